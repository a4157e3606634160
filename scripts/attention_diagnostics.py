"""Measure the claims about attention scoring functions: plots, report.md and results.json.

    python scripts/attention_diagnostics.py --out docs/diagnostics [--quick] [--seed N]
        [--runs RUN_DIR ...] [--docs docs/attention.md]

Runs controlled experiments on synthetic inputs (docs/attention.md explains each claim): score
spread and softmax entropy against d, tanh saturation against input norm with and without
LayerNorm, the bias and temperature invariances, and an XOR alignment task. ``--runs`` adds the
attn/* diagnostics that training runs logged to their metrics.csv; ``--docs`` refreshes the
generated blocks of a docs page with the same numbers. Under 5 minutes on 2 CPU cores;
``--quick`` takes a few seconds (what CI runs).
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

import torch

# benchmarks/ (the harness and the peers' runners) sits beside scripts/ in a checkout and is not
# installed with the package: put the checkout first on the path (hence the imports below it).
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.attention_report import render_sections, run_all, update_docs
from seq2seq.cli import UsageError, run

log = logging.getLogger("seq2seq")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="directory for plots and report")
    parser.add_argument("--quick", action="store_true", help="small sizes: a few seconds (CI)")
    parser.add_argument("--seed", type=int, default=0, help="seed of every experiment (0)")
    parser.add_argument(
        "--runs",
        type=Path,
        nargs="+",
        default=[],
        metavar="RUN_DIR",
        help="training run directories whose metrics.csv to summarise",
    )
    parser.add_argument(
        "--docs", type=Path, default=None, help="markdown page whose generated blocks to refresh"
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.docs is not None and not args.docs.is_file():
        raise UsageError(
            f"--docs {args.docs} does not exist: pass a markdown page, or leave it out."
        )
    # The experiments are many small operations, where more threads cost more than they give.
    torch.set_num_threads(1)
    results = run_all(args.out, quick=args.quick, seed=args.seed, run_dirs=args.runs)
    log.info("wrote %s in %.1f s", args.out / "report.md", results.environment["seconds"])
    if args.docs is not None:
        replaced = update_docs(args.docs, render_sections(results))
        log.info("refreshed %s: %s", args.docs, ", ".join(replaced) or "no generated blocks")
    return 0


if __name__ == "__main__":
    run(main)
