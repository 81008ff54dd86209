"""The in-flight accounting section: the memory and CPU of the scorer's Pod watch, from
`benchmarks.pod_watch` (needs the loopback control plane).

Its heading and markdown are `benchmarks.pod_watch`'s; this module runs it for the figures and
keeps its summary.
"""

from __future__ import annotations

from typing import Final

from benchmarks import pod_watch
from benchmarks.sections.section import RunContext, Section, not_measured, run_benchmark

HEADING: Final = pod_watch.HEADING
# Its one step in the timing table.
STEP: Final = "benchmark: pod watch"
MODULE: Final = "benchmarks.pod_watch"


def arguments(*, quick: bool) -> list[str]:
    """The benchmark's arguments: its defaults, or a small fleet for one short round when quick."""
    return (
        ["--nodes", "50", "--pods", "500", "--duration-s", "10", "--rounds", "1"] if quick else []
    )


def run(ctx: RunContext) -> str:
    """Measure the Pod watch, write the section."""
    if ctx.no_benchmarks:
        return f"{HEADING}\n\nNot measured in this run: skipped (--no-benchmarks).\n"
    extra = arguments(quick=ctx.quick)
    bench = ctx.timed(STEP, lambda: run_benchmark(MODULE, extra, 3600))
    if "error" in bench:
        return not_measured(HEADING, bench)
    ctx.summary["pod_watch"] = bench["data"]
    return pod_watch.markdown_section(bench["data"], command=bench["command"])


SECTION: Final = Section(name="inflight", heading=HEADING, steps=(STEP,), run=run)
