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
