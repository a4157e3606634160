"""Choose the beam size and length penalty on a validation set (never on test): a BLEU table.

    python scripts/tune_decoding.py --model RUN/checkpoints/best.ckpt --src val.de --ref val.en \
        [--beam-sizes 1,5,8] [--length-penalties 0,0.6,1.0] [--json]

Prints one line per setting, best first; use the best with evaluate.py on the test set once.
"""

from __future__ import annotations

import argparse
import json
import logging
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from seq2seq import Translator
from seq2seq.analysis.decoding import tune_decoding
from seq2seq.cli import (
    add_trust_argument,
    check_device,
    int_at_least,
    penalty_weight,
    read_sources_and_references,
    run,
)

log = logging.getLogger("seq2seq.tune")


def numbers(text: str, parse: Callable[[str], Any]) -> list[Any]:
    """An argparse type: a comma-separated list, each item read by ``parse`` (an argparse type
    itself, which says what is wrong with an item)."""
    items = [part.strip() for part in text.split(",")]
    if not all(items):  # "0,,1" or "0.6,": a number left out, not one to drop
        raise argparse.ArgumentTypeError(f"a comma-separated list of numbers, got {text!r}")
    values = []
    for item in items:
        try:
            values.append(parse(item))
        except argparse.ArgumentTypeError as error:
            raise argparse.ArgumentTypeError(f"{item!r} in {text!r}: {error}") from None
    return values


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, required=True, help="checkpoint file or bundle dir")
    parser.add_argument("--src", type=Path, required=True, help="validation sources")
    parser.add_argument("--ref", type=Path, required=True, help="validation references")
    parser.add_argument(
        "--beam-sizes",
        type=lambda t: numbers(t, int_at_least(1)),
        default=[1, 5, 8],
        help="beam sizes, each at least 1; 1 is greedy search, which has no length penalty (1,5,8)",
    )
    parser.add_argument(
        "--length-penalties",
        type=lambda t: numbers(t, penalty_weight),
        default=[0.0, 0.6, 1.0, 1.5],
        help="GNMT alphas, each 0 to 10 (0,0.6,1.0,1.5)",
    )
    parser.add_argument("--tokenize", default="13a", help="sacreBLEU tokenizer (13a)")
    parser.add_argument("--device", default="cpu", help="cpu, cuda, ... (cpu)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    add_trust_argument(parser)
    args = parser.parse_args()
    sources, references = read_sources_and_references(args.src, args.ref)
    check_device(args.device)
    translator = Translator.load(args.model, device=args.device, trust_modules=args.trust_modules)
    scores = tune_decoding(
        translator, sources, references, args.beam_sizes, args.length_penalties, args.tokenize
    )
    if args.json:
        print(json.dumps({"best": asdict(scores[0]), "all": [asdict(s) for s in scores]}))
    else:
        for score in scores:
            # A beam of one is greedy search, which no length penalty changes.
            alpha = f"{score.length_penalty:4.2f}" if score.beam_size > 1 else "   –"
            print(f"beam {score.beam_size:2d}  length penalty {alpha}  BLEU {score.bleu:6.2f}")
        best = scores[0]
        setting = f"--beam-size {best.beam_size}"
        if best.beam_size > 1:
            setting += f" --length-penalty {best.length_penalty:g}"
        log.info("best on these sentences: %s", setting)
    return 0


if __name__ == "__main__":
    run(main)
