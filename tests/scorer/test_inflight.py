"""In-flight pods: GPU pods bound to a node that its published data cannot show yet.

`count_inflight` decides which bound pods count (allocation pending, load pending, the time
bound); `evaluate` shows what they do to a verdict: on node-level data their load and memory
are added to what the node published, under the k-GPU rule they hold the best GPUs and shrink
the pool a blind device plugin draws from. Named cases pin each rule at its boundary; a
property drives the names-only node store (nodes and pods arriving in any order, the clock
moving) against a fresh `evaluate` of the same inputs at the same moment.

Times are relative to NOW; a node built here was sampled 10 s before it (`updated-at`).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exporter_scheduler.core import inflight, records
from exporter_scheduler.core.inflight import (
    PROVISIONAL_MAX_S,
    BoundPod,
    InFlight,
    SharedCounts,
    count_inflight,
)
from exporter_scheduler.core.judge import evaluate, judge_node
from exporter_scheduler.core.podclass import PodClass
from exporter_scheduler.core.policy import Policy
from exporter_scheduler.core.records import Evaluation, GpuStatus, NodeInput, NodeVerdict, PodInput
from exporter_scheduler.core.validity import validity_window
from exporter_scheduler.serving import wire
from exporter_scheduler.serving.app import ScorerApp
from exporter_scheduler.serving.explain import explain, render_text
from exporter_scheduler.serving.nodestore import NodeStore
from tests.scorer.scoring_builders import (
    NOW,
    STRICT,
    Gpu,
    bound_pod,
    gpu_node,
    node,
    one,
    pod,
    run,
    runs,
    with_pods,
)

DEFAULTS = Policy(own_load=False)
UPDATED_AT = NOW - timedelta(seconds=10)  # node(), gpu_node(): sampled 10 s before NOW
MS = timedelta(milliseconds=1)
INF = math.inf

# Pod timelines as `bound_pod` ages (seconds before NOW; the node was sampled at 10). The
# builder's default: bound 5 s ago, no `status.startTime` yet.
ADMITTED_AFTER_SAMPLE: dict[str, Any] = {"admitted_age_s": 4.0}
ADMITTED_IN_SAMPLED_SECOND: dict[str, Any] = {"admitted_age_s": 10.0}
# Admitted before the sample (the data shows its GPUs allocated), running for 15 s (< 60 s).
LOAD_PENDING: dict[str, Any] = {"bound_age_s": 25.0, "admitted_age_s": 20.0, "running_age_s": 15.0}
# Running long enough before the sample for the agent's utilization to show it.
RELEASED: dict[str, Any] = {"bound_age_s": 120.0, "admitted_age_s": 110.0, "running_age_s": 100.0}


def _counted(
    pods: Sequence[BoundPod], *, now: datetime = NOW, policy: Policy = DEFAULTS
) -> InFlight | None:
    return count_inflight(
        pods,
        UPDATED_AT,
        now,
        policy.inflight_max_s,
        policy.inflight_load_delay_s,
        round(policy.inflight_gpu_load * 10_000),
    )


# ----------------------------------------------------------------------------- count_inflight

# (ref, allocation pending, load pending, load per GPU in basis points) per counted pod, then
# allocation GPUs, load GPUs, load GPU-equivalents (bp), memory MiB, left_s, since_s.
Summary = tuple[list[tuple[str, bool, bool, int]], int, int, int, int, float, float]


def _summary(inflight: InFlight | None) -> Summary | None:
    if inflight is None:
        return None
    return (
        [(p.ref, p.allocation_pending, p.load_pending, p.load_bp) for p in inflight.pods],
        inflight.allocation_gpus,
        inflight.load_gpus,
        inflight.load_bp,
        inflight.memory_mib,
        inflight.left_s,
        inflight.since_s,
    )


P = "default/inflight"
COUNT_CASES = [
    pytest.param(
        [bound_pod(gpus=2)], ([(P, True, True, 10_000)], 2, 2, 20_000, 0, 595.0, INF),
        id="no-start-time-yet-allocation-and-load-pending",
    ),
    pytest.param(
        [bound_pod(**ADMITTED_AFTER_SAMPLE)],
        ([(P, True, True, 10_000)], 1, 1, 10_000, 0, 595.0, INF),
        id="admitted-after-the-sample-allocation-pending",
    ),
    pytest.param(
        [bound_pod(**ADMITTED_IN_SAMPLED_SECOND)],
        ([(P, True, True, 10_000)], 1, 1, 10_000, 0, 595.0, INF),
        id="admitted-in-the-sampled-second-counts-as-pending",
    ),
    pytest.param(
        [bound_pod(admitted_age_s=11.0)], ([(P, False, True, 10_000)], 0, 1, 10_000, 0, 595.0, INF),
        id="admitted-before-the-sample-allocation-released-load-pending-until-running",
    ),
    pytest.param(
        [bound_pod(**LOAD_PENDING)], ([(P, False, True, 10_000)], 0, 1, 10_000, 0, 575.0, INF),
        id="running-for-less-than-the-load-delay-load-pending",
    ),
    pytest.param(
        # running since NOW-70: the load shows from NOW-10 on, the very moment sampled.
        [bound_pod(bound_age_s=80.0, admitted_age_s=75.0, running_age_s=70.0)], None,
        id="running-exactly-the-load-delay-before-the-sample-released",
    ),
    pytest.param(
        [bound_pod(bound_age_s=80.0, admitted_age_s=75.0, running_age_s=69.0)],
        ([(P, False, True, 10_000)], 0, 1, 10_000, 0, 520.0, INF),
        id="running-a-second-short-of-the-load-delay-pending",
    ),
    pytest.param([bound_pod(**RELEASED)], None, id="released-pods-do-not-count"),
    pytest.param(
        [bound_pod(bound_age_s=595.0)], ([(P, True, True, 10_000)], 1, 1, 10_000, 0, 5.0, INF),
        id="time-bound-ahead",
    ),
    pytest.param(
        [bound_pod(bound_age_s=600.0)], ([], 0, 0, 0, 0, INF, 0.0),
        id="time-bound-reached-at-inflight-max-s-whatever-the-data",
    ),
    pytest.param(
        [bound_pod(bound_age_s=700.0)], ([], 0, 0, 0, 0, INF, 100.0),
        id="time-bound-passed-dates-the-change",
    ),
    pytest.param(
        [bound_pod(bound_age_s=None)], ([(P, True, True, 10_000)], 1, 1, 10_000, 0, INF, INF),
        id="unknown-bind-time-no-time-bound",
    ),
    pytest.param(
        [bound_pod(bound_age_s=9.0, provisional=True)],
        ([(P, True, True, 10_000)], 1, 1, 10_000, 0, 1.0, INF),
        id="provisional-counts-for-10s",
    ),
    pytest.param(
        [bound_pod(bound_age_s=10.0, provisional=True)], ([], 0, 0, 0, 0, INF, 0.0),
        id="provisional-ends-after-10s",
    ),
    pytest.param(
        # What the pod watch keeps of a pod kube-scheduler nominated and has not bound.
        [msgspec.structs.replace(bound_pod(gpus=4, bound_age_s=None), nominated=True)],
        ([(P, True, True, 10_000)], 4, 4, 40_000, 0, INF, INF),
        id="nominated-unbound-counts-with-no-time-bound",
    ),
    pytest.param([bound_pod(gpus=0)], None, id="pod-without-gpus-ignored"),
    pytest.param(
        [bound_pod(gpus=2, gpu_load=0.25)], ([(P, True, True, 2500)], 2, 2, 5000, 0, 595.0, INF),
        id="expected-gpu-load-hint-instead-of-the-policy-default",
    ),
    pytest.param(
        [bound_pod("a", gpus=2, memory_mib=1000), bound_pod("b", gpus=3)],
        (
            [("default/a", True, True, 10_000), ("default/b", True, True, 10_000)],
            5, 5, 50_000, 2000, 595.0, INF,
        ),
        id="memory-only-of-pods-that-declared-min-gpu-memory-mib",
    ),
    pytest.param(
        # The kubelet's clocks say it ran before it was admitted: allocation pending only.
        [bound_pod(admitted_age_s=5.0, running_age_s=100.0, memory_mib=1000)],
        ([(P, True, False, 10_000)], 1, 0, 0, 0, 595.0, INF),
        id="allocation-pending-alone-adds-no-load-or-memory",
    ),
    pytest.param(
        [
            bound_pod("late", bound_age_s=590.0),
            bound_pod("early", bound_age_s=595.0),
            bound_pod("gone-long", bound_age_s=620.0),
            bound_pod("gone", bound_age_s=605.0),
        ],
        ([("default/early", True, True, 10_000), ("default/late", True, True, 10_000)],
         2, 2, 20_000, 0, 5.0, 5.0),
        id="earliest-bound-ahead-latest-behind-pods-in-ref-order",
    ),
]  # fmt: skip


@pytest.mark.parametrize(("pods", "expected"), COUNT_CASES)
def test_count_inflight(pods: list[BoundPod], expected: Summary | None) -> None:
    assert _summary(_counted(pods)) == expected


def test_count_inflight_reads_the_policy_numbers() -> None:
    policy = Policy(
        own_load=False, inflight_max_s=30.0, inflight_load_delay_s=0.0, inflight_gpu_load=0.5
    )
    pods = [bound_pod("a", bound_age_s=20.0), bound_pod("b", **LOAD_PENDING)]
    # b: bound 25 s ago, running before the sample, no load delay: released; a: 10 s left.
    expected = ([("default/a", True, True, 5000)], 1, 1, 5000, 0, 10.0, INF)
    assert _summary(_counted(pods, policy=policy)) == expected


def test_shared_counts_count_a_nodes_pods_once_per_distinct_numbers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A node judged again for every active class counts its pods once for all the classes
    whose policies count them alike, and each class's verdict is the one it gets alone."""
    calls: list[tuple[Any, ...]] = []

    def counting(*args: Any) -> InFlight | None:
        calls.append(args)
        return count_inflight(*args)

    monkeypatch.setattr(inflight, "count_inflight", counting)
    pods = (bound_pod("a"), bound_pod("b", **LOAD_PENDING))
    the_node = msgspec.structs.replace(node("n"), pods=pods)
    shared = SharedCounts(pods, NOW)
    policies = [DEFAULTS, Policy(own_load=True), Policy(own_load=False, inflight_gpu_load=0.5)]
    asked = [pod(gpus=1), pod(gpus=2), pod(gpus=1, max_utilization="0.50")]
    for policy in policies:
        for the_pod in asked:
            c = PodClass.of(the_pod, policy)
            assert judge_node(the_node, NOW, c, shared) == judge_node(the_node, NOW, c)
    assert len(calls) == len(policies)


def test_with_pods_changes_the_pods_alone() -> None:
    original = records.NodeInput(**{f.name: object() for f in msgspec.structs.fields(NodeInput)})
    pods = (bound_pod("a"),)
    changed = records.with_pods(original, pods)
    assert changed.pods is pods
    for f in msgspec.structs.fields(NodeInput):
        if f.name != "pods":
            assert getattr(changed, f.name) is getattr(original, f.name), f.name


# ----------------------------------------------------------------------------- node-level data


def _judged(
    the_node: NodeInput, the_pod: PodInput | None = None, policy: Policy | None = None
) -> tuple[bool, str | None, float | None, int | None]:
    v = one(the_node, the_pod, policy)
    return v.passed, v.reason, v.utilization_judged, v.memory_largest_free_judged_mib


HALF_BUSY = node("n", utilization=0.50, largest_free_mib=80_000)  # 8 GPUs
NEEDS_60G = pod(min_memory_mib="60000")
NODE_LEVEL_CASES = [
    pytest.param(HALF_BUSY, (), None, (True, None, None, None), id="no-pods"),
    pytest.param(
        HALF_BUSY, [bound_pod(gpus=3)], None, (True, None, 0.875, None),
        id="load-of-3-gpus-spread-over-8-stays-below-the-limit",
    ),
    pytest.param(
        HALF_BUSY, [bound_pod("a", gpus=3), bound_pod("b", gpus=1, **LOAD_PENDING)], None,
        (False, "gpu utilization above 0.90", 1.0, None),
        id="load-of-4-gpus-pushes-the-node-over-the-limit-with-the-uniform-reason",
    ),
    pytest.param(
        HALF_BUSY, [bound_pod(gpus=4, gpu_load=0.25)], None, (True, None, 0.625, None),
        id="expected-gpu-load-hint-scales-the-load",
    ),
    pytest.param(
        HALF_BUSY, [bound_pod(gpus=8, **RELEASED)], None, (True, None, None, None),
        id="released-pods-leave-the-published-mean",
    ),
    pytest.param(
        HALF_BUSY, [bound_pod(gpus=4, bound_age_s=600.0)], None, (True, None, None, None),
        id="past-the-time-bound-the-pod-no-longer-counts",
    ),
    pytest.param(
        HALF_BUSY, [bound_pod(gpus=1, gpu_load=0.0, memory_mib=30_000)], NEEDS_60G,
        (False, "gpu memory below 60000MiB free on one gpu", None, 50_000),
        id="declared-memory-of-a-load-pending-pod-fails-the-memory-hint",
    ),
    pytest.param(
        HALF_BUSY, [bound_pod(gpus=1, gpu_load=0.0, memory_mib=10_000)], NEEDS_60G,
        (True, None, None, 70_000), id="declared-memory-that-leaves-enough",
    ),
    pytest.param(
        HALF_BUSY, [bound_pod(gpus=1, gpu_load=0.0)], NEEDS_60G, (True, None, None, None),
        id="no-memory-counted-for-a-pod-that-declared-none",
    ),
    pytest.param(
        HALF_BUSY, [bound_pod(gpus=1, memory_mib=70_000)], None, (True, None, 0.625, None),
        id="memory-is-judged-only-for-a-pod-asking-for-it",
    ),
]  # fmt: skip


@pytest.mark.parametrize(("the_node", "pods", "the_pod", "expected"), NODE_LEVEL_CASES)
def test_inflight_pods_on_node_level_data(
    the_node: NodeInput,
    pods: Sequence[BoundPod],
    the_pod: PodInput | None,
    expected: tuple[bool, str | None, float | None, int | None],
) -> None:
    assert _judged(with_pods(the_node, *pods), the_pod) == expected


def test_inflight_utilization_fails_with_the_same_reason_as_published_utilization() -> None:
    published = one(node("hot", utilization=0.95))
    inflight = one(with_pods(node("busy", utilization=0.80), bound_pod(gpus=2)))
    assert not published.passed
    assert not inflight.passed
    assert inflight.reason == published.reason == "gpu utilization above 0.90"
    assert inflight.unresolvable is published.unresolvable is False


# ----------------------------------------------------------------------------- per-GPU data

IDLE_FREE = Gpu(utilization=0.0, allocated=False)
SATURATED_FREE = Gpu(utilization=0.97, allocated=False)
ALLOCATED = Gpu(utilization=0.0, allocated=True)
IDLE = Gpu(utilization=0.0)  # allocations unknown
SATURATED = Gpu(utilization=0.97)
LADDER_FREE = [Gpu(utilization=u, allocated=False) for u in (0.3, 0.0, 0.1, 0.2)]
LADDER = [Gpu(utilization=u) for u in (0.3, 0.0, 0.1, 0.2)]

_CODES: dict[GpuStatus, str] = {
    "candidate": "c",
    "in-flight": "i",
    "utilization": "u",
    "allocated": "a",
    "not-offered": "o",
    "unmeasured": "m",
    "temperature": "t",
    "memory": "M",
}


def _gpu_findings(v: NodeVerdict) -> tuple[bool, str | None, str, tuple[int, ...], Any, Any]:
    """passed, reason, a letter per GPU (`_CODES`), the counted GPUs, the pool, the fit (bp)."""
    check = v.gpus
    assert check is not None
    codes = "".join(_CODES[s] for s in check.status)
    return v.passed, v.reason, codes, check.counted, check.pool, check.fit_bp


PER_GPU_CASES = [
    # Allocations published: a blind device plugin draws k of the pool.
    pytest.param(
        LADDER_FREE, [bound_pod()], 1, (True, None, "cicc", (0, 2, 3), 3, 10_000),
        id="allocation-pending-pod-takes-the-best-candidate-and-leaves-the-pool",
    ),
    pytest.param(
        runs((4, IDLE_FREE)), [bound_pod(gpus=3)], 2,
        (False, "fewer than 2 unallocated gpus", "iiic", (), 1, 0),
        id="pool-smaller-than-k",
    ),
    pytest.param(
        runs((7, IDLE_FREE), (1, SATURATED_FREE)), [], 1,
        (True, None, "cccccccu", tuple(range(7)), 8, 8750),
        id="7-idle-1-saturated-1-gpu-fit-8750-passes",
    ),
    pytest.param(
        runs((4, IDLE_FREE), (4, SATURATED_FREE)), [], 1,
        (False, "gpu fit probability below 0.75", "ccccuuuu", (0, 1, 2, 3), 8, 5000),
        id="4-idle-4-saturated-fit-5000-rejected",
    ),
    pytest.param(
        runs((7, IDLE_FREE), (1, SATURATED_FREE)), [], 2,
        (True, None, "cccccccu", tuple(range(7)), 8, 7500),
        id="2-gpus-of-7-idle-1-saturated-fit-7500-passes-at-the-threshold",
    ),
    pytest.param(
        runs((5, IDLE_FREE), (1, SATURATED_FREE)), [bound_pod(gpus=3)], 1,
        (False, "gpu fit probability below 0.75", "iiiccu", (3, 4), 3, 6666),
        id="in-flight-pod-lowers-the-fit-below-the-threshold",
    ),
    pytest.param(
        runs((5, IDLE_FREE), (1, SATURATED_FREE)), [bound_pod(gpus=2)], 1,
        (True, None, "iicccu", (2, 3, 4), 4, 7500),
        id="in-flight-pod-leaves-the-fit-at-the-threshold",
    ),
    pytest.param(
        runs((1, ALLOCATED), (7, IDLE_FREE)), [bound_pod(**LOAD_PENDING)], 1,
        (True, None, "accccccc", tuple(range(1, 8)), 7, 10_000),
        id="allocation-shown-in-the-data-the-pod-holds-no-further-gpu",
    ),
    pytest.param(
        runs((2, IDLE_FREE), (2, SATURATED_FREE)), [bound_pod(gpus=3)], 1,
        (False, "no gpu at or below utilization 0.90", "iiiu", (), 1, 0),
        id="more-in-flight-gpus-than-candidates-take-the-pool-in-index-order",
    ),
    pytest.param(
        runs((2, IDLE_FREE), (2, SATURATED_FREE)), [bound_pod(gpus=4)], 1,
        (False, "no unallocated gpu", "iiii", (), 0, 0),
        id="in-flight-pods-take-the-whole-pool",
    ),
    # Allocations unknown: the best k candidates, less those in-flight pods hold.
    pytest.param(
        LADDER, [bound_pod(**LOAD_PENDING)], 2, (True, None, "cicc", (2, 3), None, None),
        id="no-allocations-load-pending-pod-takes-the-best-candidate",
    ),
    pytest.param(
        LADDER, [bound_pod(admitted_age_s=5.0, running_age_s=100.0)], 2,
        (True, None, "cccc", (1, 2), None, None),
        id="no-allocations-a-pod-without-pending-load-holds-nothing",
    ),
    pytest.param(
        runs((4, IDLE), (4, SATURATED)), [bound_pod(gpus=3, **LOAD_PENDING)], 2,
        (False, "fewer than 2 gpus at or below utilization 0.90", "iiicuuuu", (), None, None),
        id="no-allocations-fewer-candidates-left-than-k",
    ),
    pytest.param(
        runs((4, IDLE), (4, SATURATED)), [bound_pod(gpus=2, **RELEASED)], 4,
        (True, None, "ccccuuuu", (0, 1, 2, 3), None, None),
        id="no-allocations-released-pod-holds-nothing",
    ),
]  # fmt: skip


@pytest.mark.parametrize(("table", "pods", "k", "expected"), PER_GPU_CASES)
def test_inflight_pods_under_the_k_gpu_rule(
    table: Sequence[Gpu], pods: Sequence[BoundPod], k: int, expected: tuple[Any, ...]
) -> None:
    verdict = one(with_pods(gpu_node("node-a", table), *pods), pod(gpus=k))
    assert _gpu_findings(verdict) == expected
    check = verdict.gpus
    assert check is not None
    assert check.inflight == check.status.count("in-flight")


SCORE_CASES = [
    pytest.param(
        node("n", utilization=0.30), [bound_pod(gpus=2, gpu_load=0.5)], 1,
        id="node-level-in-flight-load",
    ),
    pytest.param(gpu_node("n", LADDER), [bound_pod(**LOAD_PENDING)], 1, id="per-gpu-best-taken"),
    pytest.param(
        gpu_node("n", runs((8, IDLE_FREE))), [], 1, id="saturated-gpu-in-the-pool",
    ),
]  # fmt: skip


@pytest.mark.parametrize(("the_node", "pods", "k"), SCORE_CASES)
def test_inflight_pods_lower_the_score(
    the_node: NodeInput, pods: Sequence[BoundPod], k: int
) -> None:
    if pods:
        without, with_them = the_node, with_pods(the_node, *pods)
    else:  # the same node with one GPU saturated, in the pool a blind plugin draws from
        without = the_node
        with_them = gpu_node("n", runs((7, IDLE_FREE), (1, SATURATED_FREE)))
    before, after = one(without, pod(gpus=k)), one(with_them, pod(gpus=k))
    assert before.passed
    assert after.passed
    assert after.score < before.score


def test_a_pod_without_gpus_on_a_per_gpu_node_is_judged_on_the_node_level() -> None:
    """The k-GPU rule applies to a pod asking GPUs; others read the node mean, with the load."""
    the_node = with_pods(gpu_node("n", runs((8, Gpu(utilization=0.5)))), bound_pod(gpus=4))
    verdict = one(the_node, pod(gpus=0))
    assert verdict.gpus is None
    assert (verdict.passed, verdict.reason, verdict.utilization_judged) == (
        False,
        "gpu utilization above 0.90",
        1.0,
    )


def test_pods_do_not_count_on_stale_data() -> None:
    """Stale data is judged by the missing-data policy; nothing is added to what no rule reads."""
    stale = with_pods(node("n", age_s=999, utilization=0.5), bound_pod(gpus=8))
    verdict = one(stale, policy=STRICT)
    assert (verdict.data_status, verdict.inflight) == ("stale", None)


# ----------------------------------------------------------------------------- explain


def test_explain_shows_the_inflight_pods_and_the_pool() -> None:
    per_gpu = with_pods(
        gpu_node("gpus", runs((5, IDLE_FREE), (1, SATURATED_FREE))),
        bound_pod("job-1", gpus=2, gpu_load=0.5),
    )
    level = with_pods(
        node("level", utilization=0.40), bound_pod("job-2", gpus=4, **LOAD_PENDING, memory_mib=5)
    )
    the_pod = pod(gpus=1)
    evaluation = run([per_gpu, level], the_pod)
    document = explain(evaluation, the_pod, NOW, DEFAULTS)
    gpus_node, level_node = document["nodes"]
    bound_at = "2026-11-30T13:59:55Z"
    assert gpus_node["inflight"] == {
        "pods": [
            {
                "pod": "default/job-1",
                "gpus": 2,
                "allocation_pending": True,
                "load_pending": True,
                "gpu_load": 0.5,
                "gpu_load_source": "hint",
                "bound_at": bound_at,
                "provisional": False,
                "nominated": False,
            }
        ],
        "allocation_gpus": 2,
        "load_gpus": 2,
        "load_gpu_equivalents": 1.0,
        "memory_mib": 0,
        "utilization_judged": None,  # judged per GPU: the mean is not read
        "memory_largest_free_judged_mib": None,
    }
    figures = {k: gpus_node["gpus"][k] for k in ("needed", "candidates", "inflight", "pool")}
    assert figures == {"needed": 1, "candidates": 3, "inflight": 2, "pool": 4}
    assert gpus_node["gpus"]["fit_probability"] == 0.75
    assert [row["status"] for row in gpus_node["gpus"]["table"]][:2] == ["in-flight"] * 2
    assert gpus_node["gpus"]["table"][0]["why_not"] == "taken by an in-flight pod"
    assert level_node["inflight"]["utilization_judged"] == 0.9
    assert level_node["inflight"]["pods"][0]["load_pending"] is True
    assert level_node["inflight"]["pods"][0]["allocation_pending"] is False
    utilization_rule = next(r for r in level_node["rules"] if r["rule"] == "utilization")
    assert utilization_rule["value"] == 0.9  # the value judged, not the one published

    text = render_text(document)
    assert "  in-flight: 1 pod, 2 gpus not yet allocated in the data, 2 gpus of load" in text
    assert re.search(
        r"    default/job-1: 2 gpus?, allocation and load pending, load 0.50 \(hint\), "
        rf"bound {bound_at}",
        text,
    )
    assert ", 2 held by in-flight pods, pool 4, fit probability 0.75 (allocations checked)" in text
    assert "    utilization judged 0.90" in text
    assert re.search(r"default/job-2: 4 gpus?, load pending, load 1.00 \(policy\)", text)


def test_explain_without_inflight_pods_shows_none() -> None:
    evaluation = run([node("n")])
    document = explain(evaluation, pod(), NOW, DEFAULTS)
    assert document["nodes"][0]["inflight"] is None
    assert "in-flight" not in render_text(document)


# ----------------------------------------------------------------------------- time bounds


def _outcome(evaluation: Evaluation) -> list[tuple[bool, str | None, int]]:
    return [(v.passed, v.reason, v.score) for v in evaluation.verdicts]


BOUND_CASES = [
    pytest.param(
        with_pods(node("n", utilization=0.5), bound_pod(gpus=4, bound_age_s=595.0)), 1,
        timedelta(seconds=5), id="node-level-load-ends-at-inflight-max-s",
    ),
    pytest.param(
        with_pods(node("n", utilization=0.5), bound_pod(gpus=4, bound_age_s=2, provisional=True)),
        1, timedelta(seconds=8), id="a-proposal-ends-after-10s",
    ),
    pytest.param(
        with_pods(
            gpu_node("n", runs((5, IDLE_FREE), (1, SATURATED_FREE))),
            bound_pod("a", gpus=3, bound_age_s=590.0), bound_pod("b", bound_age_s=30.0),
        ),
        1, timedelta(seconds=10), id="per-gpu-fit-recovers-when-the-first-pod-ends",
    ),
]  # fmt: skip


@pytest.mark.parametrize(("the_node", "k", "left"), BOUND_CASES)
def test_a_verdict_changes_exactly_at_its_inflight_time_bound(
    the_node: NodeInput, k: int, left: timedelta
) -> None:
    the_pod = pod(gpus=k)
    now = run([the_node], the_pod)
    assert now.valid_until == NOW + left - MS
    just_before = run([the_node], the_pod, now=NOW + left - MS)
    at_the_bound = run([the_node], the_pod, now=NOW + left)
    assert _outcome(just_before) == _outcome(now)
    assert not now.verdicts[0].passed
    assert at_the_bound.verdicts[0].passed


def test_the_window_starts_where_an_ended_pod_still_counted() -> None:
    """Going back in time, the verdict changes where a pod past its bound counted again."""
    the_node = with_pods(node("n", utilization=0.5), bound_pod(gpus=4, bound_age_s=605.0))
    c = PodClass.of(pod(), DEFAULTS)
    now_ts = NOW.timestamp()
    start, end = validity_window(judge_node(the_node, NOW, c), now_ts, c)
    assert start == now_ts - 5 + 0.001
    assert end == now_ts + 170 - 0.001  # the data's own stale boundary
    assert run([the_node]).verdicts[0].passed
    before = run([the_node], now=NOW - timedelta(seconds=5) - MS)
    assert before.verdicts[0].reason == "gpu utilization above 0.90"


# ----------------------------------------------------------------------------- the node store

NAMES = ("n0", "n1", "n2", "n3")
POLICIES = (
    Policy(own_load=False),
    Policy(own_load=False, missing_data="strict"),
    Policy(
        inflight_max_s=30.0,
        inflight_load_delay_s=0.0,
        inflight_gpu_load=0.5,
        min_gpu_fit_probability=0.5,
    ),
)
ASKED = (
    pod(gpus=1),
    pod(gpus=2),
    pod(gpus=4, min_memory_mib="40000"),
    pod(gpus=0),
    pod(gpus=1, max_utilization="0.50", expected_gpu_load="0.3"),
    pod(gpus=2, preference="A100,*", fallback="0.40"),
    pod(gpus=1, expected_gpu_load="lots"),  # a hint error: rejected everywhere
)

gpu_spec = st.builds(
    Gpu,
    utilization=st.sampled_from([None, 0.0, 0.0, 0.3, 0.72, 0.97]),
    free_mib=st.sampled_from([None, 20_000, 80_000]),
    temperature_c=st.sampled_from([None, 50, 90]),
    allocated=st.sampled_from([None, False, False, True]),
    lost=st.sampled_from([False] * 7 + [True]),
)
# Node data mostly fresh (stale after 180 s; skewed beyond 30 s ahead), so that pods count.
ages = st.one_of(
    st.sampled_from([5.0, 10.0, 10.0, 10.0, 100.0, 179.5, -40.0, 400.0]), st.floats(-40, 200)
)
node_spec = st.one_of(
    st.tuples(st.just("per-gpu"), st.lists(gpu_spec, min_size=1, max_size=8), ages),
    st.tuples(
        st.just("node-level"),
        st.fixed_dictionaries(
            {
                "age_s": ages,
                "utilization": st.sampled_from([None, 0.1, 0.5, 0.8, 0.95]),
                "largest_free_mib": st.sampled_from([None, 30_000, 80_000]),
                "temperature_c": st.sampled_from([None, 50, 90]),
            }
        ),
        st.just(0.0),
    ),
)
# Around the boundaries of a node sampled 10 s ago: provisional pods end 10 s after they were
# proposed, bound ones inflight_max_s (600 s; 30 s in one policy) after binding.
bound_ages = st.one_of(
    st.sampled_from([None, 0.0, 5.0, 9.5, 25.0, 29.5, 590.0, 595.0, 599.5, 600.0, 700.0]),
    st.floats(-20, 800),
)
# What the kubelet reported, against the sample 10 s ago and the 60 s load delay (0 in one
# policy). Mostly in flight: a pod that no longer counts changes no verdict.
timelines = st.one_of(
    st.sampled_from(
        [
            (None, None),  # not admitted yet
            (4.0, None),  # admitted after the sample
            (10.0, 9.0),  # admitted in the sampled second
            (20.0, 15.0),  # allocation shown, load pending
            (80.0, 69.5),  # load half a second short of showing
            (80.0, 70.0),  # load shows at the sample
            (300.0, 290.0),  # long running
        ]
    ),
    st.tuples(st.one_of(st.none(), st.floats(-20, 400)), st.one_of(st.none(), st.floats(-20, 400))),
)
bound_pod_lists = st.lists(
    st.builds(
        lambda name, gpus, bound_age_s, timeline, gpu_load, memory_mib, provisional: bound_pod(
            name,
            gpus=gpus,
            bound_age_s=bound_age_s,
            admitted_age_s=timeline[0],
            running_age_s=timeline[1],
            gpu_load=gpu_load,
            memory_mib=memory_mib,
            provisional=provisional,
        ),
        name=st.sampled_from(["p0", "p1", "p2", "p3", "p4"]),
        gpus=st.integers(0, 3),
        bound_age_s=bound_ages,
        timeline=timelines,
        gpu_load=st.one_of(st.none(), st.sampled_from([0.0, 0.25, 1.0])),
        memory_mib=st.one_of(st.none(), st.sampled_from([10_000, 40_000])),
        provisional=st.booleans(),
    ),
    min_size=1,
    max_size=3,
    unique_by=lambda p: p.name,
)
no_pods: list[BoundPod] = []  # the node's pods all gone
bound_pods = st.one_of(bound_pod_lists, st.just(no_pods))
name_lists = st.one_of(
    st.just(NAMES), st.lists(st.sampled_from([*NAMES, "ghost"]), max_size=6).map(tuple)
)
asks = st.tuples(
    st.just("ask"),
    st.sampled_from(["filter", "prioritize"]),
    st.integers(0, len(ASKED) - 1),
    name_lists,
)
clock_steps = st.tuples(
    st.just("clock"),
    # Mostly short steps: across a pod's time bound, not past the data's stale one.
    st.one_of(st.sampled_from([0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 60.0, -5.0]), st.floats(-50, 700)),
)
# To the next end of a pod's time bound (or a millisecond either side): where a kept verdict
# must give way to a new one.
to_bound = st.tuples(st.just("to-bound"), st.sampled_from([-0.001, 0.0, 0.001]))
changes = st.one_of(
    clock_steps,
    to_bound,
    to_bound,
    st.tuples(st.just("put"), st.sampled_from(NAMES), node_spec),
    st.tuples(st.just("pods"), st.sampled_from(NAMES), bound_pods),
    st.tuples(
        st.just("replace_pods"),
        st.dictionaries(st.sampled_from(NAMES), bound_pods, max_size=len(NAMES)),
    ),
    st.tuples(st.just("delete"), st.sampled_from(NAMES)),
    st.tuples(st.just("refresh")),
)
# Each change, then a request (most sequences ask after each change, as the scheduler does).
store_steps = st.lists(st.tuples(changes, asks), min_size=1, max_size=20).map(
    lambda pairs: [step for pair in pairs for step in pair]
)


def _agent_node(name: str, spec: tuple[str, Any, float]) -> NodeInput:
    kind, data, age_s = spec
    if kind == "per-gpu":
        return gpu_node(name, data, age_s=age_s)
    return node(name, **data)


def _on(name: str, pods: Sequence[BoundPod]) -> tuple[BoundPod, ...]:
    return tuple(msgspec.structs.replace(p, node=name) for p in pods)


def _encoded(value: object) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


def _reference(verb: str, evaluation: Evaluation, names: Sequence[str]) -> bytes:
    """The reply a fresh evaluation gives, encoded independently of the scorer's encoders."""
    if verb == "prioritize":
        return json.dumps(
            [{"Host": host, "Score": score} for host, score in evaluation.scores()],
            separators=(",", ":"),
        ).encode()
    passed = set(evaluation.passed_names())
    return (
        b'{"Nodes":null,"NodeNames":' + _encoded([n for n in names if n in passed])
        + b',"FailedNodes":' + _encoded(evaluation.failed())
        + b',"FailedAndUnresolvableNodes":' + _encoded(evaluation.unresolvable())
        + b',"Error":""}'
    )  # fmt: skip


class _Clock:
    def __init__(self) -> None:
        self.now = NOW

    def __call__(self) -> datetime:
        return self.now


def _drive(steps: Sequence[tuple[Any, ...]], policy: Policy) -> list[bytes]:
    """Apply `steps` to a names-only node store; check each reply against a fresh evaluation of
    the same nodes and pods (kept apart, in `nodes` and `pods`) at the same moment."""
    clock = _Clock()
    store = NodeStore(clock=clock)
    store.replace([])
    classes = [PodClass.of(p, policy) for p in ASKED]
    nodes: dict[str, NodeInput] = {}
    pods: dict[str, tuple[BoundPod, ...]] = {}
    replies: list[bytes] = []
    max_s = policy.inflight_max_s
    for action, *args in steps:
        if action == "put":
            nodes[args[0]] = _agent_node(args[0], args[1])
            store.put(nodes[args[0]])
        elif action == "pods":
            pods[args[0]] = _on(args[0], args[1])
            store.set_pods(args[0], pods[args[0]])
        elif action == "replace_pods":
            pods = {name: _on(name, node_pods) for name, node_pods in args[0].items()}
            store.replace_pods(pods)
        elif action == "delete":
            nodes.pop(args[0], None)
            store.delete(args[0])
        elif action == "refresh":
            store.refresh_expired()
        elif action == "clock":
            clock.now += timedelta(seconds=args[0])
        elif action == "to-bound":
            ends = [
                p.bound_at + timedelta(seconds=PROVISIONAL_MAX_S if p.provisional else max_s)
                for node_pods in pods.values()
                for p in node_pods
                if p.bound_at is not None
            ]
            later = [end for end in ends if end > clock.now]
            if later:
                clock.now = min(later) + timedelta(seconds=args[0])
        else:
            verb, index, names = args
            judgement = store.judge(
                classes[index], names, clock.now, list_key=_encoded(list(names))
            )
            if verb == "prioritize":
                got = judgement.prioritize_reply()
            else:  # as the app encodes a names-only filter reply
                failed, unresolvable = judgement.rejections()
                passed = [n for n, ok in zip(names, judgement.passed_mask(), strict=True) if ok]
                got = wire.encode_names_filter_reply(
                    passed, failed=failed, unresolvable=unresolvable
                )
            inputs = [
                msgspec.structs.replace(
                    nodes.get(n) or NodeInput(n, {}, None), pods=pods.get(n, ())
                )
                for n in names
            ]
            want = _reference(verb, evaluate(ASKED[index], inputs, clock.now, policy), names)
            assert got == want
            # A kept verdict's window ends where a fresh one's does: at the next moment time
            # alone changes it (a pod's time bound among them), never later.
            now_ts = clock.now.timestamp()
            for entry, fresh in zip(judgement.entries, inputs, strict=True):
                c = classes[index]
                until_ts = validity_window(judge_node(fresh, clock.now, c), now_ts, c)[1]
                assert entry.until_ts == pytest.approx(until_ts, abs=1e-6, rel=0)
            replies.append(got)
    return replies


@settings(max_examples=200, deadline=None)
@given(
    initial_nodes=st.lists(node_spec, min_size=len(NAMES), max_size=len(NAMES)),
    initial_pods=st.lists(bound_pod_lists, min_size=len(NAMES), max_size=len(NAMES)),
    # Each node's data and its pods arrive in any order, and requests may come between.
    order=st.permutations([*(("put", i) for i in range(4)), *(("pods", i) for i in range(4))]),
    steps=store_steps,
    policy=st.sampled_from(POLICIES),
)
def test_node_store_replies_with_pods_match_a_fresh_evaluation(
    initial_nodes: list[tuple[str, Any, float]],
    initial_pods: list[list[BoundPod]],
    order: list[tuple[str, int]],
    steps: list[tuple[Any, ...]],
    policy: Policy,
) -> None:
    arrivals: list[tuple[Any, ...]] = []
    for action, i in order:
        data = initial_nodes[i] if action == "put" else initial_pods[i]
        arrivals += [(action, NAMES[i], data), ("ask", "prioritize", 0, NAMES)]
    first = _drive([*arrivals, *steps], policy)
    assert _drive([*arrivals, *steps], policy) == first  # replayed: byte-identical replies


def test_pods_set_before_and_after_their_node_give_the_same_replies() -> None:
    the_node = gpu_node("n0", runs((3, IDLE_FREE), (1, SATURATED_FREE)))
    pods = _on("n0", [bound_pod("a"), bound_pod("b", **LOAD_PENDING)])
    c = PodClass.of(pod(gpus=1), DEFAULTS)
    replies = []
    for order in ("pods-first", "node-first", "relist"):
        store = NodeStore(clock=_Clock())
        if order == "pods-first":
            store.set_pods("n0", pods)
            store.replace([the_node])
        elif order == "node-first":
            store.replace([the_node])
            store.judge(c, ["n0"], NOW)  # an active class: judged again when the pods come
            store.set_pods("n0", pods)
        else:
            store.replace([the_node])
            store.replace_pods({"n0": pods})
            store.replace([msgspec.structs.replace(the_node)])  # a LIST: new object, same data
        replies.append(store.judge(c, ["n0"], NOW).prioritize_reply())
        assert store.set_pods("n0", pods) is False  # the same pods again change nothing
    expected = wire.encode_prioritize_reply(
        run([msgspec.structs.replace(the_node, pods=pods)], pod(gpus=1)).scores()
    )
    assert replies == [expected] * 3


def test_an_app_over_the_store_answers_with_the_pods() -> None:
    """The request path end to end: the store's pods are in the reply and in explain."""
    store = NodeStore(clock=_Clock())
    store.replace([node("n0", utilization=0.5), node("n1", utilization=0.5)])
    store.set_pods("n0", _on("n0", [bound_pod(gpus=4)]))
    app = ScorerApp(policy=DEFAULTS, clock=_Clock(), node_store=store)
    doc = {"metadata": {"name": "p", "namespace": "default"}, "spec": {"containers": []}}
    body = json.dumps({"Pod": doc, "Nodes": None, "NodeNames": ["n0", "n1"]}).encode()
    reply = json.loads(app.handle("filter", body).body)
    assert reply["NodeNames"] == ["n1"]
    assert reply["FailedNodes"] == {"n0": "gpu utilization above 0.90"}
    explained = json.loads(app.handle("explain", body).body)
    assert [n["inflight"] is not None for n in explained["nodes"]] == [True, False]
