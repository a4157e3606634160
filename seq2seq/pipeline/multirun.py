"""What a multirun leaves once all its jobs are done: its runs as results.

``MultirunSummary`` is a Hydra callback (``hydra.callbacks`` in ``conf/config.yaml``): after the
last job of ``python train.py -m ...`` it groups the sweep's runs by their config but the seed,
writes the groups' figures with their intervals over seeds and the paired tests between the groups
(``seq2seq.analysis.groups``, what ``scripts/compare_runs.py`` prints) to ``SWEEP/comparison.md``,
and, with ``logger=wandb``, logs the same tables to one more W&B run of the sweep's group
(``job_type`` ``summary``; offline where the training runs were), so that a W&B user reads the
same conclusions.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from seq2seq.analysis.compare import RunsError, find_runs, markdown_table, read_run
from seq2seq.analysis.groups import (
    ONE_GROUP_NOTE,
    compare_groups,
    flat_config,
    group_runs,
    groups_numbers,
    groups_rows,
    groups_table,
    run_labels,
    significance_rows,
    significance_table,
)
from seq2seq.training.loggers import log_summary_tables

log = logging.getLogger(__name__)

SUMMARY_FILE = "comparison.md"


class MultirunSummary(Callback):
    """The Hydra callback that summarises a multirun (module docstring)."""

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep = Path(str(config.hydra.sweep.dir))
        try:
            summarise(sweep, config)
        except RunsError as error:  # a sweep whose runs cannot be read as results: say why
            log.warning("no summary of %s: %s", sweep, error)


def summarise(sweep: Path, config: DictConfig) -> dict[str, tuple[list[str], list[list[Any]]]]:
    """Write ``SWEEP/comparison.md`` and log its tables to W&B; returns the tables."""
    runs = [read_run(path) for path in find_runs([sweep])]
    groups = group_runs(runs)
    tables: dict[str, tuple[list[str], list[list[Any]]]] = {
        "groups": groups_rows(groups), "group_numbers": groups_numbers(groups),
    }  # fmt: skip
    text = [
        f"# {sweep}\n",
        markdown_table(runs, run_labels(runs, groups)),  # each run, as compare prints it
        "\nGroups (mean ± 95 % interval over seeds):\n",
        groups_table(groups),  # with its notes (cut intervals, too few seeds), as compare prints
    ]
    if len(groups) == 1:
        text.append(f"\n{ONE_GROUP_NOTE}\n")
    else:
        tokenize = str(flat_config(runs[0]).get("data.bleu_tokenize", "13a"))
        try:
            comparisons = compare_groups(groups, tokenize)
            tables["paired_tests"] = significance_rows(comparisons, "ar")
            text += ["\nPaired tests:\n", significance_table(comparisons, "ar")]
        except RunsError as error:
            text.append(f"\nNo paired tests: {error}\n")
    (sweep / SUMMARY_FILE).write_text("\n".join(text), encoding="utf-8")
    log.info("the multirun's groups and paired tests: %s", sweep / SUMMARY_FILE)
    logger = OmegaConf.select(config, "logger", default=None)
    if logger is not None and str(logger.get("_target_", "")).endswith("wandb_logger"):
        log_summary_tables(
            sweep, tables, name="summary", group=str(logger.get("group") or sweep),
            project=str(logger.get("project", "seq2seq")), entity=logger.get("entity"),
            mode=str(logger.get("mode", "auto")),
            init_timeout=float(logger.get("init_timeout", 60.0)),
        )  # fmt: skip
    return tables
