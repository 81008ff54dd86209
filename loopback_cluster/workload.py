"""What runs on the loopback control plane: GPU Nodes, GPU pods, and the project's two binaries.

The e2e tests, the real-scheduler benchmark and the demo's real-cluster mode share these, so a
Node is registered the same way everywhere (created as the kubelet would, its status set, the
`not-ready` taint lifted as the node lifecycle controller would), and the agent and the scorer
run as the real `gpu-agent` and `gpu-scorer` processes.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final, TypeVar

from gpu_contract.schema import (
    DEFAULT_KEYS,
    FIELD_MANAGER,
    GpuState,
    Health,
    Keys,
    NodeGpuState,
    encode,
    format_timestamp,
    merge_patch,
)
from loopback_cluster.control_plane import GPU_RESOURCE, LOOPBACK, ClusterError, KubeApi, free_port

T = TypeVar("T")

_SERVER_SET: Final = ("uid", "creationTimestamp", "managedFields", "resourceVersion")


# ----------------------------------------------------------------------------- nodes


def register_node(api: KubeApi, node: Mapping[str, Any]) -> dict[str, Any]:
    """Create `node` (a `kube_standins.nodes.gpu_node`) as its kubelet would; return it stored.

    The API server keeps the status a Node is created with, and its TaintNodesByCondition
    admission adds `node.kubernetes.io/not-ready`, which the node lifecycle controller removes
    once the kubelet reports Ready; no controller runs here, so the taint is lifted next.
    """
    body = copy.deepcopy(dict(node))
    for key in _SERVER_SET:
        body["metadata"].pop(key, None)
    name = body["metadata"]["name"]
    api.create("/api/v1/nodes?fieldManager=kubelet", body)
    stored: dict[str, Any] = api.merge_patch(
        f"/api/v1/nodes/{name}", {"spec": {"taints": None}}, field_manager="node-controller"
    )
    return stored


def publish(
    api: KubeApi,
    node_name: str,
    state: NodeGpuState,
    *,
    keys: Keys = DEFAULT_KEYS,
    field_manager: str = FIELD_MANAGER,
) -> dict[str, Any]:
    """Write `state` onto the Node exactly as the agent does: one merge patch, its field manager."""
    body = merge_patch(encode(state, keys), keys)
    stored: dict[str, Any] = api.merge_patch(
        f"/api/v1/nodes/{node_name}", body, field_manager=field_manager
    )
    return stored


def gpu_state(
    *,
    utilization: float,
    gpu_model: str = "NVIDIA-A100-SXM4-80GB",
    gpu_count: int = 8,
    temperature_c: int = 55,
    memory_largest_free_mib: int = 81_000,
    at: datetime | None = None,
) -> NodeGpuState:
    """A healthy node's state with the values a placement test varies; the rest consistent."""

    return NodeGpuState(
        health=Health.OK,
        updated_at=(at or datetime.now(UTC)).replace(microsecond=0),
        utilization=utilization,
        utilization_max=min(1.0, utilization + 0.05),
        memory_fragmentation=0.10,
        memory_free_mib=memory_largest_free_mib * gpu_count,
        memory_largest_free_mib=memory_largest_free_mib,
        temperature_c=temperature_c,
        gpu_model=gpu_model,
        gpu_count=gpu_count,
    )


def per_gpu_node_state(
    gpus: Sequence[tuple[float, bool | None]],
    *,
    gpu_model: str = "NVIDIA-A100-SXM4-80GB",
    at: datetime | None = None,
    dra_devices: Sequence[str] | None = None,
) -> NodeGpuState:
    """A healthy node as the agent publishes it from per-GPU readings, one `(utilization,
    allocated)` per GPU in index order (`allocated` None: the kubelet's allocations unknown):
    the per-GPU keys, and the node-level keys summarising the same GPUs. A busier GPU has less
    memory free (its process holds it) and runs hotter. `dra_devices`: each GPU's DRA device
    name, in index order, as the agent finds them in its driver's ResourceSlice."""
    total_mib = 81_000
    names: Sequence[str | None] = [None] * len(gpus) if dra_devices is None else dra_devices
    table = tuple(
        GpuState(
            utilization,
            round(total_mib * (1 - 0.9 * utilization)),
            40 + round(30 * utilization),
            allocated,
            device,
        )
        for (utilization, allocated), device in zip(gpus, names, strict=True)
    )
    free = [gpu.memory_free_mib or 0 for gpu in table]
    largest = max(free)
    return NodeGpuState(
        health=Health.OK,
        updated_at=(at or datetime.now(UTC)).replace(microsecond=0),
        utilization=sum(u for u, _ in gpus) / len(gpus),
        utilization_max=max(u for u, _ in gpus),
        memory_fragmentation=1 - largest / sum(free) if len(free) > 1 else 0.0,
        memory_free_mib=sum(free),
        memory_largest_free_mib=largest,
        temperature_c=max(gpu.temperature_c or 0 for gpu in table),
        gpu_model=gpu_model,
        gpu_count=len(table),
        gpus=table,
    )


def delete_nodes(api: KubeApi, names: Sequence[str]) -> None:
    for name in names:
        api.delete(f"/api/v1/nodes/{name}")


# ----------------------------------------------------------------------------- manifests

# Where each kind the chart renders lives in the API (namespaced kinds take `{ns}`).
_RESOURCE_PATHS: Final[dict[str, str]] = {
    "Namespace": "/api/v1/namespaces",
    "ServiceAccount": "/api/v1/namespaces/{ns}/serviceaccounts",
    "ConfigMap": "/api/v1/namespaces/{ns}/configmaps",
    "Secret": "/api/v1/namespaces/{ns}/secrets",
    "Service": "/api/v1/namespaces/{ns}/services",
    "ClusterRole": "/apis/rbac.authorization.k8s.io/v1/clusterroles",
    "ClusterRoleBinding": "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
    "Role": "/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/roles",
    "RoleBinding": "/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/rolebindings",
    "ValidatingAdmissionPolicy": (
        "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies"
    ),
    "ValidatingAdmissionPolicyBinding": (
        "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings"
    ),
    "MutatingAdmissionPolicy": "/apis/admissionregistration.k8s.io/v1/mutatingadmissionpolicies",
    "MutatingAdmissionPolicyBinding": (
        "/apis/admissionregistration.k8s.io/v1/mutatingadmissionpolicybindings"
    ),
    "NetworkPolicy": "/apis/networking.k8s.io/v1/namespaces/{ns}/networkpolicies",
}


def apply(api: KubeApi, manifest: Mapping[str, Any], *, namespace: str = "default") -> None:
    """Create `manifest`, or replace it when it exists (what `kubectl apply` ends with)."""
    kind = manifest["kind"]
    try:
        collection = _RESOURCE_PATHS[kind]
    except KeyError:
        raise ClusterError(f"no API path known for kind {kind}") from None
    ns = manifest["metadata"].get("namespace", namespace)
    collection = collection.format(ns=ns)
    status, body = api.raw("POST", collection, manifest)
    if status == 409:
        path = f"{collection}/{manifest['metadata']['name']}"
        current = api.get(path)
        replacement = copy.deepcopy(dict(manifest))
        replacement["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
        api.call("PUT", path, replacement)
    elif status not in (200, 201):
        raise ClusterError(
            f"creating {kind} {manifest['metadata']['name']}: HTTP {status}: {body[:300]!r}"
        )


def pod_bound_token(
    api: KubeApi,
    *,
    namespace: str,
    service_account: str,
    pod: Mapping[str, Any],
    audience: str,
    expiration_s: int = 3600,
) -> str:
    """A TokenRequest bound to `pod`: the API server puts the pod's node in its claims."""
    request = {
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenRequest",
        "spec": {
            "audiences": [audience],
            "expirationSeconds": expiration_s,
            "boundObjectRef": {
                "kind": "Pod",
                "apiVersion": "v1",
                "name": pod["metadata"]["name"],
                "uid": pod["metadata"]["uid"],
            },
        },
    }
    answer = api.create(
        f"/api/v1/namespaces/{namespace}/serviceaccounts/{service_account}/token", request
    )
    return str(answer["status"]["token"])


def service_account_token(
    api: KubeApi,
    *,
    namespace: str,
    service_account: str,
    audience: str,
    expiration_s: int = 3600,
) -> str:
    """A TokenRequest for `service_account`, bound to no object (what a workload outside the
    cluster gets, or a test that grants the account its RBAC step by step)."""
    request = {
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenRequest",
        "spec": {"audiences": [audience], "expirationSeconds": expiration_s},
    }
    answer = api.create(
        f"/api/v1/namespaces/{namespace}/serviceaccounts/{service_account}/token", request
    )
    return str(answer["status"]["token"])


# ----------------------------------------------------------------------------- pods


def gpu_pod(
    name: str,
    *,
    scheduler_name: str,
    gpus: int = 1,
    annotations: Mapping[str, str] | None = None,
    cpu: str = "100m",
    namespace: str = "default",
) -> dict[str, Any]:
    """A pod asking `gpus` of the GPU resource, for `scheduler_name` (the shape of the captures)."""
    quantity = str(gpus)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {"app": "gpu-e2e"},
            "annotations": dict(annotations or {}),
        },
        "spec": {
            "schedulerName": scheduler_name,
            "automountServiceAccountToken": False,
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {
                    "name": "main",
                    "image": "pause:3.10",
                    "resources": {
                        "requests": {"cpu": cpu, "memory": "64Mi", GPU_RESOURCE: quantity},
                        "limits": {"memory": "64Mi", GPU_RESOURCE: quantity},
                    },
                }
            ],
        },
    }


def running_pod(
    name: str, *, node_name: str, cpu: str, namespace: str = "default"
) -> dict[str, Any]:
    """A pod already placed on `node_name` (no scheduler involved), holding CPU there."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": {"app": "cpu-load"}},
        "spec": {
            "nodeName": node_name,
            "automountServiceAccountToken": False,
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {
                    "name": "main",
                    "image": "pause:3.10",
                    "resources": {"requests": {"cpu": cpu, "memory": "1Gi"}},
                }
            ],
        },
    }


def placed_gpu_pod(
    name: str,
    *,
    node_name: str,
    gpus: int = 1,
    annotations: Mapping[str, str] | None = None,
    namespace: str = "default",
) -> dict[str, Any]:
    """A GPU pod created with `spec.nodeName` set: bound without any scheduler (a DaemonSet's
    pod, or another scheduler's that writes the node name itself)."""
    pod = gpu_pod(
        name,
        scheduler_name="default-scheduler",
        gpus=gpus,
        annotations=annotations,
        namespace=namespace,
    )
    pod["spec"]["nodeName"] = node_name
    return pod


def report_pod_status(
    api: KubeApi,
    name: str,
    *,
    admitted_at: datetime,
    running_since: datetime | None = None,
    namespace: str = "default",
) -> dict[str, Any]:
    """Write a pod's status as its kubelet does (there is none on this plane): `startTime` once
    admitted (its device plugin has allocated the GPUs), and, with `running_since`, every
    container running since then and the phase `Running`; else the containers still being
    created and the phase `Pending`. Both times are the node's clock, whole seconds."""
    pod = api.get(f"/api/v1/namespaces/{namespace}/pods/{name}")
    if running_since is None:
        state: dict[str, Any] = {"waiting": {"reason": "ContainerCreating"}}
        phase, ready = "Pending", False
    else:
        state = {"running": {"startedAt": format_timestamp(running_since)}}
        phase, ready = "Running", True
    statuses = [
        {
            "name": container["name"],
            "image": container["image"],
            "imageID": "",
            "ready": ready,
            "started": ready,
            "restartCount": 0,
            "state": state,
        }
        for container in pod["spec"]["containers"]
    ]
    body = {
        "status": {
            "phase": phase,
            "startTime": format_timestamp(admitted_at),
            "containerStatuses": statuses,
        }
    }
    stored: dict[str, Any] = api.merge_patch(
        f"/api/v1/namespaces/{namespace}/pods/{name}/status", body, field_manager="kubelet"
    )
    return stored


def create_pod(api: KubeApi, pod: Mapping[str, Any]) -> dict[str, Any]:
    namespace = pod["metadata"].get("namespace", "default")
    created: dict[str, Any] = api.create(f"/api/v1/namespaces/{namespace}/pods", pod)
    return created


def pod_node(api: KubeApi, name: str, namespace: str = "default") -> str | None:
    """The node the pod is bound to, or None while it is unscheduled."""
    pod = api.get(f"/api/v1/namespaces/{namespace}/pods/{name}")
    node = pod.get("spec", {}).get("nodeName")
    return str(node) if node else None


def pod_events(api: KubeApi, name: str, namespace: str = "default") -> list[tuple[str, str]]:
    """(reason, message) of the events about a pod, oldest first."""
    selector = f"involvedObject.kind=Pod,involvedObject.name={name}"
    events = api.get(f"/api/v1/namespaces/{namespace}/events?fieldSelector={selector}")
    items = sorted(
        events.get("items", []),
        key=lambda e: e.get("lastTimestamp") or e.get("eventTime") or "",
    )
    return [(e.get("reason", ""), e.get("message", "")) for e in items]


def delete_pods(api: KubeApi, names: Sequence[str], namespace: str = "default") -> None:
    for name in names:
        api.delete(f"/api/v1/namespaces/{namespace}/pods/{name}")


def wait_for(
    what: str, probe: Callable[[], T | None], *, timeout_s: float, interval_s: float = 0.1
) -> T:
    """Poll `probe` until it returns something other than None (or False); raise on timeout."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = probe()
        if value is not None and value is not False:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(interval_s)


# ----------------------------------------------------------------------------- the binaries


def _project_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("GPU_AGENT_", "GPU_SCORER_")) and k not in ("NODE_NAME", "KUBECONFIG")
    }
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.update(extra or {})
    return env


@dataclass
class BinaryProcess:
    """`gpu-agent` or `gpu-scorer` as a child process, its output in a log file."""

    name: str
    argv: list[str]
    log_path: Path
    env: dict[str, str] = field(default_factory=dict)
    popen: subprocess.Popen[bytes] | None = None

    def start(self) -> BinaryProcess:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log_file:
            self.popen = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                env=_project_env(self.env),
            )
        return self

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def terminate(self, timeout_s: float = 15.0) -> int:
        """SIGTERM and wait; the exit code (SIGKILL after the timeout gives -9)."""
        if self.popen is None:
            return 0
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()
        return int(self.popen.returncode)

    def kill(self) -> None:
        if self.popen is not None and self.popen.poll() is None:
            self.popen.kill()
            self.popen.wait()

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""


@dataclass
class ScorerProcess(BinaryProcess):
    port: int = 0

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    def wait_ready(self, timeout_s: float = 30.0) -> ScorerProcess:
        """Until `/readyz` answers 200 (names only: after the node cache's first LIST)."""

        def ready() -> bool:
            if not self.alive():
                raise ClusterError(f"gpu-scorer exited during start-up:\n{self.log()[-2000:]}")
            try:
                with urllib.request.urlopen(f"{self.url}/readyz", timeout=2) as response:
                    return bool(response.status == 200)
            except (urllib.error.URLError, OSError):
                return False

        wait_for("gpu-scorer /readyz", ready, timeout_s=timeout_s)
        return self

    def log_documents(self) -> list[dict[str, Any]]:
        """The scorer's structured log lines so far (one JSON object a line), in order."""
        documents = []
        for line in self.log().splitlines():
            try:
                document = json.loads(line)
            except ValueError:
                continue  # a line that is not JSON: the runtime's own output
            if isinstance(document, dict):
                documents.append(document)
        return documents

    def wait_log_documents(
        self,
        what: str,
        match: Callable[[dict[str, Any]], bool],
        *,
        timeout_s: float = 15.0,
    ) -> list[dict[str, Any]]:
        """The log lines `match` accepts, once there is at least one (raise after `timeout_s`).

        The scorer writes its log lines in batches (every 50 ms), so a line about a request
        that has just been answered may not be in the file yet: a reader waits for it.
        """

        def matched() -> list[dict[str, Any]] | None:
            found = [document for document in self.log_documents() if match(document)]
            return found or None

        try:
            return wait_for(what, matched, timeout_s=timeout_s, interval_s=0.05)
        except TimeoutError as error:
            raise TimeoutError(f"{error}; the log ends:\n{self.log()[-2000:]}") from None

    def metrics(self) -> str:
        with urllib.request.urlopen(f"{self.url}/metrics", timeout=5) as response:
            return str(response.read().decode())

    def metric(self, name: str) -> float | None:
        """The value of an unlabelled metric in `/metrics`, or None when it is not there."""
        for line in self.metrics().splitlines():
            sample, _, value = line.partition(" ")
            if sample == name:
                return float(value)
        return None


def scorer_process(
    log_dir: Path,
    *,
    kubeconfig: Path | None,
    port: int | None = None,
    extra_args: Sequence[str] = (),
    name: str = "gpu-scorer",
    node_cache: bool | None = None,
    command: Sequence[str] = (),
) -> ScorerProcess:
    """`gpu-scorer serve` on loopback; names only (`--node-cache`) when given a kubeconfig,
    unless `node_cache=False`: full Node objects, the kubeconfig then serving the pod watch
    (in-flight accounting) alone. `command` runs the scorer (default: this interpreter on this
    checkout's package)."""
    port = port or free_port()
    argv = [*(command or (sys.executable, "-m", "exporter_scheduler"))]
    argv += ["serve", f"--host={LOOPBACK}"]
    argv.append(f"--port={port}")
    if node_cache is None:
        node_cache = kubeconfig is not None
    if node_cache:
        argv.append("--node-cache")
    if kubeconfig is not None:
        argv.append(f"--kubeconfig={kubeconfig}")
    argv += list(extra_args)
    return ScorerProcess(name=name, argv=argv, log_path=log_dir / f"{name}.log", port=port)


def agent_process(
    log_dir: Path,
    *,
    node_name: str,
    kubeconfig: Path,
    extra_args: Sequence[str] = (),
    metrics_port: int | None = None,
) -> BinaryProcess:
    """`gpu-agent run --source simulated` for one Node."""
    metrics_port = metrics_port or free_port()
    argv = [
        sys.executable,
        "-m",
        "agent",
        "run",
        "--source=simulated",
        f"--node-name={node_name}",
        f"--kubeconfig={kubeconfig}",
        f"--metrics-port={metrics_port}",
        f"--metrics-address={LOOPBACK}",
        *extra_args,
    ]
    return BinaryProcess(
        name=f"gpu-agent-{node_name}", argv=argv, log_path=log_dir / f"gpu-agent-{node_name}.log"
    )


@contextlib.contextmanager
def running(process: BinaryProcess) -> Iterator[BinaryProcess]:
    process.start()
    try:
        yield process
    finally:
        process.kill()
