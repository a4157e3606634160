"""Paired significance against references: sacreBLEU's own command line on the same files (the
same seed and resamples give the same p-values), the AER bootstrap against the procedure written
out by hand, and intervals over seeds against Student's t by hand."""

from __future__ import annotations

import logging
import math
import random
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from seq2seq.analysis.alignment import AlignmentCounts
from seq2seq.analysis.intervals import IntervalError, mean_interval
from seq2seq.analysis.significance import (
    SignificanceError,
    paired_aer_bootstrap,
    paired_translation_test,
    sacrebleu_seed,
)

WORDS = ["the", "a", "dog", "cat", "sees", "runs", "big", "small", "house", "tree", "red", "old"]


def systems(count: int = 150) -> tuple[list[str], list[str], list[str]]:
    """References and two systems' translations of them, one noisier than the other."""
    rng = random.Random(0)
    references, first, second = [], [], []
    for _ in range(count):
        reference = [rng.choice(WORDS) for _ in range(rng.randint(4, 12))]
        references.append(" ".join(reference))
        for noise, output in ((0.35, first), (0.25, second)):
            output.append(
                " ".join(w if rng.random() > noise else rng.choice(WORDS) for w in reference)
            )
    return references, first, second


def cli_p_values(tmp_path: Path, flag: str) -> list[float]:
    """The p-values sacrebleu's command line prints for BLEU and chrF, second system vs first."""
    executable = shutil.which("sacrebleu")
    if executable is None:
        pytest.skip("the sacrebleu command is not on PATH")
    references, first, second = systems()
    paths = {}
    for name, lines in (("ref", references), ("a", first), ("b", second)):
        paths[name] = tmp_path / name
        paths[name].write_text("\n".join(lines) + "\n", encoding="utf-8")
    completed = subprocess.run(
        [executable, str(paths["ref"]), "-i", str(paths["a"]), str(paths["b"]), flag,
         "-m", "bleu", "chrf", "-f", "text"],
        capture_output=True, text=True, check=True, timeout=600,
    )  # fmt: skip
    return [float(p) for p in re.findall(r"\(p = ([0-9.]+)\)", completed.stdout)]


@pytest.mark.parametrize(("test", "flag"), [("bs", "--paired-bs"), ("ar", "--paired-ar")])
def test_the_paired_tests_give_sacrebleus_own_p_values(
    test: str, flag: str, tmp_path: Path
) -> None:
    references, first, second = systems()
    results = paired_translation_test(first, second, references, "13a", test)
    expected = cli_p_values(tmp_path, flag)
    assert [r.metric for r in results] == ["BLEU", "chrF"]
    assert [round(r.p_value, 4) for r in results] == expected
    assert results[0].system > results[0].baseline  # the less noisy system scores higher


def test_the_aer_bootstrap_is_the_procedure_written_out() -> None:
    rng = np.random.default_rng(3)
    baseline = [AlignmentCounts(*map(int, rng.integers(0, 6, 4))) for _ in range(40)]
    system = [AlignmentCounts(*map(int, rng.integers(0, 6, 4))) for _ in range(40)]
    result = paired_aer_bootstrap(baseline, system, samples=200)

    def corpus_aer(counts: list[AlignmentCounts]) -> float:
        total = AlignmentCounts()
        for count in counts:
            total += count
        return total.aer

    # sacreBLEU's resampling of sentence indices, then its p-value, one resample at a time.
    indices = np.random.default_rng(sacrebleu_seed()).choice(40, size=(200, 40), replace=True)
    differences = [
        abs(corpus_aer([system[i] for i in row]) - corpus_aer([baseline[i] for i in row]))
        for row in indices
    ]
    mean = sum(differences) / len(differences)
    observed = abs(corpus_aer(system) - corpus_aer(baseline))
    exceeding = sum(1 for d in differences if d - mean > observed)
    assert (result.baseline, result.system) == (corpus_aer(baseline), corpus_aer(system))
    assert result.p_value == pytest.approx((exceeding + 1) / 201)


def test_a_system_against_a_near_copy_is_no_finding() -> None:
    """One sentence changed of 150: a difference that resampling explains."""
    references, first, _ = systems()
    copy = [*first[:-1], references[-1]]
    for result in paired_translation_test(first, copy, references):
        assert abs(result.difference) < 1 and result.p_value > 0.05


def test_systems_of_different_test_sets_are_refused() -> None:
    references, first, second = systems()
    with pytest.raises(SignificanceError, match="line counts"):
        paired_translation_test(first, second[:-1], references)
    with pytest.raises(SignificanceError, match="not scored on the same test set"):
        paired_aer_bootstrap([AlignmentCounts()] * 3, [AlignmentCounts()] * 2)


def test_the_interval_is_students_t_by_hand() -> None:
    values = [99.1, 98.4, 99.9]
    interval = mean_interval(values)
    mean = sum(values) / 3
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / 2)
    t_975_2 = 4.302652729911275  # Student's t, 97.5 % quantile, 2 degrees of freedom
    assert interval.mean == pytest.approx(mean)
    assert interval.std == pytest.approx(std)
    assert interval.half_width == pytest.approx(t_975_2 * std / math.sqrt(3))
    assert (interval.low, interval.high) == pytest.approx(
        (mean - interval.half_width, mean + interval.half_width)
    )


def test_an_interval_needs_two_runs() -> None:
    with pytest.raises(IntervalError, match="needs at least 2 runs, got 1"):
        mean_interval([99.0])


def test_sacrebleus_progress_lines_are_debug_records(caplog: pytest.LogCaptureFixture) -> None:
    """ "Pre-computing BLEU statistics ..." is sacreBLEU's INFO: at a sweep's end it stood beside
    the results under Hydra's tag. Now it is shown only where debug logging is on."""
    hypotheses = [f"a b c {i}" for i in range(30)]
    references = [f"a b d {i}" for i in range(30)]
    with caplog.at_level(logging.INFO):
        paired_translation_test(hypotheses, hypotheses, references, samples=50)
    assert "Pre-computing" not in caplog.text
    with caplog.at_level(logging.DEBUG):
        paired_translation_test(hypotheses, hypotheses, references, samples=50)
    assert any(r.levelno == logging.DEBUG and "Pre-computing" in r.message for r in caplog.records)
