#!/usr/bin/env bash
# evaluate_run.sh RUN LAST DATA: average RUN's last LAST checkpoints, choose the length penalty
# for beam 5 on val for both the best checkpoint and the average, keep whichever scores higher on
# val, and score test_2016_flickr once with it. Each step's output is kept; a finished step is skipped.
# DEVICE=cuda decodes on the GPU (default cpu).
set -eu
RUN=$1; LAST=$2; DATA=$3
DEVICE=${DEVICE:-cpu}
lang() { python -c "import sys, yaml; print(yaml.safe_load(open(sys.argv[1]))['data'][sys.argv[2]])" "$RUN/config.yaml" "$1"; }
SRC=$(lang src_lang); TGT=$(lang tgt_lang)
[ -s "$RUN/checkpoints/avg.ckpt" ] || python scripts/average_checkpoints.py --run "$RUN" --last "$LAST" --out "$RUN/checkpoints/avg.ckpt"
for MODEL in best avg; do
  [ -s "$RUN/tune_$MODEL.json" ] || { python scripts/tune_decoding.py --model "$RUN/checkpoints/$MODEL.ckpt" \
      --src "$DATA/val.$SRC" --ref "$DATA/val.$TGT" --device "$DEVICE" --beam-sizes 1,5 --length-penalties 0,0.6,1.0,1.5,2.0,2.5,3.0 \
      --json > "$RUN/tune_$MODEL.json.tmp" && mv "$RUN/tune_$MODEL.json.tmp" "$RUN/tune_$MODEL.json"; }
done
# The (val BLEU, model, length penalty) of beam 5 that is best on val, over both models.
read -r MODEL ALPHA < <(python - "$RUN" <<'PY'
import json, sys
best = max(
    (row["bleu"], model, row["length_penalty"])
    for model in ("best", "avg")
    for row in json.load(open(f"{sys.argv[1]}/tune_{model}.json"))["all"]
    if row["beam_size"] == 5
)
print(best[1], best[2])
PY
)
echo "$MODEL $ALPHA" > "$RUN/chosen.txt"
[ -s "$RUN/test.json" ] || { python scripts/evaluate.py --model "$RUN/checkpoints/$MODEL.ckpt" \
    --src "$DATA/test_2016_flickr.$SRC" --ref "$DATA/test_2016_flickr.$TGT" --device "$DEVICE" --beam-size 5 \
    --length-penalty "$ALPHA" --hyp-out "$RUN/test.hyp" --json > "$RUN/test.json.tmp" \
    && mv "$RUN/test.json.tmp" "$RUN/test.json"; }
cat "$RUN/test.json"
