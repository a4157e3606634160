"""Compare finished (or running) training runs from their local files; no tracker server needed.

A run directory holds ``config.yaml``, ``metrics.csv``, ``summary.json`` (written when training
ends) and ``attention/step-*.json`` (sample translations with their attention). A Hydra multirun
directory holds one run directory per job (``0/``, ``1/``, ...).
"""

from __future__ import annotations

import csv
import json
import logging
import math
import re
import textwrap
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
from matplotlib.ticker import MaxNLocator

from seq2seq.analysis.plotting import draw_attention  # also selects the file-only backend
from seq2seq.errors import Seq2SeqError

SUMMARY_FILE = "summary.json"
METRICS_FILE = "metrics.csv"
log = logging.getLogger(__name__)

PANEL_INCHES = 4.2  # an attention grid panel's width and height
COLOUR_BAR_INCHES = 0.9  # the strip at the grid's right that holds its colour bar and label
GRID_COLUMNS = 4  # panels per row of the attention grid: a dozen runs stay readable
# Characters of a (12 pt) title per inch of figure, with a margin: a longer title is wrapped, not
# cut off at the figure's edge (one panel holds a 4.2-inch line, a long sentence does not).
TITLE_CHARS_PER_INCH = 9


class RunsError(Seq2SeqError, ValueError):
    """A path that holds no run; the message says what a run directory contains."""


@dataclass
class RunRecord:
    """What one run directory says about its run."""

    path: Path
    name: str
    summary: dict[str, Any] = field(default_factory=dict)
    metrics: list[dict[str, float]] = field(default_factory=list)  # rows of metrics.csv
    origin: Path | None = None  # the directory given that holds it (a sweep's), where known

    def series(self, column: str) -> list[tuple[int, float]]:
        """(step, value) of every row where ``column`` was logged."""
        return [(int(row["step"]), row[column]) for row in self.metrics if column in row]

    def validations(self, column: str = "val/bleu") -> list[tuple[int, float]]:
        """(updates, value) of every validation: the steps as the checkpoints, the attention
        maps and the explorer count them. Lightning logs a validation at its last batch's index,
        one less than the updates done by then (metrics.csv's 9 after 10 updates)."""
        return [(step + 1, value) for step, value in self.series(column)]

    def best(self, column: str) -> float | None:
        values = [value for _, value in self.series(column)]
        return max(values) if values else None

    def last(self, column: str) -> float | None:
        values = [value for _, value in self.series(column)]
        return values[-1] if values else None

    def latest_attention(self) -> dict[str, Any] | None:
        records = sorted((self.path / "attention").glob("step-*.json"))
        return json.loads(records[-1].read_text(encoding="utf-8")) if records else None


def is_run_dir(path: Path) -> bool:
    return (path / METRICS_FILE).is_file() or (path / SUMMARY_FILE).is_file()


def natural_key(path: Path) -> list[Any]:
    """Sorts a multirun's jobs 0, 1, 2, ..., 10 rather than 0, 1, 10, 11, 2 (numbers as numbers)."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", str(path))]


def find_runs(paths: Iterable[Path]) -> list[Path]:
    """Run directories among ``paths`` and their subdirectories (a multirun's jobs), each once:
    a run reached twice (the same directory given twice, or a job and its multirun) is read
    once, with a warning, so that it neither counts twice in a group nor meets itself."""
    return [run for run, _ in find_runs_in(paths)]


def read_runs(paths: Iterable[Path]) -> list[RunRecord]:
    """The runs of ``find_runs``, read, each with the directory given that holds it."""
    runs = []
    for path, origin in find_runs_in(paths):
        run = read_run(path)
        run.origin = origin
        runs.append(run)
    return runs


def find_runs_in(paths: Iterable[Path]) -> list[tuple[Path, Path]]:
    """``find_runs``' run directories, each with the path given that holds it."""
    runs: list[tuple[Path, Path]] = []
    seen: set[Path] = set()
    for path in paths:
        if not path.is_dir():
            what = "is a file, not a directory" if path.exists() else "does not exist"
            raise RunsError(f"{path} {what}: pass run or multirun directories.")
        jobs = (p.parent for p in path.glob("*/metrics.csv"))
        found = [path] if is_run_dir(path) else sorted(jobs, key=natural_key)
        if not found:
            raise RunsError(
                f"{path} holds no run: a run directory has metrics.csv (and summary.json once "
                "training has ended), a multirun directory has one such directory per job. "
                "Pass e.g. outputs/DATE/TIME or multirun/DATE/TIME."
            )
        again = [run for run in found if run.resolve() in seen]
        if again:  # one line for the directory given, not one per run
            verb = "was" if len(again) == 1 else "were"
            what = "it was" if again == [path] else f"{len(again)} of its {len(found)} runs {verb}"
            log.warning(
                "%s: %s given before (directly or inside a multirun given): read once", path, what
            )
        for run in found:
            if run.resolve() not in seen:
                seen.add(run.resolve())
                runs.append((run, path))
    return runs


def read_run(path: Path) -> RunRecord:
    summary: dict[str, Any] = {}
    if (path / SUMMARY_FILE).is_file():
        try:
            summary = json.loads((path / SUMMARY_FILE).read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            raise RunsError(
                f"{path / SUMMARY_FILE} is not valid JSON ({error}): the file was cut short or "
                "edited. Delete it to compare the run from its metrics.csv alone, or run its test "
                "pass again."
            ) from None
    else:
        log.warning(
            "%s has no %s (still training, or stopped before its test): its test figures are "
            "missing and its test AER column shows its last val/aer, marked (val)",
            path, SUMMARY_FILE,
        )  # fmt: skip
    metrics: list[dict[str, float]] = []
    if (path / METRICS_FILE).is_file():
        with open(path / METRICS_FILE, newline="", encoding="utf-8") as file:
            for row in csv.DictReader(file):
                metrics.append({key: float(value) for key, value in row.items() if value})
    return RunRecord(path, str(summary.get("name") or path.name), summary, metrics)


TABLE_COLUMNS = (
    "run",
    "directory",
    "attention",
    "parameters",
    "best val BLEU",
    "test BLEU",
    "test chrF",
    "test AER",
    "training time",
    "tokens/s",
)


def table_row(run: RunRecord, label: str) -> list[str]:
    """One row of the comparison, the run named ``label``; a run still training shows what
    metrics.csv has so far."""
    summary = run.summary
    best_val = summary.get("best_val_bleu", run.best("val/bleu"))
    # AER of the best checkpoint on the test split; while training, the latest validation's.
    aer = _number(summary.get("test_aer"), 3)
    if summary.get("test_aer") is None and run.last("val/aer") is not None:
        aer = f"{_number(run.last('val/aer'), 3)} (val)"
    seconds = summary.get("train_seconds")
    return [
        label,
        str(run.path),
        str(summary.get("attention") or "?"),
        f"{summary['parameters']:,}" if summary.get("parameters") else "–",
        _number(best_val, 2),
        _number(summary.get("test_bleu"), 2),
        _number(run.last("test/chrf"), 2),  # not in summary.json: metrics.csv has it
        aer,
        duration(seconds),
        _number(summary.get("train_tokens_per_s"), 0, thousands=True),
    ]


def duration(seconds: float | None) -> str:
    """A run's training time: seconds under a minute (a short run is not "0.0 min")."""
    if not seconds:
        return "–"
    return f"{seconds:.0f} s" if seconds < 60 else f"{seconds / 60:.1f} min"


def _number(value: float | None, digits: int, thousands: bool = False) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    return f"{value:,.{digits}f}" if thousands else f"{value:.{digits}f}"


def markdown_table(runs: Sequence[RunRecord], labels: Sequence[str]) -> str:
    """A row per run, named by ``labels`` (``seq2seq.analysis.groups.run_labels``)."""
    lines = [
        "| " + " | ".join(TABLE_COLUMNS) + " |",
        "|" + "---|" * len(TABLE_COLUMNS),
        *(
            "| " + " | ".join(table_row(run, label)) + " |"
            for run, label in zip(runs, labels, strict=True)
        ),
    ]
    return "\n".join(lines) + "\n"


def plot_bleu_curves(
    runs: Sequence[RunRecord],
    labels: Sequence[str],
    path: Path,
    colours: Sequence[int] | None = None,
    styles: Sequence[int] | None = None,
) -> Path:
    """val BLEU against training step, one line per run, named by ``labels``; ``colours``: each
    run's colour index (its group's, as ``bleu_bands.png`` draws it: the seeds of a group share a
    colour), else one colour per run; ``styles``: each run's line style index (its seed's, so that
    seed 2 is dashed in every group), else the runs of a colour take the styles in turn."""
    figure, axes = plt.subplots(figsize=(7, 4.5))
    try:
        # tab20: 20 distinct colours, where the default cycle repeats after 10 runs.
        palette = [plt.get_cmap("tab20")(i) for i in range(20)]
        line_styles = ("-", "--", ":", "-.")
        seen: dict[int, int] = {}  # colour index -> runs drawn in it
        for index, (run, label) in enumerate(zip(runs, labels, strict=True)):
            colour = index if colours is None else colours[index]
            turn = seen.get(colour, 0) if styles is None else styles[index]
            style = line_styles[turn % len(line_styles)]
            seen[colour] = seen.get(colour, 0) + 1
            points = run.validations("val/bleu")
            if points:
                steps, values = zip(*points, strict=True)
                axes.plot(
                    steps, values, marker="o", linestyle=style, label=label,
                    color=palette[colour % 20],
                )  # fmt: skip
        save_curves(figure, axes, "val BLEU", path)
    finally:
        plt.close(figure)
    return path


def group_colour(group_index: int) -> int:
    """The tab20 index of a group's colour in both plots: tab20's strong half (even indices)."""
    return (2 * group_index) % 20


def save_curves(figure: Any, axes: Any, ylabel: str, path: Path) -> None:
    """Label a plot of val BLEU against the training step, put the legend below it (where it
    covers no line and long labels are not cut) and save it to ``path``."""
    axes.set_xlabel("training step (updates)")
    axes.xaxis.set_major_locator(MaxNLocator(integer=True))  # one validation: no 312.5
    axes.set_ylabel(ylabel)
    axes.grid(alpha=0.3)
    if axes.get_legend_handles_labels()[0]:  # runs without val/bleu yet draw nothing
        axes.legend(loc="upper left", bbox_to_anchor=(0, -0.14), ncol=2, fontsize="small")
    figure.savefig(path, dpi=120, bbox_inches="tight")


def plot_attention_grid(
    runs: Sequence[RunRecord], labels: Sequence[str], path: Path
) -> Path | None:
    """The first sample sentence's attention map in each run's latest record, side by side,
    each panel named by its run's label.

    All runs of a comparison translate the same fixed validation sentences, so the panels show
    one sentence under each scoring function. Returns None when no run has a record yet.
    """
    panels: list[tuple[RunRecord, str, dict[str, Any], dict[str, Any]]] = []
    for run, label in zip(runs, labels, strict=True):
        record = run.latest_attention()
        if record is None:
            continue
        sentences = [s for s in record.get("sentences", []) if s.get("attention")]
        if sentences:
            panels.append((run, label, record, sentences[0]))
    if not panels:
        return None
    index = panels[0][3]["index"]
    columns = min(len(panels), GRID_COLUMNS)
    rows = math.ceil(len(panels) / columns)
    width = PANEL_INCHES * columns + COLOUR_BAR_INCHES
    figure, grid = plt.subplots(rows, columns, figsize=(width, PANEL_INCHES * rows), squeeze=False)
    try:
        for unused in grid.flat[len(panels) :]:
            unused.axis("off")
        image: Any = None  # the last panel's, for the colour bar
        for axes, (run, label, record, sentence) in zip(grid.flat, panels, strict=False):
            if sentence["index"] != index:
                raise RunsError(
                    f"{run.path} recorded other validation sentences than {panels[0][0].path}: "
                    "compare runs of the same data (same data.* settings)."
                )
            image = draw_attention(
                axes,
                sentence["src_tokens"],
                sentence["tgt_tokens"],
                sentence["attention"],
                title=wrap_title(unbroken(f"{label} (step {record['step']})"), PANEL_INCHES),
                zeros=sentence.get("zeros"),  # None in records written before they were kept
            )
        source = panels[0][3]["source"]
        # Line numbers from 1, as the explorer, --lines and every error message count them.
        title = wrap_title(f"val line {index + 1}: {source}", PANEL_INCHES * columns)
        figure.suptitle(title)
        # The panels below the suptitle's lines (about 0.3 inch each), not under them.
        top = 1 - (0.3 * (title.count("\n") + 1) + 0.1) / (PANEL_INCHES * rows)
        # One colour bar for every panel (they share the 0-1 scale), in a strip at the right.
        right = 1 - COLOUR_BAR_INCHES / width
        figure.tight_layout(rect=(0, 0, right, top))
        bar = figure.add_axes((right + 0.1 / width, 0.15, 0.15 / width, top - 0.3))
        figure.colorbar(image, cax=bar, label="weight (hatched: exactly 0)")
        figure.savefig(path, dpi=120)
    finally:
        plt.close(figure)
    return path


NO_BREAK = "\u00a0"  # a no-break space, which textwrap does not break at


def unbroken(title: str) -> str:
    """``title`` with no line break inside "seed 1" or "step 626"."""
    return title.replace("seed ", f"seed{NO_BREAK}").replace("step ", f"step{NO_BREAK}")


def wrap_title(text: str, inches: float) -> str:
    """``text`` in lines that fit ``inches`` of figure."""
    # A word longer than a line (a run directory's name) is cut rather than run off the figure.
    return textwrap.fill(text, width=int(inches * TITLE_CHARS_PER_INCH))
