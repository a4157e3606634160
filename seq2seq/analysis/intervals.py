"""Mean and confidence interval of a figure over seeds, and whether two such intervals separate.

Reporting one run per setting hides how much a figure moves from seed to seed; Clark et al. (2011,
"Better hypothesis testing for statistical machine translation: controlling for optimizer
instability") ask for several runs per setting and their spread. The interval here is Student's t
interval of the mean of n independent runs, mean ± t_{(1+c)/2, n-1} · s / √n, with s the sample
standard deviation (n - 1 in the denominator). A figure with a range (BLEU in [0, 100], AER in
[0, 1]) gets its interval cut at the range's ends and marked (``clipped``): a t interval of two
seeds near 100 BLEU would reach past it, which no figure can.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from scipy import stats

from seq2seq.errors import Seq2SeqError


class IntervalError(Seq2SeqError, ValueError):
    """Too few values for an interval; the message says how many are needed."""


@dataclass(frozen=True)
class Interval:
    """A figure over ``n`` runs: its mean, sample standard deviation and confidence interval."""

    mean: float
    std: float
    low: float
    high: float
    n: int
    confidence: float = 0.95
    clipped: bool = False  # cut at the figure's range (``mean_interval``'s ``bounds``)

    @property
    def half_width(self) -> float:
        return (self.high - self.low) / 2

    def separates_from(self, other: Interval) -> bool:
        """Whether the two intervals do not overlap: the difference of the means is larger than
        the seed-to-seed spread allows at this confidence (a conservative test)."""
        return self.low > other.high or other.low > self.high

    def format(self, digits: int = 1) -> str:
        """``mean ± half-width``, e.g. ``99.1 ± 0.4`` (thousands separated: ``5,511 ± 926``); an
        interval cut at the figure's range as its ends with a dagger, e.g. ``99.7 [96.2,
        100.0]†`` (a star marks p < 0.05 elsewhere)."""
        if self.clipped:
            return f"{self.mean:,.{digits}f} [{self.low:,.{digits}f}, {self.high:,.{digits}f}]†"
        return f"{self.mean:,.{digits}f} ± {self.half_width:,.{digits}f}"


def mean_interval(
    values: Sequence[float],
    confidence: float = 0.95,
    bounds: tuple[float, float] = (-math.inf, math.inf),
) -> Interval:
    """Student's t interval of the mean of ``values`` (at least two runs), cut to ``bounds``
    (the figure's range) and then marked ``clipped``."""
    values = [float(value) for value in values]
    if len(values) < 2:
        raise IntervalError(
            f"an interval over seeds needs at least 2 runs, got {len(values)}: train the same "
            "setting with more seeds (e.g. seq2seq train -m seed=1,2,3)."
        )
    if not 0 < confidence < 1:
        raise IntervalError(f"confidence must be between 0 and 1, got {confidence}.")
    mean = statistics.fmean(values)
    std = statistics.stdev(values)
    quantile = float(stats.t.ppf((1 + confidence) / 2, df=len(values) - 1))
    half = quantile * std / math.sqrt(len(values))
    low, high = max(mean - half, bounds[0]), min(mean + half, bounds[1])
    clipped = (low, high) != (mean - half, mean + half)
    return Interval(mean, std, low, high, len(values), confidence, clipped)
