"""The kube-scheduler profile section: where the real scheduler's CPU goes per mode, from
`benchmarks.scheduler_profile` (needs the loopback control plane and Go).

Its heading and markdown are `benchmarks.scheduler_profile`'s; this module runs it for the
figures and keeps its summary.
"""

from __future__ import annotations

from typing import Final

from benchmarks import scheduler_profile
from benchmarks.sections.section import RunContext, Section, process_benchmark_section

HEADING: Final = scheduler_profile.HEADING
# Its one step in the timing table.
STEP: Final = "benchmark: kube-scheduler profile"
MODULE: Final = "benchmarks.scheduler_profile"


def arguments(*, quick: bool) -> list[str]:
    """The benchmark's arguments: its defaults, or fewer nodes, modes and seconds when quick."""
    return ["--nodes", "50", "--seconds", "2", "--modes", "none,names,full"] if quick else []


def run(ctx: RunContext) -> str:
    """Profile the scheduler in every mode, write the section."""
    return process_benchmark_section(
        ctx,
        heading=HEADING,
        step=STEP,
        module=MODULE,
        extra=arguments(quick=ctx.quick),
        timeout_s=1800,
        summary_key="scheduler_profile",
        render=lambda data, command: scheduler_profile.markdown_section(data, command=command),
    )


SECTION: Final = Section(name="profile", heading=HEADING, steps=(STEP,), run=run)
