"""A benchmark stopped from outside stops what it started.

The benchmarks that run the loopback control plane start etcd, kube-apiserver, kube-scheduler,
scorers and the Go null extender, and stop them as their context managers unwind. Python's
default action on SIGTERM (`kill`, `timeout`) ends the process at once, unwound or not: the
control plane's own processes are told of their parent's death (`PR_SET_PDEATHSIG`), but the
scorers and the null extender kept running, on ports and cores the next run then shares.
"""

from __future__ import annotations

import signal
from types import FrameType
from typing import NoReturn


def exit_on_sigterm() -> None:
    """From now on, SIGTERM raises `SystemExit(143)` in the main thread (as `kill` and
    `timeout` report it), so that every `with` block unwinds and stops what it started."""
    signal.signal(signal.SIGTERM, _exit)


def _exit(signum: int, _frame: FrameType | None) -> NoReturn:
    raise SystemExit(128 + signum)
