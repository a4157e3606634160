"""The attention's parts besides its score, measured on the toy task over seeds (issue 56).

Trains the default model (bidirectional GRU, Bahdanau decoder) with each switch against the
softmax/global baseline, one at a time, for each scoring function and seed, then scores every run's
best checkpoint: test BLEU and AER (its ``summary.json``), greedy BLEU and AER on ``test_long``
(sources longer than any in training, where a window should matter), the share of exact-zero
weights over the real (target word, source word) pairs of the test set and the mean entropy of
those rows (teacher forcing), and training tokens/s. Figures over seeds are means with a 95 %
t interval (``seq2seq.analysis.intervals``); a variant's difference from its baseline is called
larger than the seed-to-seed spread when their intervals do not overlap.

Also the parameter counts of additive and general scoring around their crossover
d_a = d_s · d_h / (d_s + d_h + 1), read from the modules' own ``numel()``.
"""

from __future__ import annotations

import json
import logging
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from sacrebleu.metrics import BLEU

from benchmarks.switch_speed import train_py_tokens_per_s
from seq2seq import Translator
from seq2seq.analysis.alignment import GoldAlignment, argmax_links, corpus_aer
from seq2seq.analysis.diagnostics import learned_alphas
from seq2seq.analysis.intervals import Interval, IntervalError, mean_interval
from seq2seq.attention import AdditiveAttention, GeneralAttention
from seq2seq.cli import UsageError, int_at_least
from seq2seq.data.toy import ToyTranslation

log = logging.getLogger("seq2seq")

ROOT = Path(__file__).resolve().parents[1]

# Each switch against the baseline, one at a time: name -> train.py overrides.
VARIANTS: dict[str, list[str]] = {
    "baseline": [],
    # The baseline on the reference path, where every variant below trains (the C kernels
    # compute global softmax only): the fair comparison of training speed.
    "baseline, kernels off": ["model.kernels=off"],
    "sparsemax": ["attention.normalizer=sparsemax"],
    "entmax15": ["attention.normalizer=entmax15"],
    "entmax, learned α": [
        "attention.normalizer=entmax",
        "attention.alpha=learnable",
        "attention.initial_alpha=1.5",
    ],
    "local_m": ["attention.window=local_m", "attention.window_size=3"],
    "local_p": ["attention.window=local_p", "attention.window_size=3"],
    "key_bias": ["attention.key_bias=true"],
}
SCORINGS = ("additive", "scaled_dot")
FIGURES = (
    ("test_bleu", "test BLEU", 1),
    ("test_aer", "test AER", 3),
    ("long_bleu", "test_long BLEU", 1),
    ("long_aer", "test_long AER", 3),
    ("zero_share", "exact zeros", 3),
    ("entropy", "entropy (nats)", 3),
)


@dataclass(frozen=True)
class Run:
    scoring: str
    variant: str
    seed: int
    switches: tuple[str, ...] = ()  # the variant's train.py overrides

    def directory(self, root: Path) -> Path:
        variant = self.variant.replace(", ", "_").replace(" ", "_").replace("α", "alpha")
        variant = variant.replace("λ", "lambda").replace("=", "")
        return root / self.scoring / variant / f"seed-{self.seed}"

    def overrides(self, epochs: int, extra: Sequence[str] = ()) -> list[str]:
        return [
            f"attention={self.scoring}",
            *self.switches,
            f"seed={self.seed}",
            f"trainer.max_epochs={epochs}",
            "threads=1",
            "logger=csv",
            *extra,
        ]


def train(run: Run, root: Path, epochs: int, extra: Sequence[str] = ()) -> Path:
    """Train ``run`` (unless its summary.json exists) in its directory under ``root``, with the
    ``extra`` overrides."""
    directory = run.directory(root)
    if (directory / "summary.json").is_file():
        return directory
    command = [
        sys.executable, str(ROOT / "train.py"), *run.overrides(epochs, extra),
        f"run_dir={directory.resolve()}",
    ]  # fmt: skip
    directory.mkdir(parents=True, exist_ok=True)
    log.info("training %s", " ".join(command[2:]))
    with (directory / "train.log").open("w") as output:
        subprocess.run(
            command, check=True, stdout=output, stderr=subprocess.STDOUT, cwd=ROOT,
            env={**os.environ, "WANDB_MODE": "offline"},
        )  # fmt: skip
    return directory


def evaluate(directory: Path) -> dict[str, float]:
    """The figures of one trained run (cached in its ``evaluation.json``)."""
    cached = directory / "evaluation.json"
    if cached.is_file():
        return dict(json.loads(cached.read_text()))
    torch.set_num_threads(1)
    summary = json.loads((directory / "summary.json").read_text())
    translator = Translator.load(directory / "checkpoints" / "best.ckpt")
    splits = ToyTranslation(seed=1).splits()  # data.seed's default: the runs' own splits
    long = splits["test_long"]
    hypotheses = translator.translate([example.src for example in long], beam_size=1)
    long_bleu = (
        BLEU(tokenize="none", force=True).corpus_score(hypotheses, [[e.tgt for e in long]]).score
    )
    alphas = learned_alphas(translator.model)
    figures = {
        **({"alpha": alphas["attn/alpha"]} if alphas else {}),
        "test_bleu": summary["test_bleu"],
        "test_aer": summary["test_aer"],
        "long_bleu": long_bleu,
        "long_aer": aer(translator, long),
        "tokens_per_s": summary["train_tokens_per_s"],
        **sparsity(translator, splits["test"]),
    }
    cached.write_text(json.dumps(figures, indent=2) + "\n")
    return figures


def aer(translator: Translator, examples: Sequence[Any]) -> float:
    """AER of the argmax links of teacher-forced attention against the gold links."""
    forced = translator.force_decode([e.src for e in examples], [e.tgt for e in examples])
    links = [argmax_links(t.attention, len(t.src_tokens), len(t.tgt_tokens)) for t in forced]
    gold = [GoldAlignment.from_links(e.alignment or ()) for e in examples]
    return corpus_aer(links, gold)


def sparsity(translator: Translator, examples: Sequence[Any]) -> dict[str, float]:
    """The share of exact zeros among the weights of real (target word, source word) pairs, and
    the mean entropy (nats) of those rows, renormalised (local-p's sum to less than 1)."""
    forced = translator.force_decode([e.src for e in examples], [e.tgt for e in examples])
    zeros = cells = 0
    entropies: list[float] = []
    for translation in forced:
        weights = translation.attention.double()  # (T, S): real words only
        zeros += int((weights == 0).sum())
        cells += weights.numel()
        rows = weights / weights.sum(-1, keepdim=True).clamp(min=1e-300)
        entropies += (-torch.special.xlogy(rows, rows).sum(-1)).tolist()
    return {"zero_share": zeros / cells, "entropy": sum(entropies) / len(entropies)}


def add_study_arguments(parser: Any, out: Path) -> None:
    """The command-line options every seeds study shares: where its runs are, the seeds, epochs
    and parallel runs, where its report goes (``out`` by default), the page to refresh and more
    train.py overrides."""
    parser.add_argument(
        "--runs", type=Path, help="directory of the training runs (needed but with --speed-only)"
    )
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3], help="(1 2 3)")
    parser.add_argument("--epochs", type=int_at_least(1), default=2, help="per run (2)")
    parser.add_argument("--jobs", type=int_at_least(1), default=2, help="runs at a time (2)")
    parser.add_argument("--out", type=Path, default=out, help="report")
    parser.add_argument("--docs", type=Path, help="markdown page whose generated blocks to refresh")
    parser.add_argument(
        "--overrides", nargs="*", default=[], help="more train.py overrides for every run"
    )


def add_speed_arguments(parser: Any) -> None:
    """The options that time every setting one run at a time (``measure_speed``)."""
    parser.add_argument(
        "--speed-repeats", type=int, default=0,
        help="also time every setting this many times, one run at a time (0: no)",
    )  # fmt: skip
    parser.add_argument("--speed-steps", type=int_at_least(1), default=150, help="(150)")
    parser.add_argument(
        "--speed-only", action="store_true",
        help="train nothing: time the settings, render the tables from --out's results.json",
    )  # fmt: skip


def study_arguments(args: Any) -> tuple[Path, list[int], int, int, list[str]]:
    """``run_all``'s first arguments from the parsed options (``add_study_arguments``)."""
    return args.runs, args.seeds, args.epochs, args.jobs, args.overrides


def study_results(args: Any, train_and_score: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """The study's results: ``train_and_score``'s, written to ``--out``'s ``results.json``, or
    with ``--speed-only`` that file's as it is."""
    results_file = args.out / "results.json"
    if args.speed_only:
        if not results_file.is_file():
            raise UsageError(
                f"--speed-only renders the tables from {results_file}, which does not exist: run "
                "the study once without --speed-only, or give --out the directory of its report."
            )
        return dict(json.loads(results_file.read_text()))
    if args.runs is None:
        raise UsageError(
            "--runs DIR is needed to train the study's runs (or keep them there): give it, or "
            "--speed-only to render the tables from --out's results.json without training."
        )
    results = train_and_score()
    results["machine"] = this_machine()
    args.out.mkdir(parents=True, exist_ok=True)
    results_file.write_text(json.dumps(results, indent=2) + "\n")
    return results


def this_machine() -> str:
    """The processor and platform, as the studies' reports name them."""
    return f"{platform.processor() or platform.machine()}, {platform.platform()}"


def run_all(
    root: Path,
    seeds: Sequence[int],
    epochs: int,
    jobs: int,
    extra: Sequence[str] = (),
    variants: dict[str, list[str]] | None = None,
    score: Callable[[Path], dict[str, float]] = evaluate,
) -> dict[str, Any]:
    """Train (``jobs`` at a time) and ``score`` every run of ``variants`` (``VARIANTS``); the
    figures per run and per group."""
    variants = VARIANTS if variants is None else variants
    if len(set(seeds)) < 2:
        raise IntervalError(
            f"--seeds {' '.join(map(str, seeds))}: an interval over seeds needs at least 2 "
            "different seeds (e.g. --seeds 1 2 3); nothing was trained."
        )
    runs = [
        Run(s, v, seed, tuple(switches))
        for s in SCORINGS
        for v, switches in variants.items()
        for seed in seeds
    ]
    start = time.perf_counter()
    with ThreadPoolExecutor(jobs) as pool:
        directories = list(pool.map(lambda run: train(run, root, epochs, extra), runs))
    with ThreadPoolExecutor(jobs) as pool:
        figures = list(pool.map(score, directories))
    log.info("trained and evaluated %d runs in %.0f s", len(runs), time.perf_counter() - start)
    per_run = [
        {"scoring": r.scoring, "variant": r.variant, "seed": r.seed, **f}
        for r, f in zip(runs, figures, strict=True)
    ]
    return {"seeds": list(seeds), "epochs": epochs, "overrides": list(extra), "runs": per_run}


def measure_speed(
    repeats: int,
    steps: int,
    extra: Sequence[str] = (),
    variants: dict[str, list[str]] | None = None,
) -> dict[str, Any]:
    """Training tokens/s of every (scoring, variant) of ``variants`` (``VARIANTS``), one
    ``train.py`` run at a time on one thread, ``steps`` updates each, the whole set ``repeats``
    times over (interleaved, so that a slow spell of the machine falls on all of them): median
    per setting."""
    variants = VARIANTS if variants is None else variants
    measured: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as scratch:
        for repeat in range(repeats):
            for scoring in SCORINGS:
                for variant, switches in variants.items():
                    run = Run(scoring, variant, 1, tuple(switches))
                    directory = run.directory(Path(scratch) / f"{repeat}")
                    key = f"{scoring}/{variant}"
                    tokens_per_s = train_py_tokens_per_s(run.overrides(1, extra), steps, directory)
                    measured.setdefault(key, []).append(tokens_per_s)
                    log.info("%s: %.0f tokens/s", key, tokens_per_s)
    return {
        "repeats": repeats,
        "steps": steps,
        "tokens_per_s": measured,
        "median": {key: statistics.median(values) for key, values in measured.items()},
    }


def render_speed(
    speed: dict[str, Any],
    variants: Sequence[str] = tuple(VARIANTS),
    compared_with: dict[str, str] | None = None,
) -> str:
    """Median tokens/s per setting, and its ratio to the baseline (or the variant it is
    ``compared_with``) and to the baseline with the kernels off (where measured)."""
    median = speed["median"]
    compared_with = compared_with or {}
    off = "baseline, kernels off"
    columns = ["tokens/s", "÷ baseline", *(["÷ kernels off"] if off in variants else [])]
    header = " | ".join(f"{s} {c}" for s in SCORINGS for c in columns)
    lines = [f"| variant | {header} |", "|---" * (1 + len(columns) * len(SCORINGS)) + "|"]
    for variant in variants:
        cells = []
        for scoring in SCORINGS:
            value = median[f"{scoring}/{variant}"]
            base = median[f"{scoring}/{compared_with.get(variant, 'baseline')}"]
            cells += [f"{value:,.0f}", f"{value / base:.2f}"]
            if off in variants:
                cells.append(f"{value / median[f'{scoring}/{off}']:.2f}")
        lines.append(f"| {variant} | {' | '.join(cells)} |")
    return "\n".join(lines)


Figure = tuple[str, str, int]  # key in a run's figures, column name, decimals


def group_intervals(
    results: dict[str, Any], figures_shown: Sequence[Figure] = FIGURES
) -> dict[tuple[str, str], dict[str, Interval]]:
    """(scoring, variant) -> figure -> its interval over the seeds."""
    groups: dict[tuple[str, str], dict[str, list[float]]] = {}
    for run in results["runs"]:
        figures = groups.setdefault((run["scoring"], run["variant"]), {})
        for key, _, _ in figures_shown:
            figures.setdefault(key, []).append(float(run[key]))
    return {
        group: {key: mean_interval(values) for key, values in figures.items()}
        for group, figures in groups.items()
    }


def render_table(
    results: dict[str, Any],
    variants: Sequence[str] | None = None,
    figures: Sequence[Figure] = FIGURES,
    compared_with: dict[str, str] | None = None,
) -> str:
    """One markdown table per scoring function: mean ± 95 % half-width over the seeds, in bold
    where the interval does not overlap that of the variant it is compared with
    (``compared_with``, else the baseline)."""
    intervals = group_intervals(results, figures)
    variants = list(VARIANTS) if variants is None else variants
    compared_with = compared_with or {}
    lines = []
    for scoring in SCORINGS:
        header = " | ".join(name for _, name, _ in figures)
        lines += [
            f"**attention={scoring}** ({len(results['seeds'])} seeds, mean ± 95 % interval)",
            "",
            f"| variant | {header} |",
            "|---" * (len(figures) + 1) + "|",
        ]
        for variant in variants:
            reference = compared_with.get(variant, "baseline")
            cells = []
            for key, _, digits in figures:
                interval = intervals[(scoring, variant)][key]
                text = interval.format(digits)
                other = intervals[(scoring, reference)][key]
                if variant != reference and interval.separates_from(other):
                    text = f"**{text}**"
                cells.append(text)
            lines.append(f"| {variant} | {' | '.join(cells)} |")
        learned = [
            run["alpha"] for run in results["runs"] if run["scoring"] == scoring and "alpha" in run
        ]
        if len(learned) >= 2:
            lines += ["", f"Learned α at the end (from 1.5): {mean_interval(learned).format(3)}."]
        lines.append("")
    return "\n".join(lines).rstrip()


def plot_key_bias(root: Path, path: Path, positions: int = 24) -> Path | None:
    """What ``attention.key_bias`` learns: b_i against source position i for each key-bias run
    (the first ``positions``; training sources have at most 20 words, later b_i stay at 0)."""
    import matplotlib.pyplot as plt

    found = sorted(root.glob("*/key_bias/seed-*/checkpoints/best.ckpt"))
    if not found:
        return None
    figure, axes = plt.subplots(figsize=(7, 4))
    try:
        for checkpoint in found:
            model = Translator.load(checkpoint).model
            bias = model.decoder.attention.normalization.key_bias.bias.detach()[:positions]
            scoring, seed = checkpoint.parts[-5], checkpoint.parts[-3]
            style = "-" if scoring == "additive" else "--"
            axes.plot(
                range(len(bias)), bias.tolist(), style, marker=".", label=f"{scoring}, {seed}"
            )
        axes.axhline(0, color="#999", linewidth=0.8)
        axes.set_xlabel("source position i")
        axes.set_ylabel("learned b_i (added to the logits)")
        axes.grid(alpha=0.3)
        axes.legend(fontsize=8)
        figure.tight_layout()
        figure.savefig(path, dpi=120)
    finally:
        plt.close(figure)
    return path


def crossover_table(query_size: int = 64, key_size: int = 128) -> str:
    """Parameters of additive scoring for several d_a, and of general scoring, from the modules'
    ``numel()``; the crossover d_a = d_s d_h / (d_s + d_h + 1) where they are equal."""
    general = sum(p.numel() for p in GeneralAttention(query_size, key_size).parameters())
    crossover = query_size * key_size / (query_size + key_size + 1)
    lines = [
        f"d_s = {query_size}, d_h = {key_size}: general scoring (W, d_h × d_s) has {general} "
        f"parameters; additive (W_q, W_k, w_v) has d_a (d_s + d_h + 1). Equal at "
        f"d_a = d_s d_h / (d_s + d_h + 1) = {crossover:.1f}.",
        "",
        "| d_a | additive parameters | general parameters | additive / general |",
        "|---|---|---|---|",
    ]
    for size in sorted({16, 32, int(crossover), int(crossover) + 1, 64, 128}):
        scoring = AdditiveAttention(query_size, key_size, size)
        additive = sum(p.numel() for p in scoring.parameters())
        lines.append(f"| {size} | {additive} | {general} | {additive / general:.2f} |")
    return "\n".join(lines)
