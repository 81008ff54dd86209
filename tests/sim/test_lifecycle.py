"""A benchmark stopped with SIGTERM unwinds: what its `with` blocks started is stopped."""

from __future__ import annotations

import importlib
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmarks.lifecycle import exit_on_sigterm

ROOT = Path(__file__).resolve().parents[2]

# A process that starts something in a `with` block and waits, as a benchmark does: its exit
# writes `stopped` into the file named by argv[1] (the control plane's and scorers' stop).
_CHILD = """
import contextlib, sys, time
from pathlib import Path
from benchmarks.lifecycle import exit_on_sigterm
if sys.argv[2] == "handled":
    exit_on_sigterm()
@contextlib.contextmanager
def started():
    Path(sys.argv[1]).write_text("started")
    try:
        yield
    finally:
        Path(sys.argv[1]).write_text("stopped")
with started():
    time.sleep(60)
"""


@pytest.mark.parametrize(
    ("how", "code", "left"), [("handled", 143, "stopped"), ("default", -15, "started")]
)
def test_a_benchmark_stopped_with_sigterm_stops_what_it_started(
    tmp_path: Path, how: str, code: int, left: str
) -> None:
    marker = tmp_path / "marker"
    child = subprocess.Popen([sys.executable, "-c", _CHILD, str(marker), how], cwd=ROOT)
    deadline = time.monotonic() + 30
    while not marker.exists():  # waits for the child to have started, never a fixed sleep
        assert child.poll() is None, "the child exited before it started"
        assert time.monotonic() < deadline, "the child never started"
        time.sleep(0.01)
    child.send_signal(signal.SIGTERM)
    assert child.wait(timeout=30) == code
    assert marker.read_text() == left


@pytest.mark.parametrize("module", ["real_scheduler", "pod_watch", "bind_lag"])
def test_the_control_plane_benchmarks_exit_on_sigterm(module: str) -> None:
    before = signal.getsignal(signal.SIGTERM)
    try:
        with pytest.raises(SystemExit):
            importlib.import_module(f"benchmarks.{module}").main(["--help"])
        assert signal.getsignal(signal.SIGTERM) is not before
        exit_on_sigterm()  # the same handler
        assert signal.getsignal(signal.SIGTERM).__name__ == "_exit"  # type: ignore[union-attr]
    finally:
        signal.signal(signal.SIGTERM, before)
