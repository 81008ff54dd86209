"""The in-flight accounting section: the memory and CPU of the scorer's Pod watch, from
`benchmarks.pod_watch` (needs the loopback control plane).

Its heading and markdown are `benchmarks.pod_watch`'s; this module runs it for the figures and
keeps its summary.
"""

from __future__ import annotations

from typing import Final

from benchmarks import pod_watch
from benchmarks.sections.section import RunContext, Section, process_benchmark_section

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
    return process_benchmark_section(
        ctx,
        heading=HEADING,
        step=STEP,
        module=MODULE,
        extra=arguments(quick=ctx.quick),
        timeout_s=3600,
        summary_key="pod_watch",
        render=lambda data, command: pod_watch.markdown_section(data, command=command),
    )


SECTION: Final = Section(name="inflight", heading=HEADING, steps=(STEP,), run=run)
