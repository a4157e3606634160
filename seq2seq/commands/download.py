"""Download a real corpus, verify its sha256 and write it atomically.

    python scripts/download_data.py {multi30k,tatoeba} [--root DIR] [--base-url URL]
        [--retries N]

Default roots: data/multi30k and data/tatoeba-fra-eng (the corpus configs' defaults). Files
already there with the right sha256 are kept; an interrupted download resumes when run again.
--base-url replaces the host and folder the files are fetched from (a mirror, or a local test
server); the file names stay the same (train.de.gz, ..., fra-eng.zip).
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from seq2seq.cli import int_at_least
from seq2seq.data.corpora import DataError
from seq2seq.data.download import DATASETS, download


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("name", choices=sorted(DATASETS), help="which corpus")
    parser.add_argument(
        "--root", type=Path, default=None, help="directory to write to (the corpus's default)"
    )
    parser.add_argument("--base-url", default=None, help="fetch from here instead (a mirror)")
    parser.add_argument(
        "--retries", type=int_at_least(0), default=3, help="retries per file after a failure (3)"
    )
    parser.add_argument(
        "--backoff", type=float, default=1.0, help="seconds before the first retry, doubling (1)"
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        paths = download(
            args.name, args.root, base_url=args.base_url, retries=args.retries, backoff=args.backoff
        )
    except DataError as error:  # the message says what to do; a traceback would only bury it
        print(f"error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted: run the same command again to resume.", file=sys.stderr)
        return 130
    for path in paths:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
