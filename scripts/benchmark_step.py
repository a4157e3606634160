"""One training step in eager PyTorch, through torch.compile and as CUDA graphs, side by side.

    python scripts/benchmark_step.py --json OUT.json [options] -- HYDRA OVERRIDES

On a GPU (docs/performance.md):

    python scripts/benchmark_step.py --json step.json --device cuda -- experiment=bench_reverse

Times the step of the config's model on fixed-shape random batches (B = data.batch_size,
S = T - 1 = each --lengths), checks each variant against eager, writes OUT.json and prints a
markdown table (``--markdown`` also writes it to a file). See ``seq2seq/step_benchmark.py``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from seq2seq.cli import check_report_paths, int_at_least, report_parser, run, split_overrides

# benchmarks/ (the harness and the peers' runners) sits beside scripts/ in a checkout and is not
# installed with the package: put the checkout first on the path (hence the imports below it).
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.step_benchmark import VARIANTS, markdown, run_step_benchmark


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    argv, overrides = split_overrides(argv)
    parser = report_parser(__doc__)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument(
        "--variants",
        default="eager,compile",
        help=f"comma-separated, of {', '.join(VARIANTS)} (default: eager,compile)",
    )
    parser.add_argument(
        "--lengths", default="25", help="comma-separated source lengths S (T = S + 1)"
    )
    parser.add_argument("--vocab-size", type=int_at_least(5), default=54)
    parser.add_argument("--warmup", type=int_at_least(1), default=5, help="untimed steps")
    parser.add_argument("--steps", type=int_at_least(1), default=20, help="steps per chunk")
    parser.add_argument("--chunks", type=int_at_least(1), default=5, help="timed chunks")
    args = parser.parse_args(argv)
    try:
        args.lengths = [int(length) for length in args.lengths.split(",")]
    except ValueError:
        parser.error(f"--lengths must be comma-separated integers, got {args.lengths!r}")
    if min(args.lengths) < 1:
        parser.error(f"--lengths must be positive, got {args.lengths}")
    args.variants = [variant.strip() for variant in args.variants.split(",") if variant.strip()]
    return args, overrides


def main() -> int:
    args, overrides = parse_args(sys.argv[1:])
    check_report_paths(args.json, args.markdown)
    report = run_step_benchmark(
        overrides,
        args.variants,
        args.device,
        args.lengths,
        vocab_size=args.vocab_size,
        warmup=args.warmup,
        steps=args.steps,
        chunks=args.chunks,
    )
    table = markdown(report)
    args.json.write_text(json.dumps({**report, "markdown": table}, indent=2) + "\n")
    if args.markdown:
        args.markdown.write_text(table, encoding="utf-8")
    print(table)
    return 0


if __name__ == "__main__":
    run(main)
