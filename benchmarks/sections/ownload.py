"""The pod's own load: the four estimate sources over every seed, and a sweep of the default.

The scorer counts the load a pod will add to a GPU (docs/scoring.md). This section compares
where that estimate comes from (learned from the workload's running pods, the policy default,
nothing, or an oracle that knows each pod's true load) on the placement model, by the two
things it trades: GPUs pushed over the limit and pods left waiting.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any, Final

from benchmarks.sections import markdown as md
from benchmarks.sections.plots import plt, save
from benchmarks.sections.section import RunContext, Section
from fleet_sim.placement import PlacementConfig, PolicyName, compare

HEADING: Final = "## The pod's own load"
# How its steps begin in the timing table.
STEP: Final = "own load: "

OWN_LOAD_POLICIES: tuple[PolicyName, ...] = (
    "per-gpu",
    "per-gpu-without-own-load",
    "per-gpu-oracle-load",
    "per-gpu-default-load",
)
OWN_LOAD_SWEEP: tuple[float, ...] = (0.1, 0.3, 0.5, 0.7)
# The sweep runs shorter simulations on two seeds: a trend across defaults, not the headline.
OWN_LOAD_SWEEP_DURATION_S = 3600.0


def render(summary: Mapping[str, Any], img: Path) -> str:
    """The section from the `placement_own_load` entry of `summary` (figures.json); writes
    `img/placement_own_load.png`: GPUs pushed against pods pending per policy, and the sweep."""
    data: Mapping[str, Any] = summary["placement_own_load"]
    seeds_data: Mapping[str, Mapping[str, Any]] = data["seeds"]

    def total(policy: str, key: str, runs: Mapping[str, Mapping[str, Any]] = seeds_data) -> int:
        return sum(int(by_policy[policy][key]) for by_policy in runs.values())

    pushed = {p: total(p, "gpus_pushed_over_limit") for p in OWN_LOAD_POLICIES}
    pending = {p: total(p, "pending_at_end") for p in OWN_LOAD_POLICIES}
    rows = [
        [f"`{p}`", str(pushed[p]), str(pending[p]), str(total(p, "placed"))]
        for p in OWN_LOAD_POLICIES
    ]
    table = md.table(
        ["policy", "GPUs pushed over the limit", "pods pending at the end", "placed"], rows
    )
    sweep_data: Mapping[str, Mapping[str, Mapping[str, Any]]] = data.get("sweep", {})
    sweep_rows: list[list[str]] = []
    for value, runs in sweep_data.items():
        cells = [
            f"{total(p, 'gpus_pushed_over_limit', runs)} / {total(p, 'pending_at_end', runs)}"
            for p in ("per-gpu", "per-gpu-default-load")
        ]
        sweep_rows.append([value, *cells])
    sweep_table = md.table(
        [
            "own_load_gpu_load",
            "`per-gpu`: pushed / pending",
            "`per-gpu-default-load`: pushed / pending",
        ],
        sweep_rows,
    )
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for p in OWN_LOAD_POLICIES:
        ax.scatter(pushed[p], pending[p], s=40, label=p)
        ax.annotate(
            p, (pushed[p], pending[p]), fontsize=7, xytext=(4, 4), textcoords="offset points"
        )
    if sweep_data:
        xs = [total("per-gpu", "gpus_pushed_over_limit", r) for r in sweep_data.values()]
        ys = [total("per-gpu", "pending_at_end", r) for r in sweep_data.values()]
        ax.plot(xs, ys, "k--", lw=0.8, label="per-gpu, default swept (2 seeds)")
        for value, x, y in zip(sweep_data, xs, ys, strict=True):
            ax.annotate(value, (x, y), fontsize=6, xytext=(3, -8), textcoords="offset points")
    ax.set_xlabel("GPUs pushed over the limit (summed over seeds)")
    ax.set_ylabel("pods pending at the end (summed)")
    ax.set_title("The pod's own load: GPUs pushed against pods waiting")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    save(fig, img / "placement_own_load.png")
    seed_list = ",".join(seeds_data)
    sweep_s = float(data.get("sweep_duration_s", 0.0))
    sweep_seeds = ",".join(next(iter(sweep_data.values()), {}).keys()) or "-"
    command = (
        f"python -m fleet_sim.placement --nodes {data['nodes']} --duration-s "
        f"{data['duration_s']:g} --seeds {seed_list} "
        + " ".join(f"--policy {p}" for p in OWN_LOAD_POLICIES)
    )
    oracle, without = pushed["per-gpu-oracle-load"], pushed["per-gpu-without-own-load"]
    pending_ratio = pending["per-gpu"] / max(1, pending["per-gpu-oracle-load"])
    ratios = (
        f"`per-gpu` pushes {pushed['per-gpu'] / oracle:.2f}x as many GPUs over the limit as "
        f"`per-gpu-oracle-load` and {pushed['per-gpu'] / without:.0%} as many as "
        f"`per-gpu-without-own-load`, and leaves {pending_ratio:.2f}x "
        "as many pods pending as the oracle"
        if oracle and without
        else "no GPU was pushed over the limit by the oracle or the scorer without own load"
    )
    return f"""{HEADING}

Command: `{command}`. Each policy runs the project's scorer on the stream of
[the model above](#scheduling-quality), whose pods belong to workloads (inference Deployments
whose replicas share a traffic-driven load, training Jobs, singletons) and give no load hint:
`per-gpu` counts each pod's own load as learned from its workload's running pods by the
scorer's real store, out of the simulated agents' `pod-gpu-usage`, else the default
(`own_load_gpu_load`); `per-gpu-without-own-load` judges GPUs by their load now;
`per-gpu-oracle-load` knows each pod's true mean load and memory; `per-gpu-default-load` uses
the default alone. Summed over the seeds:

{table}

{ratios}.

![GPUs pushed against pods pending](img/placement_own_load.png)

The default estimate, swept ({sweep_s:g} s runs on seeds {sweep_seeds}; each cell: GPUs pushed
over the limit / pods pending at the end, summed):

{sweep_table}
"""


def run(ctx: RunContext) -> str:
    """Simulate the four policies on every seed and the default's sweep, then render."""
    sizes = ctx.sizes
    base = PlacementConfig(nodes=sizes.placement_nodes, duration_s=sizes.placement_duration_s)
    workers = max(1, min(len(OWN_LOAD_POLICIES), os.cpu_count() or 1))
    seeds: dict[str, dict[str, Any]] = {}
    sweep: dict[str, dict[str, Any]] = {}
    for seed in sizes.placement_seeds:
        config = replace(base, seed=seed)
        results = ctx.timed(
            f"{STEP}seed {seed}, {len(OWN_LOAD_POLICIES)} policies",
            functools.partial(compare, config, OWN_LOAD_POLICIES, workers=workers),
        )
        seeds[str(seed)] = {p: r.summary() for p, r in results.items()}
    for default in OWN_LOAD_SWEEP:
        policy = replace(base.scorer_policy, own_load_gpu_load=default)
        sweep[f"{default:.2f}"] = {
            str(seed): {
                p: r.summary()
                for p, r in compare(
                    replace(
                        base,
                        seed=seed,
                        scorer_policy=policy,
                        duration_s=min(base.duration_s, OWN_LOAD_SWEEP_DURATION_S),
                    ),
                    ("per-gpu", "per-gpu-default-load"),
                    workers=2,
                ).items()
            }
            for seed in sizes.placement_seeds[:2]
        }
    ctx.summary["placement_own_load"] = {
        "nodes": base.nodes,
        "duration_s": base.duration_s,
        "seeds": seeds,
        "sweep": sweep,
        "sweep_duration_s": min(base.duration_s, OWN_LOAD_SWEEP_DURATION_S),
    }
    return render(ctx.summary, ctx.img)


SECTION: Final = Section(name="own-load", heading=HEADING, steps=(STEP,), run=run)
