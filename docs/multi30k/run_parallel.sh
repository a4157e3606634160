#!/usr/bin/env bash
# Every run of a runs file at once, each through run_recipes.sh (same variables, same records):
# for one GPU, which three of these small recipes kept busy (a median 92 % utilisation on an H100:
# docs/multi30k.md, "On one GPU"). Each run's log is RUNS/NAME.log, as with run_recipes.sh.
#   DEVICE=cuda RUNS=/tmp/runs DATA=../shared/data/multi30k \
#       bash docs/multi30k/run_parallel.sh docs/multi30k/runs_gpu.txt
set -u
cd "$(dirname "$0")/../.." || exit 1
LIST=${1:-docs/multi30k/runs_gpu.txt}
[ -r "$LIST" ] || { echo "run_parallel.sh: cannot read the runs file $LIST." >&2; exit 1; }
ONE=$(mktemp -d)
# A script's background jobs ignore Ctrl+C: pass it (and SIGTERM) on to every run, each of which
# stops cleanly with a last.ckpt that this command, run again, resumes from.
trap 'trap - INT TERM; rm -r "$ONE"; kill 0' INT TERM
n=0
while read -r LINE; do
  n=$((n + 1))
  echo "$LINE" > "$ONE/$n.txt"
  bash docs/multi30k/run_recipes.sh "$ONE/$n.txt" &
done < <(grep -v -e '^#' -e '^[[:space:]]*$' "$LIST")
wait
rm -r "$ONE"
