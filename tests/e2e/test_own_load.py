"""The load a pod will add, on the real control plane: a hint, learned from its workload, or the
default.

The real kube-scheduler with the real scorer as its extender, in both modes (names only, the
scorer's node cache; full Node objects), each scorer with its Pod watch. Workloads are made as
their controllers make them: a Deployment, a ReplicaSet it owns (`pod-template-hash`), and pods
the ReplicaSet owns, built from its template. No controller-manager runs, so the tests create
the replicas themselves; no kubelet runs either, so the tests write a running replica's status
as its kubelet would (`report_pod_status`), and the agent's data of the node it runs on
(`publish`), with what each replica uses of its GPU (`pod-gpu-usage`, whole-GPU attribution).
Where the next replica goes is read back from the API server; the estimate the scorer counted
(its figure and source: a hint, learned from n pods, the default) from its `/explain`, asked
with the request the scheduler sends.

The layout every placement shares, per test: `half`, one GPU at 0.50, where a pod fits if it
adds at most 0.40 (the limit is 0.90); `spare`, a node whose agent has published nothing, which
passes and scores lowest; and each workload's running replicas on a node of their own, whose
GPUs they hold (the scheduler's own resource check keeps further pods off it).

Each workload's replicas hold every GPU of their node, so kube-scheduler, which sends only the
Nodes that pass its own filters, never sends that node: a full-node scorer that learned only
from the Nodes of its requests would never see the replicas' samples (its learned figure would
not come, `NotLearnedError`). So the full-node scorer runs with `--own-load-node-watch`, the
Node watch that only teaches (docs/scoring.md), as the chart's `scorer.ownLoadNodeWatch` sets.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Final

import pytest

from exporter_scheduler.core.policy import Policy
from gpu_contract.podusage import GpuShare, PodUsage
from gpu_contract.schema import DEFAULT_PREFIX, NodeGpuState, format_timestamp
from loopback_cluster.control_plane import KubeApi
from loopback_cluster.workload import (
    delete_pods,
    gpu_pod,
    per_gpu_node_state,
    publish,
    report_pod_status,
    wait_for,
)
from tests.e2e.support import (
    WATCH_SYNC_S,
    Scope,
    ScorerStack,
    StackSpec,
    bound_nodes,
    explain,
    inflight_refs,
    stack_fixture,
)

pytestmark = pytest.mark.e2e

# How long learned samples count (`own_load_max_age_s`): short, so that the test of a workload
# whose load changes can date its old samples that far back and still see them counted first.
MAX_AGE_S: Final = 120
# The policy's `inflight_load_delay_s` (its default): a replica's samples teach only once the
# node's data was sampled this long after its containers started.
LOAD_DELAY_S: Final = 60
# The policy's `own_load_gpu_load` (its default).
DEFAULT_LOAD: Final = Policy().own_load_gpu_load
HALF_BUSY: Final = 0.50
# Replicas' loads per GPU: a heavy one does not fit on the half-busy GPU (0.50 + 0.60 > 0.90),
# a light one does (0.70). Both are multiples of the learned figures' 0.05 step.
HEAVY, LIGHT = 0.60, 0.20
HEAVY_MIB, LIGHT_MIB = 20_000, 8_000
# The learned memory is rounded up to whole GiB.
HEAVY_LEARNED_MIB, LIGHT_LEARNED_MIB = 20_480, 8_192
GPU_MEMORY_MIB: Final = 81_000
# The scorer sees a Node or Pod event within milliseconds on loopback; this is the deadline.
WATCH_S: Final = WATCH_SYNC_S
EXPECTED_GPU_LOAD: Final = DEFAULT_PREFIX + "expected-gpu-load"

# `--own-load-settle-s=0`: a light reading counts as soon as the replica is past its ramp
# (`inflight_load_delay_s`), so that the replicas here can be in flight and teach at once (the
# settling time of young pods' light readings is tests/scorer/test_workloads.py's).
stack = stack_fixture(
    StackSpec(
        "ownload",
        scorer_flags=(
            f"--own-load-max-age-s={MAX_AGE_S}",
            "--own-load-settle-s=0",
            "--own-load-node-watch",  # read by the full-node scorer only
        ),
    )
)

Explanation = dict[str, Any]


class NotLearnedError(AssertionError):
    """The scorer gave no learned figure for a workload whose running replicas show their load."""


# ----------------------------------------------------------------------------- workloads


@dataclass
class ReplicaSet:
    """A ReplicaSet a Deployment owns (one revision), as the Deployment controller makes it."""

    name: str
    uid: str
    template_hash: str
    template: dict[str, Any]
    _suffixes: Iterator[int] = field(default_factory=lambda: iter(range(10_000)))

    def replica(self) -> dict[str, Any]:
        """A new pod of this ReplicaSet, as its controller makes it from the template (not
        created here)."""
        pod = copy.deepcopy(self.template)
        pod["apiVersion"], pod["kind"] = "v1", "Pod"
        metadata = pod["metadata"]
        metadata["name"] = f"{self.name}-r{next(self._suffixes):04d}"
        metadata["namespace"] = "default"
        metadata["ownerReferences"] = [owner("ReplicaSet", self.name, self.uid)]
        return pod


@dataclass
class Deployment:
    name: str
    uid: str


def owner(kind: str, name: str, uid: str) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": kind,
        "name": name,
        "uid": uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


_APPS = "/apis/apps/v1/namespaces/default"


class Apps:
    """A test's Deployments and ReplicaSets (created in the API, deleted afterwards)."""

    def __init__(self, scope: Scope, stack: ScorerStack) -> None:
        self.scope = scope
        self.stack = stack
        self.made: list[str] = []

    def deployment(self, short_name: str) -> Deployment:
        name = self.scope.name(short_name)
        created = self.scope.api.create(
            f"{_APPS}/deployments",
            {
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "metadata": {"name": name},
                "spec": {
                    "replicas": 2,
                    "selector": {"matchLabels": {"app": name}},
                    "template": self._template(name, {"app": name}),
                },
            },
        )
        self.made.append(f"{_APPS}/deployments/{name}")
        return Deployment(name, created["metadata"]["uid"])

    def revision(
        self,
        deployment: Deployment,
        template_hash: str,
        *,
        annotations: dict[str, str] | None = None,
    ) -> ReplicaSet:
        """The ReplicaSet of one revision of `deployment`'s template, whose hash is
        `template_hash`; `annotations` are the template's (a hint is one)."""
        name = f"{deployment.name}-{template_hash}"
        labels = {"app": deployment.name, "pod-template-hash": template_hash}
        template = self._template(deployment.name, labels, annotations)
        created = self.scope.api.create(
            f"{_APPS}/replicasets",
            {
                "apiVersion": "apps/v1",
                "kind": "ReplicaSet",
                "metadata": {
                    "name": name,
                    "labels": labels,
                    "ownerReferences": [owner("Deployment", deployment.name, deployment.uid)],
                },
                "spec": {"replicas": 2, "selector": {"matchLabels": labels}, "template": template},
            },
        )
        self.made.append(f"{_APPS}/replicasets/{name}")
        return ReplicaSet(name, created["metadata"]["uid"], template_hash, template)

    def _template(
        self, name: str, labels: dict[str, str], annotations: dict[str, str] | None = None
    ) -> dict[str, Any]:
        """A pod template: one GPU, for the stack's scheduler, on this test's nodes."""
        spec = gpu_pod(name, scheduler_name=self.stack.scheduler_name)["spec"]
        spec["nodeSelector"] = {"e2e-scope": self.scope.label}
        spec["restartPolicy"] = "Always"  # the only one a Deployment's template may have
        metadata = {"labels": dict(labels), "annotations": dict(annotations or {})}
        return {"metadata": metadata, "spec": spec}

    def cleanup(self) -> None:
        for path in reversed(self.made):
            self.scope.api.delete(path)


@pytest.fixture
def apps(scope: Scope, stack: ScorerStack) -> Iterator[Apps]:
    made = Apps(scope, stack)
    try:
        yield made
    finally:
        made.cleanup()


# ----------------------------------------------------------------------------- the agent's data


@dataclass(frozen=True)
class Share:
    """What one running replica uses of the one GPU it holds."""

    pod: str
    utilization: float
    memory_mib: int


def held_gpus(shares: Sequence[Share], *, at: datetime) -> NodeGpuState:
    """A node whose GPUs are each held by one replica, as the agent samples it `at`: each GPU
    allocated, as busy as its replica and with the memory its replica holds taken (whole-GPU
    attribution), and `pod-gpu-usage` naming each replica's share."""
    state = per_gpu_node_state([(s.utilization, True) for s in shares], at=at)
    gpus = tuple(
        gpu._replace(memory_free_mib=GPU_MEMORY_MIB - s.memory_mib)
        for gpu, s in zip(state.gpus, shares, strict=True)
    )
    free = [gpu.memory_free_mib or 0 for gpu in gpus]
    usage = tuple(
        PodUsage(f"default/{s.pod}", (GpuShare(i, s.utilization, s.memory_mib),))
        for i, s in enumerate(shares)
    )
    return dataclasses.replace(
        state, gpus=gpus, memory_free_mib=sum(free), memory_largest_free_mib=max(free), pods=usage
    )


def before_they_ran(gpus: int, *, at: datetime) -> NodeGpuState:
    """The node's sample from while its replicas started: GPUs allocated, idle, no usage."""
    return per_gpu_node_state([(0.0, True)] * gpus, at=at)


def whole_seconds(at: datetime) -> datetime:
    return at.replace(microsecond=0)


# ----------------------------------------------------------------------------- explanations


def explained(
    stack: ScorerStack, scope: Scope, pod: dict[str, Any], nodes: Sequence[str]
) -> Explanation:
    """`/explain`'s document for `pod` (not created) on `nodes`, as the scheduler would ask."""
    return explain(stack.scorer.url, scope.api, pod, nodes, names_only=stack.names_only)


def node_of(document: Explanation, name: str) -> dict[str, Any]:
    found: dict[str, Any] = next(n for n in document["nodes"] if n["name"] == name)
    return found


def estimate(document: Explanation) -> str:
    """The pod's own utilization per GPU as the verdicts counted it, and where it came from:
    `0.60 (learned from 2 pods)`, `0.20 (hint)`, `0.30 (default)`."""
    own = document["own_load"]
    if own is None:
        return "not counted (the policy's own_load is off)"
    source = own["utilization_source"]
    if source == "learned":
        source = f"learned from {own['learned_from_pods']} pods"
    return f"{own['utilization']:.2f} ({source})"


def wait_estimate(
    stack: ScorerStack, scope: Scope, pod: dict[str, Any], nodes: Sequence[str], want: str
) -> Explanation:
    """The explanation of `pod` (not created) once the scorer counts the estimate `want` (see
    `estimate`): the watches carry the replicas' statuses and the nodes' data to it. A learned
    figure that does not come raises `NotLearnedError`."""
    seen: list[str] = []

    def probe() -> Explanation | None:
        document = explained(stack, scope, pod, nodes)
        seen[:] = [estimate(document)]
        return document if seen[0] == want else None

    try:
        return wait_for(f"the estimate {want}", probe, timeout_s=WATCH_S, interval_s=0.1)
    except TimeoutError as error:
        failure = NotLearnedError if "learned" in want else AssertionError
        raise failure(f"{error}; the scorer counted {seen}") from None


def gpu_statuses(document: Explanation, node: str) -> list[str]:
    """Each GPU of an explained node: `candidate`, or the first criterion it failed."""
    return [gpu["status"] for gpu in node_of(document, node)["gpus"]["table"]]


# ----------------------------------------------------------------------------- layout


def lay_out_targets(stack: ScorerStack, scope: Scope, *, busy: float = HALF_BUSY) -> Targets:
    """`half` (one GPU at `busy`) and `spare` (no agent data), once the scorer judges `half` on
    its data and the scheduler's informer has caught up."""
    at = whole_seconds(datetime.now(UTC))
    half, spare = scope.node("half", gpus=1), scope.node("spare", gpus=8)
    publish(scope.api, half, per_gpu_node_state([(busy, None)], at=at))
    stamp = format_timestamp(at)
    probe = gpu_pod(scope.name("layout-probe"), scheduler_name=stack.scheduler_name)

    def seen(document: Explanation) -> bool:
        inputs = node_of(document, half)["inputs"]
        return inputs is not None and inputs["updated_at"] == stamp

    wait_for(
        "the scorer to read the half-busy GPU",
        lambda: seen(explained(stack, scope, probe, [half])),
        timeout_s=WATCH_S,
    )
    scope.settle()
    return Targets(half, spare)


@dataclass(frozen=True)
class Targets:
    half: str
    spare: str

    @property
    def nodes(self) -> list[str]:
        return [self.half, self.spare]


def run_replicas(
    stack: ScorerStack,
    scope: Scope,
    revision: ReplicaSet,
    *,
    count: int = 2,
    running_since: datetime,
) -> tuple[str, list[str]]:
    """`count` replicas of `revision` bound to a node of their own (its GPUs all theirs),
    running since `running_since` as their kubelet reports it, once the scorer's Pod watch has
    seen them run. The node's agent has published one sample from while they started (which
    cannot show their load yet), so the scorer counts them there, in flight.
    Returns (the node, the replicas' names)."""
    api = scope.api
    home = scope.node(f"home-{revision.template_hash}", gpus=count)
    pods = []
    for _ in range(count):
        pod = revision.replica()
        pod["spec"]["nodeName"] = home
        pods.append(scope.pod(pod))
    for pod_name in pods:
        report_pod_status(
            api,
            pod_name,
            admitted_at=running_since - timedelta(seconds=1),
            running_since=running_since,
        )
    publish(api, home, before_they_ran(count, at=running_since + timedelta(seconds=1)))
    refs = sorted(f"default/{name}" for name in pods)
    probe = revision.replica()

    def running_seen(document: Explanation) -> bool:
        node = node_of(document, home)
        return inflight_refs(node) == refs and not any(
            p["allocation_pending"] for p in node["inflight"]["pods"]
        )

    wait_for(
        f"the scorer to see {count} replicas run on {home}",
        lambda: running_seen(explained(stack, scope, probe, [home])),
        timeout_s=WATCH_S,
    )
    return home, pods


def sample(
    api: KubeApi,
    home: str,
    pods: Sequence[str],
    utilization: float,
    memory_mib: int,
    *,
    at: datetime,
) -> None:
    """The agent's sample of `home` at `at`: each replica keeps its GPU `utilization` busy."""
    shares = [Share(pod, utilization, memory_mib) for pod in pods]
    publish(api, home, held_gpus(shares, at=at))


def place(scope: Scope, pod: dict[str, Any]) -> str:
    """Create `pod`; the node it is bound to, read back from the API server."""
    name = scope.pod(pod)
    return bound_nodes(scope.api, [name])[name]


# ----------------------------------------------------------------------------- the cases


def test_a_heavy_workloads_next_replica_avoids_a_half_busy_gpu_a_light_ones_takes_it(
    stack: ScorerStack, scope: Scope, apps: Apps
) -> None:
    targets = lay_out_targets(stack, scope)
    now = whole_seconds(datetime.now(UTC))
    heavy = apps.revision(apps.deployment("heavy"), "6d4f8b9c7")
    light = apps.revision(apps.deployment("light"), "7b5c9d8f6")
    for revision, load, mib in ((heavy, HEAVY, HEAVY_MIB), (light, LIGHT, LIGHT_MIB)):
        ran = now - timedelta(seconds=LOAD_DELAY_S + 10)
        home, pods = run_replicas(stack, scope, revision, running_since=ran)
        sample(scope.api, home, pods, load, mib, at=now)

    next_heavy = heavy.replica()
    document = wait_estimate(
        stack, scope, next_heavy, targets.nodes, f"{HEAVY:.2f} (learned from 2 pods)"
    )
    own = document["own_load"]
    assert (own["memory_mib"], own["memory_source"]) == (HEAVY_LEARNED_MIB, "learned"), own
    # 0.50 + 0.60 is over the limit: the GPU is no candidate, the node fails.
    assert gpu_statuses(document, targets.half) == ["utilization"]
    assert node_of(document, targets.half)["verdict"] == "fail"
    assert place(scope, next_heavy) == targets.spare

    next_light = light.replica()
    document = wait_estimate(
        stack, scope, next_light, targets.nodes, f"{LIGHT:.2f} (learned from 2 pods)"
    )
    assert document["own_load"]["memory_mib"] == LIGHT_LEARNED_MIB
    assert gpu_statuses(document, targets.half) == ["candidate"]
    assert node_of(document, targets.half)["verdict"] == "pass"
    assert place(scope, next_light) == targets.half


def test_a_pod_whose_hint_disagrees_with_its_siblings_follows_its_hint(
    stack: ScorerStack, scope: Scope, apps: Apps
) -> None:
    """Learned figures first, so that each hint overrides one; the hints' placements are
    checked in both modes, and a mode that learns nothing fails with `NotLearnedError` last."""
    targets = lay_out_targets(stack, scope)
    now = whole_seconds(datetime.now(UTC))
    heavy_deployment, light_deployment = apps.deployment("heavy"), apps.deployment("light")
    heavy = apps.revision(heavy_deployment, "6d4f8b9c7")
    light = apps.revision(light_deployment, "7b5c9d8f6")
    for revision, load, mib in ((heavy, HEAVY, HEAVY_MIB), (light, LIGHT, LIGHT_MIB)):
        ran = now - timedelta(seconds=LOAD_DELAY_S + 10)
        home, pods = run_replicas(stack, scope, revision, running_since=ran)
        sample(scope.api, home, pods, load, mib, at=now)
    not_learned: NotLearnedError | None = None
    try:
        for revision, load in ((heavy, HEAVY), (light, LIGHT)):
            learned = f"{load:.2f} (learned from 2 pods)"
            wait_estimate(stack, scope, revision.replica(), targets.nodes, learned)
    except NotLearnedError as error:
        not_learned = error

    # The light workload rolls out a revision whose template says it will be busier: its
    # replicas are the same workload as the running ones, and follow the hint.
    hinted = {EXPECTED_GPU_LOAD: f"{HEAVY:.2f}"}
    busier = apps.revision(light_deployment, "5b6c7d8f9", annotations=hinted).replica()
    document = wait_estimate(stack, scope, busier, targets.nodes, f"{HEAVY:.2f} (hint)")
    assert gpu_statuses(document, targets.half) == ["utilization"]
    assert place(scope, busier) == targets.spare

    # And the heavy one a revision that says it will be lighter.
    hinted = {EXPECTED_GPU_LOAD: f"{LIGHT:.2f}"}
    lighter = apps.revision(heavy_deployment, "8f9b6c5d7", annotations=hinted).replica()
    document = wait_estimate(stack, scope, lighter, targets.nodes, f"{LIGHT:.2f} (hint)")
    assert gpu_statuses(document, targets.half) == ["candidate"]
    assert place(scope, lighter) == targets.half
    if not_learned is not None:
        raise not_learned


def test_a_workload_with_no_data_uses_the_default(
    stack: ScorerStack, scope: Scope, apps: Apps
) -> None:
    """Replicas that run, on a node whose agent publishes no per-pod figures (an agent older
    than the key, or none readable), teach nothing: their next replica counts the policy's
    default, as a pod without a workload does. The default (0.50) does not fit on a GPU at
    0.65, which alone is within the limit."""
    busy = 0.65
    targets = lay_out_targets(stack, scope, busy=busy)
    now = whole_seconds(datetime.now(UTC))
    revision = apps.revision(apps.deployment("quiet"), "9c7d5b8f4")
    home, _ = run_replicas(
        stack, scope, revision, running_since=now - timedelta(seconds=LOAD_DELAY_S + 10)
    )
    publish(scope.api, home, per_gpu_node_state([(HEAVY, True)] * 2, at=now))
    stamp = format_timestamp(now)
    wait_for(
        f"the scorer to read {home}'s sample",
        lambda: (
            node_of(explained(stack, scope, revision.replica(), [home]), home)["inputs"][
                "updated_at"
            ]
            == stamp
        ),
        timeout_s=WATCH_S,
    )

    replica = revision.replica()
    bare = gpu_pod(scope.name("bare"), scheduler_name=stack.scheduler_name)
    for pod in (replica, bare):
        document = wait_estimate(stack, scope, pod, targets.nodes, f"{DEFAULT_LOAD:.2f} (default)")
        assert gpu_statuses(document, targets.half) == ["utilization"]
        assert node_of(document, targets.half)["verdict"] == "fail"
        assert place(scope, pod) == targets.spare


# The time the first half of the next test has to run in: its samples are dated back so that
# they age out this long after it starts.
PHASE_S: Final = 30


def test_the_learned_figure_follows_a_workload_whose_load_changes(
    stack: ScorerStack, scope: Scope, apps: Apps
) -> None:
    """New samples of the same replicas replace their old ones at once; samples of replicas
    gone (a rollout replaced them) age out `own_load_max_age_s` after they were taken. The
    first revision's samples are dated back nearly that long, so that the test waits
    `PHASE_S`, not the whole age, for them to age out."""
    api = scope.api
    targets = lay_out_targets(stack, scope)
    start = whole_seconds(datetime.now(UTC))
    early = start - timedelta(seconds=MAX_AGE_S - PHASE_S)
    deployment = apps.deployment("serving")
    first = apps.revision(deployment, "5f6d7c8b9")
    ran = early - timedelta(seconds=LOAD_DELAY_S + 2)
    home, old = run_replicas(stack, scope, first, running_since=ran)

    # Traffic grows: the replicas' next sample shows them heavier, and the figure follows.
    sample(api, home, old, LIGHT, LIGHT_MIB, at=early)
    wait_estimate(
        stack, scope, first.replica(), targets.nodes, f"{LIGHT:.2f} (learned from 2 pods)"
    )
    heavier = early + timedelta(seconds=1)
    sample(api, home, old, HEAVY, HEAVY_MIB, at=heavier)
    replica = first.replica()
    document = wait_estimate(
        stack, scope, replica, targets.nodes, f"{HEAVY:.2f} (learned from 2 pods)"
    )
    assert gpu_statuses(document, targets.half) == ["utilization"]
    assert place(scope, replica) == targets.spare

    # A rollout: a new revision, lighter, replaces the replicas. The old ones' samples are
    # still there, but once older than the age limit they no longer count: the figure is the
    # new replicas' alone (with them it would be 0.60, from 4 pods).
    aged = heavier + timedelta(seconds=MAX_AGE_S + 1)
    wait_for(
        "the old samples to pass the age limit",
        lambda: datetime.now(UTC) >= aged,
        timeout_s=PHASE_S + 5,
        interval_s=0.2,
    )
    delete_pods(api, old)
    second = apps.revision(deployment, "8c9b7d6f5")
    new_home, new = run_replicas(
        stack, scope, second, running_since=aged - timedelta(seconds=LOAD_DELAY_S + 2)
    )
    sample(api, new_home, new, LIGHT, LIGHT_MIB, at=aged)
    replica = second.replica()
    document = wait_estimate(
        stack, scope, replica, targets.nodes, f"{LIGHT:.2f} (learned from 2 pods)"
    )
    assert gpu_statuses(document, targets.half) == ["candidate"]
    assert place(scope, replica) == targets.half
