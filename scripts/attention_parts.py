"""Measure the attention's normalizer, window and key bias on the toy task over seeds.

    python scripts/attention_parts.py --runs outputs/attention_parts [--seeds 1 2 3]
        [--epochs 2] [--jobs 2] [--out docs/attention_parts] [--docs docs/attention.md]
        [--speed-repeats 2 --speed-steps 150] [--speed-only]

Trains the default model with each switch of ``benchmarks/attention_parts.py`` (sparsemax,
entmax15, local_m, local_p, key_bias) and the softmax/global baseline, for additive and scaled_dot
scoring and each seed, ``--jobs`` runs at a time with one thread each (runs already in ``--runs``
are kept); scores every best checkpoint; writes ``results.json`` and ``report.md`` (mean and 95 %
interval over the seeds) to ``--out``, and refreshes the generated blocks of ``--docs``. Three
seeds of fourteen settings at 2 epochs take about two hours on 2 CPU cores. ``--speed-repeats``
also times every setting on a quiet machine, one run at a time (``speed.json``, the
``attention_parts_speed`` block): the runs above share the cores with each other, so their own
tokens/s are not shown. ``--speed-only`` trains nothing: it times the settings and renders the
tables from ``--out``'s ``results.json``.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

# benchmarks/ sits beside scripts/ in a checkout and is not installed with the package.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.attention_parts import (
    add_speed_arguments,
    add_study_arguments,
    crossover_table,
    measure_speed,
    plot_key_bias,
    render_speed,
    render_table,
    run_all,
    study_arguments,
    study_results,
    this_machine,
)
from benchmarks.attention_report import update_docs
from seq2seq.cli import run

log = logging.getLogger("seq2seq")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_study_arguments(parser, Path("docs/attention_parts"))
    add_speed_arguments(parser)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    results = study_results(args, lambda: run_all(*study_arguments(args)))
    sections = {"attention_parts": render_table(results), "crossover": crossover_table()}
    speed_file = args.out / "speed.json"
    if args.speed_repeats:
        speed = measure_speed(args.speed_repeats, args.speed_steps, args.overrides)
        speed["machine"] = this_machine()
        speed_file.write_text(json.dumps(speed, indent=2) + "\n")
    if speed_file.is_file():
        sections["attention_parts_speed"] = render_speed(json.loads(speed_file.read_text()))
    plot = None if args.runs is None else plot_key_bias(args.runs, args.out / "key_bias.png")
    if plot is not None:
        log.info("wrote %s", plot)
    command = " ".join(["python scripts/attention_parts.py", *(argv or sys.argv[1:])])
    report = "\n\n".join([f"# The attention's parts, measured\n\n`{command}`", *sections.values()])
    (args.out / "report.md").write_text(report + "\n")
    if args.docs is not None:
        log.info("refreshed %s in %s", ", ".join(update_docs(args.docs, sections)), args.docs)
    print(report)
    return 0


if __name__ == "__main__":
    run(main)
