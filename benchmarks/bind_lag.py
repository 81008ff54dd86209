"""Within a burst, how often the next pod's filter reaches the scorer before the previous pod's
bind is in the scorer's pod watch, and what the scorer's provisional placements change.

    python -m benchmarks.bind_lag [--nodes 50] [--pods 40] [--pair-pods 8] [--rounds 3]
        [--modes names,full] [--json]

kube-scheduler binds asynchronously: once a pod's scheduling cycle has picked a node, the bind
(a POST to the API server) runs in a goroutine and the next pod's cycle starts at once. The
scorer learns of the bind from its pod watch (`exporter_scheduler.edges.podcache`), which comes
later, so for a while the node's verdict cannot count that pod. The scorer therefore also counts its
own last answer as a provisional placement (`PodCache.propose`). This measures the lag and
what the proposals are worth, on the loopback control plane (`loopback_cluster.control_plane`):

1. a fleet of `--nodes` 8-GPU nodes with per-GPU data and allocations published: 8 of them have
   4 idle GPUs and 4 saturated ones that the kubelet's allocations account for (two at each
   of four idle-GPU utilizations, so their scores differ by level and tie by pairs), the rest
   8 GPUs at 0.45..0.80. A burst of `--pods` one-GPU pods goes to the four-GPU nodes first;
   each can take 4 of them;
2. the pair of the e2e burst test: `mixed` (4 idle GPUs, 4 saturated ones allocated) and `even`
   (8 GPUs at 0.55); a burst of `--pair-pods` one-GPU pods; `mixed` can take 4.

Per mode (names only, full nodes) and with the proposals on and off, each burst is created while
no scheduler serves it, then a fresh kube-scheduler places the backlog. The scorer runs in a
child process of this module (`scorer`), built as `gpu-scorer serve` builds it, that records
the wall time of each filter request (by pod) and of each pod's first event in its pod watch
(after the event is applied). Proposals off is `placements=None` on the app: the scorer then
counts the pod watch alone (there is no user-facing switch).

Reported per mode and setting: of the filters of a burst after its first, the fraction that
came before the previous pod's bind was in the watch, and by how much (median, p90); how many
earlier pods of the burst the watch had not shown at each filter; the time from a pod's filter
to its own bind in the watch; and placements: pods beyond a node's suitable GPUs (the fleet)
and pods on `mixed` (the pair; at most 4 is right).
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any, Final

import msgspec

from benchmarks.lifecycle import exit_on_sigterm
from benchmarks.machine import machine_description
from kube_standins.nodes import gpu_node
from loopback_cluster.control_plane import (
    ControlPlane,
    ExtenderConfig,
    KubeApi,
    SchedulerConfig,
    free_port,
    running_control_plane,
)
from loopback_cluster.workload import (
    gpu_pod,
    per_gpu_node_state,
    publish,
    register_node,
    wait_for,
)

MODES: Final = ("names", "full")
GPUS: Final = 8
SUITABLE_ON_FOUR_GPU_NODES: Final = 4
# The four-GPU nodes' idle-GPU utilizations: scores 9, 8, 7 and 6 under the default policy.
FOUR_GPU_LEVELS: Final = (0.0, 0.1, 0.2, 0.35)
EVEN_LEVELS: Final = (0.45, 0.5, 0.55, 0.6, 0.65, 0.7, 0.75, 0.8)
LAYOUT_LABEL: Final = "bind-lag-layout"
# The node cache and the scheduler's informer see a Node write within milliseconds on loopback.
SETTLE_S: Final = 1.0


# ----------------------------------------------------------------------------- the child scorer


class _PodRef(msgspec.Struct):
    name: str | None = None


class _Meta(msgspec.Struct):
    metadata: _PodRef | None = None


class _Args(msgspec.Struct, rename={"pod": "Pod"}):
    pod: _Meta | None = None


_ARGS: Final = msgspec.json.Decoder(_Args)


class Recorder:
    """What the child scorer saw, with wall times (seconds since the epoch)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.filters: list[tuple[str, float]] = []
        self.binds: dict[str, tuple[str, float]] = {}
        # Seconds each extender call spent in the app (proposals included), by verb.
        self.handled: dict[str, list[float]] = {}

    def filter(self, name: str, at: float) -> None:
        with self._lock:
            self.filters.append((name, at))

    def handle(self, verb: str, seconds: float) -> None:
        with self._lock:
            self.handled.setdefault(verb, []).append(seconds)

    def bind(self, name: str, node: str, at: float) -> None:
        with self._lock:
            self.binds.setdefault(name, (node, at))

    def take(self) -> dict[str, Any]:
        with self._lock:
            taken = {"filters": self.filters, "binds": self.binds, "handled": self.handled}
            self.filters, self.binds, self.handled = [], {}, {}
            return taken


def serve_scorer(args: argparse.Namespace) -> int:
    """The scorer, wired as `gpu-scorer serve` wires it, with the recorder's hooks; answers
    one JSON line on stdout per command line on stdin (`take`, `pods`, `quit`)."""
    from exporter_scheduler.core.policy import Policy  # noqa: PLC0415
    from exporter_scheduler.edges.nodecache import NodeCache  # noqa: PLC0415
    from exporter_scheduler.edges.podcache import PodCache  # noqa: PLC0415
    from exporter_scheduler.edges.server import HttpServer  # noqa: PLC0415
    from exporter_scheduler.serving.app import ScorerApp  # noqa: PLC0415
    from exporter_scheduler.serving.metrics import ScorerMetrics  # noqa: PLC0415

    names_only = args.mode == "names"
    policy = Policy()
    metrics = ScorerMetrics()
    recorder = Recorder()
    node_cache = None
    if names_only:
        node_cache = NodeCache(kubeconfig=args.kubeconfig, keys=policy.keys, metrics=metrics)
        node_cache.start()
    pods = PodCache(kubeconfig=args.kubeconfig, keys=policy.keys, metrics=metrics)
    applied = pods._on_event  # the watch thread's hook: an event is visible once it returns

    def on_event(kind: str, obj: Any) -> bool:
        changed = applied(kind, obj)
        spec = obj.spec
        if kind != "DELETED" and spec is not None and spec.nodeName and obj.metadata.name:
            recorder.bind(obj.metadata.name, spec.nodeName, time.time())
        return changed

    pods._on_event = on_event  # type: ignore[method-assign]
    if node_cache is not None:
        pods.add_sink(node_cache.store)
    pods.start()

    class RecordingApp(ScorerApp):
        def handle(self, verb: Any, body: Any, *, query: bytes = b"") -> Any:
            at = time.time()
            if verb == "filter":
                with contextlib.suppress(msgspec.DecodeError):
                    pod = _ARGS.decode(body).pod
                    if pod is not None and pod.metadata is not None and pod.metadata.name:
                        recorder.filter(pod.metadata.name, at)
            response = super().handle(verb, body, query=query)
            recorder.handle(str(verb), time.time() - at)
            return response

    app = RecordingApp(
        policy=policy,
        node_store=None if node_cache is None else node_cache.store,
        metrics=metrics,
        pods_of=None if names_only else pods.pods_of,
        placements=pods if args.proposals == "on" else None,
    )
    server = HttpServer(app, host="127.0.0.1", port=args.port).start()
    ready = pods.wait_until(lambda c: c.active, 60) and (
        node_cache is None or node_cache.wait_until(lambda c: c.store.ready(), 60)
    )
    _answer({"ready": bool(ready)})
    try:
        for line in sys.stdin:
            command = json.loads(line)["cmd"]
            if command == "take":
                _answer(recorder.take())
            elif command == "pods":
                _answer({"pods": len(pods), "proposals": pods.proposals()})
            else:
                break
    finally:
        server.stop()
        pods.stop()
        if node_cache is not None:
            node_cache.stop()
    return 0


def _answer(value: Any) -> None:
    sys.stdout.write(json.dumps(value) + "\n")
    sys.stdout.flush()


@dataclass
class ChildScorer:
    """The parent's handle on one child scorer."""

    mode: str
    proposals: bool
    port: int
    popen: subprocess.Popen[str]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def ask(self, command: str) -> Any:
        assert self.popen.stdin is not None
        assert self.popen.stdout is not None
        self.popen.stdin.write(json.dumps({"cmd": command}) + "\n")
        self.popen.stdin.flush()
        line = self.popen.stdout.readline()
        if not line:
            raise RuntimeError(f"the {self.mode} scorer exited (see its log)")
        return json.loads(line)

    def quit(self) -> None:
        with contextlib.suppress(OSError):
            assert self.popen.stdin is not None
            self.popen.stdin.write(json.dumps({"cmd": "quit"}) + "\n")
            self.popen.stdin.close()
        try:
            self.popen.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait()


@contextlib.contextmanager
def child_scorer(
    plane: ControlPlane, mode: str, proposals: bool, log: IO[str]
) -> Iterator[ChildScorer]:
    port = free_port()
    argv = [
        sys.executable,
        "-m",
        "benchmarks.bind_lag",
        "scorer",
        f"--mode={mode}",
        f"--proposals={'on' if proposals else 'off'}",
        f"--port={port}",
        f"--kubeconfig={plane.admin_kubeconfig}",
    ]
    popen = subprocess.Popen(
        argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True
    )
    child = ChildScorer(mode, proposals, port, popen)
    try:
        assert popen.stdout is not None
        started = json.loads(popen.stdout.readline() or "{}")
        if not started.get("ready"):
            raise RuntimeError(f"the {mode} scorer did not become ready (see its log)")
        yield child
    finally:
        child.quit()


# ----------------------------------------------------------------------------- the layouts


@dataclass(frozen=True)
class Layout:
    name: str
    # node -> its GPUs as (utilization, allocated), and how many one-GPU pods it can take
    nodes: dict[str, tuple[list[tuple[float, bool]], int]]
    pods: int


def fleet(count: int, pods: int) -> Layout:
    nodes: dict[str, tuple[list[tuple[float, bool]], int]] = {}
    half = GPUS // 2
    for i in range(count):
        if i < 2 * len(FOUR_GPU_LEVELS):
            level = FOUR_GPU_LEVELS[i // 2]
            gpus = [(level, False)] * half + [(1.0, True)] * half
            nodes[f"fleet-{i:03d}"] = (gpus, SUITABLE_ON_FOUR_GPU_NODES)
        else:
            level = EVEN_LEVELS[i % len(EVEN_LEVELS)]
            nodes[f"fleet-{i:03d}"] = ([(level, False)] * GPUS, GPUS)
    return Layout("fleet", nodes, pods)


def pair(pods: int) -> Layout:
    half = GPUS // 2
    return Layout(
        "pair",
        {
            "pair-mixed": ([(0.0, False)] * half + [(1.0, True)] * half, half),
            "pair-even": ([(0.55, False)] * GPUS, GPUS),
        },
        pods,
    )


def register_layout(api: KubeApi, layout: Layout) -> None:
    for name in layout.nodes:
        register_node(api, gpu_node(name, gpu_count=GPUS, labels={LAYOUT_LABEL: layout.name}))


def publish_layout(api: KubeApi, layout: Layout) -> None:
    at = datetime.now(UTC)
    for name, (gpus, _) in layout.nodes.items():
        publish(api, name, per_gpu_node_state(gpus, at=at))


# ----------------------------------------------------------------------------- one burst


@dataclass
class Burst:
    mode: str
    proposals: bool
    layout: str
    round: int
    # Per filter after the burst's first: seconds the previous pod's bind came after it in
    # the watch (negative: it was there already), and the earlier pods not yet in the watch.
    lag_s: list[float] = field(default_factory=list)
    unseen: list[int] = field(default_factory=list)
    # Per pod: seconds from its first filter to its bind in the watch.
    own_s: list[float] = field(default_factory=list)
    placed: dict[str, int] = field(default_factory=dict)
    # Pods beyond a node's suitable GPUs, summed over the nodes.
    overfilled: int = 0
    retried_filters: int = 0
    # From the first filter to the last bind in the watch.
    span_s: float = 0.0
    handled_s: dict[str, list[float]] = field(default_factory=dict)


class Collected:
    """The child's records of one burst, taken from it until every pod's bind is in."""

    def __init__(self, scorer: ChildScorer, wanted: set[str]) -> None:
        self.scorer = scorer
        self.wanted = wanted
        self.filters: list[Sequence[Any]] = []
        self.binds: dict[str, Sequence[Any]] = {}
        self.handled: dict[str, list[float]] = {}

    def done(self) -> bool:
        seen = self.scorer.ask("take")
        self.filters += seen["filters"]
        self.binds.update(seen["binds"])
        for verb, seconds in seen["handled"].items():
            self.handled.setdefault(verb, []).extend(seconds)
        return self.wanted <= set(self.binds)


def run_burst(plane: ControlPlane, scorer: ChildScorer, layout: Layout, round_index: int) -> Burst:
    mode = scorer.mode
    scheduler_name = f"lag-{mode}-{'on' if scorer.proposals else 'off'}"
    prefix = f"{layout.name}-{scheduler_name}-r{round_index}"
    names = [f"{prefix}-{i:03d}" for i in range(layout.pods)]
    with plane.admin() as api:
        publish_layout(api, layout)
        time.sleep(SETTLE_S)  # the child's node cache; the fresh scheduler lists anyway
        scorer.ask("take")  # forget what came before
        for name in names:
            pod = gpu_pod(name, scheduler_name=scheduler_name)
            pod["spec"]["nodeSelector"] = {LAYOUT_LABEL: layout.name}
            api.create("/api/v1/namespaces/default/pods", pod)
        extender = ExtenderConfig(scorer.url, node_cache_capable=mode == "names", ignorable=False)
        plane.start_scheduler(SchedulerConfig(scheduler_name, extender))
        try:
            collected = Collected(scorer, set(names))
            wait_for(f"{len(names)} binds in the scorer's watch", collected.done, timeout_s=180)
        finally:
            plane.stop_scheduler(f"kube-scheduler-{scheduler_name}")
            for name in names:
                api.delete(f"/api/v1/namespaces/default/pods/{name}")
        wait_for(
            "the scorer's watch to drop the burst",
            lambda: scorer.ask("pods")["pods"] == 0,
            timeout_s=60,
            interval_s=0.2,
        )
    burst = analyse(mode, scorer.proposals, layout, round_index, collected.filters, collected.binds)
    burst.handled_s = collected.handled
    return burst


def analyse(  # noqa: PLR0917 (one burst's records)
    mode: str,
    proposals: bool,
    layout: Layout,
    round_index: int,
    filters: Sequence[Sequence[Any]],
    binds: dict[str, Sequence[Any]],
) -> Burst:
    burst = Burst(mode, proposals, layout.name, round_index)
    first: dict[str, float] = {}
    for name, at in filters:
        if name in first:
            burst.retried_filters += 1
        else:
            first[name] = float(at)
    order = sorted(first, key=first.__getitem__)
    seen = {name: float(at) for name, (_, at) in binds.items()}
    for previous, current in itertools.pairwise(order):
        at = first[current]
        burst.lag_s.append(seen[previous] - at)
        burst.unseen.append(sum(1 for p in order if first[p] < at and seen[p] > at))
    burst.own_s = [seen[name] - first[name] for name in order]
    if order:
        burst.span_s = max(seen.values()) - first[order[0]]
    placed = Counter(str(node) for node, _ in binds.values())
    burst.placed = dict(sorted(placed.items()))
    burst.overfilled = sum(
        max(0, placed.get(node, 0) - suitable) for node, (_, suitable) in layout.nodes.items()
    )
    return burst


# ----------------------------------------------------------------------------- the report


def _ms(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(1000 * ordered[min(len(ordered) - 1, int(q * len(ordered)))], 1)


def summarise(bursts: Sequence[Burst]) -> dict[str, Any]:
    lags = [lag for b in bursts for lag in b.lag_s]
    late = [lag for lag in lags if lag > 0]
    unseen = [u for b in bursts for u in b.unseen]
    own = [s for b in bursts for s in b.own_s]
    return {
        "bursts": len(bursts),
        "filters_after_the_first": len(lags),
        "before_previous_bind_seen": round(len(late) / len(lags), 3) if lags else None,
        "late_by_ms_median": _ms(late, 0.5),
        "late_by_ms_p90": _ms(late, 0.9),
        "unseen_at_filter_median": statistics.median(unseen) if unseen else None,
        "unseen_at_filter_max": max(unseen, default=None),
        "filter_to_own_bind_seen_ms_median": _ms(own, 0.5),
        "filter_to_own_bind_seen_ms_p90": _ms(own, 0.9),
        "burst_span_ms_median": _ms([b.span_s for b in bursts], 0.5),
        "handled_ms_mean": {
            verb: round(1000 * statistics.fmean(times), 2)
            for verb in ("filter", "prioritize")
            if (times := [t for b in bursts for t in b.handled_s.get(verb, ())])
        },
        "overfilled_pods": [b.overfilled for b in bursts],
        "placed": [b.placed for b in bursts],
        "retried_filters": sum(b.retried_filters for b in bursts),
    }


def render(results: dict[str, dict[str, Any]]) -> str:
    lines = []
    for key, s in results.items():
        lines.append(
            f"{key}: {s['bursts']} bursts, {s['filters_after_the_first']} filters after the "
            f"first; before the previous bind was seen: {s['before_previous_bind_seen']}, "
            f"late by median {s['late_by_ms_median']} ms, p90 {s['late_by_ms_p90']} ms; "
            f"earlier pods unseen at a filter: median {s['unseen_at_filter_median']}, max "
            f"{s['unseen_at_filter_max']}; filter to own bind seen: median "
            f"{s['filter_to_own_bind_seen_ms_median']} ms, p90 "
            f"{s['filter_to_own_bind_seen_ms_p90']} ms; burst span median "
            f"{s['burst_span_ms_median']} ms; scorer ms per call {s['handled_ms_mean']}; "
            f"pods beyond suitable GPUs per burst: "
            f"{s['overfilled_pods']}; retried filters: {s['retried_filters']}"
        )
        if key.endswith("pair"):
            lines.append(f"    placements: {s['placed']}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> dict[str, Any]:
    layouts = [fleet(args.nodes, args.pods), pair(args.pair_pods)]
    results: dict[str, dict[str, Any]] = {}
    with (
        tempfile.TemporaryDirectory(prefix="bind-lag-") as tmp,
        running_control_plane(Path(tmp) / "plane") as plane,
        (args.log or Path(tmp) / "scorers.log").open("w") as log,
    ):
        with plane.admin() as api:
            for layout in layouts:
                register_layout(api, layout)
        for mode in args.modes:
            for proposals in (True, False):
                with child_scorer(plane, mode, proposals, log) as scorer:
                    for layout in layouts:
                        bursts = [run_burst(plane, scorer, layout, r) for r in range(args.rounds)]
                        key = f"{mode} proposals {'on' if proposals else 'off'} {layout.name}"
                        results[key] = summarise(bursts)
                        print(render({key: results[key]}), file=sys.stderr, flush=True)
    return {
        "machine": machine_description(),
        "nodes": args.nodes,
        "pods": args.pods,
        "pair_pods": args.pair_pods,
        "rounds": args.rounds,
        "results": results,
    }


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["scorer"]:
        child = argparse.ArgumentParser(prog="bind_lag scorer")
        child.add_argument("--mode", choices=MODES, required=True)
        child.add_argument("--proposals", choices=("on", "off"), required=True)
        child.add_argument("--port", type=int, required=True)
        child.add_argument("--kubeconfig", required=True)
        return serve_scorer(child.parse_args(argv[1:]))
    exit_on_sigterm()  # a stopped run stops its control plane and scorers too
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bind_lag", description=__doc__)
    parser.add_argument("--nodes", type=int, default=50)
    parser.add_argument("--pods", type=int, default=40)
    parser.add_argument("--pair-pods", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--modes", type=lambda text: tuple(text.split(",")), default=MODES, help="names,full"
    )
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument("--log", type=Path, help="keep the child scorers' logs in this file")
    args = parser.parse_args(argv)
    report = run(args)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(f"machine: {report['machine']}")
        print(render(report["results"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
