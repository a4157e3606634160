"""Compare training runs side by side from their local files (no W&B server needed).

    python scripts/compare_runs.py multirun/2026-11-22/10-00-00/ [more runs ...] [--out DIR]
        [--by KEY ...] [--pair RUN_A RUN_B] [--test bs|ar] [--samples N]

Prints a markdown table (one row per run: attention, parameters, best val BLEU, test BLEU, AER,
training time, tokens/s); then the runs as results: grouped by their config but the seed (or by
the config keys --by names), each group's figures as mean ± 95 % interval over its seeds, and
paired significance tests between every two groups on BLEU, chrF and AER: one over all seeds
(stratified approximate randomization, as MultEval), and seed pair by seed pair as detail
(approximate randomization, or sacreBLEU's paired bootstrap for BLEU and chrF with --test bs;
AER always by randomization), with whether the difference is beyond the seed-to-seed spread.
--pair tests two runs.
Writes comparison.md (the tables as printed), bleu_curves.png (val BLEU against step, all runs),
bleu_bands.png (each group's mean and
interval), attention_grid.png (one validation sentence's attention under each run) and
explorer.html (the attention explorer: every run's best checkpoint on the same validation
sentences, side by side) to --out, by default comparison-NAME in the current directory, NAME the
first directory's (and "-and-N-more" for N more): never into the runs it reads.
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
from pathlib import Path

from seq2seq import Translator
from seq2seq.analysis.compare import (
    RunRecord,
    RunsError,
    group_colour,
    is_run_dir,
    markdown_table,
    plot_attention_grid,
    plot_bleu_curves,
    read_run,
    read_runs,
)
from seq2seq.analysis.groups import (
    ONE_GROUP_NOTE,
    Group,
    compare_groups,
    flat_config,
    group_runs,
    groups_table,
    plot_bleu_bands,
    run_labels,
    run_seed,
    significance_table,
    untested_groups,
)
from seq2seq.analysis.metrics import TEST_REFERENCES
from seq2seq.analysis.reference_aligners import (
    ReferenceAligner,
    check_references,
    read_reference,
    reference_table,
)
from seq2seq.analysis.significance import SHUFFLES, TESTS
from seq2seq.atomic import write_atomic
from seq2seq.cli import UsageError, add_trust_argument, int_at_least, run
from seq2seq.explorer import MAX_MODELS, ExplorerModel, explorer_data, write_page
from seq2seq.explorer.data import snapshot_sentences

log = logging.getLogger("seq2seq.compare_runs")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", type=Path, nargs="+", help="run or multirun directories")
    parser.add_argument(
        "--out", type=Path,
        help="where to write the figures and explorer.html (comparison-NAME here, NAME the "
        "first directory's); never inside a run directory",
    )  # fmt: skip
    parser.add_argument(
        "--by", nargs="+", metavar="KEY",
        help="group by these config keys (default: every key but the seed and where it ran); "
        "input: by the directory given, e.g. two sweeps of one setting",
    )  # fmt: skip
    parser.add_argument(
        "--pair", nargs=2, type=Path, metavar=("BASELINE", "SYSTEM"),
        help="also test these two run directories against each other",
    )  # fmt: skip
    parser.add_argument(
        "--test", choices=TESTS, default="ar",
        help="each seed pair's own test: ar, approximate randomization (default), or bs, "
        "sacreBLEU's paired bootstrap as its command line runs it",
    )  # fmt: skip
    parser.add_argument(
        "--samples", type=samples_count, metavar="N",
        help=f"resamples (bootstrap, default 1000) or shuffles (--test ar; 10000 by default, "
        f"and in every randomization test), at most "
        f"{MAX_SAMPLES:,}",
    )  # fmt: skip
    parser.add_argument(
        "--reference", action="append", default=[], metavar="NAME=LINKS",
        help="a word aligner's Pharaoh links of the runs' test sentences (e.g. seq2seq align "
        "--eflomal --write LINKS), as a reference row for the AER column (repeatable; --gold)",
    )  # fmt: skip
    parser.add_argument(
        "--gold", type=Path, metavar="FILE", help="the test set's gold links, for --reference"
    )
    add_trust_argument(parser)
    args = parser.parse_args()
    if args.reference and args.gold is None:
        parser.error("--reference needs --gold FILE, the test set's gold links")
    if args.gold is not None and not args.reference:
        parser.error("--gold scores --reference links: give --reference NAME=LINKS too")
    for given in args.reference:
        name, _, path = given.partition("=")
        if not name or not path:
            parser.error(f"--reference {given!r}: give NAME=LINKS, e.g. eflomal=test.links")
    return args


# More resamples than this hold their (samples × sentences) index table in memory for nothing:
# the p-value's resolution is 1 / (samples + 1).
MAX_SAMPLES = 100_000


def samples_count(text: str) -> int:
    """--samples: an integer from 1 to ``MAX_SAMPLES``."""
    value = int_at_least(1)(text)
    if value > MAX_SAMPLES:
        raise argparse.ArgumentTypeError(f"at most {MAX_SAMPLES:,}, got {value:,}")
    return value


def main() -> int:
    args = parse_args()
    for path in args.pair or []:
        if not path.is_dir():
            raise UsageError(f"--pair {path}: no such run directory.")
        if not is_run_dir(path):
            raise UsageError(
                f"--pair {path} is not a run directory (a run has metrics.csv and summary.json; "
                "a sweep's are its numbered subdirectories): --pair tests two runs, e.g. --pair "
                f"{path / '0'} OTHER/0; give whole sweeps as the inputs to compare their groups."
            )
    if args.pair and args.pair[0].resolve() == args.pair[1].resolve():
        raise UsageError(
            f"--pair {args.pair[0]} {args.pair[1]}: the same run twice; a paired test compares "
            "two runs (a run against itself is no difference, p = 1)."
        )
    runs = read_runs(args.runs)
    run_dirs = [run.path for run in runs]
    out_dir = output_directory(args.out, args.runs, run_dirs)
    groups = group_runs(runs, args.by)  # before any output: a bad --by stops here
    references = read_references(runs, groups, args)  # as are bad --reference files
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise UsageError(f"cannot create --out {out_dir} ({error.strerror}).") from None
    labels = run_labels(runs, groups)
    report = Report()
    report.say(markdown_table(runs, labels))
    print_groups(runs, groups, args, report, references)
    # The tables first, then the files and their log lines (which go to stderr).
    log.info("wrote %s", report.write(out_dir / REPORT_FILE))
    log.info("wrote %s", plot_bleu_bands(groups, out_dir / "bleu_bands.png"))
    group_index = {id(run): index for index, group in enumerate(groups) for run in group.runs}
    colours = [group_colour(group_index[id(run)]) for run in runs]
    seeds = sorted({str(run_seed(run)) for run in runs}, key=lambda seed: (len(seed), seed))
    styles = [seeds.index(str(run_seed(run))) for run in runs]  # a seed's style in every group
    curves = plot_bleu_curves(runs, labels, out_dir / "bleu_curves.png", colours, styles)
    log.info("wrote %s", curves)
    grid = plot_attention_grid(runs, labels, out_dir / "attention_grid.png")
    if grid is None:
        log.info("no run has recorded attention maps yet: no attention_grid.png")
    else:
        log.info("wrote %s", grid)
    page = write_explorer(runs, labels, groups, out_dir / "explorer.html", args.trust_modules)
    if page is not None:
        log.info("wrote %s", page)
    return 0


REPORT_FILE = "comparison.md"  # the tables, as printed


class Report:
    """What compare prints, kept to be written to ``REPORT_FILE`` under --out as well."""

    def __init__(self) -> None:
        self.parts: list[str] = []

    def say(self, text: str) -> None:
        print(text, end="", flush=True)
        self.parts.append(text)

    def write(self, path: Path) -> Path:
        text = "".join(self.parts)
        write_atomic(path, lambda temporary: temporary.write_text(text, encoding="utf-8"))
        return path


def output_directory(out: Path | None, inputs: list[Path], run_dirs: list[Path]) -> Path:
    """--out, or comparison-NAME in the current directory (NAME the first input's, "-and-N-more"
    for N more inputs), said in the log; refused inside a directory it reads (a run's or a
    sweep's, the current one too): a comparison never writes into the runs it reads."""
    name = inputs[0].resolve().name or "runs"
    more = len({given.resolve() for given in inputs}) - 1  # a directory given twice is one
    default = Path(f"comparison-{name}" + (f"-and-{more}-more" if more else ""))
    read = [path.resolve() for path in [*inputs, *run_dirs]]
    holders = [directory for directory in read if inside(default.resolve(), directory)]
    if out is None and holders:  # run from inside a run or sweep it reads
        outermost = min(holders, key=lambda directory: len(directory.parts))
        beside = outermost.parent
        while (beside / "multirun.yaml").is_file():  # not into the sweep that holds the run
            beside = beside.parent
        raise UsageError(
            f"the current directory is inside {outermost}, which this comparison reads, and "
            f"the default --out ({default}, here) would write into it: run from another "
            f"directory or pass --out, e.g. --out {beside / default.name}."
        )
    if out is None:
        out = default
        log.info("writing the figures and explorer.html to %s (--out chooses another)", out)
    if (out / REPORT_FILE).is_file():
        log.warning("%s holds an earlier comparison: its files are replaced", out)
    resolved = out.resolve()
    for given in inputs:  # a multirun directory given as input holds its runs too
        if inside(resolved, given.resolve()):
            raise UsageError(
                f"--out {out} is inside {given}, which this comparison reads: a comparison does "
                f"not write into the runs it reads; choose another directory (e.g. --out "
                f"{default}, the default)."
            )
    for run_dir in run_dirs:
        if inside(resolved, run_dir.resolve()):
            raise UsageError(
                f"--out {out} is inside the run directory {run_dir}: a comparison does not "
                "write into the runs it reads; choose another directory (e.g. --out "
                f"{default}, the default)."
            )
    return out


def inside(path: Path, directory: Path) -> bool:
    """Whether ``path`` (resolved) is ``directory`` (resolved) or below it."""
    return path == directory or directory in path.parents


def print_groups(
    runs: list[RunRecord],
    groups: list[Group],
    args: argparse.Namespace,
    report: Report,
    references: list[ReferenceAligner],
) -> None:
    """The groups' table and their paired tests, and the tests of --pair, said in ``report``."""
    if args.by and all(len(group.runs) == 1 for group in groups):
        raise UsageError(
            f"--by {' '.join(args.by)} puts every run in a group of its own, so there is no "
            "interval over seeds to show: train each setting with several seeds (e.g. python "
            "train.py -m ... seed=1,2,3) or group by fewer keys."
        )
    tokenize = str(flat_config(runs[0]).get("data.bleu_tokenize", "13a"))
    report.say(f"\nGroups (mean ± 95 % interval over seeds):\n\n{groups_table(groups)}")
    if len(groups) == 1 and not args.pair:  # with --pair, the pair is what is tested
        report.say(f"\n{ONE_GROUP_NOTE}\n")
    else:
        try:
            comparisons = compare_groups(groups, tokenize, args.test, args.samples)
        except RunsError as error:
            log.warning("no paired tests: %s", error)
            report.say(f"\nNo paired tests: {str(error).rstrip('.')}.\n")
        else:
            report.say(f"\nPaired tests:\n\n{significance_table(comparisons, args.test)}")
        skipped = untested_groups(groups)
        if skipped:
            report.say(
                f"\nNot tested (a group of several runs of one seed, ‡): {'; '.join(skipped)}.\n"
            )
    if references:
        print_references(groups, references, args, report)
    if args.pair:
        # Each named as the tables name it where it is one of the runs, else by its path.
        names = {
            run.path.resolve(): label
            for run, label in zip(runs, run_labels(runs, groups), strict=True)
        }
        pair = [Group(pair_label(path, names), [read_run(path)]) for path in args.pair]
        comparisons = compare_groups(pair, tokenize, args.test, args.samples)
        table = significance_table(comparisons, args.test, verdict_line=False)
        report.say(f"\n--pair (one run a side: its p-values, no finding):\n\n{table}")


def pair_label(path: Path, names: dict[Path, str]) -> str:
    """A --pair run's name: the tables' where it is one of the runs compared, else its own
    setting and seed, said to be outside them."""
    if path.resolve() in names:
        return names[path.resolve()]
    run = read_run(path)
    [label] = run_labels([run], group_runs([run]))
    return f"{label} ({path}, not among the runs compared)"


def read_references(
    runs: list[RunRecord], groups: list[Group], args: argparse.Namespace
) -> list[ReferenceAligner]:
    """--reference: each aligner's links, read and checked against the runs' test set."""
    if not args.reference:
        return []
    with_references = [run for run in runs if (run.path / TEST_REFERENCES).is_file()]
    targets = (
        (with_references[0].path / TEST_REFERENCES).read_text(encoding="utf-8").splitlines()
        if with_references
        else None
    )
    references = []
    for given in args.reference:
        name, _, path = given.partition("=")
        references.append(read_reference(name, Path(path), args.gold, targets))
    check_references(groups, references)
    return references


def print_references(
    groups: list[Group],
    references: list[ReferenceAligner],
    args: argparse.Namespace,
    report: Report,
) -> None:
    """--reference: each aligner's test AER beside the groups', tested against each group."""
    shuffles = args.samples if args.test == "ar" and args.samples else SHUFFLES
    report.say(
        f"\nReference aligners (test AER against {args.gold}; Δ: a group's mean minus the "
        "aligner's; p: stratified approximate randomization over the group's seeds, "
        f"{shuffles:,} shuffles):\n\n{reference_table(groups, references, shuffles)}"
    )


def write_explorer(
    runs: list[RunRecord],
    labels: list[str],
    groups: list[Group],
    path: Path,
    trust_modules: list[str],
) -> Path | None:
    """The explorer page of every run's best checkpoint on the validation sentences the first
    run's pages show (the same data config: a multirun's), or None where there are none. More
    runs than a page holds (``MAX_MODELS``, as ``seq2seq explore``): each group's first seed."""
    snapshots = [sorted((run.path / "attention").glob("explorer-step-*.json")) for run in runs]
    first = next((found[-1] for found in snapshots if found), None)
    with_checkpoints = [
        (label, run) for label, run in zip(labels, runs, strict=True)
        if (run.path / "checkpoints" / "best.ckpt").is_file()
    ]  # fmt: skip
    if first is None or not with_checkpoints:
        log.info("no run has an explorer page and a best.ckpt yet: no explorer.html")
        return None
    chosen = page_models(with_checkpoints, groups)
    sources, references, gold = snapshot_sentences(json.loads(first.read_text()))
    log.info(
        "explorer.html: %d model(s) translating %d validation sentences...",
        len(chosen), len(sources),
    )  # fmt: skip
    models = [
        ExplorerModel(
            label,
            Translator.load(run.path / "checkpoints" / "best.ckpt", trust_modules=trust_modules),
        )
        for label, run in chosen
    ]
    # Labels hold commas ("attention=dot, seed 2"): a semicolon tells one run from the next.
    title = f"best checkpoints on {len(sources)} validation sentences: " + "; ".join(
        label for label, _ in chosen
    )
    if len(chosen) < len(with_checkpoints):
        title += f" ({len(chosen)} of {len(with_checkpoints)} runs: the log names the others)"
    return write_page(explorer_data(models, sources, references, gold, title=title), path)


def page_models(
    candidates: list[tuple[str, RunRecord]], groups: list[Group]
) -> list[tuple[str, RunRecord]]:
    """The runs one explorer page shows, each group's runs in turn, seed by seed (every group's
    first seed, then every group's second, ...), so that the page's first models, which it
    shows side by side, are one of each setting; where there are more than a page holds
    (``MAX_MODELS``), up to the limit, the others said in the log."""
    per_group = [
        sorted(
            ((label, run) for label, run in candidates if run in group.runs),
            key=lambda member: str(run_seed(member[1])),
        )
        for group in groups
    ]
    in_turn = [member for rank in itertools.zip_longest(*per_group) for member in rank if member]
    if len(in_turn) <= MAX_MODELS:
        return in_turn
    chosen = in_turn[:MAX_MODELS]
    left_out = [label for label, run in candidates if (label, run) not in chosen]
    log.warning(
        "explorer.html holds %d models at most: it shows %s; not %s (seq2seq explore --model "
        "RUN/checkpoints/best.ckpt makes a page of others)",
        MAX_MODELS, ", ".join(label for label, _ in chosen), ", ".join(left_out),
    )  # fmt: skip
    return chosen


if __name__ == "__main__":
    run(main)
