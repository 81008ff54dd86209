"""The pod's own load: what a pod will add to each GPU it gets, once it runs.

A GPU at 0.60 passes a 0.90 limit, but a pod that will keep it 0.50 busy pushes it to 1.10. So
the scorer judges each GPU by the load it will carry once the pod runs, as Koordinator's
LoadAware plugin adds a pod's estimated CPU to the node's usage in Filter and Score. The estimate
of the pod's load per GPU (utilization, and the memory its processes hold) comes from, first
found:

1. **hint**: the pod's `expected-gpu-load` and `expected-gpu-memory-mib` annotations, the
   workload owner's word (a pod whose hint disagrees with its siblings follows its hint);
2. **learned**: what the running pods of its workload (`exporter_scheduler.core.workload`) use
   per GPU, as the agent reports per pod (`pod-gpu-usage`), taken by `learn` below;
3. **default**: the policy's figure for pods with neither (`own_load_gpu_load`,
   `own_load_gpu_memory_mib`).

Each figure is chosen on its own: a pod may hint its memory and take its utilization from its
siblings.

`learn` is a pure function of a workload's samples and `now`: the 90th percentile (nearest
rank) of the per-GPU samples that are at most `max_age_s` old, once they come from at least
`min_pods` distinct pods. A high quantile, not the mean: the estimate is there to keep a GPU under
the limit, and a replica that serves a hot shard of the traffic is as likely to be the next one
as any other; not the maximum: one sample taken during a spike would hold the whole workload at
its peak. Old samples age out, so the figure follows a workload whose load changes (a new model
revision, a traffic shift) within `max_age_s`. Below the floor the figure is not trusted: one
replica, sampled once, may be idle between two requests, or still starting. The floor counts
pods, not samples: the eight GPUs of one training worker, sampled at one instant, are one
observation of one pod (a worker still loading its data reads idle on all eight).

The learned figures are rounded *up* to a step (`UTILIZATION_STEP_BP`, `MEMORY_STEP_MIB`): the
estimate is part of a pod's class in the names-only verdict cache, and a class must not change
with every new sample, or cached verdicts would be rebuilt on each; rounding up keeps the
rounding on the safe side.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Final, Literal, NamedTuple

import msgspec

BASIS_POINTS: Final = 10_000
# Steps the learned figures are rounded up to: 0.05 utilization, 1 GiB.
UTILIZATION_STEP_BP: Final = 500
MEMORY_STEP_MIB: Final = 1024
LEARNED_QUANTILE: Final = 0.9
# How long a pod runs before an idle-looking reading is learned as its load
# (serving/workloads.py): the longest start-up the placement model draws, a notebook's first
# cell (training 20-120 s, inference 15-90 s; docs/performance.md).
DEFAULT_SETTLE_S: Final = 300.0

Source = Literal["hint", "learned", "default"]


class UsageSample(NamedTuple):
    """One pod's use of one GPU, as one agent write reported it (`pod-gpu-usage`)."""

    pod: str  # namespace/name
    gpu_index: int
    # The node's `updated-at`: when the agent sampled it (node clock).
    sampled_at: datetime
    utilization_bp: int | None  # None: the agent could not attribute it
    memory_mib: int | None


class Learned(msgspec.Struct, frozen=True, gc=False):
    """A workload's learned load per GPU, rounded up to the steps; None where too few samples."""

    utilization_bp: int | None
    memory_mib: int | None
    samples: int  # the per-GPU samples the figures were taken from
    pods: int  # the distinct pods those samples came from


class OwnLoad(msgspec.Struct, frozen=True, gc=False):
    """The load a verdict counts for the pod on each GPU it would get, and where each figure
    came from (`explain` shows both)."""

    utilization_bp: int
    utilization_source: Source
    memory_mib: int
    memory_source: Source
    # The learned figures' basis (0 when neither figure is learned).
    samples: int = 0
    pods: int = 0
    # The workload's figure the estimate was drawn from (an in-flight pod carries it on).
    learned: Learned | None = None


def round_up(value: int, step: int) -> int:
    return -(-value // step) * step


def quantile_nearest_rank(values: list[int], quantile: float) -> int:
    """The nearest-rank quantile of a non-empty list (sorted here)."""
    values.sort()
    rank = max(1, math.ceil(quantile * len(values)))
    return values[rank - 1]


def learn(
    samples: Iterable[UsageSample],
    now: datetime,
    *,
    max_age_s: float,
    min_pods: int,
) -> Learned | None:
    """A workload's learned load from its pods' samples (module docstring), or None when
    neither figure has recent samples from at least `min_pods` distinct pods."""
    oldest = now - timedelta(seconds=max_age_s)
    utilizations: list[int] = []
    memories: list[int] = []
    utilization_pods: set[str] = set()
    memory_pods: set[str] = set()
    for sample in samples:
        if sample.sampled_at < oldest or sample.sampled_at > now:
            continue
        if sample.utilization_bp is not None:
            utilizations.append(min(BASIS_POINTS, max(0, sample.utilization_bp)))
            utilization_pods.add(sample.pod)
        if sample.memory_mib is not None:
            memories.append(max(0, sample.memory_mib))
            memory_pods.add(sample.pod)
    util_bp = mem_mib = None
    samples_used = 0
    pods: set[str] = set()
    if len(utilization_pods) >= min_pods:
        util_bp = min(
            BASIS_POINTS,
            round_up(quantile_nearest_rank(utilizations, LEARNED_QUANTILE), UTILIZATION_STEP_BP),
        )
        samples_used, pods = len(utilizations), utilization_pods
    if len(memory_pods) >= min_pods:
        mem_mib = round_up(quantile_nearest_rank(memories, LEARNED_QUANTILE), MEMORY_STEP_MIB)
        samples_used, pods = max(samples_used, len(memories)), pods | memory_pods
    if util_bp is None and mem_mib is None:
        return None
    return Learned(util_bp, mem_mib, samples_used, len(pods))


def own_load(
    hint_load: float | None,
    hint_memory_mib: int | None,
    learned: Learned | None,
    default_load: float,
    default_memory_mib: int,
) -> OwnLoad:
    """The estimate a verdict counts: each figure from the hint, else learned, else default."""
    util_source: Source
    mem_source: Source
    if hint_load is not None:
        util_bp, util_source = round(hint_load * BASIS_POINTS), "hint"
    elif learned is not None and learned.utilization_bp is not None:
        util_bp, util_source = learned.utilization_bp, "learned"
    else:
        util_bp, util_source = round(default_load * BASIS_POINTS), "default"
    if hint_memory_mib is not None:
        mem_mib, mem_source = hint_memory_mib, "hint"
    elif learned is not None and learned.memory_mib is not None:
        mem_mib, mem_source = learned.memory_mib, "learned"
    else:
        mem_mib, mem_source = default_memory_mib, "default"
    used = learned is not None and "learned" in (util_source, mem_source)
    return OwnLoad(
        util_bp,
        util_source,
        mem_mib,
        mem_source,
        learned.samples if used and learned is not None else 0,
        learned.pods if used and learned is not None else 0,
        learned,
    )


def describe(load: OwnLoad) -> str:
    """One line for explanations: `0.45 (learned from 6 pods), 8192 MiB (hint)`."""

    def source(kind: Source) -> str:
        return f"learned from {load.pods} pods" if kind == "learned" else kind

    return (
        f"{load.utilization_bp / BASIS_POINTS:.2f} ({source(load.utilization_source)}), "
        f"{load.memory_mib} MiB ({source(load.memory_source)})"
    )
