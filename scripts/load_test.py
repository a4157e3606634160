"""Load-test the translation server on loopback: sentences/s and p50/p99 latency by concurrency.

Each concurrency is measured with batching on and off, and an optional soak samples the
server's memory.

    python scripts/load_test.py --model bundle/ --sentences test.src --out docs/benchmark/serve \
        --name toy_transformer --concurrency 1,8,32,64 --soak-seconds 600

Starts its own servers (127.0.0.1, free ports) and stops by itself after a fixed number of
requests; writes NAME.json and NAME.md to --out.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

# benchmarks/ sits beside scripts/ in a checkout and is not installed with the package: put the
# checkout first on the path (hence the imports below it).
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.serve_load import run_load_test
from seq2seq.cli import UsageError, int_at_least, run


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, required=True, help="bundle dir or checkpoint")
    parser.add_argument("--sentences", type=Path, required=True, help="one source a line")
    parser.add_argument("--out", type=Path, required=True, help="directory for the report")
    parser.add_argument("--name", default="load_test", help="report name (load_test)")
    parser.add_argument(
        "--concurrency", default="1,8,32,64", help="client counts, comma-separated (1,8,32,64)"
    )
    parser.add_argument(
        "--requests-per-client", type=int_at_least(1), default=16, help="each client's (16)"
    )
    parser.add_argument("--beam-size", type=int_at_least(1), default=1, help="(1: greedy)")
    parser.add_argument("--threads", type=int_at_least(1), default=2, help="server's torch threads")
    parser.add_argument("--max-wait-ms", type=float, default=5.0, help="server's batching wait (5)")
    parser.add_argument(
        "--soak-seconds", type=float, default=0.0, help="then this long at the top concurrency"
    )
    parser.add_argument(
        "--heavy",
        metavar="N,J",
        help="then one-sentence latency alone and beside a client that sends requests of N "
        "sentences of J lines each in a loop (e.g. 64,8); none by default",
    )
    return parser.parse_args()


def main() -> int:
    args = parse_args()
    try:
        concurrency = [int(part) for part in args.concurrency.split(",")]
    except ValueError:
        raise UsageError(
            f"--concurrency wants integers like 1,8,32, got {args.concurrency!r}."
        ) from None
    heavy = None
    if args.heavy is not None:
        try:
            count, join = (int(part) for part in args.heavy.split(","))
        except ValueError:
            raise UsageError(f"--heavy wants two integers like 64,8, got {args.heavy!r}.") from None
        if count < 1 or join < 1:
            raise UsageError(f"--heavy wants two positive integers, got {args.heavy!r}.")
        heavy = (count, join)
    if not args.model.exists():
        raise UsageError(f"--model {args.model} does not exist.")
    try:
        sentences = [line.strip() for line in args.sentences.read_text("utf-8").splitlines()]
    except (OSError, UnicodeDecodeError) as error:
        raise UsageError(f"cannot read --sentences {args.sentences}: {error}.") from None
    sentences = [sentence for sentence in sentences if sentence]
    if not sentences:
        raise UsageError(f"--sentences {args.sentences} has no sentences.")
    run_load_test(
        args.model, sentences, args.out, args.name, concurrency, args.requests_per_client,
        args.beam_size, args.threads, args.max_wait_ms, args.soak_seconds, heavy,
    )  # fmt: skip
    return 0


if __name__ == "__main__":
    run(main)
