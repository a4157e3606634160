"""Export a checkpoint as a pickle-free bundle directory for inference.

    python scripts/export.py --checkpoint RUN/checkpoints/best.ckpt --out bundle/

The bundle holds model.safetensors, config.json, src_tokenizer.json and tgt_tokenizer.json.
With --onnx it also holds encoder.onnx and decoder_step.onnx (pip install -e ".[onnx]"), which
translate.py, evaluate.py and serve.py run with --backend onnx; with --format ctranslate2 it
holds ctranslate2/ (pip install -e ".[ctranslate2]"), which they run with --backend ctranslate2.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from seq2seq.cli import UsageError, add_trust_argument, run
from seq2seq.errors import CTRANSLATE2, ONNX, require_extra
from seq2seq.inference.bundle import export_bundle, load

log = logging.getLogger("seq2seq.export")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", type=Path, required=True, help="a train.py checkpoint")
    parser.add_argument("--out", type=Path, required=True, help="the bundle directory to write")
    parser.add_argument(
        "--onnx", action="store_true", help="also export the encoder and decoder step to ONNX"
    )
    parser.add_argument(
        "--format",
        choices=["bundle", "ctranslate2"],
        default="bundle",
        help="ctranslate2: also a CTranslate2 model in OUT/ctranslate2 (Transformers with "
        "dot-product scoring) (bundle)",
    )
    parser.add_argument(
        "--quantization",
        choices=["int8", "int16", "float32"],
        default="float32",
        help="the CTranslate2 model's weights (float32)",
    )
    add_trust_argument(parser)
    args = parser.parse_args()
    # Before anything is written: a bundle without the files asked for would look complete.
    if args.onnx:
        require_extra("onnx", ONNX)
    if args.format == "ctranslate2":
        require_extra("ctranslate2", CTRANSLATE2)
    trained = load(args.checkpoint, trust_modules=args.trust_modules)
    if args.format == "ctranslate2":
        from seq2seq.inference.ctranslate2_export import refusal

        why = refusal(trained)
        if why is not None:  # before anything is written
            raise UsageError(why)
    out_dir = export_bundle(trained, args.out)
    log.info("wrote the bundle %s (from %s)", out_dir, args.checkpoint)
    if args.format == "ctranslate2":
        from seq2seq.inference.ctranslate2_export import export_ctranslate2

        path = export_ctranslate2(trained, out_dir, args.quantization)
        log.info("wrote %s (%s)", path, args.quantization)
    if args.onnx:
        from seq2seq.inference.onnx_export import export_onnx  # only this option needs the exporter

        for path in export_onnx(trained.model, out_dir):
            log.info("wrote %s", path)
    return 0


if __name__ == "__main__":
    run(main)
