"""Training and decoding speed, memory and time to BLEU 95, beside Joey NMT and OpenNMT-py.

    python scripts/benchmark.py --json OUT.json [options] -- HYDRA OVERRIDES

The overrides are train.py's, e.g. the peers' reverse task (docs/performance.md):

    python scripts/benchmark.py --json bench.json --plot docs/attention_cost.png -- \\
        experiment=bench_reverse data=parallel data.root=DIR data.train=train data.val=dev \\
        data.test=test data.src_lang=src data.tgt_lang=trg

Our Transformer (model=transformer) runs beside Joey NMT's of the same size, with Joey installed
in an environment of its own: the command is in docs/performance.md ("How we measure").

Writes OUT.json (medians with min and max, every run, the machine and its load) and prints a
markdown table; ``--markdown`` also writes the table to a file.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

# benchmarks/ (the harness and the peers' runners) sits beside scripts/ in a checkout and is not
# installed with the package: put the checkout first on the path (hence the imports below it).
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.benchmark import PEER_CHOICES, QUICK, BenchmarkOptions, run_benchmark
from benchmarks.opennmt import OPENNMT_PYTHON_ENV
from benchmarks.report import write_report
from seq2seq.cli import check_report_paths, int_at_least, report_parser, run, split_overrides

log = logging.getLogger("seq2seq")


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    argv, overrides = split_overrides(argv)
    parser = report_parser(__doc__)
    parser.add_argument("--plot", type=Path, help="write the attention cost-vs-length plot here")
    parser.add_argument(
        "--peer",
        choices=PEER_CHOICES,
        default="auto",
        help=(
            "run the same work through Joey NMT (joeynmt), OpenNMT-py (opennmt) or both (all); "
            "auto: every one installed that can read the data"
        ),
    )
    parser.add_argument(
        "--opennmt-python",
        metavar="PATH",
        help=(
            f"the Python of OpenNMT-py's own environment (default: ${OPENNMT_PYTHON_ENV}, else "
            "this Python if onmt_train lies beside it)"
        ),
    )
    parser.add_argument("--repeats", type=int_at_least(1), default=3, help="training runs each")
    parser.add_argument("--decode-repeats", type=int_at_least(1), default=5)
    parser.add_argument("--warmup-batches", type=int_at_least(0), default=20)
    parser.add_argument(
        "--val-every",
        type=float,
        default=1 / 12,
        help="validate (for the time to BLEU 95) every this fraction of an epoch (default 1/12: "
        "every 26 updates on the reverse task, about a second of our training)",
    )
    parser.add_argument(
        "--bleu-target",
        type=float,
        default=95.0,
        help="the dev BLEU (0-100) whose first reaching is timed, for ours and the peers alike",
    )
    parser.add_argument(
        "--quick", action="store_true", help="a few seconds' smoke test (CI), not a measurement"
    )
    args = parser.parse_args(argv)
    if not 0 < args.val_every <= 1:
        parser.error(f"--val-every must be in (0, 1], got {args.val_every}")
    if not 0 <= args.bleu_target <= 100:
        parser.error(f"--bleu-target must be in [0, 100], got {args.bleu_target}")
    return args, overrides


def main() -> int:
    args, overrides = parse_args(sys.argv[1:])
    check_report_paths(args.json, args.markdown)
    options = BenchmarkOptions(
        repeats=args.repeats,
        decode_repeats=args.decode_repeats,
        warmup_batches=args.warmup_batches,
        val_check_interval=args.val_every,
        bleu_target=args.bleu_target,
        peer=args.peer,
        opennmt_python=args.opennmt_python,
        plot=args.plot,
    )
    if args.quick:
        options = BenchmarkOptions(**{**vars(options), **QUICK})
    report = run_benchmark(overrides, options)
    write_report(report, args.json)
    if args.markdown:
        args.markdown.write_text(report["markdown"], encoding="utf-8")
    print(report["markdown"])
    load = report["load_average_before"][0], report["load_average_after"][0]
    print(f"load average (1 min) before {load[0]:.2f}, after {load[1]:.2f}; report: {args.json}")
    return 0


if __name__ == "__main__":
    run(main)
