"""The write-budget section: the agent's writes and data age at fleet scale, simulated.

It runs `fleet_sim.fleet` on one fleet for an hour, on one whole large fleet over a shorter span
(the check on extrapolating per-node rates), and on a sensitivity sweep of the write policy
(`VARIANTS`), draws the writes-against-fleet-size and data-age figures, and writes the section
from those results.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Final

import numpy as np

from agent.limiter import WRITE_REASONS, WritePolicy
from benchmarks.sections import markdown as md
from benchmarks.sections.markdown import num, span
from benchmarks.sections.plots import plt, save
from benchmarks.sections.section import COMMAND, RunContext, Section
from fleet_sim.fleet import FleetConfig, FleetResult, simulate

HEADING: Final = "## Write budget at fleet scale"
# How this section's steps begin in the timing table.
STEP: Final = "fleet: "
VARIANT_STEP: Final = "fleet variant: "
# Pods waiting to be scheduled, each retried on every write (the section's "second cost").
PENDING_PODS: Final = 50
# Fleets larger than the simulated one, at the measured per-node rate.
EXTRAPOLATED_SIZES: Final = (1000, 2000, 5000)


@dataclass(frozen=True, slots=True)
class Variant:
    """One row of the sensitivity table: a write policy, with or without per-GPU data."""

    label: str
    policy: WritePolicy
    per_gpu: bool = True
    # Publish pod-gpu-usage (fleet_sim.pods): which pods hold each GPU, and what each uses.
    pods: bool = True


# DESIGN.md's numbers, applied to the per-GPU values as well: symmetric deadbands, 0.05 / 3 C /
# 5 %, each GPU against its own written value.
DESIGN_RULES = WritePolicy(
    temperature_deadband_c=3.0,
    improving_deadband_factor=1.0,
    per_gpu_utilization_deadband=0.05,
    per_gpu_temperature_deadband_c=3.0,
    per_gpu_compare="by-index",
)

VARIANTS: tuple[Variant, ...] = (
    Variant(
        "defaults (worsening 0.05 / 5 C / 5 %, improving x3; per GPU 0.15 / 5 C / 5 % as a "
        "multiset; min 10 s, heartbeat 60 s)",
        WritePolicy(),
    ),
    Variant("no per-GPU keys, DESIGN.md's rules (the write budget before per-GPU data)",
            replace(DESIGN_RULES), per_gpu=False),
    Variant("DESIGN.md's rules applied to per-GPU values too (symmetric, 0.05 / 3 C, GPU by GPU)",
            DESIGN_RULES),
    Variant("defaults, but symmetric deadbands (improving x1)",
            WritePolicy(improving_deadband_factor=1.0)),
    Variant("defaults, but per-GPU values GPU by GPU (no multiset)",
            WritePolicy(per_gpu_compare="by-index")),
    Variant("defaults, but per-GPU utilization deadband 0.05",
            WritePolicy(per_gpu_utilization_deadband=0.05)),
    Variant("defaults, but temperature deadbands 3 C (DESIGN.md)",
            WritePolicy(temperature_deadband_c=3.0, per_gpu_temperature_deadband_c=3.0)),
    Variant("defaults + min write interval 30 s", WritePolicy(min_write_interval_s=30.0)),
    Variant("defaults + heartbeat 120 s", WritePolicy(heartbeat_s=120.0, backoff_max_s=240.0)),
    Variant("defaults without pod-gpu-usage (the write budget before per-pod figures)",
            WritePolicy(), pods=False),
    Variant("defaults, but per-pod utilization deadband 0.05 (the node's)",
            WritePolicy(pod_utilization_deadband=0.05)),
)  # fmt: skip


def fig_writes_vs_fleet(
    sizes_sim: Sequence[int],
    project_sim: Sequence[float],
    *,
    per_node: float,
    naive_per_node: float,
    path: Path,
    exact: FleetResult | None = None,
) -> None:
    fig, ax = plt.subplots(figsize=(7, 4.2))
    all_sizes = [*sizes_sim, *(s for s in EXTRAPOLATED_SIZES if s > max(sizes_sim))]
    ax.plot(
        all_sizes,
        [s * naive_per_node for s in all_sizes],
        "s-",
        color="tab:red",
        label="naive: a patch every sample",
    )
    ax.plot(
        all_sizes,
        [s * naive_per_node * 0.10 for s in all_sizes],
        ":",
        color="grey",
        label="target: 10 % of naive",
    )
    ax.plot(sizes_sim, project_sim, "o-", color="tab:blue", label="agent (simulated nodes)")
    extra = [s for s in all_sizes if s >= max(sizes_sim)]
    ax.plot(
        extra,
        [s * per_node for s in extra],
        "o--",
        color="tab:blue",
        alpha=0.6,
        label="agent (per-node rate x nodes)",
    )
    if exact is not None:
        ax.plot(
            [exact.config.nodes],
            [exact.writes_per_s],
            "*",
            markersize=13,
            color="tab:green",
            label=(
                f"agent ({exact.config.nodes:,} nodes simulated, {span(exact.config.duration_s)})"
            ),
        )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("GPU nodes")
    ax.set_ylabel("Node patches per second (cluster-wide)")
    ax.set_title("API writes against fleet size")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    save(fig, path)


def fig_data_age(result: FleetResult, path: Path) -> None:
    policy = result.config.policy
    bound = policy.heartbeat_s + result.config.interval_s
    ages = np.sort(result.ages_api_up_s)
    fig, ax = plt.subplots(figsize=(7, 4.2))
    if ages.size:
        ax.plot(ages, np.linspace(0, 1, ages.size), color="tab:blue", label="agent")
    ax.axvline(
        result.config.interval_s,
        color="tab:red",
        linestyle="-",
        label=f"naive: at most {result.config.interval_s:g} s",
    )
    ax.axvline(
        policy.heartbeat_s, color="grey", linestyle=":", label=f"heartbeat {policy.heartbeat_s:g} s"
    )
    ax.axvline(bound, color="black", linestyle="--", label=f"bound {bound:g} s")
    ax.set_xlabel("Age of the data a scorer reads (s)")
    ax.set_ylabel("Fraction of reads")
    ax.set_title("Freshness of published data (API up)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    save(fig, path)


def render(
    main: FleetResult,
    variants: Sequence[tuple[str, FleetResult]],
    *,
    sizes_sim: Sequence[int],
    seed: int,
    wall_s: float,
    exact: FleetResult,
) -> str:
    cfg = main.config
    tick_s = wall_s / (cfg.nodes * cfg.duration_s / cfg.interval_s)
    policy = cfg.policy
    per_node = main.writes_per_s / cfg.nodes
    naive_per_node = main.naive_writes_per_s / cfg.nodes
    bytes_per_write = main.bytes_written / max(1, main.writes)

    def scaled_row(n: int, how: str, w: float, w_digits: int) -> list[str]:
        naive = n * naive_per_node
        return [
            f"{n:,}",
            how,
            num(w, w_digits),
            num(naive, 1),
            f"{w / naive:.1%}",
            num(w * bytes_per_write / 1024, 1),
            num(naive * bytes_per_write / 1024, 1),
            num(w * PENDING_PODS, 0),
            num(naive * PENDING_PODS, 0),
        ]

    rows = [scaled_row(n, "simulated", main.writes_per_s_first(n), 2) for n in sizes_sim]
    rows += [
        scaled_row(n, "per-node rate x nodes", n * per_node, 1)
        for n in EXTRAPOLATED_SIZES
        if n > max(sizes_sim)
    ]
    rows.append(
        [
            f"{exact.config.nodes:,}",
            f"simulated, {span(exact.config.duration_s)}",
            num(exact.writes_per_s, 1),
            num(exact.naive_writes_per_s, 1),
            f"{exact.write_ratio:.1%}",
            num(exact.bytes_per_s / 1024, 1),
            num(exact.naive_bytes_per_s / 1024, 1),
            num(exact.extender_calls_per_s(PENDING_PODS), 0),
            num(exact.naive_extender_calls_per_s(PENDING_PODS), 0),
        ]
    )
    exact_cmd = (
        f"python -m fleet_sim.fleet --nodes {exact.config.nodes} "
        f"--duration-s {exact.config.duration_s:g} --seed {seed}"
    )
    exact_ages = exact.age_percentiles()
    table = md.table(
        [
            "nodes",
            "how",
            "agent writes/s",
            "naive writes/s",
            "ratio",
            "agent KiB/s",
            "naive KiB/s",
            f"extender calls/s ({PENDING_PODS} pending)",
            "naive extender calls/s",
        ],
        rows,
    )
    ages = main.age_percentiles()
    bound = policy.heartbeat_s + cfg.interval_s
    age_table = md.table(
        ["", "p50 age (s)", "p99 age (s)", "max age (s)", "bound (s)"],
        [
            ["agent", num(ages["p50"]), num(ages["p99"]), num(ages["max"]), num(bound, 0)],
            ["naive", "n/a", "n/a", f"< {cfg.interval_s:g}", num(cfg.interval_s, 0)],
        ],
    )
    by_profile = main.writes_per_node_per_s_by_profile()
    profile_table = md.table(
        ["profile", "nodes", "writes per node per minute", "share of naive"],
        [
            [
                p,
                str(main.node_profiles.count(p)),
                num(rate * 60, 2),
                f"{rate / (1 / cfg.interval_s):.1%}",
            ]
            for p, rate in by_profile.items()
        ],
    )
    change_writes = sum(main.reasons[r] for r in ("deadband-exceeded", "discrete-change"))
    trigger_table = md.table(
        ["field", "share of change-driven writes it triggered"],
        [
            [f"`{name}`", f"{count / max(1, change_writes):.0%}"]
            for name, count in main.triggers.most_common()
        ],
    )
    writes_total = max(1, sum(main.reasons[r] for r in WRITE_REASONS))
    reason_line = ", ".join(
        f"{r} {main.reasons[r] / writes_total:.0%}" for r in sorted(WRITE_REASONS)
    )
    heartbeat_floor = cfg.interval_s / policy.heartbeat_s
    variant_rows = []
    for label, r in variants:
        a = r.age_percentiles()
        variant_rows.append(
            [
                label,
                f"{r.write_ratio:.1%}",
                num(a["p50"]),
                num(a["p99"]),
                num(a["max"]),
                num(r.config.policy.heartbeat_s + r.config.interval_s, 0),
            ]
        )
    variant_table = md.table(
        [
            "write policy",
            "writes / naive",
            "p50 age (s)",
            "p99 age (s)",
            "max age (s)",
            "bound (s)",
        ],
        variant_rows,
    )
    met_ratio = main.write_ratio <= 0.10
    met_age = ages["max"] <= bound
    steady_bins = (main.bin_starts_s >= cfg.warmup_s) & (
        main.bin_starts_s + cfg.bin_s <= cfg.duration_s
    )
    bin_rates = main.bin_successes[steady_bins] / cfg.bin_s
    burst = (
        f"How evenly the writes spread: the busiest {cfg.bin_s:g} s carried "
        f"{float(bin_rates.max()) / max(1e-9, float(bin_rates.mean())):.1f} x the mean rate. "
        "Every agent here started within one sample interval of the others (as after a "
        "DaemonSet rollout); the one-off random heartbeat lead (`docs/agent.md`) moves each "
        "quiet node's heartbeat to its own phase, so the heartbeats do not stay in step "
        "(without it the peak was 2.4 x the mean)."
        if bin_rates.size
        else ""
    )
    verdict = (
        f"**Targets.** Writes: {main.write_ratio:.1%} of naive "
        f"({'met' if met_ratio else 'not met'}: target <= 10 %). Data age while the API is up: "
        f"max {ages['max']:.1f} s against the bound heartbeat + interval = {bound:g} s "
        f"({'met' if met_age else 'NOT met'})."
    )
    if not met_ratio:
        verdict += (
            f" Why the write target is missed: the heartbeat alone costs one write per "
            f"{policy.heartbeat_s:g} s, {heartbeat_floor:.1%} of naive at a {cfg.interval_s:g} s "
            "sample interval, so only about "
            f"{max(0.0, 0.10 - heartbeat_floor):.1%} is left for change-driven writes. Nodes "
            "whose load really moves (bursty inference, jobs that start and end, checkpoint "
            "dips that swing the temperature by tens of degrees) spend more than that, and they "
            "should: those are the changes a scheduler needs to see. The profile table shows "
            "where the writes go"
        )
        top = main.triggers.most_common(1)
        if top:
            name, count = top[0]
            verdict += (
                f"; the field that triggers most change-driven writes is `{name}` "
                f"({count / max(1, change_writes):.0%} of them)"
            )
        meeting = [label for label, r in variants if r.write_ratio <= 0.10]
        verdict += (
            ". The sensitivity table shows what each knob buys and costs in freshness"
            + (
                f"; at or under 10 %: {'; '.join(meeting)}, with the freshness shown there"
                if meeting
                else "; none of the tried settings reaches 10 % at this sample interval"
            )
            + ". The defaults favour fresh data; an operator who values fewer writes more "
            "sets `--heartbeat-s`, `--min-write-interval-s` and the deadbands."
        )
    per_gpu_text = _per_gpu_paragraph(main, variants)
    fleet_cmd = (
        f"python -m fleet_sim.fleet --nodes {cfg.nodes} --duration-s {cfg.duration_s:g}"
        f" --seed {seed}"
    )
    return f"""{HEADING}

Command: `{fleet_cmd}` (the same run as `{COMMAND}`; `python -m fleet_sim.fleet --nodes 5000`
simulates a whole 5,000-node hour, about {5000 * 3600 / cfg.interval_s * tick_s / 60:.0f} minutes
here).

**Model.** {cfg.nodes} nodes of {cfg.gpus_per_node} GPUs each, {span(cfg.duration_s)} of
cluster time sampled every {cfg.interval_s:g} s, the first {cfg.warmup_s:g} s (every agent's first
write) left out of the rates. Each node runs the agent's real path: a seeded trace
(`fleet_sim/traces.py`: steady training with checkpoint dips, bursty inference, idle nodes, diurnal
serving, batch jobs that start and end; thermal lag; a few hot nodes) becomes a `NodeReading`,
`agent.aggregate` makes the contract state, `agent.limiter.decide` says whether to write, and a
write's size is the real merge-patch body (`encode` + `merge_patch`, compact JSON). The naive
baseline patches every sample; its body size is charged as the node's last real body (every
value has a fixed width except the integer fields, so the sizes match within a few bytes).
Start-up jitter sets each node's phase, and the scorer's reads are spread uniformly between
ticks.

**Scale.** The simulation cost {tick_s * 1e6:.0f} us of Python per node per tick in this run (the
real aggregation and limiter), so a 5,000-node hour is 3.6 M node-ticks, about
{3.6e6 * tick_s / 60:.0f} minutes on its own: too long to add to a regeneration that must finish
in a few minutes. The committed numbers simulate {cfg.nodes} nodes
exactly; fleets up to {cfg.nodes} are the first n of those nodes (exact sums), and larger fleets
are the measured per-node rate times the node count. That is exact in expectation, because
agents do not interact: each decides alone about its own Node, the API answers each patch on its
own, and the write rate of a fleet is the sum of its nodes' rates. As a check, the last row is a
whole {exact.config.nodes:,}-node fleet over a shorter span (`{exact_cmd}`, the first
{exact.config.warmup_s:g} s left out as everywhere): {num(exact.writes_per_s, 1)} writes/s against
{num(exact.config.nodes * per_node, 1)} extrapolated, data age p50 {num(exact_ages["p50"])} s,
max {num(exact_ages["max"])} s.

**Second cost.** kube-scheduler retries every unschedulable pod within ~50 ms of any node
annotation change (captured on a real v1.36 scheduler:
tests/fixtures/kube-scheduler-v1.36/README.md), so the model
charges one extender filter call per pending pod per write: extender calls/s = writes/s x
pending pods, here {PENDING_PODS} pending pods. That is an upper bound: a pod already in the
scheduler's back-off queue is not retried twice, so at very high write rates the real cost
saturates at (pending pods / back-off), 1 s doubling to 10 s per pod.

{table}

Data age (the scorer's clock minus the sampling time of the last written state), sampled for
every node once per interval at a uniformly random moment, API up (the contract's `updated-at`
has one-second resolution, so a reader computing the age from it sees up to 1 s more):

{age_table}

Where the writes go (writes per node per minute; naive is {60 / cfg.interval_s:g}):

{profile_table}

Why they were written: {reason_line}. A change-driven write can name several fields:

{trigger_table}

Sensitivity ({variants[0][1].config.nodes if variants else 0} nodes,
{span(variants[0][1].config.duration_s) if variants else "-"}, same traces and seed):

{variant_table}

{verdict}

{per_gpu_text}

{burst}

![writes per second against fleet size](img/writes_vs_fleet.png)

![data age distribution](img/data_age.png)
"""


def _per_gpu_paragraph(main: FleetResult, variants: Sequence[tuple[str, FleetResult]]) -> str:
    """How the per-GPU keys fit the write budget, from the sensitivity rows that show it."""
    ratio = {label: r.write_ratio for label, r in variants}

    def row(index: int) -> str:
        label = VARIANTS[index].label
        return f"{ratio[label]:.1%}" if label in ratio else "n/a"

    sent = {label: r.bytes_per_s for label, r in variants}
    with_key, without_key = sent.get(VARIANTS[0].label), sent.get(VARIANTS[9].label)
    bytes_ratio = f"{with_key / without_key:.2f} x" if with_key and without_key else "n/a"

    return f"""**Per-GPU keys in the budget.** Every write here carries the four per-GPU keys (one
value per GPU, allocations from the trace's pods), and they take part in the write rules. In the
sensitivity runs: node-level keys alone under DESIGN.md's rules write {row(1)} of naive (the
budget before per-GPU data); per-GPU keys under the same rules, each GPU against its own written
value, {row(2)}. One GPU's 5 s utilization wanders far more than the node mean (eight GPUs' noise
does not average out), so on a serving node some GPU crosses 0.05 on most ticks. The defaults
write on the per-GPU movements a scorer can act on (docs/agent.md, "Departures from the design's
defaults"): per-GPU values are compared as a multiset, because the scheduler picks the node and the
device plugin the GPU, so GPUs trading places changes no decision ({row(4)} without it); deadbands
are direction-aware, so a move towards less headroom is written at once and one towards more
headroom waits for three deadbands or the heartbeat, and published values err towards less
headroom ({row(3)} without it); a GPU's utilization deadband is 0.15, one score step at the default
weights ({row(5)} at 0.05); temperature deadbands are 5 C, since a degree is worth 0.15/40 of the
score and matters only at the filter limit ({row(6)} at 3 C). An allocation flip is a discrete
change. Result: {main.write_ratio:.1%} of naive over {main.config.nodes} nodes, with every GPU's
values at most one heartbeat old.

**Per-pod figures in the budget.** Every write also carries `pod-gpu-usage`: which pods hold each
GPU and what each uses of it (`fleet_sim/pods.py`: one training pod on all of a node's GPUs, a
serving pod per GPU on diurnal nodes, a pod per batch run, and on inference nodes every GPU
time-sliced into 4 replicas shared by 2-4 serving pods whose parts of the GPU's SM time wander;
their figures come from the agent's own attribution, per process on the shared GPUs). Without
the key the same fleet writes {row(9)} of naive; with it, at the default per-pod deadbands
(utilization 0.15, memory 5 % of one GPU), {row(0)}; at the node's utilization deadband of
0.05, {row(10)}: a pod holding a GPU alone has the GPU's own utilization, which wanders as the
per-GPU values do, and every pod is compared with its own written figures. Which pods hold which
GPU changes only when the allocations do, so it adds few writes of its own. The key makes the
bodies larger: the fleet sends {bytes_ratio} the bytes per second it sends without it."""


def run(ctx: RunContext) -> str:
    """Simulate the fleet, its whole large check and every variant; draw; write the section."""
    sizes, seed, img = ctx.sizes, ctx.fleet_seed, ctx.img
    main_cfg = FleetConfig(nodes=sizes.fleet_nodes, duration_s=sizes.fleet_duration_s, seed=seed)
    started = len(ctx.timings)
    main_result = ctx.timed(
        f"{STEP}{main_cfg.nodes} nodes x {main_cfg.duration_s:g} s",
        lambda: simulate(main_cfg),
    )
    exact_cfg = FleetConfig(nodes=sizes.exact_nodes, duration_s=sizes.exact_duration_s, seed=seed)
    exact_result = ctx.timed(
        f"{STEP}{exact_cfg.nodes} nodes x {exact_cfg.duration_s:g} s",
        lambda: simulate(exact_cfg),
    )
    variant_results: list[tuple[str, FleetResult]] = []
    for variant in VARIANTS:
        cfg = FleetConfig(
            nodes=sizes.variant_nodes,
            duration_s=sizes.variant_duration_s,
            seed=seed,
            policy=variant.policy,
            per_gpu=variant.per_gpu,
            pods=variant.pods,
        )
        variant_results.append(
            (
                variant.label,
                ctx.timed(f"{VARIANT_STEP}{variant.label}", functools.partial(simulate, cfg)),
            )
        )
    sim_sizes = [n for n in (50, 100, 250, 500, 1000) if n <= main_cfg.nodes] or [main_cfg.nodes]
    if sim_sizes[-1] != main_cfg.nodes:
        sim_sizes.append(main_cfg.nodes)
    fig_writes_vs_fleet(
        sim_sizes,
        [main_result.writes_per_s_first(n) for n in sim_sizes],
        per_node=main_result.writes_per_s / main_cfg.nodes,
        naive_per_node=main_result.naive_writes_per_s / main_cfg.nodes,
        path=img / "writes_vs_fleet.png",
        exact=exact_result,
    )
    fig_data_age(main_result, img / "data_age.png")
    ctx.summary["fleet"] = main_result.summary(PENDING_PODS)
    ctx.summary["fleet_whole"] = exact_result.summary(PENDING_PODS)
    ctx.summary["variants"] = {label: r.summary(PENDING_PODS) for label, r in variant_results}
    return render(
        main_result,
        variant_results,
        sizes_sim=sim_sizes,
        seed=seed,
        wall_s=ctx.timings[started].seconds,
        exact=exact_result,
    )


SECTION: Final = Section(name="fleet", heading=HEADING, steps=(STEP, VARIANT_STEP), run=run)
