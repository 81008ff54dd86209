"""What a handful of noisy rounds can say about their median.

A benchmark on a shared machine gets a few rounds, each off by the machine's noise of the
moment. Their median is the figure; how far the true median may be from it depends on how
many rounds there are and how they spread. The interval here assumes nothing about the noise's
shape: of n values, sorted, the k-th smallest and the k-th largest bracket the true median
unless k or more of the n fall on the same side of it, so the pair covers it with probability
1 - 2 P(Binomial(n, 1/2) < k). Three rounds give only their range, at 75 %; nine give the
second smallest to the second largest, at 96 %.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final, Literal

CONFIDENCE: Final = 0.95

Resolution = Literal["met", "missed", "unresolved"]


@dataclass(frozen=True, slots=True)
class MedianInterval:
    low: float
    high: float
    coverage: float  # the probability that [low, high] holds the true median
    count: int  # the values it was taken from


def resolution(low: float, high: float, least: float) -> Resolution:
    """A target of at least `least` against the interval [low, high]: met when the whole
    interval is at or above it, missed when it is all below, unresolved when it straddles it."""
    if low >= least:
        return "met"
    if high < least:
        return "missed"
    return "unresolved"


def median_interval(values: Sequence[float], confidence: float = CONFIDENCE) -> MedianInterval:
    """The narrowest order-statistic interval for the median of `values` that covers it with at
    least `confidence`; where no interval does (five values or fewer at 95 %), their range,
    with the coverage it has. Raises ValueError for fewer than two values."""
    ordered = sorted(values)
    count = len(ordered)
    if count < 2:
        raise ValueError(f"an interval needs at least two values, got {count}")
    k = 1
    while k < count // 2 and _coverage(count, k + 1) >= confidence:
        k += 1
    return MedianInterval(ordered[k - 1], ordered[count - k], _coverage(count, k), count)


def _coverage(count: int, k: int) -> float:
    """P(the k-th smallest <= the median <= the k-th largest) for `count` independent values."""
    outside = sum(math.comb(count, i) for i in range(k))
    return 1.0 - 2.0 * outside / float(2**count)
