#!/bin/sh
# fuzz-search.sh [BUDGET [MACHINES]]: every search algorithm on small models and machines
# with shared links (MACHINES, space-separated; default three); each plan it writes must
# simulate (parasol simulate --strategy) to the iteration time the search reported, to a
# relative 1e-12: searches time plans with every task, simulate merges chains and rings,
# which agree to the bit but in rare plans (docs/scale.md) by the last bit.  Run from the repository root after building (PARASOL names another build's
# program).
set -u
P=${PARASOL:-build/cli/parasol}
budget=${1:-2s}
machines=${2:-"dgx-a100 dgx1-v100 flexflow-p100"}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
bad=0 runs=0
for algo in mcmc dp beam optcnn subst pipeline; do
  for spec in "gpt|layers=2,hidden=128,heads=4,seq=32,vocab=256,batch=16" \
              "mlp|layers=3,hidden=256,input=128,classes=64,batch=32" \
              "bert-base|layers=2,hidden=64,heads=4,seq=16,vocab=128,batch=16,positions=16" \
              "rnnlm|batch=16"; do
    for machine in $machines; do
      model=${spec%%|*}
      params=${spec#*|}
      runs=$((runs + 1))
      if ! out=$("$P" search --algo "$algo" --model "$model" --param "$params" \
                 --machine "$machine" --budget "$budget" --own --json -q \
                 --out "$dir/plan.json" 2>"$dir/err"); then
        echo "$algo, $model on $machine: the search failed: $(tail -c 300 "$dir/err")"
        bad=$((bad + 1))
        continue
      fi
      searched=$(echo "$out" | python3 -c 'import json, sys; d = json.load(sys.stdin); print(repr(d.get("search_iteration_time_s", d["iteration_time_s"])))')
      simulated=$("$P" simulate --model "$model" --param "$params" --machine "$machine" \
                  --strategy "$dir/plan.json" --json | python3 -c 'import json, sys; print(repr(json.load(sys.stdin)["iteration_time_s"]))')
      if ! python3 -c 'import sys; a, b = float(sys.argv[1]), float(sys.argv[2]); sys.exit(abs(a - b) > 1e-12 * max(abs(a), abs(b)))' "$searched" "$simulated"; then
        echo "$algo, $model on $machine: searched $searched s, simulated $simulated s"
        bad=$((bad + 1))
      fi
    done
  done
done
echo "search: $runs searches, $bad disagreements"
[ "$bad" -eq 0 ]
