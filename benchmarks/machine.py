"""The machine a benchmark ran on, in one line: figures are only comparable on the same box."""

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
