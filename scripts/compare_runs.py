"""Compare training runs side by side from their local files (no W&B server needed).

    python scripts/compare_runs.py multirun/2026-11-22/10-00-00/ [more runs ...] [--out DIR]

Prints a markdown table (one row per run: attention, parameters, best val BLEU, test BLEU, AER,
training time, tokens/s) and writes bleu_curves.png (val BLEU against step, all runs) and
attention_grid.png (one validation sentence's attention under each run) to --out (default: the
first directory given).
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from seq2seq.analysis.compare import (
    find_runs,
    markdown_table,
    plot_attention_grid,
    plot_bleu_curves,
    read_run,
)
from seq2seq.cli import UsageError, run

log = logging.getLogger("seq2seq.compare_runs")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", type=Path, nargs="+", help="run or multirun directories")
    parser.add_argument("--out", type=Path, help="where to write the PNGs (the first directory)")
    return parser.parse_args()


def main() -> int:
    args = parse_args()
    runs = [read_run(path) for path in find_runs(args.runs)]
    out_dir: Path = args.out or args.runs[0]
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise UsageError(f"cannot create --out {out_dir} ({error.strerror}).") from None
    print(markdown_table(runs), end="")
    curves = plot_bleu_curves(runs, out_dir / "bleu_curves.png")
    log.info("wrote %s", curves)
    grid = plot_attention_grid(runs, out_dir / "attention_grid.png")
    if grid is None:
        log.info("no run has recorded attention maps yet: no attention_grid.png")
    else:
        log.info("wrote %s", grid)
    return 0


if __name__ == "__main__":
    run(main)
