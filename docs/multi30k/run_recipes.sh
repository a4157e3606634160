#!/usr/bin/env bash
# Train, then evaluate, every run of a runs file (docs/multi30k/runs.txt by default), one after the
# other, as the measurements in docs/multi30k.md were made. A run that was killed (a machine shut
# down) resumes from its last.ckpt; Lightning's Timer is in the checkpoint, so trainer.max_time
# still bounds the run's total training time. Finished steps are skipped, so rerunning is safe. A
# run's records (metrics, val grids, test score, config, the last validation's attention record)
# are copied to docs/multi30k/runs/NAME, and a run with a test score there is skipped.
#   RUNS=/tmp/runs DATA=../shared/data/multi30k bash docs/multi30k/run_recipes.sh [runs.txt]
set -u
cd "$(dirname "$0")/../.." || exit 1
RUNS=${RUNS:-runs/multi30k}
DATA=${DATA:-../shared/data/multi30k}
LIST=${1:-docs/multi30k/runs.txt}
# scripts/*.py import the installed package: without it every evaluation would fail after training.
python -c "import seq2seq" 2>/dev/null || {
  echo "run_recipes.sh: the seq2seq package is not installed in $(command -v python); run" \
    "'make install' (or pip install -e .) in $PWD first." >&2
  exit 1
}
mkdir -p "$RUNS"
# keep_last_attention RUN RECORDS: the last validation's sample translations and attention (~15 kB),
# for compare_runs.py's grid; a run without them keeps none.
keep_last_attention() {
  local last
  last=$(find "$1/attention" -name 'step-*.json' 2>/dev/null | sort | tail -n 1)
  [ -z "$last" ] || { mkdir -p "$2/attention" && cp "$last" "$2/attention/"; }
}
grep -v '^#' "$LIST" | while read -r NAME EXP LAST OVERRIDES; do
  RUN=$RUNS/$NAME
  RECORDS=docs/multi30k/runs/$NAME
  [ -s "$RECORDS/test.json" ] && continue
  if [ ! -e "$RUN.trained" ]; then
    RESUME=""
    [ -e "$RUN/checkpoints/last.ckpt" ] && RESUME="ckpt_path=$RUN/checkpoints/last.ckpt"
    echo "$(date -u +%T) train $NAME $RESUME" >> "$RUNS/chain.log"
    # shellcheck disable=SC2086  # OVERRIDES is a list of Hydra overrides
    python train.py "experiment=multi30k_$EXP" "data.root=$DATA" "hydra.run.dir=$RUN" $OVERRIDES \
      $RESUME < /dev/null >> "$RUN.log" 2>&1 && touch "$RUN.trained"
  fi
  if [ -e "$RUN.trained" ]; then
    echo "$(date -u +%T) evaluate $NAME" >> "$RUNS/chain.log"
    bash docs/multi30k/evaluate_run.sh "$RUN" "$LAST" "$DATA" < /dev/null >> "$RUN.eval.log" 2>&1 \
      && mkdir -p "$RECORDS" \
      && cp "$RUN"/{metrics.csv,summary.json,tune_{best,avg}.json,test.json,chosen.txt,config.yaml} "$RECORDS" \
      && keep_last_attention "$RUN" "$RECORDS"
  fi
done
