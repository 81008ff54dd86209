"""A gang waiting unbound on the real kube-scheduler v1.37 is counted where it is nominated.

Kubernetes v1.37's gang scheduling (the `scheduling.k8s.io/v1beta1` PodGroup, beta and off by
default: the `GenericWorkload` feature gate) places a gang's members together and lets them
through Permit only once `minCount` of them are placed; since KEP-5278 the scheduler writes
`status.nominatedNodeName` on a pod before a Permit wait or a PreBind that takes time. On a
real v1.37 scheduler a gang whose members are all created goes through Permit within
milliseconds (its members are placed in one pod-group cycle), so a gang that waits long enough
to matter waits in PreBind: here each worker has a volume of a StorageClass whose provisioner
never answers (as a CSI driver that is slow or down), and the scheduler holds the gang at
PreBind, nominated and unbound, for its 600 s bind timeout.

The scorer is restarted once the gang waits, so that its own proposals (10 s, made while it
scored the gang) are gone: what it counts then comes from its nominated-pod watch alone.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpu_contract.schema import DEFAULT_PREFIX
from loopback_cluster.control_plane import ControlPlane, ExtenderConfig, KubeApi, SchedulerConfig
from loopback_cluster.workload import (
    gpu_pod,
    gpu_state,
    publish,
    scorer_process,
    wait_for,
)
from tests.e2e.support import (
    Scope,
    bound_nodes,
    explain_nodes,
    require_kubernetes,
    started_control_plane,
)

pytestmark = pytest.mark.e2e

SCHEDULER = "gang-gpu"
GANG = 4
# The watches and the scheduler's cycles take milliseconds on loopback; these are deadlines.
WAIT_S = 30.0
STORAGE_CLASS = "never-provisioned"


@pytest.fixture(scope="module")
def gang_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    require_kubernetes("v1.37", "the PodGroup API and nominations before PreBind")
    with started_control_plane(
        tmp_path_factory,
        "gang-plane",
        feature_gates={"GenericWorkload": True},
        runtime_config=["scheduling.k8s.io/v1beta1=true"],
    ) as plane:
        yield plane


@pytest.fixture
def gang_admin(gang_plane: ControlPlane) -> Iterator[KubeApi]:
    with gang_plane.admin() as api:
        yield api


def storage_class() -> dict[str, Any]:
    return {
        "apiVersion": "storage.k8s.io/v1",
        "kind": "StorageClass",
        "metadata": {"name": STORAGE_CLASS},
        # No controller provisions for it: the scheduler's PreBind waits for the volume.
        "provisioner": "example.com/never-provisioned",
        "volumeBindingMode": "WaitForFirstConsumer",
    }


def claim(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "storageClassName": STORAGE_CLASS,
            "resources": {"requests": {"storage": "1Gi"}},
        },
    }


def gang_worker(name: str, *, group: str, node: str, claim_name: str) -> dict[str, Any]:
    """A one-GPU worker of pod group `group`, pinned to `node` (the gang's rack), with a
    scratch volume that is never provisioned. It says it fills its GPU (`expected-gpu-load`
    0.90, as training workers do), so the gang, counted where it waits, leaves its rack
    clearly busier than the other node (4 x 0.90 over 8 GPUs: +0.45 to its mean), whatever the
    policy's default estimate."""
    pod = gpu_pod(name, scheduler_name=SCHEDULER)
    pod["metadata"].setdefault("annotations", {})[DEFAULT_PREFIX + "expected-gpu-load"] = "0.90"
    spec = pod["spec"]
    spec["schedulingGroup"] = {"podGroupName": group}
    spec["affinity"] = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
                ]
            }
        }
    }
    spec["volumes"] = [{"name": "scratch", "persistentVolumeClaim": {"claimName": claim_name}}]
    spec["containers"][0]["volumeMounts"] = [{"name": "scratch", "mountPath": "/scratch"}]
    return pod


def nomination(api: KubeApi, name: str) -> tuple[str | None, str | None]:
    pod = api.get(f"/api/v1/namespaces/default/pods/{name}")
    return pod["spec"].get("nodeName"), pod["status"].get("nominatedNodeName")


def test_a_gang_waiting_unbound_is_counted_on_its_nominated_node(
    gang_plane: ControlPlane, gang_admin: KubeApi, tmp_path: Path
) -> None:
    api = gang_admin
    scope = Scope(api, "gang", gang_plane)
    logs = tmp_path / "logs"
    logs.mkdir()
    first = scorer_process(logs, kubeconfig=gang_plane.admin_kubeconfig, name="scorer-1")
    first.start().wait_ready()
    extender = ExtenderConfig(first.url, ignorable=False)
    gang_plane.start_scheduler(SchedulerConfig(SCHEDULER, extender))
    claims: list[str] = []
    try:
        # Mixed nodes: the gang's rack looks idler than the other node by its data alone.
        rack = scope.node("rack", gpus=8)
        other = scope.node("other", gpus=8, product="NVIDIA-H100-80GB-HBM3")
        publish(api, rack, gpu_state(utilization=0.0))
        publish(api, other, gpu_state(utilization=0.20, gpu_model="NVIDIA-H100-80GB-HBM3"))
        api.create("/apis/storage.k8s.io/v1/storageclasses", storage_class())
        api.create(
            "/apis/scheduling.k8s.io/v1beta1/namespaces/default/podgroups",
            {
                "apiVersion": "scheduling.k8s.io/v1beta1",
                "kind": "PodGroup",
                "metadata": {"name": "train", "namespace": "default"},
                "spec": {"schedulingPolicy": {"gang": {"minCount": GANG}}},
            },
        )
        scope.settle()
        workers = []
        for i in range(GANG):
            claim_name = f"scratch-{i}"
            api.create("/api/v1/namespaces/default/persistentvolumeclaims", claim(claim_name))
            claims.append(claim_name)
            worker = gang_worker(
                scope.name(f"worker-{i}"), group="train", node=rack, claim_name=claim_name
            )
            workers.append(scope.pod(worker))

        # The whole gang passes Permit and waits in PreBind: nominated to the rack, unbound.
        def gang_waiting() -> bool:
            return all(nomination(api, w) == (None, rack) for w in workers)

        wait_for(
            "the gang to be nominated to its rack and left unbound", gang_waiting, timeout_s=WAIT_S
        )

        # A fresh scorer: no proposals of its own, only what its watches list.
        first.kill()
        second = scorer_process(
            logs, kubeconfig=gang_plane.admin_kubeconfig, port=first.port, name="scorer-2"
        )
        second.start().wait_ready()
        wait_for(
            "the scorer's nominated-pod watch to sync",
            lambda: (
                second.metric("gpu_scorer_nominated_pod_cache_ready") == 1
                and second.metric("gpu_scorer_inflight_accounting") == 1
            ),
            timeout_s=WAIT_S,
        )
        probe = gpu_pod(scope.name("probe"), scheduler_name=SCHEDULER)
        explained = explain_nodes(second.url, api, probe, [rack, other], names_only=True)
        counted = explained[rack]["inflight"]["pods"]
        assert sorted(p["pod"] for p in counted) == sorted(f"default/{w}" for w in workers)
        assert all(p["nominated"] and not p["provisional"] for p in counted)
        assert explained[other]["inflight"] is None

        # The next pods go to the other node: the rack's four idle-looking GPUs are promised.
        later = [
            scope.pod(gpu_pod(scope.name(f"next-{i}"), scheduler_name=SCHEDULER)) for i in range(2)
        ]
        assert set(bound_nodes(api, later, timeout_s=WAIT_S).values()) == {other}
        assert all(nomination(api, w) == (None, rack) for w in workers)  # still waiting
        second.kill()
    finally:
        first.kill()
        gang_plane.stop_scheduler(f"kube-scheduler-{SCHEDULER}")
        scope.cleanup()
        for name in claims:
            api.delete(f"/api/v1/namespaces/default/persistentvolumeclaims/{name}")
        api.delete(f"/apis/storage.k8s.io/v1/storageclasses/{STORAGE_CLASS}")
        api.delete("/apis/scheduling.k8s.io/v1beta1/namespaces/default/podgroups/train")
