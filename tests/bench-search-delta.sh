#!/bin/sh
# bench-search-delta.sh — what delta simulation saves a whole search: FlexFlow's MCMC on
# inception-v3 and bert-large over 64 A100s, a fixed number of evaluations on one thread,
# each search run twice in turn, with delta sessions and with every evaluation lowered,
# assembled and run from nothing (PARASOL_NO_DELTA).  Both must end with the same plan
# (delta and full simulation give the same times, so the chains take the same steps);
# the table gives the median wall time of each and the median of the pairs' ratios.
#
#   tests/bench-search-delta.sh [PARASOL [EVALS [PAIRS]]]
set -eu
P=${1:-build/cli/parasol}
EVALS=${2:-500}
PAIRS=${3:-3}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT

median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

run() { # MODEL PARAMS OUT [env...]
  m=$1 params=$2 out=$3
  shift 3
  s=$(date +%s.%N)
  env "$@" "$P" search --model "$m" --param "$params" --machine dgx-a100:8 --algo mcmc \
    --budget "${EVALS}evals" --threads 1 --seed 1 --out "$out" > "$T/report" 2> "$T/err" ||
    { cat "$T/err" >&2; exit 1; }
  e=$(date +%s.%N)
  awk -v a="$s" -v b="$e" 'BEGIN { printf "%.3f\n", b - a }'
}

echo "| model (64 A100, MCMC, $EVALS evaluations, 1 thread) | delta (median s) | full (median s) | full / delta (median of $PAIRS pairs) | same plan |"
echo "|---|---:|---:|---:|---|"
for spec in "inception-v3 batch=512" "bert-large batch=256,seq=128"; do
  set -- $spec
  m=$1 params=$2
  : > "$T/d"; : > "$T/f"; : > "$T/r"
  same=yes
  for i in $(seq "$PAIRS"); do
    d=$(run "$m" "$params" "$T/delta.json")
    f=$(run "$m" "$params" "$T/full.json" PARASOL_NO_DELTA=1)
    cmp -s "$T/delta.json" "$T/full.json" || same=no
    echo "$d" >> "$T/d"
    echo "$f" >> "$T/f"
    awk -v a="$f" -v b="$d" 'BEGIN { printf "%.4f\n", a / b }' >> "$T/r"
  done
  printf '| %s | %.1f | %.1f | %.2fx | %s |\n' "$m" "$(median < "$T/d")" "$(median < "$T/f")" \
    "$(median < "$T/r")" "$same"
  [ "$same" = yes ] || exit 1
done
