"""The real kube-scheduler section: pods/s with the scorer as extender and without, from
`benchmarks.real_scheduler` (needs the loopback control plane, `python3 dev.py cluster build`).

Its heading and markdown are `benchmarks.real_scheduler`'s, so that the benchmark prints the same
section on its own; this module runs it for the figures and keeps its summary.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from benchmarks import real_scheduler
from benchmarks.sections.section import RunContext, Section, not_measured, run_benchmark, skipped

HEADING: Final = real_scheduler.HEADING
# Its one step in the timing table.
STEP: Final = "benchmark: real kube-scheduler"
MODULE: Final = "benchmarks.real_scheduler"


# Pods per names-only burst: at 300 nodes a burst of the benchmark's default 400 lasts about a
# second and a half, too short to read a 5 % difference through this machine's noise.
PODS: Final = 1200


def arguments(*, quick: bool, modes: Sequence[str] = real_scheduler.ALL_MODES) -> list[str]:
    """The benchmark's arguments: every mode (or `modes`, those a kept run measured), on a small
    cluster for one round when quick."""
    # Every mode, the null extenders included (they show what any extender costs the
    # scheduler), but those that need more than the checkout: an earlier commit (`--before`),
    # the built image (and root).
    extra = ["--modes", ",".join(m for m in modes if m not in real_scheduler.UNPLANNED_MODES)]
    return extra + (
        ["--nodes", "50", "--pods", "30", "--full-pods", "30", "--rounds", "1"]
        if quick
        else ["--pods", str(PODS)]
    )


def run(ctx: RunContext) -> str:
    """Run the benchmark, draw before against now, write the section."""
    if ctx.no_benchmarks:
        bench = skipped(MODULE)
    else:
        extra = arguments(quick=ctx.quick)
        bench = ctx.timed(STEP, lambda: run_benchmark(MODULE, extra, 3600))
    if "error" in bench:
        return not_measured(HEADING, bench)
    # The figures before the scorer's request path was rebuilt, kept as measured then.
    before = ctx.summary.get("real_scheduler_before")
    ctx.summary["real_scheduler"] = bench["data"]
    plotted = real_scheduler.plot(bench["data"], ctx.img / "real_scheduler.png", before=before)
    return real_scheduler.markdown_section(
        bench["data"], command=bench["command"], before=before, plotted=plotted
    )


def measured_modes(data: Mapping[str, Any]) -> list[str]:
    """The modes a kept run measured, in its order: its command names these, not the modes the
    benchmark has now (a mode added since is measured at the next regeneration)."""
    return [str(mode) for mode in data["sizes"][0]["modes"]]


SECTION: Final = Section(name="scheduler", heading=HEADING, steps=(STEP,), run=run)
