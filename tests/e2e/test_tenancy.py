"""Tenant profiles and spread caps on the real control plane.

The real kube-scheduler v1.37 with the real scorer as its extender, in both modes (names only,
the scorer's node cache; full Node objects), each scorer with a kubeconfig so that its Pod watch
runs (a spread group's pods are counted from it) and with a policy file whose profiles are
chosen by namespace name (`prod-*`) and by namespace label (`team: research`, read by the
scorer's Namespace watch). There is no kubelet: bound pods stay Pending, which is all a cap or a
verdict reads of them.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator, Sequence
from typing import Any

import pytest

from gpu_contract.schema import DEFAULT_PREFIX
from loopback_cluster.control_plane import KubeApi
from loopback_cluster.workload import (
    ScorerProcess,
    delete_pods,
    gpu_pod,
    gpu_state,
    pod_node,
    publish,
    wait_for,
)
from tests.e2e.support import (
    Scope,
    ScorerStack,
    StackSpec,
    create_namespace,
    failed_scheduling_messages,
    stack_fixture,
    wait_failed_scheduling,
)

pytestmark = pytest.mark.e2e

# Pods of a group rejected while a slot was held by a proposal the watch had not confirmed
# yet are retried by kube-scheduler on the next cluster event, after its back-off (1 s
# doubling to 10 s); a burst settles well within this.
BURST_S = 60.0
GROUP_LABEL = DEFAULT_PREFIX + "spread-group"
MAX_PER_DOMAIN = DEFAULT_PREFIX + "spread-max-per-domain"
TOPOLOGY_KEY = DEFAULT_PREFIX + "spread-topology-key"
ZONE = "topology.kubernetes.io/zone"
# The FailedScheduling text once each of three nodes holds a group's two pods.
HOST_CAP_OF_2_ON_3_NODES = (
    "0/3 nodes are available: 3 spread group at most 2 per kubernetes.io/hostname."
)

POLICY_FILE = """\
# The top-level policy (the `default` profile): the built-in limits.
profiles:
  # Latency-sensitive serving: only nodes well below saturation.
  - name: prod
    namespaces: ["prod-*"]
    utilization-limit: 0.70
  # Batch research: pack nodes up to 0.97.
  - name: research
    namespace-selector:
      matchLabels:
        team: research
    utilization-limit: 0.97
"""


# Namespaces of the stacks' pods: one a profile chooses by name, one by label.
PROD, RESEARCH = "prod-tenancy", "lab-tenancy"

# Both modes with credentials: the Pod watch counts the groups; the Namespace watch holds the
# labels profiles read.
stack = stack_fixture(
    StackSpec(
        "tenancy",
        policy_yaml=POLICY_FILE,
        namespace_watch=True,
        namespaces={PROD: {}, RESEARCH: {"team": "research"}},
    )
)


@pytest.fixture
def namespaced(scope: Scope) -> Iterator[list[tuple[str, str]]]:
    """(namespace, name) of pods a test creates outside `default`; deleted afterwards."""
    created: list[tuple[str, str]] = []
    try:
        yield created
    finally:
        for namespace, name in created:
            scope.api.delete(f"/api/v1/namespaces/{namespace}/pods/{name}")


# ----------------------------------------------------------------------------- helpers


def bound_until(
    scope: Scope,
    pod: str,
    namespace: str = "default",
    *,
    poke: str,
    utilization: float,
    timeout_s: float = 20.0,
) -> str:
    """The node `pod` binds to. A pending pod is retried on a cluster event; when that event
    reaches kube-scheduler before the scorer's own watch has it (two watches, no order between
    them), the retry is rejected again and the pod waits for the next event. The agent writes
    its node every heartbeat in a fleet; here `poke` is rewritten every 2 s, freshly sampled
    at `utilization`."""
    written = [time.monotonic()]

    def bound() -> str | None:
        node = pod_node(scope.api, pod, namespace)
        if node is None and time.monotonic() - written[-1] > 2.0:
            # A fresh `updated-at` each time: an unchanged Node write is no event.
            publish(scope.api, poke, gpu_state(utilization=utilization))
            written.append(time.monotonic())
        return node

    return wait_for(f"{pod} to bind", bound, timeout_s=timeout_s, interval_s=0.1)


def placement(
    api: KubeApi, pods: Sequence[str], namespace: str = "default"
) -> dict[str, str | None]:
    return {pod: pod_node(api, pod, namespace) for pod in pods}


def group_member(
    stack: ScorerStack,
    scope: Scope,
    name: str,
    *,
    group: str,
    max_per_domain: int,
    topology_key: str | None = None,
) -> dict[str, Any]:
    annotations = {MAX_PER_DOMAIN: str(max_per_domain)}
    if topology_key is not None:
        annotations[TOPOLOGY_KEY] = topology_key
    pod = gpu_pod(scope.name(name), scheduler_name=stack.scheduler_name, annotations=annotations)
    pod["metadata"]["labels"][GROUP_LABEL] = group
    return pod


def settled_placement(
    scope: Scope, pods: Sequence[str], *, bound: int, poke: str, timeout_s: float
) -> dict[str, str | None]:
    """Once exactly `bound` of `pods` are bound (and the others have a FailedScheduling). A pod
    rejected while a slot was held by a proposal is retried on the next cluster event: `poke`
    is rewritten every 2 s, as its agent's heartbeat would."""
    api = scope.api
    written = [time.monotonic()]

    def done() -> dict[str, str | None] | None:
        if time.monotonic() - written[-1] > 2.0:
            publish(api, poke, gpu_state(utilization=0.10))
            written.append(time.monotonic())
        placed = placement(api, pods)
        if sum(node is not None for node in placed.values()) != bound:
            return None
        waiting = [pod for pod, node in placed.items() if node is None]
        for pod in waiting:
            if not failed_scheduling_messages(api, pod):
                return None
        return placed

    return wait_for(f"{bound} of {len(pods)} pods to bind", done, timeout_s=timeout_s)


def _profile_requests(scorer: ScorerProcess, profile: str) -> float:
    total = 0.0
    for line in scorer.metrics().splitlines():
        if line.startswith("gpu_scorer_requests_total{") and f'profile="{profile}"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


# ----------------------------------------------------------------------------- tenant profiles


def test_namespaces_with_different_profiles_are_placed_differently(
    stack: ScorerStack, scope: Scope, namespaced: list[tuple[str, str]]
) -> None:
    api = scope.api
    warm, hot = scope.node("warm"), scope.node("hot")
    publish(api, warm, gpu_state(utilization=0.80))
    publish(api, hot, gpu_state(utilization=0.95))
    scope.settle()

    pods: dict[str, tuple[str, str]] = {}
    for role, namespace in (
        ("research", RESEARCH),
        ("prod", PROD),
        ("plain", "default"),
    ):
        doc = gpu_pod(
            scope.name(role),
            scheduler_name=stack.scheduler_name,
            namespace=namespace,
            # Light pods (0.1 of a GPU each, 0.0125 of the node's mean once bound), so that
            # one bound pod does not move the warm node past the next pod's limit.
            annotations={DEFAULT_PREFIX + "expected-gpu-load": "0.1"},
        )
        name = scope.pod(doc)
        if namespace != "default":
            namespaced.append((namespace, name))
        pods[role] = (namespace, name)

    # research (a namespace label chose it) packs to 0.97: the warm node is the better of two.
    assert bound_until(scope, pods["research"][1], RESEARCH, poke=warm, utilization=0.80) == warm
    # The top-level policy (0.90) takes the warm node, not the hot one.
    assert bound_until(scope, pods["plain"][1], poke=warm, utilization=0.80) == warm
    # prod (chosen by the namespace's name) only below 0.70: neither node.
    wait_failed_scheduling(
        api,
        pods["prod"][1],
        PROD,
        starting_with="0/2 nodes are available: 2 gpu utilization above 0.70.",
    )
    assert pod_node(api, pods["prod"][1], PROD) is None

    assert _profile_requests(stack.scorer, "research") >= 1
    assert _profile_requests(stack.scorer, "prod") >= 1
    prod_pod = f"{PROD}/{pods['prod'][1]}"
    rejected = stack.scorer.wait_log_documents(
        "the scorer's log line for the rejected prod pod",
        lambda line: line.get("msg") == "nodes rejected" and line.get("pod") == prod_pod,
    )
    assert rejected[-1]["pod_class"]["profile"] == "prod", rejected[-1]

    # A node below 0.70 joins: the prod pod binds there.
    cool = scope.node("cool")
    publish(api, cool, gpu_state(utilization=0.50))
    assert bound_until(scope, pods["prod"][1], PROD, poke=cool, utilization=0.50) == cool


def test_a_namespace_label_change_switches_the_profile(
    stack: ScorerStack, scope: Scope, namespaced: list[tuple[str, str]]
) -> None:
    api = scope.api
    warm = scope.node("warm")
    # With one more pod's default own load (0.50 on one of its 8 GPUs: +0.0625 to the mean),
    # above the top-level limit (0.90) and within research's (0.97).
    publish(api, warm, gpu_state(utilization=0.90))
    scope.settle()
    namespace = f"{RESEARCH}-{scope.label}"
    # No namespace controller runs here (a deleted one would stay Terminating): it is kept.
    create_namespace(api, namespace)
    doc = gpu_pod(scope.name("late"), scheduler_name=stack.scheduler_name, namespace=namespace)
    name = scope.pod(doc)
    namespaced.append((namespace, name))
    wait_failed_scheduling(
        api, name, namespace, starting_with="0/1 nodes are available: 1 gpu utilization above 0.90."
    )
    # Labelled research: the scorer's Namespace watch sees it, and the next try passes.
    labelled = {"metadata": {"labels": {"team": "research"}}}
    api.merge_patch(f"/api/v1/namespaces/{namespace}", labelled)
    assert bound_until(scope, name, namespace, poke=warm, utilization=0.90) == warm


# ----------------------------------------------------------------------------- spread caps


def test_a_group_keeps_its_cap_per_node_and_the_last_pod_waits_for_a_slot(
    stack: ScorerStack, scope: Scope
) -> None:
    api = scope.api
    nodes = [scope.node(f"gpu-{i}") for i in range(3)]
    for node, utilization in zip(nodes, (0.10, 0.20, 0.30), strict=True):
        publish(api, node, gpu_state(utilization=utilization))
    scope.settle()
    group = scope.name("train")
    members = []
    for i in range(6):  # one at a time: every count comes from the Pod watch
        name = scope.pod(group_member(stack, scope, f"train-{i}", group=group, max_per_domain=2))
        members.append(name)
        bound_until(scope, name, poke=nodes[0], utilization=0.10)
    per_node = Counter(placement(api, members).values())
    assert per_node == dict.fromkeys(nodes, 2), per_node

    last = scope.pod(group_member(stack, scope, "train-6", group=group, max_per_domain=2))
    wait_failed_scheduling(
        api,
        last,
        starting_with=HOST_CAP_OF_2_ON_3_NODES,
    )
    assert pod_node(api, last) is None

    freed = pod_node(api, members[4])
    assert freed is not None
    delete_pods(api, [members[4]])
    assert bound_until(scope, last, poke=freed, utilization=0.10) == freed
    survivors = [m for m in members if m != members[4]] + [last]
    assert Counter(placement(api, survivors).values()) == dict.fromkeys(nodes, 2)


def test_a_burst_of_a_whole_group_never_exceeds_its_cap(stack: ScorerStack, scope: Scope) -> None:
    api = scope.api
    nodes = [scope.node(f"gpu-{i}") for i in range(3)]
    for node in nodes:
        publish(api, node, gpu_state(utilization=0.10))  # equal: the scores tie
    scope.settle()
    group = scope.name("burst")
    pods = [
        scope.pod(group_member(stack, scope, f"burst-{i}", group=group, max_per_domain=2))
        for i in range(7)
    ]
    placed = settled_placement(scope, pods, bound=6, poke=nodes[0], timeout_s=BURST_S)
    per_node = Counter(node for node in placed.values() if node is not None)
    assert per_node == dict.fromkeys(nodes, 2), per_node
    (waiting,) = [pod for pod, node in placed.items() if node is None]
    wait_failed_scheduling(
        api,
        waiting,
        starting_with=HOST_CAP_OF_2_ON_3_NODES,
    )


def test_a_zone_cap_counts_pods_per_zone(stack: ScorerStack, scope: Scope) -> None:
    api = scope.api
    zones = {"a-0": "zone-a", "a-1": "zone-a", "b-0": "zone-b", "bare": None}
    nodes = {}
    for short, zone in zones.items():
        name = scope.node(short)
        api.merge_patch(f"/api/v1/nodes/{name}", {"metadata": {"labels": {ZONE: zone}}})
        publish(api, name, gpu_state(utilization=0.10))
        nodes[short] = name
    scope.settle()
    group = scope.name("zonal")
    pods = [
        scope.pod(
            group_member(
                stack, scope, f"zonal-{i}", group=group, max_per_domain=1, topology_key=ZONE
            )
        )
        for i in range(3)
    ]
    placed = settled_placement(scope, pods, bound=2, poke=nodes["bare"], timeout_s=BURST_S)
    zone_of = {nodes[short]: zone for short, zone in zones.items()}
    bound_zones = Counter(zone_of[node] for node in placed.values() if node is not None)
    assert bound_zones == {"zone-a": 1, "zone-b": 1}, placed
    (waiting,) = [pod for pod, node in placed.items() if node is None]
    wait_failed_scheduling(
        api,
        waiting,
        starting_with="0/4 nodes are available: 1 node has no topology.kubernetes.io/zone label, "
        "3 spread group at most 1 per topology.kubernetes.io/zone.",
    )
