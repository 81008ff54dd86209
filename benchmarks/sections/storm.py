"""The 429-storm section: what the agent's writes and data age do while the API server
answers every patch with `429 Too Many Requests`, simulated with `fleet_sim.fleet`.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Final

import numpy as np

from benchmarks.sections import markdown as md
from benchmarks.sections.fleet import PENDING_PODS
from benchmarks.sections.markdown import num
from benchmarks.sections.plots import plt, save
from benchmarks.sections.section import RunContext, Section
from fleet_sim.fleet import ApiStorm, FleetConfig, FleetResult, simulate

HEADING: Final = "## A 429 storm"
# Its one step in the timing table (it begins like the fleet section's: the longer prefix wins).
STEP: Final = "fleet: 429 storm"


def fig_storm(result: FleetResult, storm: ApiStorm, path: Path) -> None:
    bin_s = result.config.bin_s
    # Only whole bins: the last, partial one would read as a drop to zero.
    whole = result.bin_starts_s + bin_s <= result.config.duration_s
    t = result.bin_starts_s[whole] / 60.0
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    top.plot(t, result.bin_naive_attempts[whole] / bin_s, color="tab:red", label="naive attempts")
    top.plot(t, result.bin_attempts[whole] / bin_s, color="tab:orange", label="agent attempts")
    top.plot(
        t, result.bin_successes[whole] / bin_s, color="tab:blue", label="agent successful writes"
    )
    top.set_ylabel("Patches per second")
    top.set_yscale("symlog", linthresh=1.0)
    top.legend(fontsize=8, loc="upper right")
    top.set_title(f"429 storm, {result.config.nodes} nodes: Retry-After {storm.retry_after_s:g} s")
    bottom.plot(t, result.bin_max_age_s[whole], color="black", label="oldest data")
    bottom.plot(t, result.bin_p50_age_s[whole], color="tab:blue", label="median data age")
    bottom.set_ylabel("Data age (s)")
    bottom.set_xlabel("Simulated time (min)")
    bottom.legend(fontsize=8, loc="upper right")
    for ax in (top, bottom):
        ax.axvspan(storm.start_s / 60, storm.end_s / 60, color="tab:red", alpha=0.12)
        ax.grid(True, alpha=0.3)
    save(fig, path)


def render(result: FleetResult, storm: ApiStorm, seed: int) -> str:
    cfg = result.config
    bin_s = cfg.bin_s
    starts = result.bin_starts_s
    during = (starts >= storm.start_s) & (starts < storm.end_s)
    before = (starts >= cfg.warmup_s) & (starts < storm.start_s)
    after = (starts >= storm.end_s) & (starts < storm.end_s + 180.0)
    settled = starts >= storm.end_s + cfg.policy.backoff_max_s + cfg.policy.heartbeat_s
    storm_s = storm.end_s - storm.start_s

    def rate(values: np.ndarray, mask: np.ndarray) -> float:
        return float(values[mask].sum()) / max(bin_s, float(mask.sum()) * bin_s)

    bound = cfg.policy.heartbeat_s + cfg.interval_s
    recovered_at = next(
        (
            float(s)
            for s, m in zip(starts, result.bin_max_age_s, strict=True)
            if s >= storm.end_s and not math.isnan(m) and m <= bound
        ),
        math.nan,
    )
    peak_after = float(result.bin_successes[after].max()) / bin_s if after.any() else math.nan
    rows = [
        [
            "agent patches attempted/s",
            num(rate(result.bin_attempts, before), 2),
            num(rate(result.bin_attempts, during), 2),
            num(peak_after, 2),
            num(rate(result.bin_successes, settled), 2),
        ],
        [
            "naive patches attempted/s",
            num(rate(result.bin_naive_attempts, before), 1),
            num(rate(result.bin_naive_attempts, during), 1),
            num(rate(result.bin_naive_attempts, after), 1),
            num(rate(result.bin_naive_attempts, settled), 1),
        ],
    ]
    table = md.table(["", "before", "during the storm", "peak 10 s after", "settled"], rows)
    attempts_storm = float(result.bin_attempts[during].sum())
    naive_storm = float(result.bin_naive_attempts[during].sum())
    cmd = (
        f"python -m fleet_sim.fleet --nodes {cfg.nodes} --duration-s {cfg.duration_s:g} "
        f"--seed {seed} --storm {storm.start_s:g}:{storm.end_s:g}:{storm.retry_after_s:g}"
    )
    return f"""{HEADING}

Command: `{cmd}`.

From {storm.start_s / 60:g} to {storm.end_s / 60:g} min the API server answers every patch with
`429 Too Many Requests` and `Retry-After: {storm.retry_after_s:g}`. The agent backs off
exponentially from its {cfg.policy.backoff_base_s:g} s base (never sooner than Retry-After, at
most {cfg.policy.backoff_max_s:g} s), and keeps no queue: each attempt carries the newest sample,
compared with what the server last accepted, so a state that could not be sent is superseded,
never replayed. During the {storm_s / 60:g} minutes the fleet attempted {attempts_storm:,.0f}
patches against the naive agent's {naive_storm:,.0f} ({attempts_storm / max(1.0, naive_storm):.1%}).
After the storm every node's data was within the {bound:g} s bound again
{num(recovered_at - storm.end_s, 0)} s after the API recovered (at most the longest back-off,
{cfg.policy.backoff_max_s:g} s, plus one interval). The busiest 10 s after the storm carried
{num(peak_after, 2)} writes/s against {num(rate(result.bin_attempts, before), 2)} before
(nodes whose back-offs ended together), never more than one write per node per minimum
interval, each with the node's newest state; then the rate went back to its steady level. There
is no backlog to drain, because nothing was queued. Data age grows during the storm: that is
what the scorer's `stale after` ({3 * cfg.policy.heartbeat_s:g} s by default) is for.

{table}

![429 storm timeline](img/storm.png)
"""


def run(ctx: RunContext) -> str:
    """Simulate the storm, draw its timeline and write the section."""
    sizes, seed = ctx.sizes, ctx.fleet_seed
    storm = ApiStorm(sizes.storm_start_s, sizes.storm_end_s, retry_after_s=30.0)
    storm_cfg = FleetConfig(
        nodes=sizes.storm_nodes, duration_s=sizes.storm_duration_s, seed=seed, storms=(storm,)
    )
    storm_result = ctx.timed(STEP, lambda: simulate(storm_cfg))
    fig_storm(storm_result, storm, ctx.img / "storm.png")
    ctx.summary["storm"] = storm_result.summary(PENDING_PODS)
    return render(storm_result, storm, seed)


SECTION: Final = Section(name="storm", heading=HEADING, steps=(STEP,), run=run)
