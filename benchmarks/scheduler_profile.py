"""Where a real kube-scheduler's CPU goes with an extender in its loop: a Go CPU profile per mode.

    python -m benchmarks.scheduler_profile [--nodes 5000] [--modes none,names,full,...]
        [--seconds 8] [--json]

`benchmarks.real_scheduler` says how much slower a burst is placed with the extender; this says
why. On the same loopback control plane and fleet (annotations patched at the fleet's rate), per
mode: one calibration burst gives the mode's pods/s; then a burst sized to keep the scheduler busy
for the whole window is placed by a kube-scheduler serving /debug/pprof, and its CPU profile over
`--seconds` is read with `go tool pprof -top -cum` against the same binary (Go from PATH; the
control-plane build needs it anyway).

Reported per mode: the scheduler's CPU over the window (cores), and the share of its samples in
each part of its loop: the scheduling cycle, the filter and score plugins, the extender calls
and, inside them, the JSON encoding of the request and the decoding of the reply; binding; Go's
garbage collector. Shares are cumulative (a caller includes its callees), so they do not add up.
"""

from __future__ import annotations

import argparse
import http.client
import json
import math
import re
import shutil
import ssl
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

from benchmarks.machine import machine_description
from benchmarks.real_scheduler import (
    ALL_MODES,
    FLEET_WRITES_PER_NODE_S,
    MODE_LABELS,
    Config,
    bench,
    measure,
    node_plan,
)
from loopback_cluster.control_plane import LOOPBACK, ControlPlane, Scheduler

DEFAULT_MODES: Final = ("none", "names", "null-go-names", "full", "null-go-full")
# (label, function-name pattern, only under the extender's send): matched against pprof's
# function names in kube-scheduler v1.36 (pkg/scheduler/schedule_one.go, extender.go).
SEND: Final = "extender calls"
ENCODE: Final = "  encoding the request (JSON)"
DECODE: Final = "  decoding the reply (JSON)"
PARTS: Final = (
    # The filter and score plugins run on parallel workers, off the scheduling goroutine.
    ("filter plugins", r"pkg/scheduler\.\(\*Scheduler\)\.findNodesThatPassFilters\.func1$", False),
    ("score plugins", r"runtime\.\(\*frameworkImpl\)\.RunScorePlugins(\.func\d+)?$", False),
    (SEND, r"pkg/scheduler\.\(\*HTTPExtender\)\.send$", False),
    (ENCODE, r"^encoding/json\.Marshal$", True),
    (DECODE, r"^encoding/json\.\(\*Decoder\)\.Decode$", True),
    ("binding", r"pkg/scheduler\.\(\*Scheduler\)\.runBindingCycle$", False),
    ("garbage collection", r"^runtime\.gcBgMarkWorker$", False),
)
_SEND_FOCUS: Final = r"HTTPExtender\)\.send$"
_ROW: Final = re.compile(
    r"^\s*[\d.]+\w*s?\s+[\d.]+%\s+[\d.]+%\s+[\d.]+\w*s?\s+(?P<cum>[\d.]+)%\s+(?P<name>.+?)\s*$"
)
_TOTAL: Final = re.compile(
    r"Duration: (?P<duration>[\d.]+)s, Total samples = (?P<total>[\d.]+)(?P<unit>m?s)"
)


@dataclass(slots=True)
class Profile:
    mode: str
    pods: int
    window_s: float
    calibration_pods_per_s: float
    # The profiled burst's own pods/s (its window is most of that burst).
    pods_per_s: float = 0.0
    # CPU seconds sampled over the window: the scheduler's cores in use.
    cpu_s: float = 0.0
    shares: dict[str, float] = field(default_factory=dict)  # part label -> % of samples

    @property
    def cores(self) -> float:
        """The scheduler's CPU over the window, in cores."""
        return self.cpu_s / self.window_s

    def per_pod_ms(self, seconds_per_s: float) -> str:
        """`seconds_per_s` (1: wall time, `cores`: CPU) per placed pod, in ms."""
        return f"{seconds_per_s * 1000 / self.pods_per_s:.1f}" if self.pods_per_s else "-"


def go_binary() -> str:
    found = shutil.which("go")
    if found is None:
        raise SystemExit("go not found on PATH: `go tool pprof` reads the profiles")
    return found


def pprof_top(binary: Path, profile: Path, *, focus: str | None = None) -> str:
    argv = [go_binary(), "tool", "pprof", "-top", "-cum", "-nodecount=400"]
    argv += [f"-focus={focus}"] if focus else []
    done = subprocess.run(
        [*argv, str(binary), str(profile)], capture_output=True, text=True, check=False, timeout=120
    )
    if done.returncode != 0:
        raise RuntimeError(f"go tool pprof failed: {done.stderr.strip()[-400:]}")
    return done.stdout


def cumulative_shares(top: str) -> dict[str, float]:
    """Function name -> cum% from `go tool pprof -top -cum` output."""
    shares: dict[str, float] = {}
    for line in top.splitlines():
        match = _ROW.match(line)
        if match:
            shares.setdefault(match["name"], float(match["cum"]))
    return shares


def sampled_cpu_s(top: str) -> float:
    match = _TOTAL.search(top)
    if match is None:
        return 0.0
    total = float(match["total"])
    return total / 1000 if match["unit"] == "ms" else total


def part_shares(whole: dict[str, float], in_send: dict[str, float]) -> dict[str, float]:
    """Each of `PARTS`' share of the samples (0 where the profile has no such function)."""
    found: dict[str, float] = {}
    for label, pattern, under_send in PARTS:
        names = in_send if under_send else whole
        found[label] = max(
            (share for name, share in names.items() if re.search(pattern, name)), default=0.0
        )
    return found


def fetch_profile(scheduler: Scheduler, seconds: int, into: Path) -> None:
    """The scheduler's CPU profile over the next `seconds` (a blocking HTTP GET)."""
    insecure = ssl.create_default_context()
    insecure.check_hostname = False
    insecure.verify_mode = ssl.CERT_NONE  # the scheduler's self-signed loopback serving cert
    connection = http.client.HTTPSConnection(
        LOOPBACK, scheduler.secure_port, context=insecure, timeout=seconds + 30
    )
    try:
        connection.request("GET", f"/debug/pprof/profile?seconds={seconds}")
        response = connection.getresponse()
        body = response.read()
    finally:
        connection.close()
    if response.status != 200:
        raise RuntimeError(f"/debug/pprof/profile: HTTP {response.status}: {body[:200]!r}")
    into.write_bytes(body)


def profile_mode(  # noqa: PLR0917 (the run's state, passed positionally by one caller)
    plane: ControlPlane,
    mode: str,
    config: Config,
    made: dict[str, Any],
    seconds: int,
    scratch: Path,
    progress: Callable[[str], None],
) -> Profile:
    # No burst asks for more than half the fleet's GPUs (nodes above the utilization limit
    # take none).
    most = sum(node_plan(i)[2] for i in range(config.nodes)) // 2
    calibration = measure(plane, mode, 0, config, made, pods=min(config.pods_for(mode), most))
    # Enough pods to keep the scheduler busy through the window and its start, with margin.
    wanted = math.ceil(calibration.pods_per_s * (seconds + 3) * 1.5)
    pods = min(max(config.pods_for(mode), wanted), most)
    path = scratch / f"{mode}.pprof"
    profiled = measure(
        plane,
        mode,
        1,
        config,
        made,
        pods=pods,
        while_scheduling=lambda scheduler: fetch_profile(scheduler, seconds, path),
    )
    binary = plane.spec.bin_dir / "kube-scheduler"
    whole = pprof_top(binary, path)
    in_send = pprof_top(binary, path, focus=_SEND_FOCUS) if mode != "none" else ""
    result = Profile(
        mode, pods, seconds, round(calibration.pods_per_s, 1), round(profiled.pods_per_s, 1)
    )
    result.cpu_s = sampled_cpu_s(whole)
    result.shares = part_shares(cumulative_shares(whole), cumulative_shares(in_send))
    progress(f"  {mode:13s} {pods} pods, {result.cpu_s:.1f} CPU s in {seconds} s: {result.shares}")
    return result


def run(
    config: Config, *, seconds: int, progress: Callable[[str], None], keep: Path | None = None
) -> list[Profile]:
    with bench(config, progress=progress) as ready:
        plane, scratch = ready.plane, ready.scratch
        profiles = [
            profile_mode(plane, mode, config, ready.made, seconds, scratch, progress)
            for mode in config.modes
        ]
        if keep is not None:
            keep.mkdir(parents=True, exist_ok=True)
            for profile in profiles:
                shutil.copy(scratch / f"{profile.mode}.pprof", keep / f"{profile.mode}.pprof")
            shutil.copy(plane.spec.bin_dir / "kube-scheduler", keep / "kube-scheduler")
        return profiles


# The section's first line in docs/performance.md (`benchmarks.figures` finds it by this).
HEADING: Final = "## Where kube-scheduler's time goes"


def markdown_table(profiles: Sequence[Profile]) -> str:
    header = ["", *(f"`{p.mode}`" for p in profiles)]

    rows = [
        ["pods/s (the profiled burst)", *(f"{p.pods_per_s:.1f}" for p in profiles)],
        ["wall time per pod (ms)", *(p.per_pod_ms(1.0) for p in profiles)],
        ["scheduler CPU per pod (ms)", *(p.per_pod_ms(p.cores) for p in profiles)],
        ["scheduler CPU (cores)", *(f"{p.cores:.2f}" for p in profiles)],
    ]
    for label, _, _ in PARTS:
        rows.append([label, *(f"{p.shares.get(label, 0.0):.0f} %" for p in profiles)])
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def markdown_section(document: dict[str, Any], *, command: str) -> str:
    profiles = [Profile(**p) for p in document["profiles"]]
    legend = "; ".join(f"`{p.mode}`: {MODE_LABELS[p.mode]}" for p in profiles)
    by_mode = {p.mode: p for p in profiles}
    notes: list[str] = []

    def share(p: Profile | None, part: str) -> str:
        return "-" if p is None else f"{p.shares.get(part, 0.0):.0f} %"

    full, null_full = by_mode.get("full"), by_mode.get("null-go-full")
    if full is not None:
        notes.append(
            "**Full nodes: the scheduler's own JSON.** Each pod takes "
            f"{full.per_pod_ms(1.0)} ms of wall time and {full.per_pod_ms(full.cores)} ms of "
            "the scheduler's CPU; "
            f"{share(full, SEND)} of its samples are in the extender calls, most "
            f"of them Go's `encoding/json` on the scheduler's side of the wire: encoding every "
            f"feasible Node into the request ({share(full, ENCODE)}) and decoding the "
            f"Nodes the reply must carry back ({share(full, DECODE)}; kube-scheduler "
            "rebuilds each feasible node from them). That work is the same whatever answers"
            + (
                f": behind a null extender in Go the extender calls take "
                f"{share(null_full, SEND)} of the samples."
                if null_full is not None
                else "."
            )
        )
    names, null_names = by_mode.get("names"), by_mode.get("null-go-names")
    if names is not None:
        notes.append(
            "**Names only: waiting, not work.** Each pod takes "
            f"{names.per_pod_ms(1.0)} ms of wall time but only {names.per_pod_ms(names.cores)} "
            "ms of the scheduler's CPU, and the extender calls "
            f"are {share(names, SEND)} of that. The scheduling cycle is serial: for "
            "every pod it sends two requests to another process and waits for the answers, "
            "which on two shared cores queue behind the API server, etcd and the binds in "
            "flight"
            + (
                f"; a null extender in Go costs that wait too "
                f"({null_names.per_pod_ms(1.0)} ms of wall time per pod)."
                if null_names is not None
                else "."
            )
        )
    when = f"machine: {document['machine']}, {document['measured_at']}"
    patches = f"{document['nodes'] * FLEET_WRITES_PER_NODE_S:.0f}"
    return f"""{HEADING}

Command: `{command}` ({when}, {document["nodes"]:,} nodes). A Go CPU profile
of the real kube-scheduler over {profiles[0].window_s:.0f} s of a burst per mode, read with
`go tool pprof -top -cum`. Shares are cumulative (a caller counts its callees) and are of the
scheduler's own samples; its CPU in cores says how busy it was. CPU per pod is the window's
CPU over the pods it placed, so it includes the scheduler's work that does not depend on pods
(its informers take every Node update: up to {patches} a second here), which a slower mode
spreads over fewer pods. {" ".join(notes)}

Modes: {legend}.

{markdown_table(profiles)}
"""


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.scheduler_profile", description=__doc__
    )
    parser.add_argument("--nodes", type=int, default=5000, help="cluster size")
    parser.add_argument("--seconds", type=int, default=8, help="profile window per mode")
    parser.add_argument(
        "--modes",
        default=",".join(DEFAULT_MODES),
        help=f"comma-separated, of {', '.join(ALL_MODES)}",
    )
    parser.add_argument(
        "--keep", type=Path, help="copy each mode's profile here (`go tool pprof -http` reads it)"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    args = parser.parse_args(argv)
    modes = tuple(m.strip() for m in args.modes.split(",") if m.strip())
    unknown = sorted(set(modes) - set(ALL_MODES))
    if unknown:
        parser.error(f"--modes: choose from {', '.join(ALL_MODES)}")
    go_binary()

    def progress(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    started = time.monotonic()
    profiles = run(
        Config(args.nodes, modes=modes), seconds=args.seconds, progress=progress, keep=args.keep
    )
    document = {
        "machine": machine_description(),
        "measured_at": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "nodes": args.nodes,
        "wall_s": round(time.monotonic() - started, 1),
        "profiles": [asdict(p) for p in profiles],
    }
    if args.json:
        print(json.dumps(document, indent=2))
    else:
        print(markdown_section(document, command="python -m benchmarks.scheduler_profile"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
