#!/usr/bin/env bash
# Every run of a runs file at once, each through run_recipes.sh (same variables, same records):
# for one GPU, which a recipe this small leaves idle most of the time while the CPU launches its
# kernels (docs/multi30k.md, "On a GPU"). Each run's log is RUNS/NAME.log, as with run_recipes.sh.
#   DEVICE=cuda RUNS=/tmp/runs DATA=../shared/data/multi30k \
#       bash docs/multi30k/run_parallel.sh docs/multi30k/runs_gpu.txt
set -u
cd "$(dirname "$0")/../.." || exit 1
LIST=${1:-docs/multi30k/runs_gpu.txt}
[ -r "$LIST" ] || { echo "run_parallel.sh: cannot read the runs file $LIST." >&2; exit 1; }
ONE=$(mktemp -d)
n=0
while read -r LINE; do
  n=$((n + 1))
  echo "$LINE" > "$ONE/$n.txt"
  bash docs/multi30k/run_recipes.sh "$ONE/$n.txt" &
done < <(grep -v -e '^#' -e '^[[:space:]]*$' "$LIST")
wait
rm -r "$ONE"
