"""Translate one test set with each inference backend: time, BLEU, and differences from the first.

    python scripts/compare_backends.py --model bundle/ --src test.de --ref test.en \
        --backend torch --backend onnx --beam-size 1 --beam-size 5 --out docs/benchmark/backends

The bundle must hold what each backend reads (scripts/export.py --onnx for onnx).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

# benchmarks/ sits beside scripts/ in a checkout and is not installed with the package: put the
# checkout first on the path (hence the imports below it).
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.backends import compare_backends, markdown
from seq2seq.cli import UsageError, int_at_least, run
from seq2seq.inference.translator import BACKENDS


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, required=True, help="bundle directory")
    parser.add_argument("--src", type=Path, required=True, help="source sentences, one a line")
    parser.add_argument("--ref", type=Path, required=True, help="references, line-parallel")
    parser.add_argument(
        "--backend", dest="backends", action="append", choices=BACKENDS,
        help="a backend to run (repeatable; the first is the one the others are compared with)",
    )  # fmt: skip
    parser.add_argument(
        "--beam-size", dest="beam_sizes", action="append", type=int_at_least(1),
        help="a beam size to run each backend at (repeatable; 1: greedy)",
    )  # fmt: skip
    parser.add_argument("--batch-size", type=int_at_least(1), default=64, help="sentences (64)")
    parser.add_argument("--rounds", type=int_at_least(1), default=2, help="alternating rounds (2)")
    parser.add_argument("--out", type=Path, help="write NAME.json and NAME.md here")
    parser.add_argument("--name", default="backends", help="report name (backends)")
    args = parser.parse_args()
    try:
        sources = args.src.read_text("utf-8").splitlines()
        references = args.ref.read_text("utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as error:
        raise UsageError(f"cannot read the test set: {error}.") from None
    if len(sources) != len(references):
        raise UsageError(f"{args.src} has {len(sources)} lines, {args.ref} {len(references)}.")
    report = compare_backends(
        args.model, sources, references, args.backends or ["torch", "onnx"],
        args.beam_sizes or [1, 5], args.batch_size, args.rounds,
    )  # fmt: skip
    print(markdown(report), end="")
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / f"{args.name}.json").write_text(json.dumps(report, indent=2) + "\n")
        (args.out / f"{args.name}.md").write_text(markdown(report))
    return 0


if __name__ == "__main__":
    run(main)
