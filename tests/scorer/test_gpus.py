"""The k-GPU rule: a pod asking k GPUs on a node that publishes per-GPU data, one named case each.

Nodes are annotated by the real agent aggregation (`gpu_node`), so the node-level keys are the
summaries the agent writes beside the per-GPU keys, and every case also shows what the
node-level rules alone would have said.
"""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exporter_scheduler.core.judge import evaluate
from exporter_scheduler.core.policy import Policy
from exporter_scheduler.core.records import (
    BASIS_POINTS,
    NodeInput,
    NodeVerdict,
    PodInput,
    ScoreBreakdown,
)
from gpu_contract.schema import DEFAULT_KEYS, Field, Health
from tests.scorer.scoring_builders import (
    NOW,
    STRICT,
    V100,
    Gpu,
    gpu_node,
    node,
    one,
    pod,
    run,
    runs,
    without_per_gpu,
)

MEMORY = DEFAULT_KEYS.prefix + "min-gpu-memory-mib"
IDLE = Gpu(utilization=0.0)
HALF = Gpu(utilization=0.50)
SATURATED = Gpu(utilization=0.97)
LENIENT = Policy(own_load=False)

FOUR_IDLE_FOUR_SATURATED = gpu_node("split", runs((4, IDLE), (4, SATURATED)))
ALL_HALF_BUSY = gpu_node("even", runs((8, HALF)))
# 7 GPUs at 1.00 and one at 0.25: the node mean (0.91) is above the 0.90 limit.
ONE_FREE_IN_A_BUSY_NODE = gpu_node(
    "busy", runs((1, Gpu(utilization=0.25)), (7, Gpu(utilization=1.0)))
)
MIG_AND_THREE = gpu_node(
    "mig", (Gpu(free_mib=40_960, mig_slice_mib=20_480), *runs((3, Gpu(utilization=0.10))))
)

CASES = [
    pytest.param(
        FOUR_IDLE_FOUR_SATURATED, pod(gpus=4), LENIENT, True, None, False, (0, 1, 2, 3),
        id="4-idle-4-saturated-k4-passes",
    ),
    pytest.param(
        FOUR_IDLE_FOUR_SATURATED, pod(gpus=5), LENIENT, False,
        "fewer than 5 gpus at or below utilization 0.90", False, (),
        id="4-idle-4-saturated-k5-fails",
    ),
    pytest.param(
        ALL_HALF_BUSY, pod(gpus=4), LENIENT, True, None, False, (0, 1, 2, 3),
        id="all-half-busy-k4-passes",
    ),
    pytest.param(
        ALL_HALF_BUSY, pod(gpus=8), LENIENT, True, None, False, tuple(range(8)),
        id="all-half-busy-k8-passes",
    ),
    pytest.param(
        ONE_FREE_IN_A_BUSY_NODE, pod(gpus=1), LENIENT, True, None, False, (0,),
        id="node-mean-above-limit-one-gpu-free-k1-passes",
    ),
    pytest.param(
        ONE_FREE_IN_A_BUSY_NODE, pod(gpus=2), LENIENT, False,
        "fewer than 2 gpus at or below utilization 0.90", False, (),
        id="node-mean-above-limit-k2-fails",
    ),
    pytest.param(
        ONE_FREE_IN_A_BUSY_NODE, pod(gpus=0), LENIENT, False, "gpu utilization above 0.90",
        False, None, id="k0-no-gpu-request-judged-by-node-level-rules",
    ),
    pytest.param(
        gpu_node("mem", [Gpu(free_mib=m) for m in (81_000, 20_000, 30_000, 10_000)]),
        pod(gpus=2, min_memory_mib="40000"), LENIENT, False,
        "fewer than 2 gpus with 40000MiB free", False, (),
        id="memory-per-gpu-one-big-gpu-is-not-two",
    ),
    pytest.param(
        gpu_node("mem", [Gpu(free_mib=m) for m in (81_000, 20_000, 45_000, 10_000)]),
        pod(gpus=2, min_memory_mib="40000"), LENIENT, True, None, False, (0, 2),
        id="memory-per-gpu-two-big-gpus",
    ),
    pytest.param(
        gpu_node("mem", [Gpu(free_mib=m) for m in (81_000, 20_000)]),
        pod(gpus=1, min_memory_mib="40000"), LENIENT, True, None, False, (0,),
        id="memory-per-gpu-k1-like-the-node-level-rule",
    ),
    pytest.param(
        gpu_node("alloc", runs((5, Gpu(allocated=True)), (3, Gpu(allocated=False)))),
        pod(gpus=4), LENIENT, False, "fewer than 4 unallocated gpus", False, (),
        id="allocated-gpus-are-not-candidates",
    ),
    pytest.param(
        gpu_node("alloc", runs((5, Gpu(allocated=True)), (3, Gpu(allocated=False)))),
        pod(gpus=3), LENIENT, True, None, False, (5, 6, 7),
        id="unallocated-gpus-enough",
    ),
    pytest.param(
        gpu_node("alloc", runs((2, Gpu(allocated=False)), (2, Gpu(offered=False)))),
        pod(gpus=3), LENIENT, False, "fewer than 3 unallocated gpus", False, (),
        id="gpu-the-kubelet-does-not-offer-is-not-free",
    ),
    pytest.param(
        gpu_node("alloc", runs((2, Gpu(allocated=False)), (2, Gpu(offered=False)))),
        pod(gpus=3), STRICT, False, "fewer than 3 unallocated gpus", False, (),
        id="gpu-the-kubelet-does-not-offer-strict-the-same",
    ),
    pytest.param(
        gpu_node("noalloc", runs((4, IDLE))), pod(gpus=4), STRICT, True, None, False,
        (0, 1, 2, 3), id="allocation-not-published-is-not-checked-even-strict",
    ),
    pytest.param(
        gpu_node("warm", [Gpu(temperature_c=t) for t in (90, 50, 52, 50)]), pod(gpus=3),
        LENIENT, False, "gpu temperature at or above 85C", False, (),
        id="one-hot-gpu-fails-the-node-level-temperature-rule",
    ),
    pytest.param(
        gpu_node("warm", [Gpu(temperature_c=t) for t in (88, 85, 60, 50)],
                 overrides={Field.TEMPERATURE: None}),
        pod(gpus=3), LENIENT, False, "fewer than 3 gpus below temperature 85C", False, (),
        id="per-gpu-temperature-at-limit-is-not-a-candidate",
    ),
    pytest.param(
        gpu_node("warm", [Gpu(temperature_c=t) for t in (88, 85, 60, 50)],
                 overrides={Field.TEMPERATURE: None}),
        pod(gpus=2), LENIENT, True, None, False, (3, 2),
        id="per-gpu-temperature-cooler-gpus-count",
    ),
    pytest.param(
        gpu_node("unk", [Gpu(temperature_c=None), Gpu(utilization=0.10)]), pod(gpus=2),
        LENIENT, True, None, False, (1, 0), id="unmeasured-temperature-lenient-counts",
    ),
    pytest.param(
        gpu_node("unk", [Gpu(temperature_c=None), Gpu(utilization=0.10)]), pod(gpus=2),
        STRICT, False, "fewer than 2 gpus measured", True, (),
        id="unmeasured-temperature-strict-does-not",
    ),
    pytest.param(
        gpu_node("unk", [Gpu(free_mib=None), Gpu()]), pod(gpus=2, min_memory_mib="1000"),
        STRICT, False, "fewer than 2 gpus measured", True, (),
        id="unmeasured-memory-strict-when-the-pod-asks-memory",
    ),
    pytest.param(
        gpu_node("unk", [Gpu(free_mib=None), Gpu()]), pod(gpus=2), STRICT, True, None, False,
        (0, 1), id="unmeasured-memory-strict-without-a-memory-hint",
    ),
    pytest.param(
        gpu_node("lost", runs((3, IDLE), (1, Gpu(lost=True)))), pod(gpus=4), LENIENT, False,
        "fewer than 4 gpus measured", True, (), id="lost-gpu-is-never-a-candidate",
    ),
    pytest.param(
        gpu_node("lost", runs((3, IDLE), (1, Gpu(lost=True)))), pod(gpus=3), LENIENT, True,
        None, False, (0, 1, 2), id="lost-gpu-leaves-enough",
    ),
    pytest.param(
        gpu_node("small", runs((4, IDLE))), pod(gpus=8), LENIENT, False,
        "fewer than 8 gpus on the node", True, (), id="k-larger-than-gpu-count",
    ),
    pytest.param(
        MIG_AND_THREE, pod(gpus=4, min_memory_mib="20000"), LENIENT, True, None, False,
        (1, 2, 3, 0), id="mig-gpu-lenient-no-utilization-scores-last",
    ),
    pytest.param(
        MIG_AND_THREE, pod(gpus=4, min_memory_mib="20000"), STRICT, False,
        "fewer than 4 gpus measured", True, (), id="mig-gpu-strict-utilization-unknown",
    ),
    pytest.param(
        MIG_AND_THREE, pod(gpus=4, min_memory_mib="30000"), LENIENT, False,
        "fewer than 4 gpus with 30000MiB free", False, (),
        id="mig-gpu-largest-slice-is-its-memory",
    ),
    pytest.param(
        gpu_node("hint", runs((4, Gpu(utilization=0.60)), (4, Gpu(utilization=0.20)))),
        pod(gpus=5, max_utilization="0.50"), LENIENT, False,
        "fewer than 5 gpus at or below utilization 0.50", False, (),
        id="max-utilization-hint-tightens-per-gpu",
    ),
    pytest.param(
        gpu_node("order", [
            *runs((3, Gpu(allocated=True)), (2, Gpu(utilization=0.95, allocated=False))),
            Gpu(free_mib=1_000, allocated=False), *runs((2, Gpu(allocated=False))),
        ]),
        pod(gpus=4, min_memory_mib="10000"), LENIENT, False,
        "fewer than 4 gpus at or below utilization 0.90", False, (),
        id="first-criterion-leaving-fewer-than-k-names-the-reason",
    ),
    pytest.param(
        gpu_node("order", [
            *runs((3, Gpu(allocated=True)), (1, Gpu(utilization=0.95, allocated=False))),
            Gpu(free_mib=1_000, allocated=False), *runs((3, Gpu(allocated=False))),
        ]),
        pod(gpus=4, min_memory_mib="10000"), LENIENT, False,
        "fewer than 4 gpus with 10000MiB free", False, (), id="criteria-count-cumulatively",
    ),
    pytest.param(
        gpu_node("sick", runs((4, IDLE)), overrides={Field.HEALTH: "unavailable"}), pod(gpus=8),
        LENIENT, False, "gpu health unavailable", True, (),
        id="health-rule-comes-before-the-gpus-rule",
    ),
    pytest.param(
        gpu_node("idle", runs((4, IDLE))), pod(gpus=1, extra={
            DEFAULT_KEYS.prefix + "min-gpu-memory-mib": "90000",
            DEFAULT_KEYS.prefix + "gpu-model-preference": "V100",
        }), LENIENT, False, "gpu model not in preference list", True, (),
        id="model-rule-comes-before-the-gpus-rule",
    ),
    pytest.param(
        gpu_node("nonode", runs((4, IDLE)), overrides={Field.UTILIZATION: None}), pod(gpus=2),
        LENIENT, True, "gpu data missing", False, (0, 1),
        id="node-utilization-missing-lenient-passes-unscored",
    ),
    pytest.param(
        gpu_node("nonode", runs((4, Gpu(allocated=True))), overrides={Field.UTILIZATION: None}),
        pod(gpus=2), LENIENT, False, "fewer than 2 unallocated gpus", False, (),
        id="node-utilization-missing-gpus-rule-still-rejects",
    ),
    pytest.param(
        gpu_node("nonode", runs((4, IDLE)), overrides={Field.UTILIZATION: None}), pod(gpus=2),
        STRICT, False, "gpu data missing", True, (),
        id="node-utilization-missing-strict",
    ),
]  # fmt: skip


@pytest.mark.parametrize(
    ("the_node", "the_pod", "policy", "passed", "reason", "unresolvable", "counted"), CASES
)
def test_gpus_rule(  # noqa: PLR0917 (one parameter per column of the table)
    the_node: NodeInput,
    the_pod: PodInput,
    policy: Policy,
    passed: bool,
    reason: str | None,
    unresolvable: bool,
    counted: tuple[int, ...] | None,
) -> None:
    verdict = one(the_node, the_pod, policy)
    assert (verdict.passed, verdict.reason) == (passed, reason)
    assert verdict.unresolvable is (unresolvable and not passed)
    if counted is None:
        assert verdict.gpus is None
        assert verdict.rules.gpus.outcome == "not-checked"
        return
    assert verdict.gpus is not None
    assert verdict.gpus.needed == the_pod.gpu_request
    if passed:
        assert verdict.gpus.counted == counted
    if not passed and verdict.reason is not None and verdict.reason.startswith(("no ", "fewer")):
        assert verdict.gpus.candidates < the_pod.gpu_request
        assert verdict.gpus.counted == ()
    # The node-level rules the k-GPU rule takes over say so; the temperature rule stays.
    outcomes = {r.rule: r.outcome for r in verdict.rules}
    assert outcomes["temperature"] != "per-gpu"
    assert outcomes["memory"] == ("per-gpu" if the_pod.annotations.get(MEMORY) else "not-checked")
    if verdict.data_status == "fresh":
        assert outcomes["utilization"] == "per-gpu"


def test_idle_gpus_beat_the_same_node_mean_spread_thin() -> None:
    """Four idle and four saturated GPUs against eight half-busy ones: both nodes read
    `utilization: 0.50`-ish; the 4-GPU pod prefers the node whose 4 GPUs are idle, and the
    node-level scorer cannot tell them apart."""
    split = one(FOUR_IDLE_FOUR_SATURATED, pod(gpus=4))
    even = one(ALL_HALF_BUSY, pod(gpus=4))
    assert split.score > even.score
    assert split.breakdown is not None
    assert split.breakdown.utilization_headroom_bp == BASIS_POINTS
    old_split = one(without_per_gpu(FOUR_IDLE_FOUR_SATURATED), pod(gpus=4))
    old_even = one(without_per_gpu(ALL_HALF_BUSY), pod(gpus=4))
    assert abs(old_split.score - old_even.score) <= 1  # node means 0.48 and 0.50


def test_worked_example_from_the_docs() -> None:
    """docs/scoring.md's per-GPU example (the README's node), digit for digit."""
    utilization = (0.97, 0.93, 0.00, 0.01, 0.90, 0.02, 0.45, 0.08)
    free_mib = (1_024, 2_048, 81_251, 60_000, 4_096, 40_000, 12_000, 12_573)
    temperature_c = (64, 63, 38, 41, 62, 40, 55, 44)
    allocated = (True, True, False, True, True, False, True, False)
    columns = zip(utilization, free_mib, temperature_c, allocated, strict=True)
    table = [Gpu(*values) for values in columns]
    the_node = gpu_node("gpu-node-1", table)
    published = {
        f.value: the_node.annotations[DEFAULT_KEYS[f]]
        for f in (Field.UTILIZATION, Field.MEMORY_FRAGMENTATION, Field.PER_GPU_ALLOCATED)
    }
    assert published == {
        "utilization": "0.42",
        "memory-fragmentation": "0.62",
        "per-gpu-allocated": "1,1,0,1,1,0,1,0",
    }
    verdict = one(the_node, pod(gpus=2, min_memory_mib="40000"))
    assert verdict.gpus is not None
    assert verdict.gpus.status == (
        "allocated", "allocated", "candidate", "allocated",
        "allocated", "candidate", "allocated", "memory",
    )  # fmt: skip
    # The device plugin hands out any 2 of the 3 unallocated GPUs: 1 pair in 3 has the memory.
    assert (verdict.gpus.pool, verdict.gpus.fit_bp) == (3, 3333)
    assert verdict.reason == "gpu fit probability below 0.75"
    assert not verdict.unresolvable
    # Without the memory hint every GPU of the pool is a candidate: the expected headroom is
    # the pool's mean.
    fits = one(the_node, pod(gpus=2))
    assert fits.gpus is not None
    assert (fits.gpus.pool, fits.gpus.fit_bp, fits.gpus.counted) == (3, 10_000, (2, 5, 7))
    assert fits.breakdown == ScoreBreakdown(
        utilization_headroom_bp=9667,  # (10000 + 9800 + 9200) / 3
        fragmentation_headroom_bp=3800,  # 1 - 0.62
        temperature_headroom_bp=10000,  # 38, 40 and 44 C: all 40 C or more below 85 C
        percent_bp=8837,
        score=9,
    )
    three = one(the_node, pod(gpus=3, min_memory_mib="40000"))
    assert three.reason == "fewer than 3 gpus with 40000MiB free"
    # The node-level rules alone pass it: one GPU has 81251 MiB free, the mean is 0.42.
    assert one(without_per_gpu(the_node), pod(gpus=3, min_memory_mib="40000")).passed
    assert one(the_node, pod(gpus=4)).reason == "fewer than 4 unallocated gpus"


def test_best_candidates_by_headroom_ties_by_index() -> None:
    table = [Gpu(utilization=u) for u in (0.50, 0.10, 0.30, 0.10, 0.10)]
    verdict = one(gpu_node("n", table), pod(gpus=2))
    assert verdict.gpus is not None
    assert verdict.gpus.counted == (1, 3)
    # Temperature counts too, under its weight: a cooler GPU of the same load is better.
    table = [Gpu(utilization=0.10, temperature_c=t) for t in (70, 45, 60)]
    verdict = one(gpu_node("n", table), pod(gpus=2))
    assert verdict.gpus is not None
    assert verdict.gpus.counted == (1, 2)


def test_means_over_the_counted_gpus_round_half_up() -> None:
    """Integer means in basis points: 29900 / 3 = 9966.67 -> 9967; 250 + 500 + 500 = 1250 / 3
    = 416.67 -> 417 (temperatures 84, 83, 83 C against 85 C)."""
    table = [Gpu(utilization=u, temperature_c=t) for u, t in ((0.0, 84), (0.0, 83), (0.01, 83))]
    verdict = one(gpu_node("n", table), pod(gpus=3))
    assert verdict.breakdown is not None
    assert verdict.breakdown.utilization_headroom_bp == 9967
    assert verdict.breakdown.temperature_headroom_bp == 417


def test_reasons_are_uniform_across_nodes() -> None:
    """One text per rule, limit and k: nodes short in different ways on the same criterion
    aggregate under one reason in the pod's event."""
    nodes = [gpu_node(f"n{i}", runs((i, IDLE), (8 - i, SATURATED))) for i in range(4)]
    evaluation = run(nodes, pod(gpus=4))
    assert set(evaluation.failed().values()) == {"fewer than 4 gpus at or below utilization 0.90"}
    assert run(nodes, pod(gpus=1)).failed() == {"n0": "no gpu at or below utilization 0.90"}


def test_a_node_without_per_gpu_keys_is_judged_as_before() -> None:
    """An agent (or a hand-written node) without per-GPU keys: the node-level rules alone, the
    old reason texts, and the `gpus` rule not checked, whatever k."""
    old = node(utilization=0.95)
    for k in (0, 1, 4):
        verdict = one(old, pod(gpus=k))
        assert (verdict.passed, verdict.reason, verdict.gpus) == (
            False,
            "gpu utilization above 0.90",
            None,
        )
        assert [r.outcome for r in verdict.rules][-1] == "not-checked"
    memory = one(node(largest_free_mib=30_000), pod(gpus=4, min_memory_mib="40000"))
    assert memory.reason == "gpu memory below 40000MiB free on one gpu"


def test_old_readers_keep_working_on_per_gpu_nodes() -> None:
    """The pre-version-1 reader parses `utilization` alone: the agent's node-level keys are the
    summaries of the per-GPU ones, so that reader still sees the node mean."""
    annotations = FOUR_IDLE_FOUR_SATURATED.annotations
    utilization = float(annotations[DEFAULT_KEYS[Field.UTILIZATION]])
    per_gpu = [float(v) for v in annotations[DEFAULT_KEYS[Field.PER_GPU_UTILIZATION]].split(",")]
    assert utilization == round(sum(per_gpu) / len(per_gpu), 2)
    assert (1 - utilization) * 100 == pytest.approx(52.0)  # mean 0.485, written 0.48


def test_verdicts_depend_on_k_so_the_pod_class_carries_it() -> None:
    policy = Policy(own_load=False)
    from exporter_scheduler.core.podclass import PodClass  # noqa: PLC0415

    assert PodClass.of(pod(gpus=4), policy).key != PodClass.of(pod(gpus=5), policy).key
    four = evaluate(pod(gpus=4), [FOUR_IDLE_FOUR_SATURATED], NOW, policy)
    five = evaluate(pod(gpus=5), [FOUR_IDLE_FOUR_SATURATED], NOW, policy)
    assert (four.passed_names(), five.passed_names()) == (["split"], [])


# ----------------------------------------------------------------------------- the chain


def test_chain_reads_the_per_gpu_view() -> None:
    """The chain "A100, V100 when every A100 node is above 0.80": the A100 node's mean (0.88) is
    above the threshold, yet it has an idle GPU, which is what a 1-GPU pod gets."""
    a100 = gpu_node("a100", runs((1, IDLE), (7, Gpu(utilization=1.0))))
    assert a100.annotations[DEFAULT_KEYS[Field.UTILIZATION]] == "0.88"
    v100 = gpu_node("v100", runs((8, Gpu(utilization=0.20))), product="Tesla V100-SXM2-16GB")
    assert v100.annotations[DEFAULT_KEYS[Field.GPU_MODEL]] == V100
    chain = {"preference": "A100,V100", "fallback": "0.80"}
    one_gpu = run([a100, v100], pod(gpus=1, **chain))
    assert one_gpu.chain is not None
    assert (one_gpu.chain.chosen, one_gpu.chain.basis) == ("A100", "at-or-below-threshold")
    assert one_gpu.passed_names() == ["a100"]
    # Two GPUs: the A100 node has one candidate only; the chain falls back to V100.
    two_gpus = run([a100, v100], pod(gpus=2, **chain))
    assert two_gpus.chain is not None
    assert two_gpus.chain.chosen == "V100"
    assert two_gpus.passed_names() == ["v100"]
    # The node-level view (per-GPU keys dropped): 0.88 is above the threshold.
    old = run([without_per_gpu(a100), v100], pod(gpus=1, **chain))
    assert old.chain is not None
    assert old.chain.basis == "at-or-below-threshold"
    assert old.chain.chosen == "V100"


def test_candidates_above_the_threshold_do_not_count_for_the_chain() -> None:
    a100 = gpu_node("a100", runs((2, Gpu(utilization=0.85))))
    v100 = gpu_node("v100", runs((2, Gpu(utilization=0.85))), product="Tesla V100-SXM2-16GB")
    evaluation = run([a100, v100], pod(gpus=2, preference="A100,V100", fallback="0.80"))
    assert evaluation.chain is not None
    assert (evaluation.chain.chosen, evaluation.chain.basis) == ("A100", "all-above-threshold")


# ----------------------------------------------------------------------------- properties

_GPU = st.builds(
    Gpu,
    utilization=st.one_of(st.none(), st.sampled_from([0.0, 0.3, 0.5, 0.85, 0.9, 0.91, 1.0])),
    free_mib=st.one_of(st.none(), st.sampled_from([0, 10_000, 40_000, 80_000])),
    temperature_c=st.one_of(st.none(), st.sampled_from([30, 60, 84, 85, 95])),
    allocated=st.sampled_from([None, False, True]),
    offered=st.booleans(),
    lost=st.sampled_from([False, False, False, True]),
)
_TABLE = st.lists(_GPU, min_size=1, max_size=8)
_HINT = st.sampled_from([None, "10000", "40000"])


def _gpu_pod(k: int, memory: str | None) -> PodInput:
    return pod(gpus=k, min_memory_mib=memory)


def _verdict(table: list[Gpu], k: int, memory: str | None, policy: Policy) -> NodeVerdict:
    return one(gpu_node("n", table), _gpu_pod(k, memory), policy)


@settings(max_examples=300, deadline=None)
@given(_TABLE, st.integers(1, 9), _HINT, st.sampled_from([LENIENT, STRICT]))
def test_passes_exactly_with_k_candidates_and_scores_the_best_k(
    table: list[Gpu], k: int, memory: str | None, policy: Policy
) -> None:
    verdict = _verdict(table, k, memory, policy)
    if verdict.gpus is None:  # no GPU with an NVML value: nothing per GPU to judge
        assert all(
            g.lost or (g.utilization is None and g.free_mib is None and g.temperature_c is None)
            for g in table
        )
        return
    check = verdict.gpus
    assert len(check.status) == len(table)
    assert check.candidates == check.status.count("candidate")
    gpus_rule = verdict.rules.gpus
    fits = check.fit_bp is None or check.fit_bp >= round(policy.min_gpu_fit_probability * 10_000)
    assert gpus_rule.outcome == ("pass" if check.candidates >= k and fits else "fail")
    if check.candidates < k:
        assert not verdict.passed
        assert check.counted == ()
        return
    if check.allocation_checked and policy.blind_device_plugin:
        # A blind device plugin: every candidate of its pool counts, the chance is exact.
        assert check.pool is not None
        assert check.fit_bp == math.comb(check.candidates, k) * 10_000 // math.comb(check.pool, k)
        assert check.counted == tuple(i for i, s in enumerate(check.status) if s == "candidate")
        return
    assert len(check.counted) == k
    assert all(check.status[i] == "candidate" for i in check.counted)
    assert all(not table[i].lost for i in check.counted)
    if verdict.breakdown is not None:
        # No other k candidates have more weighted headroom than the counted ones.
        candidates = [i for i, s in enumerate(check.status) if s == "candidate"]

        def merit(i: int) -> int:
            g = table[i]
            util = 0 if g.utilization is None else BASIS_POINTS - round(g.utilization * 10_000)
            temp = (
                0
                if g.temperature_c is None
                else max(0, min(BASIS_POINTS, (85 - g.temperature_c) * BASIS_POINTS // 40))
            )
            return 700 * util + 150 * temp

        best = sum(map(merit, check.counted))
        for other in itertools.islice(itertools.combinations(candidates, k), 200):
            assert sum(map(merit, other)) <= best


@settings(max_examples=200, deadline=None)
@given(_TABLE, st.integers(0, 8), st.integers(1, 8), _HINT, st.sampled_from([LENIENT, STRICT]))
def test_a_busier_gpu_never_adds_candidates(
    table: list[Gpu], index: int, k: int, memory: str | None, policy: Policy
) -> None:
    index %= len(table)
    busier = list(table)
    busier[index] = Gpu(
        1.0, table[index].free_mib, table[index].temperature_c, table[index].allocated,
        table[index].offered, lost=table[index].lost,
    )  # fmt: skip
    before = _verdict(table, k, memory, policy)
    after = _verdict(busier, k, memory, policy)
    if before.gpus is not None and after.gpus is not None:
        assert after.gpus.candidates <= before.gpus.candidates
        assert not (after.passed and not before.passed)


@settings(max_examples=200, deadline=None)
@given(
    st.sampled_from([0.0, 0.2, 0.5, 0.9, 0.95]),
    st.sampled_from([30, 60, 85, 90]),
    st.sampled_from([10_000, 40_000, 80_000]),
    st.integers(1, 8),
    st.integers(1, 8),
    _HINT,
)
def test_a_uniform_node_gets_the_node_level_verdict_and_score(  # noqa: PLR0917
    utilization: float, temperature_c: int, free_mib: int, n: int, k: int, memory: str | None
) -> None:
    """All GPUs alike: the mean, the maxima and each GPU are the same numbers, so the k-GPU
    rule and the node-level rules agree, score included (for k up to the GPU count)."""
    the_node = gpu_node("n", runs((n, Gpu(utilization, free_mib, temperature_c))))
    per_gpu = one(the_node, _gpu_pod(k, memory))
    node_level = one(without_per_gpu(the_node), _gpu_pod(k, memory))
    if k > n:  # more GPUs than the node has: rejected (by this or an earlier rule)
        assert not per_gpu.passed
        return
    assert per_gpu.passed == node_level.passed
    assert per_gpu.score == node_level.score
    assert per_gpu.breakdown == node_level.breakdown


@settings(max_examples=100, deadline=None)
@given(_TABLE, _HINT, st.sampled_from([LENIENT, STRICT]))
def test_a_pod_without_gpus_ignores_per_gpu_keys(
    table: list[Gpu], memory: str | None, policy: Policy
) -> None:
    the_node = gpu_node("n", table)
    with_keys = one(the_node, _gpu_pod(0, memory), policy)
    without = one(without_per_gpu(the_node), _gpu_pod(0, memory), policy)
    # Only the decoded inputs differ (they hold the per-GPU table).
    assert (
        with_keys.passed,
        with_keys.reason,
        with_keys.score,
        with_keys.rules,
        with_keys.gpus,
    ) == (without.passed, without.reason, without.score, without.rules, None)


def test_unknown_health_value_reads_degraded_and_still_judges_gpus() -> None:
    the_node = gpu_node("n", runs((2, IDLE)), overrides={Field.HEALTH: "weird"})
    verdict = one(the_node, pod(gpus=2))
    assert verdict.inputs.state is not None
    assert verdict.inputs.state.health is Health.DEGRADED
    assert verdict.passed
    assert verdict.gpus is not None
