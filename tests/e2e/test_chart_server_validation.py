"""Every object the chart renders, accepted by a real kube-apiserver v1.37.

The render tests check the manifests against the published OpenAPI schemas; the API server goes
further: its own validation (a NetworkPolicy's peers, a Deployment's selector against its
template, an admission policy's CEL compiled against the Node schema) and strict field
validation, which refuses a field the type does not have. Each object is created with
`dryRun=All`, so nothing is persisted and the shared control plane is left as it was.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from loopback_cluster.control_plane import KubeApi
from tests.deploy.chart_support import NAMESPACE, VARIANTS, parse_manifests, template
from tests.e2e.support import kube_version

# Kinds served by the operators the chart integrates with, not by kube-apiserver: their CRDs are
# not installed here (the render tests check their shape).
CUSTOM_KINDS = frozenset({"ServiceMonitor", "PrometheusRule", "Certificate"})
# Built-in kinds the chart renders: their plural resource name, and whether they are namespaced.
BUILT_IN: dict[str, tuple[str, bool]] = {
    "ConfigMap": ("configmaps", True),
    "ServiceAccount": ("serviceaccounts", True),
    "Service": ("services", True),
    "Deployment": ("deployments", True),
    "DaemonSet": ("daemonsets", True),
    "Job": ("jobs", True),
    "NetworkPolicy": ("networkpolicies", True),
    "PodDisruptionBudget": ("poddisruptionbudgets", True),
    "Role": ("roles", True),
    "RoleBinding": ("rolebindings", True),
    "ClusterRole": ("clusterroles", False),
    "ClusterRoleBinding": ("clusterrolebindings", False),
    "ValidatingAdmissionPolicy": ("validatingadmissionpolicies", False),
    "ValidatingAdmissionPolicyBinding": ("validatingadmissionpolicybindings", False),
    "MutatingAdmissionPolicy": ("mutatingadmissionpolicies", False),
    "MutatingAdmissionPolicyBinding": ("mutatingadmissionpolicybindings", False),
}
# The variants that between them turn every template on.
CHECKED_VARIANTS = (
    "defaults",
    "full-node",
    "sidecar-tls",
    "network-policy-extra-extender",
    "gpu-data-break-glass",
    "grafana-dashboard",
    "mtls-service-monitor",
    "cert-manager-mtls",
    "tenant-profiles",
    "scheduler-guard-deny",
    "gpu-pod-label",
)


def collection_path(manifest: dict[str, Any]) -> str:
    """The REST collection a manifest is created in (`apiVersion` `v1` is the core group)."""
    plural, namespaced = BUILT_IN[manifest["kind"]]
    api_version = manifest["apiVersion"]
    root = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    if namespaced:
        namespace = manifest["metadata"].get("namespace", NAMESPACE)
        return f"{root}/namespaces/{namespace}/{plural}"
    return f"{root}/{plural}"


def ensure_namespace(api: KubeApi, name: str) -> None:
    status, body = api.raw("POST", "/api/v1/namespaces", {"metadata": {"name": name}})
    assert status in (201, 409), body


@pytest.mark.parametrize("variant", CHECKED_VARIANTS)
def test_the_api_server_accepts_every_rendered_object(admin: KubeApi, variant: str) -> None:
    manifests = parse_manifests(template(VARIANTS[variant].values, kube_version=kube_version()))
    kinds = {m["kind"] for m in manifests}
    # A kind added to the chart is checked here, or listed as served by an operator.
    assert kinds <= BUILT_IN.keys() | CUSTOM_KINDS, sorted(kinds - BUILT_IN.keys() - CUSTOM_KINDS)
    refused: list[str] = []
    checked = 0
    for manifest in manifests:
        if manifest["kind"] in CUSTOM_KINDS:
            continue
        if BUILT_IN[manifest["kind"]][1]:
            ensure_namespace(admin, manifest["metadata"].get("namespace", NAMESPACE))
        path = collection_path(manifest) + "?dryRun=All&fieldValidation=Strict"
        status, body = admin.raw("POST", path, manifest)
        # 409: an earlier test applied the same object for real; the dry run validated it first.
        if status not in (201, 409):
            message = json.loads(body).get("message", body.decode(errors="replace"))
            refused.append(f"{manifest['kind']} {manifest['metadata']['name']}: {message}")
        checked += 1
    assert not refused, "\n".join(refused)
    assert checked >= 10


def test_the_api_server_refuses_an_invalid_object(admin: KubeApi) -> None:
    # The check above can fail: a NetworkPolicy port out of range and a field the type lacks.
    ensure_namespace(admin, NAMESPACE)
    rendered = template({}, kube_version=kube_version())

    def network_policy() -> dict[str, Any]:
        return next(m for m in parse_manifests(rendered) if m["kind"] == "NetworkPolicy")

    policy = network_policy()
    policy["spec"]["ingress"][0]["ports"][0]["port"] = 70_000
    status, body = admin.raw("POST", collection_path(policy) + "?dryRun=All", policy)
    assert status == 422, body
    policy = network_policy()
    policy["spec"]["podSelektor"] = {}
    path = collection_path(policy) + "?dryRun=All&fieldValidation=Strict"
    status, body = admin.raw("POST", path, policy)
    assert status == 400, body
    assert b"podSelektor" in body


def test_a_sidecar_scorer_may_watch_what_it_reads(admin: KubeApi) -> None:
    # In sidecar mode the scorer runs as the chart's kube-scheduler, which the chart binds to
    # system:kube-scheduler and adds no role to: that role must list and watch what the
    # scorer's watches read (Nodes, Pods, and Namespaces for profiles chosen by labels).
    role = admin.get("/apis/rbac.authorization.k8s.io/v1/clusterroles/system:kube-scheduler")
    readable = {
        resource
        for rule in role["rules"]
        if "" in rule.get("apiGroups", []) and {"list", "watch"} <= set(rule.get("verbs", []))
        for resource in rule.get("resources", [])
    }
    assert {"nodes", "pods", "namespaces"} <= readable, sorted(readable)
