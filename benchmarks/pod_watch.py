"""What in-flight accounting costs the scorer: the memory and CPU of its Pod watch, measured.

    python -m benchmarks.pod_watch [--nodes 5000] [--pods 50000] [--churn-per-s 50]
        [--duration-s 120] [--rounds 3] [--json]

In names-only mode the scorer lists and watches every bound pod of the cluster
(`exporter_scheduler.edges.podcache`) to count the ones its nodes' annotations cannot show yet.
On the loopback control plane (`loopback_cluster.control_plane`, built by `python3 dev.py cluster
build`) this
registers `--nodes` realistic GPU Nodes (the agent's annotations on every one) and `--pods`
pods already bound to them, a few KB each as a Job's pods are (labels, an owner, env, an init
container and a sidecar); one in five asks for no GPU, which the scorer must decode and drop.
The fleet's pods have run for two hours, so none of them is in flight. Then, per round, two
`gpu-scorer serve --node-cache` processes start side by side: one with the Pod watch (the
default) and one with `--no-pod-watch`. Each gets one filter and one prioritize for two pod
classes (one GPU; two GPUs with a memory hint) over every node, so that each change is judged
as it is in a scorer in use. Then, for `--duration-s`, pods churn at `--churn-per-s` writes a
second (for each new pod: its create, its kubelet's two status patches, 2 s and 5 s later,
`startTime` then every container running, and the delete of a running pod), while the GPU
annotations are patched at a fleet's write rate (`benchmarks.real_scheduler.Patcher`).

Measured per scorer and round: CPU seconds (`/proc/<pid>/stat`, utime + stime) from start to
ready (both LISTs done) and during the churn; RSS (`/proc/<pid>/status`: VmRSS once ready and
at the end, VmHWM the peak); the time from start until the first pod LIST is held
(`gpu_scorer_pod_cache_ready` turning 1, read every 0.25 s from both scorers' /metrics alike);
`gpu_scorer_pod_cache_pods`; the pod watch's time per event that changed a node
(`gpu_scorer_pod_cache_event_seconds`, mean and p99 bucket) and the node watch's
(`gpu_scorer_node_cache_event_seconds`). The cost is the scorer with the watch minus the one
without, the median over rounds of each round's difference. Everything (etcd, kube-apiserver,
both scorers, this process's writers) shares the machine's cores, so the two scorers compete
with each other and with the writes they watch.
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import hashlib
import heapq
import http.client
import json
import math
import random
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
import zlib
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Final, Literal

from benchmarks.lifecycle import exit_on_sigterm
from benchmarks.machine import machine_description, process_cpu_s
from benchmarks.real_scheduler import Config as FleetConfig
from benchmarks.real_scheduler import Patcher, node_plan, register_fleet
from exporter_scheduler.core.hints import GPU_POD_LABEL, GPU_POD_LABEL_VALUE
from exporter_scheduler.serving.metrics import EVENT_BUCKETS_S
from gpu_contract.schema import format_timestamp
from loopback_cluster.control_plane import (
    GPU_RESOURCE,
    ApiError,
    ControlPlane,
    KubeApi,
    running_control_plane,
)
from loopback_cluster.workload import ScorerProcess, apply, scorer_process

NAMESPACES: Final = ("ml-training", "ml-research", "inference", "batch-eval", "data-prep")
# One pod in GPU_POD_PERIOD asks for no GPU (data loaders, gateways): 20 %, by default
# (`--gpu-share` sets another share; clusters that share GPU nodes with CPU work have far more).
GPU_POD_PERIOD: Final = 5
DEFAULT_GPU_SHARE: Final = 1 - 1 / GPU_POD_PERIOD
# The share is laid out over each run of this many consecutive pods.
_SHARE_SLOTS: Final = 20
# GPUs per GPU pod, cycled: mostly one, as inference and small jobs are.
GPU_COUNTS: Final = (1, 1, 1, 1, 2, 2, 4, 8)
# The fleet's pods were bound and started this long before the run: past every in-flight window.
FLEET_AGE: Final = timedelta(hours=2)
# A new pod's kubelet reports it admitted (`startTime`), then every container running.
ADMIT_AFTER_S: Final = 2.0
RUN_AFTER_S: Final = 5.0
READY_POLL_S: Final = 0.1
POD_LIST_HELD: Final = "in-flight accounting on"
WRITERS: Final = 8
PREFIX: Final = "gpu-scheduler.example.com/"

Op = Literal["create", "admit", "run", "delete"]


@dataclass(frozen=True, slots=True)
class Config:
    nodes: int = 5000
    pods: int = 50_000
    churn_per_s: float = 50.0
    duration_s: float = 120.0
    rounds: int = 3
    seed: int = 7
    gpu_share: float = DEFAULT_GPU_SHARE
    # A commit whose scorer also runs, with its Pod watch, beside the two (`before_watch`).
    before: str | None = None
    # GPU pods carry the label the chart's admission policy sets, and a third scorer watches
    # with `--pod-label-selector` (`labelled_watch`).
    labelled: bool = False

    def fleet(self) -> FleetConfig:
        """The node fleet and its annotation write rate, as the real-scheduler benchmark has it."""
        return FleetConfig(self.nodes, seed=self.seed, modes=("none",))


# ----------------------------------------------------------------------------- the pods


@dataclass(frozen=True, slots=True)
class PodPlan:
    """Where pod number `index` lives and what it asks for; the same index, the same pod."""

    index: int
    name: str
    namespace: str
    node: str
    gpus: int

    @classmethod
    def of(cls, index: int, nodes: int, gpu_share: float = DEFAULT_GPU_SHARE) -> PodPlan:
        # The pods without a GPU spread evenly over each run of slots (the default: every
        # fifth pod, the last of each five).
        without = round((1 - gpu_share) * _SHARE_SLOTS)
        slot = index % _SHARE_SLOTS
        loader = (slot + 1) * without // _SHARE_SLOTS > slot * without // _SHARE_SLOTS
        gpus = 0 if loader else GPU_COUNTS[index % 8]
        # A multiplicative hash spreads consecutive pods over the nodes without a generator.
        node, _, _ = node_plan((index * 2_654_435_761) % nodes)
        kind = "worker" if gpus else "loader"
        return cls(index, f"{kind}-{index:07d}", NAMESPACES[index % len(NAMESPACES)], node, gpus)


def _uid(text: str) -> str:
    digest = hashlib.blake2b(text.encode(), digest_size=16).hexdigest()
    return f"{digest[:8]}-{digest[8:12]}-{digest[12:16]}-{digest[16:20]}-{digest[20:]}"


_POD_NAME_FIELD: Final = {"fieldRef": {"fieldPath": "metadata.name"}}


def pod_object(plan: PodPlan, *, labelled: bool = False) -> dict[str, Any]:
    """A Job's pod bound to its node, as a training or data pipeline creates it (~4 KB);
    `labelled`: a GPU pod has the label the chart's admission policy gives it."""
    job = f"{plan.namespace}-job-{plan.index // 16:05d}"
    job_uid = _uid(job)
    main_resources: dict[str, dict[str, str]] = {
        "requests": {"cpu": "4", "memory": "32Gi"},
        "limits": {"memory": "32Gi"},
    }
    annotations = {
        "prometheus.io/scrape": "true",
        "prometheus.io/port": "9090",
        "kubectl.kubernetes.io/default-container": "main",
    }
    if plan.gpus:
        main_resources["requests"][GPU_RESOURCE] = str(plan.gpus)
        main_resources["limits"][GPU_RESOURCE] = str(plan.gpus)
        if plan.index % 3 == 0:  # some workloads say how busy they keep their GPUs
            annotations[PREFIX + "expected-gpu-load"] = "0.6"
    env = [
        {"name": "JOB_NAME", "value": job},
        {"name": "JOB_COMPLETION_INDEX", "value": str(plan.index % 16)},
        {"name": "WORLD_SIZE", "value": "16"},
        {"name": "MASTER_ADDR", "value": f"{job}-0.{job}.{plan.namespace}.svc"},
        {"name": "MASTER_PORT", "value": "29500"},
        {"name": "NCCL_DEBUG", "value": "WARN"},
        {"name": "NCCL_IB_DISABLE", "value": "0"},
        {"name": "OMP_NUM_THREADS", "value": "4"},
        {"name": "DATASET_URI", "value": f"s3://datasets/{plan.namespace}/shard-{plan.index % 97}"},
        {"name": "CHECKPOINT_DIR", "value": f"/checkpoints/{job}"},
        {"name": "WANDB_PROJECT", "value": plan.namespace},
        {"name": "POD_NAME", "valueFrom": _POD_NAME_FIELD},
        {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
    ]
    mounts = [
        {"name": "dshm", "mountPath": "/dev/shm"},
        {"name": "config", "mountPath": "/etc/job", "readOnly": True},
        {"name": "scratch", "mountPath": "/scratch"},
    ]
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": plan.name,
            "namespace": plan.namespace,
            "labels": {
                "app.kubernetes.io/name": "trainer" if plan.gpus else "loader",
                "app.kubernetes.io/part-of": plan.namespace,
                "batch.kubernetes.io/job-name": job,
                "batch.kubernetes.io/controller-uid": job_uid,
                "batch.kubernetes.io/job-completion-index": str(plan.index % 16),
                "job-name": job,
                "controller-uid": job_uid,
                "team": plan.namespace.split("-")[0],
            },
            "annotations": annotations,
            "ownerReferences": [
                {
                    "apiVersion": "batch/v1",
                    "kind": "Job",
                    "name": job,
                    "uid": job_uid,
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": {
            "nodeName": plan.node,
            "schedulerName": "default-scheduler",
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 30,
            "automountServiceAccountToken": False,
            # GPU nodes are tainted for GPU pods; the loaders run there beside them.
            "tolerations": [{"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}],
            "initContainers": [
                {
                    "name": "fetch-dataset",
                    "image": "registry.example.com/tools/fetch:1.8.2",
                    "args": ["--source", f"s3://datasets/{plan.namespace}", "--dest", "/scratch"],
                    "resources": {"requests": {"cpu": "500m", "memory": "512Mi"}},
                    "volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}],
                }
            ],
            "containers": [
                {
                    "name": "main",
                    "image": f"registry.example.com/{plan.namespace}/trainer:2026.11.3",
                    "command": ["python", "-m", "train"],
                    "args": ["--config", "/etc/job/config.yaml", "--resume"],
                    "env": env,
                    "ports": [{"name": "metrics", "containerPort": 9090, "protocol": "TCP"}],
                    "resources": main_resources,
                    "volumeMounts": mounts,
                },
                {
                    "name": "log-shipper",
                    "image": "registry.example.com/observability/shipper:0.14.1",
                    "env": [
                        {"name": "SHIP_TO", "value": "logs.observability.svc:4317"},
                        {"name": "POD_NAME", "valueFrom": _POD_NAME_FIELD},
                    ],
                    "resources": {
                        "requests": {"cpu": "50m", "memory": "64Mi"},
                        "limits": {"memory": "128Mi"},
                    },
                },
            ],
            "volumes": [
                {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "16Gi"}},
                {"name": "config", "configMap": {"name": f"{job}-config"}},
                {"name": "scratch", "emptyDir": {}},
            ],
        },
    }
    if labelled and plan.gpus:
        pod["metadata"]["labels"][PREFIX + GPU_POD_LABEL] = GPU_POD_LABEL_VALUE
    return pod


def pod_status(
    pod: Mapping[str, Any], *, admitted_at: datetime, running_since: datetime | None
) -> dict[str, Any]:
    """The status its kubelet writes: admitted (`startTime`, containers being created), or with
    `running_since` every container running and the pod Ready."""
    stamp = format_timestamp(admitted_at)
    if running_since is None:
        state: dict[str, Any] = {"waiting": {"reason": "PodInitializing"}}
        phase, ready, ready_at = "Pending", "False", stamp
    else:
        ready_at = format_timestamp(running_since)
        state = {"running": {"startedAt": ready_at}}
        phase, ready = "Running", "True"
    spec = pod["spec"]

    def statuses(containers: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        return [
            {
                "name": c["name"],
                "image": c["image"],
                "imageID": "",
                "ready": ready == "True",
                "started": ready == "True",
                "restartCount": 0,
                "state": state,
            }
            for c in containers
        ]

    initialized = {"terminated": {"exitCode": 0, "reason": "Completed", "startedAt": stamp}}
    return {
        "status": {
            "phase": phase,
            "hostIP": "10.0.0.1",
            "podIP": f"10.{128 + zlib.crc32(pod['metadata']['name'].encode()) % 64}.0.1",
            "startTime": stamp,
            "qosClass": "Burstable",
            "conditions": [
                {"type": "PodScheduled", "status": "True", "lastTransitionTime": stamp},
                {"type": "Initialized", "status": ready, "lastTransitionTime": ready_at},
                {"type": "ContainersReady", "status": ready, "lastTransitionTime": ready_at},
                {"type": "Ready", "status": ready, "lastTransitionTime": ready_at},
            ],
            "initContainerStatuses": [
                {**s, "state": initialized, "ready": True} for s in statuses(spec["initContainers"])
            ],
            "containerStatuses": statuses(spec["containers"]),
        }
    }


class ChurnPlan:
    """Which pod write comes next, so that pods are replaced at a steady rate.

    Each new pod (a create) brings its kubelet's two status patches (`admit` after
    `admit_after_s`, `run` after `run_after_s`) and the delete of one running pod: writes come
    1:2:1 (create, patch, delete), and the pod count stays what it was. A due patch or delete
    goes first; otherwise the next pod is created. Pure: `now_s` is given, the choice of
    which pod to delete is seeded."""

    def __init__(
        self,
        *,
        running: Sequence[int],
        next_index: int,
        seed: int,
        admit_after_s: float = ADMIT_AFTER_S,
        run_after_s: float = RUN_AFTER_S,
    ) -> None:
        self._running = list(running)
        self._next_index = next_index
        self._rng = random.Random(seed)
        self._admit_after_s = admit_after_s
        self._run_after_s = run_after_s
        self._due: list[tuple[float, int, Op, int]] = []
        self._sequence = 0

    @property
    def next_index(self) -> int:
        return self._next_index

    def _push(self, due_s: float, op: Op, index: int) -> None:
        self._sequence += 1
        heapq.heappush(self._due, (due_s, self._sequence, op, index))

    def next(self, now_s: float) -> tuple[Op, int]:
        """The next write: (what, the pod's index)."""
        while self._due and self._due[0][0] <= now_s:
            _, _, op, index = heapq.heappop(self._due)
            if op == "run":
                self._running.append(index)  # deletable from now on
            if op == "delete":
                if not self._running:  # every pod is still starting: none to delete yet
                    continue
                pick = self._rng.randrange(len(self._running))
                self._running[pick], self._running[-1] = self._running[-1], self._running[pick]
                index = self._running.pop()
            return op, index
        index = self._next_index
        self._next_index += 1
        self._push(now_s, "delete", -1)
        self._push(now_s + self._admit_after_s, "admit", index)
        self._push(now_s + self._run_after_s, "run", index)
        return "create", index

    def pending(self) -> list[tuple[Op, int]]:
        """The status patches still due (what a stop leaves half started), soonest first."""
        due = sorted(self._due)
        self._due = []
        for _, _, op, index in due:
            if op == "run":
                self._running.append(index)
        return [(op, index) for _, _, op, index in due if op != "delete"]

    def running(self) -> list[int]:
        return list(self._running)


# ----------------------------------------------------------------------------- the writers


@dataclass(slots=True)
class WriteTally:
    """Pod writes by kind, and the failed ones."""

    writes: dict[str, int] = field(default_factory=dict)
    errors: int = 0
    # GPU pods that exist after the writes so far (the pod watch should hold exactly these).
    gpu_pods: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def count(self, op: str, *, ok: bool, gpu_delta: int = 0) -> None:
        with self._lock:
            self.writes[op] = self.writes.get(op, 0) + 1
            self.errors += not ok
            if ok:
                self.gpu_pods += gpu_delta


class PodWriter:
    """Pod writes on a few keep-alive connections (a `KubeApi` per thread)."""

    def __init__(
        self,
        plane: ControlPlane,
        nodes: int,
        tally: WriteTally,
        gpu_share: float = DEFAULT_GPU_SHARE,
        *,
        labelled: bool = False,
    ) -> None:
        self._plane = plane
        self._nodes = nodes
        self._gpu_share = gpu_share
        self._labelled = labelled
        self.tally = tally
        self._local = threading.local()
        self._pool = ThreadPoolExecutor(WRITERS, thread_name_prefix="pod-writer")
        self._apis: list[KubeApi] = []
        self._apis_lock = threading.Lock()

    def _api(self) -> KubeApi:
        api: KubeApi | None = getattr(self._local, "api", None)
        if api is None:
            api = self._plane.admin()
            self._local.api = api
            with self._apis_lock:
                self._apis.append(api)
        return api

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        with self._apis_lock:
            for api in self._apis:
                api.close()

    def submit(self, op: Op, index: int, *, now: datetime | None = None) -> Future[None]:
        return self._pool.submit(self.write, op, index, now or datetime.now(UTC))

    def write(self, op: Op, index: int, now: datetime) -> None:
        plan = PodPlan.of(index, self._nodes, self._gpu_share)
        path = f"/api/v1/namespaces/{plan.namespace}/pods"
        api = self._api()
        gpu = 1 if plan.gpus else 0
        try:
            if op == "create":
                api.create(path, pod_object(plan, labelled=self._labelled))
                self.tally.count(op, ok=True, gpu_delta=gpu)
            elif op == "delete":
                status, _ = api.raw("DELETE", f"{path}/{plan.name}", {"gracePeriodSeconds": 0})
                self.tally.count(op, ok=status in (200, 202), gpu_delta=-gpu)
            else:
                admitted = now - timedelta(seconds=RUN_AFTER_S - ADMIT_AFTER_S)
                body = pod_status(
                    pod_object(plan, labelled=self._labelled),
                    admitted_at=now if op == "admit" else admitted,
                    running_since=now if op == "run" else None,
                )
                api.merge_patch(f"{path}/{plan.name}/status", body, field_manager="kubelet")
                self.tally.count(op, ok=True)
        except (ApiError, OSError, http.client.HTTPException):
            self.tally.count(op, ok=False)

    def create_fleet(self, count: int, *, progress: Callable[[str], None]) -> None:
        """`count` pods, each created and then reported running since `FLEET_AGE` ago."""
        since = datetime.now(UTC).replace(microsecond=0) - FLEET_AGE
        done = 0
        lock = threading.Lock()
        step = max(1, count // 10)

        def one(index: int) -> None:
            nonlocal done
            plan = PodPlan.of(index, self._nodes, self._gpu_share)
            api = self._api()
            path = f"/api/v1/namespaces/{plan.namespace}/pods"
            pod = pod_object(plan, labelled=self._labelled)
            try:
                api.create(path, pod)
                api.merge_patch(
                    f"{path}/{plan.name}/status",
                    pod_status(pod, admitted_at=since, running_since=since + timedelta(seconds=20)),
                    field_manager="kubelet",
                )
                self.tally.count("fleet", ok=True, gpu_delta=1 if plan.gpus else 0)
            except (ApiError, OSError, http.client.HTTPException):
                self.tally.count("fleet", ok=False)
            with lock:
                done += 1
                if done % step == 0:
                    progress(f"  {done:,} of {count:,} pods")

        list(self._pool.map(one, range(count)))


def run_churn(
    writer: PodWriter, plan: ChurnPlan, *, rate_per_s: float, duration_s: float
) -> dict[str, Any]:
    """Pod writes at `rate_per_s` for `duration_s`, at most `2 * WRITERS` of them unanswered:
    an API server that answers slower gets fewer (the rate reached is reported), not a queue
    that would be written after the measured window."""
    before = dict(writer.tally.writes), writer.tally.errors
    interval_s = 1.0 / rate_per_s
    started = time.monotonic()
    next_s = started
    in_flight: deque[Future[None]] = deque()
    while (now_s := time.monotonic()) < started + duration_s:
        while len(in_flight) >= 2 * WRITERS:
            in_flight.popleft().result()
        op, index = plan.next(now_s - started)
        in_flight.append(writer.submit(op, index))
        next_s += interval_s
        delay_s = next_s - time.monotonic()
        if delay_s > 0:
            time.sleep(delay_s)
        elif delay_s < -1.0:
            next_s = time.monotonic()  # fell behind: do not burst to catch up
    for future in in_flight:
        future.result()
    elapsed_s = time.monotonic() - started
    writes = {k: v - before[0].get(k, 0) for k, v in writer.tally.writes.items() if k != "fleet"}
    return {
        "writes": writes,
        "errors": writer.tally.errors - before[1],
        "writes_per_s": round(sum(writes.values()) / elapsed_s, 1),
    }


def finish_churn(writer: PodWriter, plan: ChurnPlan) -> None:
    """The status patches still due, written now: a pod created near the end of a round must
    not stay "just bound" (in flight) into the next."""
    for future in [writer.submit(op, index) for op, index in plan.pending()]:
        future.result()


# ----------------------------------------------------------------------------- measuring


@dataclass(frozen=True, slots=True)
class ProcSample:
    cpu_s: float
    rss_mib: float
    hwm_mib: float

    @classmethod
    def read(cls, pid: int) -> ProcSample:
        status = Path(f"/proc/{pid}/status").read_text()
        return cls(
            process_cpu_s(pid),
            status_kib(status, "VmRSS") / 1024,
            status_kib(status, "VmHWM") / 1024,
        )


def status_kib(status: str, key: str) -> int:
    """A `kB` line of `/proc/<pid>/status` (VmRSS, VmHWM)."""
    for line in status.splitlines():
        name, _, value = line.partition(":")
        if name == key:
            return int(value.split()[0])
    raise KeyError(key)


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text exposition: sample (with its labels) -> value."""
    samples: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        sample, _, value = line.rpartition(" ")
        with contextlib.suppress(ValueError):
            samples[sample] = float(value)
    return samples


@dataclass(frozen=True, slots=True)
class Histogram:
    """A histogram's cumulative bucket counts, sum and count at one moment."""

    buckets: tuple[tuple[float, float], ...]  # (upper bound, cumulative count), +Inf last
    sum_s: float
    count: float

    @classmethod
    def of(cls, samples: Mapping[str, float], name: str) -> Histogram:
        prefix = f'{name}_bucket{{le="'
        buckets = sorted(
            (float(sample[len(prefix) : -2]), value)
            for sample, value in samples.items()
            if sample.startswith(prefix)
        )
        return cls(
            tuple(buckets), samples.get(f"{name}_sum", 0.0), samples.get(f"{name}_count", 0.0)
        )

    def since(self, earlier: Histogram) -> Histogram:
        old = dict(earlier.buckets)
        return Histogram(
            tuple((le, n - old.get(le, 0.0)) for le, n in self.buckets),
            self.sum_s - earlier.sum_s,
            self.count - earlier.count,
        )

    def mean_us(self) -> float | None:
        return self.sum_s / self.count * 1e6 if self.count else None

    def quantile_bound_us(self, q: float) -> float | None:
        """The upper bound of the bucket that holds quantile `q`: None without observations,
        `math.inf` beyond the last finite bucket."""
        if not self.count:
            return None
        counts = [n for _, n in self.buckets]
        at = bisect.bisect_left(counts, q * self.count)
        return self.buckets[at][0] * 1e6 if at < len(self.buckets) else math.inf


POD_EVENTS: Final = "gpu_scorer_pod_cache_event_seconds"
NODE_EVENTS: Final = "gpu_scorer_node_cache_event_seconds"


def _metrics(scorer: ScorerProcess) -> dict[str, float]:
    return parse_metrics(scorer.metrics())


def _post(url: str, body: object) -> None:
    request = urllib.request.Request(
        url, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        response.read()


def activate_classes(scorer: ScorerProcess, node_names: Sequence[str]) -> None:
    """A filter and a prioritize for each of two pod classes over every node, as kube-scheduler
    sends: each node is then judged for both classes on every change."""
    for gpus, hints in ((1, {}), (2, {PREFIX + "min-gpu-memory-mib": "20000"})):
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": f"probe-{gpus}",
                "namespace": "ml-training",
                "uid": _uid(f"probe-{gpus}"),
                "annotations": hints,
            },
            "spec": {
                "containers": [
                    {
                        "name": "main",
                        "image": "pause:3.10",
                        "resources": {
                            "requests": {GPU_RESOURCE: str(gpus)},
                            "limits": {GPU_RESOURCE: str(gpus)},
                        },
                    }
                ]
            },
        }
        body = {"Pod": pod, "Nodes": None, "NodeNames": list(node_names)}
        _post(f"{scorer.url}/filter", body)
        _post(f"{scorer.url}/prioritize", body)


@dataclass(slots=True)
class ScorerRound:
    """One scorer's figures in one round."""

    ready_s: float = 0.0
    pod_list_s: float | None = None
    cpu_to_ready_s: float = 0.0
    rss_ready_mib: float = 0.0
    cpu_churn_s: float = 0.0
    cpu_churn_cores: float = 0.0
    rss_end_mib: float = 0.0
    hwm_mib: float = 0.0
    # gpu_scorer_pod_cache_pods once ready, and at the end of the churn.
    pods_listed: float = 0.0
    pods_held: float = 0.0
    pod_events: float = 0.0
    pod_event_mean_us: float | None = None
    pod_event_p99_us: float | None = None
    node_events: float = 0.0
    node_event_mean_us: float | None = None


@dataclass(slots=True)
class Round:
    round: int
    # GPU pods that exist, by this process's writes: at the start and at the end of the churn.
    gpu_pods_start: int
    gpu_pods_end: int
    churn: dict[str, Any]
    scorers: dict[str, ScorerRound]


SCORERS: Final = ("with_watch", "no_watch")
# With `--before REF`: REF's scorer, with its Pod watch, in the same rounds.
BEFORE: Final = "before_watch"
# With `--labelled`: the scorer with `--pod-label-selector`, in the same rounds.
LABELLED: Final = "labelled_watch"
SELECTOR: Final = f"{PREFIX}{GPU_POD_LABEL}={GPU_POD_LABEL_VALUE}"


def pod_list_held_at(log_text: str) -> datetime | None:
    """When the scorer's first pod LIST was held: the time of its "in-flight accounting on"
    line, which it writes as `gpu_scorer_pod_cache_ready` turns 1 (JSON lines, `time` ISO)."""
    for line in log_text.splitlines():
        if POD_LIST_HELD not in line:
            continue
        with contextlib.suppress(ValueError):
            record = json.loads(line)
            if record.get("msg") == POD_LIST_HELD:
                return datetime.fromisoformat(record["time"])
    return None


def _ready(scorer: ScorerProcess) -> bool:
    try:
        with urllib.request.urlopen(f"{scorer.url}/readyz", timeout=2) as response:
            return bool(response.status == 200)
    except OSError:
        return False


def start_to_ready(
    scorers: Mapping[str, ScorerProcess], started_at: datetime, *, timeout_s: float
) -> dict[str, ScorerRound]:
    """Each scorer from start until its LISTs are held (`/readyz`, and with the Pod watch its
    log line), with its CPU and RSS at that moment.

    Not by polling /metrics: a scrape judges every node (`gpu_scorer_node_data`), so polling
    it would cost the scorers what is measured. One scrape afterwards confirms the gauge."""
    figures = {name: ScorerRound() for name in scorers}
    waiting = dict(scorers)
    started_s = time.monotonic()
    while waiting:
        if time.monotonic() > started_s + timeout_s:
            raise TimeoutError(f"{', '.join(waiting)} not ready after {timeout_s:g} s")
        for name, scorer in list(waiting.items()):
            if not scorer.alive():
                raise RuntimeError(f"{scorer.name} exited:\n{scorer.log()[-2000:]}")
            held_at = None if name == "no_watch" else pod_list_held_at(scorer.log())
            if (name == "no_watch" or held_at is not None) and _ready(scorer):
                sample = ProcSample.read(_pid(scorer))
                mine = figures[name]
                mine.ready_s = (datetime.now(UTC) - started_at).total_seconds()
                if held_at is not None:
                    mine.pod_list_s = (held_at - started_at).total_seconds()
                mine.cpu_to_ready_s = sample.cpu_s
                mine.rss_ready_mib = sample.rss_mib
                del waiting[name]
        time.sleep(READY_POLL_S)
    for name, scorer in scorers.items():
        samples = _metrics(scorer)
        figures[name].pods_listed = samples.get("gpu_scorer_pod_cache_pods", 0.0)
        held = samples.get("gpu_scorer_pod_cache_ready")
        if name != "no_watch" and held != 1:
            raise RuntimeError(f"gpu_scorer_pod_cache_ready is {held} after the LIST was logged")
    return figures


def _pid(scorer: ScorerProcess) -> int:
    assert scorer.popen is not None
    return scorer.popen.pid


def measure_round(
    plane: ControlPlane,
    writer: PodWriter,
    plan: ChurnPlan,
    config: Config,
    *,
    index: int,
    logs: Path,
    patcher: Patcher,
    progress: Callable[[str], None],
    before_tree: Path | None = None,
) -> Round:
    gpu_pods_start = writer.tally.gpu_pods
    load_at_start = load_1m()
    scorers = {
        "with_watch": scorer_process(
            logs, kubeconfig=plane.admin_kubeconfig, name=f"scorer-watch-r{index}"
        ),
        "no_watch": scorer_process(
            logs,
            kubeconfig=plane.admin_kubeconfig,
            name=f"scorer-no-watch-r{index}",
            extra_args=["--no-pod-watch"],
        ),
    }
    if config.labelled:
        scorers[LABELLED] = scorer_process(
            logs,
            kubeconfig=plane.admin_kubeconfig,
            name=f"scorer-labelled-r{index}",
            extra_args=["--pod-label-selector", SELECTOR],
        )
    if before_tree is not None:
        earlier = scorer_process(
            logs, kubeconfig=plane.admin_kubeconfig, name=f"scorer-before-r{index}"
        )
        # `-P`: not this checkout's modules from the working directory, but the tree's.
        earlier.argv.insert(1, "-P")
        earlier.env = {"PYTHONPATH": str(before_tree)}
        scorers[BEFORE] = earlier
    try:
        started_at = datetime.now(UTC)
        for scorer in scorers.values():
            scorer.start()
        figures = start_to_ready(scorers, started_at, timeout_s=600)
        node_names = [node_plan(i)[0] for i in range(config.nodes)]
        for scorer in scorers.values():
            activate_classes(scorer, node_names)
        before = {name: _metrics(s) for name, s in scorers.items()}
        cpu_before = {name: ProcSample.read(_pid(s)).cpu_s for name, s in scorers.items()}
        window_started_s = time.monotonic()
        patches_before = patcher.sent
        progress(
            f"  round {index}: ready (pod LIST after {figures['with_watch'].pod_list_s:.1f} s); "
            f"{config.duration_s:g} s of churn"
        )
        churn = run_churn(writer, plan, rate_per_s=config.churn_per_s, duration_s=config.duration_s)
        gpu_pods_end = writer.tally.gpu_pods
        # CPU first: the scrape that follows judges every node, which is not the watch's work.
        samples = {name: ProcSample.read(_pid(s)) for name, s in scorers.items()}
        churn["window_s"] = round(time.monotonic() - window_started_s, 2)
        churn["patches_per_s"] = round((patcher.sent - patches_before) / churn["window_s"], 1)
        churn["load_1m"] = [load_at_start, load_1m()]
        for name, scorer in scorers.items():
            after = _settled(scorer, 0 if name == "no_watch" else gpu_pods_end)
            sample = samples[name]
            mine = figures[name]
            mine.cpu_churn_s = sample.cpu_s - cpu_before[name]
            mine.cpu_churn_cores = mine.cpu_churn_s / churn["window_s"]
            mine.rss_end_mib = sample.rss_mib
            mine.hwm_mib = sample.hwm_mib
            mine.pods_held = after.get("gpu_scorer_pod_cache_pods", 0.0)
            pods = Histogram.of(after, POD_EVENTS).since(Histogram.of(before[name], POD_EVENTS))
            mine.pod_events = pods.count
            mine.pod_event_mean_us = pods.mean_us()
            mine.pod_event_p99_us = pods.quantile_bound_us(0.99)
            nodes = Histogram.of(after, NODE_EVENTS).since(Histogram.of(before[name], NODE_EVENTS))
            mine.node_events = nodes.count
            mine.node_event_mean_us = nodes.mean_us()
    finally:
        for scorer in scorers.values():
            scorer.kill()
    finish_churn(writer, plan)
    return Round(index, gpu_pods_start, gpu_pods_end, churn, figures)


def load_1m() -> float:
    """The machine's 1-minute load average: how much else wanted the cores."""
    return float(Path("/proc/loadavg").read_text().split()[0])


def _settled(scorer: ScorerProcess, pods: int, timeout_s: float = 10.0) -> dict[str, float]:
    """The scorer's metrics once its pod watch has caught up with the last writes (`pods`
    held), or as they are after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        samples = _metrics(scorer)
        if samples.get("gpu_scorer_pod_cache_pods") == pods or time.monotonic() > deadline:
            return samples
        time.sleep(0.5)


# ----------------------------------------------------------------------------- the summary

MEASURES: Final = (
    "ready_s",
    "pod_list_s",
    "cpu_to_ready_s",
    "rss_ready_mib",
    "cpu_churn_s",
    "cpu_churn_cores",
    "rss_end_mib",
    "hwm_mib",
    "pods_listed",
    "pods_held",
    "pod_events",
    "pod_event_mean_us",
    "pod_event_p99_us",
    "node_events",
    "node_event_mean_us",
)


def _median(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def summarize_rounds(rounds: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, float | None]]:
    """measure -> the median with the watch, without it, and of each round's difference.

    `rounds` are `asdict(Round)`s. The cost is the median of the rounds' differences (not the
    difference of the medians): both scorers of a round saw the same machine at the same time."""
    summary: dict[str, dict[str, float | None]] = {}
    for measure in MEASURES:
        with_watch = [r["scorers"]["with_watch"][measure] for r in rounds]
        no_watch = [r["scorers"]["no_watch"][measure] for r in rounds]
        differences = [
            None if a is None or b is None else a - b
            for a, b in zip(with_watch, no_watch, strict=True)
        ]
        summary[measure] = {
            "with_watch": _median(with_watch),
            "no_watch": _median(no_watch),
            "cost": _median(differences),
        }
        for name, cost in ((BEFORE, "before_cost"), (LABELLED, "labelled_cost")):
            if not rounds or not all(name in r["scorers"] for r in rounds):
                continue
            values = [r["scorers"][name][measure] for r in rounds]
            summary[measure][name] = _median(values)
            summary[measure][cost] = _median(
                [
                    None if a is None or b is None else a - b
                    for a, b in zip(values, no_watch, strict=True)
                ]
            )
    return summary


def run(config: Config, *, progress: Callable[[str], None]) -> dict[str, Any]:
    # Not at the top: scorer_latency imports this checkout's modules, which a `--before`
    # child must not share.
    from benchmarks.scorer_latency import source_tree  # noqa: PLC0415

    fleet = config.fleet()
    with (
        source_tree(config.before) as before_tree,
        tempfile.TemporaryDirectory(prefix="pod-watch-") as scratch_dir,
        running_control_plane(Path(scratch_dir) / "plane") as plane,
    ):
        scratch = Path(scratch_dir)
        started = time.monotonic()
        register_fleet(plane, config.nodes, config.seed)
        with plane.admin() as api:
            for namespace in NAMESPACES:
                apply(
                    api, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}
                )
                apply(
                    api,
                    {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default"}},
                    namespace=namespace,
                )
        progress(f"{config.nodes:,} nodes registered in {time.monotonic() - started:.0f} s")
        tally = WriteTally()
        writer = PodWriter(plane, config.nodes, tally, config.gpu_share, labelled=config.labelled)
        patcher = Patcher(plane, fleet)
        rounds: list[Round] = []
        try:
            started = time.monotonic()
            writer.create_fleet(config.pods, progress=progress)
            created_s = time.monotonic() - started
            progress(
                f"{config.pods:,} pods created and running in {created_s:.0f} s "
                f"({tally.errors} errors)"
            )
            if tally.errors:
                raise RuntimeError(f"{tally.errors} of {config.pods} pod writes failed")
            plan = ChurnPlan(running=range(config.pods), next_index=config.pods, seed=config.seed)
            patcher.start()
            for index in range(config.rounds):
                result = measure_round(
                    plane, writer, plan, config, index=index, logs=scratch / "logs",
                    patcher=patcher, progress=progress, before_tree=before_tree,
                )  # fmt: skip
                rounds.append(result)
                progress(_round_line(result))
        finally:
            patcher.stop()
            writer.close()
    document_rounds = [asdict(r) for r in rounds]
    loads = [x for r in rounds for x in r.churn["load_1m"]]
    return {
        "machine": machine_description(),
        "measured_at": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "config": asdict(config),
        "gpu_pods": rounds[0].gpu_pods_start if rounds else 0,
        "fleet_created_s": round(created_s, 1),
        "patches_per_s": round(patcher.rate_per_s, 1),
        "patch_errors": patcher.errors,
        "load_1m": {"min": min(loads), "median": statistics.median(loads), "max": max(loads)}
        if loads
        else None,
        "rounds": document_rounds,
        "summary": summarize_rounds(document_rounds),
    }


def _round_line(result: Round) -> str:
    w, n = result.scorers["with_watch"], result.scorers["no_watch"]
    return (
        f"  round {result.round}: cpu churn {w.cpu_churn_s:.1f} vs {n.cpu_churn_s:.1f} s, "
        f"rss {w.rss_end_mib:.0f} vs {n.rss_end_mib:.0f} MiB, pods held {w.pods_listed:.0f} of "
        f"{result.gpu_pods_start} once ready, {w.pods_held:.0f} of {result.gpu_pods_end} at the "
        f"end, churn {result.churn['writes_per_s']} writes/s "
        f"({result.churn['errors']} errors); cpu to ready "
        + ", ".join(f"{name} {s.cpu_to_ready_s:.2f} s" for name, s in result.scorers.items())
    )


# ----------------------------------------------------------------------------- the document

HEADING: Final = "## In-flight accounting: what the Pod watch costs"

# (measure, label, digits): the table's rows.
ROWS: Final = (
    ("ready_s", "start to ready (s)", 1),
    ("pod_list_s", "first pod LIST held (`gpu_scorer_pod_cache_ready` 1), s after start", 1),
    ("cpu_to_ready_s", "CPU from start to ready (s)", 1),
    ("rss_ready_mib", "RSS once ready (MiB)", 0),
    ("cpu_churn_s", "CPU during the churn (s)", 1),
    ("cpu_churn_cores", "CPU during the churn (cores)", 3),
    ("rss_end_mib", "RSS at the end (MiB)", 0),
    ("hwm_mib", "peak RSS, VmHWM (MiB)", 0),
    ("pods_listed", "GPU pods held once ready (`gpu_scorer_pod_cache_pods`)", 0),
    ("pods_held", "GPU pods held at the end", 0),
    ("pod_events", "pod events that changed a node, in the churn", 0),
    ("pod_event_mean_us", "time per pod event, mean (us)", 0),
    ("pod_event_p99_us", "time per pod event, p99 at most (us)", 0),
    ("node_events", "node events that changed a verdict input, in the churn", 0),
    ("node_event_mean_us", "time per node event, mean (us)", 0),
)


def _cell(value: float | None, digits: int) -> str:
    if value is None:
        return ""
    if value == math.inf:  # a p99 beyond the histogram's last bucket
        return f"> {EVENT_BUCKETS_S[-1] * 1e6:,.0f}"
    return f"{value:,.{digits}f}"


def markdown_section(document: Mapping[str, Any], *, command: str) -> str:
    """The performance document's section: the two scorers side by side, and the cost."""
    config = document["config"]
    summary = document["summary"]
    labelled = LABELLED in summary["cpu_to_ready_s"]
    rows = [["measure", "with the Pod watch", "`--no-pod-watch`", "cost (with - without)"]]
    if labelled:
        rows[0] += ["with `--pod-label-selector`", "its cost"]
    for measure, label, digits in ROWS:
        entry = summary[measure]
        rows.append(
            [
                label,
                _cell(entry["with_watch"], digits),
                _cell(entry["no_watch"], digits),
                _cell(entry["cost"], digits),
            ]
            + ([_cell(entry[LABELLED], digits), _cell(entry["labelled_cost"], digits)]
               if labelled else [])
        )  # fmt: skip
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = [
        "| " + " | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) + " |"
        for row in [rows[0], ["-" * w for w in widths], *rows[1:]]
    ]
    churn = [r["churn"] for r in document["rounds"]]
    rate = _median([c["writes_per_s"] for c in churn])
    errors = sum(c["errors"] for c in churn)
    cpu_cost = summary["cpu_churn_cores"]["cost"]
    rss_cost = summary["rss_end_mib"]["cost"]
    held = summary["pods_held"]["with_watch"] or 0
    facts = []
    if cpu_cost is not None:
        facts.append(f"the watch costs {cpu_cost:.1%} of a core at {rate:g} pod writes/s")
    if rss_cost is not None and held:
        facts.append(
            f"{rss_cost:,.0f} MiB of RSS for {held:,.0f} GPU pods held "
            f"({rss_cost * 1024 / held:.1f} KiB a pod, the whole difference counted per pod)"
        )
    if summary["pod_list_s"]["with_watch"] is not None:
        facts.append(
            f"the first pod LIST is held {summary['pod_list_s']['with_watch']:.1f} s after start"
        )
    gpu_pods = document["gpu_pods"]
    patches = _median([c.get("patches_per_s") for c in churn]) or document["patches_per_s"]
    load = document.get("load_1m")
    load_text = (
        f" The machine's 1-minute load average during the rounds: median {load['median']:.1f} "
        f"({load['min']:.1f} to {load['max']:.1f})."
        if load
        else ""
    )
    return f"""{HEADING}

Command: `{command}` (machine: {document["machine"]}, {document["measured_at"]}). On the
loopback control plane ([control-plane.md](control-plane.md)): {config["nodes"]:,} GPU Nodes
and {config["pods"]:,} pods bound to them ({gpu_pods:,} asking for GPUs, the rest for none:
the scorer decodes and drops those), a few KB each as a Job's pods are, running for two hours.
Per round ({len(document["rounds"])} rounds) two names-only scorers start side by side, one
with the Pod watch (the default) and one with `--no-pod-watch`; each is asked once per pod
class (two classes) over every node, then pods churn for {config["duration_s"]:g} s at
{rate:g} writes/s (creates, the kubelet's `startTime` and running patches, deletes: 1:2:1;
{errors} failed) while GPU annotations are patched at {patches:g}/s. CPU is
`/proc/<pid>/stat` utime + stime, RSS `/proc/<pid>/status`; the cost is the median of the
rounds' differences. The two scorers, etcd, kube-apiserver and the writers share the
cores.{load_text} In short: {"; ".join(facts)}.

{chr(10).join(lines)}
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.pod_watch", description=__doc__)
    defaults = Config()
    parser.add_argument("--nodes", type=int, default=defaults.nodes, help="GPU Nodes")
    parser.add_argument("--pods", type=int, default=defaults.pods, help="pods bound at the start")
    parser.add_argument(
        "--churn-per-s",
        type=float,
        default=defaults.churn_per_s,
        help="pod writes a second in the churn (create, 2 status patches, delete: 1:2:1)",
    )
    parser.add_argument(
        "--duration-s", type=float, default=defaults.duration_s, help="churn per round, seconds"
    )
    parser.add_argument("--rounds", type=int, default=defaults.rounds, help="fresh scorer pairs")
    parser.add_argument(
        "--before", metavar="REF", help="also run this commit's scorer, with its Pod watch"
    )
    parser.add_argument(
        "--gpu-share",
        type=float,
        default=defaults.gpu_share,
        help="share of the pods that ask for GPUs (default 0.8)",
    )
    parser.add_argument(
        "--labelled",
        action="store_true",
        help="GPU pods carry the chart's GPU-pod label, and a third scorer watches with "
        "--pod-label-selector",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    return parser


def config_from(parser: argparse.ArgumentParser, args: argparse.Namespace) -> Config:
    """The run's settings, or a usage error for sizes that cannot run."""
    if args.nodes < 1 or args.pods < 1 or args.rounds < 1:
        parser.error("--nodes, --pods and --rounds must be at least 1")
    if args.churn_per_s <= 0 or args.duration_s <= 0:
        parser.error("--churn-per-s and --duration-s must be positive")
    if args.pods < GPU_POD_PERIOD:
        parser.error(f"--pods: at least {GPU_POD_PERIOD}, so that some ask for no GPU")
    if not 0 < args.gpu_share <= 1:
        parser.error("--gpu-share: above 0, at most 1")
    return Config(
        args.nodes,
        args.pods,
        args.churn_per_s,
        args.duration_s,
        args.rounds,
        gpu_share=args.gpu_share,
        before=args.before,
        labelled=args.labelled,
    )


def main(argv: Sequence[str] | None = None) -> int:
    exit_on_sigterm()  # a stopped run stops its control plane and scorers too
    parser = build_parser()
    args = parser.parse_args(argv)
    config = config_from(parser, args)

    def progress(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    document = run(config, progress=progress)
    if args.json:
        print(json.dumps(document, indent=2))
        return 0
    print(markdown_section(document, command=command_line(argv)))
    return 0


def command_line(argv: Sequence[str] | None) -> str:
    return " ".join(["python -m benchmarks.pod_watch", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    raise SystemExit(main())
