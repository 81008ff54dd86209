"""The pod's own load: the estimate (hint, learned, default), and how filter and score count it."""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from exporter_scheduler.core.inflight import BoundPod
from exporter_scheduler.core.judge import evaluate
from exporter_scheduler.core.ownload import (
    Learned,
    UsageSample,
    learn,
    own_load,
    quantile_nearest_rank,
)
from exporter_scheduler.core.podclass import PodClass, pod_class_key
from exporter_scheduler.core.policy import Policy
from exporter_scheduler.core.records import NodeInput, PodInput
from exporter_scheduler.serving.app import ScorerApp
from exporter_scheduler.serving.explain import explain, render_text, with_learned_basis
from exporter_scheduler.serving.nodestore import NodeStore
from gpu_contract.schema import Field
from tests.scorer._http_helpers import args_body
from tests.scorer._http_helpers import pod as http_pod
from tests.scorer.scoring_builders import (
    NOW,
    PREFIX,
    Gpu,
    bound_pod,
    gpu_node,
    node,
    pod,
    run,
    runs,
    with_pods,
)

POLICY = Policy(own_load_gpu_load=0.30)  # own load counted, 0.30 per GPU by default
OFF = Policy(own_load=False)


def _sample(
    pod_name: str, util: float | None, mem: int | None = None, age_s: float = 10.0
) -> UsageSample:
    return UsageSample(
        pod_name,
        0,
        NOW - timedelta(seconds=age_s),
        None if util is None else round(util * 10_000),
        mem,
    )


# ----------------------------------------------------------------------------- learn


LEARN_CASES = [
    pytest.param([], None, id="no-samples-nothing-learned"),
    pytest.param([_sample("a", 0.5)], None, id="one-sample-below-the-floor"),
    pytest.param(
        [_sample("a", 0.42), _sample("b", 0.47)],
        Learned(5000, None, 2, 2),
        id="two-samples-high-quantile-rounded-up-to-0.05",
    ),
    pytest.param(
        [_sample(f"p{i}", 0.1 * i) for i in range(10)],
        Learned(8000, None, 10, 10),
        id="p90-of-ten-is-the-ninth-not-the-peak",
    ),
    pytest.param(
        [_sample("a", 0.2, age_s=7200), _sample("b", 0.3), _sample("c", 0.35)],
        Learned(3500, None, 2, 2),
        id="old-samples-age-out",
    ),
    pytest.param(
        [_sample("a", None, 3000), _sample("b", None, 5000)],
        Learned(None, 5120, 2, 2),
        id="memory-alone-rounded-up-to-a-gib",
    ),
    pytest.param(
        [_sample("a", 0.2, age_s=-60), _sample("b", 0.3)],
        None,
        id="a-sample-from-the-future-does-not-count",
    ),
    pytest.param(
        [UsageSample("worker-0", gpu, NOW, 0, 30_000) for gpu in range(8)],
        None,
        id="one-pod-on-eight-gpus-is-one-pod-below-the-floor",
    ),
    pytest.param(
        [
            *(UsageSample("worker-0", gpu, NOW, 9200, None) for gpu in range(4)),
            UsageSample("worker-1", 0, NOW, None, 30_000),
            UsageSample("worker-2", 0, NOW, None, 31_000),
        ],
        Learned(None, 31_744, 2, 2),
        id="each-figure-needs-its-own-pods",
    ),
]


@pytest.mark.parametrize(("samples", "expected"), LEARN_CASES)
def test_learn(samples: list[UsageSample], expected: Learned | None) -> None:
    assert learn(samples, NOW, max_age_s=3600.0, min_pods=2) == expected


@given(st.lists(st.integers(0, 10_000), min_size=1, max_size=50))
def test_learned_figure_is_one_of_the_samples_rounded_up(values: list[int]) -> None:
    samples = [UsageSample(f"p{i}", 0, NOW, value, None) for i, value in enumerate(values)]
    learned = learn(samples, NOW, max_age_s=60.0, min_pods=1)
    assert learned is not None
    assert learned.utilization_bp is not None
    q = quantile_nearest_rank(list(values), 0.9)
    assert q in values
    assert q <= learned.utilization_bp < q + 500 or learned.utilization_bp == 10_000
    assert learned.utilization_bp % 500 == 0


# ----------------------------------------------------------------------------- sources


SOURCE_CASES = [
    pytest.param(None, None, None, (3000, "default", 0, "default"), id="nothing-default"),
    pytest.param(
        None, None, Learned(6500, 8192, 4, 3), (6500, "learned", 8192, "learned"), id="learned"
    ),
    pytest.param(
        0.1, None, Learned(6500, 8192, 4, 3), (1000, "hint", 8192, "learned"), id="hint-wins"
    ),
    pytest.param(
        None, 2048, Learned(6500, None, 4, 3), (6500, "learned", 2048, "hint"), id="mixed"
    ),
]


@pytest.mark.parametrize(("hint_load", "hint_mib", "learned", "expected"), SOURCE_CASES)
def test_sources_in_order(
    hint_load: float | None,
    hint_mib: int | None,
    learned: Learned | None,
    expected: tuple[int, str, int, str],
) -> None:
    load = own_load(hint_load, hint_mib, learned, 0.30, 0)
    assert (
        load.utilization_bp,
        load.utilization_source,
        load.memory_mib,
        load.memory_source,
    ) == expected


# ----------------------------------------------------------------------------- the rules


def _learned(the_pod: PodInput, util: float, mem: int | None = None) -> PodInput:
    return msgspec.structs.replace(the_pod, learned=Learned(round(util * 10_000), mem, 6, 3))


HALF = gpu_node("half", runs((1, Gpu(utilization=0.45))))
IDLE = gpu_node("idle", runs((1, Gpu(utilization=0.0))))
GPU_CASES = [
    pytest.param(HALF, pod(), OFF, True, id="off-judged-by-load-now"),
    pytest.param(HALF, pod(), POLICY, True, id="default-0.30-fits-on-0.45"),
    pytest.param(HALF, _learned(pod(), 0.6), POLICY, False, id="heavy-workload-avoids-half-busy"),
    pytest.param(IDLE, _learned(pod(), 0.6), POLICY, True, id="heavy-workload-takes-idle"),
    pytest.param(HALF, _learned(pod(), 0.2), POLICY, True, id="light-workload-takes-half-busy"),
    pytest.param(
        HALF,
        _learned(pod(expected_gpu_load="0.1"), 0.6),
        POLICY,
        True,
        id="hint-disagreeing-with-siblings-wins",
    ),
    pytest.param(HALF, _learned(pod(), 0.45), POLICY, True, id="exactly-at-the-limit-passes"),
    pytest.param(
        gpu_node("full", runs((1, Gpu(free_mib=4000)))),
        _learned(pod(), 0.1, 8192),
        POLICY,
        False,
        id="memory-its-processes-hold-must-be-free",
    ),
]


@pytest.mark.parametrize(("the_node", "the_pod", "policy", "passed"), GPU_CASES)
def test_per_gpu_rule_counts_the_pods_own_load(
    the_node: NodeInput, the_pod: PodInput, policy: Policy, passed: bool
) -> None:
    verdict = run([the_node], the_pod, policy).verdicts[0]
    assert verdict.passed is passed, verdict.reason


def test_reasons_stay_uniform_texts() -> None:
    verdict = run([HALF], _learned(pod(), 0.6), POLICY).verdicts[0]
    assert verdict.reason == "no gpu at or below utilization 0.90"


def test_score_reads_the_headroom_left_after_the_pods_load() -> None:
    light = run([HALF], _learned(pod(), 0.1), POLICY).verdicts[0]
    heavy = run([HALF], _learned(pod(), 0.4), POLICY).verdicts[0]
    assert light.breakdown is not None
    assert heavy.breakdown is not None
    assert light.breakdown.utilization_headroom_bp == 10_000 - 4500 - 1000
    assert heavy.breakdown.utilization_headroom_bp == 10_000 - 4500 - 4000


NODE_LEVEL_CASES = [
    pytest.param(0.50, 1, 4, 0.6, True, id="one-of-four-gpus-moves-the-mean-by-a-quarter"),
    pytest.param(0.50, 4, 4, 0.6, False, id="all-four-gpus-move-it-in-full"),
    pytest.param(0.50, 1, None, 0.6, False, id="unknown-count-taken-as-one-gpu"),
]


@pytest.mark.parametrize(("util", "k", "count", "own", "passed"), NODE_LEVEL_CASES)
def test_node_level_data_counts_the_load_in_the_mean(
    util: float, k: int, count: int | None, own: float, passed: bool
) -> None:
    the_node = node(
        utilization=util, overrides={Field.GPU_COUNT: None if count is None else str(count)}
    )
    verdict = run([the_node], _learned(pod(gpus=k), own), POLICY).verdicts[0]
    assert verdict.passed is passed, verdict.reason
    assert verdict.utilization_judged is not None


def test_the_learned_figures_make_the_class_not_their_sample_counts() -> None:
    a = _learned(pod(), 0.6)
    b = msgspec.structs.replace(a, learned=Learned(6000, None, 40, 20))
    c = _learned(pod(), 0.65)
    assert pod_class_key(a, POLICY) == pod_class_key(b, POLICY)
    assert pod_class_key(a, POLICY) != pod_class_key(c, POLICY)
    assert pod_class_key(a, OFF) == pod_class_key(c, OFF)


def test_explain_shows_the_estimate_and_its_source() -> None:
    the_pod = _learned(pod(extra={PREFIX + "expected-gpu-memory-mib": "2048"}), 0.6)
    evaluation = evaluate(the_pod, [HALF], NOW, POLICY)
    explanation = explain(evaluation, the_pod, NOW, POLICY)
    assert explanation["own_load"]["utilization_source"] == "learned"
    assert explanation["own_load"]["memory_source"] == "hint"
    assert "own load per gpu: 0.60 (learned from 3 pods), 2048 MiB (hint)" in render_text(
        explanation
    )
    off = explain(evaluate(the_pod, [HALF], NOW, OFF), the_pod, NOW, OFF)
    assert off["own_load"] is None


def test_a_bad_memory_hint_takes_the_hint_error_path() -> None:
    the_pod = pod(extra={PREFIX + "expected-gpu-memory-mib": "8Gi"})
    assert PodClass.of(the_pod, POLICY).hint_problem is not None
    assert run([IDLE], the_pod, POLICY).verdicts[0].reason == (
        f"invalid pod annotation {PREFIX}expected-gpu-memory-mib"
    )


# ----------------------------------------------------------------------------- explain's basis


class _Learned:
    """The learned store's read, per workload (`serving.inputs.LearnedLoads`)."""

    def __init__(self, figures: dict[str, Learned]) -> None:
        self.figures = figures

    def learned_for(self, workload: str | None, now: datetime) -> Learned | None:
        return None if workload is None else self.figures.get(workload)


def _replica(deployment: str) -> dict[str, Any]:
    """A Deployment's replica, as its ReplicaSet's controller makes it."""
    document = http_pod(name=f"{deployment}-5c8d7f9b64-abcde")
    document["metadata"]["labels"] = {"pod-template-hash": "5c8d7f9b64"}
    document["metadata"]["ownerReferences"] = [
        {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": f"{deployment}-5c8d7f9b64",
         "uid": deployment, "controller": True}
    ]  # fmt: skip
    return document


def test_explain_names_the_pods_each_workload_learned_from_when_their_figures_agree() -> None:
    """Two workloads with the same learned figures share a pod class (its key is the figures),
    whose basis is the first one's; each pod's explanation names its own workload's."""
    store = NodeStore(clock=lambda: NOW)
    store.replace([HALF])
    figures = {
        "default/Deployment/few": Learned(6000, None, 2, 2),
        "default/Deployment/many": Learned(6000, None, 40, 20),
    }
    app = ScorerApp(policy=POLICY, clock=lambda: NOW, node_store=store, workloads=_Learned(figures))
    for deployment, pods in (("few", 2), ("many", 20), ("few", 2)):
        body = args_body(_replica(deployment), names=["half"])
        own = json.loads(app.handle("explain", body).body)["own_load"]
        assert (own["utilization"], own["utilization_source"]) == (0.6, "learned")
        assert own["learned_from_pods"] == pods, deployment


def test_a_class_basis_stays_where_the_workloads_figure_moved_since() -> None:
    the_pod = _learned(pod(), 0.6)
    evaluation = evaluate(the_pod, [HALF], NOW, POLICY)
    moved = Learned(6500, None, 50, 25)
    assert with_learned_basis(evaluation, moved) is evaluation
    assert with_learned_basis(evaluation, None) is evaluation
    same = Learned(6000, None, 50, 25)
    own = with_learned_basis(evaluation, same).own_load
    assert own is not None
    assert (own.samples, own.pods) == (50, 25)


def test_a_pod_heavier_than_the_limit_still_fits_an_idle_gpu_only() -> None:
    """A workload whose pods fill their GPU (learned 0.95, above the 0.90 limit) pushes no other
    work over the limit on an idle GPU: its load counts up to the limit, not past it."""
    heavy = _learned(pod(), 0.95)
    busy = gpu_node("busy", runs((1, Gpu(utilization=0.05))))
    idle_verdict, busy_verdict = run([IDLE, busy], heavy, POLICY).verdicts
    assert idle_verdict.passed, idle_verdict.reason
    assert not busy_verdict.passed
    # On node-level data as well: an idle node takes it, a node with any load does not.
    level = [
        node(name, utilization=u, overrides={Field.GPU_COUNT: "1"})
        for name, u in (("level-idle", 0.0), ("level-busy", 0.05))
    ]
    assert [v.passed for v in run(level, heavy, POLICY).verdicts] == [True, False]


# ----------------------------------------------------------------------------- in-flight pods


def _in_flight(**learned: int | None) -> BoundPod:
    """A 4-GPU pod bound 5 s ago, no status yet, of a workload whose load is `learned`."""
    the_pod = bound_pod("replica-1", gpus=4)
    if not learned:
        return the_pod
    figures = Learned(learned.get("util_bp"), learned.get("mem_mib"), 6, 3)
    return msgspec.structs.replace(the_pod, workload="default/deploy/infer", learned=figures)


# (in-flight pod, policy, utilization judged: 0.40 published on 8 GPUs + the in-flight pod's
# 4 GPUs x its load / 8 + the 1-GPU pod's own 0.30 / 8 when own load counts)
INFLIGHT_ESTIMATE_CASES = [
    pytest.param(_in_flight(), OFF, 0.40 + 4 * 1.0 / 8, id="off-inflight-gpu-load-1.0"),
    pytest.param(_in_flight(util_bp=5000), OFF, 0.40 + 4 * 1.0 / 8, id="off-learned-not-read"),
    pytest.param(
        _in_flight(), POLICY, 0.40 + 4 * 0.30 / 8 + 0.30 / 8, id="on-no-data-the-own-default"
    ),
    pytest.param(
        _in_flight(util_bp=5000),
        POLICY,
        0.40 + 4 * 0.50 / 8 + 0.30 / 8,
        id="on-its-workloads-learned-load",
    ),
    pytest.param(
        msgspec.structs.replace(_in_flight(util_bp=5000), gpu_load_bp=1000),
        POLICY,
        0.40 + 4 * 0.10 / 8 + 0.30 / 8,
        id="on-its-hint-before-its-siblings",
    ),
]


@pytest.mark.parametrize(("inflight", "policy", "judged"), INFLIGHT_ESTIMATE_CASES)
def test_inflight_pods_count_their_own_estimate(
    inflight: BoundPod, policy: Policy, judged: float
) -> None:
    the_node = with_pods(node(utilization=0.40, overrides={Field.GPU_COUNT: "8"}), inflight)
    verdict = run([the_node], pod(gpus=1), policy).verdicts[0]
    assert verdict.utilization_judged == pytest.approx(judged, abs=1e-4)


def test_inflight_pods_hold_the_memory_their_workload_uses() -> None:
    """Largest free judged: 80000 MiB less 4 GPUs x the memory the in-flight pod's workload
    holds per GPU (no `min-gpu-memory-mib` hint: before, nothing was subtracted)."""
    inflight = _in_flight(util_bp=1000, mem_mib=15360)
    the_node = with_pods(node(utilization=0.10, overrides={Field.GPU_COUNT: "8"}), inflight)
    asking = pod(gpus=1, min_memory_mib="30000")
    on = run([the_node], asking, POLICY).verdicts[0]
    assert on.memory_largest_free_judged_mib == 80_000 - 4 * 15360  # 18560: too little
    assert on.reason == "gpu memory below 30000MiB free on one gpu"
    off = run([the_node], asking, OFF).verdicts[0]
    assert off.memory_largest_free_judged_mib is None  # nothing known of its memory
    assert off.passed, off.reason


def test_explain_shows_each_inflight_pods_estimate_source() -> None:
    the_node = with_pods(
        node(utilization=0.40, overrides={Field.GPU_COUNT: "8"}), _in_flight(util_bp=5000)
    )
    the_pod = pod(gpus=1)
    document = explain(evaluate(the_pod, [the_node], NOW, POLICY), the_pod, NOW, POLICY)
    counted = document["nodes"][0]["inflight"]["pods"][0]
    assert (counted["gpu_load"], counted["gpu_load_source"]) == (0.5, "learned")
    assert "load 0.50 (learned)" in render_text(document)
