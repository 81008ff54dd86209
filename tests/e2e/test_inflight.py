"""In-flight accounting on the real control plane: pods bound since a node's data was sampled.

The real kube-scheduler v1.37 with the real scorer as its extender, in both modes (names only,
the scorer's node cache; full Node objects), each scorer with its pod watch. There is no
kubelet: a bound pod stays Pending, and the tests write its status as the kubelet would
(`report_pod_status`), and the node's GPU data as the agent would (`publish`), to show when
a pod stops counting. Which pods a verdict counted on a node is read from the scorer's
`/explain`, with the same request the scheduler sends.

The layout most tests share: two 8-GPU nodes. `mixed` has four idle GPUs and four saturated
ones; `even` has eight GPUs at 0.35, each with room for one more pod. Where the kubelet's
allocations account for the saturated GPUs, `mixed` offers four idle GPUs and scores higher
than `even`; where they do not, a device plugin blind to load may hand out a saturated one.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from gpu_contract.schema import format_timestamp
from loopback_cluster.control_plane import (
    SERVICE_ACCOUNT_ISSUER,
    ControlPlane,
    ExtenderConfig,
    KubeApi,
    SchedulerConfig,
)
from loopback_cluster.workload import (
    apply,
    delete_pods,
    gpu_pod,
    per_gpu_node_state,
    placed_gpu_pod,
    publish,
    report_pod_status,
    running,
    scorer_process,
    service_account_token,
    wait_for,
)
from tests.e2e.support import (
    INFLIGHT_ACCOUNTING,
    WATCH_SYNC_S,
    Scope,
    ScorerStack,
    StackSpec,
    bound_nodes,
    explain_nodes,
    inflight_refs,
    stack_fixture,
)

pytestmark = pytest.mark.e2e

GPUS = 8
# `even`'s GPUs leave room for a pod's default own load (0.50) under the 0.90 limit.
IDLE, SATURATED, EVEN = 0.0, 1.0, 0.35
# The scorer's pod watch sees a pod within milliseconds on loopback; this is the deadline.
WATCH_S = WATCH_SYNC_S
# `/explain`'s nodes by name.
Explanation = dict[str, dict[str, Any]]


# Both modes with credentials: the full-node scorer needs them for its pod watch alone.
stack = stack_fixture(StackSpec("inflight"))


# ----------------------------------------------------------------------------- helpers


def lay_out(scope: Scope, *, saturated_allocated: bool, at: datetime) -> tuple[str, str]:
    """The `mixed` and `even` nodes with per-GPU data sampled `at`, allocations published."""
    mixed, even = scope.node("mixed", gpus=GPUS), scope.node("even", gpus=GPUS)
    half = GPUS // 2
    publish(
        scope.api,
        mixed,
        per_gpu_node_state(
            [(IDLE, False)] * half + [(SATURATED, saturated_allocated)] * half, at=at
        ),
    )
    publish(scope.api, even, per_gpu_node_state([(EVEN, False)] * GPUS, at=at))
    return mixed, even


def probe(scope: Scope, stack: ScorerStack) -> dict[str, Any]:
    """A one-GPU pod like the tests' own, never created: what `/explain` is asked about."""
    return gpu_pod(scope.name("probe"), scheduler_name=stack.scheduler_name)


def explained(stack: ScorerStack, scope: Scope, nodes: list[str]) -> Explanation:
    return explain_nodes(
        stack.scorer.url, scope.api, probe(scope, stack), nodes, names_only=stack.names_only
    )


def wait_explained(
    what: str,
    stack: ScorerStack,
    scope: Scope,
    nodes: list[str],
    holds: Callable[[Explanation], bool],
) -> Explanation:
    """The explanation once `holds(explanation)` is true (the scorer's watches caught up)."""

    def probe_once() -> Explanation | None:
        document = explained(stack, scope, nodes)
        return document if holds(document) else None

    return wait_for(what, probe_once, timeout_s=WATCH_S, interval_s=0.1)


def data_seen(updated_at: datetime) -> Callable[[Explanation], bool]:
    """A condition on an explanation: every node's verdict read data sampled at `updated_at`."""
    stamp = format_timestamp(updated_at)

    def holds(document: Explanation) -> bool:
        return all(
            node["inputs"] is not None and node["inputs"]["updated_at"] == stamp
            for node in document.values()
        )

    return holds


def ready_layout(stack: ScorerStack, scope: Scope, *, saturated_allocated: bool) -> tuple[str, str]:
    """`lay_out`, then wait until the scorer judges both nodes on that data (names only: its
    node cache has it) and let the scheduler's informer catch up (full nodes: it sends its
    copy of the Nodes)."""
    at = datetime.now(UTC)
    mixed, even = lay_out(scope, saturated_allocated=saturated_allocated, at=at)
    wait_explained("the scorer to read the layout", stack, scope, [mixed, even], data_seen(at))
    scope.settle()
    return mixed, even


def bind_directly(stack: ScorerStack, scope: Scope, node: str, count: int) -> list[str]:
    """`count` one-GPU pods created with `spec.nodeName` (no scheduler involved), once the
    scorer counts them on `node`."""
    pods = [
        scope.pod(placed_gpu_pod(scope.name(f"direct-{i}"), node_name=node)) for i in range(count)
    ]
    refs = sorted(f"default/{pod}" for pod in pods)
    wait_explained(
        f"the scorer to count {count} pods on {node}",
        stack,
        scope,
        [node],
        lambda document: inflight_refs(document[node]) == refs,
    )
    return pods


def assert_holding_idle_gpus(node: dict[str, Any]) -> None:
    """The mixed node as explained while four pods bound to it directly are not admitted yet:
    each counts as allocation pending, together they hold its four idle GPUs, so it fails."""
    half = GPUS // 2
    pods = node["inflight"]["pods"]
    assert [p["allocation_pending"] for p in pods] == [True] * half, pods
    assert node["gpus"]["inflight"] == half, node["gpus"]
    statuses = [gpu["status"] for gpu in node["gpus"]["table"]]
    assert statuses == ["in-flight"] * half + ["allocated"] * half, statuses
    assert node["verdict"] == "fail", node


def burst(stack: ScorerStack, scope: Scope, count: int, prefix: str = "burst") -> list[str]:
    """`count` one-GPU pods for the stack's scheduler, created back to back."""
    return [
        scope.pod(gpu_pod(scope.name(f"{prefix}-{i}"), scheduler_name=stack.scheduler_name))
        for i in range(count)
    ]


# ----------------------------------------------------------------------------- bursts


@dataclass(frozen=True)
class BurstCase:
    name: str
    # Whether the kubelet's allocations account for the mixed node's saturated GPUs.
    saturated_allocated: bool
    # The GPUs of the mixed node that a blind device plugin hands out only to pods that can
    # use them: its pool is all candidates (allocated) or half saturated (not accounted for).
    suitable_on_mixed: int


BURSTS = [
    BurstCase("saturated-gpus-unaccounted", saturated_allocated=False, suitable_on_mixed=0),
    BurstCase("saturated-gpus-allocated", saturated_allocated=True, suitable_on_mixed=4),
]


@pytest.mark.parametrize("case", BURSTS, ids=lambda c: c.name)
def test_a_burst_puts_no_more_pods_on_a_node_than_it_has_suitable_gpus(
    stack: ScorerStack, scope: Scope, case: BurstCase
) -> None:
    mixed, even = ready_layout(stack, scope, saturated_allocated=case.saturated_allocated)
    placed = Counter(bound_nodes(scope.api, burst(stack, scope, GPUS)).values())
    # The target: no pod on a node whose remaining suitable GPUs are fewer than it asks while
    # another node has them. Where the mixed node is suitable it scores higher (its idle GPUs
    # against 0.35), so it also fills exactly to what it can take.
    expected = Counter({mixed: case.suitable_on_mixed, even: GPUS - case.suitable_on_mixed})
    assert placed == expected, placed


# ----------------------------------------------------------------------------- bound by others


def test_pods_bound_by_others_hold_their_gpus_until_deleted(
    stack: ScorerStack, scope: Scope
) -> None:
    api = scope.api
    mixed, even = ready_layout(stack, scope, saturated_allocated=True)
    direct = bind_directly(stack, scope, mixed, GPUS // 2)
    assert_holding_idle_gpus(explained(stack, scope, [mixed])[mixed])

    (first,) = burst(stack, scope, 1, "first")
    assert bound_nodes(api, [first]) == {first: even}

    delete_pods(api, direct)
    wait_explained(
        f"the scorer to drop the deleted pods from {mixed}",
        stack,
        scope,
        [mixed],
        lambda document: inflight_refs(document[mixed]) == [],
    )
    (again,) = burst(stack, scope, 1, "again")
    assert bound_nodes(api, [again]) == {again: mixed}


# The utilization the agent reads on the GPUs the admitted pods got: their processes have not
# started yet, or they have. Where allocations are published it changes nothing: those GPUs are
# allocated either way.
ADMITTED_GPU_LOADS = [
    pytest.param(IDLE, id="load-not-showing-yet"),
    pytest.param(0.8, id="load-showing"),
]


@pytest.mark.parametrize("admitted_gpu_load", ADMITTED_GPU_LOADS)
def test_in_flight_pods_stop_holding_gpus_once_the_node_data_shows_them(
    stack: ScorerStack, scope: Scope, admitted_gpu_load: float
) -> None:
    api = scope.api
    mixed, even = ready_layout(stack, scope, saturated_allocated=True)
    direct = bind_directly(stack, scope, mixed, GPUS // 2)
    assert_holding_idle_gpus(explained(stack, scope, [mixed])[mixed])
    (first,) = burst(stack, scope, 1, "first")
    assert bound_nodes(api, [first]) == {first: even}

    # The kubelet admits the four pods (the device plugin gives them the idle GPUs 0-3) and
    # writes startTime; containers are still being created. The agent's next sample, in the
    # next second (both times are whole seconds), shows those GPUs allocated, and the earlier
    # work on GPUs 4-7 finished: they are idle and free. Before it, the allocations count as
    # pending whatever else the node shows.
    admitted = datetime.now(UTC).replace(microsecond=0)
    for pod in direct:
        report_pod_status(api, pod, admitted_at=admitted)
    sampled = admitted + timedelta(seconds=1)
    wait_for("the agent's next sample", lambda: datetime.now(UTC) >= sampled, timeout_s=2)
    half = GPUS // 2
    gpus = [(admitted_gpu_load, True)] * half + [(IDLE, False)] * half
    publish(api, mixed, per_gpu_node_state(gpus, at=sampled))

    def released(document: Explanation) -> bool:
        node = document[mixed]
        pods = [] if node["inflight"] is None else node["inflight"]["pods"]
        return (
            data_seen(sampled)(document)
            and len(pods) == half
            and not any(p["allocation_pending"] for p in pods)
        )

    after = wait_explained("the allocations to be released", stack, scope, [mixed], released)
    node = after[mixed]
    refs = sorted(f"default/{pod}" for pod in direct)
    # Still counted, as load pending (their containers are not running yet), but holding no
    # GPU: the node's own allocations show them now.
    assert inflight_refs(node) == refs
    assert all(p["load_pending"] for p in node["inflight"]["pods"]), node["inflight"]
    assert node["gpus"]["inflight"] == 0, node["gpus"]
    statuses = [gpu["status"] for gpu in node["gpus"]["table"]]
    assert statuses == ["allocated"] * half + ["candidate"] * half, statuses
    assert node["verdict"] == "pass", node
    scope.settle()

    # Placement follows the published data: four free idle GPUs on the mixed node.
    (follows,) = burst(stack, scope, 1, "follows")
    assert bound_nodes(api, [follows]) == {follows: mixed}


# The policy's `inflight_load_delay_s`, the scorer's default: a running pod's load counts until
# data sampled this long after its containers started.
LOAD_DELAY_S = 60
# What the four pods bound to the mixed node keep their GPUs at once they run: above the limit.
POD_LOAD = 0.95


def test_running_pods_stop_holding_gpus_once_data_sampled_after_their_load_window(
    stack: ScorerStack, scope: Scope
) -> None:
    """Where the kubelet's allocations are not published, an admitted pod counts until the node
    shows its load: data sampled `inflight_load_delay_s` after its containers run. The pods
    here run since just over that long ago (the scorer reads the times the pods' statuses give,
    so the test need not wait a minute), and the node publishes twice: data sampled half-way
    through their load window, which cannot show them, then data sampled now, which can."""
    api = scope.api
    mixed, even = scope.node("mixed", gpus=GPUS), scope.node("even", gpus=GPUS)
    half = GPUS // 2
    # No allocations published: the mixed node offers its four idle GPUs as candidates.
    start = datetime.now(UTC).replace(microsecond=0)
    publish(
        api, mixed, per_gpu_node_state([(IDLE, None)] * half + [(SATURATED, None)] * half, at=start)
    )
    publish(api, even, per_gpu_node_state([(EVEN, None)] * GPUS, at=start))
    direct = bind_directly(stack, scope, mixed, half)
    refs = sorted(f"default/{pod}" for pod in direct)

    running_since = start - timedelta(seconds=LOAD_DELAY_S + 1)
    for pod in direct:
        report_pod_status(
            api, pod, admitted_at=running_since - timedelta(seconds=1), running_since=running_since
        )
    # The agent's samples: the pods' load is on GPUs 0-3, the earlier work on 4-7 has ended.
    gpus = [(POD_LOAD, None)] * half + [(IDLE, None)] * half
    midway = running_since + timedelta(seconds=LOAD_DELAY_S // 2)
    publish(api, mixed, per_gpu_node_state(gpus, at=midway))

    def counted_as_load_pending(document: Explanation) -> bool:
        node = document[mixed]
        return (
            data_seen(midway)({mixed: node})
            and inflight_refs(node) == refs
            and all(
                p["load_pending"] and not p["allocation_pending"] for p in node["inflight"]["pods"]
            )
        )

    before = wait_explained(
        "the pods to count as load pending", stack, scope, [mixed], counted_as_load_pending
    )[mixed]
    # Their GPUs are not known: they hold the node's best candidates, the four idle GPUs.
    assert before["gpus"]["inflight"] == half, before["gpus"]
    assert before["verdict"] == "fail", before
    scope.settle()
    (first,) = burst(stack, scope, 1, "first")
    assert bound_nodes(api, [first]) == {first: even}

    caught_up = start + timedelta(seconds=1)
    wait_for("the agent's next sample", lambda: datetime.now(UTC) >= caught_up, timeout_s=2)
    publish(api, mixed, per_gpu_node_state(gpus, at=caught_up))

    def released(document: Explanation) -> bool:
        node = document[mixed]
        return data_seen(caught_up)({mixed: node}) and inflight_refs(node) == []

    after = wait_explained("the load to be released", stack, scope, [mixed], released)[mixed]
    statuses = [gpu["status"] for gpu in after["gpus"]["table"]]
    assert statuses == ["utilization"] * half + ["candidate"] * half, statuses
    assert after["verdict"] == "pass", after
    scope.settle()
    (follows,) = burst(stack, scope, 1, "follows")
    assert bound_nodes(api, [follows]) == {follows: mixed}


# ----------------------------------------------------------------------------- no pod RBAC

_RBAC = "/apis/rbac.authorization.k8s.io/v1"


def _cluster_role(name: str, resource: str) -> dict[str, Any]:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": name},
        "rules": [{"apiGroups": [""], "resources": [resource], "verbs": ["list", "watch"]}],
    }


def _binding(name: str, service_account: str) -> dict[str, Any]:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": service_account, "namespace": "default"}],
    }


@pytest.fixture
def node_only_identity(scope: Scope) -> Iterator[tuple[str, str]]:
    """A ServiceAccount allowed to list and watch Nodes, nothing else, and its token.
    Yields (service account, token); its RBAC objects are removed afterwards."""
    api = scope.api
    account = scope.name("scorer")
    api.create(
        "/api/v1/namespaces/default/serviceaccounts",
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": account}},
    )
    nodes_role = scope.name("scorer-nodes")
    apply(api, _cluster_role(nodes_role, "nodes"))
    apply(api, _binding(nodes_role, account))
    token = service_account_token(
        api, namespace="default", service_account=account, audience=SERVICE_ACCOUNT_ISSUER
    )
    try:
        yield account, token
    finally:
        for name in (nodes_role, scope.name("scorer-pods")):
            api.delete(f"{_RBAC}/clusterrolebindings/{name}")
            api.delete(f"{_RBAC}/clusterroles/{name}")
        api.delete(f"/api/v1/namespaces/default/serviceaccounts/{account}")


def test_without_pod_rbac_the_scorer_schedules_by_the_annotations_until_granted(
    control_plane: ControlPlane,
    scope: Scope,
    node_only_identity: tuple[str, str],
    tmp_path: Path,
) -> None:
    api: KubeApi = scope.api
    account, token = node_only_identity
    kubeconfig = control_plane.token_kubeconfig(tmp_path / "scorer.kubeconfig", token, account)
    scorer = scorer_process(tmp_path, kubeconfig=kubeconfig, name="gpu-scorer-no-pod-rbac")
    scheduler_name = "inflight-no-pod-rbac"
    with running(scorer):
        scorer.wait_ready()  # the node cache's LIST: its RBAC suffices

        (off, *_) = scorer.wait_log_documents(
            "the scorer to turn in-flight accounting off",
            lambda line: str(line.get("msg", "")).startswith("in-flight accounting off"),
            timeout_s=30,
        )
        assert "(403)" in off["why"], off
        assert "list and watch on pods" in off["why"], off
        assert scorer.metric(INFLIGHT_ACCOUNTING) == 0

        control_plane.start_scheduler(
            SchedulerConfig(scheduler_name, ExtenderConfig(scorer.url, node_cache_capable=True))
        )
        try:
            stack = ScorerStack("names", scheduler_name, scorer)
            mixed, even = ready_layout(stack, scope, saturated_allocated=True)
            direct = [
                scope.pod(placed_gpu_pod(scope.name(f"direct-{i}"), node_name=mixed))
                for i in range(GPUS // 2)
            ]
            # Without the pod watch nothing holds the mixed node's idle GPUs: the pod goes
            # where the annotations alone say, as before in-flight accounting.
            (blind,) = burst(stack, scope, 1, "blind")
            assert bound_nodes(api, [blind]) == {blind: mixed}

            pods_role = scope.name("scorer-pods")
            apply(api, _cluster_role(pods_role, "pods"))
            apply(api, _binding(pods_role, account))
            # The watch retries with back-off (at most 30 s between tries).
            wait_for(
                "in-flight accounting to turn on",
                lambda: scorer.metric(INFLIGHT_ACCOUNTING) == 1,
                timeout_s=60,
                interval_s=0.25,
            )
            # The metric moves before the batched log line is written: wait for the line.
            scorer.wait_log_documents(
                "the scorer's log line that in-flight accounting is on",
                lambda line: line.get("msg") == "in-flight accounting on",
            )

            refs = sorted(f"default/{pod}" for pod in [*direct, blind])
            wait_explained(
                "the scorer to count the pods on the mixed node",
                stack,
                scope,
                [mixed],
                lambda document: inflight_refs(document[mixed]) == refs,
            )
            (counted,) = burst(stack, scope, 1, "counted")
            assert bound_nodes(api, [counted]) == {counted: even}
        finally:
            control_plane.stop_scheduler(f"kube-scheduler-{scheduler_name}")
