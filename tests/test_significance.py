"""Paired significance against references: sacreBLEU's own command line on the same files (the
same seed and resamples give the same p-values), the stratified randomization test against the
exact permutation p-value enumerated by hand and against MultEval's published behaviour, and
intervals over seeds against Student's t by hand."""

from __future__ import annotations

import itertools
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
    aer_statistics,
    corpus_aer,
    paired_aer_randomization,
    paired_translation_test,
    stratified_randomization,
    translation_statistics,
)

WORDS = ["the", "a", "dog", "cat", "sees", "runs", "big", "small", "house", "tree", "red", "old"]


def systems(
    count: int = 150, noises: tuple[float, float] = (0.35, 0.25), seed: int = 0
) -> tuple[list[str], list[str], list[str]]:
    """References and two systems' translations of them, one noisier than the other."""
    rng = random.Random(seed)
    references, first, second = [], [], []
    for _ in range(count):
        reference = [rng.choice(WORDS) for _ in range(rng.randint(4, 12))]
        references.append(" ".join(reference))
        for noise, output in zip(noises, (first, second), strict=True):
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


def exact_p_value(baseline: np.ndarray, system: np.ndarray, score: object) -> float:
    """The permutation p-value by enumeration: every way of dealing each sentence's 2R
    translations R to either side, equally likely; the share at least as far apart as observed."""
    assert callable(score)
    seeds, sentences = baseline.shape[:2]
    pooled = np.concatenate([baseline, system])  # (2R, N, k)
    observed = abs(score(system.sum((0, 1))) - score(baseline.sum((0, 1))))
    splits = list(itertools.combinations(range(2 * seeds), seeds))
    at_least = total = 0
    for dealt in itertools.product(splits, repeat=sentences):
        side = sum(pooled[list(rows), i].sum(0) for i, rows in enumerate(dealt))
        rest = pooled.sum((0, 1)) - side
        at_least += abs(score(side) - score(rest)) >= observed - 1e-12
        total += 1
    return at_least / total


@pytest.mark.parametrize("seeds", [1, 2])
def test_the_randomization_p_value_is_the_exact_permutation_one(seeds: int) -> None:
    """Few sentences, so every split can be enumerated (2^8 with one seed, 6^4 with two): the
    Monte Carlo p-value lies within its own sampling error of the exact one."""
    rng = np.random.default_rng(seeds)
    sentences = 8 if seeds == 1 else 4
    baseline, system = (rng.integers(0, 6, (seeds, sentences, 4)).astype(float) for _ in "ab")
    system[..., 0] += 1  # more sure hits: the system tends to be better, but not on every line
    shuffles = 20000
    result = stratified_randomization("AER", baseline, system, corpus_aer, shuffles)
    exact = exact_p_value(baseline, system, corpus_aer)
    assert 0.02 < exact < 0.98  # a p-value the test has to estimate, not a corner
    error = math.sqrt(exact * (1 - exact) / shuffles)
    assert abs(result.p_value - exact) < 4 * error + 1 / shuffles
    assert result.seeds == seeds and result.shuffles == shuffles


def seeds_of(count: int, noise: float) -> tuple[list[list[str]], list[str]]:
    """``count`` runs of one system (its translations differ run to run), and the references."""
    references, _, _ = systems()
    runs = []
    for seed in range(count):
        rng = random.Random(100 + seed)
        runs.append(
            [
                " ".join(w if rng.random() > noise else rng.choice(WORDS) for w in line.split())
                for line in references
            ]
        )
    return runs, references


def stacked(runs: list[list[str]], references: list[str], metric: str) -> np.ndarray:
    return np.stack([translation_statistics(run, references, "13a")[metric][0] for run in runs])


def test_over_seeds_identical_systems_get_p_near_one_and_a_better_one_the_floor() -> None:
    """MultEval's published behaviour (Clark et al., 2011; multeval#5): the same three runs as
    both systems are no finding; a system better on every sentence gets the smallest p."""
    runs, references = seeds_of(3, 0.3)
    score = translation_statistics(runs[0], references, "13a")["BLEU"][1]
    same = stacked(runs, references, "BLEU")
    identical = stratified_randomization("BLEU", same, same.copy(), score, 2000)
    assert identical.difference == 0 and identical.p_value > 0.5
    better = stacked([references] * 3, references, "BLEU")  # every sentence translated exactly
    floor = stratified_randomization("BLEU", same, better, score, 2000)
    assert floor.p_value == pytest.approx(1 / 2001)


def test_the_pooled_score_is_sacrebleus_on_every_seed_as_one_corpus() -> None:
    import sacrebleu

    runs, references = seeds_of(3, 0.3)
    every = [line for run in runs for line in run]
    for metric, expected in (
        ("BLEU", sacrebleu.corpus_bleu(every, [references * 3]).score),
        ("chrF", sacrebleu.corpus_chrf(every, [references * 3]).score),
    ):
        statistics = stacked(runs, references, metric)
        score = translation_statistics(runs[0], references, "13a")[metric][1]
        result = stratified_randomization(metric, statistics, statistics, score, 10)
        assert result.baseline == pytest.approx(expected, abs=1e-9)


def test_one_pair_agrees_with_sacrebleus_randomization_where_no_shuffle_ties() -> None:
    """With one seed the test is sacreBLEU's approximate randomization but for ties (which it
    does not count): on two systems of close quality, the same p within sampling error."""
    references, first, second = systems(noises=(0.3, 0.29), seed=5)
    ours = translation_statistics(first, references, "13a")
    theirs = {
        r.metric: r.p_value for r in paired_translation_test(first, second, references, "13a", "ar")
    }
    system = translation_statistics(second, references, "13a")
    for metric in ("BLEU", "chrF"):
        statistics, score = ours[metric]
        result = stratified_randomization(metric, statistics[None], system[metric][0][None], score)
        assert 0.05 < theirs[metric] < 0.95
        error = math.sqrt(theirs[metric] * (1 - theirs[metric]) / 10000)
        assert abs(result.p_value - theirs[metric]) < 6 * error


def link_counts(rng: np.random.Generator, sentences: int) -> list[AlignmentCounts]:
    """Counts a real alignment can have: gold with sure links only, hits at most either side."""
    counts = []
    for _ in range(sentences):
        sure, predicted = (int(n) for n in rng.integers(1, 7, 2))
        hits = int(rng.integers(0, min(sure, predicted) + 1))
        counts.append(AlignmentCounts(hits, hits, predicted, sure))
    return counts


def test_the_aer_test_gives_identical_links_p_one_and_near_identical_a_large_p() -> None:
    baseline = link_counts(np.random.default_rng(3), 40)
    assert paired_aer_randomization(baseline, list(baseline)).p_value == 1.0
    near = [*baseline[:-1], AlignmentCounts(3, 3, 4, 5)]  # one sentence's links differ
    result = paired_aer_randomization(baseline, near, 2000)
    assert result.difference != 0 and result.p_value > 0.5
    perfect = [AlignmentCounts(c.sure, c.sure, c.sure, c.sure) for c in baseline]
    floor = paired_aer_randomization(baseline, perfect, 2000)
    assert floor.system == 0.0 and floor.p_value == pytest.approx(1 / 2001)
    total = AlignmentCounts()
    for count in baseline:
        total += count
    assert corpus_aer(aer_statistics(baseline).sum(0)) == pytest.approx(total.aer)


def test_a_system_against_a_near_copy_is_no_finding() -> None:
    """One sentence changed of 150: a difference that resampling explains."""
    references, first, _ = systems()
    copy = [*first[:-1], references[-1]]
    for result in paired_translation_test(first, copy, references):
        assert abs(result.difference) < 1 and result.p_value > 0.05


@pytest.mark.parametrize("test", ["bs", "ar"])
def test_identical_translations_get_p_one_under_either_test(test: str) -> None:
    """sacreBLEU's bootstrap alone would give two identical systems its smallest p."""
    references, first, _ = systems()
    for result in paired_translation_test(first, list(first), references, "13a", test):
        assert result.difference == 0 and result.p_value == 1.0


def test_systems_of_different_test_sets_are_refused() -> None:
    references, first, second = systems()
    with pytest.raises(SignificanceError, match="line counts"):
        paired_translation_test(first, second[:-1], references)
    with pytest.raises(SignificanceError, match="not scored on the same test set"):
        paired_aer_randomization([AlignmentCounts()] * 3, [AlignmentCounts()] * 2)
    with pytest.raises(SignificanceError, match="as many runs of each system"):
        stratified_randomization("AER", np.zeros((2, 3, 4)), np.zeros((3, 3, 4)), corpus_aer)


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
