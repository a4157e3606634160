"""Measure input feeding, coverage and its loss, and the coverage penalty on the toy task.

    python scripts/attention_memory.py --runs outputs/attention_parts [--seeds 1 2 3]
        [--epochs 2] [--jobs 2] [--out docs/attention_memory] [--docs docs/attention.md]
        [--speed-repeats 2 --speed-steps 150] [--speed-only]

Trains the default model with each switch of ``benchmarks/attention_memory.py`` for additive and
scaled_dot scoring and each seed, ``--jobs`` runs at a time with one thread each (runs already in
``--runs`` are kept: with the parts study's directory, its baseline runs serve); scores every best
checkpoint; writes ``results.json`` and ``report.md`` (mean and 95 % interval over the seeds) to
``--out``, and refreshes the ``attention_memory`` block of ``--docs``. ``--speed-repeats`` and
``--speed-only`` time every setting one run at a time, as ``scripts/attention_parts.py`` does
(``speed.json``, the ``attention_memory_speed`` block).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

# benchmarks/ sits beside scripts/ in a checkout and is not installed with the package.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.attention_memory import (
    COMPARED_WITH,
    VARIANTS,
    render_memory_table,
    run_memory_study,
)
from benchmarks.attention_parts import (
    add_speed_arguments,
    add_study_arguments,
    measure_speed,
    render_speed,
    study_arguments,
    study_results,
    this_machine,
)
from benchmarks.attention_report import update_docs
from seq2seq.cli import run

log = logging.getLogger("seq2seq")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_study_arguments(parser, Path("docs/attention_memory"))
    add_speed_arguments(parser)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    results = study_results(args, lambda: run_memory_study(*study_arguments(args)))
    sections = {"attention_memory": render_memory_table(results)}
    speed_file = args.out / "speed.json"
    if args.speed_repeats:
        speed = measure_speed(args.speed_repeats, args.speed_steps, args.overrides, VARIANTS)
        speed["machine"] = this_machine()
        speed_file.write_text(json.dumps(speed, indent=2) + "\n")
    if speed_file.is_file():
        speed = json.loads(speed_file.read_text())
        sections["attention_memory_speed"] = render_speed(speed, list(VARIANTS), COMPARED_WITH)
    command = " ".join(["python scripts/attention_memory.py", *(argv or sys.argv[1:])])
    report = "\n\n".join([f"# Attention with memory, measured\n\n`{command}`", *sections.values()])
    (args.out / "report.md").write_text(report + "\n")
    if args.docs is not None:
        log.info("refreshed %s in %s", ", ".join(update_docs(args.docs, sections)), args.docs)
    print(report)
    return 0


if __name__ == "__main__":
    run(main)
