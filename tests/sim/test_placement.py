"""The placement simulation: grading rules on hand-built cases, policy wiring, determinism."""

from __future__ import annotations

import json
import random
from datetime import UTC, datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.limiter import LimiterState
from exporter_scheduler.policy import Policy
from gpu_contract import DEFAULT_KEYS, Health, NodeGpuState, encode
from gpu_sim.placement import (
    POLICIES,
    NodeSetup,
    NodeTruth,
    PlacementConfig,
    PodRequest,
    _assign,
    _choose,
    _Node,
    chain_rank,
    judge,
    main,
    make_nodes,
    make_pods,
    run,
    stranded_fraction,
)
from gpu_sim.traces import A100_80GB, L4_24GB, V100_32GB, GpuModel

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
    }


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
    ],
)  # fmt: skip
def test_judge(
    pod: PodRequest,
    chosen: NodeTruth,
    feasible: list[NodeTruth],
    extra: dict[str, object],
    expected: dict[str, bool],
) -> None:
    want = {"above": False, "chain": False, "memory": False, "hot": False} | expected
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
    tenants: list[int] | None = None,
    mem_mib: list[int] | None = None,
) -> _Node:
    node = _Node(
        setup=NodeSetup(name, model, gpus, slots, 30.0),
        total_mib=model.memory_total_mib,
        util=[0.0] * gpus,
        mem_mib=mem_mib or [0] * gpus,
        tenants=tenants or [0] * gpus,
        temperature_c=[40.0] * gpus,
        phase_s=0.0,
        limiter=LimiterState.initial(now_s=0.0),
    )
    if published_util is not None:
        state = NodeGpuState(
            health=Health.OK,
            updated_at=NOW,
            utilization=published_util,
            utilization_max=published_util,
            memory_fragmentation=0.0,
            memory_free_mib=model.memory_total_mib * gpus,
            memory_largest_free_mib=model.memory_total_mib,
            temperature_c=40,
            gpu_model=model.name.replace(" ", "-"),
            gpu_count=gpus,
        )
        node.annotations = encode(state, DEFAULT_KEYS)
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


def test_project_policy_rejects_what_it_sees_above_the_limit() -> None:
    nodes = [_node("busy", published_util=0.95)]
    assert _pick("project", _pod(), nodes) is None
    assert _pick("utilization-only", _pod(), nodes) == "busy"
    assert _pick("random", _pod(), nodes) == "busy"


def test_project_and_utilization_only_prefer_the_idle_node() -> None:
    nodes = [_node("warm", published_util=0.6), _node("cool", published_util=0.1)]
    assert _pick("project", _pod(), nodes) == "cool"
    assert _pick("utilization-only", _pod(), nodes) == "cool"


def test_allocation_spread_prefers_free_slots_whatever_the_load() -> None:
    nodes = [
        _node("hot-but-empty", published_util=0.95),
        _node("cool-but-full", published_util=0.1, tenants=[1, 0]),
    ]
    assert _pick("allocation-spread", _pod(), nodes) == "hot-but-empty"


def test_project_follows_the_model_chain() -> None:
    nodes = [_node("v100", V100_32GB, published_util=0.1), _node("a100", published_util=0.5)]
    pod = _pod(chain=("A100", "V100"), fallback_utilization=0.80)
    assert _pick("project", pod, nodes) == "a100"
    assert _pick("utilization-only", pod, nodes) == "v100"


def test_project_skips_nodes_without_the_memory_the_pod_declares() -> None:
    nodes = [_node("l4", L4_24GB, published_util=0.0), _node("a100", published_util=0.5)]
    pod = _pod(memory_mib=40_000, declares_memory=True)
    assert _pick("project", pod, nodes) == "a100"


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


def test_pod_annotations_use_the_scorer_hint_names() -> None:
    pod = _pod(chain=("A100", "V100"), fallback_utilization=0.8, declares_memory=True)
    prefix = DEFAULT_KEYS.prefix
    assert pod.annotations() == {
        prefix + "gpu-model-preference": "A100,V100",
        prefix + "gpu-fallback-utilization": "0.80",
        prefix + "min-gpu-memory-mib": "10000",
    }
    assert _pod().annotations() == {}


SMALL = PlacementConfig(nodes=10, duration_s=900.0, seed=5)


def test_stream_and_fleet_are_seeded() -> None:
    nodes = make_nodes(SMALL)
    assert nodes == make_nodes(SMALL)
    assert make_pods(SMALL, nodes) == make_pods(SMALL, make_nodes(SMALL))
    assert len({n.model.name for n in nodes}) == len(SMALL.pools)


@pytest.fixture(scope="module")
def small_runs() -> dict[str, dict[str, object]]:
    return {p: run(SMALL, p).summary() for p in POLICIES}


def test_every_pod_is_placed_or_pending(small_runs: dict[str, dict[str, object]]) -> None:
    for summary in small_runs.values():
        assert summary["placed"] + summary["pending_at_end"] == summary["pods"]  # type: ignore[operator]
        assert summary["above_limit_clear"] <= summary["above_limit"]  # type: ignore[operator]
        assert summary["chain_violations_clear"] <= summary["chain_violations"]  # type: ignore[operator]
    assert len({s["pods"] for s in small_runs.values()}) == 1


def test_runs_are_reproducible(small_runs: dict[str, dict[str, object]]) -> None:
    assert run(SMALL, "random").summary() == small_runs["random"]


def test_command_line_prints_every_policy(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--nodes", "5", "--duration-s", "300", "--policy", "random"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert list(out) == ["random"]


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
