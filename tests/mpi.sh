#!/bin/sh
# mpi.sh: searches and comparisons shared among MPI ranks (docs/distributed.md), run with
# mpirun --oversubscribe on this machine.
#  - With an evaluation budget, a seed and --threads, mcmc, expert, beam, megatron, dp,
#    optcnn, pipeline, alpa and exhaustive write the same plan byte for byte, and report the
#    same evaluations and iteration time, alone and on 2 and 4 ranks; 2 and 4 ranks report
#    that they shared the search (exchanges).  So does subst on a small Inception-v3, whose
#    plan is on a graph rewritten twice.
#  - With a budget of one evaluation rank 0 simulates the yardsticks alone, and finishes.
#  - compare divides its runs over 3 ranks: each run ends (the CSV's last line for it) with
#    the evaluations and best time of the same run made by a single process (the lines
#    before depend on how its threads were timed, alone as on the ranks).
#  - SIGTERM to rank 1 alone stops every rank: rank 0 says so, writes a plan, exits 0.
#  - SIGKILL of rank 1: mpirun ends the job; rank 0 writes its plan first.
#  - SIGKILL of rank 1 under mpirun --enable-recovery with a budget in evaluations: the
#    others see that it is gone; rank 0 says so and writes its plan.  The same where the
#    ranks do not look at each other's processes (PARASOL_MPI_NO_HOST_CHECK, as on other
#    hosts): rank 0 names rank 1 after --rank-timeout 3 seconds without a word from it.
# PARASOL names the program, MPIRUN mpirun.
set -u
P=${PARASOL:-build/cli/parasol}
MPIRUN=${MPIRUN:-mpirun}
# CI runs as root, which Open MPI refuses without these.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# Several ranks on few cores, polling in their exchanges: yield the cores rather than spin.
export OMPI_MCA_mpi_yield_when_idle=1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
bad=0
fail() {
  echo "FAIL: $*"
  bad=$((bad + 1))
}
run() {  # run NP ARGS...: parasol alone (NP 1) or under mpirun
  np=$1
  shift
  if [ "$np" = 1 ]; then
    "$P" "$@"
  else
    "$MPIRUN" --oversubscribe -np "$np" "$P" "$@"
  fi
}
field() {  # field FILE KEY: a top-level member of a JSON file
  python3 -c "import json,sys; print(repr(json.load(open(sys.argv[1]))[sys.argv[2]]))" "$1" "$2"
}

MODEL="--model gpt --param layers=2,hidden=128,heads=4,seq=32,vocab=256,batch=16"
# same_plan NAME ARGS...: the search of ARGS alone and on 2 and 4 ranks; NAME for files.
same_plan() {
  name=$1
  shift
  for np in 1 2 4; do
    if ! run "$np" search "$@" --threads 4 --seed 7 --own -q --json --out "$dir/$name-$np.json" \
           >"$dir/$name-$np.out" 2>"$dir/$name-$np.err"; then
      fail "$name on $np ranks: $(tail -c 400 "$dir/$name-$np.err")"
      continue
    fi
    [ "$(field "$dir/$name-$np.out" ranks)" = "$np" ] ||
      fail "$name on $np ranks: the report says $(field "$dir/$name-$np.out" ranks) ranks"
    [ "$np" = 1 ] || [ "$(field "$dir/$name-$np.out" exchanges)" != 0 ] ||
      fail "$name on $np ranks: no exchanges, the search was not shared"
  done
  for np in 2 4; do
    [ -f "$dir/$name-$np.json" ] || continue
    cmp -s "$dir/$name-1.json" "$dir/$name-$np.json" ||
      fail "$name: the plan of $np ranks differs from one process's"
    for key in evals iteration_time_s search_iteration_time_s; do
      a=$(field "$dir/$name-1.out" $key)
      b=$(field "$dir/$name-$np.out" $key)
      [ "$a" = "$b" ] || fail "$name: $key $b on $np ranks, $a alone"
    done
  done
  echo "$name: the same plan alone and on 2 and 4 ranks"
}
# alpa where this build has it (GLPK).
algos="mcmc expert beam megatron dp optcnn pipeline exhaustive"
"$P" search --list 2>/dev/null | grep -q '^alpa ' && algos="$algos alpa"
for algo in $algos; do
  # exhaustive: the budget's first 1,200 of the combinations, however many there are.
  extra=""
  [ "$algo" = exhaustive ] && extra="--opt max=1e300"
  same_plan "$algo" --algo "$algo" $MODEL --machine dgx-a100 --budget 1200evals $extra
done
# subst with its inner dp: the graphs' searches shared, the rewrites' times divided.  The
# plan (2 of Inception-v3's merged branch convolutions) is a rewritten graph's.
same_plan subst --algo subst --model inception-v3 --param batch=8,image=75,classes=10 \
  --machine dgx-a100 --budget 150evals
grep -q '"rewrites": \["merge-convs' "$dir/subst-1.json" ||
  fail "subst: the plan applies no rewrite: $(grep rewrites "$dir/subst-1.json")"

# A budget too small for the expert plans: rank 0 simulates them alone afterwards, as the
# yardstick, while the other ranks wait for it to finish.
timeout 300 "$MPIRUN" --oversubscribe -np 2 "$P" search --algo mcmc $MODEL --machine dgx-a100 \
    --budget 1evals -q --json >"$dir/tiny.out" 2>"$dir/tiny.err" ||
  fail "mcmc on 2 ranks with 1 evaluation: status $?: $(tail -c 400 "$dir/tiny.err")"
[ "$(field "$dir/tiny.out" expert_complete)" = True ] ||
  fail "mcmc on 2 ranks with 1 evaluation: the expert yardstick was not simulated"
# The shared search did exchange (the text report counts the exchanges).
run 2 search --algo mcmc $MODEL --machine dgx-a100 --budget 600evals --threads 2 --own \
    >"$dir/text.out" 2>/dev/null || fail "mcmc on 2 ranks, text report"
grep -Eq '^  ranks +2 \(MPI\), [1-9][0-9]* exchanges' "$dir/text.out" ||
  fail "mcmc on 2 ranks: no exchanges reported: $(grep ranks "$dir/text.out")"

# compare: the runs divided over 3 ranks, the same CSV but for wall_s.
for np in 1 3; do
  run "$np" compare --algos mcmc,expert,dp --seeds 2 $MODEL --machine dgx-a100 \
      --budget 300evals --threads 2 -q --json --out "$dir/cmp-$np" \
      >"$dir/cmp-$np.out" 2>"$dir/cmp-$np.err" ||
    fail "compare on $np ranks: $(tail -c 400 "$dir/cmp-$np.err")"
  awk -F, 'NR > 1 { last[$1 "," $2] = $4 "," $5 } END { for (k in last) print k "," last[k] }' \
      "$dir/cmp-$np.csv" 2>/dev/null | sort >"$dir/cmp-$np.rows"
done
[ "$(wc -l <"$dir/cmp-1.rows")" = 6 ] || fail "compare alone: not 6 runs in its CSV"
cmp -s "$dir/cmp-1.rows" "$dir/cmp-3.rows" ||
  fail "compare: the runs of 3 ranks differ from one process's: $(diff "$dir/cmp-1.rows" "$dir/cmp-3.rows" | head -5)"
echo "compare: the same runs alone and on 3 ranks"

# rank_pid MPIRUN_PID RANK: the process of that rank.
rank_pid() {
  for d in /proc/[0-9]*; do
    [ "$(awk '/^PPid:/ { print $2 }' "$d/status" 2>/dev/null)" = "$1" ] || continue
    if tr '\0' '\n' <"$d/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$2"; then
      echo "${d#/proc/}"
      return
    fi
  done
}
# A signal to rank 1 alone, then its death: rank 0 writes the plan each time.
for sig in TERM KILL; do
  rm -f "$dir/sig.json"
  "$MPIRUN" --oversubscribe -np 2 "$P" search $MODEL --machine dgx-a100 --budget 60s -q \
            --out "$dir/sig.json" >"$dir/sig.out" 2>"$dir/sig.err" &
  mp=$!
  pid=""
  # Until rank 1 has started (at most 30 s), then into the search.
  for _ in $(seq 60); do
    sleep 0.5
    pid=$(rank_pid "$mp" 1)
    [ -n "$pid" ] && break
  done
  sleep 3
  if [ -z "$pid" ]; then
    fail "SIG$sig: no rank 1 found"
    kill "$mp" 2>/dev/null
    wait "$mp"
    continue
  fi
  kill -"$sig" "$pid"
  wait "$mp"
  status=$?
  [ -s "$dir/sig.json" ] || fail "SIG$sig to rank 1: no plan written: $(tail -c 400 "$dir/sig.err")"
  if [ "$sig" = TERM ]; then
    [ "$status" = 0 ] || fail "SIGTERM to rank 1: status $status"
    grep -q "SIGTERM on rank 1" "$dir/sig.err" ||
      fail "SIGTERM to rank 1: not reported: $(tail -c 400 "$dir/sig.err")"
  else
    grep -q "gave the sharing up" "$dir/sig.err" ||
      fail "SIGKILL of rank 1: not reported: $(tail -c 400 "$dir/sig.err")"
  fi
  echo "SIG$sig of rank 1: rank 0 wrote its plan"
done

# SIGKILL of rank 1 under mpirun --enable-recovery, which leaves the other ranks running,
# with a budget in evaluations (no deadline to give up at): rank 0 sees that rank 1 is
# gone, says so and writes its plan, and mpirun ends (given 60 s).  First with the ranks
# looking at each other's processes ("rank 1 ended"), then as if on other hosts, where
# rank 0 hears no word from rank 1 for the rank timeout ("no word from rank 1").
running() {  # running PID: the process is there and not a zombie
  [ -e "/proc/$1" ] && ! grep -q ') Z' "/proc/$1/stat" 2>/dev/null
}
for how in host timeout; do
  rm -f "$dir/rec.json"
  if [ "$how" = host ]; then
    "$MPIRUN" --oversubscribe --enable-recovery -np 3 "$P" search $MODEL --machine dgx-a100 \
              --budget 100000000evals -q --out "$dir/rec.json" >"$dir/rec.out" 2>"$dir/rec.err" &
    said="rank 1 ended"
  else
    PARASOL_MPI_NO_HOST_CHECK=1 "$MPIRUN" -x PARASOL_MPI_NO_HOST_CHECK --oversubscribe \
      --enable-recovery -np 3 "$P" search $MODEL --machine dgx-a100 --budget 100000000evals \
      --rank-timeout 3 -q --out "$dir/rec.json" >"$dir/rec.out" 2>"$dir/rec.err" &
    said="no word from rank 1 for 3 s"
  fi
  mp=$!
  pid=""
  for _ in $(seq 60); do
    sleep 0.5
    pid=$(rank_pid "$mp" 1)
    [ -n "$pid" ] && break
  done
  sleep 3
  before=$bad
  others="$(rank_pid "$mp" 0) $(rank_pid "$mp" 2)"
  [ -n "$pid" ] && kill -KILL "$pid"
  for _ in $(seq 120); do
    running "$mp" || break
    sleep 0.5
  done
  if running "$mp"; then
    fail "--enable-recovery ($how), SIGKILL of rank 1: the other ranks still wait after 60 s"
    kill -KILL $others "$mp" 2>/dev/null
  fi
  wait "$mp"
  if [ -z "$pid" ]; then
    fail "--enable-recovery ($how): no rank 1 found"
  else
    [ -s "$dir/rec.json" ] ||
      fail "--enable-recovery ($how), SIGKILL of rank 1: no plan written: $(tail -c 400 "$dir/rec.err")"
    grep -q "$said" "$dir/rec.err" ||
      fail "--enable-recovery ($how), SIGKILL of rank 1: not reported: $(tail -c 400 "$dir/rec.err")"
    [ "$bad" != "$before" ] ||
      echo "SIGKILL of rank 1 under --enable-recovery ($how): rank 0 reported it and wrote its plan"
  fi
done

if [ "$bad" -gt 0 ]; then
  echo "$bad failures"
  exit 1
fi
echo "all passed"
