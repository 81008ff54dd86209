"""Agent cost per tick and the daemon's peak memory.

What a tick costs on the node, apart from NVML: aggregating the reading, the write decision, and
building and serialising the merge patch body. Measured per tick for 1 and 8 simulated GPUs as CPU
time (`time.process_time_ns`) and wall time (`time.perf_counter_ns`), reported as median and p99.
Beside it, `Agent.tick` itself (metrics included, replayed readings, a writer without I/O) shows
what the daemon's own bookkeeping adds.
Reading the source is timed separately (for the simulated source it is the trace's cost, not
NVML's; the real NVML time per tick comes from `pytest -m gpu` on a GPU machine).

Peak RSS: a real `gpu-agent run --source simulated` process against the local API server stand-in
and a kubelet pod-resources stand-in (a real gRPC server), sampling every 0.5 s for a few seconds;
`VmHWM` from /proc/<pid>/status. Measured side by side: as `python` runs it and as `python -OO`
(docstrings dropped; see docs/agent.md, Footprint), each with and without `--pod-resources`
(the difference is what loading grpc costs).

    python -m benchmarks.agent_tick            # table
    python -m benchmarks.agent_tick --json     # one JSON object (for benchmarks.figures)
    python -m benchmarks.agent_tick --image    # also the daemon run from the built image (root)

Targets: <= 5 ms per tick for 8 GPUs (excluding NVML), <= 80 MB peak RSS.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path, PurePosixPath
from typing import Any

from agent.aggregate import aggregate
from agent.daemon import Agent, memory_total_mib
from agent.limiter import LimiterState, WritePolicy, decide, record_success
from agent.podresources_wire import ContainerDevices, DeviceGroup
from agent.records import DeviceAllocations, NodeReading
from agent.simulated import SimulatedSource
from agent.sources import open_source
from benchmarks.machine import machine_description
from gpu_contract.schema import DEFAULT_KEYS, encode, merge_patch
from kube_standins.apiserver import ApiServerStandIn
from kube_standins.kubelet import PodResourcesStandIn
from loopback_cluster import image

TICK_TARGET_MS = 5.0
RSS_TARGET_MB = 80.0
T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


def _quantiles_ms(samples_ns: list[int]) -> dict[str, float]:
    ordered = sorted(samples_ns)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return {"median_ms": statistics.median(ordered) / 1e6, "p99_ms": p99 / 1e6}


def bench_tick(gpus: int, ticks: int) -> dict[str, Any]:
    """Per-tick cost of aggregate + decide + patch body (encode, merge patch, JSON), and read."""
    source = open_source("simulated", simulated_gpus=gpus, seed=5, start=T0)
    policy = WritePolicy()
    readings: list[NodeReading] = []
    read_wall_ns: list[int] = []
    for step in range(ticks):
        started = time.perf_counter_ns()
        reading = source.read(T0 + timedelta(seconds=5 * step))
        read_wall_ns.append(time.perf_counter_ns() - started)
        # What the kubelet would say: every GPU allocatable, every other one held by a pod.
        uuids = [g.uuid for g in reading.gpus]
        readings.append(
            replace(
                reading,
                allocations=DeviceAllocations(frozenset(uuids), frozenset(uuids[::2])),
            )
        )
    source.close()

    limiter = LimiterState.initial(now_s=0.0)
    cpu_ns: list[int] = []
    wall_ns: list[int] = []
    writes = 0
    for step, reading in enumerate(readings):
        now_s = 5.0 * step
        cpu_start, wall_start = time.process_time_ns(), time.perf_counter_ns()
        state = aggregate(reading)
        annotations = encode(state, DEFAULT_KEYS)
        decision = decide(
            limiter,
            state,
            now_s=now_s,
            memory_total_mib=memory_total_mib(reading),
            policy=policy,
        )
        # The body is built every tick (the `once` command and the dry-run path print it), so its
        # cost counts whether or not this tick writes.
        body = json.dumps(merge_patch(annotations, DEFAULT_KEYS)).encode()
        if decision.write:
            limiter = record_success(limiter, written=state, now_s=now_s)
            writes += 1
        cpu_ns.append(time.process_time_ns() - cpu_start)
        wall_ns.append(time.perf_counter_ns() - wall_start)
        assert body
    return {
        "gpus": gpus,
        "ticks": ticks,
        "writes": writes,
        "agent_tick_cpu": _agent_tick_cpu(readings),
        "cpu": _quantiles_ms(cpu_ns),
        "wall": _quantiles_ms(wall_ns),
        "source_read_wall": _quantiles_ms(read_wall_ns),
    }


class _Replay:
    """A source that hands back recorded readings: the tick's own cost without the trace's."""

    def __init__(self, readings: list[NodeReading]) -> None:
        self._readings = iter(readings)

    def read(self, now: datetime) -> NodeReading:
        return next(self._readings)

    def close(self) -> None:
        return None


class _AcceptingWriter:
    """Accepts every patch without I/O, but builds the body as the real writer does."""

    def patch(self, annotations: Mapping[str, str]) -> None:
        json.dumps(merge_patch(annotations, DEFAULT_KEYS)).encode()


def _agent_tick_cpu(readings: list[NodeReading]) -> dict[str, float]:
    """`Agent.tick` as the daemon runs it (metrics included), API and source I/O excluded."""
    agent = Agent(
        source=_Replay(readings), writer=_AcceptingWriter(), sample_interval_s=5.0, start_s=0.0
    )
    cpu_ns: list[int] = []
    for step in range(len(readings)):
        started = time.process_time_ns()
        agent.tick(now_s=5.0 * step, wall_now=T0 + timedelta(seconds=5 * step))
        cpu_ns.append(time.process_time_ns() - started)
    return _quantiles_ms(cpu_ns)


def _proc_status_kib(pid: int, field: str) -> int | None:
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return None


def _daemon_peak(
    kubeconfig: Path,
    *,
    seconds: float,
    python_flags: list[str],
    env: dict[str, str],
    pod_resources_socket: str | None,
) -> tuple[int | None, int | None, bool, int, str]:
    """Run the daemon for `seconds`; (VmHWM KiB, VmRSS KiB, alive at the end, exit code, stderr)."""
    pod_resources = (
        [f"--pod-resources-socket={pod_resources_socket}"]
        if pod_resources_socket
        else ["--pod-resources=false"]
    )
    argv = [sys.executable, *python_flags, "-m", "agent", *_run_args(kubeconfig), *pod_resources]
    return _peak(argv, env=env, seconds=seconds)


def _run_args(kubeconfig: Path | str) -> list[str]:
    return [
        "run",
        "--source=simulated",
        "--node-name=bench-node",
        f"--kubeconfig={kubeconfig}",
        "--metrics-port=0",
        "--sample-interval-s=0.5",
        "--min-write-interval-s=1",
        "--heartbeat-s=2",
        "--log-level=WARNING",
    ]


def _peak(
    argv: list[str],
    *,
    env: Mapping[str, str] | None,
    seconds: float,
    started: Callable[[], bool] | None = None,
) -> tuple[int | None, int | None, bool, int, str]:
    """Run `argv` (a daemon) for `seconds`, then SIGTERM it; as `_daemon_peak`. With `started`,
    the `seconds` count from when it first holds (at most a minute's wait), so that a slow
    start (a fresh image's files are not in the page cache yet) is not cut short."""
    process = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60.0
        while started is not None and not started() and time.monotonic() < deadline:
            if process.poll() is not None:
                break
            time.sleep(0.1)
        time.sleep(seconds)
        hwm_kib = _proc_status_kib(process.pid, "VmHWM")
        rss_kib = _proc_status_kib(process.pid, "VmRSS")
        alive = process.poll() is None
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    return hwm_kib, rss_kib, alive, process.returncode, stderr.decode(errors="replace")


def _kubelet_for_the_simulated_node(socket_path: str) -> PodResourcesStandIn:
    """A kubelet stand-in that offers the daemon's simulated GPUs and has given half to pods."""
    uuids = [g.uuid for g in SimulatedSource(gpus=8, seed=0).read(T0).gpus]
    kubelet = PodResourcesStandIn(socket_path)
    kubelet.serve(
        allocatable=[DeviceGroup("nvidia.com/gpu", tuple(uuids))],
        containers=[
            ContainerDevices("bench", f"pod-{i}", "main", (DeviceGroup("nvidia.com/gpu", (u,)),))
            for i, u in enumerate(uuids[::2])
        ],
    )
    return kubelet.start()


def bench_rss(
    seconds: float, *, optimize: bool = False, pod_resources: bool = True
) -> dict[str, Any]:
    """Peak RSS of a real daemon writing to the API server stand-in for `seconds`.

    `optimize`: run it as `python -OO` (PYTHONOPTIMIZE=2), which drops docstrings; most of the
    kubernetes client's code is docstrings. Measured with the `.opt-2.pyc` files compiled first
    (an unmeasured import writes them under a private cache prefix), as an image that ships them
    runs: without them every start compiles ~1400 modules and peaks far higher.
    """
    with ApiServerStandIn(token="bench-token") as server, tempfile.TemporaryDirectory() as tmp:
        server.put_node({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "bench-node"}})
        kubeconfig = server.write_kubeconfig(Path(tmp) / "kubeconfig")
        env = {k: v for k, v in os.environ.items() if not k.startswith("GPU_AGENT_")}
        flags: list[str] = []
        if optimize:
            flags = ["-OO"]
            env.pop("PYTHONDONTWRITEBYTECODE", None)
            env["PYTHONPYCACHEPREFIX"] = str(Path(tmp) / "pycache")
            # Compile everything the daemon imports, to the end (a timed run could be cut short
            # by a slow compile and leave the rest to the measured run).
            subprocess.run(
                [
                    sys.executable,
                    *flags,
                    "-c",
                    "import agent.cli, agent.simulated, agent.podresources",
                ],
                env=env,
                check=True,
                timeout=300,
            )
        socket_path = str(Path(tmp) / "kubelet.sock")
        kubelet = _kubelet_for_the_simulated_node(socket_path) if pod_resources else None
        try:
            hwm_kib, rss_kib, alive, code, stderr = _daemon_peak(
                kubeconfig,
                seconds=seconds,
                python_flags=flags,
                env=env,
                pod_resources_socket=socket_path if pod_resources else None,
            )
        finally:
            if kubelet is not None:
                kubelet.stop()
        writes = server.node_writes("bench-node")
        allocated_key = "gpu-scheduler.example.com/per-gpu-allocated"
        published = allocated_key in server.node("bench-node")["metadata"].get("annotations", {})
    if not alive:
        raise RuntimeError("the daemon exited early: " + stderr[-500:])
    return {
        "seconds": seconds,
        "python_flags": flags,
        "peak_rss_mb": None if hwm_kib is None else hwm_kib / 1024,
        "rss_mb": None if rss_kib is None else rss_kib / 1024,
        "writes": writes,
        "exit_code": code,
        "pod_resources": pod_resources,
        "allocations_published": published,
    }


def bench_rss_in_image(seconds: float, *, pod_resources: bool = True) -> dict[str, Any]:
    """Peak RSS of the daemon run from the image (`python3 dev.py image`), as the chart runs it:
    the image's own interpreter and `PYTHONOPTIMIZE=2`, uid 65532, or uid 0 with the kubelet's
    socket (the chart's `podResources.runAsRoot`), a read-only root. Needs root."""
    built, reason = image.current()
    if built is None:
        raise RuntimeError(f"no image to measure: {reason}")
    with ApiServerStandIn(token="bench-token") as server, tempfile.TemporaryDirectory() as tmp:
        server.put_node({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "bench-node"}})
        kube_dir, sockets = Path(tmp) / "kube", Path(tmp) / "pod-resources"
        for folder in (Path(tmp), kube_dir, sockets):
            folder.mkdir(exist_ok=True)
            folder.chmod(0o755)
        server.write_kubeconfig(kube_dir / "kubeconfig").chmod(0o644)
        socket_in_image = "/var/lib/kubelet/pod-resources/kubelet.sock"
        container = image.Container(
            argv=[
                "gpu-agent",
                *_run_args("/etc/bench/kubeconfig"),
                f"--pod-resources-socket={socket_in_image}"
                if pod_resources
                else "--pod-resources=false",
            ],
            uid=0 if pod_resources else image.IMAGE_USER,
            gid=image.IMAGE_USER,
            read_only={
                kube_dir: PurePosixPath("/etc/bench"),
                sockets: PurePosixPath(socket_in_image).parent,
            },
        )
        kubelet = (
            _kubelet_for_the_simulated_node(str(sockets / "kubelet.sock"))
            if pod_resources
            else None
        )
        try:
            with image.mounted(built.image) as rootfs:
                argv = image.container_argv(rootfs, container, image=built.image)
                hwm_kib, rss_kib, alive, code, stderr = _peak(
                    argv,
                    env=None,
                    seconds=seconds,
                    started=lambda: server.node_writes("bench-node") > 0,
                )
        finally:
            if kubelet is not None:
                kubelet.stop()
        writes = server.node_writes("bench-node")
    if not alive:
        raise RuntimeError("the daemon exited early: " + stderr[-500:])
    return {
        "seconds": seconds,
        "image": built.image,
        "peak_rss_mb": None if hwm_kib is None else hwm_kib / 1024,
        "rss_mb": None if rss_kib is None else rss_kib / 1024,
        "writes": writes,
        "exit_code": code,
        "pod_resources": pod_resources,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ticks", type=int, default=2000, help="ticks per GPU count")
    parser.add_argument("--rss-seconds", type=float, default=6.0, help="daemon run time")
    parser.add_argument("--no-rss", action="store_true", help="skip the daemon RSS run")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument(
        "--image", action="store_true", help="also run the daemon from the built image (root)"
    )
    args = parser.parse_args(argv)

    ticks = [bench_tick(gpus, args.ticks) for gpus in (1, 8)]
    rss = None if args.no_rss else bench_rss(args.rss_seconds)
    rss_optimized = None if args.no_rss else bench_rss(args.rss_seconds, optimize=True)
    rss_off = None if args.no_rss else bench_rss(args.rss_seconds, pod_resources=False)
    rss_optimized_off = (
        None if args.no_rss else bench_rss(args.rss_seconds, optimize=True, pod_resources=False)
    )
    result: dict[str, Any] = {
        "machine": machine_description(),
        "targets": {"tick_ms_8_gpus": TICK_TARGET_MS, "peak_rss_mb": RSS_TARGET_MB},
        "ticks": ticks,
        "rss": rss,
        "rss_optimized": rss_optimized,
        "rss_no_pod_resources": rss_off,
        "rss_optimized_no_pod_resources": rss_optimized_off,
    }
    if args.image and not args.no_rss:
        result["rss_image"] = bench_rss_in_image(args.rss_seconds)
        result["rss_image_no_pod_resources"] = bench_rss_in_image(
            args.rss_seconds, pod_resources=False
        )
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"machine: {result['machine']}")
    print(
        f"{'gpus':>4}  {'cpu med ms':>10}  {'cpu p99 ms':>10}  {'wall med ms':>11}  "
        f"{'wall p99 ms':>11}  {'Agent.tick cpu med/p99 ms':>25}  {'read med ms':>11}  "
        f"{'writes/ticks':>12}"
    )
    for row in ticks:
        print(
            f"{row['gpus']:>4}  {row['cpu']['median_ms']:>10.3f}  {row['cpu']['p99_ms']:>10.3f}  "
            f"{row['wall']['median_ms']:>11.3f}  {row['wall']['p99_ms']:>11.3f}  "
            f"{row['agent_tick_cpu']['median_ms']:>12.3f}/{row['agent_tick_cpu']['p99_ms']:<12.3f} "
            f"{row['source_read_wall']['median_ms']:>11.3f}  "
            f"{row['writes']:>5}/{row['ticks']:<6}"
        )
    eight = ticks[1]["cpu"]["median_ms"]
    print(
        f"tick cpu median, 8 gpus: {eight:.3f} ms (target <= {TICK_TARGET_MS} ms); "
        f"8/1 gpu ratio {eight / max(ticks[0]['cpu']['median_ms'], 1e-9):.2f}"
    )
    for label, measured in (
        ("python", rss),
        ("python -OO", rss_optimized),
        ("python, --pod-resources=false", rss_off),
        ("python -OO, --pod-resources=false", rss_optimized_off),
        ("in the image", result.get("rss_image")),
        ("in the image, --pod-resources=false", result.get("rss_image_no_pod_resources")),
    ):
        if measured is None:
            continue
        print(
            f"daemon peak RSS (VmHWM), {label}, after {measured['seconds']:g}s: "
            f"{measured['peak_rss_mb']:.1f} MB (target <= {RSS_TARGET_MB:g} MB), "
            f"{measured['writes']} writes, exit {measured['exit_code']}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
