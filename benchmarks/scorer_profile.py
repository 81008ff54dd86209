"""Where the names-only scorer's time goes while a real kube-scheduler places a burst.

    python -m benchmarks.scorer_profile [--nodes 5000] [--seconds 8] [--rate 50]
        [--modes names,names-no-inflight] [--keep DIR] [--json]

`benchmarks.real_scheduler` says how much slower a burst is placed with the scorer than with a
null extender; `benchmarks.scheduler_profile` says where the scheduler's own CPU goes. This says
where the scorer's goes, and where its requests wait. On the same loopback control plane and
fleet (annotations patched at the fleet's rate), per mode: a calibration burst gives the mode's
pods/s, then a burst sized to outlast the window is placed while, over `--seconds`:

- py-spy (`pip install py-spy`; it reads the scorer's memory with ptrace) samples every thread
  of the scorer with native frames and idle threads included (`--native --idle --threads`), so
  each sample says whether a thread ran, waited for the GIL (CPython 3.11's `take_gil` is a
  `pthread_cond_timedwait`; its locks and `Condition` waits are semaphores) or waited for I/O;
- the scheduler's own Go CPU profile is taken (`/debug/pprof/profile`), read as
  `benchmarks.scheduler_profile` reads it;
- the scorer's CPU (`/proc/<pid>/stat`), its threads' CPU, its context switches, its request
  times (`gpu_scorer_request_duration_seconds`) and its watch events' times are read before and
  after.

Sampling stops the scorer's threads for a moment each time (native frames need ptrace), so the
profiled burst is a little slower than the calibration one; both are reported.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import shutil
import subprocess
import sys
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

from benchmarks.machine import machine_description
from benchmarks.real_scheduler import (
    FLEET_WRITES_PER_NODE_S,
    Config,
    Extender,
    bench,
    measure,
    node_plan,
)
from benchmarks.scheduler_profile import (
    PARTS,
    cumulative_shares,
    fetch_profile,
    part_shares,
    pprof_top,
    sampled_cpu_s,
)
from loopback_cluster.control_plane import ControlPlane

DEFAULT_MODES: Final = ("names", "names-no-inflight")
SCORER_MODES: Final = ("names", "names-no-inflight")
_SPY_SEND: Final = r"HTTPExtender\)\.send$"
# Native leaves that are a thread waiting on the kernel (a socket, a sleep, a lock's semaphore).
_IO_LEAVES: Final = (
    "recv",
    "__libc_recv",
    "poll",
    "__poll",
    "accept",
    "accept4",
    "epoll_wait",
    "select",
    "clock_nanosleep",
    "sem_clockwait",
    "sem_timedwait",
    "sem_wait",
    "do_futex_wait",
    "read",
    "__libc_read",
    "write",
    "sendmsg",
    "send",
    "PyThread_acquire_lock_timed",
)
_GIL_WAIT: Final = ("pthread_cond_timedwait", "pthread_cond_wait")
_LOCK_WAITS: Final = ("_queue_SimpleQueue_get_impl", "PyThread_acquire_lock_timed")
_STACK: Final = re.compile(r"^thread \((?P<tid>\d+)\): (?P<frames>.*) (?P<count>\d+)$")
_NATIVE: Final = re.compile(r"^(?P<name>\S+) \((?P<where>[^)]*)\)$")
_PY_FRAME: Final = re.compile(r"\.py:\d+\)$")


def thread_group(name: str) -> str:
    """A thread's name without its number: the scorer's request threads are `Thread-N (_run)`."""
    if name.startswith("Thread-") and name.endswith("(_run)"):
        return "request threads"
    return re.sub(r"[-_ ]?\d+$", "", name)


@dataclass(slots=True)
class ThreadSamples:
    running: int = 0
    gil_wait: int = 0
    io_wait: int = 0
    # Where a waiting-for-the-GIL thread was (its innermost Python frame) -> samples.
    gil_wait_at: Counter[str] = field(default_factory=Counter)
    # Innermost Python frame of a running sample -> samples.
    running_at: Counter[str] = field(default_factory=Counter)
    # Any Python frame on a running sample's stack (inclusive) -> samples.
    running_under: Counter[str] = field(default_factory=Counter)

    @property
    def total(self) -> int:
        return self.running + self.gil_wait + self.io_wait


def _python_frames(frames: Sequence[str]) -> list[str]:
    return [f for f in frames if _PY_FRAME.search(f)]


def _short(frame: str) -> str:
    """`_judge (exporter_scheduler/serving/verdicts.py:123)` -> `_judge (verdicts.py)`."""
    match = re.match(r"^(?P<fn>.*?) \((?P<path>[^:]*):\d+\)$", frame)
    if match is None:
        return frame
    return f"{match['fn']} ({Path(match['path']).name})"


def classify(frames: Sequence[str]) -> str:
    """running, gil_wait or io_wait, from a native stack's innermost named frames.

    In CPython 3.11 a thread waiting for the GIL sits in `pthread_cond_timedwait` right under
    the C function that gave the GIL up (`take_gil` is inlined there); a lock or `Event`
    wait is in `PyThread_acquire_lock_timed`, a `SimpleQueue.get` in its own condition wait.
    A thread in a system call (recv, sendmsg, write) counts as I/O."""
    named = [
        m["name"]
        for f in frames
        if (m := _NATIVE.match(f)) and not _PY_FRAME.search(f) and not f.startswith("0x")
    ]
    leaf = named[-1] if named else ""
    if leaf in _GIL_WAIT:
        parent = named[-2] if len(named) > 1 else ""
        return "io_wait" if parent in _LOCK_WAITS else "gil_wait"
    if leaf in _IO_LEAVES or leaf.startswith(("__GI___", "__libc_")):
        return "io_wait"
    return "running"


def read_raw(text: str) -> dict[str, ThreadSamples]:
    """py-spy's raw output (`--threads`) by thread group."""
    groups: dict[str, ThreadSamples] = {}
    for line in text.splitlines():
        match = _STACK.match(line.strip())
        if match is None:
            continue
        name, *frames = match["frames"].split(";")
        count = int(match["count"])
        samples = groups.setdefault(thread_group(name), ThreadSamples())
        state = classify(frames)
        python = [_short(f) for f in _python_frames(frames)]
        where = python[-1] if python else "(native)"
        if state == "gil_wait":
            samples.gil_wait += count
            samples.gil_wait_at[where] += count
        elif state == "io_wait":
            samples.io_wait += count
        else:
            samples.running += count
            samples.running_at[where] += count
            for frame in set(python):
                samples.running_under[frame] += count
    return groups


# ----------------------------------------------------------------------------- /proc


def thread_cpu_s(pid: int) -> dict[int, float]:
    """tid -> user + system CPU seconds so far."""
    ticks = 100.0  # USER_HZ on Linux
    found: dict[int, float] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        found[int(task.name)] = (int(fields[11]) + int(fields[12])) / ticks
    return found


def context_switches(pid: int) -> tuple[int, int]:
    """(voluntary, involuntary) context switches of every thread so far."""
    voluntary = involuntary = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            text = (task / "status").read_text()
        except OSError:
            continue
        for line in text.splitlines():
            if line.startswith("voluntary_ctxt_switches:"):
                voluntary += int(line.split()[1])
            elif line.startswith("nonvoluntary_ctxt_switches:"):
                involuntary += int(line.split()[1])
    return voluntary, involuntary


def scorer_metrics(url: str) -> dict[str, float]:
    """The scorer's `_sum` and `_count` series, by name and labels."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as response:
        text = response.read().decode()
    values: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("#") or not ("_sum" in line or "_count" in line):
            continue
        key, _, value = line.rpartition(" ")
        try:
            values[key] = float(value)
        except ValueError:
            continue
    return values


# ----------------------------------------------------------------------------- one mode


@dataclass(slots=True)
class ScorerProfile:
    mode: str
    pods: int
    window_s: float
    calibration_pods_per_s: float
    pods_per_s: float = 0.0
    scorer_cpu_cores: float = 0.0
    # Thread group -> CPU cores over the window (from /proc, not from the samples).
    thread_cores: dict[str, float] = field(default_factory=dict)
    context_switches_per_s: dict[str, float] = field(default_factory=dict)
    # verb or watch -> (mean ms, count) in the window.
    times_ms: dict[str, tuple[float, int]] = field(default_factory=dict)
    # Thread group -> {running, gil_wait, io_wait} samples.
    states: dict[str, dict[str, int]] = field(default_factory=dict)
    samples_per_thread: dict[str, int] = field(default_factory=dict)
    # The request threads: where they waited for the GIL, where they ran (innermost Python
    # frame, and inclusive), as % of their non-idle samples.
    request_gil_wait_at: dict[str, float] = field(default_factory=dict)
    request_running_at: dict[str, float] = field(default_factory=dict)
    request_running_under: dict[str, float] = field(default_factory=dict)
    # Other threads: inclusive % of their running samples, by group.
    running_under: dict[str, dict[str, float]] = field(default_factory=dict)
    scheduler_cpu_cores: float = 0.0
    scheduler_shares: dict[str, float] = field(default_factory=dict)


def _top(counter: Counter[str], total: int, count: int = 12) -> dict[str, float]:
    if not total:
        return {}
    return {k: round(100.0 * v / total, 1) for k, v in counter.most_common(count)}


def py_spy() -> str:
    found = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(found).exists():
        raise SystemExit("py-spy not found: `pip install py-spy` into the virtual environment")
    return found


def profile_mode(  # noqa: PLR0917 (the run's state, passed positionally by one caller)
    plane: ControlPlane,
    mode: str,
    config: Config,
    made: dict[str, Extender],
    seconds: int,
    rate_hz: int,
    scratch: Path,
    progress: Callable[[str], None],
) -> ScorerProfile:
    extender = made[mode]
    assert extender.scorer is not None
    assert extender.process.popen is not None
    pid = extender.process.popen.pid
    url = extender.scorer.url
    most = sum(node_plan(i)[2] for i in range(config.nodes)) // 2
    calibration = measure(plane, mode, 0, config, made, pods=min(config.pods, most))
    wanted = math.ceil(calibration.pods_per_s * (seconds + 3) * 1.5)
    pods = min(max(config.pods, wanted), most)
    raw = scratch / f"{mode}.spy.txt"
    pprof = scratch / f"{mode}.pprof"
    result = ScorerProfile(mode, pods, seconds, round(calibration.pods_per_s, 1))
    taken: dict[str, Any] = {}

    def during(scheduler: Any) -> None:
        fetcher = threading.Thread(
            target=fetch_profile, args=(scheduler, seconds, pprof), daemon=True
        )
        metrics_before = scorer_metrics(url)
        threads_before = thread_cpu_s(pid)
        switches_before = context_switches(pid)
        started = time.monotonic()
        fetcher.start()
        spy = subprocess.run(
            [
                py_spy(),
                "record",
                f"--pid={pid}",
                f"--duration={seconds}",
                f"--rate={rate_hz}",
                "--native",
                "--idle",
                "--threads",
                "--format=raw",
                f"--output={raw}",
            ],
            capture_output=True,
            text=True,
            check=False,
            timeout=seconds + 60,
        )
        elapsed = time.monotonic() - started
        taken["metrics"] = (metrics_before, scorer_metrics(url))
        taken["threads"] = (threads_before, thread_cpu_s(pid))
        taken["switches"] = (switches_before, context_switches(pid))
        taken["elapsed_s"] = elapsed
        fetcher.join(seconds + 60)
        if spy.returncode != 0:
            raise RuntimeError(f"py-spy failed: {spy.stderr.strip()[-600:]}")

    profiled = measure(plane, mode, 1, config, made, pods=pods, while_scheduling=during)
    result.pods_per_s = round(profiled.pods_per_s, 1)
    elapsed = taken["elapsed_s"]
    groups = read_raw(raw.read_text())
    names = _thread_names(raw.read_text())
    before, after = taken["threads"]
    cores: Counter[str] = Counter()
    for tid, cpu in after.items():
        cores[thread_group(names.get(tid, "unsampled"))] += cpu - before.get(tid, 0.0)
    result.thread_cores = {k: round(v / elapsed, 3) for k, v in cores.most_common()}
    result.scorer_cpu_cores = round(sum(cores.values()) / elapsed, 3)
    (v0, i0), (v1, i1) = taken["switches"]
    result.context_switches_per_s = {
        "voluntary": round((v1 - v0) / elapsed),
        "involuntary": round((i1 - i0) / elapsed),
    }
    m0, m1 = taken["metrics"]
    for label, name, labels in (
        ("filter", "gpu_scorer_request_duration_seconds", '{verb="filter"}'),
        ("prioritize", "gpu_scorer_request_duration_seconds", '{verb="prioritize"}'),
        ("node event", "gpu_scorer_node_cache_event_seconds", ""),
        ("pod event", "gpu_scorer_pod_cache_event_seconds", ""),
    ):
        mean, count = _labelled_mean(m0, m1, name, labels)
        result.times_ms[label] = (round(mean, 3), count)
    for group, samples in groups.items():
        result.states[group] = {
            "running": samples.running,
            "gil_wait": samples.gil_wait,
            "io_wait": samples.io_wait,
        }
        result.samples_per_thread[group] = samples.total
        if group != "request threads":
            result.running_under[group] = _top(samples.running_under, samples.running, 10)
    requests = groups.get("request threads", ThreadSamples())
    busy = requests.running + requests.gil_wait
    result.request_gil_wait_at = _top(requests.gil_wait_at, busy)
    result.request_running_at = _top(requests.running_at, busy)
    result.request_running_under = _top(requests.running_under, busy, 20)
    binary = plane.spec.bin_dir / "kube-scheduler"
    whole = pprof_top(binary, pprof)
    in_send = pprof_top(binary, pprof, focus=_SPY_SEND)
    result.scheduler_cpu_cores = round(sampled_cpu_s(whole) / seconds, 3)
    result.scheduler_shares = part_shares(cumulative_shares(whole), cumulative_shares(in_send))
    progress(
        f"  {mode}: {pods} pods, {result.pods_per_s} pods/s (calibration "
        f"{result.calibration_pods_per_s}); scorer {result.scorer_cpu_cores} cores; "
        f"states {result.states}"
    )
    return result


def _labelled_mean(
    before: dict[str, float], after: dict[str, float], name: str, labels: str
) -> tuple[float, int]:
    def get(values: dict[str, float], suffix: str) -> float:
        return values.get(f"{name}{suffix}{labels}", 0.0)

    seconds = get(after, "_sum") - get(before, "_sum")
    count = get(after, "_count") - get(before, "_count")
    return (seconds * 1000 / count if count else 0.0), int(count)


def _thread_names(text: str) -> dict[int, str]:
    names: dict[int, str] = {}
    for line in text.splitlines():
        match = _STACK.match(line.strip())
        if match is not None:
            names[int(match["tid"])] = match["frames"].split(";", 1)[0]
    return names


def run(
    config: Config,
    *,
    seconds: int,
    rate_hz: int,
    progress: Callable[[str], None],
    keep: Path | None = None,
) -> list[ScorerProfile]:
    with bench(config, progress=progress) as ready:
        profiles = [
            profile_mode(
                ready.plane, mode, config, ready.made, seconds, rate_hz, ready.scratch, progress
            )
            for mode in config.modes
        ]
        if keep is not None:
            keep.mkdir(parents=True, exist_ok=True)
            for profile in profiles:
                for suffix in (".spy.txt", ".pprof"):
                    shutil.copy(ready.scratch / f"{profile.mode}{suffix}", keep)
        return profiles


# ----------------------------------------------------------------------------- the document


def _pct(part: int, whole: int) -> str:
    return f"{100.0 * part / whole:.0f} %" if whole else "-"


def markdown_table(profiles: Sequence[ScorerProfile]) -> str:
    header = ["", *(f"`{p.mode}`" for p in profiles)]
    rows: list[list[str]] = [
        ["pods/s (calibration / profiled burst)"]
        + [f"{p.calibration_pods_per_s:.1f} / {p.pods_per_s:.1f}" for p in profiles],
        ["scorer CPU (cores)", *(f"{p.scorer_cpu_cores:.2f}" for p in profiles)],
    ]
    groups = _ordered_groups(profiles)
    for group in groups:
        rows.append(
            [f"  {group} (cores)"] + [f"{p.thread_cores.get(group, 0.0):.3f}" for p in profiles]
        )
    rows.append(
        ["context switches/s (voluntary / involuntary)"]
        + [
            f"{p.context_switches_per_s['voluntary']} / {p.context_switches_per_s['involuntary']}"
            for p in profiles
        ]
    )
    for label in ("filter", "prioritize", "node event", "pod event"):
        rows.append(
            [f"{label}: mean ms (count)"]
            + [
                "-"
                if not p.times_ms.get(label, (0, 0))[1]
                else f"{p.times_ms[label][0]:.2f} ({p.times_ms[label][1]})"
                for p in profiles
            ]
        )
    for group in groups:
        rows.append(
            [f"{group}: running / GIL wait / I/O wait"]
            + [_states(p.states.get(group)) for p in profiles]
        )
    rows.append(["scheduler CPU (cores)", *(f"{p.scheduler_cpu_cores:.2f}" for p in profiles)])
    for label, _, _ in PARTS:
        rows.append(
            [f"scheduler: {label.strip()}"]
            + [f"{p.scheduler_shares.get(label, 0.0):.0f} %" for p in profiles]
        )
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def _states(states: dict[str, int] | None) -> str:
    if not states:
        return "-"
    total = sum(states.values())
    return " / ".join(_pct(states[k], total) for k in ("running", "gil_wait", "io_wait"))


def _ordered_groups(profiles: Iterable[ScorerProfile]) -> list[str]:
    cores: Counter[str] = Counter()
    for p in profiles:
        cores.update(p.thread_cores)
    return [g for g, _ in cores.most_common() if g != "unsampled"]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.scorer_profile", description=__doc__
    )
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--pods", type=int, default=400, help="the calibration burst's pods")
    parser.add_argument("--seconds", type=int, default=8, help="the profile window")
    parser.add_argument("--rate", type=int, default=50, help="py-spy samples per second")
    parser.add_argument("--writes-per-node-s", type=float, default=FLEET_WRITES_PER_NODE_S)
    parser.add_argument(
        "--modes", default=",".join(DEFAULT_MODES), help="of names, names-no-inflight"
    )
    parser.add_argument("--keep", type=Path, help="copy the py-spy and pprof profiles here")
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    args = parser.parse_args(argv)
    modes = tuple(m.strip() for m in args.modes.split(",") if m.strip())
    if not modes or set(modes) - set(SCORER_MODES):
        parser.error(f"--modes: of {', '.join(SCORER_MODES)}")

    def progress(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    config = Config(
        args.nodes, pods=args.pods, writes_per_node_s=args.writes_per_node_s, modes=modes
    )
    profiles = run(
        config, seconds=args.seconds, rate_hz=args.rate, progress=progress, keep=args.keep
    )
    document = {
        "machine": machine_description(),
        "measured_at": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "nodes": args.nodes,
        "profiles": [asdict(p) for p in profiles],
    }
    if args.json:
        print(json.dumps(document, indent=2))
        return 0
    print(f"{document['machine']}, {document['measured_at']}, {args.nodes} nodes")
    print(markdown_table(profiles))
    for p in profiles:
        print(f"\n`{p.mode}` request threads, GIL wait at: {p.request_gil_wait_at}")
        print(f"`{p.mode}` request threads, running in (innermost): {p.request_running_at}")
        print(f"`{p.mode}` request threads, running under: {p.request_running_under}")
        for group, shares in p.running_under.items():
            print(f"`{p.mode}` {group}, running under: {shares}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
