"""The placement section: how each scheduling policy places one pod stream, simulated.

It runs `fleet_sim.placement` with every policy on the same fleet and stream, draws the
per-policy and burst metrics and the fragmentation timeline, and writes the section: the model,
the grading, the comparison tables, and notes written from the numbers (so a rerun cannot leave
a stale claim). The table's names for the scorer's variants and the causes of pushed GPUs are
also the across-seeds section's.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

import numpy as np

from benchmarks.sections import markdown as md
from benchmarks.sections.markdown import num, span
from benchmarks.sections.plots import plt, save
from benchmarks.sections.section import RunContext, Section
from fleet_sim.placement import (
    JOB_SPREAD_S,
    JOB_WORKER_GPUS,
    JOB_WORKERS,
    POLICIES,
    PUSH_CAUSES,
    SCALE_UP_REPLICAS,
    SCALE_UP_SPREAD_S,
    SCORER_POLICIES,
    WORKLOADS,
    PlacementConfig,
    PlacementResult,
    compare,
    lag_summary,
    make_nodes,
    make_pods,
)

HEADING: Final = "## Scheduling quality"
# How its one step begins in the timing table.
STEP: Final = "placement: "

PLACEMENT_METRICS: tuple[tuple[str, str], ...] = (
    ("fewer_suitable", "fewer than k GPUs\nsuitable"),
    ("memory_fit_failures", "memory-fit\nfailures"),
    ("gpus_pushed_over_limit", "GPUs pushed over\nthe limit (GPUs)"),
    ("above_limit", "above limit,\ncooler node free"),
    ("chain_violations", "chain\nviolations"),
    ("hot_placements", "placed at/above\ntemp. limit"),
    ("pending_at_end", "pending\nat end"),
)


def fig_placement(results: Mapping[str, PlacementResult], path: Path) -> None:
    summaries = {p: r.summary() for p, r in results.items()}
    fig, ax = plt.subplots(figsize=(13, 5))
    width = 0.84 / max(1, len(summaries))
    x = np.arange(len(PLACEMENT_METRICS))
    for i, (policy, summary) in enumerate(summaries.items()):
        values = [float(summary[key]) for key, _ in PLACEMENT_METRICS]
        bars = ax.bar(x + i * width - 0.42 + width / 2, values, width, label=policy)
        ax.bar_label(bars, labels=[f"{v:.0f}" for v in values], fontsize=5)
    ax.set_xticks(x, [label for _, label in PLACEMENT_METRICS], fontsize=8)
    ax.set_ylabel("Pods (GPUs where marked)")
    ax.set_title("Placement quality on the same pod stream")
    ax.legend(fontsize=7, ncols=2)
    ax.grid(True, axis="y", alpha=0.3)
    save(fig, path)


# What the other work on a pushed GPU was (`fleet_sim.placement.PUSH_CAUSES`), as the plot and the
# table name it.
PUSH_CAUSE_LABELS: Mapping[str, str] = {
    "in-flight": "a pod in flight at the bind",
    "busy-at-bind": "GPU above the limit at the bind",
    "after-bind": "work that came after the bind",
    "within-limit": "work there at the bind, GPU within the limit",
}


def fig_placement_burst(results: Mapping[str, PlacementResult], path: Path) -> None:
    """The three burst metrics per policy; the pushed GPUs stacked by what pushed them."""
    summaries = {p: r.summary() for p, r in results.items()}
    names = list(summaries)
    x = np.arange(len(names))
    colors = [f"C{i}" for i in range(len(names))]
    fig, (short, pushed, pending) = plt.subplots(1, 3, figsize=(15, 5), sharex=True)
    values = [float(summaries[p]["burst_short_placements"]) for p in names]
    bars = short.bar(x, values, color=colors)
    short.bar_label(bars, labels=[f"{v:.0f}" for v in values], fontsize=7)
    short.set_title("Pods of bursts placed on a node short of\nsuitable GPUs (another had room)")
    short.set_ylabel("Pods")
    bottom = np.zeros(len(names))
    for i, cause in enumerate(PUSH_CAUSES):
        counts = np.asarray(
            [float(summaries[p]["gpus_pushed_over_limit_by_cause"][cause]) for p in names]
        )
        # A palette of its own: the other panels colour the policies.
        color = plt.get_cmap("viridis")(i / max(1, len(PUSH_CAUSES) - 1))
        pushed.bar(x, counts, bottom=bottom, color=color, label=PUSH_CAUSE_LABELS[cause])
        bottom += counts
    pushed.bar_label(pushed.containers[-1], labels=[f"{v:.0f}" for v in bottom], fontsize=7)
    pushed.set_ylim(0, max(1.0, float(bottom.max())) * 1.5)  # room for the legend above the bars
    pushed.set_title("GPUs pushed over the utilization limit,\nby what else was on them")
    pushed.set_ylabel("GPUs")
    pushed.legend(fontsize=7, loc="upper right")
    values = [float(summaries[p]["pending_at_end"]) for p in names]
    bars = pending.bar(x, values, color=colors)
    pending.bar_label(bars, labels=[f"{v:.0f}" for v in values], fontsize=7)
    pending.set_title("Pods pending at the end")
    pending.set_ylabel("Pods")
    for ax in (short, pushed, pending):
        ax.set_ylim(bottom=0)
        ax.set_xticks(x, names, rotation=40, ha="right", fontsize=7)
        ax.grid(True, axis="y", alpha=0.3)
    save(fig, path)


def fig_fragmentation(results: Mapping[str, PlacementResult], path: Path) -> None:
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    for policy, result in results.items():
        minutes = np.asarray(result.sample_times_s) / 60.0
        top.plot(minutes, result.stranded, label=policy)
        bottom.plot(minutes, result.pending, label=policy)
    top.set_ylabel("Free GPU slots on partly\nused nodes (share)")
    top.set_title("Fragmentation and queue over time")
    bottom.set_ylabel("Pods pending")
    bottom.set_xlabel("Simulated time (min)")
    for ax in (top, bottom):
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    save(fig, path)


# The scorer variants of the "what each part buys" table: (policy, label), from neither part to
# both.
PARTS: tuple[tuple[str, str], ...] = (
    ("per-gpu-without-either", "neither part"),
    ("per-gpu-without-inflight", "blind-plugin rule only"),
    ("per-gpu-without-blind-plugin", "in-flight pods only"),
    ("per-gpu", "both (`per-gpu`)"),
)
PART_METRICS: tuple[tuple[str, str], ...] = (
    ("burst_short_placements", "pods of bursts on a node short of suitable GPUs"),
    ("short_placements", "all pods on a node short of suitable GPUs"),
    ("gpus_pushed_over_limit", "GPUs pushed over the limit"),
    ("gpus_pushed_over_limit_burst", "of them by pods of bursts"),
    ("pending_at_end", "pods pending at the end"),
    ("memory_fit_failures", "memory-fit failures"),
    ("fewer_suitable", "placements with fewer than k GPUs suitable"),
)
# The target for both parts together, against neither: GPUs pushed over the limit at most this
# share, and no more pods pending at the end.
PUSHED_TARGET_SHARE = 0.20


def _parts_table(summaries: Mapping[str, Mapping[str, Any]]) -> str:
    """Each scorer variant's figures, and each as a share of the scorer without either part."""
    present = [(p, label) for p, label in PARTS if p in summaries]
    base = summaries.get(PARTS[0][0])
    rows = []
    for key, label in PART_METRICS:
        cells = [label]
        for policy, _ in present:
            value = int(summaries[policy][key])
            reference = int(base[key]) if base is not None else 0
            share = f" ({value / reference:.0%})" if reference and policy != PARTS[0][0] else ""
            cells.append(f"{value}{share}")
        rows.append(cells)
    return md.table(["metric", *(label for _, label in present)], rows)


def _pushed_by_cause_table(summaries: Mapping[str, Mapping[str, Any]]) -> str:
    rows = [
        [
            f"`{policy}`",
            str(s["gpus_pushed_over_limit"]),
            *(str(s["gpus_pushed_over_limit_by_cause"][c]) for c in PUSH_CAUSES),
        ]
        for policy, s in summaries.items()
    ]
    return md.table(
        ["policy", "GPUs pushed over the limit", *(PUSH_CAUSE_LABELS[c] for c in PUSH_CAUSES)],
        rows,
    )


def _lag_paragraph(lag: Mapping[str, float], config: PlacementConfig) -> str:
    model = config.lag
    ramps = ", ".join(f"{kind} {low:.0f}-{high:.0f} s" for kind, low, high in model.ramp_s)
    delay = config.scorer_policy.inflight_load_delay_s
    cached = f"{model.cached_start_s[0]:g}-{model.cached_start_s[1]:g} s"
    share = f"{model.image_cached_share:.0%}"
    return f"""**Lag model** (`fleet_sim.placement.LagModel`, what happens after the bind). The
kubelet admits a pod {model.admission_delay_s:g} s after the bind (the device plugin allocates,
`status.startTime` is set); its containers run {cached} later when the image is on the node
({share} of pods), otherwise after a pull drawn log-normal with median {model.pull_median_s:g} s
(PyTorch/CUDA images are 7-13 GB; 10 % of pulls under 30 s, 10 % over 3 min, at most
{model.pull_max_s / 60:g} min); the pod's memory is taken then (a pod that does not fit dies
then); its load reaches the GPUs after a ramp (CUDA context, NCCL, weights copied to the GPU,
warm-up: {ramps}). The agent sees the allocation at its first sample after admission and the
load as the mean utilization since its previous sample, so a load shows in full one sample after
it arrives; the real write limiter decides when either is written. Over this stream: containers
running a median {num(lag["start_delay_p50_s"])} s after admission (p90
{num(lag["start_delay_p90_s"], 0)} s), ramp median {num(lag["ramp_p50_s"], 0)} s (p90
{num(lag["ramp_p90_s"], 0)} s), bind to load median {num(lag["bind_to_load_p50_s"], 0)} s
(p90 {num(lag["bind_to_load_p90_s"], 0)} s). For {lag["load_after_delay_share"]:.0%} of pods
the load reaches the agent's window only after the scorer's `inflight_load_delay_s` ({delay:g} s
after the containers run) has passed: for those, a node-level verdict stops counting the load
before the node can show it. (Per-GPU verdicts do not read that delay: where allocations are
published, only pods whose allocation is not shown yet hold GPUs under the k-GPU rule.)"""


def render(
    summaries: Mapping[str, Mapping[str, Any]],
    config: PlacementConfig,
    lag: Mapping[str, float] | None = None,
) -> str:
    """The section from each policy's `PlacementResult.summary()` (as kept in figures.json)."""
    rows = []
    for policy, s in summaries.items():
        rows.append(
            [
                f"`{policy}`",
                f"{s['placed']}/{s['pods']}",
                f"{s['burst_short_placements']} / {s['short_placements']}",
                f"{s['fewer_suitable']} ({s['fewer_suitable_multi_gpu']}) "
                f"[{s['fewer_suitable_unseen']}]",
                f"{s['memory_fit_failures']} ({s['memory_fit_failures_undeclared']} / "
                f"{s['memory_fit_failures_multi_gpu']})",
                f"{s['gpus_pushed_over_limit']} ({s['gpus_pushed_over_limit_burst']})",
                f"{s['above_limit']} ({s['above_limit_clear']}) [{s['above_limit_unseen']}]",
                f"{s['chain_violations']} ({s['chain_violations_clear']}) "
                f"[{s['chain_violations_unseen']}] of {s['chain_pods']}",
                str(s["hot_placements"]),
                f"{s['pending_at_end']} ({s['pending_multi_gpu']} / {s['pending_burst']})",
                num(float(s["wait_p95_s"]), 0),
                f"{float(s['stranded_mean']):.2f}",
            ]
        )
    table = md.table(
        [
            "policy",
            "placed",
            "short of suitable GPUs, another node had room (bursts / all)",
            "fewer than k GPUs suitable (multi-GPU) [unseen]",
            "memory-fit failures (no hint / multi-GPU)",
            "GPUs pushed over the limit (by bursts)",
            "above limit (clear) [unseen]",
            "chain violations (clear) [unseen]",
            "at/above temp. limit",
            "pending at end (4+ GPUs / bursts)",
            "wait p95 (s)",
            "stranded free slots",
        ],
        rows,
    )
    notes = _placement_notes(summaries)
    pools = ", ".join(
        f"{p.name.upper()} x{p.gpu_count}"
        + (f" (time-sliced x{p.slots_per_gpu})" if p.slots_per_gpu > 1 else "")
        for p in config.pools
    )
    mix = ", ".join(f"{kind} {share:.0%}" for kind, share, _, _ in WORKLOADS)
    jobs = config.burst_share * config.job_share_of_bursts
    workers = "/".join(str(n) for n, _ in JOB_WORKERS)
    worker_gpus = "/".join(str(n) for n, _ in JOB_WORKER_GPUS)
    replicas = "/".join(str(n) for n, _ in SCALE_UP_REPLICAS)
    cmd = (
        f"python -m fleet_sim.placement --nodes {config.nodes} --duration-s "
        f"{config.duration_s:g} --seed {config.seed} --workers 2"
    )
    lag_text = "" if not lag else _lag_paragraph(lag, config) + "\n\n"
    parts = _parts_table(summaries)
    causes = _pushed_by_cause_table(summaries)
    return f"""{HEADING}

Command: `{cmd}` (`--workers` runs that many policies at a time, each in its own process; the
numbers do not depend on it).

**Model** (`fleet_sim/placement.py`). {config.nodes} nodes in pools {pools}; a Poisson stream
({mix}) of training pods (1, 2, 4 or 8 GPUs, 16-70 GB per GPU, ~90 % busy, half preferring
`A100,H100`, some `H100,A100`), inference pods (1 GPU, 4-14 GB, 15-55 % busy, some preferring
`L4,T4` or `A100,V100`), shared inference (tensor-parallel replicas over 2 time-sliced GPUs,
5-11 GB and 25-45 % busy on each, `L4,T4`, memory declared, `expected-gpu-load` set to that
share) and notebooks (1 or 2 GPUs), and bursts, {config.burst_share:.0%} of the load: training
jobs ({jobs:.0%} of the load; {workers} workers of {worker_gpus} GPUs each, copies of one
template, arriving within {JOB_SPREAD_S:g} s) and inference scale-ups ({replicas} replicas of
one inference or shared-inference template created within {SCALE_UP_SPREAD_S:g} s); offered at
{config.offered_load:.0%} of the fleet's GPU slots for {span(config.duration_s)}; 70 % of the
other pods declare `min-gpu-memory-mib`, chains use `gpu-fallback-utilization: 0.80`.
{config.unaccounted_share:.0%} of nodes have episodes of GPU work the scheduler does not account
for ({config.unaccounted_all_gpus_share:.0%} of the episodes on every GPU of the node, the
others on one GPU to half of them), {config.hot_share:.0%} run hot. The default scheduler's
allocation accounting comes first for every policy (a node without enough free GPU slots is no
candidate; a bound pod holds its slots at once); each policy then takes its best-scored node,
ties broken uniformly at random (seeded); a pod no node accepts stays pending and is retried
with kube-scheduler's back-off (1 s doubling to 10 s). The device plugin hands a pod the
least-shared free slots, lowest GPU index first, blind to load (the scorer does not rely on that
order: it takes the pick as random).

{lag_text}**Policies.** `per-gpu` is the scorer's real `evaluate()` with its defaults on the
annotations each node's agent last wrote through the real aggregation (with the kubelet's
allocations, so `per-gpu-allocated` is published), limiter and encoder: multi-GPU pods get the
k-GPU rule; every node's bound pods are passed as in-flight pods (`NodeInput.pods`: bind,
admission and container-start times, the pod's `expected-gpu-load` and `min-gpu-memory-mib`),
and the pods placed earlier in the same second count as the scorer's own provisional proposals
on their node, as `PodCache.propose` makes them before the binds reach the watch;
`blind_device_plugin` is on. `per-gpu-without-inflight` passes no pods (a scorer without pod
RBAC), `per-gpu-without-blind-plugin` runs `blind_device_plugin: false` (the best k candidates
counted) with in-flight pods, `per-gpu-without-either` neither (the scorer before in-flight
accounting). `node-aggregate` is the scorer, with in-flight pods, on the same writes with the
four per-GPU keys left out (a scorer that reads only the node-level keys, or this one on an
older agent); `utilization-only` reads the same annotations.

**Grading.** Every placement is graded against the truth at binding time, with the slots of
pods bound before it taken. "Short of suitable GPUs": the node had fewer suitable GPUs than the
pod asks while another node allocation accounting allowed, of a model the pod accepts, had
enough. "Fewer than k GPUs suitable": the node had fewer than the pod's k GPUs with a free slot,
utilization at or below 0.90, temperature below 85 °C and the pod's real memory need free
(declared or not); "[unseen]": the published per-GPU values showed k such GPUs (the truth had
moved since the agent's last write). "Memory-fit failure": the pod's memory did not fit on a GPU
it was given when its containers started (it dies with CUDA out-of-memory). "GPUs pushed over
the limit": when the pod's load arrived, GPUs it shares with other work (other pods on a
time-sliced GPU, or unaccounted work) whose utilization it took above 0.90; a GPU the pod has
alone is not counted. "Above limit": the node was above the 0.90 utilization limit while a
feasible node at or below it existed. "Chain violation": a feasible node of a better-ranked
model, under the temperature limit, had the pod's k GPUs suitable at the fallback threshold (a
free slot, utilization at or below it, the pod's memory free). "(clear)": only cases where the
truth was at least one deadband (0.05) from the limit or threshold; "[unseen]": cases that
vanish when graded on the published annotations instead of the truth. Stranded free slots: the
share of free GPU slots on partly used nodes (capacity a whole-node job cannot use).

{table}

**What each part buys.** The scorer with neither part, with one, and with both; in brackets,
the share of the figure without either part.

{parts}

**GPUs pushed over the limit, by what else was on them**, seen from the pushing pod's bind (the
first that applies): another pod bound before it whose load arrived only after its bind (in
flight then: what in-flight accounting is for); a GPU above the limit at the bind that the device
plugin handed out anyway (what the blind-plugin rule is for); work that came after the bind
(unaccounted work starting, a pod bound later); work there at the bind on a GPU at or below the
limit (a candidate by every rule of the scorer).

{causes}

![burst metrics per policy](img/placement_burst.png)

{chr(10).join(n + chr(10) for n in notes)}
![placement metrics per policy](img/placement.png)

![fragmentation and pending pods over time](img/fragmentation.png)
"""


def _placement_notes(summaries: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """What the table says, written from its numbers (so a rerun cannot leave a stale claim)."""
    per_gpu = summaries.get("per-gpu")
    node = summaries.get("node-aggregate")
    if per_gpu is None:
        return []
    notes: list[str] = []
    baselines = {p: s for p, s in summaries.items() if p not in SCORER_POLICIES}

    def n(summary: Mapping[str, Any], key: str) -> int:
        return int(summary[key])

    if node is not None:
        pairs = [
            ("placements on a node with fewer than k suitable GPUs", "fewer_suitable"),
            ("of them for multi-GPU pods", "fewer_suitable_multi_gpu"),
            ("memory-fit failures", "memory_fit_failures"),
            ("of them multi-GPU pods", "memory_fit_failures_multi_gpu"),
            ("GPUs pushed over the utilization limit", "gpus_pushed_over_limit"),
            ("pods pending at the end", "pending_at_end"),
        ]
        changes = "; ".join(f"{label} {n(node, key)} -> {n(per_gpu, key)}" for label, key in pairs)
        notes.append(
            "**Per-GPU against node-aggregate** (the same scorer and the same writes, with and "
            f"without the per-GPU keys): {changes}."
        )
        if n(per_gpu, "fewer_suitable"):
            notes.append(
                f"Of `per-gpu`'s {n(per_gpu, 'fewer_suitable')} placements with fewer than k "
                f"suitable GPUs, {n(per_gpu, 'fewer_suitable_unseen')} looked suitable in the "
                "published per-GPU values (a pod had landed or load had moved since the agent's "
                "last write, within the deadbands and the minimum write interval), and "
                f"{n(per_gpu, 'fewer_suitable_undeclared')} were pods that declared no memory "
                "need (the truth grades their real need; the scorer cannot know it); the two "
                "groups overlap."
            )
        pushed = n(per_gpu, "gpus_pushed_over_limit")
        if pushed:
            by_cause = per_gpu["gpus_pushed_over_limit_by_cause"]
            notes.append(
                f"`per-gpu` still pushed {pushed} GPUs over the limit; "
                f"{by_cause['within-limit']} of them had work on them at the bind and were at "
                "or below the limit (on exclusive nodes nearly all of it unaccounted work, "
                f"{n(per_gpu, 'gpus_pushed_over_limit_unaccounted')} of the {pushed} GPUs had no "
                "other pod's load): the scorer knows a GPU's load, not the load the pod being "
                "placed will add, so a GPU at 0.55 is a candidate for a training pod that takes "
                f"it to 1.0. {by_cause['in-flight']} had a pod in flight at the bind, "
                f"{by_cause['busy-at-bind']} were above the limit at the bind, "
                f"{by_cause['after-bind']} got their other work after the bind."
            )
    others = ", ".join(f"{s['memory_fit_failures']} ({p})" for p, s in baselines.items())
    fewer = all(
        n(per_gpu, "memory_fit_failures") < n(s, "memory_fit_failures") for s in baselines.values()
    )
    notes.extend(_parts_notes(summaries))
    notes.append(
        "**Targets.** "
        f"above-limit placements: {per_gpu['above_limit']} "
        f"({'met' if n(per_gpu, 'above_limit') == 0 else 'NOT met'}: target 0); "
        f"chain violations: {per_gpu['chain_violations']} "
        f"({'met' if n(per_gpu, 'chain_violations') == 0 else 'NOT met'}: target 0; "
        f"{per_gpu['chain_violations_clear']} outside the deadband); memory-fit failures: "
        f"{per_gpu['memory_fit_failures']} against {others} "
        f"({'met' if fewer else 'NOT met'}: fewer than every baseline)."
    )
    above_seen = n(per_gpu, "above_limit") - n(per_gpu, "above_limit_unseen")
    chain_seen = n(per_gpu, "chain_violations") - n(per_gpu, "chain_violations_unseen")
    misses = n(per_gpu, "above_limit") + n(per_gpu, "chain_violations")
    if misses:
        notes.append(
            f"Of `per-gpu`'s {misses} above-limit placements and chain violations, "
            f"{misses - above_seen - chain_seen} vanish when graded on the published annotations "
            "instead of the truth: the scorer decided correctly on what the agent had written, "
            "and the truth had moved since."
            + (
                f" {above_seen} above-limit placement(s) remain on the published data: that "
                "grading reads the node mean, which the k-GPU rule deliberately does not enforce "
                "(a node above 0.90 on average can have the k idle GPUs a pod needs)."
                if above_seen
                else ""
            )
            + (
                f" {chain_seen} chain violation(s) remain on the published data."
                if chain_seen
                else ""
            )
        )
    pend = n(per_gpu, "pending_at_end")
    base_pend = max((n(s, "pending_at_end") for s in baselines.values()), default=0)
    if pend > base_pend:
        notes.append(
            f"**Where the scorer's policies lose.** `per-gpu` leaves {pend} pods pending at the "
            f"end (baselines at most {base_pend}); the placed pods' p95 wait is "
            f"{num(float(per_gpu['wait_p95_s']), 0)} s. Of the {pend}, "
            f"{per_gpu['pending_with_chain']} named a model chain and "
            f"{per_gpu['pending_multi_gpu']} asked for 4 or 8 GPUs: big training pods that "
            "want A100 or H100 nodes, which are full. The scorer does not place a chain's pod "
            "on an unlisted model (unless the chain ends with `*`) and refuses nodes without k "
            "suitable GPUs, so these pods wait, where the baselines put them on whatever has "
            "free slots: a V100 or a time-sliced T4/L4, which counts a chain violation and, "
            "for most of them, a memory-fit failure (the pod dies). Waiting is what the hints "
            "ask for, but at this offered load the preferred pools are too small, and an "
            "operator would see a growing queue rather than crashing pods."
        )
    if n(per_gpu, "memory_fit_failures"):
        notes.append(
            f"`per-gpu`'s remaining memory-fit failures: "
            f"{per_gpu['memory_fit_failures_undeclared']} were pods that gave no "
            "`min-gpu-memory-mib` hint (the scorer cannot know their need), and "
            f"{per_gpu['memory_fit_failures_multi_gpu']} were multi-GPU pods (stale per-GPU "
            "values, or a device plugin handing out a free GPU other than the counted ones); "
            "the two groups overlap."
        )
    return notes


def _parts_notes(summaries: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """The target for in-flight accounting and the blind-plugin rule together, and why."""
    both, neither = summaries.get("per-gpu"), summaries.get("per-gpu-without-either")
    if both is None or neither is None:
        return []
    pushed = int(both["gpus_pushed_over_limit"])
    pushed_before = int(neither["gpus_pushed_over_limit"])
    pending, pending_before = int(both["pending_at_end"]), int(neither["pending_at_end"])
    pushed_met = pushed <= PUSHED_TARGET_SHARE * pushed_before
    pending_met = pending <= pending_before
    share = f"{pushed / pushed_before:.0%}" if pushed_before else "n/a"
    notes = [
        "**Target for both parts** (GPUs pushed over the limit at most "
        f"{PUSHED_TARGET_SHARE:.0%} of the scorer's without either, no more pods pending at "
        f"the end): pushed {pushed} against {pushed_before} ({share}: "
        f"{'met' if pushed_met else 'NOT met'}); pending {pending} against {pending_before} "
        f"({'met' if pending_met else 'NOT met'}). Pods of bursts placed on a node short of "
        f"suitable GPUs while another had room: {both['burst_short_placements']} against "
        f"{neither['burst_short_placements']}; memory-fit failures "
        f"{both['memory_fit_failures']} against {neither['memory_fit_failures']}."
    ]
    if not pushed_met:
        reachable = sum(
            int(neither["gpus_pushed_over_limit_by_cause"][cause])
            for cause in ("in-flight", "busy-at-bind")
        )
        notes.append(
            f"Why the pushed-GPU target is not met: of the {pushed_before} GPUs the scorer "
            f"without either part pushed over the limit, {reachable} had a pod in flight at the "
            "bind or were above the limit then, the cases the two parts are for; the others "
            f"({neither['gpus_pushed_over_limit_by_cause']['within-limit']} with their work there "
            "at the bind, at or below the limit) are candidates by every rule, in-flight pods "
            "or not, because no rule counts what the pod being placed will add. The default "
            "scheduler's allocation accounting already keeps a burst from taking more slots "
            "than a node has, so in-flight pods change a decision only where slots and "
            "suitable GPUs differ: unaccounted work on free GPUs, time-sliced GPUs, free "
            "memory."
        )
    return notes


def run(ctx: RunContext) -> str:
    """Place the stream under every policy, draw the three figures, write the section."""
    placement_cfg = PlacementConfig(
        nodes=ctx.sizes.placement_nodes,
        duration_s=ctx.sizes.placement_duration_s,
        seed=ctx.placement_seed,
    )
    # One process per policy at a time, as many as there are cores: each run is seeded on its
    # own, so the numbers do not depend on it.
    workers = max(1, min(len(POLICIES), os.cpu_count() or 1))
    placement: dict[str, PlacementResult] = ctx.timed(
        f"{STEP}{placement_cfg.nodes} nodes x {placement_cfg.duration_s:g} s, "
        f"{len(POLICIES)} policies",
        # A `dict[str, ...]`, as the figures and `render` take it (any policy name, not only a
        # `PolicyName`).
        lambda: dict(compare(placement_cfg, workers=workers).items()),
    )
    fig_placement(placement, ctx.img / "placement.png")
    fig_placement_burst(placement, ctx.img / "placement_burst.png")
    fig_fragmentation(placement, ctx.img / "fragmentation.png")
    lag = lag_summary(make_pods(placement_cfg, make_nodes(placement_cfg)), placement_cfg)
    summaries = {p: r.summary() for p, r in placement.items()}
    ctx.summary["placement"] = summaries
    ctx.summary["placement_lag"] = lag
    return render(summaries, placement_cfg, lag)


SECTION: Final = Section(name="placement", heading=HEADING, steps=(STEP,), run=run)
