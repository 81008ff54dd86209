"""Shared pieces of the e2e suite (the conftest holds only fixtures)."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import signal
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import pytest

from kube_standins.nodes import gpu_node
from loopback_cluster.control_plane import (
    SERVICE_ACCOUNT_ISSUER,
    BuildSpec,
    ControlPlane,
    ExtenderConfig,
    KubeApi,
    ManagedProcess,
    SchedulerConfig,
    missing_binaries_reason,
    running_control_plane,
)
from loopback_cluster.workload import (
    ScorerProcess,
    apply,
    delete_nodes,
    delete_pods,
    gpu_state,
    pod_bound_token,
    pod_events,
    pod_node,
    publish,
    register_node,
    scorer_process,
    wait_for,
)
from tests.deploy.chart_support import NAMESPACE, parse_manifests, template

# Watch events reach every watcher on loopback within milliseconds: the deadline of a wait.
SETTLE_S = 15.0
# The scorer's Pod and Namespace watches list within milliseconds on loopback; the deadline.
WATCH_SYNC_S = 15.0
# kube-scheduler writes a FailedScheduling event within a second of the failed attempt; a
# pod rejected first for another reason is retried after its back-off (1 s doubling to 10 s).
FAILED_SCHEDULING_S = 20.0


@contextlib.contextmanager
def started_control_plane(
    factory: pytest.TempPathFactory,
    name: str,
    *,
    feature_gates: Mapping[str, bool] | None = None,
    runtime_config: Sequence[str] = (),
) -> Iterator[ControlPlane]:
    """A control plane under a fresh temporary directory: the suite's, or a test module's own
    (for tests that stop parts of it, install a policy that would refuse other tests' writes,
    or need a feature gate). Skipped without the binaries locally, failed in CI."""
    require_control_plane()
    with running_control_plane(
        factory.mktemp(name), feature_gates=feature_gates, runtime_config=runtime_config
    ) as plane:
        yield plane


def require_control_plane() -> None:
    """Skip without the built binaries locally; fail without them in CI (`CI=true`). The
    version is the one `$LOOPBACK_KUBERNETES` chooses (default: the newest pinned)."""
    reason = missing_binaries_reason(BuildSpec.for_version())
    if reason is None:
        return
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(reason + "; CI must run the e2e suite")
    pytest.skip(reason)


def require_kubernetes(minor: str, why: str) -> None:
    """Skip a test of a feature that the chosen control plane's version does not have (the
    version matrix runs the suite on older minors too)."""
    spec = BuildSpec.for_version()
    if _minor_key(spec.minor) < _minor_key(minor):
        pytest.skip(
            f"needs Kubernetes {minor} or later ({why}); this run: {spec.kubernetes_version}"
        )


def kube_version() -> str:
    """The chosen control plane's version as helm's `--kube-version` takes it (`1.37.2`)."""
    return BuildSpec.for_version().kubernetes_version.removeprefix("v")


def _minor_key(minor: str) -> tuple[int, int]:
    major, number = minor.removeprefix("v").split(".")[:2]
    return int(major), int(number)


_BARRIERS = itertools.count()
# The names-only scorers running (`settles_with`): `Scope.settle` waits for them.
_NAMES_ONLY_SCORERS: list[ScorerProcess] = []


@contextlib.contextmanager
def settles_with(scorer: ScorerProcess) -> Iterator[None]:
    """While in this block, `Scope.settle` also waits until the names-only `scorer`'s node
    cache holds every Node write made so far: a pod scheduled through it must not be judged on
    a Node the scorer has not yet seen written."""
    _NAMES_ONLY_SCORERS.append(scorer)
    try:
        yield
    finally:
        _NAMES_ONLY_SCORERS.remove(scorer)


def _wait_for_cache_dump(
    process: ManagedProcess, node: str, *, listed: bool, timeout_s: float = SETTLE_S
) -> None:
    """Until a dump of kube-scheduler's cache (its cache debugger answers SIGUSR2) made after
    this call lists `node` (or no longer does)."""
    start = process.log_path.stat().st_size if process.log_path.exists() else 0

    def dumped() -> bool:
        pid = process.popen.pid if process.popen is not None else process.recorded_pid()
        if pid is None:
            raise AssertionError(f"{process.name} is not running")
        os.kill(pid, signal.SIGUSR2)
        with process.log_path.open("rb") as log:
            log.seek(start)
            text = log.read().decode(errors="replace")
        # The nodes' dump, then the queue's: the last complete pair is the newest view.
        end = text.rfind("Dump of scheduling queue")
        begin = text.rfind("Dump of cached NodeInfo", 0, max(end, 0))
        return end >= 0 and begin >= 0 and (node in text[begin:end]) == listed

    state = "hold" if listed else "drop"
    wait_for(f"{process.name}'s cache to {state} Node {node}", dumped, timeout_s=timeout_s)


def _cached_by_scorer(url: str, api: KubeApi, pod: Mapping[str, Any], node: str) -> bool:
    # A Node the cache does not hold is judged as one without annotations: missing data.
    explained = explain_nodes(url, api, pod, [node], names_only=True)
    return bool(explained[node]["data_status"] != "missing")


@dataclass
class Scope:
    """One test's Nodes and pods, labelled so that no other test's pods can land on them."""

    api: KubeApi
    label: str
    # The control plane whose kube-schedulers `settle` waits for (None: only the scorers).
    plane: ControlPlane | None = None
    nodes: list[str] = field(default_factory=list)
    pods: list[str] = field(default_factory=list)

    def node(
        self,
        short_name: str,
        *,
        product: str = "NVIDIA-A100-SXM4-80GB",
        gpus: int = 8,
        cpu: str | None = None,
        annotations: Mapping[str, str] | None = None,
    ) -> str:
        """Register a GPU Node of this scope; its full name is returned."""
        name = f"{self.label}-{short_name}"
        node = gpu_node(name, gpu_count=gpus, product=product, labels={"e2e-scope": self.label})
        node["metadata"]["annotations"].update(annotations or {})
        if cpu is not None:
            node["status"]["allocatable"]["cpu"] = cpu
            node["status"]["capacity"]["cpu"] = cpu
        register_node(self.api, node)
        self.nodes.append(name)
        return name

    def pod(self, pod: dict[str, Any]) -> str:
        """Create `pod` restricted to this scope's Nodes; its name is returned."""
        pod["spec"].setdefault("nodeSelector", {})["e2e-scope"] = self.label
        namespace = pod["metadata"].get("namespace", "default")
        self.api.create(f"/api/v1/namespaces/{namespace}/pods", pod)
        self.pods.append(pod["metadata"]["name"])
        return str(pod["metadata"]["name"])

    def settle(self, *, timeout_s: float = SETTLE_S) -> None:
        """Wait until the watchers (every kube-scheduler of `plane`, every names-only scorer's
        node cache) hold every Node write made so far.

        A pod created in the same millisecond as a Node write can be scheduled on the
        scheduler's older copy of that Node: there is no ordering between the Node and the pod
        watches, and the API cannot say when another client's informer has an event. But one
        watch delivers every Node event in resourceVersion order, so a watcher that has a Node
        created now has every earlier Node write. That barrier Node is unschedulable and outside
        the scope (no pod can land on it), with GPU data (so a scorer's cache can be asked).
        kube-scheduler shows its cache on SIGUSR2 (its cache debugger logs every cached Node);
        a names-only scorer shows it in `/explain`. The barrier is then deleted, and waited for
        until the schedulers no longer hold it, so that it never counts in a test's messages.
        """
        barrier = self.name(f"barrier-{next(_BARRIERS)}")
        node = gpu_node(barrier, labels={"e2e-barrier": self.label})
        node["spec"]["unschedulable"] = True
        register_node(self.api, node)
        self.nodes.append(barrier)
        publish(self.api, barrier, gpu_state(utilization=0.0, temperature_c=40))
        schedulers = [] if self.plane is None else list(self.plane.schedulers.values())
        for scheduler in schedulers:
            _wait_for_cache_dump(scheduler.process, barrier, listed=True, timeout_s=timeout_s)
        probe = {"metadata": {"name": f"{barrier}-probe"}, "spec": {"containers": []}}
        for scorer in list(_NAMES_ONLY_SCORERS):
            wait_for(
                f"{scorer.name}'s node cache to hold {barrier}",
                lambda s=scorer: _cached_by_scorer(s.url, self.api, probe, barrier),
                timeout_s=timeout_s,
            )
        # Gone again before the test goes on, or it would count in FailedScheduling messages
        # ("1 node(s) were unschedulable").
        delete_nodes(self.api, [barrier])
        self.nodes.remove(barrier)
        for scheduler in schedulers:
            _wait_for_cache_dump(scheduler.process, barrier, listed=False, timeout_s=timeout_s)

    def name(self, short_name: str) -> str:
        return f"{self.label}-{short_name}"

    def cleanup(self) -> None:
        delete_pods(self.api, self.pods)
        delete_nodes(self.api, self.nodes)


# ----------------------------------------------------------------------------- the chart's agent

_VAP_PATH = "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies"
_BINDING_PATH = "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings"


@dataclass
class AgentIdentity:
    """The chart's agent service account, with a token bound to a pod on `own_node`."""

    token: str
    service_account: str
    own_node: str
    other_node: str


def chart_objects(values: Mapping[str, Any], kinds: set[str]) -> list[dict[str, Any]]:
    """The chart's objects of these kinds, as `helm template` renders them with `values`."""
    return [m for m in parse_manifests(template(values)) if m["kind"] in kinds]


@contextlib.contextmanager
def installed_agent(
    scope: Scope, *, policies: Sequence[str], values: Mapping[str, Any] | None = None
) -> Iterator[AgentIdentity]:
    """Apply the chart's agent ServiceAccount, RBAC and the admission policies whose names end
    with one of `policies`; create two Nodes and a pod-bound token for the agent on the first.
    The policies are removed afterwards."""
    api = scope.api
    status, _ = api.raw("POST", "/api/v1/namespaces", {"metadata": {"name": NAMESPACE}})
    assert status in (201, 409)
    objects = chart_objects(
        values or {},
        {
            "ServiceAccount",
            "ClusterRole",
            "ClusterRoleBinding",
            "ValidatingAdmissionPolicy",
            "ValidatingAdmissionPolicyBinding",
        },
    )
    chosen = [
        o
        for o in objects
        if o["metadata"]["labels"].get("app.kubernetes.io/component") == "agent"
        and (
            not o["kind"].startswith("ValidatingAdmissionPolicy")
            or o["metadata"]["name"].endswith(tuple(policies))
        )
    ]
    found = {o["metadata"]["name"] for o in chosen if o["kind"] == "ValidatingAdmissionPolicy"}
    assert len(found) == len(policies), found
    for manifest in chosen:
        apply(api, manifest, namespace=NAMESPACE)
    (service_account,) = [o["metadata"]["name"] for o in chosen if o["kind"] == "ServiceAccount"]

    own, other = scope.node("own"), scope.node("other")
    pod = api.create(
        f"/api/v1/namespaces/{NAMESPACE}/pods",
        {
            "metadata": {"name": scope.name("agent")},
            "spec": {
                "serviceAccountName": service_account,
                "nodeName": own,
                "terminationGracePeriodSeconds": 0,
                "containers": [{"name": "agent", "image": "gpu-live-scheduler:e2e"}],
            },
        },
    )
    token = pod_bound_token(
        api,
        namespace=NAMESPACE,
        service_account=service_account,
        pod=pod,
        audience=SERVICE_ACCOUNT_ISSUER,
    )
    try:
        yield AgentIdentity(token, service_account, own, other)
    finally:
        api.delete(f"/api/v1/namespaces/{NAMESPACE}/pods/{pod['metadata']['name']}")
        for manifest in chosen:
            name = manifest["metadata"]["name"]
            if manifest["kind"] == "ValidatingAdmissionPolicyBinding":
                api.delete(f"{_BINDING_PATH}/{name}")
            elif manifest["kind"] == "ValidatingAdmissionPolicy":
                api.delete(f"{_VAP_PATH}/{name}")


# ----------------------------------------------------------------------------- pods and verdicts


def bound_nodes(api: KubeApi, pods: Sequence[str], *, timeout_s: float = 30.0) -> dict[str, str]:
    """pod -> node once every pod is bound."""

    def all_bound() -> dict[str, str] | None:
        placed = {pod: pod_node(api, pod) for pod in pods}
        if all(placed.values()):
            return {pod: node for pod, node in placed.items() if node}
        return None

    return wait_for(f"{len(pods)} pods to be bound", all_bound, timeout_s=timeout_s)


def explain_nodes(
    scorer_url: str,
    api: KubeApi,
    pod: Mapping[str, Any],
    nodes: Sequence[str],
    *,
    names_only: bool,
) -> dict[str, dict[str, Any]]:
    """The scorer's explanation of each node for `pod` (`POST /explain`), by node name: sent
    as the scheduler would send it, node names only or the Node objects as the API holds them."""
    document = explain(scorer_url, api, pod, nodes, names_only=names_only)
    return {node["name"]: node for node in document["nodes"]}


def explain(
    scorer_url: str,
    api: KubeApi,
    pod: Mapping[str, Any],
    nodes: Sequence[str],
    *,
    names_only: bool,
) -> dict[str, Any]:
    """The scorer's whole explanation for `pod` on `nodes` (`POST /explain`), as `explain_nodes`
    asks it: the pod-level parts too (its hints, its own load, the policy)."""
    if names_only:
        args: dict[str, Any] = {"Pod": pod, "Nodes": None, "NodeNames": list(nodes)}
    else:
        items = [api.get(f"/api/v1/nodes/{name}") for name in nodes]
        args = {"Pod": pod, "Nodes": {"items": items}, "NodeNames": None}
    request = urllib.request.Request(
        f"{scorer_url}/explain",
        data=json.dumps(args).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            document: dict[str, Any] = json.loads(response.read())
    except urllib.error.HTTPError as exc:
        raise AssertionError(f"explain answered {exc.code}: {exc.read()[:500]!r}") from None
    if "nodes" not in document:
        raise AssertionError(f"explain failed: {document}")
    return document


def inflight_refs(node: Mapping[str, Any]) -> list[str]:
    """`namespace/name` of the in-flight pods an explained node's verdict counted."""
    inflight = node["inflight"]
    return [] if inflight is None else [p["pod"] for p in inflight["pods"]]


def create_namespace(api: KubeApi, name: str, labels: Mapping[str, str] | None = None) -> None:
    """Create the Namespace `name` (kept if it exists) and its `default` ServiceAccount, which
    pods need and which no controller-manager creates here."""
    status, body = api.raw(
        "POST", "/api/v1/namespaces", {"metadata": {"name": name, "labels": dict(labels or {})}}
    )
    assert status in (201, 409), body
    status, body = api.raw(
        "POST",
        f"/api/v1/namespaces/{name}/serviceaccounts",
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default"}},
    )
    assert status in (201, 409), body


def failed_scheduling_messages(api: KubeApi, pod: str, namespace: str = "default") -> list[str]:
    """The messages of the pod's FailedScheduling events, oldest first (read once)."""
    return [
        text for reason, text in pod_events(api, pod, namespace) if reason == "FailedScheduling"
    ]


def wait_failed_scheduling(
    api: KubeApi,
    pod: str,
    namespace: str = "default",
    *,
    starting_with: str,
    timeout_s: float = FAILED_SCHEDULING_S,
) -> str:
    """The first FailedScheduling message of `pod` that starts with `starting_with`, once
    kube-scheduler has written one; an AssertionError names the messages seen by the deadline.

    A pod can be rejected for another reason first (a slot held by a proposal the scorer's
    watch has not confirmed yet, a node its informer has not seen), and events are written
    after the attempt, so a reader waits for the message it expects rather than taking the
    first or the latest one there is.
    """
    seen: list[str] = []

    def matching() -> str | None:
        seen[:] = failed_scheduling_messages(api, pod, namespace)
        return next((text for text in seen if text.startswith(starting_with)), None)

    try:
        return wait_for(
            f"a FailedScheduling event for {namespace}/{pod}", matching, timeout_s=timeout_s
        )
    except TimeoutError as error:
        raise AssertionError(
            f"{error}: no message starts with {starting_with!r}; seen: {seen}"
        ) from None


# ----------------------------------------------------------------------------- scorer stacks

Mode = Literal["names", "full"]
# names: `nodeCacheCapable: true`, the scorer list+watches Nodes; full: Node objects in requests.
MODES: tuple[Mode, ...] = ("names", "full")
INFLIGHT_ACCOUNTING = "gpu_scorer_inflight_accounting"
NAMESPACE_CACHE_READY = "gpu_scorer_namespace_cache_ready"


@dataclass(frozen=True)
class StackSpec:
    """What a test module's scorer + kube-scheduler pair runs with (one pair per mode)."""

    # Names the scheduler (`{purpose}-{mode}`) and the scorer process; unique per module, so
    # each module's pods reach only its own scheduler.
    purpose: str
    # The scorer's Pod watch (in-flight accounting, spread groups): credentials in both modes.
    # Off, the full-node scorer runs without credentials, as a deployment without RBAC can;
    # the names-only one has them for its node cache and so watches pods too.
    in_flight: bool = True
    # The scorer's `--policy-file` content, or None for the built-in policy.
    policy_yaml: str | None = None
    # The policy chooses a profile by namespace labels: wait for the Namespace watch too.
    namespace_watch: bool = False
    # Namespaces (name -> labels) created before the scorer starts, so its first list has them.
    namespaces: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    # More `gpu-scorer serve` flags: settings that are not policy (the policy file's are).
    scorer_flags: tuple[str, ...] = ()


@dataclass
class ScorerStack:
    """A running `gpu-scorer` and the kube-scheduler whose only profile calls it."""

    mode: Mode
    scheduler_name: str
    scorer: ScorerProcess

    @property
    def names_only(self) -> bool:
        return self.mode == "names"


@contextlib.contextmanager
def started_stack(
    control_plane: ControlPlane, log_dir: Path, spec: StackSpec, mode: Mode
) -> Iterator[ScorerStack]:
    """Start the scorer (ready, its watches synced), then a kube-scheduler calling it with
    `ignorable: false`, so that a scorer fault fails the pod instead of hiding behind the
    default plugins; both are stopped afterwards."""
    names_only = mode == "names"
    with control_plane.admin() as api:
        for namespace, labels in spec.namespaces.items():
            create_namespace(api, namespace, labels)
    extra_args = list(spec.scorer_flags)
    if spec.policy_yaml is not None:
        policy = log_dir / "policy.yaml"
        policy.write_text(spec.policy_yaml)
        extra_args.append(f"--policy-file={policy}")
    scheduler_name = f"{spec.purpose}-{mode}"
    scorer = scorer_process(
        log_dir,
        kubeconfig=control_plane.admin_kubeconfig if names_only or spec.in_flight else None,
        node_cache=names_only,
        name=f"gpu-scorer-{scheduler_name}",
        extra_args=extra_args,
    )
    scorer.start()
    try:
        scorer.wait_ready()
        watches = [INFLIGHT_ACCOUNTING] if spec.in_flight else []
        watches += [NAMESPACE_CACHE_READY] if spec.namespace_watch else []
        wait_for(
            f"the scorer's watches to sync ({', '.join(watches)})",
            lambda: all(scorer.metric(metric) == 1 for metric in watches),
            timeout_s=WATCH_SYNC_S,
        )
        extender = ExtenderConfig(scorer.url, node_cache_capable=names_only, ignorable=False)
        control_plane.start_scheduler(SchedulerConfig(scheduler_name, extender))
        try:
            with settles_with(scorer) if names_only else contextlib.nullcontext():
                yield ScorerStack(mode, scheduler_name, scorer)
        finally:
            control_plane.stop_scheduler(f"kube-scheduler-{scheduler_name}")
    finally:
        scorer.kill()


def stack_fixture(spec: StackSpec) -> Any:
    """A module-scoped `stack` fixture, one stack per mode: `stack = stack_fixture(...)` in a
    test module runs each of its tests that take `stack` in both modes."""

    @pytest.fixture(scope="module", params=MODES)
    def stack(
        request: pytest.FixtureRequest,
        control_plane: ControlPlane,
        tmp_path_factory: pytest.TempPathFactory,
    ) -> Iterator[ScorerStack]:
        mode: Mode = request.param
        log_dir = tmp_path_factory.mktemp(f"{spec.purpose}-{mode}")
        with started_stack(control_plane, log_dir, spec, mode) as running_stack:
            yield running_stack

    return stack
