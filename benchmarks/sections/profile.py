"""The kube-scheduler profile section: where the real scheduler's CPU goes per mode, from
`benchmarks.scheduler_profile` (needs the loopback control plane and Go).

Its heading and markdown are `benchmarks.scheduler_profile`'s; this module runs it for the
figures and keeps its summary.
"""

from __future__ import annotations

from typing import Final

from benchmarks import scheduler_profile
from benchmarks.sections.section import RunContext, Section, not_measured, run_benchmark

HEADING: Final = scheduler_profile.HEADING
# Its one step in the timing table.
STEP: Final = "benchmark: kube-scheduler profile"
MODULE: Final = "benchmarks.scheduler_profile"


def arguments(*, quick: bool) -> list[str]:
    """The benchmark's arguments: its defaults, or fewer nodes, modes and seconds when quick."""
    return ["--nodes", "50", "--seconds", "2", "--modes", "none,names,full"] if quick else []


def run(ctx: RunContext) -> str:
    """Profile the scheduler in every mode, write the section."""
    if ctx.no_benchmarks:
        return f"{HEADING}\n\nNot measured in this run: skipped (--no-benchmarks).\n"
    extra = arguments(quick=ctx.quick)
    bench = ctx.timed(STEP, lambda: run_benchmark(MODULE, extra, 1800))
    if "error" in bench:
        return not_measured(HEADING, bench)
    ctx.summary["scheduler_profile"] = bench["data"]
    return scheduler_profile.markdown_section(bench["data"], command=bench["command"])


SECTION: Final = Section(name="profile", heading=HEADING, steps=(STEP,), run=run)
