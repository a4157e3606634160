"""Paired significance of the difference between two systems on the same test sentences.

BLEU and chrF: sacreBLEU's own paired tests (``sacrebleu.significance``; Koehn, 2004, paired
bootstrap resampling; Riezler and Maxwell, 2005, approximate randomization), exactly as its
command line runs them (``sacrebleu REF -i A B --paired-bs``): the same resamples (its seed,
``SACREBLEU_SEED``, 12345 by default) give the same p-value. AER: the same paired bootstrap over
sentences, with each resample's corpus AER from its sentences' summed link counts
(``seq2seq.analysis.alignment.AlignmentCounts``) and sacreBLEU's p-value: the share of resamples
whose centred |difference| exceeds the observed one ((c + 1) / (n + 1)).
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
from sacrebleu.metrics.bleu import BLEU
from sacrebleu.metrics.chrf import CHRF
from sacrebleu.significance import PairedTest

from seq2seq.analysis.alignment import AlignmentCounts
from seq2seq.errors import Seq2SeqError

TESTS = ("bs", "ar")  # paired bootstrap resampling, approximate randomization
DEFAULT_SAMPLES = {"bs": 1000, "ar": 10000}  # sacreBLEU's defaults


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
    ``system`` against ``baseline``, line-parallel with ``references``."""
    check_parallel(baseline, system, references)
    if test not in TESTS:
        raise SignificanceError(f"the paired test must be one of {', '.join(TESTS)}, got {test!r}.")
    # tokenize="none" scores text tokenized on purpose (the toy tasks): say so (force), or
    # sacreBLEU warns that it looks like text left tokenized by mistake.
    metrics = {"BLEU": BLEU(tokenize=tokenize, force=tokenize == "none"), "chrF": CHRF()}
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
        results.append(
            PairedResult(name, baseline_result.score, system_result.score, system_result.p_value)
        )
    return results


def paired_aer_bootstrap(
    baseline: Sequence[AlignmentCounts],
    system: Sequence[AlignmentCounts],
    samples: int = DEFAULT_SAMPLES["bs"],
) -> PairedResult:
    """The paired bootstrap of corpus AER over sentences (module docstring), with sacreBLEU's
    resampling of sentence indices (its seed) and its p-value."""
    if len(baseline) != len(system):
        raise SignificanceError(
            f"AER counts of {len(baseline)} and {len(system)} sentences: the two runs were not "
            "scored on the same test set."
        )
    counts = [
        np.array([[c.hits_sure, c.hits_possible, c.predicted, c.sure] for c in side], dtype=float)
        for side in (baseline, system)
    ]  # (N, 4) each
    rng = np.random.default_rng(sacrebleu_seed())
    indices = rng.choice(len(baseline), size=(samples, len(baseline)), replace=True)  # (n, N)

    def aer(summed: np.ndarray) -> np.ndarray:  # (..., 4) -> (...)
        denominator = summed[..., 2] + summed[..., 3]
        hits = summed[..., 0] + summed[..., 1]
        return np.where(denominator > 0, 1 - hits / np.maximum(denominator, 1), 0.0)

    observed = [float(aer(side.sum(0))) for side in counts]
    resampled = [aer(side[indices].sum(1)) for side in counts]  # (n,) each
    differences = np.abs(resampled[1] - resampled[0])
    centred = differences - differences.mean()
    exceeding = int(np.sum(centred > abs(observed[1] - observed[0])))
    return PairedResult("AER", observed[0], observed[1], (exceeding + 1) / (samples + 1))


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
