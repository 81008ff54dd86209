"""Both binaries run from the image on the real control plane, as the chart runs them.

Each starts from the image's root filesystem (read-only, an empty `/tmp`) with the command,
arguments, environment and user that `helm template` renders for its pod, and the Kubernetes
credentials a pod gets: a service-account token of the chart's own account (with the chart's RBAC,
and for the agent the chart's admission policy) mounted where the client looks for it, and
`KUBERNETES_SERVICE_HOST`/`_PORT`. The scorer in names-only mode is the real kube-scheduler's
extender; the agent, on the simulated source, patches its own Node. SIGTERM ends each with exit 0.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from gpu_contract.schema import DEFAULT_KEYS, FIELD_MANAGER, Field
from loopback_cluster.control_plane import (
    LOOPBACK,
    SERVICE_ACCOUNT_ISSUER,
    ControlPlane,
    ExtenderConfig,
    KubeApi,
    SchedulerConfig,
    free_port,
)
from loopback_cluster.image import MountedImage
from loopback_cluster.workload import (
    ScorerProcess,
    apply,
    gpu_pod,
    gpu_state,
    pod_node,
    publish,
    wait_for,
)
from tests.deploy.chart_support import NAMESPACE, Rendered, parse_manifests, template
from tests.deploy.image_support import (
    chart_container,
    image_process,
    mounted_image,
    service_account_files,
)
from tests.e2e.support import Scope, installed_agent, settles_with, wait_failed_scheduling


@pytest.fixture(scope="module")
def mounted(control_plane: ControlPlane) -> Iterator[MountedImage]:
    with mounted_image() as found:
        yield found


def _render(values: dict[str, Any]) -> Rendered:
    text = template(values)
    return Rendered(text=text, manifests=parse_manifests(text))


def _token(api: KubeApi, service_account: str) -> str:
    """A TokenRequest for the chart's service account, as the kubelet asks for a pod."""
    request = {
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenRequest",
        "spec": {"audiences": [SERVICE_ACCOUNT_ISSUER], "expirationSeconds": 3600},
    }
    path = f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts/{service_account}/token"
    return str(api.create(path, request)["status"]["token"])


def _scorer_identity(api: KubeApi, rendered: Rendered) -> str:
    """Apply the chart's scorer ServiceAccount and RBAC; the account's name."""
    status, _ = api.raw("POST", "/api/v1/namespaces", {"metadata": {"name": NAMESPACE}})
    assert status in (201, 409)
    kinds = {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"}
    chosen = [
        m
        for m in rendered.manifests
        if m["kind"] in kinds
        and m["metadata"]["labels"].get("app.kubernetes.io/component") == "scorer"
    ]
    for manifest in chosen:
        apply(api, manifest, namespace=NAMESPACE)
    (name,) = [m["metadata"]["name"] for m in chosen if m["kind"] == "ServiceAccount"]
    return str(name)


def _extender(rendered: Rendered, url: str) -> ExtenderConfig:
    """The chart's extender entry, pointed at the scorer on loopback; not ignorable here, so a
    scorer that fails cannot go unnoticed behind kube-scheduler's own choice."""
    (entry,) = rendered.scheduler_config()["extenders"]
    (resource,) = entry["managedResources"]
    return ExtenderConfig(
        url,
        node_cache_capable=entry["nodeCacheCapable"],
        ignorable=False,
        weight=entry["weight"],
        managed_resource=resource["name"],
    )


def test_the_scorer_from_the_image_places_pods_for_the_real_scheduler(
    mounted: MountedImage, control_plane: ControlPlane, scope: Scope, tmp_path: Path
) -> None:
    port, metrics_port = free_port(), free_port()
    rendered = _render({"scorer": {"host": LOOPBACK, "port": port, "metricsPort": metrics_port}})
    api = scope.api
    account = _scorer_identity(api, rendered)
    credentials = service_account_files(
        tmp_path / "serviceaccount",
        token=_token(api, account),
        ca_file=control_plane.pki.ca_cert,
        namespace=NAMESPACE,
    )
    container = chart_container(
        rendered, "scorer", service_account=credentials, api_port=control_plane.ports.apiserver
    )
    assert (container.uid, container.gid) == (65532, 65532)
    assert container.env["GPU_SCORER_NODE_CACHE"] == "true"
    scorer = ScorerProcess(
        name="gpu-scorer", argv=mounted.argv(container), log_path=tmp_path / "scorer.log", port=port
    )
    scheduler_name = f"{scope.label}-image"
    scorer.start()
    try:
        scorer.wait_ready()
        extender = _extender(rendered, scorer.url)
        assert extender.node_cache_capable
        control_plane.start_scheduler(SchedulerConfig(scheduler_name, extender))
        try:
            # Its node cache is waited for by `settle`, as a stack's scorer is.
            with settles_with(scorer):
                now = datetime.now(UTC)
                cool, hot = scope.node("cool"), scope.node("hot")
                scorching = scope.node("scorching")
                publish(api, cool, gpu_state(utilization=0.10, at=now))
                publish(api, hot, gpu_state(utilization=0.95, at=now))
                publish(api, scorching, gpu_state(utilization=0.10, temperature_c=88, at=now))
                scope.settle()
                first = scope.pod(gpu_pod(scope.name("first"), scheduler_name=scheduler_name))
                bound = wait_for("the pod to bind", lambda: pod_node(api, first), timeout_s=30)
                assert bound == cool

                # Once the cool node is hot too, no node passes: the reasons are the scorer's.
                publish(api, cool, gpu_state(utilization=0.97))
                scope.settle()
                second = scope.pod(gpu_pod(scope.name("second"), scheduler_name=scheduler_name))
                # Reasons are listed sorted; an earlier attempt may have seen another state.
                wait_failed_scheduling(
                    api,
                    second,
                    starting_with="0/3 nodes are available: 1 gpu temperature at or above 85C, "
                    "2 gpu utilization above 0.90.",
                )
                assert pod_node(api, second) is None
        finally:
            control_plane.stop_scheduler(f"kube-scheduler-{scheduler_name}")
        assert scorer.alive(), scorer.log()
        exit_code = scorer.terminate()
    finally:
        scorer.kill()
    assert exit_code == 0, scorer.log()
    assert "shutdown complete" in scorer.log()


def test_the_agent_from_the_image_patches_its_own_node(
    mounted: MountedImage, control_plane: ControlPlane, scope: Scope, tmp_path: Path
) -> None:
    values = {
        "agent": {
            "source": "simulated",
            # No kubelet here; without its socket the chart runs the agent as its non-root user.
            "podResources": {"enabled": False},
            "sampleIntervalSeconds": 0.5,
            "minWriteIntervalSeconds": 1,
            "heartbeatSeconds": 2,
            "metricsPort": free_port(),
        }
    }
    rendered = _render(values)
    with installed_agent(
        scope, policies=("agent-own-node-annotations",), values=values
    ) as identity:
        credentials = service_account_files(
            tmp_path / "serviceaccount",
            token=identity.token,
            ca_file=control_plane.pki.ca_cert,
            namespace=NAMESPACE,
        )
        container = chart_container(
            rendered,
            "agent",
            fields={"spec.nodeName": identity.own_node},
            service_account=credentials,
            api_port=control_plane.ports.apiserver,
        )
        assert (container.uid, container.gid) == (65532, 65532)
        assert container.argv == ["gpu-agent", "run"]
        agent = image_process(mounted, container, tmp_path / "agent.log", "gpu-agent").start()
        try:

            def written() -> dict[str, Any] | None:
                node: dict[str, Any] = scope.api.get(f"/api/v1/nodes/{identity.own_node}")
                entries = [
                    e for e in node["metadata"]["managedFields"] if e["manager"] == FIELD_MANAGER
                ]
                return node if entries else None

            node = wait_for("the agent's first write", written, timeout_s=30, interval_s=0.2)
            assert agent.alive(), agent.log()
            exit_code = agent.terminate()
        finally:
            agent.kill()
    assert exit_code == 0, agent.log()
    assert "gpu-agent stopped" in agent.log()
    annotations = node["metadata"]["annotations"]
    assert annotations[DEFAULT_KEYS[Field.SCHEMA_VERSION]] == "1"
    assert annotations[DEFAULT_KEYS[Field.HEALTH]] == "ok"
    (entry,) = [e for e in node["metadata"]["managedFields"] if e["manager"] == FIELD_MANAGER]
    owned = entry["fieldsV1"]["f:metadata"]["f:annotations"]
    assert f"f:{DEFAULT_KEYS[Field.UTILIZATION]}" in owned
    # Nothing was written to the other Node (the admission policy would refuse it anyway).
    other = scope.api.get(f"/api/v1/nodes/{identity.other_node}")
    assert DEFAULT_KEYS[Field.UTILIZATION] not in other["metadata"]["annotations"]
