"""The order-statistic interval for a median (benchmarks.intervals)."""

from __future__ import annotations

import random

import pytest

from benchmarks.intervals import median_interval, resolution


def test_three_rounds_give_their_range_at_75_percent() -> None:
    interval = median_interval([1.2, 0.8, 1.0])
    assert (interval.low, interval.high, interval.count) == (0.8, 1.2, 3)
    assert interval.coverage == pytest.approx(0.75)  # 1 - 2 * (1/2)^3


def test_nine_rounds_drop_the_extreme_on_each_side_at_96_percent() -> None:
    values = [0.9, 0.3, 0.5, 0.1, 0.7, 0.2, 0.8, 0.4, 0.6]
    interval = median_interval(values)
    assert (interval.low, interval.high) == (0.2, 0.8)
    assert interval.coverage == pytest.approx(1 - 2 * (1 + 9) / 2**9)


def test_the_interval_is_the_narrowest_that_reaches_the_confidence() -> None:
    values = [float(i) for i in range(17)]
    assert median_interval(values, confidence=0.95).low == 4.0  # k = 5: 95.1 %
    assert median_interval(values, confidence=0.80).low == 5.0  # k = 6: 85.7 %


def test_the_interval_holds_the_median_as_often_as_it_says() -> None:
    """Drawn from a skewed distribution whose median is known: the share of intervals holding
    it is the stated coverage, within the draw's own error."""
    rng = random.Random(11)
    true_median = 1.0  # of exp(N(0, 1)), a skewed distribution
    trials, held = 4000, 0
    coverage = 0.0
    for _ in range(trials):
        interval = median_interval([rng.lognormvariate(0.0, 1.0) for _ in range(9)])
        held += interval.low <= true_median <= interval.high
        coverage = interval.coverage
    assert held / trials == pytest.approx(coverage, abs=0.015)


def test_one_value_has_no_interval() -> None:
    with pytest.raises(ValueError, match="at least two values"):
        median_interval([1.0])


@pytest.mark.parametrize(
    ("low", "high", "expected"),
    [(0.96, 1.10, "met"), (0.95, 1.0, "met"), (0.80, 0.94, "missed"), (0.90, 1.00, "unresolved")],
)
def test_a_target_is_resolved_only_when_the_interval_is_on_one_side(
    low: float, high: float, expected: str
) -> None:
    assert resolution(low, high, 0.95) == expected
