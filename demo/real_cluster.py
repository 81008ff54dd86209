"""The demo on the real control plane: Nodes in kube-apiserver, pods bound by kube-scheduler.

`python3 dev.py demo --cluster real` runs the same loop as the default demo with the API stand-in
and the scheduler driver swapped for the real thing (`loopback_cluster.control_plane`, built by
`python3 dev.py cluster build`): the agents write to a real kube-apiserver, a real kube-scheduler
calls the scorer as its extender, and the demo only creates pods, reads where the scheduler bound
them (or its `FailedScheduling` reason), turns bound pods into load on the node's simulated GPUs,
and deletes them when their run time is over.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

from agent.metrics import AgentMetrics
from gpu_contract.schema import normalize_model_name
from kube_standins.nodes import gpu_node
from kube_standins.scheduler_driver import Allocation, Attempt, Binding, LoadSink, NoLoad, PodSpec
from loopback_cluster.control_plane import (
    ClusterError,
    ControlPlane,
    ExtenderConfig,
    KubeApi,
    Ports,
    SchedulerConfig,
    missing_binaries_reason,
)
from loopback_cluster.workload import apply, gpu_pod, register_node

NAMESPACE: Final = "gpu-demo"
SCHEDULER_NAME: Final = "gpu-scheduler"


def _writes(metrics: AgentMetrics) -> int:
    total = 0.0
    for family in metrics.registry.collect():
        for sample in family.samples:
            if sample.name == "gpu_agent_writes_total":
                total += sample.value
    return int(total)


class RealCluster:
    """A control plane of the demo's own (free ports, a scratch directory) and its Nodes.

    `nodes()` and `node_writes()` are what the demo's view reads, as it reads the stand-in's.
    """

    def __init__(self, workdir: Path) -> None:
        reason = missing_binaries_reason()
        if reason is not None:
            raise ClusterError(f"--cluster real needs the control plane: {reason}")
        self.plane = ControlPlane(workdir / "control-plane", Ports.free(), tie_to_parent=True)
        self._local = threading.local()
        self._agent_metrics: dict[str, AgentMetrics] = {}

    @property
    def url(self) -> str:
        return self.plane.server

    @property
    def kubeconfig(self) -> Path:
        return self.plane.admin_kubeconfig

    def api(self) -> KubeApi:
        """This thread's client (a connection is not shared between threads)."""
        api: KubeApi | None = getattr(self._local, "api", None)
        if api is None:
            api = self._local.api = self.plane.admin()
        return api

    def start(self, nodes: list[tuple[str, str, int]]) -> None:
        """Start etcd and kube-apiserver and register `(name, product, gpus)` Nodes."""
        self.plane.up()
        api = self.api()
        for name, product, gpus in nodes:
            node = gpu_node(name, gpu_count=gpus, product=normalize_model_name(product))
            register_node(api, node)
        apply(api, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
        apply(
            api,
            {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default"}},
            namespace=NAMESPACE,
        )

    def start_scheduler(self, extender_url: str, *, node_cache: bool, weight: int) -> None:
        extender = ExtenderConfig(
            extender_url, node_cache_capable=node_cache, ignorable=False, weight=weight
        )
        self.plane.start_scheduler(SchedulerConfig(SCHEDULER_NAME, extender))

    def watch_agents(self, metrics: Mapping[str, AgentMetrics]) -> None:
        self._agent_metrics = dict(metrics)

    def nodes(self) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = self.api().get("/api/v1/nodes")["items"]
        return items

    def node_writes(self, name: str) -> int:
        """The agent's writes the API server accepted (its own count: no request log here)."""
        metrics = self._agent_metrics.get(name)
        return 0 if metrics is None else _writes(metrics)

    def stop(self) -> None:
        self.plane.down()


class RealSchedulerDriver:
    """What the demo's view reads from its scheduler, for pods that kube-scheduler places.

    Called from one thread (the demo's driver loop): `submit` creates the pod, `step` reads
    back what the scheduler did and ends pods whose run time is over.
    """

    def __init__(self, cluster: RealCluster, *, load: LoadSink | None = None) -> None:
        self._cluster = cluster
        self._load = load or NoLoad()
        self.allocation = Allocation()
        self.attempts: list[Attempt] = []
        self.outcome: dict[str, Attempt] = {}
        self.finished: list[Binding] = []
        self._waiting: dict[str, PodSpec] = {}
        self._submitted_at: dict[str, float] = {}
        self._seen_events: set[str] = set()

    def submit(self, pod: PodSpec, *, now_s: float) -> None:
        body = gpu_pod(
            pod.name,
            scheduler_name=SCHEDULER_NAME,
            gpus=pod.gpus,
            annotations=pod.annotations,
            namespace=NAMESPACE,
        )
        body["metadata"]["labels"] = {"app": "gpu-demo"}
        self._cluster.api().create(f"/api/v1/namespaces/{NAMESPACE}/pods", body)
        self._waiting[pod.name] = pod
        self._submitted_at[pod.name] = now_s

    def step(self, *, now_s: float) -> list[Attempt]:
        api = self._cluster.api()
        for binding in self.allocation.release_finished(now_s):
            api.delete(f"/api/v1/namespaces/{NAMESPACE}/pods/{binding.pod.name}")
            self._load.pod_ended(binding.node, binding.pod)
            self.finished.append(binding)
        if not self._waiting:
            return []
        attempts: list[Attempt] = []
        pods = api.get(f"/api/v1/namespaces/{NAMESPACE}/pods")["items"]
        for item in pods:
            name = item["metadata"]["name"]
            node = item.get("spec", {}).get("nodeName")
            pod = self._waiting.get(name)
            if pod is None or not node:
                continue
            del self._waiting[name]
            self.allocation.bind(pod, node, now_s)
            self._load.pod_started(node, pod)
            attempts.append(
                self._record(
                    Attempt(pod, now_s, node, "bound by kube-scheduler", {}, {}, (), False)
                )
            )
        events = api.get(
            f"/api/v1/namespaces/{NAMESPACE}/events?fieldSelector=reason%3DFailedScheduling"
        )["items"]
        for event in events:
            # An aggregated event is updated in place: its count tells a new occurrence.
            key = f"{event['metadata']['uid']}/{event.get('count', 1)}"
            pod = self._waiting.get(event.get("involvedObject", {}).get("name", ""))
            if pod is None or key in self._seen_events:
                continue
            self._seen_events.add(key)
            message = str(event.get("message", ""))
            attempts.append(self._record(Attempt(pod, now_s, None, message, {}, {}, (), False)))
        return attempts

    def _record(self, attempt: Attempt) -> Attempt:
        self.attempts.append(attempt)
        self.outcome[attempt.pod.name] = attempt
        return attempt

    def placed_pods(self) -> int:
        return sum(1 for a in self.outcome.values() if a.placed)

    def pending_pods(self) -> int:
        return len(self._waiting)

    def latency_ms(self, verb: str | None = None) -> dict[str, float]:
        # The scheduler's calls to the extender are not visible from here; the scorer's own
        # request times are in its metrics.
        return {}
