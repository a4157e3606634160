"""Write a generated toy task's splits as text files: {split}.src, {split}.tgt, {split}.align.

    python scripts/make_toy_data.py --out data/toy [--task toy|reverse|copy|sort] [--seed N]
        [--train-size N] [--val-size N] [--test-size N]

Give the same sizes as the training run (data.train_size, data.val_size, data.test_size) to get
the splits that run saw.

The files are a function of the arguments: two runs write byte-identical files.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

from seq2seq.cli import int_at_least
from seq2seq.data.toy import FILE_SUFFIXES, Copy, Reverse, Sort, ToyTranslation, write_splits

TASKS: dict[str, type[ToyTranslation] | type[Reverse] | type[Copy] | type[Sort]] = {
    "toy": ToyTranslation,
    "reverse": Reverse,
    "copy": Copy,
    "sort": Sort,
}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="directory to write the files to")
    parser.add_argument("--task", choices=list(TASKS), default="toy", help="which task (toy)")
    parser.add_argument("--seed", type=int, default=1, help="generation seed (1)")
    parser.add_argument(
        "--train-size",
        type=int_at_least(1),
        default=None,
        help="training pairs (the task's default)",
    )
    for split in ("val", "test"):
        parser.add_argument(
            f"--{split}-size",
            type=int_at_least(1),
            default=None,
            help=f"{split} pairs (the task's default)",
        )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    task = TASKS[args.task](seed=args.seed)
    sizes = {
        f"{split}_size": getattr(args, f"{split}_size")
        for split in ("train", "val", "test")
        if getattr(args, f"{split}_size") is not None
    }
    task = dataclasses.replace(task, **sizes)
    out_dir: Path = args.out
    try:
        splits = task.splits()
    except ValueError as error:  # sizes the task cannot produce: say so, without a traceback
        print(f"error: {error}", file=sys.stderr)
        return 2
    try:
        # One split at a time, so that each line printed names a file that is really there.
        for split, examples in splits.items():
            write_splits({split: examples}, out_dir)
            for suffix in FILE_SUFFIXES:
                print(
                    f"wrote {out_dir / f'{split}.{suffix}'} ({len(examples)} lines)",
                    file=sys.stderr,
                )
    except OSError as error:
        print(
            f"error: cannot write the {args.task} data to {out_dir}: "
            f"{error.strerror or error}. Check that the path is a directory (or can be created) "
            "and that you may write there, or choose another with --out.",
            file=sys.stderr,
        )
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
