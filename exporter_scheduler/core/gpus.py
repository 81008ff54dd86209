"""The k-GPU rule: a pod asking k GPUs is judged on a node's per-GPU table, not its summaries.

A GPU is a candidate when it passes, in this order: it is measured (lenient: some NVML value
is; strict: every value the rules read is), it is unallocated (only when allocations are
published; a GPU the kubelet does not offer, `-`, is not), its utilization is at or below the
pod's limit, its temperature below the limit, and it has the pod's `min-gpu-memory-mib` free
(when set). Lenient, an unmeasured utilization, temperature or memory does not disqualify the
GPU, and scores as no headroom.

In-flight pods hold GPUs the data cannot show as theirs: the pods whose allocation is pending
where allocations are published, else those whose load is pending. Which GPUs the device plugin
gave them is unknown, so they are taken to hold candidates, the best first: the worst case for
this pod, and the one that never counts a GPU twice.

Which GPUs this pod will get is the device plugin's choice too, blind to load. Where allocations
are published, the plugin hands out k of its pool (the unallocated GPUs that are measured at
all, less the in-flight ones), any k as far as the scorer can tell; so the node passes when the
chance that k drawn at random are all candidates (`fit_bp`) reaches the policy's
`min_gpu_fit_probability`, and the score reads the expected headroom of the GPUs handed out: the
mean over the pool, a GPU that is no candidate counting as none. Where allocations are unknown,
the pool is unknown too: the node passes with k candidates and the score reads the best k (by
the headrooms under the policy's weights, ties by index), as they are under the policy's
`blind_device_plugin: false` (a load-aware allocator). A node short of k candidates is rejected
with the reason of the first criterion after which fewer than k GPUs remain (in-flight GPUs
count as allocated).

The rule runs in three stages: `_survey` sorts each GPU into a candidate or the first criterion
it failed, `_hold_for_inflight` gives the in-flight pods their GPUs, and one of `_shortfall`,
`_blind_draw` and `_best_k` reads the outcome. The survey runs per GPU of every node judged,
so it counts in plain locals.

A DRA pod (`core.dra`) is judged the same way on what kube-scheduler's allocator may give it:
the GPUs allocated to other claims (`allocated`) and those with a taint its claims do not
tolerate (`tainted`) leave the pool, the claims' allocations are the allocations (known, so the
blind draw applies: the allocator takes the first fit, blind to load), and in-flight pods hold
no GPUs: their claims' allocations are in the claims the scheduler writes before binding.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Final, NamedTuple

from exporter_scheduler.core.dra import Exclusion
from exporter_scheduler.core.inflight import InFlight
from exporter_scheduler.core.podclass import PodClass
from exporter_scheduler.core.records import (
    BASIS_POINTS,
    GpuCheck,
    GpuStatus,
    RuleOutcome,
)
from exporter_scheduler.core.score import TEMPERATURE_HEADROOM_SPAN_C
from gpu_contract.schema import GpuState

# A GPU's failed criterion -> its place among the counts of GPUs that failed a criterion first
# (`GPU_STEPS` after `gpu-count`). A GPU not offered counts as allocated.
_FAILED_STEP: Final[dict[GpuStatus, int]] = {
    "unmeasured": 0,
    "allocated": 1,
    "not-offered": 1,
    "tainted": 1,
    "utilization": 2,
    "temperature": 3,
    "memory": 4,
}
_ALLOCATED_STEP: Final = 1

# A candidate, sorted best first: (-merit, index, utilization headroom, temperature headroom,
# at or below the chain's threshold). A plain tuple: it is built per candidate GPU and sorted.
_Candidate = tuple[int, int, int, int, bool]


class GpuJudgement(NamedTuple):
    """The k-GPU rule's result on one node: its outcome, the findings for the explanation,
    and what the score and the chain read of the GPUs the pod may get."""

    outcome: RuleOutcome
    check: GpuCheck
    utilization_headroom_bp: int  # expected over the GPUs the pod may get
    temperature_headroom_bp: int
    # The pod is as likely to get k GPUs at or below the chain's threshold as the rule asks.
    at_or_below_threshold: bool


class _Survey(NamedTuple):
    status: list[GpuStatus]  # per GPU in NVML index order
    failed_first: list[int]  # GPUs that failed each criterion first, in `_FAILED_STEP` order
    pool: list[int]  # the device plugin's pool (allocations published): GPU indexes
    candidates: list[_Candidate]  # best first


def fit_bp(suitable: int, pool: int, k: int) -> int:
    """The chance, in basis points rounded down, that k GPUs drawn at random without
    replacement from `pool` GPUs of which `suitable` are candidates are all candidates:
    C(suitable, k) / C(pool, k), in integers so that it is exact and the same everywhere."""
    if k <= 0:
        return BASIS_POINTS
    if suitable < k or pool < k:
        return 0
    return math.comb(suitable, k) * BASIS_POINTS // math.comb(pool, k)


def judge_gpus(
    gpus: tuple[GpuState, ...],
    c: PodClass,
    inflight: InFlight | None = None,
    excluded: Mapping[int, Exclusion] | None = None,
) -> GpuJudgement | None:
    """The k-GPU rule (k = the pod's GPU request, at least 1) on a node's per-GPU table, or
    None when no GPU has an NVML value (nothing per GPU to judge: the node-level rules apply).
    `excluded`: a DRA pod's GPUs the allocator will not give it (`core.dra`), None for any other
    pod. The module docstring has the rule."""
    allocation_checked = excluded is not None
    if not allocation_checked:
        for gpu in gpus:
            if gpu.allocated is not None:
                allocation_checked = True
                break
    survey = _survey(gpus, c, allocation_checked=allocation_checked, excluded=excluded)
    if survey is None:
        return None
    held = 0
    if inflight is not None and excluded is None:
        held = inflight.allocation_gpus if allocation_checked else inflight.load_gpus
    taken = _hold_for_inflight(survey, held) if held else 0
    pool = survey.pool
    if taken and allocation_checked:
        pool = [i for i in pool if survey.status[i] != "in-flight"]
    if len(survey.candidates) < c.gpu_request:
        return _shortfall(survey, c, len(gpus), taken, pool if allocation_checked else None)
    if allocation_checked and (c.policy.blind_device_plugin or excluded is not None):
        return _blind_draw(survey, c, taken, len(pool))
    return _best_k(survey, c, taken, allocation_checked=allocation_checked)


def _survey(
    gpus: tuple[GpuState, ...],
    c: PodClass,
    *,
    allocation_checked: bool,
    excluded: Mapping[int, Exclusion] | None = None,
) -> _Survey | None:
    """Each GPU as a candidate or the first criterion it failed; None when every GPU is lost."""
    limit_bp, threshold_bp = c.limit_bp, c.threshold_bp
    # The pod's own load: a GPU is a candidate only if it stays within the limit under it,
    # and its headroom is what is left after it.
    own_bp = c.own_bp
    fit_limit_bp = limit_bp - own_bp
    temp_limit_c = c.policy.temperature_limit_c
    min_mib = c.min_memory_mib
    strict = not c.lenient
    w_util, w_temp = c.weights.utilization, c.weights.temperature
    status: list[GpuStatus] = []
    add = status.append
    unmeasured = allocated_n = hot_util = hot_temp = short_mem = 0
    lost = 0
    pool: list[int] = []
    candidates: list[_Candidate] = []
    for index, (u, mib, temp_c, allocated, _device) in enumerate(gpus):
        if u is None and mib is None and temp_c is None:
            lost += 1  # lost, or nothing NVML could read: not a GPU the pod can use
            unmeasured += 1
            add("unmeasured")
            continue
        offered = not allocation_checked or allocated is False
        exclusion: Exclusion | None = None
        if excluded is not None:
            # DRA: the claims say what is allocated; a GPU the kubelet reports held stays held.
            exclusion = excluded.get(index)
            offered = exclusion is None and not allocated
        if offered and allocation_checked:
            pool.append(index)
        u_bp = -1 if u is None else round(u * BASIS_POINTS)
        if strict and (u_bp < 0 or temp_c is None or (min_mib is not None and mib is None)):
            unmeasured += 1
            add("unmeasured")
            continue
        if not offered:
            allocated_n += 1
            if exclusion is not None:
                add(exclusion)
            else:
                add("allocated" if allocated else "not-offered")
            continue
        if u_bp > fit_limit_bp:
            hot_util += 1
            add("utilization")
            continue
        if temp_c is None:
            temp_headroom = 0
        elif temp_c >= temp_limit_c:
            hot_temp += 1
            add("temperature")
            continue
        else:  # `score.temperature_headroom` inline: above 0 here, capped at the full headroom
            temp_headroom = (temp_limit_c - temp_c) * BASIS_POINTS // TEMPERATURE_HEADROOM_SPAN_C
            temp_headroom = min(temp_headroom, BASIS_POINTS)
        if min_mib is not None and mib is not None and mib < min_mib:
            short_mem += 1
            add("memory")
            continue
        add("candidate")
        util_headroom = 0 if u_bp < 0 else max(0, BASIS_POINTS - u_bp - own_bp)
        merit = w_util * util_headroom + w_temp * temp_headroom
        candidates.append((-merit, index, util_headroom, temp_headroom, 0 <= u_bp <= threshold_bp))
    if lost == len(gpus):
        return None
    candidates.sort()
    failed_first = [unmeasured, allocated_n, hot_util, hot_temp, short_mem]
    return _Survey(status, failed_first, pool, candidates)


def _hold_for_inflight(survey: _Survey, held: int) -> int:
    """Give the in-flight pods `held` GPUs: the best candidates, then (more GPUs held than there
    are candidates) the pool's other GPUs in index order. Each taken GPU becomes `in-flight`
    and counts as allocated, not as what it failed before. Returns how many were taken."""
    status, failed_first = survey.status, survey.failed_first
    taken_candidates = survey.candidates[:held]
    del survey.candidates[:held]
    for candidate in taken_candidates:
        status[candidate[1]] = "in-flight"
    taken = len(taken_candidates)
    for index in survey.pool:
        if taken >= held:
            break
        if status[index] != "in-flight":
            failed_first[_FAILED_STEP[status[index]]] -= 1
            status[index] = "in-flight"
            taken += 1
    failed_first[_ALLOCATED_STEP] += taken
    return taken


def _shortfall_step(total: int, failed_first: Sequence[int], k: int) -> int:
    """The index in `GPU_STEPS` of the first criterion after which fewer than k of `total` GPUs
    remain (`failed_first[i]`: the GPUs that failed step i + 1 first); 0 when total < k."""
    remaining = total
    if remaining < k:
        return 0
    for step, count in enumerate(failed_first, start=1):
        remaining -= count
        if remaining < k:
            return step
    raise AssertionError("called with k candidates or more")


def _shortfall(
    survey: _Survey, c: PodClass, total: int, taken: int, pool: list[int] | None
) -> GpuJudgement:
    """Fewer than k candidates: rejected with the reason of the criterion that made it so."""
    k = c.gpu_request
    check = GpuCheck(
        needed=k,
        candidates=len(survey.candidates),
        status=tuple(survey.status),
        counted=(),
        allocation_checked=pool is not None,
        inflight=taken,
        pool=None if pool is None else len(pool),
        fit_bp=None if pool is None else 0,
    )
    outcome = c.gpus_fail[_shortfall_step(total, survey.failed_first, k)]
    return GpuJudgement(outcome, check, 0, 0, at_or_below_threshold=False)


def _blind_draw(survey: _Survey, c: PodClass, taken: int, pool_size: int) -> GpuJudgement:
    """A blind device plugin hands out any k of its pool: the node passes on the chance that
    all k are candidates, and expected headrooms are means over the pool."""
    k = c.gpu_request
    candidates = survey.candidates
    chance_bp = fit_bp(len(candidates), pool_size, k)
    below_bp = fit_bp(sum(1 for entry in candidates if entry[4]), pool_size, k)
    check = GpuCheck(
        needed=k,
        candidates=len(candidates),
        status=tuple(survey.status),
        counted=tuple(sorted(entry[1] for entry in candidates)),
        allocation_checked=True,
        inflight=taken,
        pool=pool_size,
        fit_bp=chance_bp,
    )
    return GpuJudgement(
        c.gpus_pass if chance_bp >= c.min_fit_bp else c.gpus_unlikely,
        check,
        _mean_bp(sum(entry[2] for entry in candidates), pool_size),
        _mean_bp(sum(entry[3] for entry in candidates), pool_size),
        at_or_below_threshold=below_bp >= c.min_fit_bp,
    )


def _best_k(survey: _Survey, c: PodClass, taken: int, *, allocation_checked: bool) -> GpuJudgement:
    """The pod gets the best k candidates (allocations unknown, or a load-aware allocator)."""
    k = c.gpu_request
    candidates = survey.candidates
    best = candidates[:k]
    check = GpuCheck(
        needed=k,
        candidates=len(candidates),
        status=tuple(survey.status),
        counted=tuple(entry[1] for entry in best),
        allocation_checked=allocation_checked,
        inflight=taken,
    )
    return GpuJudgement(
        c.gpus_pass,
        check,
        _mean_bp(sum(entry[2] for entry in best), k),
        _mean_bp(sum(entry[3] for entry in best), k),
        at_or_below_threshold=sum(1 for entry in candidates if entry[4]) >= k,
    )


def _mean_bp(total_bp: int, count: int) -> int:
    """A mean in basis points, rounded half up (integers, as every step of the score)."""
    return (2 * total_bp + count) // (2 * count)
