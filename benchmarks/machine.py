"""The machine a benchmark ran on, in one line (figures are only comparable on the same box), and
what its processes use of it."""

from __future__ import annotations

import os
import platform
from pathlib import Path
from typing import NamedTuple


def machine_description() -> str:
    """CPU count and model, OS and Python version, e.g. for a benchmark's JSON `machine` field."""
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return (
        f"{os.cpu_count()} logical CPUs ({model}), {platform.system()} {platform.release()}, "
        f"Python {platform.python_version()}"
    )


def cpu_seconds(stat: str, ticks_per_s: int) -> float:
    """utime + stime of a `/proc/<pid>/stat` line, in seconds (all the process's threads)."""
    # The command name (field 2) may hold spaces and parentheses: count from its last ')'.
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / ticks_per_s


def process_cpu_s(pid: int) -> float:
    """The CPU seconds process `pid` has used so far, every thread's (Linux)."""
    return cpu_seconds(Path(f"/proc/{pid}/stat").read_text(), os.sysconf("SC_CLK_TCK"))


class MachineCpu(NamedTuple):
    """Seconds of every CPU together so far, by what they went to."""

    busy_s: float  # run by the machine's processes and its kernel
    idle_s: float  # idle, or waiting on I/O
    steal_s: float  # taken by the hypervisor for other guests: neither idle nor this machine's


def machine_cpu(stat: str, ticks_per_s: int) -> MachineCpu:
    """`MachineCpu` from `/proc/stat`'s first line (`cpu`): busy is user, nice, system, irq and
    softirq (guest time is counted within user already, so it is not added again), idle is
    idle + iowait. Fields an older kernel does not have (irq, softirq, steal) count as 0."""
    fields = stat.split("\n", 1)[0].split()
    if len(fields) < 6 or fields[0] != "cpu":
        raise ValueError(f"not a /proc/stat cpu line: {stat[:80]!r}")
    user, nice, system, idle, iowait, irq, softirq, steal = [*map(int, fields[1:9]), 0, 0, 0][:8]
    return MachineCpu(
        busy_s=(user + nice + system + irq + softirq) / ticks_per_s,
        idle_s=(idle + iowait) / ticks_per_s,
        steal_s=steal / ticks_per_s,
    )


def machine_cpu_s() -> MachineCpu | None:
    """`machine_cpu` of this machine now; None where `/proc/stat` cannot be read or is not as
    Linux writes it (the figures that need it are then left out, not the benchmark)."""
    try:
        return machine_cpu(Path("/proc/stat").read_text(), os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError):
        return None
