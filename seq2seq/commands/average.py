"""Average the weights of several checkpoints into one, for evaluate.py, translate.py, export.py.

python scripts/average_checkpoints.py --out RUN/checkpoints/avg.ckpt CKPT [CKPT ...]
python scripts/average_checkpoints.py --out avg.ckpt --run RUN --last 5     # checkpoint.keep_last=5
python scripts/average_checkpoints.py --out avg.ckpt --run RUN --best 5     # checkpoint.keep_best=5
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from seq2seq.cli import UsageError, add_trust_argument, int_at_least, run
from seq2seq.inference.averaging import average_checkpoints, kept_checkpoints

log = logging.getLogger("seq2seq.average")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoints", type=Path, nargs="*", help="checkpoint files to average")
    parser.add_argument("--out", type=Path, required=True, help="the averaged checkpoint to write")
    parser.add_argument("--run", type=Path, help="a run directory whose kept checkpoints to use")
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--last", type=int_at_least(1), help="the N latest (checkpoint.keep_last)")
    group.add_argument("--best", type=int_at_least(1), help="the N best by val/bleu (keep_best)")
    add_trust_argument(parser)
    args = parser.parse_args()
    paths = list(args.checkpoints)
    if args.run is not None:
        if args.last is None and args.best is None:
            raise UsageError("--run needs --last N or --best N: which of its checkpoints to use.")
        which, count = ("last", args.last) if args.last is not None else ("best", args.best)
        paths += kept_checkpoints(args.run, which, count)
    elif args.last is not None or args.best is not None:
        raise UsageError("--last and --best choose among a run's checkpoints: add --run RUN.")
    if not paths:
        raise UsageError("give checkpoint files to average, or --run RUN with --last/--best N.")
    out = average_checkpoints(paths, args.out, args.trust_modules)
    log.info("averaged %d checkpoints into %s", len(paths), out)
    return 0


if __name__ == "__main__":
    run(main)
