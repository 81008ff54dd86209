"""How long a verdict holds: `Evaluation.valid_until` and each verdict's own window.

Both halves of reusing a verdict rest on this: time alone cannot change a verdict inside its
window, and the window ends no later than the first boundary (stale by either clock, the end of
a clock-skew window).
"""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exporter_scheduler.policy import Policy
from exporter_scheduler.scoring import (
    NodeInput,
    PodClass,
    PodInput,
    evaluate,
    judge_node,
    validity_window,
)
from tests.scorer.scoring_builders import NOW
from tests.scorer.scoring_builders import node as scoring_node

MS = timedelta(milliseconds=1)


@pytest.mark.parametrize(
    ("nodes", "expected"),
    [
        pytest.param(
            [scoring_node(age_s=5)], NOW + timedelta(seconds=175) - MS, id="fresh-until-stale"
        ),
        pytest.param(
            [scoring_node("a", age_s=5), scoring_node("b", age_s=100)],
            NOW + timedelta(seconds=80) - MS,
            id="earliest-node-wins",
        ),
        pytest.param(
            [scoring_node(age_s=5, write_age_s=60)],
            NOW + timedelta(seconds=120) - MS,
            id="server-write-time-stales-first",
        ),
        pytest.param([scoring_node(age_s=-90)], NOW + timedelta(seconds=60) - MS, id="skew-ends"),
        pytest.param([scoring_node(age_s=999)], None, id="stale-stays-stale"),
        pytest.param([NodeInput("blank", {})], None, id="missing-data-does-not-age"),
        pytest.param([], None, id="no-nodes"),
    ],
)
def test_valid_until(nodes: list[NodeInput], expected: datetime | None) -> None:
    evaluation = evaluate(PodInput("d", "p", {}), nodes, NOW, Policy())
    assert evaluation.valid_until == expected


@pytest.mark.parametrize(
    ("the_node", "since_s", "left_s"),
    [
        # Fresh: skewed until 30 s before updated-at, stale 180 s after it.
        pytest.param(scoring_node(age_s=5), 35.0, 175.0, id="fresh"),
        pytest.param(scoring_node(age_s=200), 20.0, None, id="stale"),
        pytest.param(scoring_node(age_s=-90), None, 60.0, id="skewed"),
        pytest.param(scoring_node(age_s=5, write_age_s=60), 35.0, 120.0, id="by-server-clock"),
        pytest.param(NodeInput("blank", {}), None, None, id="missing"),
    ],
)
def test_validity_window(the_node: NodeInput, since_s: float | None, left_s: float | None) -> None:
    c = PodClass.of(PodInput("d", "p", {}), Policy())
    now_ts = NOW.timestamp()
    start, end = validity_window(judge_node(the_node, NOW, c), now_ts, c)
    assert start == (-float("inf") if since_s is None else now_ts - since_s + 0.001)
    assert end == (float("inf") if left_s is None else now_ts + left_s - 0.001)


def _outcomes(nodes: list[NodeInput], now: datetime) -> list[tuple[bool, str | None, int]]:
    evaluation = evaluate(PodInput("d", "p", {}), nodes, now, Policy())
    return [(v.passed, v.reason, v.score) for v in evaluation.verdicts]


@settings(max_examples=100, deadline=None)
@given(
    age_s=st.floats(min_value=-120, max_value=400),
    write_age_s=st.one_of(st.none(), st.floats(-60, 400)),
    fraction=st.floats(min_value=0, max_value=1, exclude_max=True),
)
def test_no_verdict_changes_inside_its_window(
    age_s: float, write_age_s: float | None, fraction: float
) -> None:
    """Anywhere in [from, until) around the moment judged, the verdict is the same."""
    the_node = scoring_node("n", age_s=age_s, write_age_s=write_age_s, utilization=0.5)
    c = PodClass.of(PodInput("d", "p", {}), Policy())
    now_ts = NOW.timestamp()
    start, end = validity_window(judge_node(the_node, NOW, c), now_ts, c)
    start, end = max(start, now_ts - 10_000), min(end, now_ts + 10_000)
    if end <= start:
        return  # a boundary exactly at NOW
    moment = datetime.fromtimestamp(start + (end - start) * fraction, NOW.tzinfo)
    assert _outcomes([the_node], moment) == _outcomes([the_node], NOW)
