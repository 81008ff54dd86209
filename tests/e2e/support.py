"""Shared pieces of the e2e suite (the conftest holds only fixtures)."""

from __future__ import annotations

import contextlib
import json
import os
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest

from kube_standins.nodes import gpu_node
from loopback_cluster.control_plane import (
    SERVICE_ACCOUNT_ISSUER,
    BuildSpec,
    ControlPlane,
    KubeApi,
    missing_binaries_reason,
    running_control_plane,
)
from loopback_cluster.workload import (
    apply,
    delete_nodes,
    delete_pods,
    pod_bound_token,
    pod_node,
    register_node,
    wait_for,
)
from tests.deploy.chart_support import NAMESPACE, parse_manifests, template

# Watch events reach every watcher on loopback within milliseconds; this leaves a wide margin.
SETTLE_S = 0.5


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


@dataclass
class Scope:
    """One test's Nodes and pods, labelled so that no other test's pods can land on them."""

    api: KubeApi
    label: str
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

    def settle(self) -> None:
        """Let the watchers (kube-scheduler's informers, the scorer's node cache) catch up.

        A pod created in the same millisecond as a Node write can be scheduled on the
        scheduler's older copy of that Node: there is no ordering between the Node and the pod
        watches, and nothing the API offers says when another client's informer has an event.
        Tests that lay out GPU data and then create pods wait this long in between.
        """
        time.sleep(SETTLE_S)

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
            document = json.loads(response.read())
    except urllib.error.HTTPError as exc:
        raise AssertionError(f"explain answered {exc.code}: {exc.read()[:500]!r}") from None
    if "nodes" not in document:
        raise AssertionError(f"explain failed: {document}")
    return {node["name"]: node for node in document["nodes"]}


def inflight_refs(node: Mapping[str, Any]) -> list[str]:
    """`namespace/name` of the in-flight pods an explained node's verdict counted."""
    inflight = node["inflight"]
    return [] if inflight is None else [p["pod"] for p in inflight["pods"]]
