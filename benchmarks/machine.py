"""The machine a benchmark ran on, in one line (figures are only comparable on the same box), and
what its processes use of it."""

from __future__ import annotations

import os
import platform
from pathlib import Path


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


def machine_cpu(stat: str, ticks_per_s: int) -> tuple[float, float]:
    """(busy, idle) seconds of every CPU together so far, from `/proc/stat`'s first line (`cpu`).

    Idle is `idle` + `iowait`; busy is the rest of the first eight fields (user, nice, system,
    irq, softirq, steal). Guest time is counted within user already, so it is not added again."""
    fields = stat.split("\n", 1)[0].split()
    if len(fields) < 9 or fields[0] != "cpu":
        raise ValueError(f"not a /proc/stat cpu line: {stat[:80]!r}")
    user, nice, system, idle, iowait, irq, softirq, steal = map(int, fields[1:9])
    busy = user + nice + system + irq + softirq + steal
    return busy / ticks_per_s, (idle + iowait) / ticks_per_s


def machine_cpu_s() -> tuple[float, float] | None:
    """`machine_cpu` of this machine now, or None where `/proc/stat` cannot be read (not Linux)."""
    try:
        stat = Path("/proc/stat").read_text()
    except OSError:
        return None
    return machine_cpu(stat, os.sysconf("SC_CLK_TCK"))
