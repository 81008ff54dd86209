"""Shared pieces of the e2e suite (the conftest holds only fixtures)."""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest

from gpu_sim.cluster import BuildSpec, KubeApi, missing_binaries_reason
from gpu_sim.cluster_workload import delete_nodes, delete_pods, register_node
from gpu_sim.nodes import gpu_node

# Watch events reach every watcher on loopback within milliseconds; this leaves a wide margin.
SETTLE_S = 0.5


def require_control_plane() -> None:
    """Skip without the built binaries locally; fail without them in CI (`CI=true`)."""
    reason = missing_binaries_reason(BuildSpec.read())
    if reason is None:
        return
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(reason + "; CI must run the e2e suite")
    pytest.skip(reason)


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
