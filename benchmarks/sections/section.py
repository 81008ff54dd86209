"""What every section of docs/performance.md shares: its record, the state of a run, timed
steps and benchmark subprocesses.

`benchmarks.figures` lists one `Section` per module of this package and calls `run` for those a
run redoes; `RunContext` carries what those runs share (sizes, seeds, the timing table, the
raw summaries written to `img/figures.json`).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, TypeVar

ROOT = Path(__file__).resolve().parents[2]
# The command the document names for regenerating everything.
COMMAND: Final = "python3 dev.py figures"

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Sizes:
    """How much to simulate. FULL is what the committed document uses."""

    fleet_nodes: int
    # One whole large fleet over a short span, to check the per-node extrapolation.
    exact_nodes: int
    exact_duration_s: float
    fleet_duration_s: float
    variant_nodes: int
    variant_duration_s: float
    storm_nodes: int
    storm_duration_s: float
    storm_start_s: float
    storm_end_s: float
    placement_nodes: int
    placement_duration_s: float
    # The across-seeds comparison: each seed draws its own fleet, episodes and stream.
    placement_seeds: tuple[int, ...]


FULL = Sizes(
    fleet_nodes=300,
    exact_nodes=5000,
    exact_duration_s=600.0,
    fleet_duration_s=3600.0,
    variant_nodes=100,
    variant_duration_s=3600.0,
    storm_nodes=200,
    storm_duration_s=1800.0,
    storm_start_s=600.0,
    storm_end_s=900.0,
    placement_nodes=60,
    placement_duration_s=3 * 3600.0,
    placement_seeds=(11, 12, 13, 14, 15),
)
QUICK = Sizes(
    fleet_nodes=24,
    exact_nodes=40,
    exact_duration_s=300.0,
    fleet_duration_s=600.0,
    variant_nodes=12,
    variant_duration_s=600.0,
    storm_nodes=12,
    storm_duration_s=900.0,
    storm_start_s=300.0,
    storm_end_s=450.0,
    placement_nodes=12,
    placement_duration_s=1200.0,
    placement_seeds=(11, 12),
)


@dataclass(slots=True)
class Timed:
    """One row of the document's timing table."""

    label: str
    seconds: float


@dataclass(slots=True)
class RunContext:
    """What the sections of one run share. `timings` and `summary` grow as sections run."""

    sizes: Sizes
    quick: bool
    # Skip the benchmarks that run as processes of their own (agent, scorer, scheduler ...).
    no_benchmarks: bool
    fleet_seed: int
    placement_seed: int
    img: Path
    timings: list[Timed]
    # The raw summaries behind the tables, written to `img/figures.json`; a section a run does
    # not redo keeps its entries from the earlier run.
    summary: dict[str, Any]

    def timed(self, label: str, fn: Callable[[], T]) -> T:
        """Run one step, print its progress and add its wall time to the timing table."""
        started = time.perf_counter()
        print(f"==> {label} ...", flush=True)
        value = fn()
        elapsed = time.perf_counter() - started
        self.timings.append(Timed(label, elapsed))
        print(f"    {label}: {elapsed:.1f} s", flush=True)
        return value


@dataclass(frozen=True, slots=True)
class Section:
    """One section of the document, as `benchmarks.figures` lists it."""

    # What `--sections` calls it.
    name: str
    # Its first line. A partial run keeps the text from this line to the next section's heading.
    heading: str
    # How the labels of its steps in the timing table begin: a partial run keeps the rows of
    # the sections it does not redo.
    steps: tuple[str, ...]
    # Redo the section: its numbers, figures and summaries; returns its markdown.
    run: Callable[[RunContext], str]


def command_line(module: str, extra: Sequence[str]) -> str:
    """How the document names a benchmark's run: the command that reproduces it alone."""
    return "python -m " + " ".join([module, "--json", *extra])


def run_benchmark(module: str, extra: Sequence[str], timeout_s: float) -> dict[str, Any]:
    """Run `python -m <module> --json ...` and parse its JSON, or say why it could not.

    Each benchmark runs as its own process, so that its timings are not disturbed by the memory
    of the simulations run before it."""
    argv = [sys.executable, "-m", module, "--json", *extra]
    command = command_line(module, extra)
    try:
        done = subprocess.run(
            argv, cwd=ROOT, capture_output=True, text=True, timeout=timeout_s, check=False
        )
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout_s:.0f} s", "command": command}
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        return {
            "error": f"exit {done.returncode}: " + " / ".join(tail),
            "command": command,
        }
    try:
        data = json.loads(done.stdout)
    except json.JSONDecodeError as exc:
        return {"error": f"output is not JSON ({exc})", "command": command}
    return {"data": data, "command": command}


def skipped(module: str) -> dict[str, Any]:
    """A benchmark's outcome when `--no-benchmarks` skips it: said in the document, not omitted."""
    return {"error": "skipped (--no-benchmarks)", "command": f"python -m {module} --json"}


def not_measured(heading: str, bench: Mapping[str, Any]) -> str:
    """A section whose benchmark failed or was skipped: its heading and why."""
    return (
        f"{heading}\n\nNot measured in this run: `{bench.get('command')}` failed: "
        f"{bench['error']}.\n"
    )


def process_benchmark_section(
    ctx: RunContext,
    *,
    heading: str,
    step: str,
    module: str,
    extra: Sequence[str],
    timeout_s: float,
    summary_key: str,
    render: Callable[[dict[str, Any], str], str],
) -> str:
    """The run of a section that is one benchmark process: skipped with `--no-benchmarks`,
    "not measured" when it fails, else its data kept under `summary_key` and rendered."""
    if ctx.no_benchmarks:
        return f"{heading}\n\nNot measured in this run: skipped (--no-benchmarks).\n"
    bench = ctx.timed(step, lambda: run_benchmark(module, extra, timeout_s))
    if "error" in bench:
        return not_measured(heading, bench)
    ctx.summary[summary_key] = bench["data"]
    return render(bench["data"], bench["command"])
