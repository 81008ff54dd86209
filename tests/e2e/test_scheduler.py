"""The real kube-scheduler v1.37 with the real scorer as its extender, in both modes.

Each mode runs as its own pair: a `gpu-scorer` process and a kube-scheduler whose only profile
(`gpu-names` or `gpu-full`) calls it, `nodeCacheCapable: true` (names only; the scorer
list+watches the real API server) or `false` (full Node objects in every request). GPU state
is written onto the Nodes exactly as the agent writes it (its merge patch, its field manager).
"""

from __future__ import annotations

import dataclasses
import time
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime

import pytest

from gpu_contract.schema import DEFAULT_PREFIX, GpuState, NodeGpuState
from loopback_cluster.workload import (
    gpu_pod,
    gpu_state,
    pod_node,
    publish,
    running_pod,
    wait_for,
)
from tests.e2e.support import (
    Scope,
    ScorerStack,
    StackSpec,
    bound_nodes,
    stack_fixture,
    wait_failed_scheduling,
)

pytestmark = pytest.mark.e2e

# Full-node mode without credentials, as a deployment without RBAC runs it: no Pod watch.
stack = stack_fixture(StackSpec("gpu", in_flight=False))


def hint(name: str) -> str:
    return DEFAULT_PREFIX + name


def test_pods_land_where_the_rules_allow(stack: ScorerStack, scope: Scope) -> None:
    api = scope.api
    now = datetime.now(UTC)
    layout = {
        "cool": gpu_state(utilization=0.10, at=now),
        "warm": gpu_state(utilization=0.60, at=now),
        "hot": gpu_state(utilization=0.95, at=now),
        "scorching": gpu_state(utilization=0.10, temperature_c=88, at=now),
    }
    for short, state in layout.items():
        publish(api, scope.node(short), state)
    scope.settle()
    pods = [
        scope.pod(gpu_pod(scope.name(f"p{i}"), scheduler_name=stack.scheduler_name))
        for i in range(4)
    ]
    placed = bound_nodes(api, pods)
    # cool scores 9 of 10 and warm 5: weight 5 puts 200 points between them, far more than
    # the default plugins move for four small pods on a 96-CPU node.
    assert set(placed.values()) == {scope.name("cool")}, placed


def test_memory_hint_skips_nodes_without_a_big_enough_gpu(stack: ScorerStack, scope: Scope) -> None:
    api = scope.api
    publish(
        api, scope.node("fragmented"), gpu_state(utilization=0.05, memory_largest_free_mib=20_000)
    )
    publish(api, scope.node("roomy"), gpu_state(utilization=0.50, memory_largest_free_mib=81_000))
    scope.settle()
    pod = scope.pod(
        gpu_pod(
            scope.name("big"),
            scheduler_name=stack.scheduler_name,
            annotations={hint("min-gpu-memory-mib"): "60000"},
        )
    )
    assert bound_nodes(api, [pod]) == {pod: scope.name("roomy")}


def per_gpu_state(
    utilizations: list[float], *, at: datetime, allocated: list[bool] | None = None
) -> NodeGpuState:
    """A node's state with the per-GPU keys as the agent writes them, node-level values the
    summaries of the same GPUs; `allocated`: the kubelet's allocations (else none)."""
    mean = sum(utilizations) / len(utilizations)
    state = gpu_state(utilization=mean, gpu_count=len(utilizations), at=at)
    taken = allocated or [False] * len(utilizations)
    return dataclasses.replace(
        state,
        utilization_max=max(utilizations),
        gpus=tuple(GpuState(u, 81_000, 55, a) for u, a in zip(utilizations, taken, strict=True)),
    )


def _split_and_even(scope: Scope, *, busy_allocated: bool = True) -> tuple[str, str]:
    """Two 8-GPU nodes with the same node mean (0.35): four idle and four busy GPUs (0.70: one
    more pod's default own load, 0.50, takes a busy one over the 0.90 limit), or eight GPUs at
    0.35, each with room for that load. The node-level keys alone cannot tell them apart.
    `busy_allocated`: the kubelet's allocations account for the busy GPUs (their pods are
    known), so the device plugin hands out only the idle ones; else it may hand out any of the
    eight."""
    now = datetime.now(UTC)
    split = scope.node("split")
    even = scope.node("even")
    busy = [False] * 4 + [busy_allocated] * 4
    publish(scope.api, split, per_gpu_state([0.0] * 4 + [0.7] * 4, at=now, allocated=busy))
    publish(scope.api, even, per_gpu_state([0.35] * 8, at=now))
    scope.settle()
    return split, even


@dataclass(frozen=True)
class FourGpuCase:
    name: str
    busy_allocated: bool
    binds_to: str  # the short name of the node


FOUR_GPU_CASES = [
    # The split node offers exactly its four idle GPUs and scores higher (their headroom) than
    # the even one.
    FourGpuCase("busy-gpus-allocated", busy_allocated=True, binds_to="split"),
    # Nothing accounts for the busy GPUs: a device plugin blind to load hands out four of
    # the eight, all idle with a chance of 1 in 70, so only the even node is fit.
    FourGpuCase("busy-gpus-unaccounted", busy_allocated=False, binds_to="even"),
]


@pytest.mark.parametrize("case", FOUR_GPU_CASES, ids=lambda c: c.name)
def test_a_four_gpu_pod_goes_where_four_gpus_are_idle(
    stack: ScorerStack, scope: Scope, case: FourGpuCase
) -> None:
    _split_and_even(scope, busy_allocated=case.busy_allocated)
    pod = scope.pod(gpu_pod(scope.name("four"), scheduler_name=stack.scheduler_name, gpus=4))
    assert bound_nodes(scope.api, [pod]) == {pod: scope.name(case.binds_to)}


def test_a_five_gpu_pod_is_kept_off_a_node_with_four_usable_gpus(
    stack: ScorerStack, scope: Scope
) -> None:
    _, even = _split_and_even(scope)
    pod = scope.pod(gpu_pod(scope.name("five"), scheduler_name=stack.scheduler_name, gpus=5))
    assert bound_nodes(scope.api, [pod]) == {pod: even}


def test_model_chain_falls_back_when_every_preferred_node_is_busy(
    stack: ScorerStack, scope: Scope
) -> None:
    api = scope.api
    a100 = scope.node("a100", product="NVIDIA-A100-SXM4-80GB")
    v100 = scope.node("v100", product="Tesla-V100-SXM2-32GB")
    publish(api, a100, gpu_state(utilization=0.85, gpu_model="NVIDIA-A100-SXM4-80GB"))
    publish(api, v100, gpu_state(utilization=0.20, gpu_model="Tesla-V100-SXM2-32GB"))
    scope.settle()
    chain = {hint("gpu-model-preference"): "A100,V100", hint("gpu-fallback-utilization"): "0.80"}
    first = scope.pod(
        gpu_pod(scope.name("chain-1"), scheduler_name=stack.scheduler_name, annotations=chain)
    )
    assert bound_nodes(api, [first]) == {first: v100}

    # Once an A100 node is below the threshold again, the chain keeps its first choice.
    publish(api, a100, gpu_state(utilization=0.40, gpu_model="NVIDIA-A100-SXM4-80GB"))
    scope.settle()
    second = scope.pod(
        gpu_pod(scope.name("chain-2"), scheduler_name=stack.scheduler_name, annotations=chain)
    )
    assert bound_nodes(api, [second]) == {second: a100}


def test_rejections_aggregate_into_one_reason_and_the_pod_binds_once_a_node_cools(
    stack: ScorerStack, scope: Scope
) -> None:
    api = scope.api
    nodes = [scope.node(f"busy-{i}") for i in range(3)]
    for node, utilization in zip(nodes, (0.93, 0.96, 0.99), strict=True):
        publish(api, node, gpu_state(utilization=utilization))
    scope.settle()
    pod = scope.pod(gpu_pod(scope.name("waiting"), scheduler_name=stack.scheduler_name))

    # One uniform text per rule and limit: kube-scheduler counts the three nodes under it.
    wait_failed_scheduling(
        api, pod, starting_with="0/3 nodes are available: 3 gpu utilization above 0.90."
    )
    assert pod_node(api, pod) is None

    cooled = time.monotonic()

    # A node annotation change requeues the unschedulable pod at once (not after the 5-minute
    # flush). In names-only mode the scheduler can retry before the scorer's own watch has the
    # change (two watches, no order between them); the pod then waits for the next Node write,
    # which in a fleet comes within seconds. The cooled node's agent keeps writing here too.
    written = [cooled]

    def bound() -> str | None:
        node = pod_node(api, pod)
        if node is None and time.monotonic() - written[-1] > 2.0:
            publish(api, nodes[1], gpu_state(utilization=0.30))
            written.append(time.monotonic())
        return node

    publish(api, nodes[1], gpu_state(utilization=0.30))
    assert wait_for("the pod to bind", bound, timeout_s=10, interval_s=0.25) == nodes[1]
    assert time.monotonic() - cooled < 10


def test_full_node_mode_hides_running_pods_from_the_default_scores(
    stack: ScorerStack, scope: Scope
) -> None:
    """kube-scheduler (v1.36, v1.37) rebuilds each feasible node's NodeInfo from the Node object a
    full-node extender returns (`HTTPExtender.Filter`: `NewNodeInfo()` + `SetNode`), without the
    node's pods, so NodeResourcesFit no longer sees that one node is three quarters full."""
    api = scope.api
    # 16 GPUs each (a DGX-2 shape), so the twelve pods fit on either node alone.
    busy = scope.node("busy", cpu="31", gpus=16)
    empty = scope.node("empty", cpu="31", gpus=16)
    for node in (busy, empty):
        publish(api, node, gpu_state(utilization=0.20, gpu_count=16))
    for i in range(4):  # 24 of the busy node's 31 CPUs requested by running pods
        name = scope.name(f"cpu-{i}")
        api.create("/api/v1/namespaces/default/pods", running_pod(name, node_name=busy, cpu="6"))
        scope.pods.append(name)
    scope.settle()

    # Pods that declare no GPU load: the scorer's in-flight accounting adds none to the node
    # they land on, so its scores stay level and only the default plugins tell the nodes apart.
    no_load = {hint("expected-gpu-load"): "0"}
    pods = [
        scope.pod(
            gpu_pod(
                scope.name(f"gpu-{i}"), scheduler_name=stack.scheduler_name, annotations=no_load
            )
        )
        for i in range(12)
    ]
    placed = Counter(bound_nodes(api, pods).values())
    if stack.names_only:
        assert placed == {empty: 12}
    else:
        # Both nodes look empty to the default score plugins; ties go either way (each pod
        # lands on the busy node with even odds: all 12 avoiding it has odds of 1 in 4096).
        assert placed[busy] >= 1, placed
