"""How long a verdict holds: `Evaluation.valid_until` and each verdict's own window.

Both halves of reusing a verdict rest on this: time alone cannot change a verdict inside its
window, and the window ends no later than the first boundary (stale by either clock, the end of
a clock-skew window, the end of an in-flight pod's time bound).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exporter_scheduler.core.judge import evaluate, judge_node
from exporter_scheduler.core.podclass import PodClass
from exporter_scheduler.core.policy import Policy
from exporter_scheduler.core.records import NodeInput, PodInput
from exporter_scheduler.core.validity import validity_window
from tests.scorer.scoring_builders import (
    NOW,
    Gpu,
    bound_pod,
    gpu_node,
    pod,
    runs,
    with_pods,
)
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
        pytest.param(
            [with_pods(scoring_node(age_s=5), bound_pod(bound_age_s=590))],
            NOW + timedelta(seconds=10) - MS,
            id="inflight-pod-time-bound-first",
        ),
        pytest.param(
            [with_pods(scoring_node(age_s=5), bound_pod(bound_age_s=4, provisional=True))],
            NOW + timedelta(seconds=6) - MS,
            id="provisional-pod-ends-after-10s",
        ),
        pytest.param(
            [
                with_pods(
                    scoring_node(age_s=5),
                    bound_pod(bound_age_s=120, admitted_age_s=110, running_age_s=100),
                )
            ],
            NOW + timedelta(seconds=175) - MS,
            id="released-pod-bounds-nothing",
        ),
        pytest.param(
            [with_pods(scoring_node(age_s=999), bound_pod(bound_age_s=590))],
            None,
            id="pods-on-stale-data-bound-nothing",
        ),
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
        pytest.param(
            with_pods(scoring_node(age_s=5), bound_pod(bound_age_s=595)),
            35.0,
            5.0,
            id="inflight-pod-ends-ahead",
        ),
        pytest.param(
            with_pods(scoring_node(age_s=5), bound_pod(bound_age_s=610)),
            10.0,
            175.0,
            id="inflight-pod-ended-behind",
        ),
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


# Around the boundaries of a node sampled `age_s` ago (load delay 60 s, bound 600 s, 10 s for a
# proposal), and anywhere.
pod_ages = st.one_of(
    st.none(), st.sampled_from([0.0, 5.0, 9.5, 10.0, 30.0, 69.5, 595.0, 600.0]), st.floats(-30, 800)
)
inflight_pods = st.lists(
    st.builds(
        bound_pod,
        name=st.sampled_from(["a", "b", "c"]),
        gpus=st.integers(0, 4),
        bound_age_s=pod_ages,
        admitted_age_s=pod_ages,
        running_age_s=pod_ages,
        gpu_load=st.one_of(st.none(), st.sampled_from([0.25, 1.0])),
        memory_mib=st.one_of(st.none(), st.just(30_000)),
        provisional=st.booleans(),
    ),
    min_size=1,
    max_size=3,
    unique_by=lambda p: p.name,
)
IDLE_FREE = Gpu(utilization=0.0, allocated=False)
SATURATED_FREE = Gpu(utilization=0.97, allocated=False)


@settings(max_examples=200, deadline=None)
@given(
    age_s=st.one_of(st.floats(min_value=-40, max_value=200), st.sampled_from([5.0, 10.0])),
    per_gpu=st.sampled_from([None, "allocations", "no-allocations"]),
    pods=inflight_pods,
    k=st.integers(0, 2),
    min_memory=st.sampled_from([None, "60000"]),
    fraction=st.floats(min_value=0, max_value=1, exclude_max=True),
)
def test_no_verdict_with_inflight_pods_changes_inside_its_window(  # noqa: PLR0917
    age_s: float,
    per_gpu: str | None,
    pods: list[Any],
    k: int,
    min_memory: str | None,
    fraction: float,
) -> None:
    """Pods reaching their time bound change verdicts only at the window's ends."""
    if per_gpu is None:
        plain = scoring_node("n", age_s=age_s, utilization=0.5)
    else:
        allocated = False if per_gpu == "allocations" else None
        table = runs(
            (5, Gpu(utilization=0.0, allocated=allocated)),
            (1, Gpu(utilization=0.97, allocated=allocated)),
        )
        plain = gpu_node("n", table, age_s=age_s)
    the_node = with_pods(plain, *pods)
    the_pod = pod(gpus=k, min_memory_mib=min_memory)
    policy = Policy()
    c = PodClass.of(the_pod, policy)
    now_ts = NOW.timestamp()
    verdict = judge_node(the_node, NOW, c)
    start, end = validity_window(verdict, now_ts, c)
    valid_until = evaluate(the_pod, [the_node], NOW, policy).valid_until
    assert (end == float("inf")) is (valid_until is None)
    if valid_until is not None:
        assert valid_until.timestamp() == pytest.approx(end, abs=1e-6)
    start, end = max(start, now_ts - 10_000), min(end, now_ts + 10_000)
    if end <= start:
        return  # a boundary exactly at NOW
    moment = datetime.fromtimestamp(start + (end - start) * fraction, NOW.tzinfo)
    again = judge_node(the_node, moment, c)
    assert (again.passed, again.reason, again.score) == (
        verdict.passed,
        verdict.reason,
        verdict.score,
    )
