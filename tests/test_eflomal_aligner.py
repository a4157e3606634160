"""eflomal beside the attention: its links on a made-up language whose alignment is known, the
context pairs it learns from and drops, and `seq2seq align --eflomal` writing and scoring them."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

from seq2seq.analysis.alignment import (
    AlignmentCounts,
    GoldAlignment,
    corpus_aer,
    count_links,
    read_pharaoh,
)
from seq2seq.analysis.eflomal_aligner import eflomal_links
from seq2seq.analysis.word_alignment import symmetrize

pytest.importorskip("eflomal")

ROOT = Path(__file__).resolve().parents[1]


def cipher(count: int, seed: int) -> tuple[list[str], list[str], list[list[tuple[int, int]]]]:
    """Sentences of a 30-word language and their word-by-word cipher with the last two words
    swapped: target word j translates source word gold[j]."""
    generator = random.Random(seed)
    sources, targets, gold = [], [], []
    for _ in range(count):
        words = [f"w{generator.randrange(30)}" for _ in range(generator.randint(3, 8))]
        order = [*range(len(words) - 2), len(words) - 1, len(words) - 2]
        sources.append(" ".join(words))
        targets.append(" ".join(f"c{words[i][1:]}" for i in order))
        gold.append(sorted((i, j) for j, i in enumerate(order)))
    return sources, targets, gold


def test_eflomal_finds_a_cipher_s_alignment_and_returns_only_the_pairs_asked() -> None:
    sources, targets, gold = cipher(400, seed=0)
    more_sources, more_targets, _ = cipher(600, seed=1)
    forward, backward = eflomal_links(sources, targets, (more_sources, more_targets))
    assert len(forward) == len(backward) == len(sources)
    golden = [GoldAlignment.from_links(links) for links in gold]
    joined = [symmetrize(f, b) for f, b in zip(forward, backward, strict=True)]
    for links in (forward, backward, joined):
        assert corpus_aer(links, golden) < 0.1  # a statistical aligner's job, done
    assert eflomal_links([], []) == ([], [])


def test_align_eflomal_writes_links_whose_aer_it_prints(tmp_path: Path) -> None:
    sources, targets, gold = cipher(300, seed=2)
    for name, lines in [
        ("s", sources), ("t", targets), ("a", [" ".join(f"{i}-{j}" for i, j in g) for g in gold]),
    ]:  # fmt: skip
        (tmp_path / name).write_text("\n".join(lines) + "\n")
    for method in ("none", "grow-diag-final-and"):
        completed = subprocess.run(
            [sys.executable, "scripts/alignment.py", "--eflomal", "--src", tmp_path / "s",
             "--tgt", tmp_path / "t", "--align", tmp_path / "a", "--write", tmp_path / method,
             "--symmetrize", method, "--json"],
            cwd=ROOT, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert completed.returncode == 0, completed.stderr
        written = [sorted(a.sure) for a in read_pharaoh(tmp_path / method)]
        references = read_pharaoh(tmp_path / "a")
        printed = json.loads(completed.stdout)
        assert printed["aer"] == pytest.approx(corpus_aer(written, references))
        counts = sum(
            (count_links(a, g) for a, g in zip(written, references, strict=True)),
            AlignmentCounts(),
        )
        assert printed["recall"] == pytest.approx(counts.recall)
        assert "Prepared" not in completed.stderr


def test_align_eflomal_refuses_a_model_s_options(tmp_path: Path) -> None:
    (tmp_path / "s").write_text("a b\n")
    completed = subprocess.run(
        [sys.executable, "scripts/alignment.py", "--eflomal", "--src", tmp_path / "s", "--tgt",
         tmp_path / "s", "--write", tmp_path / "w", "--alignment", "0.3"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert completed.returncode == 2 and "eflomal gives hard links" in completed.stderr
