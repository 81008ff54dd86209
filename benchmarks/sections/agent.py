"""The agent section: the cost of one agent tick and the agent's memory, from
`benchmarks.agent_tick`, run as a process of its own.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Final

from benchmarks.sections import markdown as md
from benchmarks.sections.markdown import num, pick
from benchmarks.sections.section import RunContext, Section, not_measured, run_benchmark, skipped

HEADING: Final = "## Agent tick and memory"
# Its one step in the timing table.
STEP: Final = "benchmark: agent tick"
MODULE: Final = "benchmarks.agent_tick"


def render(bench: Mapping[str, Any]) -> str:
    """The section from the benchmark's outcome (`run_benchmark`'s), measured or not."""
    if "error" in bench:
        return not_measured(HEADING, bench)
    data = bench["data"]

    def ms(row: Mapping[str, Any], key: str) -> str:
        value = pick(row, key)
        return "n/a" if value is None else num(value, 3)

    rows = [
        [
            str(row.get("gpus")),
            ms(row, "cpu.median_ms"),
            ms(row, "cpu.p99_ms"),
            ms(row, "wall.median_ms"),
            ms(row, "wall.p99_ms"),
            ms(row, "agent_tick_cpu.median_ms"),
            ms(row, "agent_tick_cpu.p99_ms"),
            ms(row, "source_read_wall.median_ms"),
            f"{row.get('writes')}/{row.get('ticks')}",
        ]
        for row in data.get("ticks", [])
        if isinstance(row, Mapping)
    ]
    table = md.table(
        [
            "GPUs",
            "CPU median (ms)",
            "CPU p99 (ms)",
            "wall median (ms)",
            "wall p99 (ms)",
            "whole `Agent.tick` CPU median (ms)",
            "whole `Agent.tick` CPU p99 (ms)",
            "simulated read median (ms)",
            "writes/ticks",
        ],
        rows,
    )
    targets = data.get("targets", {})
    limit = targets.get("peak_rss_mb", 80)
    rss_lines: list[str] = []
    for key, how in (
        ("rss", "plain `python`, allocations from a kubelet stand-in (grpc loaded)"),
        ("rss_optimized", "`python -OO`, allocations from a kubelet stand-in (grpc loaded)"),
        ("rss_no_pod_resources", "plain `python`, `--pod-resources=false` (no grpc)"),
        ("rss_optimized_no_pod_resources", "`python -OO`, `--pod-resources=false` (no grpc)"),
    ):
        rss = data.get(key)
        if not isinstance(rss, Mapping):
            continue
        peak = pick(rss, "peak_rss_mb")
        verdict = "n/a" if peak is None else ("met" if peak <= limit else "**missed**")
        rss_lines.append(
            f"- {how}: peak RSS **{num(peak if peak is not None else math.nan, 1)} MB** "
            f"after {rss.get('seconds')} s ({verdict}: target <= {limit} MB)"
        )
    rss_text = (
        "A real `gpu-agent run --source simulated` writing to the API stand-in and reading "
        "allocations from a real gRPC kubelet stand-in (`kube_standins/kubelet.py`):\n\n"
        + "\n".join(rss_lines)
        if rss_lines
        else "Peak RSS was not measured in this run."
    )
    return f"""{HEADING}

Command: `{bench["command"]}` (machine as reported by the benchmark: {data.get("machine")}).
A tick here is aggregation + write decision + merge-patch body, without NVML (the simulated
source's read time is shown apart); the whole-tick columns time the daemon's own `Agent.tick`
with its metrics, API and source I/O excluded.
Target: <= {targets.get("tick_ms_8_gpus", 5)} ms per tick for 8 GPUs.

{table}

{rss_text}
"""


def run(ctx: RunContext) -> str:
    """Run the benchmark (shorter, without the memory runs, when quick); write the section."""
    if ctx.no_benchmarks:
        return render(skipped(MODULE))
    extra = ["--ticks", "300", "--no-rss"] if ctx.quick else []
    return render(ctx.timed(STEP, lambda: run_benchmark(MODULE, extra, 300)))


SECTION: Final = Section(name="agent", heading=HEADING, steps=(STEP,), run=run)
