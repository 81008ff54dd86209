"""The whole loop on one machine, on loopback: `python -m demo` (or `python3 dev.py demo`).

It starts, in this one process:

- the local Kubernetes API stand-in (`kube_standins.apiserver`) holding N GPU Nodes of mixed models;
- one real agent per node (the agent's own tick, its simulated GPU source, its rate limiter and
  its Kubernetes client writing merge patches over HTTP to the stand-in);
- the real scorer serving the extender over HTTP, names only by default as the chart deploys it
  (the scorer list+watches the stand-in), or with full Node objects in each request with
  `--no-node-cache`;
- a driver that plays kube-scheduler for a seeded stream of GPU pods
  (`kube_standins.scheduler_driver`); a bound pod adds load to its node's simulated GPUs, so the
  agent's next writes show it;

and shows it all live (`demo.tui`), or as plain lines with `--no-tui`, until `--duration`
ends, then prints a summary. Nothing leaves 127.0.0.1, nothing needs a GPU or a cluster, and
Ctrl-C stops every thread and server before exiting.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import random
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Final, TextIO

from rich.console import Console, RenderableType
from rich.live import Live

from demo import parts
from demo.options import DemoOptions, NodePlan
from demo.parts import DemoAgent
from demo.real_cluster import RealCluster, RealSchedulerDriver
from demo.tui import (
    DemoSnapshot,
    LatencyFigures,
    NodeView,
    attempt_line,
    render,
    summary_lines,
    write_line,
)
from gpu_contract.schema import DEFAULT_PREFIX, Field, parse_timestamp
from kube_standins.scheduler_driver import (
    Attempt,
    DriverConfig,
    ExtenderClient,
    PodFactory,
    PodSpec,
    SchedulerDriver,
    allocatable_gpus,
    short_model_name,
)
from loopback_cluster.control_plane import ClusterError

# The fleet cycles through these (product name as NVML reports it, GPUs per node): A100 and V100
# first, so the preference chain "A100,V100" has both ranks and a fallback to show.
FLEET: Final[tuple[tuple[str, int], ...]] = (
    ("NVIDIA A100-SXM4-80GB", 8),
    ("Tesla V100-SXM2-32GB", 8),
    ("NVIDIA H100 80GB HBM3", 8),
    ("Tesla T4", 4),
    ("NVIDIA A100-SXM4-80GB", 8),
    ("Tesla V100-SXM2-32GB", 8),
    ("NVIDIA L4", 4),
    ("NVIDIA H100 80GB HBM3", 8),
)

TOKEN: Final = "demo-token"

_log = logging.getLogger(__name__)


def plan_fleet(count: int) -> list[NodePlan]:
    """Node names and models: `gpu-a100-0`, `gpu-v100-1`, ... cycling through `FLEET`."""
    plans: list[NodePlan] = []
    for i in range(count):
        product, gpus = FLEET[i % len(FLEET)]
        plans.append(NodePlan(f"gpu-{short_model_name(product).lower()}-{i}", product, gpus))
    return plans


# ----------------------------------------------------------------------------------------------
# The parts, each behind a small adapter so the orchestration reads as a list of steps.


class PodStream:
    """Poisson arrivals of seeded pods, stepped by the driver thread."""

    def __init__(self, *, seed: int, pods_per_s: float) -> None:
        self._factory = PodFactory(seed=seed)
        self._rng = random.Random(seed + 1)
        self._rate = pods_per_s
        self._next_s = self._gap()
        self.submitted = 0

    def _gap(self) -> float:
        return self._rng.expovariate(self._rate) if self._rate > 0 else float("inf")

    def due(self, now_s: float) -> Iterator[PodSpec]:
        while self._next_s <= now_s:
            self._next_s += self._gap()
            self.submitted += 1
            yield self._factory.next()


@dataclass(slots=True)
class Running:
    """Everything the demo started, so that `stop` can undo it in reverse order."""

    stops: list[Callable[[], None]] = field(default_factory=list)

    def close(self) -> None:
        while self.stops:
            stop = self.stops.pop()
            with contextlib.suppress(Exception):
                stop()


class Demo:
    """Starts the parts, runs the pod stream, and gives consistent snapshots to the view."""

    def __init__(
        self, options: DemoOptions, *, workdir: Path, logs: _LogTail | None = None
    ) -> None:
        self.options = options
        self._logs = logs
        self.started = False
        self._workdir = workdir
        self._running = Running()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._started_at = time.monotonic()
        self.plans = plan_fleet(options.nodes)
        self.models = {p.name: short_model_name(p.product) for p in self.plans}
        self.stream = PodStream(seed=options.seed, pods_per_s=options.pods_per_s)
        self._api: parts.ClusterView | None = None
        self._real: RealCluster | None = None
        self.agents: list[DemoAgent] = []
        self.driver: SchedulerDriver | RealSchedulerDriver | None = None
        self.extender_url = ""
        self._driver_thread = threading.Thread(
            target=self._drive, name="demo-scheduler", daemon=True
        )

    # -- start and stop -------------------------------------------------------------------------

    def start(self) -> None:
        try:
            if self.options.cluster == "real":
                self._start_real()
            else:
                self._start_standin()
            self._started_at = time.monotonic()
            self._driver_thread.start()
            self._running.stops.append(self.halt_driver)
            self.started = True
        except BaseException:
            self.stop()
            raise

    def _start_standin(self) -> None:
        standin = parts.start_apiserver(self.plans, token=TOKEN, running=self._running)
        self._api = standin
        kubeconfig = self._workdir / "kubeconfig"
        standin.write_kubeconfig(kubeconfig)
        self._start_agents_and_scorer(kubeconfig)
        extender = ExtenderClient(self.extender_url)
        self._running.stops.append(extender.close)
        self.driver = SchedulerDriver(
            extender=extender,
            list_nodes=standin.nodes,
            config=DriverConfig(
                mode="names" if self.options.node_cache else "full",
                weight=self.options.extender_weight,
                seed=self.options.seed,
            ),
            load=parts.SimulatedLoad({a.node_name: a.source for a in self.agents}),
        )

    def _start_real(self) -> None:
        real = RealCluster(self._workdir)
        self._real = real
        self._running.stops.append(real.stop)
        real.start([(p.name, p.product, p.gpus) for p in self.plans])
        self._api = real
        self._start_agents_and_scorer(real.kubeconfig)
        real.watch_agents({a.node_name: a.agent.metrics for a in self.agents})
        real.start_scheduler(
            self.extender_url,
            node_cache=self.options.node_cache,
            weight=self.options.extender_weight,
        )
        self.driver = RealSchedulerDriver(
            real, load=parts.SimulatedLoad({a.node_name: a.source for a in self.agents})
        )

    def _start_agents_and_scorer(self, kubeconfig: Path) -> None:
        self.agents = parts.start_agents(
            self.plans, kubeconfig=kubeconfig, options=self.options, running=self._running
        )
        self.extender_url = parts.start_scorer(
            node_cache=self.options.node_cache,
            kubeconfig=kubeconfig,
            stale_after_s=3 * self.options.heartbeat_s,
            running=self._running,
        )
        # Pods start once every node carries data, as in a cluster whose DaemonSet is up.
        parts.wait_for_first_writes(
            self.api,
            [p.name for p in self.plans],
            timeout_s=2 * self.options.min_write_interval_s + 5,
        )

    @property
    def api(self) -> parts.ClusterView:
        if self._api is None:
            raise RuntimeError("the demo has not started its API server")
        return self._api

    def halt_driver(self) -> None:
        self._stop.set()
        if self._driver_thread.is_alive():
            self._driver_thread.join(timeout=10)

    def stop(self) -> None:
        self._stop.set()
        self._running.close()

    def elapsed_s(self) -> float:
        return time.monotonic() - self._started_at

    # -- the scheduler loop ---------------------------------------------------------------------

    def _drive(self) -> None:
        assert self.driver is not None
        while not self._stop.is_set():
            now_s = self.elapsed_s()
            try:
                with self._lock:
                    for pod in self.stream.due(now_s):
                        self.driver.submit(pod, now_s=now_s)
                    self.driver.step(now_s=now_s)
            except Exception:
                # Keep scheduling: a bug in one cycle shows up in the view, not as a frozen demo.
                _log.exception("scheduling cycle failed")
            self._stop.wait(0.05)

    # -- what the view shows --------------------------------------------------------------------

    def snapshot(self) -> DemoSnapshot:
        now = datetime.now(UTC)
        driver = self.driver
        nodes: list[NodeView] = []
        with self._lock:
            node_objects = {str(n["metadata"]["name"]): n for n in self.api.nodes()}
            agents = {a.node_name: a for a in self.agents}
            for plan in self.plans:
                node = node_objects.get(plan.name, {})
                agent = agents.get(plan.name)
                annotations = {
                    k: str(v)
                    for k, v in (node.get("metadata", {}).get("annotations") or {}).items()
                    if k.startswith(DEFAULT_PREFIX)
                }
                updated = parse_timestamp(annotations.get(DEFAULT_PREFIX + Field.UPDATED_AT, ""))
                nodes.append(
                    NodeView(
                        name=plan.name,
                        model=self.models[plan.name],
                        gpus_total=allocatable_gpus(node) if node else plan.gpus,
                        gpus_used=driver.allocation.used(plan.name) if driver else 0,
                        annotations=annotations,
                        data_age_s=None if updated is None else (now - updated).total_seconds(),
                        # What reached the API server, not what the agents think they sent.
                        writes=self.api.node_writes(plan.name),
                        samples=agent.samples() if agent else 0,
                    )
                )
            attempts: list[Attempt] = list(driver.attempts) if driver else []
            latency = driver.latency_ms() if driver else {}
            focus = next((a.node for a in reversed(attempts) if a.node), None)
            return DemoSnapshot(
                elapsed_s=self.elapsed_s(),
                duration_s=self.options.duration_s,
                mode=(
                    ("names-only, node cache" if self.options.node_cache else "full nodes")
                    + (", real kube-scheduler" if self.options.cluster == "real" else "")
                ),
                extender_url=self.extender_url,
                settings_line=self.options.settings_line(),
                nodes=nodes,
                attempts=attempts,
                pods_submitted=self.stream.submitted,
                pods_placed=driver.placed_pods() if driver else 0,
                pods_pending=driver.pending_pods() if driver else 0,
                pods_running=len(driver.allocation.running()) if driver else 0,
                pods_finished=len(driver.finished) if driver else 0,
                latency=(
                    LatencyFigures(
                        count=int(latency["count"]),
                        p50_ms=latency["p50"],
                        p99_ms=latency["p99"],
                        max_ms=latency["max"],
                    )
                    if latency
                    else None
                ),
                focus_node=focus,
                notes=tuple(self._logs.lines) if self._logs else (),
                running_pods=frozenset(
                    b.pod.name for b in (driver.allocation.running() if driver else [])
                ),
            )


# ----------------------------------------------------------------------------------------------
# Running it


@dataclass(frozen=True, slots=True)
class DemoOutcome:
    # The last view of the parts; None only when interrupted before every part had started.
    final: DemoSnapshot | None
    interrupted: bool


def run(options: DemoOptions, *, out: TextIO = sys.stdout) -> DemoOutcome:
    """Run the demo to its end (or Ctrl-C), print the summary, and return what it saw."""
    final: DemoSnapshot | None = None
    interrupted = False
    with (
        TemporaryDirectory(prefix="gpu-demo-") as scratch,
        _collect_logs(echo=None if options.tui else out) as logs,
    ):
        demo = Demo(options, workdir=Path(scratch), logs=logs)
        cluster_words = (
            "etcd, kube-apiserver and kube-scheduler v1.37"
            if options.cluster == "real"
            else "the API stand-in"
        )
        try:
            print(
                f"starting on 127.0.0.1: {cluster_words} with {options.nodes} GPU nodes, "
                f"{options.nodes} agents, the scorer"
                f"{' (node cache)' if options.node_cache else ''}; pods start once every "
                "node has reported ...",
                file=out,
                flush=True,
            )
            demo.start()
            if options.tui:
                _run_live(demo, out)
            else:
                _run_plain(demo, out)
        except KeyboardInterrupt:
            interrupted = True
        finally:
            # Stop placing pods first, so the summary matches what the parts last did.
            demo.halt_driver()
            if demo.started:
                final = demo.snapshot()
            demo.stop()
    if options.tui:
        print(file=out)
    if interrupted:
        print("interrupted: every server and thread stopped", file=out)
    if final is not None:
        for line in summary_lines(final):
            print(line, file=out)
    return DemoOutcome(final, interrupted)


class _LogTail(logging.Handler):
    """Keeps the last warnings of the parts for the view, instead of letting them garble it."""

    def __init__(self, keep: int = 4) -> None:
        super().__init__(level=logging.WARNING)
        self.lines: deque[str] = deque(maxlen=keep)
        self.setFormatter(logging.Formatter("%(name)s: %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        with contextlib.suppress(Exception):
            self.lines.append(self.format(record))


@contextlib.contextmanager
def _collect_logs(*, echo: TextIO | None) -> Iterator[_LogTail]:
    """Route warnings of every part to the view (and to `echo`, in plain mode) while running."""
    root = logging.getLogger()
    tail = _LogTail()
    saved = root.handlers[:], root.level
    root.handlers = [tail]
    if echo is not None:
        plain = logging.StreamHandler(echo)
        plain.setFormatter(logging.Formatter("[warning] %(name)s: %(message)s"))
        root.handlers.append(plain)
    root.setLevel(logging.WARNING)
    try:
        yield tail
    finally:
        root.handlers, level = saved
        root.setLevel(level)


def _run_plain(demo: Demo, out: TextIO) -> None:
    print(demo.options.settings_line(), file=out, flush=True)
    where = "kube-apiserver" if demo.options.cluster == "real" else "API stand-in"
    print(f"extender at {demo.extender_url}; {where} at {demo.api.url}", file=out)
    shown_attempts = 0
    shown_updates: dict[str, str] = {}
    # A pending pod is retried with back-off; print it again only when its reasons change.
    shown_pending: dict[str, str] = {}
    while demo.elapsed_s() < demo.options.duration_s:
        time.sleep(min(0.2, max(0.0, demo.options.duration_s - demo.elapsed_s())))
        snap = demo.snapshot()
        for node in snap.nodes:
            stamp = node.annotations.get(DEFAULT_PREFIX + Field.UPDATED_AT, "")
            if stamp and shown_updates.get(node.name) != stamp:
                shown_updates[node.name] = stamp
                print(write_line(snap.elapsed_s, node), file=out)
        for attempt in list(snap.attempts)[shown_attempts:]:
            line = attempt_line(attempt, total_nodes=len(snap.nodes), models=demo.models)
            if attempt.node is None:
                reasons = line.split(" pending: ", 1)[-1]
                if shown_pending.get(attempt.pod.name) == reasons:
                    continue
                shown_pending[attempt.pod.name] = reasons
            print(line, file=out)
        shown_attempts = len(snap.attempts)
        out.flush()


def _run_live(demo: Demo, out: TextIO) -> None:
    console = Console(file=out)
    period_s = 1.0 / demo.options.refresh_per_s

    def screen() -> RenderableType:
        return render(demo.snapshot(), height=console.size.height)

    with Live(
        screen(),
        console=console,
        refresh_per_second=demo.options.refresh_per_s,
        screen=False,
        transient=False,
    ) as live:
        while demo.elapsed_s() < demo.options.duration_s:
            time.sleep(period_s)
            live.update(screen())


def parse_args(argv: Sequence[str] | None = None) -> DemoOptions:
    defaults = DemoOptions()
    parser = argparse.ArgumentParser(
        prog="python -m demo",
        description="Run the agent, the scorer and a kube-scheduler stand-in on loopback, "
        "with simulated GPUs, and watch pods being placed with reasons.",
    )
    parser.add_argument(
        "--duration",
        type=float,
        default=defaults.duration_s,
        help="seconds to run before the summary (default %(default)s)",
    )
    parser.add_argument(
        "--nodes",
        type=int,
        default=defaults.nodes,
        help="simulated GPU nodes, mixed models, 1..200 (default %(default)s)",
    )
    parser.add_argument(
        "--seed",
        type=int,
        default=defaults.seed,
        help="seed of the pod stream, the GPU traces and tie breaks (default %(default)s)",
    )
    parser.add_argument(
        "--pods-per-s",
        type=float,
        default=defaults.pods_per_s,
        help="mean pod arrival rate (default %(default)s)",
    )
    parser.add_argument(
        "--node-cache",
        action=argparse.BooleanOptionalAction,
        default=defaults.node_cache,
        help="names-only mode, the chart's default: the scorer list+watches Nodes itself "
        "(nodeCacheCapable: true); --no-node-cache sends full Nodes (default %(default)s)",
    )
    parser.add_argument(
        "--cluster",
        choices=("standin", "real"),
        default=defaults.cluster,
        help="standin: the embedded API stand-in and scheduler driver (default); real: "
        "kube-apiserver and kube-scheduler v1.37 on loopback (python3 dev.py cluster build)",
    )
    parser.add_argument(
        "--no-tui",
        action="store_true",
        help="print plain lines instead of the live view (for logs)",
    )
    parser.add_argument(
        "--sample-interval",
        type=float,
        default=defaults.sample_interval_s,
        help="agents' sample interval, seconds (default %(default)s)",
    )
    parser.add_argument(
        "--min-write-interval",
        type=float,
        default=defaults.min_write_interval_s,
        help="agents' minimum write interval, seconds (default %(default)s)",
    )
    parser.add_argument(
        "--heartbeat",
        type=float,
        default=defaults.heartbeat_s,
        help="agents' heartbeat, seconds (default %(default)s)",
    )
    args = parser.parse_args(argv)
    if args.duration <= 0:
        parser.error("--duration must be > 0")
    if not 1 <= args.nodes <= 200:
        parser.error("--nodes must be between 1 and 200")
    if args.pods_per_s < 0:
        parser.error("--pods-per-s must be >= 0")
    if not 0 < args.sample_interval <= args.min_write_interval <= args.heartbeat:
        parser.error("need 0 < --sample-interval <= --min-write-interval <= --heartbeat")
    return DemoOptions(
        duration_s=args.duration,
        nodes=args.nodes,
        seed=args.seed,
        node_cache=args.node_cache,
        cluster=args.cluster,
        tui=not args.no_tui,
        pods_per_s=args.pods_per_s,
        sample_interval_s=args.sample_interval,
        min_write_interval_s=args.min_write_interval,
        heartbeat_s=args.heartbeat,
    )


def main(argv: Sequence[str] | None = None) -> int:
    options = parse_args(argv)
    try:
        outcome = run(options)
    except ClusterError as exc:  # binaries not built, a port taken, a process that died
        print(f"demo: {exc}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        # The reader went away (`... | head`): every part is already stopped; exit quietly
        # instead of a traceback, and keep Python from failing again on flushing stdout.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    # 130 = 128 + SIGINT, what a shell reports for a program ended by Ctrl-C.
    return 130 if outcome.interrupted else 0


if __name__ == "__main__":
    sys.exit(main())
