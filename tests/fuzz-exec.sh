#!/bin/sh
# fuzz-exec.sh [FIRST [N]]: random valid plans (build/tests/fuzz-plans gen) run for two
# steps on the CPU back end with --check against one device.  A plan the executor refuses
# (exit status 2, with its reason) counts apart; any other failure is printed and counted.
# A run in which the executor refused every plan checked nothing, and fails.  Run from the
# repository root after building (PARASOL and FUZZ_PLANS name other builds' programs).
set -u
first=${1:-1}
n=${2:-100}
P=${PARASOL:-build/cli/parasol}
G=${FUZZ_PLANS:-build/tests/fuzz-plans}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
runs=0 fails=0 refused=0
i=$first
while [ "$i" -lt $((first + n)) ]; do
  case $((i % 8)) in
    0) model=gpt; params="layers=2,hidden=64,heads=4,seq=16,vocab=128,batch=8";;
    1) model=mlp; params="layers=3,hidden=64,input=32,classes=16,batch=16";;
    2) model=gpt; params="layers=2,hidden=32,heads=2,seq=8,vocab=64,batch=8";;
    3) model=rnnlm; params="batch=8,seq=8,chunk=4,layers=2,hidden=16,vocab=32";;
    4) model=bert-base; params="layers=1,hidden=32,heads=2,seq=8,vocab=64,batch=8,positions=8";;
    5) model=llama; params="layers=2,hidden=32,heads=4,kv_heads=2,ffn=48,seq=8,vocab=64,batch=8";;
    6) model=moe; params="layers=2,hidden=32,heads=4,kv_heads=2,experts=4,top_k=2,expert_ffn=16,seq=8,vocab=64,batch=8";;
    *) model=transformer; params="encoder_layers=1,decoder_layers=1,hidden=32,ffn=64,heads=2,seq=8,vocab=64,batch=8";;
  esac
  plan="$dir/plan-$i.json"
  if ! "$G" gen "$model" "$params" dgx-a100 "$i" "$plan"; then
    echo "seed $i: no plan generated"
    fails=$((fails + 1))
    i=$((i + 1))
    continue
  fi
  out=$("$P" exec --backend cpu --model "$model" --param "$params" --machine dgx-a100 \
        --strategy "$plan" --steps 2 --check 2>&1)
  rc=$?
  runs=$((runs + 1))
  if [ "$rc" -eq 2 ]; then
    refused=$((refused + 1))
  elif [ "$rc" -ne 0 ]; then
    fails=$((fails + 1))
    echo "seed $i ($model): exit status $rc"
    echo "$out" | tail -n 5
    cp "$plan" "${FUZZ_KEEP:-.}/fuzz-exec-failed-$i.json"
  fi
  i=$((i + 1))
done
echo "exec: $runs plans, $fails failures, $refused refused by the executor"
if [ "$runs" -gt 0 ] && [ "$refused" -eq "$runs" ]; then
  echo "exec: every plan was refused: nothing was checked"
  exit 1
fi
[ "$fails" -eq 0 ]
