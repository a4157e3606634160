"""Runs read as results: grouped by their config but the seed, each group's figures with an
interval over its seeds, paired significance between groups, and val BLEU curves with bands.

Clark et al. (2011) ask two things of a comparison of MT systems: several runs of each (an
optimizer's seed moves BLEU by itself) with their spread, and a paired test on the same sentences.
A group here is every run whose ``config.yaml`` is the same but for the seed (and the keys in
``NOT_THE_EXPERIMENT``, which say where and how a run ran, not what it trained), or the same in
the keys ``--by`` names. A difference between two groups is *beyond the seed-to-seed spread* when
their 95 % intervals over seeds do not overlap (``seq2seq.analysis.intervals``). The paired tests
(``seq2seq.analysis.significance``) run on the test sentences every run kept
(``test_hypotheses.txt``, ``test_alignments.tsv``): one stratified approximate randomization over
all seeds at once (the answer a paper reports), and as detail, each seed of one group against the
same seed of the other.
"""

from __future__ import annotations

import itertools
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import yaml

from seq2seq.analysis.alignment import AlignmentCounts
from seq2seq.analysis.compare import RunRecord, RunsError, group_colour, save_curves
from seq2seq.analysis.intervals import Interval, mean_interval
from seq2seq.analysis.metrics import TEST_ALIGNMENTS, TEST_HYPOTHESES, TEST_REFERENCES
from seq2seq.analysis.significance import (
    DEFAULT_SAMPLES,
    SHUFFLES,
    Score,
    aer_statistics,
    corpus_aer,
    paired_translation_test,
    stratified_randomization,
    translation_statistics,
)

log = logging.getLogger(__name__)

CONFIG_FILE = "config.yaml"

# Config keys (and key prefixes) that say where and how a run ran, not what it trained; and the
# seed, with data.module.seed, which the resolved config copies from it.
NOT_THE_EXPERIMENT = (
    "seed", "data.module.seed", "run_dir", "ckpt_path", "trust_modules", "threads", "logger",
    "data.cache_dir", "trainer.enable_progress_bar", "test_after_training", "examples",
    "checkpoint",
)  # fmt: skip

# (summary or metric key, column name, digits): the figures of a group; BLEU and chrF to 2, as
# sacreBLEU prints them (at 1, a toy task's 99.96 read as a perfect 100.0).
FIGURES = (
    ("test_bleu", "test BLEU", 2),
    ("test_chrf", "test chrF", 2),
    ("test_aer", "test AER", 3),
    ("best_val_bleu", "best val BLEU", 2),
    ("train_tokens_per_s", "tokens/s", 0),
)
# What each figure can be: its interval is cut there (and marked).
RANGES = {
    "test_bleu": (0.0, 100.0), "test_chrf": (0.0, 100.0), "test_aer": (0.0, 1.0),
    "best_val_bleu": (0.0, 100.0), "train_tokens_per_s": (0.0, math.inf),
}  # fmt: skip
# Fewer seeds than this give an interval too wide to separate anything (t_{0.975, 1} = 12.7).
ENOUGH_SEEDS = 3


@dataclass
class Group:
    """Runs of one setting: ``label`` names what sets it apart from the other groups."""

    label: str
    runs: list[RunRecord]

    @property
    def seeds(self) -> list[Any]:
        return [run_seed(run) for run in self.runs]


def flat_config(run: RunRecord) -> dict[str, Any]:
    """The run's ``config.yaml`` as ``{"a.b.c": value}``."""
    path = run.path / CONFIG_FILE
    if not path.is_file():
        raise RunsError(
            f"{run.path} has no {CONFIG_FILE}, so it cannot be grouped with other runs by its "
            "settings: compare run directories that train.py wrote, or name the groups' keys "
            "with --by."
        )
    return flatten(yaml.safe_load(path.read_text(encoding="utf-8")) or {})


def flatten(node: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(node, dict):
        return {prefix: node}
    flat: dict[str, Any] = {}
    for key, value in node.items():
        flat.update(flatten(value, f"{prefix}.{key}" if prefix else str(key)))
    return flat


def run_seed(run: RunRecord) -> Any:
    return flat_config(run).get("seed")


def experiment_keys(config: dict[str, Any]) -> dict[str, Any]:
    """The keys of a flat config that define what the run trained."""
    return {key: value for key, value in config.items() if not experiment_free(key)}


INPUT = "input"  # --by input: the directory given (a sweep's) rather than a config key
ONE_GROUP = "all runs"  # the label of a single group that no override or config key names
ONE_GROUP_NOTE = (
    "One group: every run has the same setting (they differ by their seed alone), so there is "
    "nothing to test it against: compare it with runs of another setting (seq2seq compare DIR "
    "OTHER_DIR), or, for two sweeps of one setting, test one directory against the other with "
    "--by input."
)


def group_runs(runs: Sequence[RunRecord], by: Sequence[str] | None = None) -> list[Group]:
    """Runs grouped by their config but the seed, or by the keys ``by`` (in first-seen order);
    each group labelled with the keys whose values tell the groups apart."""
    configs = [flat_config(run) for run in runs]
    if by and any(key == "seed" or key.startswith("seed.") for key in by):
        raise RunsError(
            "--by seed would make each seed a group, while a group's interval and its paired "
            "tests are over its seeds: they would compare seeds across settings. Group by "
            "settings (the default, or --by a setting's keys); each run, seed by seed, is in "
            "the runs table."
        )
    if by and INPUT in by:  # the directory given that holds the run: two sweeps of one setting
        configs = [
            {**config, INPUT: str(run.origin or run.path)}
            for config, run in zip(configs, runs, strict=True)
        ]
    if by:
        # A section (``attention``) stands for every key under it (``attention._target_``, ...).
        expanded = {
            key: sorted({name for config in configs for name in config if name == key
                         or name.startswith(f"{key}.")})
            for key in by
        }  # fmt: skip
        unknown = [key for key, names in expanded.items() if not names]
        if unknown:
            raise RunsError(
                f"--by {' '.join(unknown)}: no run's {CONFIG_FILE} has "
                f"{'this key' if len(unknown) == 1 else 'these keys'}. Name keys or sections as "
                "the config writes them, e.g. --by attention, --by attention._target_ "
                "attention.scaled; --by input groups by the directory given."
            )
        names = [name for key in by for name in expanded[key]]
        keys = [{name: config.get(name) for name in names} for config in configs]
    else:
        keys = [experiment_keys(config) for config in configs]
    grouped: dict[str, tuple[dict[str, Any], list[RunRecord]]] = {}
    for key, run in zip(keys, runs, strict=True):
        grouped.setdefault(repr(sorted(key.items(), key=str)), (key, []))[1].append(run)
    members = [runs_ for _, runs_ in grouped.values()]
    labels = override_labels(members) or config_labels([key for key, _ in grouped.values()])
    groups = [
        Group(label or ONE_GROUP, runs_) for label, runs_ in zip(labels, members, strict=True)
    ]
    for group in groups:
        warn_repeated_seeds(group, by)
    return groups


def run_labels(runs: Sequence[RunRecord], groups: Sequence[Group]) -> list[str]:
    """Each run named by its setting and its seed (``attention=dot, seed 2``) in every table,
    plot and explorer: the setting is its group's label, or where all runs are one group, the
    attention the run trained (its summary's). A run without a seed, or one whose name another
    run shares (a repeated seed), adds its directory's name, or its path where those match too."""
    group_of = {id(run): group for group in groups for run in group.runs}
    within = settings_within(groups)
    bases = []
    for run in runs:
        setting = group_of[id(run)].label if id(run) in group_of else ONE_GROUP
        if setting == ONE_GROUP:  # nothing sets it apart: the attention it trained names it
            setting = str(run.summary.get("attention") or run.name)
        if within.get(id(run)):  # a group of several settings (--by): the run's own too
            setting = f"{setting}: {within[id(run)]}"
        seed = run_seed(run)
        bases.append(setting if seed is None else f"{setting}, seed {seed}")
    named = [f"{base} ({run.path.name})" for base, run in zip(bases, runs, strict=True)]
    pathed = [f"{base} ({run.path})" for base, run in zip(bases, runs, strict=True)]
    return [
        base if bases.count(base) == 1 and run_seed(run) is not None
        else name if named.count(name) == 1 else path
        for base, name, path, run in zip(bases, named, pathed, runs, strict=True)
    ]  # fmt: skip


def settings_within(groups: Sequence[Group]) -> dict[int, str]:
    """Where a group holds runs of several settings (grouped --by fewer keys than they differ
    in), each run's setting within it by the config keys that tell them apart, by run id."""
    found: dict[int, str] = {}
    for group in filter(several_settings, groups):
        keys = [experiment_keys(flat_config(run)) for run in group.runs]
        for run, label in zip(group.runs, config_labels(keys), strict=True):
            found[id(run)] = label
    return found


def several_settings(group: Group) -> bool:
    """Whether the group's runs differ in more than their seed."""
    keys = {repr(sorted(experiment_keys(flat_config(run)).items(), key=str)) for run in group.runs}
    return len(keys) > 1


def warn_repeated_seeds(group: Group, by: Sequence[str] | None = None) -> None:
    """Two runs of one seed in a group are not two samples of the seed's effect: say so, and
    what would split them (not what was just used)."""
    seeds = [str(seed) for seed in group.seeds]
    repeated = sorted({seed for seed in seeds if seeds.count(seed) > 1})
    if not repeated:
        return
    if several_settings(group):
        advice = (
            "its runs are of several settings: group by the keys that tell them apart (the "
            "default groups by every key but the seed)"
        )
    elif by and INPUT in by:
        advice = "they are the same setting, run twice in one directory: give each its own seed"
    else:
        advice = (
            "give each run its own seed, or for two sweeps of one setting, --by input (a group "
            "per directory given)"
        )
    log.warning(
        "group %s holds several runs of seed %s (%s): its interval counts them as independent "
        "and it has no paired tests (they need one run a seed); %s",
        group.label, ", ".join(repeated),
        ", ".join(str(run.path) for run in group.runs if str(run_seed(run)) in repeated), advice,
    )  # fmt: skip


def override_labels(groups: Sequence[Sequence[RunRecord]]) -> list[str] | None:
    """Each group named by the command-line overrides that set it apart (``attention=additive``),
    from each run's ``.hydra/overrides.yaml`` without those of where and how it ran (its seed,
    threads, logger: ``NOT_THE_EXPERIMENT``) and those every group shares, sorted by key as
    ``config_labels`` sorts them, so that a setting reads the same in every comparison it is
    part of; a single group by all its overrides but the trainer's (how long it trained, which
    two sweeps compared share). None where a run has none recorded, the runs of a group were
    started with different ones, or the groups override different keys (a setting left at its
    default has no override to name it: the config's keys do)."""
    per_group = []
    for runs in groups:
        found = {run_overrides(run) for run in runs}
        if len(found) != 1 or None in found:
            return None
        per_group.append(tuple(sorted(found.pop() or (), key=lambda o: o.split("=", 1)[0])))
    if len(per_group) == 1:  # one group: what it overrides sets it apart from the defaults
        return [", ".join(o for o in per_group[0] if not o.startswith("trainer."))]
    override_keys = {frozenset(o.split("=", 1)[0] for o in overrides) for overrides in per_group}
    if len(override_keys) != 1:
        return None
    shared = set.intersection(*(set(overrides) for overrides in per_group))
    labels = [", ".join(o for o in overrides if o not in shared) for overrides in per_group]
    return labels if len(set(labels)) == len(labels) else None


def run_overrides(run: RunRecord) -> tuple[str, ...] | None:
    """The command-line overrides the run was started with but those of where and how it ran
    (``.hydra/overrides.yaml``), None where it has none recorded."""
    path = run.path / ".hydra" / "overrides.yaml"
    if not path.is_file():
        return None
    overrides = yaml.safe_load(path.read_text(encoding="utf-8")) or []
    return tuple(o for o in map(str, overrides) if not experiment_free(o.split("=", 1)[0]))


def experiment_free(key: str) -> bool:
    """Whether a config key (an override's, ``+key`` or ``~key`` too) says where and how a run
    ran rather than what it trained (``NOT_THE_EXPERIMENT``)."""
    key = key.lstrip("+~")
    return any(key == name or key.startswith(f"{name}.") for name in NOT_THE_EXPERIMENT)


def config_labels(settings: Sequence[dict[str, Any]]) -> list[str]:
    """Each group named by the config keys whose values differ: where a scoring function's
    ``_target_`` differs, only it and the keys every group has (not the keys one class takes and
    another lacks), a ``_target_`` by its class name."""
    differing = sorted(
        name
        for name in {name for key in settings for name in key}
        if len({repr(key.get(name)) for key in settings}) > 1
        and (name.endswith("._target_") or all(name in key for key in settings))
    )
    labels = []
    for key in settings:
        parts = []
        for name in differing:
            value = key.get(name)
            if name.endswith("._target_") and isinstance(value, str):
                name, value = name.removesuffix("._target_"), value.rsplit(".", 1)[-1]
            parts.append((f"{name}={'unset' if value is None else value}", value is None))
        # A key that does not apply to a group (α of a normalizer without one: null) is left
        # out of its label, unless that leaves two groups alike.
        labels.append(
            (", ".join(p for p, _ in parts), ", ".join(p for p, unset in parts if not unset))
        )
    short = [brief for _, brief in labels]
    if all(short) and len(set(short)) == len(short):
        return short
    return [full for full, _ in labels]


def figure_of(run: RunRecord, key: str) -> float | None:
    """A run's figure: from ``summary.json``, or test chrF from ``metrics.csv``."""
    if key == "test_chrf":
        return run.last("test/chrf")
    value = run.summary.get(key)
    return None if value is None else float(value)


def group_figures(group: Group) -> dict[str, Interval | float | None]:
    """Each figure over the group's runs: an interval with two runs or more, else the value."""
    figures: dict[str, Interval | float | None] = {}
    for key, _, _ in FIGURES:
        values = [v for run in group.runs if (v := figure_of(run, key)) is not None]
        if len(values) >= 2:
            figures[key] = mean_interval(values, bounds=RANGES[key])
        else:
            figures[key] = values[0] if values else None
    return figures


def markdown(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def groups_table(groups: Sequence[Group]) -> str:
    """Markdown: a row per group, n runs, each figure's mean ± 95 % half-width over seeds; and
    under it what a reader must know: intervals cut at a figure's range, groups of fewer than
    ``ENOUGH_SEEDS`` seeds."""
    table = markdown(*groups_rows(groups))
    return table + "".join(f"\n{note}\n" for note in interval_notes(groups))


def interval_notes(groups: Sequence[Group]) -> list[str]:
    """The footnotes of ``groups_table`` (also what the console says)."""
    notes = []
    figures = [group_figures(group) for group in groups]
    if any(isinstance(v, Interval) and v.clipped for f in figures for v in f.values()):
        notes.append(
            "† the 95 % t interval reached past what the figure can be (BLEU and chrF 0-100, "
            "AER 0-1, tokens/s 0 or more) and is shown cut there, as [low, high]."
        )
    alone = [group.label for group in groups if len(group.runs) == 1]
    if alone:
        notes.append(
            f"{', '.join(alone)}: one run, so no interval and nothing about the seed-to-seed "
            f"spread: train {ENOUGH_SEEDS} seeds or more (seed=1,2,3) before reading a difference."
        )
    repeated = [group for group in groups if repeats_seeds(group)]
    for mixed in (False, True):
        named = [group.label for group in repeated if several_settings(group) == mixed]
        if named:
            why = (
                "its runs are of several settings: group by the keys that tell them apart"
                if mixed
                else "two sweeps of one setting? --by input makes a group of each directory"
            )
            notes.append(
                f"‡ {', '.join(named)}: several runs of one seed, which the interval counts as "
                f"independent (too narrow); no paired tests; {why}."
            )
    few = [group.label for group in groups if 1 < len(group.runs) < ENOUGH_SEEDS]
    if few:
        notes.append(
            f"{', '.join(few)}: fewer than {ENOUGH_SEEDS} seeds. With 2 the t interval is ±12.7 "
            "standard errors wide and separates almost nothing: train 3 seeds "
            "or more (seed=1,2,3) before reading a difference."
        )
    return notes


def groups_rows(groups: Sequence[Group]) -> tuple[list[str], list[list[str]]]:
    """``groups_table``'s header and cells (what the W&B summary table holds too)."""
    header = ["group", "runs", *(name for _, name, _ in FIGURES)]
    rows = []
    for group in groups:
        cells = [group.label + (" ‡" if repeats_seeds(group) else ""), str(len(group.runs))]
        for (_, _, digits), value in zip(FIGURES, group_figures(group).values(), strict=True):
            if isinstance(value, Interval):
                cells.append(value.format(digits))
            elif value is None or math.isnan(value):
                cells.append("–")
            else:
                cells.append(f"{value:,.{digits}f}")
        rows.append(cells)
    return header, rows


def groups_numbers(groups: Sequence[Group]) -> tuple[list[str], list[list[Any]]]:
    """``groups_table``'s figures as numbers, a row per group and figure (group, runs, figure,
    mean, 95 % half-width, the interval's low and high ends, None each for one run): what W&B
    can sort and plot, where the table's cells are text. An interval cut at the figure's range
    has the ends where it was cut."""
    header = ["group", "runs", "figure", "mean", "half_width", "low", "high"]
    rows: list[list[Any]] = []
    for group in groups:
        for (_, name, _), value in zip(FIGURES, group_figures(group).values(), strict=True):
            runs = len(group.runs)
            if isinstance(value, Interval):
                interval = [value.mean, value.half_width, value.low, value.high]
                rows.append([group.label, runs, name, *interval])
            elif value is not None and not math.isnan(value):
                rows.append([group.label, runs, name, value, None, None, None])
    return header, rows


@dataclass(frozen=True)
class Comparison:
    """Group ``system`` against group ``baseline`` on one metric: the difference of the means,
    whether it is beyond the seed-to-seed spread (None: a group has one run), the p-value of the
    stratified test over all seed pairs (``shuffles`` shuffles), and the p-values of each seed
    pair's own test."""

    baseline: str
    system: str
    metric: str
    difference: float
    beyond_spread: bool | None
    p_value: float
    shuffles: int
    p_values: tuple[float, ...]
    seeds: tuple[str, ...] = ()  # each seed pair's seed ("1", or "1/2" where they differ)
    pair_differences: tuple[float | None, ...] = ()  # each seed pair's system minus baseline
    untested: tuple[str, ...] = ()  # the runs in Δ mean without a partner in the tests
    resamples: int | None = None  # the per-pair paired bootstrap's (None: randomization)

    @property
    def pairs(self) -> int:
        """The seed pairs both tests ran on."""
        return len(self.p_values)


def read_lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()


def read_alignments(path: Path) -> list[AlignmentCounts] | None:
    """``test_alignments.tsv`` as counts per sentence (a sentence without gold links has none)."""
    if not path.is_file():
        return None
    counts = []
    for line in read_lines(path):
        if line == "-":
            counts.append(AlignmentCounts())
        else:
            hits_sure, hits_possible, predicted, sure = (int(v) for v in line.split("\t"))
            counts.append(AlignmentCounts(hits_sure, hits_possible, predicted, sure))
    return counts


def untestable(run_a: RunRecord, run_b: RunRecord) -> str | None:
    """Why two runs cannot be tested against each other (a run without its test records, or
    runs of different test sets), or None."""
    for run in (run_a, run_b):
        if not run.path.is_dir():
            return f"{run.path} does not exist (or is not a directory): pass run directories."
        for name in (TEST_HYPOTHESES, TEST_REFERENCES):
            if not (run.path / name).is_file():
                return (
                    f"{run.path} has no {name}: a paired test needs each run's translations of "
                    "the test set, which train.py keeps beside summary.json since this version "
                    "(runs trained before it, or with test_after_training=false, have none). "
                    "Score the run again (seq2seq evaluate --hyp-out) or retrain it; "
                    "without paired tests, compare the intervals alone."
                )
    if read_lines(run_a.path / TEST_REFERENCES) != read_lines(run_b.path / TEST_REFERENCES):
        return (
            f"{run_a.path} and {run_b.path} were tested on different sentences "
            f"({TEST_REFERENCES} differ): a paired test compares translations of the same "
            "test set. Compare runs of the same data.* settings."
        )
    return None


def seed_pairs(baseline: Group, system: Group) -> list[tuple[RunRecord, RunRecord]]:
    """Runs of the two groups paired by seed where both have the seed, the others in order of
    seed; one run per seed (a repeated seed's first), as many pairs as the smaller group has
    seeds."""

    def ordered(group: Group) -> list[RunRecord]:
        first: dict[str, RunRecord] = {}
        for run in group.runs:
            first.setdefault(str(run_seed(run)), run)
        return [first[seed] for seed in sorted(first)]

    runs_a, runs_b = ordered(baseline), ordered(system)
    shared = {str(run_seed(run)) for run in runs_a} & {str(run_seed(run)) for run in runs_b}
    by_seed = {str(run_seed(run)): run for run in runs_b}
    pairs = [(run, by_seed[str(run_seed(run))]) for run in runs_a if str(run_seed(run)) in shared]
    rest_a, rest_b = (
        [run for run in runs if str(run_seed(run)) not in shared] for runs in (runs_a, runs_b)
    )
    return pairs + list(zip(rest_a, rest_b, strict=False))


def compare_groups(
    groups: Sequence[Group],
    bleu_tokenize: str,
    test: str = "ar",
    samples: int | None = None,
) -> list[Comparison]:
    """Every pair of groups (the first as baseline), on BLEU, chrF and (with gold links) AER:
    the stratified test over the seed pairs, and each seed pair's test (``test``: ``ar``,
    approximate randomization, or ``bs``, sacreBLEU's paired bootstrap; AER always the former).
    ``samples``: bootstrap resamples, or with ``ar`` the shuffles of every randomization test.
    A pair of runs that cannot be tested (``untestable``) is left out with a warning; a
    RunsError where no pair can be."""
    comparisons = []
    problems: list[str] = []
    skipped: list[str] = []  # pairs of groups, each said once
    shuffles = samples if test == "ar" and samples else SHUFFLES
    resamples = samples or DEFAULT_SAMPLES["bs"]  # --test bs: sacreBLEU's, per seed pair
    say_tests(groups, test, shuffles, resamples)
    for baseline, system in itertools.combinations(groups, 2):
        repeated = [group.label for group in (baseline, system) if repeats_seeds(group)]
        if repeated:  # which run of a seed would be tested is arbitrary: none is
            skipped.append(
                f"{system.label} against {baseline.label}: "
                f"{' and '.join(repeated)} holds several runs of one seed, of which a test "
                "would take one only"
            )
            continue
        pairs = []
        for run_a, run_b in seed_pairs(baseline, system):
            problem = untestable(run_a, run_b)
            if problem is None:
                pairs.append((run_a, run_b))
            else:
                problems.append(problem)
        if pairs:
            comparisons += compare_two_groups(
                baseline, system, pairs, bleu_tokenize, test, samples, shuffles
            )
    for line in skipped:
        log.warning("no paired tests of %s", line)
    if (problems or skipped) and not comparisons:
        raise RunsError((problems or skipped)[0])
    for problem in dict.fromkeys(problems):  # each once
        log.warning("a pair of runs is left out of the paired tests: %s", problem)
    return comparisons


def say_tests(groups: Sequence[Group], test: str, shuffles: int, resamples: int) -> None:
    """The tests take a while (each shuffle rescores the pooled corpus): say what is running."""
    testable = [group for group in groups if not repeats_seeds(group)]
    each_pair = (
        "randomization too" if test == "ar"
        else f"sacreBLEU's paired bootstrap, {resamples:,} resamples; AER by randomization"
    )  # fmt: skip
    log.info(
        "paired tests: %d pair(s) of groups on BLEU, chrF and AER, seeds pooled (approximate "
        "randomization, %s shuffles) and per seed pair (%s)...",
        len(testable) * (len(testable) - 1) // 2, f"{shuffles:,}", each_pair,
    )  # fmt: skip


def compare_two_groups(
    baseline: Group,
    system: Group,
    pairs: Sequence[tuple[RunRecord, RunRecord]],
    bleu_tokenize: str,
    test: str,
    samples: int | None,
    shuffles: int,
) -> list[Comparison]:
    """``system`` against ``baseline`` on each metric both have, over their seed ``pairs``."""
    statistics = paired_statistics(pairs, bleu_tokenize)
    bootstrapped = bootstrap_p_values(pairs, bleu_tokenize, samples) if test == "bs" else {}
    figures = [group_figures(baseline), group_figures(system)]
    comparisons = []
    for metric, key in (("BLEU", "test_bleu"), ("chrF", "test_chrf"), ("AER", "test_aer")):
        if metric not in statistics:
            continue
        first, second = (figure[key] for figure in figures)
        means = [v.mean if isinstance(v, Interval) else v for v in (first, second)]
        if means[0] is None or means[1] is None:
            continue
        beyond = None
        if isinstance(first, Interval) and isinstance(second, Interval):
            beyond = first.separates_from(second)
        sides, score = statistics[metric]
        pooled = stratified_randomization(metric, sides[0], sides[1], score, shuffles)
        per_pair = (
            bootstrapped[metric]
            if metric in bootstrapped  # AER has no bootstrap here: always randomization
            else randomization_p_values(metric, sides, score, shuffles)
        )
        comparisons.append(
            Comparison(
                baseline.label, system.label, metric, means[1] - means[0], beyond,
                pooled.p_value, shuffles, per_pair, pair_seeds(pairs),
                pair_differences(pairs, key), untested_runs(baseline, system, pairs),
                (samples or DEFAULT_SAMPLES["bs"]) if metric in bootstrapped else None,
            )
        )  # fmt: skip
    return comparisons


Sides = tuple[np.ndarray, np.ndarray]  # the baseline's and the system's statistics, (R, N, k)


def paired_statistics(
    pairs: Sequence[tuple[RunRecord, RunRecord]], bleu_tokenize: str
) -> dict[str, tuple[Sides, Score]]:
    """Per metric, both sides' sentence statistics over the seed pairs, and the metric's score
    of summed statistics; AER only where every run of the pairs has its links."""
    per_run: list[list[dict[str, tuple[np.ndarray, Score]]]] = [[], []]
    for pair in pairs:
        references = read_lines(pair[0].path / TEST_REFERENCES)
        for side, run in zip(per_run, pair, strict=True):
            found = translation_statistics(
                read_lines(run.path / TEST_HYPOTHESES), references, bleu_tokenize
            )
            alignments = read_alignments(run.path / TEST_ALIGNMENTS)
            if alignments is not None:
                found["AER"] = (aer_statistics(alignments), corpus_aer)
            side.append(found)
    metrics = set.intersection(*(set(found) for side in per_run for found in side))
    return {
        metric: (
            (
                np.stack([found[metric][0] for found in per_run[0]]),
                np.stack([found[metric][0] for found in per_run[1]]),
            ),
            per_run[0][0][metric][1],
        )
        for metric in ("BLEU", "chrF", "AER")
        if metric in metrics
    }


def bootstrap_p_values(
    pairs: Sequence[tuple[RunRecord, RunRecord]], bleu_tokenize: str, samples: int | None
) -> dict[str, tuple[float, ...]]:
    """Each seed pair's p-values of sacreBLEU's paired bootstrap, BLEU and chrF from one test
    of the pair (exactly as its command line runs it)."""
    p_values: dict[str, list[float]] = {"BLEU": [], "chrF": []}
    for run_a, run_b in pairs:
        for result in paired_translation_test(
            read_lines(run_a.path / TEST_HYPOTHESES),
            read_lines(run_b.path / TEST_HYPOTHESES),
            read_lines(run_a.path / TEST_REFERENCES),
            bleu_tokenize, "bs", samples,
        ):  # fmt: skip
            p_values[result.metric].append(result.p_value)
    return {metric: tuple(values) for metric, values in p_values.items()}


def randomization_p_values(
    metric: str, sides: Sides, score: Score, shuffles: int
) -> tuple[float, ...]:
    """Each seed pair's p-value of the randomization test of the pair alone."""
    return tuple(
        stratified_randomization(
            metric, sides[0][i : i + 1], sides[1][i : i + 1], score, shuffles
        ).p_value
        for i in range(sides[0].shape[0])
    )


FINDING_P = 0.05  # p (seeds pooled) below this, and beyond the seed spread: a finding


def significance_table(
    comparisons: Sequence[Comparison], test: str, verdict_line: bool = True
) -> str:
    """Markdown: each pair and metric, the difference of means, the test over seeds, the seed
    pairs' p-values (*: below 0.05), whether the difference is beyond the seed-to-seed spread
    and whether both make it a finding; a note that says how to read them, and the verdict
    (``verdict_line``: not for two single runs, of which no finding can be read)."""
    last = f"\n{verdict(comparisons)}\n" if verdict_line else ""
    return markdown(*significance_rows(comparisons, test)) + significance_note(comparisons) + last


def is_finding(comparison: Comparison) -> bool | None:
    """p (seeds pooled) below ``FINDING_P`` and beyond the seed spread; None with one run a group
    (nothing can be said about seeds)."""
    if comparison.beyond_spread is None:
        return None
    return comparison.p_value < FINDING_P and comparison.beyond_spread


def verdict(comparisons: Sequence[Comparison]) -> str:
    """One line that reads the table: which differences are findings, or that none is."""
    found = [c for c in comparisons if is_finding(c)]
    if all(is_finding(c) is None for c in comparisons):
        return (
            "Findings: none can be read: in every pair, one group has a single run, whose "
            "seed-to-seed spread is unknown (train 3 seeds or more, seed=1,2,3)."
        )
    if not found:
        small = sum(1 for c in comparisons if c.p_value < FINDING_P)
        why = (
            f"; {small} with p (seeds pooled) below {FINDING_P}, none beyond the seed spread"
            if small
            else ""
        )
        return f"Findings: none of the {len(comparisons)} differences{why}."
    named = "; ".join(
        f"{c.system} against {c.baseline}, {c.metric} {difference_text(c)}" for c in found
    )
    return f"Findings: {len(found)} of the {len(comparisons)} differences: {named}."


def significance_note(comparisons: Sequence[Comparison]) -> str:
    """How to read the paired tests, with the smallest p the test over seeds can give."""
    shuffles = {comparison.shuffles for comparison in comparisons}
    floor = ", ".join(f"{1 / (n + 1):.4f} with {n:,} shuffles" for n in sorted(shuffles))
    return (
        "\nΔ mean: system minus baseline (higher is better for BLEU and chrF, lower for AER), "
        "the means over each group's runs (and where some are "
        "untested, the mean of the tested pairs' own Δ beside it). Seed pairs: the runs "
        "the tests compare, one of each group per seed (the same seed where both groups have "
        "it; a run without a partner is in Δ mean but not in the tests). p (seeds pooled): "
        "stratified approximate randomization (Clark et al., 2011, as MultEval): the pairs' "
        "translations pooled as one corpus, each test sentence's translations dealt anew "
        f"between the two groups in each shuffle; the smallest p it can give is {floor or '–'} "
        "(shown as ≤), two identical groups get 1. It asks whether these runs differ on these "
        "test sentences, all seeds at once, not whether another seed would: seed pairs that "
        "differ in opposite directions cancel (a large pooled p where each pair's own is "
        "small), and a difference that changes sign from seed to seed can still get a small "
        "one; how much a difference varies from seed to seed is the beyond-seed-spread "
        "column's question. Per seed pair: each pair's difference and its own test, as "
        "detail (identical translations get 1 under either test; the paired bootstrap's "
        "smallest p is 1 / (resamples + 1), shown as ≤; the bootstrap and randomization ask "
        "different questions, and their p for one pair can differ severalfold). * below 0.05. "
        "Beyond seed spread: "
        "the two groups' 95 % intervals over seeds do not overlap. Finding: p (seeds pooled) "
        "below 0.05 and beyond the seed spread; with one seed per group neither says anything "
        "about seeds: train 3 or more.\n"
    )


def significance_rows(
    comparisons: Sequence[Comparison], test: str
) -> tuple[list[str], list[list[str]]]:
    """``significance_table``'s header and cells."""
    name = {"bs": "paired bootstrap; AER: randomization", "ar": "approximate randomization"}[test]
    header = [
        "baseline", "system", "metric", "Δ mean", "seed pairs", "p (seeds pooled)",
        f"per seed pair: Δ, p ({name})", "beyond seed spread", "finding",
    ]  # fmt: skip
    rows = []
    for comparison in comparisons:
        seeds = comparison.seeds or tuple(str(i + 1) for i in range(comparison.pairs))
        # Each pair's randomization has the pooled test's floor, the bootstrap 1 / (resamples + 1).
        floor = comparison.resamples or comparison.shuffles
        deltas = comparison.pair_differences or (None,) * comparison.pairs
        p_values = "; ".join(
            f"{seed}: {signed(delta, comparison.metric)}p {p_text(p, floor)}"
            for seed, delta, p in zip(seeds, deltas, comparison.p_values, strict=True)
        )
        beyond = {True: "yes", False: "no", None: "– (one run)"}[comparison.beyond_spread]
        finding = {True: "**yes**", False: "no", None: "–"}[is_finding(comparison)]
        rows.append(
            [
                comparison.baseline, comparison.system, comparison.metric,
                difference_text(comparison), pairs_text(comparison),
                p_text(comparison.p_value, comparison.shuffles), p_values, beyond, finding,
            ]
        )  # fmt: skip
    return header, rows


def pairs_text(comparison: Comparison) -> str:
    """How many seed pairs the tests ran on, and which runs of Δ mean they left out."""
    if not comparison.untested:
        return str(comparison.pairs)
    return f"{comparison.pairs} (untested: {'; '.join(comparison.untested)})"


def pair_differences(
    pairs: Sequence[tuple[RunRecord, RunRecord]], key: str
) -> tuple[float | None, ...]:
    """Each seed pair's figure ``key``, system minus baseline (None where one is missing)."""
    found = []
    for run_a, run_b in pairs:
        a, b = figure_of(run_a, key), figure_of(run_b, key)
        found.append(None if a is None or b is None else b - a)
    return tuple(found)


def untested_groups(groups: Sequence[Group]) -> list[str]:
    """The pairs of groups with no paired test for a repeated seed: "SYSTEM against BASELINE"."""
    return [
        f"{system.label} against {baseline.label}"  # as the verdict and the warnings say
        for baseline, system in itertools.combinations(groups, 2)
        if repeats_seeds(baseline) or repeats_seeds(system)
    ]


def repeats_seeds(group: Group) -> bool:
    """Whether the group holds several runs of one seed."""
    return len(set(map(str, group.seeds))) < len(group.runs)


def untested_runs(
    baseline: Group, system: Group, pairs: Sequence[tuple[RunRecord, RunRecord]]
) -> tuple[str, ...]:
    """The runs of both groups that no seed pair holds, each as "GROUP, seed N"."""
    tested = {id(run) for pair in pairs for run in pair}
    return tuple(
        f"{group.label}, seed {run_seed(run)}"
        for group in (baseline, system)
        for run in group.runs
        if id(run) not in tested
    )


def pair_seeds(pairs: Sequence[tuple[RunRecord, RunRecord]]) -> tuple[str, ...]:
    """Each seed pair named by its seed, or both where they differ ("1/2")."""
    named = []
    for run_a, run_b in pairs:
        seed_a, seed_b = run_seed(run_a), run_seed(run_b)
        named.append(str(seed_a) if seed_a == seed_b else f"{seed_a}/{seed_b}")
    return tuple(named)


def signed(delta: float | None, metric: str) -> str:
    """A seed pair's difference with its sign and a comma, or nothing where it is unknown."""
    return "" if delta is None else f"{delta:+.{3 if metric == 'AER' else 2}f}, "


def difference_text(comparison: Comparison) -> str:
    """Δ mean with its sign, to the metric's digits (AER 3, BLEU and chrF 2), and where runs are
    left untested, the mean Δ of the pairs the tests ran on beside it."""
    digits = 3 if comparison.metric == "AER" else 2
    text = f"{comparison.difference:+.{digits}f}"
    tested = [delta for delta in comparison.pair_differences if delta is not None]
    if comparison.untested and tested:
        text += f" (pairs tested: {sum(tested) / len(tested):+.{digits}f})"
    return text


def p_text(p: float, shuffles: int | None = None) -> str:
    """A p-value to 4 digits, starred below 0.05; at a randomization's floor 1 / (shuffles + 1),
    the smallest it can give, as ≤ that."""
    star = "*" if p < 0.05 else ""
    if shuffles is not None and p <= 1 / (shuffles + 1) * (1 + 1e-9):
        return f"≤{1 / (shuffles + 1):.4f}{star}"
    return f"{p:.4f}{star}"


def plot_bleu_bands(groups: Sequence[Group], path: Path) -> Path:
    """val BLEU against step: each group's mean over its runs, with the 95 % interval as a band
    (at the steps every run of the group validated)."""
    figure, axes = plt.subplots(figsize=(7, 4.5))
    try:
        for index, group in enumerate(groups):
            colour = plt.get_cmap("tab20")(group_colour(index))  # as bleu_curves.png draws it
            series = [dict(run.validations("val/bleu")) for run in group.runs]
            steps = sorted(set.intersection(*(set(s) for s in series))) if series else []
            if not steps:
                continue
            if len(series) == 1:
                axes.plot(
                    steps, [series[0][s] for s in steps], marker="o", color=colour,
                    label=f"{group.label} (1 run)",
                )  # fmt: skip
                continue
            intervals = [mean_interval([s[step] for s in series]) for step in steps]
            # BLEU lies in [0, 100]: the band is the interval cut to what BLEU can be.
            low = [max(0.0, i.low) for i in intervals]
            high = [min(100.0, i.high) for i in intervals]
            means = [i.mean for i in intervals]
            axes.plot(
                steps, means, marker="o", color=colour,
                label=f"{group.label} ({len(series)} runs)",
            )  # fmt: skip
            if len(steps) == 1:  # one validation: an error bar, as a band needs two steps
                axes.errorbar(
                    steps, means, yerr=[[means[0] - low[0]], [high[0] - means[0]]],
                    color=colour, capsize=4,
                )  # fmt: skip
            axes.fill_between(steps, low, high, color=colour, alpha=0.2, linewidth=0)
        save_curves(figure, axes, "val BLEU (mean, 95 % interval over seeds)", path)
    finally:
        plt.close(figure)
    return path
