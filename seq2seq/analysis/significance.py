"""Paired significance of the difference between two systems on the same test sentences.

BLEU and chrF, one run against one run: sacreBLEU's own paired tests (``sacrebleu.significance``;
Koehn, 2004, paired bootstrap resampling; Riezler and Maxwell, 2005, approximate randomization),
exactly as its command line runs them (``sacrebleu REF -i A B --paired-bs``): the same resamples
(its seed, ``SACREBLEU_SEED``, 12345 by default) give the same p-value.

Two settings over several seeds, and AER: **stratified approximate randomization**
(``stratified_randomization``; Clark et al., 2011, and their MultEval tool). Each system is R runs
(seeds) that translated the same N sentences; its score is the metric of all R·N translations
pooled as one corpus (sentence statistics summed). A shuffle deals each sentence's 2R translations
anew, R to either side (the strata are the sentences: a translation only ever trades places with
another translation of its own sentence, of either system and any seed), and the test counts the
shuffles whose |difference| is at least the observed one: p = (count + 1) / (shuffles + 1). With
R = 1 this is the classic per-sentence swap. Where MultEval and sacreBLEU count only differences
strictly larger than the observed one, two identical systems get the smallest p the test can give
(multeval issue #5); counting ties as Riezler and Maxwell do gives them p = 1.

AER's sentence statistics are its four link counts (``seq2seq.analysis.alignment``), so a shuffle
swaps two systems' links of a sentence and recomputes corpus AER.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np
from sacrebleu.metrics.bleu import BLEU
from sacrebleu.metrics.chrf import CHRF
from sacrebleu.significance import PairedTest

from seq2seq.analysis.alignment import AlignmentCounts
from seq2seq.errors import Seq2SeqError

TESTS = ("bs", "ar")  # paired bootstrap resampling, approximate randomization
DEFAULT_SAMPLES = {"bs": 1000, "ar": 10000}  # sacreBLEU's defaults
SHUFFLES = 10000  # the stratified test's, as sacreBLEU's and MultEval's randomization tests
# Shuffles scored at once: a (chunk, 2R, N) table of draws stays a few MB for test sets of
# thousands of sentences.
CHUNK = 256


class SignificanceError(Seq2SeqError, ValueError):
    """Systems that cannot be compared sentence by sentence; the message says why and the fix."""


@dataclass(frozen=True)
class PairedResult:
    """One metric of a baseline and a system on the same sentences, and the test's p-value: the
    probability of a difference at least this large if the two were the same system."""

    metric: str
    baseline: float
    system: float
    p_value: float

    @property
    def difference(self) -> float:
        return self.system - self.baseline


def sacrebleu_seed() -> int | None:
    """The seed sacreBLEU's tests use: ``SACREBLEU_SEED`` (``none``: the OS's entropy)."""
    seed = os.environ.get("SACREBLEU_SEED", "12345")
    return None if seed.lower() == "none" else int(seed)


def paired_translation_test(
    baseline: Sequence[str],
    system: Sequence[str],
    references: Sequence[str],
    tokenize: str = BLEU.TOKENIZER_DEFAULT,
    test: str = "bs",
    samples: int | None = None,
) -> list[PairedResult]:
    """sacreBLEU's paired ``test`` (``bs`` or ``ar``) of corpus BLEU (with ``tokenize``) and chrF,
    ``system`` against ``baseline``, line-parallel with ``references``. Identical translations
    differ nowhere: their p is 1 whatever the test (sacreBLEU's tests give them their smallest p,
    1 / (samples + 1), as though a difference of 0 were never reached by chance)."""
    check_parallel(baseline, system, references)
    if test not in TESTS:
        raise SignificanceError(f"the paired test must be one of {', '.join(TESTS)}, got {test!r}.")
    identical = list(baseline) == list(system)
    metrics = translation_metrics(tokenize)
    with progress_at_debug_level():  # its constructor scores the baseline already
        paired = PairedTest(
            [("baseline", list(baseline)), ("system", list(system))],
            metrics,
            [list(references)],
            test_type=test,
            n_samples=samples or DEFAULT_SAMPLES[test],
        )
        _, scores = paired()
    results = []
    # Results are keyed by the metrics' own names (chrF is "chrF2": β = 2), in order.
    for name, key in zip(metrics, list(scores)[1:], strict=True):
        baseline_result, system_result = scores[key]
        assert not isinstance(baseline_result, str) and not isinstance(system_result, str)
        assert system_result.p_value is not None  # the system is tested against the baseline
        p_value = 1.0 if identical else system_result.p_value
        results.append(PairedResult(name, baseline_result.score, system_result.score, p_value))
    return results


@dataclass(frozen=True)
class PooledResult(PairedResult):
    """A paired result of two systems over R seeds each, pooled, from the stratified test
    (module docstring) over ``shuffles`` shuffles: p is at least 1 / (shuffles + 1)."""

    shuffles: int
    seeds: int


Score = Callable[[np.ndarray], float]  # summed sentence statistics (k,) -> the corpus metric


def stratified_randomization(
    metric: str,
    baseline: np.ndarray,
    system: np.ndarray,
    score: Score,
    shuffles: int = SHUFFLES,
) -> PooledResult:
    """The stratified approximate randomization test (module docstring) of ``system`` against
    ``baseline``: sentence statistics of shape (R, N, k), R seeds of N sentences each, summed
    over seeds and sentences into ``score``. Shuffles drawn from sacreBLEU's seed."""
    if baseline.shape != system.shape or baseline.ndim != 3:
        raise SignificanceError(
            f"{metric}: sentence statistics of shapes {baseline.shape} and {system.shape}: a "
            "stratified test needs as many runs of each system, each run scored on the same "
            "test sentences."
        )
    seeds = baseline.shape[0]
    pooled = np.concatenate([baseline, system]).astype(np.float64)  # (2R, N, k)
    total = pooled.sum((0, 1))  # (k,)
    observed = [score(baseline.sum((0, 1))), score(system.sum((0, 1)))]
    difference = abs(observed[1] - observed[0])
    # Ties count (Riezler and Maxwell): float noise in a recomputed score must not break one.
    tie = 1e-9 * max(1.0, difference)
    rng = np.random.default_rng(sacrebleu_seed())
    at_least = 0
    for start in range(0, shuffles, CHUNK):
        count = min(CHUNK, shuffles - start)
        keys = rng.random((count, 2 * seeds, pooled.shape[1]))  # (c, 2R, N)
        # Each sentence's R smallest keys go to one side: a uniform split of its 2R translations.
        dealt = keys.argsort(axis=1).argsort(axis=1) < seeds  # (c, 2R, N)
        sides = np.einsum("cjn,jnk->ck", dealt, pooled)  # (c, k): one side's summed statistics
        for one_side in sides:
            if abs(score(one_side) - score(total - one_side)) >= difference - tie:
                at_least += 1
    return PooledResult(
        metric, observed[0], observed[1], (at_least + 1) / (shuffles + 1), shuffles, seeds
    )


def corpus_aer(summed: np.ndarray) -> float:
    """Corpus AER from the summed counts (hits sure, hits possible, predicted, sure); 0 where a
    test set has neither links nor gold (as ``AlignmentCounts.aer``)."""
    denominator = summed[2] + summed[3]
    return float(1 - (summed[0] + summed[1]) / denominator) if denominator > 0 else 0.0


def aer_statistics(counts: Sequence[AlignmentCounts]) -> np.ndarray:
    """(N, 4): each sentence's link counts, AER's sentence statistics."""
    return np.array(
        [[c.hits_sure, c.hits_possible, c.predicted, c.sure] for c in counts], dtype=np.float64
    ).reshape(len(counts), 4)


def paired_aer_randomization(
    baseline: Sequence[AlignmentCounts],
    system: Sequence[AlignmentCounts],
    shuffles: int = SHUFFLES,
) -> PooledResult:
    """Approximate randomization of corpus AER between two runs on the same sentences: each
    shuffle swaps the two runs' links of each sentence with probability ½ (the stratified test
    with one seed)."""
    if len(baseline) != len(system):
        raise SignificanceError(
            f"AER counts of {len(baseline)} and {len(system)} sentences: the two runs were not "
            "scored on the same test set."
        )
    return stratified_randomization(
        "AER", aer_statistics(baseline)[None], aer_statistics(system)[None], corpus_aer, shuffles
    )


def translation_statistics(
    hypotheses: Sequence[str], references: Sequence[str], tokenize: str = BLEU.TOKENIZER_DEFAULT
) -> dict[str, tuple[np.ndarray, Score]]:
    """Per metric (BLEU with ``tokenize``, chrF), the sentence statistics sacreBLEU's own tests
    resample, (N, k), and the corpus score of their sum: the same numbers as its corpus score."""
    check_parallel(hypotheses, references)
    statistics: dict[str, tuple[np.ndarray, Score]] = {}
    for name, metric in translation_metrics(tokenize).items():
        sentences = metric._extract_corpus_statistics(list(hypotheses), [list(references)])
        statistics[name] = (
            np.array(sentences, dtype=np.float64),
            functools.partial(sacrebleu_score, metric),
        )
    return statistics


def sacrebleu_score(metric: BLEU | CHRF, summed: np.ndarray) -> float:
    """The metric's corpus score from summed sentence statistics, by sacreBLEU's own formula."""
    return float(metric._compute_score_from_stats(summed.tolist()).score)


def translation_metrics(tokenize: str) -> dict[str, BLEU | CHRF]:
    # tokenize="none" scores text tokenized on purpose (the toy tasks): say so (force), or
    # sacreBLEU warns that it looks like text left tokenized by mistake.
    return {"BLEU": BLEU(tokenize=tokenize, force=tokenize == "none"), "chrF": CHRF()}


@contextlib.contextmanager
def progress_at_debug_level() -> Iterator[None]:
    """sacreBLEU's progress lines ("Pre-computing BLEU statistics ...", INFO on its logger) as
    DEBUG records while a test runs: shown where debug logging is on, never at the end of
    every sweep beside the results."""
    sacrebleu_log = logging.getLogger("sacrebleu")

    def demote(record: logging.LogRecord) -> bool:
        if record.levelno != logging.INFO:
            return True
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        return sacrebleu_log.isEnabledFor(logging.DEBUG)

    sacrebleu_log.addFilter(demote)
    try:
        yield
    finally:
        sacrebleu_log.removeFilter(demote)


def check_parallel(*sides: Sequence[str]) -> None:
    lengths = {len(side) for side in sides}
    if len(lengths) != 1:
        raise SignificanceError(
            f"line counts {sorted(len(side) for side in sides)} differ: a paired test needs the "
            "two systems' translations of the same test sentences, line by line, and their "
            "references."
        )
