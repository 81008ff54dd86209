"""Builders of realistic GPU Node objects, as a real cluster's API server returns them.

Tests, benchmarks and the demo need Nodes that look like production ones (about 6 KB of JSON:
the kubelet's labels and conditions, GPU Feature Discovery's `nvidia.com/*` labels, capacity with
`nvidia.com/gpu`, addresses, nodeInfo, the image list), so that decoding costs, payload sizes and
field lookups are measured on the real shape rather than on a toy. Every value is derived from the
node name, so the same name always builds the same Node.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, Final

from gpu_contract.schema import FIELD_MANAGER
from kube_standins import objects as ko

__all__ = ["DEFAULT_EXTRA_IMAGES", "KUBELET_VERSION", "gpu_node", "with_agent_write"]

KUBELET_VERSION: Final = "v1.36.2"
# With this many workload images on top of the system ones a default node encodes to about 6 KB.
DEFAULT_EXTRA_IMAGES: Final = 5
_CREATED_AT: Final = datetime(2026, 11, 1, 8, 0, 0, tzinfo=UTC)

# GPU memory in MiB per product, as GPU Feature Discovery labels it (nvidia.com/gpu.memory).
_GPU_MEMORY_MIB: Final[dict[str, int]] = {
    "NVIDIA-A100-SXM4-80GB": 81920,
    "NVIDIA-A100-SXM4-40GB": 40960,
    "NVIDIA-A100-PCIE-40GB": 40960,
    "NVIDIA-H100-80GB-HBM3": 81559,
    "NVIDIA-H100-PCIe": 81559,
    "NVIDIA-H200": 143771,
    "NVIDIA-L4": 23034,
    "NVIDIA-L40S": 46068,
    "Tesla-V100-SXM2-32GB": 32768,
    "Tesla-T4": 15360,
}
_GPU_FAMILY: Final[dict[str, str]] = {
    "A100": "ampere",
    "H100": "hopper",
    "H200": "hopper",
    "L4": "ada-lovelace",
    "L40S": "ada-lovelace",
    "V100": "volta",
    "T4": "turing",
}
_SYSTEM_IMAGES: Final = (
    ("registry.k8s.io/kube-proxy", "v1.36.2", 30_612_431),
    ("nvcr.io/nvidia/k8s-device-plugin", "v0.17.1", 151_203_775),
    ("nvcr.io/nvidia/gpu-feature-discovery", "v0.17.1", 139_842_108),
    ("nvcr.io/nvidia/k8s/dcgm-exporter", "4.2.3-4.1.1-ubuntu22.04", 409_221_553),
    ("docker.io/calico/node", "v3.29.1", 142_316_877),
    ("registry.k8s.io/pause", "3.10", 320_368),
)
_WORKLOAD_IMAGES: Final = (
    ("nvcr.io/nvidia/pytorch", "25.01-py3", 9_871_346_112),
    ("nvcr.io/nvidia/tritonserver", "25.01-py3", 8_013_452_201),
    ("nvcr.io/nvidia/cuda", "12.8.0-base-ubuntu24.04", 105_233_119),
    ("nvcr.io/nvidia/nemo", "25.02", 18_332_006_512),
    ("docker.io/vllm/vllm-openai", "v0.8.4", 7_211_004_512),
    ("nvcr.io/nvidia/tensorflow", "25.01-tf2-py3", 7_966_551_332),
    ("ghcr.io/huggingface/text-generation-inference", "3.1.0", 5_112_907_331),
    ("nvcr.io/nvidia/k8s/cuda-sample", "vectoradd-cuda12.5.0", 75_311_009),
    ("docker.io/rayproject/ray-ml", "2.43.0-gpu", 11_902_223_115),
    ("nvcr.io/nvidia/rapidsai/base", "25.02-cuda12.8-py3.12", 6_002_114_980),
)


def _digest(*parts: str) -> str:
    return hashlib.sha256("/".join(parts).encode()).hexdigest()


def _gpu_family(product: str) -> str:
    for marker, family in _GPU_FAMILY.items():
        if marker in product:
            return family
    return "unknown"


def _image(repo: str, tag: str, size_b: int, node_name: str) -> dict[str, Any]:
    return {
        "names": [f"{repo}@sha256:{_digest(repo, tag)}", f"{repo}:{tag}"],
        "sizeBytes": size_b + int(_digest(node_name, repo)[:4], 16),
    }


def gpu_node(
    name: str,
    *,
    gpu_count: int = 8,
    product: str = "NVIDIA-A100-SXM4-80GB",
    annotations: Mapping[str, str] | None = None,
    labels: Mapping[str, str] | None = None,
    extra_images: int = DEFAULT_EXTRA_IMAGES,
) -> dict[str, Any]:
    """A Ready GPU Node as a kubelet and GPU Feature Discovery would have registered it.

    `annotations` and `labels` are added to (and override) the defaults. The result has no
    resourceVersion: the API server (or `ApiServerStandIn.put_node`) assigns one.
    """
    seed = _digest(name)
    octets = [int(seed[i : i + 2], 16) for i in range(0, 6, 2)]
    internal_ip = f"10.{octets[0] % 64}.{octets[1]}.{max(octets[2], 2)}"
    internal_dns = f"ip-{internal_ip.replace('.', '-')}.ec2.internal"
    zone = "abc"[octets[0] % 3]
    memory_mib = _GPU_MEMORY_MIB.get(product, 81920)
    node_labels: dict[str, str] = {
        "beta.kubernetes.io/arch": "amd64",
        "beta.kubernetes.io/instance-type": "p4d.24xlarge",
        "beta.kubernetes.io/os": "linux",
        "failure-domain.beta.kubernetes.io/region": "us-east-1",
        "failure-domain.beta.kubernetes.io/zone": f"us-east-1{zone}",
        "kubernetes.io/arch": "amd64",
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "node.kubernetes.io/instance-type": "p4d.24xlarge",
        "topology.kubernetes.io/region": "us-east-1",
        "topology.kubernetes.io/zone": f"us-east-1{zone}",
        "nvidia.com/gpu.present": "true",
        "nvidia.com/gpu.product": product,
        "nvidia.com/gpu.count": str(gpu_count),
        "nvidia.com/gpu.memory": str(memory_mib),
        "nvidia.com/gpu.family": _gpu_family(product),
        "nvidia.com/gpu.machine": "p4d.24xlarge",
        "nvidia.com/cuda.driver.major": "570",
        "nvidia.com/cuda.driver.minor": "124",
        "nvidia.com/cuda.runtime.major": "12",
        "nvidia.com/cuda.runtime.minor": "8",
        "nvidia.com/mig.capable": "true" if "A100" in product or "H1" in product else "false",
        "nvidia.com/gfd.timestamp": "1764576000",
        "feature.node.kubernetes.io/pci-10de.present": "true",
    }
    node_labels.update(labels or {})
    node_annotations: dict[str, str] = {
        "node.alpha.kubernetes.io/ttl": "0",
        "volumes.kubernetes.io/controller-managed-attach-detach": "true",
        "csi.volume.kubernetes.io/nodeid": f'{{"ebs.csi.aws.com":"i-{seed[:17]}"}}',
        "projectcalico.org/IPv4Address": f"{internal_ip}/19",
    }
    node_annotations.update(annotations or {})
    heartbeat = "2026-11-30T14:00:00Z"
    transition = ko.format_time(_CREATED_AT)
    conditions = [
        (
            "MemoryPressure",
            "False",
            "KubeletHasSufficientMemory",
            "kubelet has sufficient memory available",
        ),
        ("DiskPressure", "False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
        ("PIDPressure", "False", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
        ("Ready", "True", "KubeletReady", "kubelet is posting ready status"),
    ]
    images = [_image(r, t, s, name) for r, t, s in _SYSTEM_IMAGES]
    for i in range(max(extra_images, 0)):
        repo, tag, size_b = _WORKLOAD_IMAGES[i % len(_WORKLOAD_IMAGES)]
        if i >= len(_WORKLOAD_IMAGES):
            tag = f"{tag}-r{i // len(_WORKLOAD_IMAGES)}"
        images.append(_image(repo, tag, size_b, name))
    node: dict[str, Any] = {
        "kind": "Node",
        "apiVersion": "v1",
        "metadata": {
            "name": name,
            "uid": str(uuid.UUID(seed[:32])),
            "creationTimestamp": ko.format_time(_CREATED_AT),
            "labels": node_labels,
            "annotations": node_annotations,
        },
        "spec": {"providerID": f"aws:///us-east-1{zone}/i-{seed[:17]}"},
        "status": {
            "capacity": {
                "cpu": "96",
                "ephemeral-storage": "3905070584Ki",
                "hugepages-1Gi": "0",
                "hugepages-2Mi": "0",
                "memory": "1176334152Ki",
                "nvidia.com/gpu": str(gpu_count),
                "pods": "110",
            },
            "allocatable": {
                "cpu": "95690m",
                "ephemeral-storage": "3597800747594",
                "hugepages-1Gi": "0",
                "hugepages-2Mi": "0",
                "memory": "1166079304Ki",
                "nvidia.com/gpu": str(gpu_count),
                "pods": "110",
            },
            "conditions": [
                {
                    "type": ctype,
                    "status": status,
                    "lastHeartbeatTime": heartbeat,
                    "lastTransitionTime": transition,
                    "reason": reason,
                    "message": message,
                }
                for ctype, status, reason, message in conditions
            ],
            "addresses": [
                {"type": "InternalIP", "address": internal_ip},
                {
                    "type": "InternalDNS",
                    "address": internal_dns,
                },
                {"type": "Hostname", "address": name},
            ],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {
                "machineID": seed[:32],
                "systemUUID": str(uuid.UUID(seed[32:64])).upper(),
                "bootID": str(uuid.UUID(_digest(name, "boot")[:32])),
                "kernelVersion": "6.8.0-1021-aws",
                "osImage": "Ubuntu 24.04.1 LTS",
                "containerRuntimeVersion": "containerd://2.1.0",
                "kubeletVersion": KUBELET_VERSION,
                "kubeProxyVersion": "",
                "operatingSystem": "linux",
                "architecture": "amd64",
            },
            "images": images,
        },
    }
    # The kubelet registered the Node, so it owns the labels and annotations it set then.
    registered = {"metadata": {"labels": node_labels, "annotations": node_annotations}}
    node["metadata"]["managedFields"] = ko.created_managed_fields(
        registered, ko.Manager("kubelet", "Update", ""), _CREATED_AT
    )
    return ko.canonical_node(node)


def with_agent_write(
    node: Mapping[str, Any], annotations: Mapping[str, str | None], at: datetime
) -> dict[str, Any]:
    """`node` after the agent's merge patch of `annotations` at server time `at`.

    Sets the annotations (None deletes, as in a merge patch) and updates the
    `gpu-scheduler-agent` managedFields entry exactly as the API server would: its `time` moves
    to `at` only when something changed, and its fieldsV1 lists the annotation keys it owns.
    The input is not modified.
    """
    old = ko.canonical_node(node)
    new = ko.merge_patch(old, {"metadata": {"annotations": dict(annotations)}})
    new = ko.canonical_node(new)
    if new == old:
        return ko.clone(old)
    new["metadata"]["managedFields"] = ko.updated_managed_fields(
        old, new, ko.Manager(FIELD_MANAGER, "Update", ""), at
    )
    return ko.canonical_node(new)
