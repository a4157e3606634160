"""A word aligner's reference row in seq2seq compare: its AER against the gold, each group's
difference from it, a stratified test that finds a real difference and none where there is none,
and a gold file that is not the runs' test set refused."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import yaml

from seq2seq.analysis.alignment import AlignmentCounts, corpus_aer, count_links, parse_pharaoh
from seq2seq.analysis.compare import RunsError, read_run
from seq2seq.analysis.groups import group_runs
from seq2seq.analysis.metrics import TEST_ALIGNMENTS
from seq2seq.analysis.reference_aligners import read_reference, reference_table
from seq2seq.analysis.word_alignment import pharaoh
from tests.test_groups import config, run_compare

SENTENCES = 60


def gold_and_links(seed: int, wrong: float) -> tuple[list[str], list[list[tuple[int, int]]]]:
    """Gold diagonal alignments of 5-word sentences, and links that miss each word with
    probability ``wrong``."""
    generator = random.Random(seed)
    gold, links = [], []
    for _ in range(SENTENCES):
        gold.append(" ".join(f"{i}-{i}" for i in range(5)))
        links.append(
            [(generator.randrange(5) if generator.random() < wrong else j, j) for j in range(5)]
        )
    return gold, links


def aligned_run(directory: Path, seed: int, wrong: float, attention: str) -> Path:
    """A run directory whose test_alignments.tsv holds its links' counts against the gold."""
    gold, links = gold_and_links(seed, wrong)
    counts = [count_links(found, parse_pharaoh(g)) for found, g in zip(links, gold, strict=True)]
    directory.mkdir(parents=True)
    settings = config(seed, attention___target_=attention)
    (directory / "config.yaml").write_text(yaml.safe_dump(settings), encoding="utf-8")
    total = sum(counts, AlignmentCounts())
    (directory / "summary.json").write_text(json.dumps({"test_bleu": 50.0, "test_aer": total.aer}))
    (directory / "metrics.csv").write_text("step,val/bleu\n100,50.0\n")
    (directory / TEST_ALIGNMENTS).write_text(
        "".join(f"{c.hits_sure}\t{c.hits_possible}\t{c.predicted}\t{c.sure}\n" for c in counts)
    )
    return directory


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    gold, _ = gold_and_links(0, 0.0)
    _, good = gold_and_links(100, 0.05)
    (tmp_path / "gold").write_text("".join(f"{line}\n" for line in gold))
    (tmp_path / "good").write_text("".join(f"{pharaoh(links)}\n" for links in good))
    for seed in (1, 2, 3):
        aligned_run(tmp_path / "runs" / f"poor{seed}", seed, 0.6, "seq2seq.attention.DotAttention")
        aligned_run(
            tmp_path / "runs" / f"even{seed}", 100, 0.05, "seq2seq.attention.AdditiveAttention"
        )
    return {"gold": tmp_path / "gold", "good": tmp_path / "good", "runs": tmp_path / "runs"}


def test_the_reference_row_and_each_groups_difference_and_test(files: dict[str, Path]) -> None:
    reference = read_reference("aligner", files["good"], files["gold"])
    _, good = gold_and_links(100, 0.05)
    gold = [parse_pharaoh(line) for line in files["gold"].read_text().splitlines()]
    assert reference.aer == pytest.approx(corpus_aer(good, gold))
    runs = [read_run(path) for path in sorted(files["runs"].iterdir())]
    groups = group_runs(runs)
    table = reference_table(groups, [reference], shuffles=999)
    rows = {row.split(" | ")[0].lstrip("| "): row for row in table.splitlines()[2:]}
    assert f"| aligner (reference) | 1 | {reference.aer:.3f} | – |" in table
    poor = next(row for name, row in rows.items() if "Dot" in name or "dot" in name)
    even = next(row for name, row in rows.items() if "Additive" in name or "additive" in name)
    # The poor group misses most links: far worse than the aligner, p at its floor. The even
    # group's runs have the aligner's very links: no difference, p = 1.
    assert "(p ≤0.0010*)" in poor and poor.split(" | ")[3].startswith("+")  # the floor
    assert "+0.000 (p = 1.0000)" in even


def test_a_gold_file_of_another_test_set_is_refused(files: dict[str, Path], tmp_path: Path) -> None:
    other = tmp_path / "other"
    other.write_text("".join("0-0 1-1\n" for _ in range(SENTENCES)))
    reference = read_reference("aligner", files["good"], other)
    groups = group_runs([read_run(path) for path in sorted(files["runs"].iterdir())])
    with pytest.raises(RunsError, match="not the test set"):
        reference_table(groups, [reference], shuffles=99)
    short = tmp_path / "short"
    short.write_text("0-0\n")
    with pytest.raises(RunsError, match="has 60 lines but --gold"):
        read_reference("aligner", files["good"], short)


def test_compare_prints_the_reference_rows(files: dict[str, Path], tmp_path: Path) -> None:
    completed = run_compare(
        files["runs"], "--out", tmp_path / "out", "--reference", f"eflomal={files['good']}",
        "--gold", files["gold"], "--samples", "999",
    )  # fmt: skip
    assert completed.returncode == 0, completed.stderr
    assert "Reference aligners" in completed.stdout and "eflomal (reference)" in completed.stdout
    refused = run_compare(files["runs"], "--out", tmp_path / "o2", "--reference", "x=y")
    assert refused.returncode == 2 and "--reference needs --gold" in refused.stderr
    alone = run_compare(files["runs"], "--out", tmp_path / "o3", "--gold", files["gold"])
    assert alone.returncode == 2 and "--gold scores --reference links" in alone.stderr


def test_bad_references_are_refused_before_any_table(
    files: dict[str, Path], tmp_path: Path
) -> None:
    """Links of another test set (past a reference's words), two references of one name and a
    missing file: refused before the runs' tables are printed."""
    references = "".join("w0 w1 w2 w3 w4\n" for _ in range(SENTENCES))
    for run in files["runs"].iterdir():
        (run / "test_references.txt").write_text(references)
    other = tmp_path / "other"
    other.write_text("".join("0-7 1-1\n" for _ in range(SENTENCES)))
    gold = ["--gold", files["gold"], "--out", tmp_path / "out"]
    for arguments, message in [
        (["--reference", f"x={other}"], f"{other}:1: link 0-7 points past the 5 words"),
        (["--reference", f"x={files['good']}", "--reference", f"x={files['good']}"], "given twice"),
        (["--reference", f"x={tmp_path / 'missing'}"], "does not exist"),
    ]:
        done = run_compare(files["runs"], *arguments, *gold)
        assert done.returncode == 2 and message in done.stderr, done.stderr
        assert done.stdout == "" and "Traceback" not in done.stderr
        assert not (tmp_path / "out").exists()  # nothing written for a refused comparison
