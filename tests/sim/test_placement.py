"""The placement simulation: grading rules on hand-built cases, policy wiring, determinism."""

from __future__ import annotations

import json
import random
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.aggregate import aggregate
from agent.limiter import LimiterState
from exporter_scheduler.core.policy import Policy
from fleet_sim.placement import (
    BACKOFF_MAX_S,
    EPOCH,
    INFERENCE_DEPLOYMENTS,
    JOB_SPREAD_S,
    JOB_WORKER_GPUS,
    JOB_WORKERS,
    LAG_MODEL,
    PER_GPU_KEYS,
    POLICIES,
    PUSH_CAUSES,
    REPLICA_SPREAD,
    SCALE_UP_REPLICAS,
    SCALE_UP_SPREAD_S,
    SCORER_POLICIES,
    SCORER_VARIANTS,
    SHARED_DEPLOYMENTS,
    WORKLOADS,
    GpuTruth,
    NodeSetup,
    NodeTruth,
    PlacementConfig,
    PodRequest,
    PolicyName,
    PushCause,
    _assign,
    _choose,
    _Node,
    _Placed,
    _reading,
    _Run,
    backoff_s,
    bound_pod,
    chain_rank,
    compare,
    judge,
    lag_summary,
    main,
    make_nodes,
    make_pods,
    pushed_over_limit,
    run,
    short_of_suitable,
    stranded_fraction,
    suitable_gpus,
)
from fleet_sim.traces import A100_80GB, L4_24GB, V100_32GB, GpuModel
from gpu_contract import DEFAULT_KEYS, Field, GpuState, Health, NodeGpuState, decode, encode

NOW = datetime(2026, 1, 5, 12, 0, tzinfo=UTC)
A100 = "NVIDIA-A100-SXM4-80GB"
V100 = "Tesla-V100-SXM2-32GB"
T4 = "Tesla-T4"


def _pod(**changes: object) -> PodRequest:
    fields: dict[str, object] = {
        "name": "p",
        "arrival_s": 0.0,
        "gpus": 1,
        "memory_mib": 10_000,
        "utilization": 0.5,
        "run_s": 60.0,
    }
    fields.update(changes)
    return PodRequest(**fields)  # type: ignore[arg-type]


def _truth(name: str, model: str = A100, util: float = 0.5, temp: float = 60.0,
           free_mib: int = 80_000) -> NodeTruth:  # fmt: skip
    return NodeTruth(name, model, util, temp, free_mib)


def _judge(
    pod: PodRequest, chosen: NodeTruth, feasible: list[NodeTruth], **kw: object
) -> dict[str, bool]:
    verdict = judge(
        pod,
        chosen,
        feasible,
        fits_in_memory=bool(kw.pop("fits", True)),
        utilization_limit=0.90,
        temperature_limit_c=85.0,
        margin=float(kw.pop("margin", 0.0)),  # type: ignore[arg-type]
    )
    return {
        "above": verdict.above_limit,
        "chain": verdict.chain_violation,
        "memory": verdict.memory_fit_failure,
        "hot": verdict.hot,
        "fewer": verdict.fewer_suitable,
    }


def _gpu(util: float = 0.0, *, free: bool = True, temp: float = 50.0,
         mib: int = 40_000) -> GpuTruth:  # fmt: skip
    return GpuTruth(free_slot=free, utilization=util, temperature_c=temp, free_mib=mib)


# Four GPUs that can take a pod (idle, a free slot, 40 GB free) and four that cannot.
SPLIT = NodeTruth(
    "split", A100, 0.5, 60.0, 40_000,
    (*[_gpu()] * 4, _gpu(0.95), _gpu(free=False), _gpu(temp=85.0), _gpu(mib=1_000)),
)  # fmt: skip
HOT_NODE = _truth("busy", util=0.95)
COOL_NODE = _truth("cool", util=0.40)
CHAIN = {"chain": ("A100", "V100"), "fallback_utilization": 0.80}


@pytest.mark.parametrize(
    ("pod", "chosen", "feasible", "extra", "expected"),
    [
        pytest.param(_pod(), COOL_NODE, [COOL_NODE, HOT_NODE], {}, {}, id="clean"),
        pytest.param(
            _pod(), HOT_NODE, [COOL_NODE, HOT_NODE], {}, {"above": True}, id="above-limit"
        ),
        pytest.param(
            _pod(), HOT_NODE, [HOT_NODE, _truth("b", util=0.99)], {}, {},
            id="above-limit-but-no-cooler-node",
        ),
        pytest.param(
            _pod(), HOT_NODE, [_truth("c", util=0.88), HOT_NODE], {"margin": 0.05}, {},
            id="above-limit-within-margin-not-clear",
        ),
        pytest.param(
            _pod(**CHAIN), _truth("v", V100), [_truth("a", A100, util=0.70), _truth("v", V100)],
            {}, {"chain": True}, id="chain-skipped-a100-below-threshold",
        ),
        pytest.param(
            _pod(**CHAIN), _truth("v", V100), [_truth("a", A100, util=0.85), _truth("v", V100)],
            {}, {}, id="chain-fallback-every-a100-above-threshold",
        ),
        pytest.param(
            _pod(**CHAIN), _truth("v", V100), [_truth("a", A100, util=0.80), _truth("v", V100)],
            {}, {"chain": True}, id="chain-threshold-is-inclusive",
        ),
        pytest.param(
            _pod(**CHAIN), _truth("v", V100),
            [_truth("a", A100, util=0.78), _truth("v", V100)], {"margin": 0.05}, {},
            id="chain-within-margin-not-clear",
        ),
        pytest.param(
            _pod(**CHAIN), _truth("t", T4), [_truth("v", V100, util=0.5), _truth("t", T4)],
            {}, {"chain": True}, id="chain-unlisted-while-listed-free",
        ),
        pytest.param(
            _pod(**CHAIN), _truth("v", V100),
            [_truth("a", A100, util=0.3, temp=90.0), _truth("v", V100)], {}, {"hot": False},
            id="chain-better-node-too-hot-is-no-violation",
        ),
        pytest.param(
            _pod(**CHAIN, memory_mib=70_000), _truth("v", V100),
            [_truth("a", A100, util=0.3, free_mib=20_000), _truth("v", V100)], {}, {},
            id="chain-better-node-without-memory-is-no-violation",
        ),
        pytest.param(_pod(), COOL_NODE, [COOL_NODE], {"fits": False}, {"memory": True},
                     id="memory-fit-failure"),
        pytest.param(_pod(), _truth("h", temp=85.0), [_truth("h", temp=85.0)], {},
                     {"hot": True}, id="at-temperature-limit-is-hot"),
        pytest.param(_pod(gpus=4), SPLIT, [SPLIT], {}, {}, id="four-suitable-of-eight"),
        pytest.param(_pod(gpus=5), SPLIT, [SPLIT], {}, {"fewer": True},
                     id="fewer-than-k-suitable"),
        pytest.param(_pod(gpus=2, memory_mib=50_000), SPLIT, [SPLIT], {}, {"fewer": True},
                     id="suitable-needs-the-pods-memory"),
        pytest.param(_pod(**CHAIN, gpus=4), _truth("v", V100), [SPLIT, _truth("v", V100)], {},
                     {"chain": True}, id="chain-better-node-with-k-suitable-gpus"),
        pytest.param(_pod(**CHAIN, gpus=5), _truth("v", V100), [SPLIT, _truth("v", V100)], {},
                     {}, id="chain-better-node-short-of-k-suitable-gpus-is-no-violation"),
        pytest.param(_pod(**CHAIN, gpus=2), _truth("v", V100),
                     [NodeTruth("a", A100, 0.85, 60.0, 40_000, (_gpu(), _gpu(), *[_gpu(0.99)] * 6)),
                      _truth("v", V100)], {},
                     {"chain": True}, id="chain-better-node-mean-above-threshold-k-idle-gpus"),
        pytest.param(_pod(**CHAIN, gpus=2), _truth("v", V100),
                     [NodeTruth("a", A100, 0.50, 60.0, 40_000, (_gpu(), *[_gpu(0.85)] * 3)),
                      _truth("v", V100)], {},
                     {}, id="chain-better-node-mean-below-threshold-one-gpu-below-it"),
    ],
)  # fmt: skip
def test_judge(
    pod: PodRequest,
    chosen: NodeTruth,
    feasible: list[NodeTruth],
    extra: dict[str, object],
    expected: dict[str, bool],
) -> None:
    want = {"above": False, "chain": False, "memory": False, "hot": False, "fewer": False}
    want |= expected
    assert _judge(pod, chosen, feasible, **extra) == want


@pytest.mark.parametrize(
    ("model", "chain", "rank"),
    [
        pytest.param(A100, ("A100", "V100"), 0, id="first"),
        pytest.param(V100, ("A100", "V100"), 1, id="second"),
        pytest.param(T4, ("A100", "V100"), 2, id="unlisted-last"),
        pytest.param("NVIDIA-A10", ("A100",), 1, id="a10-is-not-a100"),
        pytest.param(T4, ("A100", "*"), 1, id="star-matches-anything"),
        pytest.param("NVIDIA-A100-80GB-PCIe", ("a100-80gb",), 0, id="multi-token-any-case"),
    ],
)
def test_chain_rank(model: str, chain: tuple[str, ...], rank: int) -> None:
    assert chain_rank(model, chain) == rank


@pytest.mark.parametrize(
    ("free", "total", "expected"),
    [
        pytest.param([8, 8], [8, 8], 0.0, id="all-whole-nodes"),
        pytest.param([4, 8], [8, 8], 4 / 12, id="one-partial"),
        pytest.param([0, 0], [8, 8], 0.0, id="nothing-free"),
        pytest.param([1, 2], [8, 4], 1.0, id="all-partial"),
    ],
)
def test_stranded_fraction(free: list[int], total: list[int], expected: float) -> None:
    assert stranded_fraction(free, total) == pytest.approx(expected)


def _node(
    name: str,
    model: GpuModel = A100_80GB,
    *,
    gpus: int = 2,
    slots: int = 1,
    published_util: float | None = 0.2,
    per_gpu: list[GpuState] | None = None,
    tenants: list[int] | None = None,
    mem_mib: list[int] | None = None,
) -> _Node:
    """A node of the simulation with what its agent last wrote: node-level values, and with
    `per_gpu` that table too (the node-level values then its summaries)."""
    gpus = gpus if per_gpu is None else len(per_gpu)
    node = _Node(
        setup=NodeSetup(name, model, gpus, slots, 30.0),
        total_mib=model.memory_total_mib,
        util=[0.0] * gpus,
        mem_mib=mem_mib or [0] * gpus,
        tenants=tenants or [0] * gpus,
        temperature_c=[40.0] * gpus,
        phase_s=0.0,
        limiter=LimiterState.initial(now_s=0.0),
        bg_util=[0.0] * gpus,
        bg_mem_mib=[0] * gpus,
    )
    if published_util is not None:
        largest = model.memory_total_mib
        if per_gpu is not None:
            published_util = sum(g.utilization or 0.0 for g in per_gpu) / gpus
            largest = max(g.memory_free_mib or 0 for g in per_gpu)
        state = NodeGpuState(
            health=Health.OK,
            updated_at=NOW,
            utilization=published_util,
            utilization_max=published_util,
            memory_fragmentation=0.0,
            memory_free_mib=model.memory_total_mib * gpus,
            memory_largest_free_mib=largest,
            temperature_c=40,
            gpu_model=model.name.replace(" ", "-"),
            gpu_count=gpus,
            gpus=() if per_gpu is None else tuple(per_gpu),
        )
        node.annotations = encode(state, DEFAULT_KEYS)
        node.node_level = {k: v for k, v in node.annotations.items() if k not in PER_GPU_KEYS}
        node.write_time = NOW
    return node


def _pick(policy: str, pod: PodRequest, nodes: list[_Node]) -> str | None:
    chosen = _choose(
        policy,  # type: ignore[arg-type]
        pod,
        pod_annotations=pod.annotations(),
        candidates=nodes,
        now=NOW,
        scorer_policy=Policy(),
        rng=random.Random(1),
    )
    return None if chosen is None else chosen.setup.name


SCORERS = tuple(sorted(SCORER_POLICIES))


@pytest.mark.parametrize("scorer", SCORERS)
def test_scorer_policies_reject_what_they_see_above_the_limit(scorer: str) -> None:
    nodes = [_node("busy", published_util=0.95)]
    assert _pick(scorer, _pod(), nodes) is None
    assert _pick("utilization-only", _pod(), nodes) == "busy"
    assert _pick("random", _pod(), nodes) == "busy"


@pytest.mark.parametrize("scorer", SCORERS)
def test_scorers_and_utilization_only_prefer_the_idle_node(scorer: str) -> None:
    nodes = [_node("warm", published_util=0.6), _node("cool", published_util=0.1)]
    assert _pick(scorer, _pod(), nodes) == "cool"
    assert _pick("utilization-only", _pod(), nodes) == "cool"


def _table(*utilizations: float, mib: int = 80_000, allocated: bool = False) -> list[GpuState]:
    return [GpuState(u, mib, 50, allocated) for u in utilizations]


def test_per_gpu_sends_a_four_gpu_pod_where_four_gpus_are_idle() -> None:
    """Same node mean: the node-aggregate scorer ties (and picks at random), per-GPU does not.
    Where the busy GPUs are unallocated, the device plugin may hand them out: per-GPU avoids
    that node."""
    busy_allocated = _table(*[0.0] * 4, *[1.0] * 4)
    busy_allocated[4:] = [GpuState(1.0, 80_000, 50, True)] * 4
    nodes = [
        _node("even", per_gpu=_table(*[0.5] * 8)),
        _node("split", per_gpu=busy_allocated),
    ]
    # A light pod (hint 0.30): its own load fits on GPUs at 0.50.
    pod = _pod(gpus=4, expected_gpu_load=0.3)
    assert _pick("per-gpu", pod, nodes) == "split"
    assert _pick("per-gpu", _pod(gpus=5, expected_gpu_load=0.3), nodes) == "even"
    unaccounted = [
        _node("even", per_gpu=_table(*[0.5] * 8)),
        _node("split", per_gpu=_table(*[0.0] * 4, *[1.0] * 4)),
    ]
    assert _pick("per-gpu", pod, unaccounted) == "even"
    assert _pick("per-gpu", _pod(gpus=1, expected_gpu_load=0.3), unaccounted) == "even"
    assert {n.setup.name for n in nodes} == {
        _pick_seeded("node-aggregate", pod, nodes, seed) for seed in range(20)
    }


def test_per_gpu_checks_the_memory_of_every_gpu_the_pod_gets() -> None:
    one_big = _table(0.0, 0.0, mib=10_000)
    one_big[0] = GpuState(0.0, 60_000, 50, False)
    nodes = [_node("one-big", per_gpu=one_big), _node("two-ok", per_gpu=_table(0.4, 0.4))]
    pod = _pod(gpus=2, memory_mib=40_000, declares_memory=True)
    assert _pick("per-gpu", pod, nodes) == "two-ok"
    assert _pick("node-aggregate", pod, nodes) == "one-big"  # idler, and one GPU has 60 GB


def test_per_gpu_reads_the_published_allocations() -> None:
    taken = _table(0.0, 0.0, 0.0, 0.0)
    taken[1:] = [GpuState(0.0, 80_000, 50, True)] * 3
    nodes = [_node("taken", per_gpu=taken), _node("free", per_gpu=_table(0.3, 0.3, 0.3, 0.3))]
    assert _pick("per-gpu", _pod(gpus=2), nodes) == "free"
    assert _pick("node-aggregate", _pod(gpus=2), nodes) == "taken"


def _pick_seeded(policy: str, pod: PodRequest, nodes: list[_Node], seed: int) -> str | None:
    chosen = _choose(
        policy,  # type: ignore[arg-type]
        pod,
        pod_annotations=pod.annotations(),
        candidates=nodes,
        now=NOW,
        scorer_policy=Policy(),
        rng=random.Random(seed),
    )
    return None if chosen is None else chosen.setup.name


def test_allocation_spread_prefers_free_slots_whatever_the_load() -> None:
    nodes = [
        _node("hot-but-empty", published_util=0.95),
        _node("cool-but-full", published_util=0.1, tenants=[1, 0]),
    ]
    assert _pick("allocation-spread", _pod(), nodes) == "hot-but-empty"


@pytest.mark.parametrize("scorer", SCORERS)
def test_scorers_follow_the_model_chain(scorer: str) -> None:
    nodes = [_node("v100", V100_32GB, published_util=0.1), _node("a100", published_util=0.5)]
    pod = _pod(chain=("A100", "V100"), fallback_utilization=0.80)
    assert _pick(scorer, pod, nodes) == "a100"
    assert _pick("utilization-only", pod, nodes) == "v100"


@pytest.mark.parametrize("scorer", SCORERS)
def test_scorers_skip_nodes_without_the_memory_the_pod_declares(scorer: str) -> None:
    nodes = [_node("l4", L4_24GB, published_util=0.0), _node("a100", published_util=0.5)]
    pod = _pod(memory_mib=40_000, declares_memory=True)
    assert _pick(scorer, pod, nodes) == "a100"


def test_unpublished_node_scores_lowest_for_utilization_only() -> None:
    nodes = [_node("silent", published_util=None), _node("known", published_util=0.7)]
    assert _pick("utilization-only", _pod(), nodes) == "known"


@pytest.mark.parametrize(
    ("node_state", "pod_need", "expected"),
    [
        pytest.param(([0, 0], [0, 0]), (1, 10_000), ([0], True), id="first-free"),
        pytest.param(([1, 0], [30_000, 0]), (1, 10_000), ([1], True), id="least-shared"),
        pytest.param(([1, 1], [20_000, 5_000]), (1, 10_000), ([0], False), id="shared-no-room"),
        pytest.param(([0, 0], [0, 0]), (3, 10_000), ([0, 1, 0], True), id="replicas-wrap"),
        pytest.param(([0, 0], [0, 0]), (3, 15_000), ([0, 1, 0], False), id="own-replicas-overflow"),
    ],
)
def test_assign_on_a_time_sliced_node(
    node_state: tuple[list[int], list[int]],
    pod_need: tuple[int, int],
    expected: tuple[list[int], bool],
) -> None:
    tenants, mem_mib = node_state
    gpus, memory_mib = pod_need
    node = _node("l4", L4_24GB, slots=2, tenants=tenants, mem_mib=mem_mib)
    assert _assign(node, _pod(gpus=gpus, memory_mib=memory_mib)) == expected


@pytest.mark.parametrize(
    ("pod", "gpus", "expected"),
    [
        pytest.param(_pod(), [_gpu()], 1, id="idle-free"),
        pytest.param(_pod(), [_gpu(free=False)], 0, id="no-free-slot"),
        pytest.param(_pod(), [_gpu(0.90), _gpu(0.91)], 1, id="utilization-limit-inclusive"),
        pytest.param(_pod(), [_gpu(temp=84.0), _gpu(temp=85.0)], 1, id="temperature-limit"),
        pytest.param(_pod(memory_mib=40_000), [_gpu(mib=40_000), _gpu(mib=39_999)], 1,
                     id="memory-real-need"),
        pytest.param(_pod(memory_mib=40_000, declares_memory=False), [_gpu(mib=1)], 0,
                     id="memory-counts-undeclared-too"),
    ],
)  # fmt: skip
def test_suitable_gpus(pod: PodRequest, gpus: list[GpuTruth], expected: int) -> None:
    node = NodeTruth("n", A100, 0.0, 50.0, 0, tuple(gpus))
    assert suitable_gpus(node, pod, utilization_limit=0.90, temperature_limit_c=85.0) == expected


@pytest.mark.parametrize(
    ("before", "assigned", "pod_util", "expected"),
    [
        pytest.param([0.0, 0.0], [0, 1], 0.95, 0, id="alone-on-idle-gpus"),
        pytest.param([0.5, 0.0], [0], 0.45, 1, id="shared-over-limit"),
        pytest.param([0.5, 0.0], [0], 0.40, 0, id="shared-at-limit"),
        pytest.param([0.0, 0.0], [0, 0], 0.5, 0, id="own-replicas-alone"),
        pytest.param([0.3, 0.0], [0, 0], 0.35, 1, id="own-replicas-on-shared"),
        pytest.param([0.95, 0.95], [0, 1], 0.1, 2, id="already-above"),
    ],
)
def test_pushed_over_limit(
    before: list[float], assigned: list[int], pod_util: float, expected: int
) -> None:
    assert len(pushed_over_limit(before, assigned, pod_util, 0.90)) == expected


def test_the_agent_publishes_allocations_from_the_slots_taken() -> None:
    exclusive = _node("a100", gpus=2, tenants=[1, 0])
    sliced = _node("l4", L4_24GB, gpus=2, slots=2, tenants=[2, 1])
    noise = np.random.default_rng(0)
    for node, allocated in ((exclusive, "1,0"), (sliced, "1,0")):
        annotations = encode(aggregate(_reading(node, NOW, noise)), DEFAULT_KEYS)
        assert annotations[DEFAULT_KEYS[Field.PER_GPU_ALLOCATED]] == allocated
    # The published view the grading reads: GPU 0 has no free slot.
    exclusive.annotations = encode(aggregate(_reading(exclusive, NOW, noise)), DEFAULT_KEYS)
    published = exclusive.published()
    assert published is not None
    assert [g.free_slot for g in published.gpus] == [False, True]


def test_unaccounted_work_loads_only_its_gpus() -> None:
    config = PlacementConfig(nodes=40, duration_s=3600.0, seed=3, unaccounted_share=1.0)
    episodes = [e for n in make_nodes(config) for e in n.episodes]
    assert episodes
    spans = {len(on) for *_, on in episodes}
    assert 1 in spans  # a stray process on one GPU
    assert max(spans) in (4, 8)  # and work on every GPU of a node


def test_the_stream_holds_every_workload_kind() -> None:
    config = PlacementConfig(nodes=30, duration_s=3600.0, seed=4)
    pods = make_pods(config, make_nodes(config))
    kinds = {p.kind for p in pods}
    assert kinds == {kind for kind, *_ in WORKLOADS}
    shared = [p for p in pods if p.kind == "shared-inference"]
    assert all(p.gpus == 2 and p.chain == ("L4", "T4") and p.declares_memory for p in shared)
    assert {p.gpus for p in pods if p.kind == "training"} == {1, 2, 4, 8}


def test_pod_annotations_use_the_scorer_hint_names() -> None:
    pod = _pod(chain=("A100", "V100"), fallback_utilization=0.8, declares_memory=True)
    prefix = DEFAULT_KEYS.prefix
    assert pod.annotations() == {
        prefix + "gpu-model-preference": "A100,V100",
        prefix + "gpu-fallback-utilization": "0.80",
        prefix + "min-gpu-memory-mib": "10000",
    }
    assert _pod().annotations() == {}


SMALL = PlacementConfig(nodes=8, duration_s=600.0, seed=5)


def test_stream_and_fleet_are_seeded() -> None:
    nodes = make_nodes(SMALL)
    assert nodes == make_nodes(SMALL)
    assert make_pods(SMALL, nodes) == make_pods(SMALL, make_nodes(SMALL))
    assert len({n.model.name for n in nodes}) == len(SMALL.pools)


@pytest.fixture(scope="module")
def small_runs() -> dict[str, dict[str, Any]]:
    return {p: run(SMALL, p).summary() for p in POLICIES}


def test_every_pod_is_placed_or_pending(small_runs: dict[str, dict[str, Any]]) -> None:
    for summary in small_runs.values():
        assert summary["placed"] + summary["pending_at_end"] == summary["pods"]
        assert summary["above_limit_clear"] <= summary["above_limit"]
        assert summary["chain_violations_clear"] <= summary["chain_violations"]
        assert summary["fewer_suitable_multi_gpu"] <= summary["fewer_suitable"]
        assert summary["fewer_suitable_unseen"] <= summary["fewer_suitable"]
        assert summary["fewer_suitable"] <= summary["placed"]
        assert sum(summary["placed_by_kind"].values()) == summary["placed"]
        pushed = summary["gpus_pushed_over_limit"]
        assert sum(summary["gpus_pushed_over_limit_by_cause"].values()) == pushed
        assert sum(summary["gpus_pushed_over_limit_by_estimate"].values()) == pushed
        assert summary["gpus_pushed_over_limit_burst"] <= pushed
        assert summary["burst_short_placements"] <= summary["short_placements"]
        assert summary["short_placements"] <= summary["fewer_suitable"]
        assert summary["burst_placed"] + summary["pending_burst"] == summary["burst_pods"]
        assert summary["pending_burst"] <= summary["pending_at_end"]
    assert len({s["pods"] for s in small_runs.values()}) == 1


def test_runs_are_reproducible(small_runs: dict[str, dict[str, Any]]) -> None:
    assert run(SMALL, "random").summary() == small_runs["random"]


def test_policies_in_parallel_give_the_same_results() -> None:
    config = PlacementConfig(nodes=4, duration_s=240.0, seed=6)
    policies: tuple[PolicyName, ...] = ("per-gpu", "random")
    alone = {p: r.summary() for p, r in compare(config, policies).items()}
    assert {p: r.summary() for p, r in compare(config, policies, workers=2).items()} == alone


def test_command_line_prints_every_policy(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--nodes", "5", "--duration-s", "300", "--policy", "random"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert list(out) == ["random"]


def test_command_line_runs_each_seed_on_its_own(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["--nodes", "5", "--duration-s", "300", "--policy", "random"]
    assert main([*args, "--seeds", "3,4"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert list(out) == ["3", "4"]
    assert main([*args, "--seed", "4"]) == 0
    assert out["4"] == json.loads(capsys.readouterr().out)
    assert out["3"] != out["4"]


_truths = st.builds(
    NodeTruth,
    name=st.sampled_from(["a", "b", "c", "d"]),
    model_name=st.sampled_from([A100, V100, T4]),
    utilization=st.floats(0.0, 1.0),
    temperature_c=st.floats(20.0, 100.0),
    largest_free_mib=st.integers(0, 81_920),
)


@settings(max_examples=200, deadline=None)
@given(
    chosen=_truths,
    others=st.lists(_truths, max_size=5),
    chain=st.sampled_from([(), ("A100",), ("A100", "V100"), ("V100", "*")]),
    margin=st.floats(0.0, 0.2),
)
def test_clear_cases_are_a_subset_of_all_cases(
    chosen: NodeTruth, others: list[NodeTruth], chain: tuple[str, ...], margin: float
) -> None:
    pod = _pod(chain=chain, fallback_utilization=0.8 if chain else None)
    feasible = [chosen, *others]
    strict = _judge(pod, chosen, feasible)
    clear = _judge(pod, chosen, feasible, margin=margin)
    assert not (clear["above"] and not strict["above"])
    assert not (clear["chain"] and not strict["chain"])
    if chosen.utilization <= 0.90:
        assert not strict["above"]
    if not chain or chain_rank(chosen.model_name, chain) == 0:
        assert not strict["chain"]


@given(
    slots=st.lists(
        st.tuples(st.integers(0, 16), st.integers(1, 16)).map(lambda t: (min(t), t[1])),
        max_size=8,
    )
)
def test_stranded_fraction_is_a_fraction(slots: list[tuple[int, int]]) -> None:
    free = [f for f, _ in slots]
    total = [t for _, t in slots]
    assert 0.0 <= stranded_fraction(free, total) <= 1.0


# ----------------------------------------------------------------------------------------------
# Variants, bursts, the lag model and in-flight accounting


def test_each_scorer_variant_is_named_for_the_part_it_goes_without() -> None:
    assert set(POLICIES) >= SCORER_POLICIES
    for name, variant in SCORER_VARIANTS.items():
        without_either = name.endswith("-without-either")
        assert variant.inflight == (not without_either and not name.endswith("-without-inflight"))
        assert variant.blind_device_plugin == (
            not without_either and not name.endswith("-without-blind-plugin")
        )
    assert SCORER_VARIANTS["per-gpu"].per_gpu_keys
    assert not SCORER_VARIANTS["node-aggregate"].per_gpu_keys
    assert SCORER_VARIANTS["node-aggregate"].inflight


BURSTY = PlacementConfig(nodes=40, duration_s=7200.0, seed=8, burst_share=0.5)


@pytest.fixture(scope="module")
def bursty_pods() -> list[PodRequest]:
    return make_pods(BURSTY, make_nodes(BURSTY))


def _groups(pods: list[PodRequest], kind: str) -> list[list[PodRequest]]:
    by_burst: dict[str, list[PodRequest]] = {}
    for pod in pods:
        if pod.burst_kind == kind:
            by_burst.setdefault(pod.burst, []).append(pod)
    return list(by_burst.values())


@pytest.mark.parametrize(
    ("kind", "sizes", "spread_s"),
    [
        pytest.param("job", {n for n, _ in JOB_WORKERS}, JOB_SPREAD_S, id="job-workers"),
        pytest.param(
            "scale-up", {n for n, _ in SCALE_UP_REPLICAS}, SCALE_UP_SPREAD_S, id="scale-up"
        ),
    ],
)
def test_bursts_are_copies_of_one_template_arriving_together(
    bursty_pods: list[PodRequest], kind: str, sizes: set[int], spread_s: float
) -> None:
    groups = _groups(bursty_pods, kind)
    assert len(groups) >= 5
    for group in groups:
        assert len(group) in sizes
        arrivals = [p.arrival_s for p in group]
        assert max(arrivals) - min(arrivals) <= spread_s
        # One template; a Deployment's replicas differ in load only by the replica spread.
        templates = {(p.gpus, p.memory_mib, p.chain, p.kind, p.workload) for p in group}
        assert len(templates) == 1, group[0].burst
        loads = [p.utilization for p in group]
        assert max(loads) - min(loads) <= 2 * REPLICA_SPREAD + 1e-9, group[0].burst
    if kind == "job":
        assert {p.gpus for g in groups for p in g} <= {n for n, _ in JOB_WORKER_GPUS}
        assert all(len({p.run_s for p in g}) == 1 for g in groups)  # a job ends as one
    else:
        kinds = {p.kind for g in groups for p in g}
        assert kinds == {"inference", "shared-inference"}


def test_no_pod_of_the_stream_hints_its_load(bursty_pods: list[PodRequest]) -> None:
    assert all(p.expected_gpu_load is None for p in bursty_pods)
    assert all(
        DEFAULT_KEYS.prefix + "expected-gpu-load" not in p.annotations() for p in bursty_pods
    )


def test_pods_belong_to_workloads_as_in_a_fleet(bursty_pods: list[PodRequest]) -> None:
    """Inference pods are replicas of a few Deployments (alike but for the traffic-driven load),
    a job's workers share their Job, stream training pods and notebooks have no siblings."""
    by_workload: dict[str, list[PodRequest]] = {}
    for pod in bursty_pods:
        by_workload.setdefault(pod.workload, []).append(pod)
    singletons = by_workload.pop("", [])
    assert {p.kind for p in singletons} == {"training", "notebook"}
    assert all(not p.burst for p in singletons)
    deployments = {w: ps for w, ps in by_workload.items() if w.startswith("deploy/")}
    assert 0 < len(deployments) <= INFERENCE_DEPLOYMENTS + SHARED_DEPLOYMENTS
    for replicas in deployments.values():
        assert len({(p.gpus, p.memory_mib, p.chain, p.kind) for p in replicas}) == 1
    assert any(len(replicas) >= 5 for replicas in deployments.values())
    jobs = {w: ps for w, ps in by_workload.items() if w.startswith("job/")}
    assert jobs
    assert all(len({p.burst for p in ps}) == 1 for ps in jobs.values())


def test_a_deployments_replicas_carry_its_traffic_together(bursty_pods: list[PodRequest]) -> None:
    """Replicas that arrived hours apart carry, at any one time, the same load but for their
    own spread: a load balancer shares the traffic, so a new replica carries what its siblings
    carry then. A replica's load moves with the traffic while it runs."""
    by_deployment: dict[str, list[PodRequest]] = {}
    for pod in bursty_pods:
        if pod.workload.startswith("deploy/"):
            by_deployment.setdefault(pod.workload, []).append(pod)
    replicas = max(by_deployment.values(), key=len)
    assert all(p.traffic is not None for p in replicas)
    assert max(p.arrival_s for p in replicas) - min(p.arrival_s for p in replicas) > 1800
    for time_s in (0.0, 1800.0, 3600.0, 5400.0):
        loads = [p.load_at(time_s) for p in replicas]
        assert max(loads) - min(loads) <= 2 * REPLICA_SPREAD + 1e-3, time_s
    first = replicas[0]
    assert first.load_at(first.arrival_s) == first.utilization
    assert len({first.load_at(t) for t in (0.0, 1800.0, 3600.0, 5400.0)}) > 1
    singles = [p for p in bursty_pods if not p.workload.startswith("deploy/")]
    assert all(p.traffic is None and p.load_at(9e9) == p.utilization for p in singles)


def test_the_back_off_is_capped_however_often_a_pod_is_tried() -> None:
    assert [backoff_s(n) for n in range(6)] == [1.0, 2.0, 4.0, 8.0, 10.0, 10.0]
    assert backoff_s(5_000) == BACKOFF_MAX_S


def test_the_agent_publishes_each_running_pods_usage() -> None:
    """Whole-GPU attribution on an exclusive GPU, per-process on a time-sliced one."""
    sim = _Run(SMALL, "per-gpu")
    for step in range(int(SMALL.duration_s)):
        sim.step(float(step))
    published = [decode(n.annotations, DEFAULT_KEYS).state for n in sim.nodes if n.annotations]
    usage = [pod for state in published if state is not None for pod in state.pods]
    assert usage
    assert all(pod.pod.startswith("sim/") for pod in usage)
    assert sim.learner is not None
    assert len(sim.learner) > 0


@pytest.mark.parametrize("burst_share", [0.0, 0.35, 0.7])
def test_bursts_take_their_share_of_the_offered_load(burst_share: float) -> None:
    config = PlacementConfig(nodes=40, duration_s=4 * 3600.0, seed=9, burst_share=burst_share)
    pods = make_pods(config, make_nodes(config))
    gpu_s = [p.gpus * p.run_s for p in pods]
    burst_gpu_s = sum(g for g, p in zip(gpu_s, pods, strict=True) if p.burst)
    assert burst_gpu_s / sum(gpu_s) == pytest.approx(burst_share, abs=0.12)
    assert [p.arrival_s for p in pods] == sorted(p.arrival_s for p in pods)
    assert len({p.name for p in pods}) == len(pods)


def test_lag_draws_follow_the_lag_model(bursty_pods: list[PodRequest]) -> None:
    lag = LAG_MODEL
    cached = [p for p in bursty_pods if p.start_delay_s <= lag.cached_start_s[1]]
    assert len(cached) / len(bursty_pods) == pytest.approx(lag.image_cached_share, abs=0.08)
    assert all(lag.cached_start_s[0] <= p.start_delay_s <= lag.pull_max_s for p in bursty_pods)
    for pod in bursty_pods:
        low, high = lag.ramp_range_s(pod.kind)
        assert low <= pod.ramp_s <= high
    summary = lag_summary(bursty_pods, BURSTY)
    assert summary["start_delay_p50_s"] < summary["start_delay_p90_s"] <= lag.pull_max_s
    assert summary["bind_to_load_p50_s"] > lag.admission_delay_s
    assert 0.0 <= summary["load_after_delay_share"] <= 1.0


LAG_SETUP = NodeSetup("a100-000", A100_80GB, 2, 1, 30.0)
LAG_CONFIG = PlacementConfig(nodes=1, duration_s=600.0, seed=5, unaccounted_share=0.0)
ALLOCATED_KEY = DEFAULT_KEYS[Field.PER_GPU_ALLOCATED]
PER_GPU_UTIL_KEY = DEFAULT_KEYS[Field.PER_GPU_UTILIZATION]


@pytest.mark.parametrize(
    ("start_delay_s", "ramp_s"),
    [
        pytest.param(2.0, 15.0, id="cached-image"),
        pytest.param(95.0, 60.0, id="large-image-pull"),
        pytest.param(3.0, 0.0, id="no-ramp"),
    ],
)
def test_allocation_shows_after_admission_and_load_after_the_ramp(
    start_delay_s: float, ramp_s: float
) -> None:
    """Bound at 1 s, admitted at 2 s: the published allocation appears at the agent's first
    write from then on, never before; the load at its first write after the ramp."""
    pod = _pod(name="p", arrival_s=0.5, utilization=0.9, run_s=500.0,
               start_delay_s=start_delay_s, ramp_s=ramp_s)  # fmt: skip
    sim = _Run(LAG_CONFIG, "per-gpu", setups=[LAG_SETUP], pods=[pod])
    node = sim.nodes[0]
    bound_s, admitted_s = 1.0, 1.0 + LAG_CONFIG.lag.admission_delay_s
    started_s = admitted_s + start_delay_s
    loaded_s = started_s + ramp_s
    writes: list[tuple[float, dict[str, str]]] = []
    for step in range(int(loaded_s) + 60):
        t = float(step)
        sim.step(t)
        if node.write_time == EPOCH + timedelta(seconds=t):
            writes.append((t, dict(node.annotations)))
        if t == bound_s:
            assert node.tenants == [1, 0]
            assert node.allocated == [0, 0]
            assert node.pods_view[0].admitted_at is None
        if t == admitted_s:
            assert node.allocated == [1, 0]
            assert node.pods_view[0].admitted_at == EPOCH + timedelta(seconds=admitted_s)
    assert node.pods_view[0].running_since == EPOCH + timedelta(seconds=started_s)
    shown = [t for t, a in writes if a[ALLOCATED_KEY] == "1,0"]
    assert all(a[ALLOCATED_KEY] == "0,0" for t, a in writes if t < admitted_s)
    assert shown
    assert shown[0] >= admitted_s
    # The agent's next sample, held back at most by the limiter's minimum write interval.
    policy = LAG_CONFIG.write_policy
    assert shown[0] <= admitted_s + LAG_CONFIG.interval_s + policy.min_write_interval_s
    loaded = [t for t, a in writes if float(a[PER_GPU_UTIL_KEY].split(",")[0]) >= 0.5]
    assert loaded
    assert loaded[0] >= loaded_s
    # One sample for the window to fill, one more if the limiter held the write back.
    assert loaded[0] <= loaded_s + 2 * LAG_CONFIG.interval_s + policy.min_write_interval_s


def test_the_agent_reads_utilization_averaged_over_its_window() -> None:
    node = _node("n", gpus=2)
    node.util = [0.8, 0.0]
    assert node.window_util(0) == pytest.approx(0.8)  # nothing accumulated yet: the value now
    node.util_acc, node.acc_s = [0.8 * 2, 0.0], 5  # loaded for 2 s of the 5 s window
    assert node.window_util(0) == pytest.approx(0.32)
    reading = _reading(node, NOW, np.random.default_rng(0))
    assert reading.gpus[0].utilization == pytest.approx(0.32, abs=0.06)


@pytest.mark.parametrize(
    ("pod", "expected"),
    [
        pytest.param(_pod(gpus=2), (None, None), id="no-hints"),
        pytest.param(_pod(gpus=2, declares_memory=True), (None, 10_000), id="memory-declared"),
        pytest.param(_pod(gpus=2, expected_gpu_load=0.35), (3_500, None), id="expected-load"),
    ],
)
def test_bound_pods_carry_the_pods_hints(
    pod: PodRequest, expected: tuple[int | None, int | None]
) -> None:
    record = bound_pod(pod, "n", NOW, provisional=True)
    assert (record.gpu_load_bp, record.memory_mib) == expected
    assert (record.node, record.gpus, record.bound_at, record.provisional) == ("n", 2, NOW, True)
    assert record.admitted_at is None
    assert record.running_since is None


def _place_burst(policy: str, nodes: list[_Node], pods: list[PodRequest]) -> list[str]:
    """The sim's scheduling pass for pods of one instant: allocation accounting first, then the
    policy; each decision is a provisional in-flight pod on its node for the next one."""
    names = []
    for pod in pods:
        feasible = [n for n in nodes if n.free_slots >= pod.gpus]
        chosen = _choose(
            policy,  # type: ignore[arg-type]
            pod,
            pod_annotations=pod.annotations(),
            candidates=feasible,
            now=NOW,
            scorer_policy=Policy(),
            rng=random.Random(1),
        )
        assert chosen is not None
        gpus, _ = _assign(chosen, pod)
        for g in gpus:
            chosen.tenants[g] += 1
        chosen.set_bound(bound_pod(pod, chosen.setup.name, NOW, provisional=True))
        names.append(chosen.setup.name)
    return names


def _unallocated(*utilizations: float) -> list[GpuState]:
    return [GpuState(u, 80_000, 50, False) for u in utilizations]


@pytest.mark.parametrize(
    ("policy", "without", "short_table", "burst", "suitable"),
    [
        # 7 idle GPUs and a busy unallocated one: the blind-plugin rule passes the node for a
        # 1-GPU pod (7/8), and would keep passing it for all 8 pods without in-flight pods.
        pytest.param("per-gpu", "per-gpu-without-inflight", _unallocated(*[0.0] * 7, 0.95),
                     8, 7, id="per-gpu"),
        # 2 idle GPUs and 2 busy ones, best k counted: in-flight pods hold the 2 idle ones.
        pytest.param("per-gpu-without-blind-plugin", "per-gpu-without-either",
                     _unallocated(0.0, 0.0, 0.95, 0.95), 4, 2, id="without-blind-plugin"),
    ],
)  # fmt: skip
def test_inflight_keeps_a_burst_off_a_node_short_of_suitable_gpus(
    policy: str, without: str, short_table: list[GpuState], burst: int, suitable: int
) -> None:
    """The short node looks best (idler on the GPUs the pod may get) and has a free slot for
    every pod of the burst, but fewer suitable GPUs than the burst has pods; the other node
    has room for all of them."""
    pods = [_pod(name=f"scale-up-0000-r{i}", burst="scale-up-0000") for i in range(burst)]

    def fleet() -> list[_Node]:
        return [_node("short", per_gpu=short_table),
                _node("roomy", per_gpu=_unallocated(*[0.3] * 8))]  # fmt: skip

    on_short = _place_burst(policy, fleet(), pods).count("short")
    assert 0 < on_short <= suitable
    assert _place_burst(without, fleet(), pods).count("short") == burst


def test_short_of_suitable_needs_another_node_with_room() -> None:
    pod = _pod(gpus=5)
    roomy = NodeTruth("roomy", A100, 0.1, 50.0, 40_000, tuple([_gpu()] * 8))
    assert short_of_suitable(pod, SPLIT, [SPLIT, roomy], utilization_limit=0.9,
                             temperature_limit_c=85.0)  # fmt: skip
    assert not short_of_suitable(pod, SPLIT, [SPLIT], utilization_limit=0.9,
                                 temperature_limit_c=85.0)  # fmt: skip
    chained = _pod(gpus=5, chain=("V100",))
    assert not short_of_suitable(chained, SPLIT, [SPLIT, roomy], utilization_limit=0.9,
                                 temperature_limit_c=85.0)  # fmt: skip


def _placed(sim: _Run, name: str, bound_s: float, loaded_s: float | None, *,
            util_at_bind: float = 0.3, unaccounted_at_bind: bool = False) -> _Placed:  # fmt: skip
    node = sim.nodes[0]
    placed = _Placed(
        _pod(name=name), node, [0], bound_pod(_pod(name=name), node.setup.name, NOW,
                                              provisional=False),
        bound_s, (util_at_bind, 0.0), (unaccounted_at_bind, False), loaded_s=loaded_s,
    )  # fmt: skip
    sim.on_node[node.setup.name][name] = placed
    return placed


@pytest.mark.parametrize(
    ("other", "mine", "unaccounted_now", "expected"),
    [
        pytest.param((5.0, 60.0), {}, False, "in-flight", id="other-pod-loaded-after-my-bind"),
        pytest.param(None, {"util_at_bind": 0.95}, True, "busy-at-bind", id="busy-at-bind"),
        pytest.param((20.0, 30.0), {}, False, "after-bind", id="pod-bound-after-me"),
        pytest.param(None, {}, True, "after-bind", id="unaccounted-work-started-after-bind"),
        pytest.param(None, {"unaccounted_at_bind": True}, True, "within-limit",
                     id="unaccounted-work-there-within-limit"),
        pytest.param((0.0, 5.0), {}, False, "within-limit", id="other-pod-load-already-there"),
    ],
)  # fmt: skip
def test_what_pushed_a_gpu_over_the_limit(
    other: tuple[float, float] | None,
    mine: dict[str, Any],
    unaccounted_now: bool,
    expected: PushCause,
) -> None:
    sim = _Run(LAG_CONFIG, "per-gpu", setups=[LAG_SETUP], pods=[])
    if other is not None:
        _placed(sim, "other", *other)
    placed = _placed(sim, "me", 10.0, None, **mine)
    sim.nodes[0].bg_util = [0.5 if unaccounted_now else 0.0, 0.0]
    assert sim._push_cause(placed, 0, 0.90) == expected
    assert expected in PUSH_CAUSES
