"""Scorer latency: the server time kube-scheduler waits for, against a floor, before and after.

Every server runs in its own process (`benchmarks/scorer_child.py`) on loopback, and one client
calls them in turn on keep-alive connections, sample after sample, so that noise on a shared
machine hits all of them alike:

- the scorer built from this checkout, and (`--before REF`) the scorer built from an earlier
  commit of the same repository, fed the same Nodes and the same watch events;
- a do-nothing server that reads each request and answers the scorer's own reply bytes;
- a floor server: the do-nothing server plus msgspec's typed decode of the body into exactly
  what a verdict reads (full-node mode: each Node's name, annotations and managedFields;
  names-only mode, during churn: the names and what the scorer reads of the Pod).

**Requests as kube-scheduler sends them** (`benchmarks.kube_requests`): one sample is one pod, a
fresh Pod object drawn from a mix of classes (GPU counts, hints, namespaces), with the next window
of names of kube-scheduler's rotation (at 5,000 nodes 500 names, each pod's window starting where
the last one ended; full-node mode: those Nodes' objects); its filter, then its prioritize of the
names the filter passed. No list and no pod comes twice in a row, so the scorer's index of a list
and its memo of a pod class are as cold or warm as the real caller leaves them.

**Server time** is a scorer's round trip minus the do-nothing server's round trip for the same
request in the same sample (the median of those differences): everything the scorer adds to
reading the request and sending the reply, HTTP parsing included. The handler time measured
inside the scorer (decode, verdicts, reply, without HTTP) is reported beside it. The floor's
server time is measured the same way.

Every scorer logs as `gpu-scorer serve` does: at INFO, through the log's writer thread
(`logs.configure_logging`), to a file per scorer whose lines the row counts (`log_lines`); a
filter with rejections queues one record on the request path, which the benchmark pays as
production does.

Names-only mode runs during live churn, as in production: an API server stand-in
(`kube_standins.apiserver`, its own process) holds the Nodes, each scorer's node cache LISTs them
and WATCHes them on its own thread (the production list + watch loop, started as
`gpu-scorer serve` starts it), and while the requests are sent the stand-in rewrites Nodes at
`--events-per-s` (100 by default; Poisson arrivals, each write one event on every watch), so
that watch events are decoded and judged in the scorer's process while requests run there (the
GIL, the store, the CPU caches). Samples are paced at `--pods-per-s` (one sample is one pod's
filter and prioritize). Reported with it: the events each scorer applied per second during the
samples, the share of requests whose round trip overlapped an event being applied, the server
time of those requests, the filter alone with the churn paused (`quiet`: no prioritize follows
it, and as many untimed pods go first, so that it does not time each pod class's first request),
and the node cache's cost per event with one and with four pod classes active.

    python -m benchmarks.scorer_latency                       # table, this checkout only
    python -m benchmarks.scorer_latency --before HEAD --json  # before/after, one JSON object
    python -m benchmarks.scorer_latency --quick               # smoke run (seconds)
    python -m benchmarks.scorer_latency --per-gpu --gpus 4    # 8-GPU tables, a 4-GPU pod
    python -m benchmarks.scorer_latency --image               # the servers on the image's
                                                              # interpreter (root; dev.py image)
    python -m benchmarks.scorer_latency --nulls               # beside the extenders that
                                                              # decide nothing

**`--nulls`** times, in the same names-only samples and the same way (round trip minus the
do-nothing server's), the two extenders that decide nothing of `benchmarks.real_scheduler`: the
compiled Go one its throughput target is measured against (`tools/k8s/cmd/null-extender`, built
with the control plane: `python3 dev.py cluster build`), and the Python one on the scorer's own
HTTP edge (`benchmarks.null_extender`). They pass every node, so their filter replies carry every
name of the window where the scorer's carry those it passed, and they go after the scorers in
each sample, which leaves the scorers' figures as they are without them. What a server that reads
the request and decides nothing takes of the same measure: the mechanism's own share of it.

Targets: names-only filter server time during churn (100 node events/s) <= 0.3 ms at 500 nodes
and <= 1.5 ms at 5,000 nodes (windows of 230 and 500 names), as medians; full-node filter server
time <= 1.5 x the floor's at 500 Nodes.
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import http.client
import importlib.util
import json
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path, PurePosixPath
from typing import IO, Any, Final, Literal, TypeVar

from benchmarks.kube_requests import (
    POD_MIX,
    PodClass,
    PodStream,
    Rotation,
    filter_body,
    informer_order,
    nodes_to_find,
    passing_names,
    snapshot_order,
    zone_key,
)
from benchmarks.machine import machine_description
from gpu_contract.schema import GpuState, Health, NodeGpuState, encode
from kube_standins.nodes import gpu_node, with_agent_write
from loopback_cluster import image
from loopback_cluster.control_plane import BuildSpec, missing_binaries_reason

ROOT = Path(__file__).resolve().parents[1]
CHILD = Path(__file__).resolve().parent / "scorer_child.py"
NOW = datetime(2026, 11, 30, 14, 0, 0, tzinfo=UTC)
PRODUCTS = ("NVIDIA-A100-SXM4-80GB", "NVIDIA-H100-80GB-HBM3", "Tesla-V100-SXM2-32GB")
Mode = Literal["full", "names"]
Interval = tuple[float, float]  # (start, end) of time.monotonic(), one clock for all processes
# (mode, nodes, samples): the scheduler sends ~10 % of a 5000-node cluster's nodes, twice per pod.
# Names-only samples are paced (`--pods-per-s`): at 100 pods/s, 3 s of churn each.
PLAN: tuple[tuple[Mode, int, int], ...] = (
    ("names", 500, 300),
    ("names", 5000, 300),
    ("full", 500, 30),
    ("full", 5000, 6),
)
QUICK_PLAN: tuple[tuple[Mode, int, int], ...] = (("names", 500, 30), ("full", 500, 5))
# Pods of four classes (hints, GPU request), for the node cache's upkeep with several active.
CLASS_PODS: tuple[dict[str, str], ...] = (
    {},
    {"gpu-scheduler.example.com/max-utilization": "0.70"},
    {"gpu-scheduler.example.com/gpu-model-preference": "A100,H100"},
    {"gpu-scheduler.example.com/min-gpu-memory-mib": "40000"},
)
TARGET_MS: Final = {500: 0.3, 5000: 1.5}
FLOOR_RATIO_TARGET: Final = 1.5
# Churn before the first timed sample, so that the watch streams are flowing.
WARM_UP_S: Final = 0.3
# How long the churn runs with four pod classes active (the per-event cost with classes).
CLASSES_S: Final = 1.0
QUICK_CLASSES_S: Final = 0.3
# The extenders that decide nothing (`--nulls`): the compiled Go one, the Python one.
NULLS: Final = ("null_go", "null_py")


GPUS_PER_NODE = 8


def per_gpu_table(i: int, rewrite: int) -> tuple[GpuState, ...]:
    """Node `i`'s 8 GPUs: loads spread from idle to saturated, as training and inference pods
    leave them (so that nodes differ in how many GPUs a multi-GPU pod finds)."""
    return tuple(
        GpuState(
            utilization=((i * 7 + g * 29 + 3 * rewrite) % 101) / 100,
            memory_free_mib=(80 - (i + g * 11 + rewrite) % 80) * 1_000,
            temperature_c=40 + (i + g * 5 + rewrite) % 45,
            allocated=(i + g + rewrite) % 3 == 0,
        )
        for g in range(GPUS_PER_NODE)
    )


def build_node(i: int, *, rewrite: int = 0, per_gpu: bool = False) -> dict[str, Any]:
    """Node `i` (~7 KB, with the agent's annotations and managedFields entry); `rewrite` > 0:
    as after that many later agent writes (other values, newer times). With `per_gpu`, the
    agent's per-GPU keys too, and the node-level values their summaries."""
    moved = timedelta(seconds=rewrite % 4)
    utilization = ((i + 3 * rewrite) % 97) / 100
    gpus = per_gpu_table(i, rewrite) if per_gpu else ()
    if gpus:
        utilization = sum(g.utilization or 0.0 for g in gpus) / len(gpus)
    state = NodeGpuState(
        health=Health.OK,
        updated_at=NOW - timedelta(seconds=5 + i % 50) + moved,
        utilization=utilization,
        utilization_max=min(1.0, utilization + 0.05),
        memory_fragmentation=(i % 10) / 20,
        memory_free_mib=320_000,
        memory_largest_free_mib=40_000 + (i % 5) * 5_000,
        temperature_c=40 + i % 45,
        gpu_model=PRODUCTS[i % len(PRODUCTS)],
        gpu_count=GPUS_PER_NODE,
        gpus=gpus,
    )
    if gpus:
        state = NodeGpuState(
            health=state.health,
            updated_at=state.updated_at,
            utilization=utilization,
            utilization_max=max(g.utilization or 0.0 for g in gpus),
            memory_fragmentation=state.memory_fragmentation,
            memory_free_mib=sum(g.memory_free_mib or 0 for g in gpus),
            memory_largest_free_mib=max(g.memory_free_mib or 0 for g in gpus),
            temperature_c=max(g.temperature_c or 0 for g in gpus),
            gpu_model=state.gpu_model,
            gpu_count=GPUS_PER_NODE,
            gpus=gpus,
        )
    node = gpu_node(f"gpu-node-{i:05d}", product=PRODUCTS[i % len(PRODUCTS)])
    written = NOW - timedelta(seconds=4 + i % 50) + moved
    node = with_agent_write(node, encode(state), written)
    # As kube-scheduler sends Nodes from its informer cache: no TypeMeta.
    node.pop("kind", None)
    node.pop("apiVersion", None)
    return node


def pod(annotations: dict[str, str] | None = None, *, gpus: int = 1) -> dict[str, Any]:
    request = {"nvidia.com/gpu": str(gpus)}
    return {
        "metadata": {"name": "train-0", "namespace": "ml", "annotations": annotations or {}},
        "spec": {"containers": [{"name": "main", "resources": {"requests": request}}]},
    }


def request_body(nodes: list[dict[str, Any]], mode: Mode, the_pod: dict[str, Any]) -> bytes:
    """The body as kube-scheduler sends it (Go's encoding/json: compact, no spaces)."""
    document: dict[str, Any]
    if mode == "full":
        document = {"Pod": the_pod, "Nodes": {"metadata": {}, "items": nodes}, "NodeNames": None}
    else:
        names = [n["metadata"]["name"] for n in nodes]
        document = {"Pod": the_pod, "Nodes": None, "NodeNames": names}
    return json.dumps(document, separators=(",", ":")).encode()


# ----------------------------------------------------------------------------- processes


@dataclass
class Child:
    name: str
    process: subprocess.Popen[bytes]
    port: int
    conn: http.client.HTTPConnection | None = None

    def command(self, **command: Any) -> Any:
        stdin, stdout = self.process.stdin, self.process.stdout
        assert stdin is not None
        assert stdout is not None
        stdin.write(json.dumps(command).encode() + b"\n")
        stdin.flush()
        return json.loads(stdout.readline())

    def post(self, path: str, body: bytes) -> tuple[int, bytes]:
        if self.conn is None:
            self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=300)
        self.conn.request("POST", path, body=body, headers={"Content-Type": "application/json"})
        response = self.conn.getresponse()
        data = response.read()
        if response.status != 200:
            raise RuntimeError(f"{self.name} {path}: HTTP {response.status}: {data[:200]!r}")
        return response.status, data

    def timed_post(self, path: str, body: bytes) -> tuple[Interval, bytes]:
        """The round trip's (start, end), on the clock the children record theirs on, and the
        reply."""
        started = time.monotonic()
        _, reply = self.post(path, body)
        return (started, time.monotonic()), reply


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass(frozen=True, slots=True)
class Runner:
    """How a server child starts: on this interpreter, or (`mounted`, `--image`) on the image's,
    with its environment (`PYTHONOPTIMIZE=2`), as root, the `trees` (this checkout holds the
    child's script) mounted read-only and the `scratch` folder writable, each at its own path."""

    mounted: image.MountedImage | None = None
    trees: tuple[Path, ...] = ()
    scratch: Path | None = None

    def command(self, argv: Sequence[str]) -> list[str]:
        if self.mounted is None:
            return [sys.executable, str(CHILD), *argv]
        container = image.Container(
            argv=["python", str(CHILD), *argv],
            uid=0,
            gid=0,
            read_only={tree: PurePosixPath(tree) for tree in {ROOT, *self.trees}},
            read_write={} if self.scratch is None else {self.scratch: PurePosixPath(self.scratch)},
        )
        return self.mounted.argv(container)


ON_THIS_INTERPRETER: Final = Runner()


def _start(name: str, *argv: str, runner: Runner = ON_THIS_INTERPRETER) -> Child:
    port = _free_port()
    process = subprocess.Popen(
        runner.command([*argv, "--port", str(port)]),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    stdout: IO[bytes] | None = process.stdout
    assert stdout is not None
    line = stdout.readline()
    if not line:
        raise RuntimeError(f"{name} did not start")
    return Child(name, process, port)


def go_null_binary() -> Path:
    """The compiled extender that decides nothing, built with the control plane."""
    return BuildSpec.for_version().bin_dir / "null-extender"


def _start_go_null(binary: Path) -> Child:
    """The Go null extender on a port of its own choosing, which its first line names."""
    process = subprocess.Popen(
        [str(binary), "--listen=127.0.0.1:0"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,  # left open: it logs nothing more unless it fails
    )
    stderr: IO[bytes] | None = process.stderr
    assert stderr is not None
    line = stderr.readline().decode(errors="replace").strip()
    address = line.removeprefix("listening on ")
    if address == line:
        process.kill()
        process.wait(10)
        raise RuntimeError(f"null_go did not start: {line or 'no output'}")
    return Child("null_go", process, int(address.rsplit(":", 1)[1]))


@contextmanager
def children() -> Iterator[list[Child]]:
    started: list[Child] = []
    try:
        yield started
    finally:
        # The API server last: a scorer whose watch loses its server mid-run logs a retry.
        for child in reversed(started):
            if child.conn is not None:
                child.conn.close()
            # Every child but the Go null extender takes commands on its stdin.
            with contextlib.suppress(OSError, ValueError):  # it may have gone already
                if child.process.stdin is not None:
                    child.command(cmd="quit")
            child.process.terminate()
            child.process.wait(10)


T = TypeVar("T")


@contextmanager
def source_tree(ref: str | None) -> Iterator[Path | None]:
    """An export of `ref` of this repository in a temporary folder; None without `--before`,
    or when it cannot be had (not a git checkout, the commit absent, or uvicorn, which the
    earlier version served with, not installed)."""
    if ref is None:
        yield None
        return
    folder = Path(tempfile.mkdtemp(prefix="scorer-before-"))
    try:
        try:
            archive = subprocess.run(
                ["git", "-C", str(ROOT), "archive", ref], check=True, capture_output=True
            ).stdout
            subprocess.run(["tar", "-x", "-C", str(folder)], input=archive, check=True)
        except (OSError, subprocess.CalledProcessError) as exc:
            print(f"--before {ref}: cannot export it ({exc}); this checkout only", file=sys.stderr)
            yield None
            return
        # Versions before the scorer's own HTTP server served with uvicorn (from a server.py
        # of their own, so the file's presence does not tell); later ones keep the server in
        # the edges package.
        package = folder / "exporter_scheduler"
        server = next(
            (p for p in (package / "edges" / "server.py", package / "server.py") if p.exists()),
            None,
        )
        needs_uvicorn = server is None or "import uvicorn" in server.read_text()
        if needs_uvicorn and importlib.util.find_spec("uvicorn") is None:
            print(
                f"--before {ref}: uvicorn is not installed; measuring this checkout only",
                file=sys.stderr,
            )
            yield None
            return
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def in_turns(ref: str | None, rounds: int, measure: Callable[[Path], T]) -> dict[str, list[T]]:
    """`measure` of this checkout's tree and, with `ref`, of an export of that commit
    (`source_tree`), `rounds` times each, in turns, so that a machine's drift hits both alike;
    by label: "before (REF)" first when there is one, then "this checkout"."""
    with source_tree(ref) as before:
        trees = {"this checkout": ROOT}
        if before is not None:
            trees = {f"before ({ref})": before, **trees}
        results: dict[str, list[T]] = {label: [] for label in trees}
        for _ in range(rounds):
            for label, tree in trees.items():
                results[label].append(measure(tree))
    return results


# ----------------------------------------------------------------------------- measuring


def _ms(seconds: Sequence[float]) -> dict[str, float]:
    ordered = sorted(seconds)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return {"median_ms": statistics.median(ordered) * 1e3, "p99_ms": p99 * 1e3, "n": len(ordered)}


def _lines(objects: Sequence[Mapping[str, Any]]) -> bytes:
    return b"\n".join(json.dumps(o, separators=(",", ":")).encode() for o in objects)


def churn_pool(count: int, writes: int, *, seed: int, per_gpu: bool) -> list[dict[str, Any]]:
    """`writes` agent writes to Nodes picked at random, each a later version of its node."""
    rng = random.Random(seed)
    rewrites = [0] * count
    pool = []
    for _ in range(writes):
        i = rng.randrange(count)
        rewrites[i] += 1
        pool.append(
            {
                "i": i,
                "rewrite": rewrites[i],
                "node": build_node(i, rewrite=rewrites[i], per_gpu=per_gpu),
            }
        )
    return pool


def meeting(requests: Sequence[Interval], events: Sequence[Interval]) -> list[bool]:
    """For each request's round trip, whether a watch event was being applied during it (the
    watch thread applies one event at a time, so the events' intervals are ordered)."""
    starts = [start for start, _ in events]
    met = []
    for start, end in requests:
        # The last event to start before the request ended overlaps it if it ended after the
        # request started (an earlier one ended before that one started).
        k = bisect.bisect_left(starts, end)
        met.append(k > 0 and events[k - 1][1] > start)
    return met


@dataclass
class Sampled:
    """One phase's samples: per scorer and verb, the server times and the round trips."""

    server_s: dict[str, dict[str, list[float]]]
    round_trips: dict[str, dict[str, list[Interval]]]
    floor_s: list[float]
    started: float
    ended: float
    # The extenders that decide nothing (`--nulls`), per verb: their server times.
    nulls_s: dict[str, dict[str, list[float]]] = field(default_factory=dict)


@dataclass
class Requests:
    """Each sample's requests as kube-scheduler sends them (`benchmarks.kube_requests`): a fresh
    pod of the mix, the next window of names of the scheduler's rotation, and (full-node mode)
    those Nodes' objects."""

    rotation: Rotation
    pods: PodStream
    nodes: dict[str, dict[str, Any]] | None = None
    windows: list[int] = field(default_factory=list)
    passed: list[int] = field(default_factory=list)

    def filter(self) -> tuple[dict[str, Any], bytes]:
        """The next pod and its filter body."""
        the_pod = self.pods.next()
        window = self.rotation.window()
        self.windows.append(len(window))
        return the_pod, filter_body(the_pod, window, self.nodes)

    def prioritize(self, the_pod: Mapping[str, Any], filter_reply: bytes) -> bytes:
        """The prioritize body: the names (or Nodes) the filter passed, in its reply's order."""
        passing = passing_names(filter_reply)
        self.passed.append(len(passing))
        return filter_body(the_pod, passing, self.nodes)

    def summary(self) -> dict[str, Any]:
        """What was sent: window sizes, names the filters passed (medians), pods."""
        return {
            "pods_sent": len(self.windows),
            "window_names_median": statistics.median(self.windows),
            "passed_names_median": statistics.median(self.passed) if self.passed else None,
        }

    @classmethod
    def of(cls, nodes: Sequence[dict[str, Any]], mode: Mode, seed: int) -> Requests:
        zones = {n["metadata"]["name"]: zone_key(n) for n in nodes}
        order = snapshot_order((name, zones[name]) for name in informer_order(list(zones), seed))
        by_name = {n["metadata"]["name"]: n for n in nodes} if mode == "full" else None
        return cls(Rotation(order), PodStream(seed), by_name)


def run_samples(  # noqa: PLR0917 (the phase's parts, as `measure` holds them)
    scorers: Mapping[str, Child],
    nothing: Mapping[str, Child],
    floor: Child | None,
    requests: Requests,
    verbs: Sequence[str],
    samples: int,
    pods_per_s: float | None,
    nulls: Mapping[str, Child] | None = None,
) -> Sampled:
    """`samples` pods: each verb on the do-nothing server, then on every scorer in turn, then
    on the floor server (the filter alone) and on each of `nulls`.

    One sample is one pod's calls: its filter (a fresh pod, the next window of names), then its
    prioritize of the names the first scorer's filter passed, every server getting the same bytes.
    With `pods_per_s`, sample k starts at k / pods_per_s (at once when behind), so the scorers see
    the pod rate, and the watch thread the gaps, of a scheduler.
    """
    server_s: dict[str, dict[str, list[float]]] = {
        label: {verb: [] for verb in verbs} for label in scorers
    }
    round_trips: dict[str, dict[str, list[Interval]]] = {
        label: {verb: [] for verb in verbs} for label in scorers
    }
    floor_s: list[float] = []
    nulls = nulls or {}
    nulls_s: dict[str, dict[str, list[float]]] = {
        label: {verb: [] for verb in verbs} for label in nulls
    }
    started = time.monotonic()
    for sample in range(samples):
        if pods_per_s:
            time.sleep(max(0.0, started + sample / pods_per_s - time.monotonic()))
        # The scorers take turns going first: the one that follows another finds the CPU
        # caches cold (see docs/scorer.md), so a fixed order would favour one.
        turn = list(scorers.items())
        if sample % 2:
            turn.reverse()
        the_pod, body = requests.filter()
        for verb in verbs:
            (base_start, base_end), _ = nothing[verb].timed_post(f"/{verb}", body)
            base = base_end - base_start
            replies: dict[str, bytes] = {}
            for label, child in turn:
                trip, replies[label] = child.timed_post(f"/{verb}", body)
                server_s[label][verb].append(trip[1] - trip[0] - base)
                round_trips[label][verb].append(trip)
            if floor is not None and verb == "filter":
                (floor_start, floor_end), _ = floor.timed_post("/filter", body)
                floor_s.append(floor_end - floor_start - base)
            for label, child in nulls.items():
                (null_start, null_end), _ = child.timed_post(f"/{verb}", body)
                nulls_s[label][verb].append(null_end - null_start - base)
            if verb == "filter":
                body = requests.prioritize(the_pod, replies[next(iter(scorers))])
    return Sampled(server_s, round_trips, floor_s, started, time.monotonic(), nulls_s)


def log_path(scratch: Path, label: str, mode: Mode, count: int) -> Path:
    """The log file of scorer `label` in one row."""
    return scratch / f"{label}-{mode}-{count}.log"


def log_lines(scratch: Path, labels: Sequence[str], mode: Mode, count: int) -> dict[str, int]:
    """The lines each scorer of a row logged, read once the row's processes have exited (their
    log writers write what is queued as they stop)."""
    counts = {}
    for label in labels:
        path = log_path(scratch, label, mode, count)
        counts[label] = path.read_bytes().count(b"\n") if path.exists() else 0
    return counts


def _durations(spans: Sequence[Sequence[float]]) -> list[float]:
    return [end - start for start, end in spans]


def _timings(child: Child) -> tuple[list[float], list[Interval]]:
    """The handler times and the applied watch events' intervals since the last call."""
    timings = child.command(cmd="timings")
    return _durations(timings["handler"]), [(a, b) for a, b in timings["events"]]


def measure(
    mode: Mode,
    count: int,
    samples: int,
    *,
    trees: dict[str, Path],
    scratch: Path,
    events_per_s: float = 100.0,
    pods_per_s: float = 100.0,
    per_gpu: bool = False,
    gpus: int | None = None,
    quick: bool = False,
    runner: Runner = ON_THIS_INTERPRETER,
    go_null: Path | None = None,
) -> dict[str, Any]:
    """One row of the plan; `runner` starts the scorers, the do-nothing and the floor servers
    and the Python null extender (the API server stand-in runs on this interpreter). With
    `go_null` (the binary), a names-only row also times the null extenders (`--nulls`)."""
    nodes = [build_node(i, per_gpu=per_gpu) for i in range(count)]
    # One rotation and one stream of pods for the whole row, priming included, as one
    # scheduler's: every request is a new pod and the next window of names.
    mix = POD_MIX if gpus is None else (PodClass(1.0, gpus, "ml"),)
    requests = Requests.of(nodes, mode, seed=count)
    requests.pods = PodStream(count, mix)
    the_pod, body = requests.filter()
    row: dict[str, Any] = {
        "mode": mode,
        "nodes": count,
        "window_names": nodes_to_find(count),
        "body_bytes": len(body),
        "per_gpu": per_gpu,
        "gpus": gpus,
        "pod_classes": len(mix),
    }
    verbs = ("filter", "prioritize")
    names_only = mode == "names"
    with children() as started:
        kubeconfig = scratch / "kubeconfig"
        apiserver: Child | None = None
        if names_only:
            # Enough writes for the phases at their slowest expected pace; the stand-in builds
            # more itself if a slow machine needs them.
            classes_s = QUICK_CLASSES_S if quick else CLASSES_S
            churn_s = 3 * samples / pods_per_s + WARM_UP_S + classes_s
            writes = max(1, round(events_per_s * churn_s))
            (scratch / "nodes.jsonl").write_bytes(_lines(nodes))
            pool = churn_pool(count, writes, seed=count, per_gpu=per_gpu)
            (scratch / "churn.jsonl").write_bytes(_lines(pool))
            apiserver = _start(
                "apiserver",
                "apiserver",
                "--nodes",
                str(scratch / "nodes.jsonl"),
                "--churn",
                str(scratch / "churn.jsonl"),
                "--kubeconfig",
                str(kubeconfig),
                *(["--per-gpu"] if per_gpu else []),
            )
            started.append(apiserver)
        scorers: dict[str, Child] = {}

        def log_of(label: str) -> Path:
            return log_path(scratch, label, mode, count)

        for label, tree in trees.items():
            # Logging on at INFO, as `serve` logs (to a file: the lines are counted, not shown).
            argv = ["scorer", "--tree", str(tree), "--mode", mode, "--log", str(log_of(label))]
            if names_only:
                argv += ["--kubeconfig", str(kubeconfig), "--expect", str(count)]
            scorers[label] = _start(label, *argv, runner=runner)
            started.append(scorers[label])
        # The pod's class (names only: so that the node cache keeps its verdicts), and the
        # replies the do-nothing servers answer with.
        filtered = scorers["after"].post("/filter", body)[1]
        bodies = {"filter": body, "prioritize": requests.prioritize(the_pod, filtered)}
        replies = {verb: scorers["after"].post(f"/{verb}", bodies[verb])[1] for verb in verbs}
        for label, child in scorers.items():
            for verb in verbs:
                reply = child.post(f"/{verb}", bodies[verb])[1]
                if label != "after":
                    # The same Nodes, no churn yet: the versions should agree (recorded, not
                    # asserted: a change of scores between versions is not a benchmark error).
                    row.setdefault("replies_equal", True)
                    row["replies_equal"] &= reply == replies[verb]
        nothing: dict[str, Child] = {}
        for verb in verbs:
            reply_file = scratch / f"{verb}.reply"
            reply_file.write_bytes(replies[verb])
            nothing[verb] = _start("nothing", "nothing", "--reply", str(reply_file), runner=runner)
            started.append(nothing[verb])
        # The floor: the do-nothing server plus a typed decode of what a verdict reads.
        floor = _start(
            "floor",
            "nothing",
            "--reply",
            str(scratch / "filter.reply"),
            "--floor",
            mode,
            runner=runner,
        )
        started.append(floor)
        nulls: dict[str, Child] = {}
        if names_only and go_null is not None:
            nulls["null_go"] = _start_go_null(go_null)
            started.append(nulls["null_go"])
            nulls["null_py"] = _start("null_py", "null", "--tree", str(ROOT), runner=runner)
            started.append(nulls["null_py"])
        # Warm every connection.
        for child in [*nothing.values(), floor, *nulls.values()]:
            child.post("/filter", body)

        if not names_only:
            sampled = run_samples(scorers, nothing, floor, requests, verbs, samples, None)
            for label, child in scorers.items():
                handler, _ = _timings(child)
                # The handler calls of the timed phase (after the priming ones), in call order.
                handler = handler[-samples * len(verbs) :]
                for index, verb in enumerate(verbs):
                    row[f"{label}_{verb}"] = _ms(sampled.server_s[label][verb])
                    row[f"{label}_{verb}_handler"] = _ms(handler[index :: len(verbs)])
            row["floor"] = _ms(sampled.floor_s)
            for label in scorers:
                row[f"{label}_filter_over_floor"] = (
                    row[f"{label}_filter"]["median_ms"] / row["floor"]["median_ms"]
                )
            row |= requests.summary()
            return row

        assert apiserver is not None
        # Quiet: the filter with no watch events, for comparison. First as many pods again,
        # not timed: a pod class's first filter judges every node for it, so without them this
        # phase would time the classes' first requests, which the churn phase never sees.
        quiet_samples = max(5, samples // 5)
        run_samples(scorers, nothing, None, requests, verbs, quiet_samples, pods_per_s)
        for child in scorers.values():
            _timings(child)
        quiet = run_samples(
            scorers, nothing, None, requests, ("filter",), quiet_samples, pods_per_s
        )
        for label, child in scorers.items():
            handler, events = _timings(child)
            row[f"{label}_quiet"] = _ms(quiet.server_s[label]["filter"])
            row[f"{label}_quiet_handler"] = _ms(handler)
            row[f"{label}_quiet_events"] = len(events)

        # During churn: the writes start, the streams flow, then the timed samples.
        apiserver.command(cmd="churn", rate=events_per_s, seed=count)
        time.sleep(WARM_UP_S)
        for child in scorers.values():
            _timings(child)
        sampled = run_samples(scorers, nothing, floor, requests, verbs, samples, pods_per_s, nulls)
        window_s = sampled.ended - sampled.started
        # No ratio here: a names-only body decodes in a few microseconds, within the noise
        # between two do-nothing servers, so the floor is near zero, either side of it.
        row["floor"] = _ms(sampled.floor_s)
        if nulls:
            row["nulls"] = {
                label: {verb: _ms(seconds) for verb, seconds in by_verb.items()}
                for label, by_verb in sampled.nulls_s.items()
            }
        for label, child in scorers.items():
            handler, events = _timings(child)
            during = [e for e in events if sampled.started <= e[0] < sampled.ended]
            if not during:
                # Then this row measured no churn at all: no figure is better than a wrong one.
                raise RuntimeError(f"{label}: no watch event reached the node cache")
            for index, verb in enumerate(verbs):
                row[f"{label}_{verb}"] = _ms(sampled.server_s[label][verb])
                row[f"{label}_{verb}_handler"] = _ms(handler[index :: len(verbs)])
            trips = [t for verb in verbs for t in sampled.round_trips[label][verb]]
            met = meeting(trips, during)
            row[f"{label}_events_per_s"] = len(during) / window_s
            row[f"{label}_event_us"] = statistics.median(_durations(during)) * 1e6
            row[f"{label}_requests_meeting_events"] = sum(met) / len(met)
            filter_met = meeting(sampled.round_trips[label]["filter"], during)
            server = sampled.server_s[label]["filter"]
            met_s = [s for s, m in zip(server, filter_met, strict=True) if m]
            apart_s = [s for s, m in zip(server, filter_met, strict=True) if not m]
            row[f"{label}_filter_meeting_event"] = _ms(met_s) if met_s else None
            row[f"{label}_filter_apart"] = _ms(apart_s) if apart_s else None
        written = apiserver.command(cmd="pause")
        row["events_per_s_target"] = events_per_s
        row["pods_per_s"] = pods_per_s
        row["samples_s"] = window_s
        row["churn_written_per_s"] = written["written"] / written["seconds"]
        row["churn_built_live"] = written["built_live"]

        # The node cache's upkeep with four pod classes active (each kept), still live.
        for child in scorers.values():
            for hints in CLASS_PODS[1:]:
                child.post("/filter", request_body(nodes, "names", pod(hints, gpus=gpus or 1)))
            _timings(child)
        apiserver.command(cmd="churn", rate=events_per_s, seed=count + 1)
        time.sleep(classes_s)
        apiserver.command(cmd="pause")
        time.sleep(0.05)  # the last writes' events on their way
        row["classes_event_us"] = {}
        for label, child in scorers.items():
            _, events = _timings(child)
            spent = _durations(events)
            if not spent:
                raise RuntimeError(f"{label}: no watch event reached the node cache (4 classes)")
            row["classes_event_us"][label] = statistics.median(spent) * 1e6
    row |= requests.summary()
    return row


def targets(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    checks = []
    for row in rows:
        limit_ms = TARGET_MS.get(row["nodes"])
        if row["mode"] == "names" and limit_ms is not None:
            value = row["after_filter"]["median_ms"]
            checks.append(
                {
                    "target": (
                        f"names-only filter server time <= {limit_ms} ms at {row['nodes']:,} "
                        f"nodes ({row['window_names']:,}-name windows, a fresh pod each) during "
                        f"churn ({row['events_per_s_target']:g} node events/s)"
                    ),
                    "value": round(value, 3),
                    "limit": limit_ms,
                    "met": value <= limit_ms,
                }
            )
        if row["mode"] == "full" and row["nodes"] == 500:
            value = row["after_filter_over_floor"]
            checks.append(
                {
                    "target": f"full-node filter server time <= {FLOOR_RATIO_TARGET} x floor at "
                    "500 nodes",
                    "value": round(value, 2),
                    "limit": FLOOR_RATIO_TARGET,
                    "met": value <= FLOOR_RATIO_TARGET,
                }
            )
    return checks


def _cell(value: Mapping[str, float] | None, width: int) -> str:
    return f"{'-':>{width}}" if value is None else f"{value['median_ms']:>{width}.3f}"


def _us(value: float) -> str:
    return f"{value:.0f} us"


def print_table(result: dict[str, Any]) -> None:
    print(f"machine: {result['machine']}")
    if result.get("image"):
        print(f"servers run from the image {result['image']} (its interpreter)")
    labels = result["trees"]
    header = f"{'mode':<6}{'nodes':>6}{'verb':>11}" + "".join(
        f"{label + ' server':>15}{label + ' handler':>16}" for label in labels
    )
    print(header)
    print("-" * len(header))
    for r in result["rows"]:
        for verb in ("filter", "prioritize", "quiet"):
            if f"{labels[0]}_{verb}" not in r:
                continue
            cells = "".join(
                _cell(r[f"{label}_{verb}"], 15) + _cell(r[f"{label}_{verb}_handler"], 16)
                for label in labels
            )
            print(f"{r['mode']:<6}{r['nodes']:>6}{verb:>11}{cells}")
        if "floor" in r:
            ratios = ", ".join(
                f"{label} {r[f'{label}_filter_over_floor']:.2f} x"
                for label in labels
                if f"{label}_filter_over_floor" in r
            )
            ratios = f"   ({ratios})" if ratios else ""
            print(f"{'':<6}{'':>6}{'floor':>11}{r['floor']['median_ms']:>15.3f}{ratios}")
        for label, by_verb in r.get("nulls", {}).items():
            for verb, figures in by_verb.items():
                print(f"{'':<6}{'':>6}{verb:>11}{figures['median_ms']:>15.3f}   ({label})")
        if "events_per_s_target" in r:
            print(
                f"{'':<12}churn: {r['churn_written_per_s']:.0f} writes/s over "
                f"{r['samples_s']:.1f} s of samples at {r['pods_per_s']:g} pods/s"
            )
            for label in labels:
                print(
                    f"{'':<12}{label}: {r[f'{label}_events_per_s']:.0f} events/s applied, "
                    f"{r[f'{label}_requests_meeting_events']:.1%} of requests met one; filter "
                    f"meeting an event {_cell(r[f'{label}_filter_meeting_event'], 0).strip()} "
                    f"ms, apart {_cell(r[f'{label}_filter_apart'], 0).strip()} ms; per event "
                    f"{_us(r[f'{label}_event_us'])} (4 classes: "
                    f"{_us(r['classes_event_us'][label])})"
                )
    print(
        "(ms, medians; server = round trip minus the do-nothing server's; handler = inside; "
        "names-only filter and prioritize during churn, quiet = filter with no churn; "
        "null_go, null_py: the extenders that decide nothing, --nulls)"
    )
    for check in result["targets"]:
        print(f"{'met' if check['met'] else 'MISSED':>6}: {check['target']} ({check['value']})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, few samples")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--before", metavar="REF", help="also measure this commit's scorer")
    parser.add_argument(
        "--events-per-s", type=float, default=100.0, help="node writes/s during the samples"
    )
    parser.add_argument(
        "--pods-per-s", type=float, default=100.0, help="names-only samples (pods) per second"
    )
    parser.add_argument("--only", help="mode:nodes[,mode:nodes...] of the plan, e.g. names:500")
    parser.add_argument(
        "--per-gpu", action="store_true", help="Nodes carry the agent's per-GPU keys (8 GPUs)"
    )
    parser.add_argument(
        "--gpus", type=int, help="every pod asks this many GPUs (default: the pod mix)"
    )
    parser.add_argument(
        "--image",
        action="store_true",
        help="run the servers from the image built from this checkout (`python3 dev.py image`; "
        "root): on its interpreter",
    )
    parser.add_argument(
        "--nulls",
        action="store_true",
        help="also time the extenders that decide nothing (Go and Python) in the names-only "
        "samples; the Go one is built with the control plane (`python3 dev.py cluster build`)",
    )
    args = parser.parse_args(argv)
    go_null = None
    if args.nulls:
        reason = missing_binaries_reason()
        if reason is not None:
            print(f"--nulls: {reason}", file=sys.stderr)
            return 2
        go_null = go_null_binary()
    plan = QUICK_PLAN if args.quick else PLAN
    if args.only:
        wanted = set(args.only.split(","))
        plan = tuple(p for p in plan if f"{p[0]}:{p[1]}" in wanted)
    rows = []
    with (
        contextlib.ExitStack() as stack,
        source_tree(args.before) as before,
        tempfile.TemporaryDirectory() as scratch,
    ):
        mounted = None
        if args.image:
            try:
                mounted = stack.enter_context(image.mounted_current())
            except image.ImageError as exc:
                print(f"--image: {exc}", file=sys.stderr)
                return 2
        trees = {"after": ROOT} | ({} if before is None else {"before": before})
        runner = Runner(mounted, tuple(trees.values()), Path(scratch))
        for mode, count, samples in plan:
            row = measure(
                mode,
                count,
                samples,
                trees=trees,
                scratch=Path(scratch),
                events_per_s=args.events_per_s,
                pods_per_s=args.pods_per_s,
                per_gpu=args.per_gpu,
                gpus=args.gpus,
                quick=args.quick,
                runner=runner,
                go_null=go_null,
            )
            row["log_lines"] = log_lines(Path(scratch), list(trees), mode, count)
            rows.append(row)
            print(f"measured {mode} {count}", file=sys.stderr)
    result = {
        "benchmark": "scorer_latency",
        "machine": machine_description(),
        "when": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "before": args.before,
        "trees": list(trees),
        # The image the servers ran from (`--image`); None: this interpreter.
        "image": None if mounted is None else mounted.name,
        "rows": rows,
        "targets": targets(rows),
    }
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print_table(result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
