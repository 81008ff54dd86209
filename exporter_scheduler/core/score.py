"""The score of a node that passed: a weighted mean of three headrooms, in integers.

Every step is integer math in basis points (10000 = 1.0), rounded half up where the
explanation shows it, so that the same inputs give the same score on every machine. The score
is a pure function of three node values and the policy's weights and temperature limit, and
the values repeat across nodes and requests (two-decimal fractions, whole degrees), so it is
memoised as what it is: `functools.lru_cache` on that pure function.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Final, NamedTuple

from exporter_scheduler.core.records import BASIS_POINTS, MAX_SCORE, ScoreBreakdown

# Temperature headroom reaches its full value this many degrees below the limit.
TEMPERATURE_HEADROOM_SPAN_C: Final = 40
_SCORE_MEMO_MAX: Final = 65_536


class ScoreWeights(NamedTuple):
    """What of the policy the score reads: the headrooms' weights (thousandths) and the
    temperature limit the temperature headroom counts down to."""

    temperature_limit_c: int
    utilization: int
    fragmentation: int
    temperature: int


@lru_cache(maxsize=_SCORE_MEMO_MAX)
def score(
    utilization_bp: int,
    fragmentation: float | None,
    temperature_c: int | None,
    weights: ScoreWeights,
) -> ScoreBreakdown:
    """The node-level score; an unknown headroom counts as none."""
    return combine(
        BASIS_POINTS - utilization_bp,
        fragmentation_headroom(fragmentation),
        temperature_headroom(temperature_c, weights.temperature_limit_c),
        weights,
    )


def fragmentation_headroom(fragmentation: float | None) -> int:
    return 0 if fragmentation is None else BASIS_POINTS - round(fragmentation * BASIS_POINTS)


def temperature_headroom(temperature_c: int | None, limit_c: int) -> int:
    if temperature_c is None:
        return 0
    headroom = (limit_c - temperature_c) * BASIS_POINTS // TEMPERATURE_HEADROOM_SPAN_C
    return max(0, min(BASIS_POINTS, headroom))


def combine(
    utilization_headroom: int,
    fragmentation_headroom: int,
    temperature_headroom: int,
    weights: ScoreWeights,
) -> ScoreBreakdown:
    """The weighted mean of three headrooms (basis points) and the score it rounds to."""
    _, w_util, w_frag, w_temp = weights
    weighted = (
        w_util * utilization_headroom
        + w_frag * fragmentation_headroom
        + w_temp * temperature_headroom
    )
    w_total = w_util + w_frag + w_temp
    # Round half up twice, each step shown in explanations: to 0.01 %, then to 0..10.
    percent_bp = (2 * weighted + w_total) // (2 * w_total)
    percent_bp = max(0, min(BASIS_POINTS, percent_bp))
    points = (percent_bp + BASIS_POINTS // (2 * MAX_SCORE)) // (BASIS_POINTS // MAX_SCORE)
    return ScoreBreakdown(
        utilization_headroom, fragmentation_headroom, temperature_headroom, percent_bp, points
    )
