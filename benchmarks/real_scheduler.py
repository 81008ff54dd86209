"""Pods per second of a real kube-scheduler, with the scorer as its extender and without.

    python -m benchmarks.real_scheduler [--nodes 300,5000] [--pods 400] [--full-pods 120]
        [--rounds 3] [--modes none,names,full,names-no-inflight,names-no-own-load,...]
        [--capture] [--json]
    python -m benchmarks.real_scheduler --pool RUN.json [RUN.json ...]   # rounds of many runs

The figure a user feels: how much slower a burst of GPU pods is placed once the extender is in the
scheduler's loop. On the loopback control plane (`loopback_cluster.control_plane`, built by
`python3 dev.py cluster build`) it registers N realistic GPU Nodes (~6 KB each, the agent's
annotations on every one), starts the scorers the modes need (names only, with its node cache and,
as `gpu-scorer serve` defaults to, its Pod watch: in-flight accounting on; full Node objects,
without credentials and so without the Pod watch; `names-no-inflight`: names only with
`--no-pod-watch`, to compare in-flight accounting on and off in the same run;
`names-no-own-load`: names only with `--no-own-load`, to compare counting the pod's own load on
and off in the same run; `names-before`, with `--before REF`: the names-only scorer of commit REF,
to compare two versions in the same run; `names-image`: the names-only scorer run from the image
built from the checkout (`python3 dev.py image`; root), as the chart runs it, on the image's
interpreter rather than the one running this benchmark), and keeps patching GPU annotations at
a fleet's write rate for the whole run. Each pod is a replica of a Deployment, as its controller
creates it (owned by a ReplicaSet, with the `pod-template-hash` label), so the scorer looks up its
workload's learned load on every request; with no kubelet no replica ever runs, so nothing is
learned and the pod's own load is the policy's default. There is no kubelet: each pod a
names-only burst binds stays "allocation pending" in the Pod watch's scorer (it counts on its node)
until its round deletes it. A first burst with no extender warms the control plane up and is not
counted. Then, per mode, in rounds whose orders balance which mode runs right before which
(`round_order`):

1. create a burst of 1-GPU pods for that mode's schedulerName while no scheduler serves it;
2. start a kube-scheduler with that mode's configuration: it schedules the backlog;
3. pods/s = (pods - 1) / (last bind - first bind), bind times read from a pod watch;
4. stop that scheduler and delete the pods.

Timing from the first bind leaves the scheduler's start-up (informer sync) out; the binds
themselves are in. Everything shares the machine's cores: etcd, kube-apiserver, the scheduler,
every mode's scorer (the names-only one's Pod watch takes the other modes' binds too), and this
process's patcher and watch. The scorers' own request time (their
`gpu_scorer_request_duration_seconds`) is reported next to the ratio, as the proxy that
explains it.

Each mode is also divided by the Go null extender's pods/s of the same round, which ran a
minute away at most. The median of those ratios comes with the interval that holds the true
median at 95 % (`benchmarks.intervals`; with fewer than six rounds, their range and its lower
coverage), and the targets line says whether that interval settles the floor target or not.
No extender at all is paired the same way: it does strictly less than the Go null extender, so
each of its rounds that comes out slower is the machine's noise, seen directly. `--pool` reads
the `--json` documents of several runs and pairs their rounds the same way, as one run.

`--capture` also times every extender call as kube-scheduler waits on it, from a loopback packet
capture (`benchmarks.wire_capture`: tcpdump, which needs CAP_NET_RAW): the scorer's own request
time leaves out the wait for a CPU, the GIL, the read and the write, and a null extender has none.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import os
import random
import shutil
import socket
import statistics
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath
from typing import Any, Final

import yaml

from benchmarks import wire_capture
from benchmarks.intervals import median_interval, resolution
from benchmarks.lifecycle import exit_on_sigterm
from benchmarks.machine import MachineCpu, machine_cpu_s, machine_description, process_cpu_s
from benchmarks.sections import markdown
from gpu_contract.schema import DEFAULT_KEYS, encode, merge_patch, normalize_model_name
from kube_standins.nodes import gpu_node
from loopback_cluster import image
from loopback_cluster.control_plane import (
    BuildSpec,
    ControlPlane,
    ExtenderConfig,
    Scheduler,
    SchedulerConfig,
    free_port,
    running_control_plane,
)
from loopback_cluster.workload import (
    BinaryProcess,
    ScorerProcess,
    apply,
    gpu_pod,
    gpu_state,
    register_node,
    scorer_process,
    wait_for,
)

MODES: Final = ("none", "names", "full")
# The names-only scorer with in-flight accounting off (`--no-pod-watch`), and with the pod's
# own load not counted (`--no-own-load`), each against `names` in the same run.
VARIANT_MODES: Final = ("names-no-inflight", "names-no-own-load")
# The flag each variant adds to the names-only scorer's command line.
VARIANT_FLAGS: Final = {"names-no-inflight": "--no-pod-watch", "names-no-own-load": "--no-own-load"}
# Extenders that decide nothing, to split the extender's cost (`--modes`): compiled Go (the
# mechanism's own cost), and Python on the scorer's HTTP edge (that edge's cost).
NULL_MODES: Final = ("null-go-names", "null-py-names", "null-go-full")
# The names-only scorer of another commit (`--before REF`), against `names` in the same run.
BEFORE_MODE: Final = "names-before"
# The names-only scorer run from the image (`python3 dev.py image`), as the chart runs it: the
# image's interpreter, PYTHONOPTIMIZE=2, a read-only root; against `names` (this checkout on the
# interpreter that runs the benchmark) in the same run. Needs root (`loopback_cluster.image`).
IMAGE_MODE: Final = "names-image"
ALL_MODES: Final = (*MODES, *VARIANT_MODES, BEFORE_MODE, IMAGE_MODE, *NULL_MODES)
# The names-only scorer as this checkout runs it and as the image does: the throughput target
# (`FLOOR_TARGET` of the Go null extender) is judged for each.
TARGET_MODES: Final = ("names", IMAGE_MODE)
# The modes that need more than this checkout (a commit, a built image): the figures leave them
# out.
UNPLANNED_MODES: Final = (BEFORE_MODE, IMAGE_MODE)
NAMES_ONLY_MODES: Final = (
    "names",
    BEFORE_MODE,
    IMAGE_MODE,
    "names-no-inflight",
    "names-no-own-load",
    "null-go-names",
    "null-py-names",
)
# The scorer's modes with its Pod watch on (in-flight accounting, the workloads' pods).
INFLIGHT_MODES: Final = ("names", "names-no-own-load", BEFORE_MODE, IMAGE_MODE)
NAMESPACE: Final = "bench"
# The fleet simulation's write rate before per-GPU data: 11.5 % of one write per 5 s sample, or
# ~110 patches/s at 5,000 nodes. Today's defaults write 9.6 %, so this churn is a little heavier.
FLEET_WRITES_PER_NODE_S: Final = 0.115 / 5.0
# kube-scheduler's client defaults (50 QPS, burst 100) would cap a burst at ~50 binds/s and
# hide the extender's cost behind the rate limiter; large clusters raise them too.
SCHEDULER_QPS: Final = 500.0
DEFAULT_PODS: Final = 400
DEFAULT_FULL_PODS: Final = 120
SCHEDULER_BURST: Final = 1000
PRODUCTS: Final = (
    ("NVIDIA A100-SXM4-80GB", 8),
    ("NVIDIA H100 80GB HBM3", 8),
    ("Tesla V100-SXM2-32GB", 8),
    ("NVIDIA L4", 4),
)


@dataclass(frozen=True, slots=True)
class Config:
    nodes: int
    # Pods per burst. A full-node burst runs 20-40x slower, so it has fewer pods for the same
    # precision; a names-only burst of 120 pods at 300 nodes lasts under half a second.
    pods: int = DEFAULT_PODS
    full_pods: int = DEFAULT_FULL_PODS
    rounds: int = 3
    writes_per_node_s: float = FLEET_WRITES_PER_NODE_S
    seed: int = 7
    timeout_s: float = 180.0
    modes: tuple[str, ...] = MODES
    before: str | None = None  # the commit `names-before` runs
    # Each extender call timed on the wire too (`benchmarks.wire_capture`: tcpdump on lo).
    capture: bool = False
    # The CPUs the extenders run on, every other process of the run kept off them (empty: all
    # share every CPU); see `--extender-cpus`.
    extender_cpus: tuple[int, ...] = ()
    # How each round orders its modes (`round_order`); documents of runs made before it was
    # recorded lack it: their rounds rotated one order.
    round_order: str = "williams"

    def pods_for(self, mode: str) -> int:
        return self.full_pods if mode.endswith("full") else self.pods

    @property
    def patch_rate_per_s(self) -> float:
        return self.nodes * self.writes_per_node_s


@dataclass(slots=True)
class Round:
    mode: str
    round: int
    pods_per_s: float
    span_s: float
    # The scorer's mean request time in this round, ms, by verb (none: no extender).
    scorer_ms: dict[str, float] = field(default_factory=dict)
    scorer_requests: dict[str, int] = field(default_factory=dict)
    # The mode's extender process's CPU (every thread) from the scheduler's start to the last
    # bind, per pod placed: what it takes of the cores the scheduler shares (none: no extender).
    extender_cpu_ms_per_pod: float | None = None
    # What kube-scheduler waited on each call, read on the wire, by verb (`wire_capture.summary`;
    # empty without `--capture` and for no extender).
    wire: dict[str, dict[str, float]] = field(default_factory=dict)
    # The scorer's CPU over the same span per pod placed, by thread (its
    # `gpu_scorer_thread_cpu_seconds_total`: request, node-watch, pod-watch, ...); empty for no
    # extender, a null one, and a scorer from before the metric.
    thread_cpu_ms_per_pod: dict[str, float] = field(default_factory=dict)
    # The whole machine from the first bind to the last, the span pods/s is counted over
    # (`/proc/stat`): the share of its CPU time left idle, and the CPU every process used (etcd,
    # the API server, the schedulers, the extenders, the patcher, this benchmark) per pod placed.
    # Near no idle time the cores are saturated, and pods/s is about what they hold divided by
    # the CPU each pod takes of them. None: not read.
    machine_idle_share: float | None = None
    machine_cpu_ms_per_pod: float | None = None
    # The control plane's processes over the extender's span (the scheduler's start to the last
    # bind), per pod placed: etcd, kube-apiserver (which serves every watch, the scorer's Node
    # and Pod watches included) and the round's kube-scheduler (from its start: its informers'
    # first sync is in it, alike in every mode). Empty: not read.
    process_cpu_ms_per_pod: dict[str, float] = field(default_factory=dict)


# ----------------------------------------------------------------------------- the fleet


def node_plan(index: int) -> tuple[str, str, int]:
    product, gpus = PRODUCTS[index % len(PRODUCTS)]
    return f"gpu-{index:05d}", normalize_model_name(product), gpus


def random_state(rng: random.Random, model: str, gpus: int) -> dict[str, Any]:
    """One node's merge patch as the agent writes it, with fleet-like values (some above 0.90)."""
    utilization = min(1.0, max(0.0, rng.betavariate(2.0, 2.2)))
    state = gpu_state(
        utilization=round(utilization, 2),
        gpu_model=model,
        gpu_count=gpus,
        temperature_c=rng.randint(38, 84),
        memory_largest_free_mib=rng.randint(8_000, 80_000),
    )
    return merge_patch(encode(state, DEFAULT_KEYS), DEFAULT_KEYS)


def register_fleet(plane: ControlPlane, count: int, seed: int, workers: int = 4) -> None:
    def register(indexes: range) -> None:
        rng = random.Random(seed + indexes.start)
        with plane.admin() as api:
            for i in indexes:
                name, model, gpus = node_plan(i)
                register_node(api, gpu_node(name, gpu_count=gpus, product=model))
                api.merge_patch(
                    f"/api/v1/nodes/{name}",
                    random_state(rng, model, gpus),
                    field_manager="gpu-scheduler-agent",
                )

    step = -(-count // workers)
    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(register, [range(s, min(s + step, count)) for s in range(0, count, step)]))


class Patcher:
    """Patches random Nodes' GPU annotations at a steady rate, as a fleet's agents would."""

    def __init__(self, plane: ControlPlane, config: Config) -> None:
        self._plane = plane
        self._config = config
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="patcher", daemon=True)
        self.sent = 0
        self.errors = 0
        self.cpu_s = 0.0
        self.started_s = 0.0
        self.stopped_s = 0.0

    def start(self) -> Patcher:
        self.started_s = time.monotonic()
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop patching. A patcher never started (an extender failed to start, whose error is
        the one to report) has no thread to wait for."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=30)
        self.stopped_s = time.monotonic()

    @property
    def rate_per_s(self) -> float:
        elapsed = (self.stopped_s or time.monotonic()) - self.started_s
        return self.sent / elapsed if elapsed > 0 else 0.0

    def _run(self) -> None:
        rng = random.Random(self._config.seed)
        interval_s = 1.0 / self._config.patch_rate_per_s
        next_s = time.monotonic()
        cpu_started = time.thread_time()
        with self._plane.admin() as api:
            while not self._stop.is_set():
                index = rng.randrange(self._config.nodes)
                name, model, gpus = node_plan(index)
                status, _ = api.raw(
                    "PATCH",
                    f"/api/v1/nodes/{name}?fieldManager=gpu-scheduler-agent",
                    random_state(rng, model, gpus),
                    content_type="application/merge-patch+json",
                )
                self.sent += 1
                self.errors += status != 200
                next_s += interval_s
                delay_s = next_s - time.monotonic()
                if delay_s > 0:
                    self._stop.wait(delay_s)
                elif delay_s < -1.0:
                    next_s = time.monotonic()  # fell behind: do not burst to catch up
        self.cpu_s = time.thread_time() - cpu_started


# ----------------------------------------------------------------------------- one measurement


@dataclass
class Extender:
    """One mode's extender process: the scorer, or a null extender."""

    url: str
    names_only: bool
    process: BinaryProcess
    # The scorer's /metrics has its own request times; the null extenders have none.
    scorer: ScorerProcess | None = None
    # Whether the scorer must count in-flight pods (its Pod watch synced) before it is ready.
    inflight: bool = False

    def wait_ready(self, timeout_s: float = 120.0) -> None:
        if self.scorer is not None:
            scorer = self.scorer.wait_ready(timeout_s=timeout_s)
            if self.inflight:
                wait_for(
                    f"{scorer.name}'s in-flight accounting (its Pod watch)",
                    lambda: scorer.metric("gpu_scorer_inflight_accounting") == 1,
                    timeout_s=timeout_s,
                    interval_s=0.5,
                )
            return
        port = int(self.url.rsplit(":", 1)[1])

        def listening() -> bool:
            if not self.process.alive():
                raise RuntimeError(f"{self.process.name} exited:\n{self.process.log()}")
            with socket.socket() as probe:
                return probe.connect_ex(("127.0.0.1", port)) == 0

        wait_for(f"{self.process.name} to listen", listening, timeout_s=timeout_s)


# Where the image's scorer reads the plane's kubeconfig.
KUBECONFIG_IN_IMAGE: Final = PurePosixPath("/etc/gpu-bench/kubeconfig")


def self_contained_kubeconfig(kubeconfig: Path, into: Path) -> Path:
    """`kubeconfig` with the files it names (the CA, the client's certificate and key; a relative
    path from the kubeconfig's folder) inlined as their `-data` fields, written readable by all
    into the folder `into` (made here): a process in the image, as another user, reads it with
    nothing else of the host's. Returns `into`. The client's key is then readable by every user
    who can reach `into`: the caller puts it in a run's private scratch folder (`mkdtemp`'s
    0700), for a loopback plane that lives as long as the run."""
    config = yaml.safe_load(kubeconfig.read_text())
    inlined = {
        "certificate-authority": "certificate-authority-data",
        "client-certificate": "client-certificate-data",
        "client-key": "client-key-data",
    }
    for section, key in (("clusters", "cluster"), ("users", "user")):
        for entry in config.get(section) or ():
            fields = entry.get(key) or {}
            for named, data in inlined.items():
                path = fields.pop(named, None)
                if path is not None:
                    named_file = kubeconfig.parent / path  # an absolute path stays itself
                    fields[data] = base64.b64encode(named_file.read_bytes()).decode()
    into.mkdir(parents=True, exist_ok=True)
    into.chmod(0o755)
    written = into / KUBECONFIG_IN_IMAGE.name
    written.write_text(yaml.safe_dump(config))
    written.chmod(0o644)
    return into


def scorer_in_image(
    mounted: image.MountedImage, argv: Sequence[str], credentials: Path
) -> list[str]:
    """`argv` (the image's `gpu-scorer ...`, its kubeconfig named as `KUBECONFIG_IN_IMAGE`) run
    from the image as the chart runs it: its interpreter and environment (`PYTHONOPTIMIZE=2`),
    the chart's user, a read-only root, an empty /tmp; the folder `credentials`
    (`self_contained_kubeconfig`'s) mounted read-only where it names."""
    container = image.Container(
        argv=list(argv),
        uid=image.IMAGE_USER,
        gid=image.IMAGE_USER,
        read_only={credentials: KUBECONFIG_IN_IMAGE.parent},
    )
    return mounted.argv(container)


def extenders(
    plane: ControlPlane,
    logs: Path,
    modes: Sequence[str],
    *,
    record: Path | None = None,
    before: Path | None = None,
    cpus: Sequence[int] = (),
    mounted_image: image.MountedImage | None = None,
) -> dict[str, Extender]:
    """Each mode's extender; `record`: the Python null extender writes the requests there;
    `before`: the source tree `names-before` runs; `cpus`: the CPUs every extender runs on
    (`taskset`, so that each of its threads inherits them), none: any; `mounted_image`: the
    image `names-image` runs from."""
    pinned = ["taskset", "--cpu-list", ",".join(map(str, cpus))] if cpus else []
    made: dict[str, Extender] = {}
    for mode in modes:
        if mode == "none":
            continue
        names_only = mode in NAMES_ONLY_MODES
        if mode in ("names", "full", *VARIANT_MODES, BEFORE_MODE, IMAGE_MODE):
            # Names only: the admin kubeconfig serves the node cache and the Pod watch alike.
            inflight = mode in INFLIGHT_MODES
            flag = VARIANT_FLAGS.get(mode)
            in_image = mode == IMAGE_MODE
            kubeconfig = Path(KUBECONFIG_IN_IMAGE) if in_image else plane.admin_kubeconfig
            scorer = scorer_process(
                logs,
                kubeconfig=kubeconfig if names_only else None,
                name=f"scorer-{mode}",
                extra_args=() if flag is None else (flag,),
                command=("gpu-scorer",) if in_image else (),
            )
            if in_image:
                if mounted_image is None:
                    raise ValueError(f"{IMAGE_MODE} needs the image (`python3 dev.py image`)")
                credentials = self_contained_kubeconfig(plane.admin_kubeconfig, logs / "image")
                scorer.argv = scorer_in_image(mounted_image, scorer.argv, credentials)
            if mode == BEFORE_MODE:
                if before is None:
                    raise ValueError(f"{BEFORE_MODE} needs --before")
                # Its package from that tree: `-P` keeps this checkout (the working directory)
                # off the path, PYTHONPATH puts the tree on it.
                scorer.argv.insert(1, "-P")
                scorer.env["PYTHONPATH"] = str(before)
            scorer.argv[:0] = pinned
            made[mode] = Extender(scorer.url, names_only, scorer, scorer, inflight=inflight)
            continue
        port = free_port()
        if mode.startswith("null-go"):
            argv = [str(plane.spec.bin_dir / "null-extender"), f"--listen=127.0.0.1:{port}"]
        else:
            argv = [sys.executable, "-m", "benchmarks.null_extender", f"--port={port}"]
            argv += [f"--record={record}"] if record is not None else []
        process = BinaryProcess(
            mode, [*pinned, *argv], logs / f"{mode}.log", env={"PYTHONPATH": str(Path.cwd())}
        )
        made[mode] = Extender(f"http://127.0.0.1:{port}", names_only, process)
    return made


def scheduler_config(
    mode: str, made: dict[str, Extender], *, profiling: bool = False
) -> SchedulerConfig:
    extender = None
    if mode != "none":
        chosen = made[mode]
        extender = ExtenderConfig(chosen.url, node_cache_capable=chosen.names_only, ignorable=False)
    return SchedulerConfig(
        f"bench-{mode}",
        extender,
        client_qps=SCHEDULER_QPS,
        client_burst=SCHEDULER_BURST,
        profiling=profiling,
    )


def scorer_totals(scorer: ScorerProcess) -> dict[str, tuple[float, int]]:
    """verb -> (seconds, requests) so far, from the scorer's own histogram."""
    totals: dict[str, tuple[float, int]] = {}
    with urllib.request.urlopen(f"{scorer.url}/metrics", timeout=10) as response:
        text = response.read().decode()
    for verb in ("filter", "prioritize"):
        seconds = count = 0.0
        for line in text.splitlines():
            if line.startswith(f'gpu_scorer_request_duration_seconds_sum{{verb="{verb}"}}'):
                seconds = float(line.rsplit(" ", 1)[1])
            if line.startswith(f'gpu_scorer_request_duration_seconds_count{{verb="{verb}"}}'):
                count = float(line.rsplit(" ", 1)[1])
        totals[verb] = (seconds, int(count))
    return totals


def scorer_thread_cpu_s(scorer: ScorerProcess) -> dict[str, float]:
    """thread -> CPU seconds so far, from the scorer's `gpu_scorer_thread_cpu_seconds_total`
    (empty from a scorer that does not export it)."""
    prefix = 'gpu_scorer_thread_cpu_seconds_total{thread="'
    totals: dict[str, float] = {}
    for line in scorer.metrics().splitlines():
        if line.startswith(prefix):
            labels, _, value = line.rpartition(" ")
            totals[labels[len(prefix) : -len('"}')]] = float(value)
    return totals


def follow_binds(
    watch: Callable[[str], Iterable[dict[str, Any]]],
    pods_path: str,
    resource_version: str,
    names: Sequence[str],
    *,
    deadline_s: float,
    bind_times: dict[str, float],
    machine_at: list[MachineCpu | None],
) -> None:
    """Record when each of `names` is first seen bound (`time.monotonic`, into `bind_times`),
    from the watches of `pods_path` after `resource_version`, and the machine's CPU at the first
    bind and at the last (into `machine_at`); until every pod is bound or `deadline_s` passes.

    The API server may end a watch before the burst is bound (it closes the watch of a reader
    that falls behind a burst's events, as this one may on saturated cores, or ends it with an
    ERROR event): each new watch starts after the last event seen, so that no bind is missed
    and none is counted twice."""
    version = resource_version
    while len(bind_times) < len(names) and time.monotonic() < deadline_s:
        events = 0
        for event in watch(f"{pods_path}&resourceVersion={version}&allowWatchBookmarks=false"):
            events += 1
            pod = event.get("object", {})
            if event.get("type") == "ERROR":
                break  # a Status, not a Pod: watch again from the last event seen
            version = pod.get("metadata", {}).get("resourceVersion") or version
            if pod.get("spec", {}).get("nodeName"):
                seen = len(bind_times)
                bind_times.setdefault(pod["metadata"]["name"], time.monotonic())
                if seen == 0:  # this event is the first bind
                    machine_at.append(machine_cpu_s())
            if len(bind_times) >= len(names):
                machine_at.append(machine_cpu_s())
                return
        if not events:
            time.sleep(0.05)  # a watch that ends at once: not a hot loop against the server


def measure(
    plane: ControlPlane,
    mode: str,
    round_index: int,
    config: Config,
    made: dict[str, Extender],
    *,
    pods: int | None = None,
    while_scheduling: Callable[[Scheduler], None] | None = None,
) -> Round:
    """One burst: `pods` (default: the mode's burst size) pods placed by a fresh scheduler of
    `mode`.
    `while_scheduling` runs once the scheduler is ready, while it places the burst (and makes
    its /debug/pprof reachable)."""
    label = "warm-up" if round_index == WARM_UP_ROUND else f"r{round_index}-{mode}"
    names = [f"{label}-{i:04d}" for i in range(pods or config.pods_for(mode))]
    with plane.admin() as api:
        listed = api.get(f"/api/v1/namespaces/{NAMESPACE}/pods?limit=1")
        resource_version = listed["metadata"]["resourceVersion"]
        create_pods(plane, names, scheduler_name=f"bench-{mode}")
    bind_times: dict[str, float] = {}
    # The machine's CPU at the first bind and at the last, read where the binds are seen.
    machine_at: list[MachineCpu | None] = []
    done = threading.Event()

    def watch_binds() -> None:
        try:
            with plane.admin() as api:
                follow_binds(
                    lambda path: api.watch(path, timeout_s=config.timeout_s),
                    f"/api/v1/namespaces/{NAMESPACE}/pods?labelSelector=round%3D{label}",
                    resource_version,
                    names,
                    deadline_s=time.monotonic() + config.timeout_s,
                    bind_times=bind_times,
                    machine_at=machine_at,
                )
        finally:
            done.set()  # a watch that failed leaves pods unbound: the round says how many

    watcher = threading.Thread(target=watch_binds, name="bind-watch", daemon=True)
    watcher.start()
    scorers = {m: e.scorer for m, e in made.items() if e.scorer is not None}
    before = {m: scorer_totals(s) for m, s in scorers.items()}
    extender = made.get(mode)
    pid = None if extender is None or extender.process.popen is None else extender.process.popen.pid
    own = scorers.get(mode)
    threads_before = {} if own is None else scorer_thread_cpu_s(own)
    cpu_before_s = None if pid is None else process_cpu_s(pid)
    plane_pids = plane.pids()
    plane_before_s = processes_cpu_s(plane_pids)
    profiling = while_scheduling is not None
    scheduler = plane.start_scheduler(
        scheduler_config(mode, made, profiling=profiling), name=f"sched-{label}"
    )
    try:
        if while_scheduling is not None:
            while_scheduling(scheduler)
        # Set once every pod is bound, or when the watches gave up at the deadline.
        if not done.wait(config.timeout_s) or len(bind_times) < len(names):
            raise TimeoutError(f"{label}: {len(bind_times)} of {len(names)} pods bound")
        cpu_s = None if pid is None or cpu_before_s is None else process_cpu_s(pid) - cpu_before_s
        threads_after = {} if own is None or not threads_before else scorer_thread_cpu_s(own)
        popen = scheduler.process.popen
        plane_after_s = processes_cpu_s(
            plane_pids | ({} if popen is None else {"kube-scheduler": popen.pid})
        )
    finally:
        scheduler.stop()
        plane.schedulers.pop(f"sched-{label}", None)
    after = {m: scorer_totals(s) for m, s in scorers.items()}
    delete_pods(plane, names)
    times = sorted(bind_times.values())
    span_s = times[-1] - times[0]
    result = Round(mode, round_index, (len(times) - 1) / span_s if span_s > 0 else 0.0, span_s)
    if cpu_s is not None:
        result.extender_cpu_ms_per_pod = cpu_s / len(times) * 1000
    _add_machine(result, machine_at, placed=len(times) - 1)
    result.thread_cpu_ms_per_pod = {
        thread: (spent_s - threads_before.get(thread, 0.0)) / len(times) * 1000
        for thread, spent_s in threads_after.items()
    }
    result.process_cpu_ms_per_pod = {
        name: (spent_s - plane_before_s.get(name, 0.0)) / len(times) * 1000
        for name, spent_s in plane_after_s.items()
    }
    if mode in scorers:
        for verb, (seconds, count) in after[mode].items():
            requests = count - before[mode][verb][1]
            result.scorer_requests[verb] = requests
            if requests:
                result.scorer_ms[verb] = (seconds - before[mode][verb][0]) / requests * 1000
    return result


# The Deployment controller's hash of the pod template, on every replica and its ReplicaSet.
TEMPLATE_HASH: Final = "5c8d7f9b64"


def replica_pod(name: str, *, scheduler_name: str) -> dict[str, Any]:
    """A burst's pod as the Deployment `<round>` would have it created: owned by its ReplicaSet
    `<round>-<hash>`, with the `pod-template-hash` label (no controller runs here, so the
    ReplicaSet exists in the pods' owner references alone)."""
    deployment = name.rsplit("-", 1)[0]
    pod = gpu_pod(name, scheduler_name=scheduler_name, namespace=NAMESPACE)
    pod["metadata"]["labels"].update({"round": deployment, "pod-template-hash": TEMPLATE_HASH})
    pod["metadata"]["ownerReferences"] = [
        {
            "apiVersion": "apps/v1",
            "kind": "ReplicaSet",
            "name": f"{deployment}-{TEMPLATE_HASH}",
            "uid": str(uuid.uuid5(uuid.NAMESPACE_DNS, deployment)),
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    return pod


def create_pods(plane: ControlPlane, names: Sequence[str], *, scheduler_name: str) -> None:
    def create(chunk: Sequence[str]) -> None:
        with plane.admin() as api:
            for name in chunk:
                pod = replica_pod(name, scheduler_name=scheduler_name)
                api.create(f"/api/v1/namespaces/{NAMESPACE}/pods", pod)

    _in_parallel(create, names)


def delete_pods(plane: ControlPlane, names: Sequence[str]) -> None:
    def delete(chunk: Sequence[str]) -> None:
        with plane.admin() as api:
            for name in chunk:
                api.delete(f"/api/v1/namespaces/{NAMESPACE}/pods/{name}")

    _in_parallel(delete, names)


def _in_parallel(work: Callable[[Sequence[str]], None], names: Sequence[str]) -> None:
    workers = 4
    chunks = [names[i::workers] for i in range(workers)]
    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(work, chunks))


# ----------------------------------------------------------------------------- the run


@dataclass
class Bench:
    """A loopback control plane with the fleet registered, the extenders serving and the
    patcher running: what every measurement needs (`bench`)."""

    plane: ControlPlane
    made: dict[str, Extender]
    patcher: Patcher
    scratch: Path
    # The image `names-image` ran from, when it ran.
    image: str | None = None


@contextlib.contextmanager
def bench(
    config: Config,
    *,
    progress: Callable[[str], None],
    record: Path | None = None,
    mounted_image: image.MountedImage | None = None,
) -> Iterator[Bench]:
    """The plane with the fleet, the extenders of `config.modes` serving (`mounted_image`: the
    image `names-image` runs from) and the patcher running."""
    # Not at the top: scorer_latency imports this checkout's scorer modules.
    from benchmarks.scorer_latency import source_tree  # noqa: PLC0415

    with (
        source_tree(config.before) as before,
        tempfile.TemporaryDirectory(prefix="real-scheduler-") as scratch_dir,
        running_control_plane(Path(scratch_dir) / "plane") as plane,
    ):
        scratch = Path(scratch_dir)
        started = time.monotonic()
        register_fleet(plane, config.nodes, config.seed)
        with plane.admin() as api:
            apply(api, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
            apply(
                api,
                {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default"}},
                namespace=NAMESPACE,
            )
        progress(f"{config.nodes} nodes registered in {time.monotonic() - started:.0f} s")
        made = extenders(
            plane,
            scratch / "logs",
            config.modes,
            record=record,
            before=before,
            cpus=config.extender_cpus,
            mounted_image=mounted_image,
        )
        patcher = Patcher(plane, config)
        try:
            for extender in made.values():
                extender.process.start()
                extender.wait_ready()
            patcher.start()
            yield Bench(
                plane, made, patcher, scratch, None if mounted_image is None else mounted_image.name
            )
        finally:
            patcher.stop()
            for extender in made.values():
                extender.process.kill()


# The round number of the uncounted first burst (its pods are named after it).
WARM_UP_ROUND: Final = 0xFFFF


def run(
    config: Config,
    *,
    progress: Callable[[str], None],
    mounted_image: image.MountedImage | None = None,
) -> dict[str, Any]:
    rounds: list[Round] = []
    with bench(config, progress=progress, mounted_image=mounted_image) as ready:
        # The first burst after the fleet is registered runs slower whatever its mode (in the
        # runs of 2026-12-06, the two worst rounds of no extender against the Go null one,
        # 0.42x, were each their run's first): it is placed and not counted.
        warm = measure(ready.plane, "none", WARM_UP_ROUND, config, ready.made)
        progress(
            f"  {config.nodes} nodes, warm-up (no extender, not counted): "
            f"{warm.pods_per_s:6.1f} pods/s"
        )
        for index in range(config.rounds):
            for mode in round_order(config.modes, index):
                result = measure_round(ready, mode, index, config)
                rounds.append(result)
                wire = {verb: w["mean_ms"] for verb, w in result.wire.items()}
                progress(
                    f"  {config.nodes} nodes, {mode:13s} round {index}: "
                    f"{result.pods_per_s:6.1f} pods/s, scorer {result.scorer_ms}"
                    + (f", on the wire (mean ms) {wire}" if wire else "")
                )
    return summarize(config, rounds, ready.patcher) | {
        "warm_up_pods_per_s": warm.pods_per_s,
        "image": ready.image,
    }


# How a run's document says its rounds were ordered, by `Config.round_order`.
_ORDERS: Final = {
    "rotation": "in rotating order",
    "williams": "in orders balanced for the mode run just before",
}


def round_order(modes: Sequence[str], index: int) -> list[str]:
    """The order of round `index`'s modes: the rows of a Williams design, so that over as many
    rounds as there are modes (twice as many for an odd count) each mode runs right after each
    other mode once (twice), within a round.

    A rotation of one order put each mode after the same neighbour in most rounds: with the
    default modes, names only ran right after no extender (the fastest burst, its pods deleted
    just before) in three rounds of four, and such rounds came out slower than its others
    (in this machine's runs of 2026-12-06 and -07 at 5,000 nodes, 0.985 of the mode's median
    against 1.041), so a design that does not balance it tilts every ratio to the Go null
    extender, which never ran after it."""
    count = len(modes)
    # 0, 1, n-1, 2, n-2, ...: the steps between neighbours are 1, -2, 3, -4, ... (mod n),
    # each a different difference, so the shifted rows pair every two modes once each way.
    first = [0] + [(k + 1) // 2 if k % 2 else count - k // 2 for k in range(1, count)]
    rows = [[(j + shift) % count for j in first] for shift in range(count)]
    if count % 2:
        rows += [row[::-1] for row in rows]
    return [modes[j] for j in rows[index % len(rows)]]


def measure_round(ready: Bench, mode: str, index: int, config: Config) -> Round:
    """One counted round of `mode`; with `config.capture`, each of its extender's calls is
    timed on the wire as well, from a capture of the extender's port."""
    extender = ready.made.get(mode)
    if not config.capture or extender is None:
        return measure(ready.plane, mode, index, config, ready.made)
    port = urllib.parse.urlsplit(extender.url).port
    assert port is not None  # every extender's URL names its port
    with wire_capture.Capture(port, ready.scratch / f"r{index}-{mode}.pcap") as capture:
        result = measure(ready.plane, mode, index, config, ready.made)
    result.wire = wire_capture.summary(capture.calls())
    capture.path.unlink(missing_ok=True)
    return result


def summarize(config: Config, rounds: Sequence[Round], patcher: Patcher) -> dict[str, Any]:
    by_mode: dict[str, dict[str, Any]] = {}
    for mode in config.modes:
        mine = [r for r in rounds if r.mode == mode]
        if not mine:
            continue
        by_mode[mode] = {
            "pods_per_s_median": statistics.median(r.pods_per_s for r in mine),
            "pods_per_s": [round(r.pods_per_s, 2) for r in mine],
            "scorer_ms_median": {
                verb: statistics.median(r.scorer_ms[verb] for r in mine if verb in r.scorer_ms)
                for verb in ("filter", "prioritize")
                if any(verb in r.scorer_ms for r in mine)
            },
            "extender_cpu_ms_per_pod_median": _median_or_none(
                [r.extender_cpu_ms_per_pod for r in mine]
            ),
            "machine_idle_share_median": _median_or_none([r.machine_idle_share for r in mine]),
            "machine_cpu_ms_per_pod_median": _median_or_none(
                [r.machine_cpu_ms_per_pod for r in mine]
            ),
            "thread_cpu_ms_per_pod_median": _medians_by_key(
                [r.thread_cpu_ms_per_pod for r in mine]
            ),
            "process_cpu_ms_per_pod_median": _medians_by_key(
                [r.process_cpu_ms_per_pod for r in mine]
            ),
            "wire_mean_ms_median": {
                verb: statistics.median(r.wire[verb]["mean_ms"] for r in mine if verb in r.wire)
                for verb in wire_capture.VERBS
                if any(verb in r.wire for r in mine)
            },
            "scorer_requests_per_pod": {
                verb: statistics.median(
                    r.scorer_requests[verb] / config.pods_for(mode) for r in mine
                )
                for verb in ("filter", "prioritize")
                if all(verb in r.scorer_requests for r in mine)
            },
        }
    baseline = by_mode.get("none", {}).get("pods_per_s_median") or 0.0
    for entry in by_mode.values():
        entry["ratio_to_none"] = entry["pods_per_s_median"] / baseline if baseline else None
    _add_paired(by_mode, rounds)
    return {
        "config": asdict(config),
        "patches_per_s": round(patcher.rate_per_s, 1),
        "patch_errors": patcher.errors,
        "patcher_cpu_fraction": round(
            patcher.cpu_s / max(1e-9, patcher.stopped_s - patcher.started_s), 3
        ),
        "modes": by_mode,
        "rounds": [asdict(r) for r in rounds],
    }


def _add_machine(result: Round, machine_at: Sequence[MachineCpu | None], *, placed: int) -> None:
    """The machine's idle share and CPU per pod between its two readings (the first bind and
    the last), over the `placed` pods pods/s counts there; nothing where either is missing."""
    if len(machine_at) != 2 or placed <= 0:
        return
    first, last = machine_at
    if first is None or last is None:
        return
    busy_s, idle_s, steal_s = (b - a for a, b in zip(first, last, strict=True))
    total_s = busy_s + idle_s + steal_s
    if total_s > 0:
        result.machine_idle_share = idle_s / total_s
        result.machine_cpu_ms_per_pod = busy_s / placed * 1000


def processes_cpu_s(pids: Mapping[str, int]) -> dict[str, float]:
    """name -> the CPU seconds that process has used so far; a process gone (or never readable)
    is left out rather than failing the round."""
    spent: dict[str, float] = {}
    for name, pid in pids.items():
        with contextlib.suppress(OSError, ValueError):
            spent[name] = process_cpu_s(pid)
    return spent


def _median_or_none(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def _medians_by_key(figures: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """Each key's median over the rounds that read it, in the order the keys first came."""
    keys = dict.fromkeys(k for round_figures in figures for k in round_figures)
    return {k: statistics.median(f[k] for f in figures if k in f) for k in keys}


def _add_paired(by_mode: dict[str, dict[str, Any]], rounds: Sequence[Round]) -> None:
    """Each mode's ratios to the Go null extender round by round, their median, and the
    interval that median is known to (`benchmarks.intervals`). No extender at all is given its
    ratios too: it does strictly less than the Go null extender, so each of its rounds that
    comes out slower is the machine's noise, seen directly."""
    for mode, entry in by_mode.items():
        by_round = _over_null_by_round(rounds, mode)
        if not by_round:
            continue
        entry["over_null_go_by_round"] = [round(r, 3) for r in by_round]
        entry["over_null_go_by_round_median"] = statistics.median(by_round)
        if len(by_round) >= 2:
            interval = median_interval(by_round)
            entry["over_null_go_interval"] = {
                "low": round(interval.low, 3),
                "high": round(interval.high, 3),
                "coverage": round(interval.coverage, 3),
            }


def _over_null_by_round(rounds: Sequence[Round], mode: str) -> list[float]:
    """`mode`'s pods/s over the Go null extender's of the same kind, round by round: the two
    ran minutes apart at most, so the machine's drift between rounds (other work, the API
    server's state) cancels, which it does not in the ratio of the two medians."""
    if mode.startswith("null-"):
        return []
    null = "null-go-full" if mode.startswith("full") else "null-go-names"
    nulls = {r.round: r.pods_per_s for r in rounds if r.mode == null}
    return [r.pods_per_s / nulls[r.round] for r in rounds if r.mode == mode and nulls.get(r.round)]


# Round numbers of pooled runs: run k's rounds are numbered from k * this.
_POOLED_RUN_STRIDE: Final = 10_000


def pooled(documents: Sequence[dict[str, Any]]) -> dict[int, dict[str, dict[str, Any]]]:
    """The rounds of several runs (their `--json` documents), by cluster size and mode, as if
    one run had made them all: each round still paired with the Go null extender's round of its
    own run. More rounds narrow the round-by-round median's interval where one run's cannot
    resolve a target."""
    by_size: dict[int, list[Round]] = {}
    for run_index, document in enumerate(documents):
        for result in document["sizes"]:
            rounds = by_size.setdefault(result["config"]["nodes"], [])
            rounds.extend(
                Round(
                    r["mode"],
                    run_index * _POOLED_RUN_STRIDE + r["round"],
                    r["pods_per_s"],
                    r["span_s"],
                )
                for r in result["rounds"]
            )
    pooled_sizes: dict[int, dict[str, dict[str, Any]]] = {}
    for nodes, rounds in sorted(by_size.items()):
        modes = dict.fromkeys(r.mode for r in rounds)
        by_mode: dict[str, dict[str, Any]] = {
            mode: {
                "rounds": sum(r.mode == mode for r in rounds),
                "pods_per_s_median": statistics.median(
                    r.pods_per_s for r in rounds if r.mode == mode
                ),
            }
            for mode in modes
        }
        _add_paired(by_mode, rounds)
        pooled_sizes[nodes] = by_mode
    return pooled_sizes


def pooled_text(sizes: dict[int, dict[str, dict[str, Any]]], runs: int) -> str:
    lines = [f"{runs} runs pooled"]
    for nodes, by_mode in sizes.items():
        lines.append(f"{nodes:,} nodes:")
        for mode, entry in by_mode.items():
            line = (
                f"  {mode:18s} {entry['rounds']:3d} rounds, {entry['pods_per_s_median']:7.1f} "
                "pods/s (median)"
            )
            if "over_null_go_by_round_median" in entry:
                line += (
                    f", over the Go null extender round by round "
                    f"{entry['over_null_go_by_round_median']:.2f}x"
                )
            interval = entry.get("over_null_go_interval")
            if interval is not None and mode in TARGET_MODES:
                line += "; " + _resolution_text(interval)
            elif interval is not None:
                line += f"; its {interval['coverage']:.0%} interval {interval['low']:.2f}x-"
                line += f"{interval['high']:.2f}x"
            lines.append(line)
        noise = _noise_text(nodes, by_mode)
        if noise:
            lines.append(f"  {noise}")
    return "\n".join(lines)


# ----------------------------------------------------------------------------- the document

# The section's first line in docs/performance.md (`benchmarks.figures` finds it by this).
HEADING: Final = "## The real kube-scheduler's throughput"

MODE_LABELS: Final = {
    "none": "no extender",
    "names": "names only (`nodeCacheCapable: true`)",
    "names-no-inflight": "names only, no in-flight accounting (`--no-pod-watch`)",
    "names-no-own-load": "names only, the pod's own load not counted (`--no-own-load`)",
    BEFORE_MODE: "names only, the scorer of the `--before` commit",
    IMAGE_MODE: "names only, the scorer run from the image (its interpreter, `PYTHONOPTIMIZE=2`)",
    "full": "full nodes (`nodeCacheCapable: false`)",
    "null-go-names": "names only, null extender in Go",
    "null-py-names": "names only, null extender on the scorer's HTTP edge",
    "null-go-full": "full nodes, null extender in Go",
}


def _size(document: dict[str, Any], nodes: int) -> dict[str, Any] | None:
    for result in document.get("sizes", []):
        if result["config"]["nodes"] == nodes:
            found: dict[str, Any] = result
            return found
    return None


def markdown_section(
    document: dict[str, Any], *, command: str, before: dict[str, Any] | None, plotted: bool
) -> str:
    """The performance document's section: one table per cluster size, before against now."""
    rows: list[list[str]] = []
    # Runs from before the extenders' CPU was read have no such column.
    with_cpu = any(
        entry.get("extender_cpu_ms_per_pod_median") is not None
        for result in document["sizes"]
        for entry in result["modes"].values()
    )
    with_wire = any(
        entry.get("wire_mean_ms_median")
        for result in document["sizes"]
        for entry in result["modes"].values()
    )
    # Runs from before the machine's CPU was read have no such columns.
    with_machine = any(
        entry.get("machine_idle_share_median") is not None
        for result in document["sizes"]
        for entry in result["modes"].values()
    )
    for result in document["sizes"]:
        nodes = result["config"]["nodes"]
        earlier = _size(before, nodes) if before else None
        for mode, entry in result["modes"].items():
            ratio = entry["ratio_to_none"]
            old = (earlier or {}).get("modes", {}).get(mode)
            old_ratio = None if old is None else old.get("ratio_to_none")
            server = entry.get("scorer_ms_median", {})
            cpu = entry.get("extender_cpu_ms_per_pod_median")
            wire = entry.get("wire_mean_ms_median") or {}
            idle = entry.get("machine_idle_share_median")
            busy = entry.get("machine_cpu_ms_per_pod_median")
            rows.append(
                [
                    f"{nodes:,}",
                    MODE_LABELS[mode],
                    f"{entry['pods_per_s_median']:.1f}",
                    ", ".join(f"{v:.0f}" for v in entry["pods_per_s"]),
                    "1" if mode == "none" else f"{ratio:.2f}x",
                    "" if mode == "none" or old_ratio is None else f"{old_ratio:.2f}x",
                    " / ".join(f"{server[v]:.2f}" for v in ("filter", "prioritize") if v in server),
                    *([("" if cpu is None else f"{cpu:.2f}")] if with_cpu else []),
                    *(
                        [" / ".join(f"{wire[v]:.2f}" for v in wire_capture.VERBS if v in wire)]
                        if with_wire
                        else []
                    ),
                    *(
                        [
                            "" if idle is None else f"{idle:.1%}",
                            "" if busy is None else f"{busy:.2f}",
                        ]
                        if with_machine
                        else []
                    ),
                ]
            )
    header = [
        "nodes",
        "mode",
        "pods/s (median)",
        "rounds",
        "vs no extender",
        "before",
        "scorer ms (filter / prioritize)",
        *(["extender CPU ms/pod"] if with_cpu else []),
        *(["on the wire, mean ms (filter / prioritize)"] if with_wire else []),
        *(["machine idle", "machine CPU ms/pod"] if with_machine else []),
    ]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = [
        "| " + " | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) + " |"
        for row in [header, ["-" * w for w in widths], *rows]
    ]
    by_thread = _thread_table(document) + _process_table(document)
    churn = ", ".join(
        f"{r['patches_per_s']:g} patches/s at {r['config']['nodes']:,} nodes"
        for r in document["sizes"]
    )
    first = document["sizes"][0]["config"]
    warm_up = (
        " Each size starts with a burst with no extender that is not counted: the first burst"
        " after the fleet is registered runs slower whatever its mode ("
        + ", ".join(
            f"{r['warm_up_pods_per_s']:.0f} pods/s at {r['config']['nodes']:,} nodes"
            for r in document["sizes"]
        )
        + ")."
        if all("warm_up_pods_per_s" in r for r in document["sizes"])
        else ""
    )
    before_line = (
        f"`before` is the same benchmark on {before['label']} ({before['measured_at']})."
        if before
        else ""
    )
    figure = "\n![pods/s against cluster size](img/real_scheduler.png)\n" if plotted else ""
    targets = _targets_text(document)
    nulls = any(m in NULL_MODES for r in document["sizes"] for m in r["modes"])
    null_text = (
        "\n\nThe null extenders decide nothing (filter passes every node, prioritize scores 0):"
        " `null-go` is a compiled Go server (`tools/k8s/cmd/null-extender`), so its ratio is "
        "what the extender mechanism itself costs kube-scheduler on this machine (two HTTP calls"
        " per pod, the scheduler encoding the pod, and in full-node mode every Node, to JSON and"
        " decoding the reply); `null-py` is the scorer's own HTTP edge with no verdicts. The "
        "scorer cannot be cheaper than the first; what it adds over the second is its verdicts."
        if nulls
        else ""
    )
    variants = {m for r in document["sizes"] for m in r["modes"] if m in VARIANT_MODES}
    # Runs from before the pod's own load was counted have no `names-no-own-load` variant.
    own_load_text = (
        ", and counting the load each pod will add to the GPUs it gets (its own load: each pod "
        "is a Deployment's replica, none of which ever runs here, so the estimate is the "
        "policy's default)"
        if "names-no-own-load" in variants
        else ""
    )
    inflight_text = (
        "\n\n`names` is the scorer as `gpu-scorer serve` starts it: with its Pod watch, so it "
        "counts each pod bound since a node's last measurement in that node's verdicts "
        "(in-flight accounting; with no kubelet here, every pod a burst binds counts until its "
        "round deletes it)"
        + own_load_text
        + "."
        + "".join(
            f" `{mode}` is the same scorer with `{VARIANT_FLAGS[mode]}`."
            for mode in VARIANT_MODES
            if mode in variants
        )
        if variants
        else ""
    )
    images = sorted({r["image"] for r in document["sizes"] if r.get("image")})
    image_text = (
        f"\n\n`{IMAGE_MODE}` is the names-only scorer run from the image "
        f"{', '.join(f'`{name}`' for name in images)}, built from the same checkout, as the chart "
        "runs it: the image's interpreter and environment (`PYTHONOPTIMIZE=2`), the chart's user, "
        "a read-only root; `names` runs the checkout on the interpreter that runs the benchmark."
        if images
        else ""
    )
    cpu_text = (
        "; `extender CPU ms/pod` is the extender process's CPU (every thread, the scorer's "
        "watches included) from the scheduler's start to the last bind, per pod placed"
        if with_cpu
        else ""
    )
    machine_text = (
        "; `machine idle` is the share of the machine's CPU time (every core) left idle from the"
        " first bind to the last, and `machine CPU ms/pod` the CPU every process on it used over"
        " that span per pod placed (`/proc/stat`; time a hypervisor stole is in neither): where"
        " idle is near 0 the cores are saturated, and pods/s is about what they hold divided by"
        " the CPU a pod takes of them, the extender's included"
        if with_machine
        else ""
    )
    pinned = first.get("extender_cpus") or ()
    sharing = (
        f"The extenders ran on CPU {', '.join(map(str, pinned))} alone (`--extender-cpus`), as a"
        " Deployment on nodes of its own would; everything else (etcd, kube-apiserver, the "
        "scheduler, the"
        if pinned
        else "Everything (etcd, kube-apiserver, the scheduler, the scorers, the"
    )
    others = "on the other CPUs" if pinned else "shares the machine's cores"
    per_request = f"per request in those rounds{cpu_text}{machine_text}. {sharing}"
    # Runs from before the version was recorded were all made on v1.36.3.
    kubernetes = document.get("kubernetes", "v1.36.3")
    ordered = _ORDERS[first.get("round_order", "rotation")]
    return f"""{HEADING}

Command: `{command}` (machine: {document["machine"]}, {document["measured_at"]}). A real
kube-scheduler {kubernetes} on the loopback control plane ([control-plane.md](control-plane.md))
places a burst of {first["pods"]} one-GPU pods ({first.get("full_pods", first["pods"])} in the
full-node modes, which run 20-40x slower), {first["rounds"]} rounds per mode {ordered},
while GPU annotations are patched at a fleet's write rate ({churn}). pods/s is counted
from the first bind to the last, read from a pod watch; `scorer ms` is the scorer's own mean time
{per_request}
patcher) {others}.{warm_up} {before_line}{null_text}{inflight_text}{image_text}

{chr(10).join(lines)}
{by_thread}{targets}{figure}"""


# The threads that take most of the scorer's CPU, as the by-thread table's columns; the others
# (verdict expiry, GC pacing, the accept loop, ...) are summed as "the rest".
_THREAD_COLUMNS: Final = ("request", "node-watch", "pod-watch", "log-writer")


def _per_mode_table(
    document: dict[str, Any],
    cells_of: Callable[[dict[str, Any]], list[str] | None],
    columns: Sequence[str],
    caption: str,
) -> str:
    """A table of one row per size and mode whose summary `cells_of` makes cells of (None: the
    mode has no such figures), under `caption`; "" when no mode has any."""
    rows = [
        [f"{result['config']['nodes']:,}", MODE_LABELS[mode], *cells]
        for result in document["sizes"]
        for mode, entry in result["modes"].items()
        if (cells := cells_of(entry)) is not None
    ]
    if not rows:
        return ""
    return f"\n{caption}:\n\n{markdown.table(['nodes', 'mode', *columns], rows)}\n"


def _thread_cells(entry: dict[str, Any]) -> list[str] | None:
    threads: dict[str, float] = entry.get("thread_cpu_ms_per_pod_median") or {}
    if not threads:
        return None
    rest = sum(v for t, v in threads.items() if t not in _THREAD_COLUMNS)
    return [
        *(f"{threads.get(t, 0.0):.2f}" for t in _THREAD_COLUMNS),
        f"{rest:.2f}",
        f"{sum(threads.values()):.2f}",
    ]


def _thread_table(document: dict[str, Any]) -> str:
    """The scorers' CPU per pod by thread (medians of the rounds), or "" for a run without it."""
    return _per_mode_table(
        document,
        _thread_cells,
        [*_THREAD_COLUMNS, "the rest", "all threads"],
        "The scorer's CPU per pod placed by thread, ms (its `gpu_scorer_thread_cpu_seconds_total`"
        " over the same span; `request` is kube-scheduler's calls and the work right after each"
        " reply, `node-watch` and `pod-watch` each event decoded and its node judged again)",
    )


# The control plane's processes, as the by-process table's columns.
_PROCESS_COLUMNS: Final = ("etcd", "kube-apiserver", "kube-scheduler")


def _process_cells(entry: dict[str, Any]) -> list[str] | None:
    processes: dict[str, float] = entry.get("process_cpu_ms_per_pod_median") or {}
    if not processes:
        return None
    cells = [processes.get(name) for name in _PROCESS_COLUMNS]
    cells.append(entry.get("extender_cpu_ms_per_pod_median"))
    known = [c for c in cells if c is not None]
    return [*("" if c is None else f"{c:.2f}" for c in cells), f"{sum(known):.2f}"]


def _process_table(document: dict[str, Any]) -> str:
    """The control plane's CPU per pod by process, with the extender's (medians of the rounds),
    or "" for a run without it."""
    return _per_mode_table(
        document,
        _process_cells,
        [*_PROCESS_COLUMNS, "extender", "together"],
        "The control plane's CPU per pod placed by process, with the extender's, ms (each"
        " process's `/proc/<pid>/stat` from the round's kube-scheduler start to the last bind:"
        " kube-scheduler's informers' first sync is in its figure, alike in every mode;"
        " kube-apiserver serves every watch, the scorer's included)",
    )


# Pods/s with the extender against without it: (mode, nodes, at least).
TARGETS: Final = (("names", 300, 0.9), ("names", 5000, 0.8), ("full", 300, 0.25))
# The scorer against the Go null extender of its mode, the mechanism's floor: names only within
# 5 % of it at every size.
FLOOR_TARGET: Final = 0.95
# Names only with a feature on is not slower than without it, in the same run: (the variant
# without it, what the feature is called).
VARIANT_TARGETS: Final = (
    ("names-no-inflight", "in-flight accounting"),
    ("names-no-own-load", "the pod's own load counted"),
)


def _targets_text(document: dict[str, Any]) -> str:
    """Each target against this run, with the Go null extender's ratio as the mechanism's floor."""
    parts: list[str] = []
    for mode, nodes, least in TARGETS:
        result = _size(document, nodes)
        entry = None if result is None else result["modes"].get(mode)
        if result is None or entry is None or entry["ratio_to_none"] is None:
            continue
        ratio = entry["ratio_to_none"]
        null = result["modes"].get(f"null-go-{mode}", {}).get("ratio_to_none")
        floor = "" if null is None else f"; a Go extender that decides nothing: {null:.2f}x"
        verdict = "met" if ratio >= least else "NOT met"
        parts.append(f"{mode} at {nodes:,} nodes {ratio:.2f}x ({verdict}: >= {least}x{floor})")
    for result in document["sizes"]:
        for mode, null_mode in (
            ("names", "null-go-names"),
            (IMAGE_MODE, "null-go-names"),
            ("full", "null-go-full"),
        ):
            scorer, null = (result["modes"].get(m) for m in (mode, null_mode))
            if scorer is None or null is None or not null["pods_per_s_median"]:
                continue
            ratio = scorer["pods_per_s_median"] / null["pods_per_s_median"]
            verdict = f"{'met' if ratio >= FLOOR_TARGET else 'NOT met'}: >= {FLOOR_TARGET}x"
            by_round = scorer.get("over_null_go_by_round")
            paired = (
                f"; round by round {scorer['over_null_go_by_round_median']:.2f}x, "
                f"{min(by_round):.2f}x-{max(by_round):.2f}x"
                if by_round
                else ""
            )
            interval = scorer.get("over_null_go_interval")
            if interval is not None and mode in TARGET_MODES:
                paired += "; " + _resolution_text(interval)
            parts.append(
                f"{mode} against the Go null extender at {result['config']['nodes']:,} nodes "
                f"{ratio:.2f}x ({verdict if mode in TARGET_MODES else 'no target'}{paired})"
            )
        noise = _noise_text(result["config"]["nodes"], result["modes"])
        if noise:
            parts.append(noise)
    for variant, what in VARIANT_TARGETS:
        for result in document["sizes"]:
            on, off = (result["modes"].get(m) for m in ("names", variant))
            if on is None or off is None or not off["pods_per_s_median"]:
                continue
            verdict = "met" if on["pods_per_s_median"] >= off["pods_per_s_median"] else "NOT met"
            parts.append(
                f"names with {what} at {result['config']['nodes']:,} nodes "
                f"{on['pods_per_s_median']:.1f} pods/s against {off['pods_per_s_median']:.1f} "
                f"without ({on['pods_per_s_median'] / off['pods_per_s_median']:.2f}x; {verdict}: "
                "not lower)"
            )
    if not parts:
        return ""
    return "\n**Targets.** " + "; ".join(parts) + ".\n"


def _resolution_text(interval: dict[str, float]) -> str:
    """What the round-by-round median's interval says of the floor target."""
    low, high = interval["low"], interval["high"]
    says = {
        "met": f"all at or above {FLOOR_TARGET}x",
        "missed": f"all below {FLOOR_TARGET}x",
        "unresolved": f"across {FLOOR_TARGET}x: this run does not resolve the target",
    }[resolution(low, high, FLOOR_TARGET)]
    return f"its {interval['coverage']:.0%} interval {low:.2f}x-{high:.2f}x, {says}"


def _noise_text(nodes: int, by_mode: dict[str, dict[str, Any]]) -> str:
    """The rounds in which no extender placed pods slower than the Go null extender: it does
    strictly less, so each such round shows the machine's noise alone."""
    by_round = by_mode.get("none", {}).get("over_null_go_by_round")
    if not by_round:
        return ""
    slower = [r for r in by_round if r < 1.0]
    if not slower:
        return (
            f"no extender ran at least as fast as the Go null extender in every round at "
            f"{nodes:,} nodes"
        )
    return (
        f"the machine's noise at {nodes:,} nodes: no extender ran slower than the Go null "
        f"extender in {len(slower)} of {len(by_round)} rounds (down to {min(slower):.2f}x)"
    )


def plot(document: dict[str, Any], path: Path, *, before: dict[str, Any] | None = None) -> bool:
    """Bars of pods/s per mode and cluster size (and the earlier run's, hatched)."""
    import matplotlib  # noqa: PLC0415  (only the figures need it)

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    sizes = [r["config"]["nodes"] for r in document["sizes"]]
    fig, axes = plt.subplots(1, len(sizes), figsize=(5.5 * len(sizes), 4), squeeze=False)
    for ax, result in zip(axes[0], document["sizes"], strict=True):
        modes = list(result["modes"])
        now = [result["modes"][m]["pods_per_s_median"] for m in modes]
        positions = range(len(modes))
        ax.bar([p + 0.2 for p in positions], now, width=0.4, label="now")
        earlier = _size(before, result["config"]["nodes"]) if before else None
        if earlier:
            old = [earlier["modes"].get(m, {}).get("pods_per_s_median", 0) for m in modes]
            ax.bar([p - 0.2 for p in positions], old, width=0.4, hatch="//", alpha=0.5,
                   label="before")  # fmt: skip
        ax.set_xticks(list(positions), modes)
        ax.set_ylabel("pods/s (median)")
        ax.set_title(f"{result['config']['nodes']:,} nodes")
        ax.grid(True, axis="y", alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line, checked: `modes` (a tuple) and `sizes` (node counts) parsed from it.
    A bad combination exits with argparse's usage error."""
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.real_scheduler", description=__doc__
    )
    parser.add_argument("--nodes", default="300,5000", help="comma-separated cluster sizes")
    parser.add_argument(
        "--pods", type=int, default=DEFAULT_PODS, help="pods per burst (names only, no extender)"
    )
    parser.add_argument(
        "--full-pods", type=int, default=DEFAULT_FULL_PODS, help="pods per full-node burst"
    )
    parser.add_argument("--rounds", type=int, default=3, help="rounds per mode and size")
    parser.add_argument(
        "--writes-per-node-s",
        type=float,
        default=FLEET_WRITES_PER_NODE_S,
        help="annotation patches per node per second during the run",
    )
    parser.add_argument(
        "--modes",
        default=",".join(MODES),
        help=f"comma-separated, of {', '.join(ALL_MODES)} (null-*: extenders that decide nothing)",
    )
    parser.add_argument("--before", metavar="REF", help=f"the commit {BEFORE_MODE} runs")
    parser.add_argument(
        "--capture",
        action="store_true",
        help="also time each extender call on the wire (tcpdump on lo; needs CAP_NET_RAW)",
    )
    parser.add_argument(
        "--extender-cpus",
        metavar="CPUS",
        default="",
        help="comma-separated CPUs the extenders run on, every other process of the run (the "
        "control plane, the patcher, this process) on the rest: an extender with cores of its "
        "own, as a Deployment on other nodes has (default: all share every CPU)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    parser.add_argument(
        "--pool",
        nargs="+",
        type=Path,
        metavar="JSON",
        help="run nothing: pool the rounds of these runs' --json documents, round by round",
    )
    args = parser.parse_args(argv)
    args.sizes = [int(n) for n in args.nodes.split(",") if n.strip()]
    args.modes = tuple(m.strip() for m in args.modes.split(",") if m.strip())
    if args.pool:
        return args
    unknown = sorted(set(args.modes) - set(ALL_MODES))
    if unknown or "none" not in args.modes:
        parser.error(f"--modes: choose from {', '.join(ALL_MODES)}, with none (the baseline)")
    if (BEFORE_MODE in args.modes) != (args.before is not None):
        parser.error(f"--before and the mode {BEFORE_MODE} go together")
    try:
        args.extender_cpus = tuple(int(c) for c in args.extender_cpus.split(",") if c.strip())
    except ValueError:
        parser.error("--extender-cpus: comma-separated CPU numbers")
    if args.extender_cpus:
        usable = os.sched_getaffinity(0)
        if not set(args.extender_cpus) < usable:
            parser.error(
                f"--extender-cpus: a part of this process's CPUs ({sorted(usable)}), leaving some "
                "for the rest"
            )
        if shutil.which("taskset") is None:
            parser.error("--extender-cpus needs taskset (util-linux) on PATH")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    exit_on_sigterm()  # a stopped run stops its control plane and scorers too
    args = parse_args(argv)
    if args.pool:
        try:
            sizes_pooled = pooled([json.loads(path.read_text()) for path in args.pool])
        except (OSError, ValueError, KeyError, TypeError) as exc:
            print(f"--pool: not a readable `--json` document of this benchmark: {exc!r}",
                  file=sys.stderr)  # fmt: skip
            return 2
        if args.json:
            print(json.dumps({str(n): m for n, m in sizes_pooled.items()}, indent=2))
        else:
            print(pooled_text(sizes_pooled, len(args.pool)))
        return 0
    sizes, modes = args.sizes, args.modes
    if args.extender_cpus:
        # This process and what it starts (the control plane, the patcher's threads) keep off
        # the extenders' CPUs; each extender is started on them alone (`extenders`).
        os.sched_setaffinity(0, os.sched_getaffinity(0) - set(args.extender_cpus))
    if args.capture:
        try:
            wire_capture.check()  # before minutes of setup, not after them
        except wire_capture.CaptureUnavailableError as exc:
            print(f"--capture: {exc}", file=sys.stderr)
            return 2

    def progress(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    with contextlib.ExitStack() as stack:
        mounted_image = None
        if IMAGE_MODE in modes:
            try:  # once, before minutes of setup, for every size
                mounted_image = stack.enter_context(image.mounted_current())
            except image.ImageError as exc:
                print(f"{IMAGE_MODE}: {exc}", file=sys.stderr)
                return 2
        results = _run_sizes(args, sizes, modes, progress, mounted_image)
    return _report(args, results)


def _run_sizes(
    args: argparse.Namespace,
    sizes: Sequence[int],
    modes: tuple[str, ...],
    progress: Callable[[str], None],
    mounted_image: image.MountedImage | None,
) -> list[dict[str, Any]]:
    return [
        run(
            Config(
                n,
                pods=args.pods,
                full_pods=args.full_pods,
                rounds=args.rounds,
                writes_per_node_s=args.writes_per_node_s,
                modes=modes,
                before=args.before,
                capture=args.capture,
                extender_cpus=args.extender_cpus,
            ),
            progress=progress,
            mounted_image=mounted_image,
        )
        for n in sizes
    ]


def _report(args: argparse.Namespace, results: list[dict[str, Any]]) -> int:
    """Print the run's document (`--json`) or its summary."""
    document = {
        "machine": machine_description(),
        "measured_at": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "kubernetes": BuildSpec.for_version().kubernetes_version,
        "sizes": results,
    }
    if args.json:
        print(json.dumps(document, indent=2))
        return 0
    print(f"{document['machine']}, {document['measured_at']}")
    for result in results:
        print(
            f"{result['config']['nodes']} nodes, {result['patches_per_s']} patches/s "
            f"(patcher {result['patcher_cpu_fraction']:.0%} of a core):"
        )
        for mode, entry in result["modes"].items():
            ratio = entry["ratio_to_none"]
            wire = entry.get("wire_mean_ms_median")
            print(
                f"  {mode:5s} {entry['pods_per_s_median']:7.1f} pods/s  "
                f"{'' if ratio is None else f'{ratio:.2f}x'}  scorer ms {entry['scorer_ms_median']}"
                + (f"  on the wire, mean ms {wire}" if wire else "")
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
