"""Attention as an aligner beside a real aligner: eflomal's AER on the toy task's gold links next to
that of trained runs' attention, on the same sentences (issue 70, docs/alignment.md).

eflomal learns from the training pairs plus the pairs it aligns (as aligners are evaluated), once
per run (its sampler seeds itself, so runs differ), with and without symmetrization; each model
reads the references (teacher forcing) and links every target word to the source word it attends
to most, as ``seq2seq align`` does. Runs are grouped by their config but the seed, mean ± 95 %
t interval over seeds.

    python -m benchmarks.alignment_reference --runs multirun/compare_attention \\
        --out docs/benchmark/alignment_reference.json
    python -m benchmarks.alignment_reference --multi30k-run RUN \\
        --out docs/benchmark/alignment_multi30k.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from seq2seq import Translator
from seq2seq.analysis.alignment import GoldAlignment, corpus_aer, read_pharaoh
from seq2seq.analysis.compare import find_runs, read_run
from seq2seq.analysis.eflomal_aligner import eflomal_links
from seq2seq.analysis.groups import group_runs
from seq2seq.analysis.intervals import mean_interval
from seq2seq.analysis.word_alignment import symmetrize
from seq2seq.commands import toy_data
from seq2seq.commands.align import attention_links
from seq2seq.data.corpora import normalize, read_lines

ROOT = Path(__file__).resolve().parents[1]

SPLITS = ("test", "test_long")
EFLOMAL = {  # row name -> how eflomal's two directions become one alignment
    "eflomal, source→target": None,
    "eflomal, target→source": "reverse",
    "eflomal, intersection": "intersection",
    "eflomal, grow-diag-final-and": "grow-diag-final-and",
}


def read_split(data: Path, split: str) -> tuple[list[str], list[str]]:
    return (
        (data / f"{split}.src").read_text(encoding="utf-8").splitlines(),
        (data / f"{split}.tgt").read_text(encoding="utf-8").splitlines(),
    )


def eflomal_rows(data: Path, runs: int) -> dict[str, dict[str, list[float]]]:
    """Per eflomal row, per split: the AER of each of ``runs`` runs."""
    train = read_split(data, "train")
    rows: dict[str, dict[str, list[float]]] = {name: {s: [] for s in SPLITS} for name in EFLOMAL}
    for _ in range(runs):
        for split in SPLITS:
            sources, targets = read_split(data, split)
            gold = read_pharaoh(data / f"{split}.align")
            forward, backward = eflomal_links(sources, targets, train)
            for name, method in EFLOMAL.items():
                if method is None:
                    links = forward
                elif method == "reverse":
                    links = backward
                else:
                    links = [
                        symmetrize(f, b, method)  # type: ignore[arg-type]
                        for f, b in zip(forward, backward, strict=True)
                    ]
                rows[name][split].append(corpus_aer(links, gold))
    return rows


def model_rows(data: Path, run_paths: Sequence[Path]) -> dict[str, dict[str, list[float]]]:
    """Per group of runs (its setting), per split: each seed's AER of its attention links."""
    records = [read_run(path) for path in find_runs(run_paths)]
    groups = group_runs(records)
    rows: dict[str, dict[str, list[float]]] = {}
    for group in groups:
        label = f"attention: {setting(group.runs[0].path) or group.label}"
        if label in rows:  # two settings named alike: the config's own label tells them apart
            label = f"attention: {group.label}"
        rows[label] = {split: [] for split in SPLITS}
        for record in group.runs:
            translator = Translator.load(record.path / "checkpoints" / "best.ckpt")
            for split in SPLITS:
                sources, targets = read_split(data, split)
                links = attention_links(translator, sources, targets)
                rows[label][split].append(corpus_aer(links, read_pharaoh(data / f"{split}.align")))
    return rows


def multi30k_agreement(run: Path, root: Path, eflomal_runs: int) -> dict[str, list[float]]:
    """Multi30k has no gold links: how far a model's attention links on the test set are from
    eflomal's (grow-diag-final-and, learning from the training pairs), AER with eflomal's links
    as the sure ones; beside it, how far eflomal's runs are from each other (its own spread)."""
    config = yaml.safe_load((run / ".hydra" / "config.yaml").read_text(encoding="utf-8"))
    source, target = config["data"]["src_lang"], config["data"]["tgt_lang"]

    def read(split: str, language: str) -> list[str]:
        return [normalize(line) for line in read_lines(root / f"{split}.{language}", split)]

    test = read("test_2016_flickr", source), read("test_2016_flickr", target)
    train = read("train", source), read("train", target)
    references = []
    for _ in range(max(eflomal_runs, 2)):
        forward, backward = eflomal_links(*test, train)
        joined = [symmetrize(f, b) for f, b in zip(forward, backward, strict=True)]
        references.append([GoldAlignment.from_links(links) for links in joined])
    translator = Translator.load(run / "checkpoints" / "best.ckpt")
    links = attention_links(translator, *test)
    as_gold = [[sorted(g.sure) for g in reference] for reference in references]
    return {
        "attention against eflomal": [corpus_aer(links, gold) for gold in references],
        "eflomal against another eflomal run": [
            corpus_aer(as_gold[i], references[(i + 1) % len(references)])
            for i in range(len(references))
        ],
    }


# Overrides that say how a run ran, not what it trained.
NOT_THE_SETTING = ("seed=", "trainer.max_epochs=", "threads=", "logger=", "hydra.", "experiment=")


def setting(run: Path) -> str:
    """A run's setting as its command line gave it (``attention=dot``), without its seed and
    where and how it ran; empty where the run kept no overrides."""
    path = run / ".hydra" / "overrides.yaml"
    if not path.is_file():
        return ""
    overrides = yaml.safe_load(path.read_text(encoding="utf-8")) or []
    return ", ".join(o for o in map(str, overrides) if not o.startswith(NOT_THE_SETTING))


def shown(values: Sequence[float]) -> str:
    if len(values) < 2:
        return f"{values[0]:.3f} (1 run)"
    interval = mean_interval(values, bounds=(0.0, 1.0))
    return f"{interval.mean:.3f} ± {(interval.high - interval.low) / 2:.3f} ({len(values)} runs)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=Path, nargs="*", default=[], help="run or multirun dirs")
    parser.add_argument("--eflomal-runs", type=int, default=3, help="eflomal runs (3)")
    parser.add_argument("--out", type=Path, help="write the figures here (JSON)")
    parser.add_argument(
        "--multi30k-run", type=Path, help="a Multi30k run: its links' agreement with eflomal's"
    )
    parser.add_argument(
        "--multi30k-root", type=Path, default=ROOT.parent / "shared" / "data" / "multi30k"
    )
    args = parser.parse_args()
    if args.multi30k_run is not None:
        agreement = multi30k_agreement(args.multi30k_run, args.multi30k_root, args.eflomal_runs)
        print("| Multi30k test_2016_flickr | AER, eflomal's links as sure |\n|---|---|")
        for name, values in agreement.items():
            print(f"| {name} | {shown(values)} |")
        if args.out is not None:
            args.out.write_text(json.dumps(agreement, indent=2) + "\n", encoding="utf-8")
        return
    with tempfile.TemporaryDirectory() as directory:
        data = Path(directory)
        toy_data.main(["--out", str(data)])  # the default toy task, as train.py builds it
        rows = {**eflomal_rows(data, args.eflomal_runs), **model_rows(data, args.runs)}
    print("| aligner | test AER | test_long AER |\n|---|---|---|")
    for name, splits in rows.items():
        print(f"| {name} | {shown(splits['test'])} | {shown(splits['test_long'])} |")
    if args.out is not None:
        result: dict[str, Any] = {
            "rows": rows,
            "means": {
                name: {split: statistics.fmean(v) for split, v in splits.items()}
                for name, splits in rows.items()
            },
        }
        args.out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
