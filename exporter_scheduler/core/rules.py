"""The node rules: what one node's data says for a pod class, once the data is dated.

Two paths, chosen by `judge_node` from the data's status. `judge_fresh` runs the rules in their
order (health, utilization, temperature, memory, model, then the k-GPU rule of `core.gpus` where
the node publishes per-GPU data), the first failure giving the reason, then scores what passed.
`untimely` applies the missing-data policy to data that cannot be judged (missing, invalid,
stale, skewed, untrusted): lenient passes it with the lowest score and says why; strict rejects
it. Every outcome and reason text is the pod class's own (`core.podclass`), shared between nodes.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime

from exporter_scheduler.core.dra import Exclusion, gpu_exclusions
from exporter_scheduler.core.gpus import judge_gpus
from exporter_scheduler.core.hints import model_rank
from exporter_scheduler.core.inflight import InFlight
from exporter_scheduler.core.podclass import PodClass
from exporter_scheduler.core.records import (
    BASIS_POINTS,
    DataStatus,
    GpuCheck,
    NodeVerdict,
    RuleOutcome,
    Rules,
)
from exporter_scheduler.core.score import SCORE_MEMO_MAX, combine, fragmentation_headroom, score
from gpu_contract.schema import DecodedAnnotations, Health, NodeGpuState


def judge_fresh(  # noqa: PLR0917 (judge_node's locals, passed positionally on the hot path)
    name: str,
    decoded: DecodedAnnotations,
    state: NodeGpuState,
    age_s: float,
    server_age_s: float | None,
    written: datetime | None,
    c: PodClass,
    inflight: InFlight | None = None,
    dra_excluded: Mapping[str, Exclusion] | None = None,
) -> NodeVerdict:
    """Fresh data: the node-level rules in order (the first failure gives the reason), the
    k-GPU rule where the node publishes per-GPU data and the pod asks for GPUs, then the score
    of what passed. In-flight pods count as the rules read them: on node-level data their
    estimated load and memory are added to what the node published; under the k-GPU rule they
    hold GPUs (`core.gpus`)."""
    rank = model_rank(state.gpu_model, c.patterns, c.any_rank) if c.chain_active else None
    # Per-GPU truth decides for a pod asking k GPUs: the k-GPU rule replaces the node-level
    # utilization and memory rules, whose values are summaries (mean, maximum) of the same
    # per-GPU readings. The temperature rule stays: a node's GPUs share its cooling, and an
    # idle GPU's temperature says nothing about its temperature under load (docs/scoring.md).
    per_gpu = None
    if state.gpus and c.gpu_request > 0:
        if dra_excluded is None:
            per_gpu = judge_gpus(state.gpus, c, inflight)
        else:
            # DRA: the GPUs the allocator will not give, and the GPUs it gives the pod here.
            excluded = gpu_exclusions(dra_excluded, state.gpus)
            node_gpus = len(state.gpus)
            on_node = c.for_node(node_gpus, node_gpus - len(excluded))
            per_gpu = judge_gpus(state.gpus, on_node, inflight, excluded)
    failed: RuleOutcome | None = None
    status: DataStatus = "fresh"
    health = c.health_fail if state.health is Health.UNAVAILABLE else c.health_pass
    if health is c.health_fail:
        failed = health

    utilization = state.utilization
    utilization_bp = 0
    judged_utilization: float | None = None
    if utilization is None:
        # The data status stays the node-level one: per-GPU values do not stand in for it.
        status = "invalid" if "utilization invalid" in decoded.problems else "missing"
        util = c.util_unknown[status]
    else:
        utilization_bp = round(utilization * BASIS_POINTS)
        if per_gpu is not None:
            util = c.util_per_gpu
        else:
            if inflight is not None and inflight.load_bp:
                # The load of pods the node's mean cannot show yet, spread over its GPUs.
                added_bp = inflight.load_bp // max(state.gpu_count or 1, 1)
                utilization_bp = min(BASIS_POINTS, utilization_bp + added_bp)
                judged_utilization = utilization_bp / BASIS_POINTS
            if c.own_bp:
                # The pod's own load on the k GPUs it gets, in the node's mean over its GPUs.
                node_gpus = max(state.gpu_count or 1, 1)
                own_gpus = min(c.gpu_request, node_gpus)
                added_bp = c.own_bp * own_gpus // node_gpus
                utilization_bp = min(BASIS_POINTS, utilization_bp + added_bp)
                judged_utilization = utilization_bp / BASIS_POINTS
            util = c.util_fail if utilization_bp > c.limit_bp else c.util_pass
    if failed is None and util.outcome == "fail":
        failed = util

    temperature_c = state.temperature_c
    if temperature_c is None:
        temp = c.temp_unknown
    else:
        temp = c.temp_fail if temperature_c >= c.policy.temperature_limit_c else c.temp_pass
    if failed is None and temp.outcome == "fail":
        failed = temp

    mem = c.mem_skip
    judged_largest: int | None = None
    if c.min_memory_mib is not None:
        largest = state.memory_largest_free_mib
        if per_gpu is not None:
            mem = c.mem_per_gpu
        elif largest is None:
            mem = c.mem_unknown
        else:
            if inflight is not None and inflight.memory_mib:
                # As if every in-flight pod took its memory from the GPU with the most free.
                largest = judged_largest = max(0, largest - inflight.memory_mib)
            mem = c.mem_fail if largest < c.min_memory_mib else c.mem_pass
        if failed is None and mem.outcome == "fail":
            failed = mem

    model = c.model_skip
    if c.chain_active:
        model = c.model_unlisted if rank is None else c.model_pass
        if failed is None and rank is None:
            failed = model

    gpus = c.gpus_skip
    check: GpuCheck | None = None
    if per_gpu is not None:
        gpus, check = per_gpu.outcome, per_gpu.check
        if failed is None and gpus.outcome == "fail":
            failed = gpus

    rules = Rules(health, util, temp, mem, model, gpus)
    if failed is not None or status != "fresh":
        # A failed rule; or, lenient on a node whose utilization is unknown, a pass that scores
        # lowest and says why.
        return NodeVerdict(
            name=name,
            passed=failed is None,
            reason=c.status_reason[status] if failed is None else failed.reason,
            unresolvable=failed is not None and failed.unresolvable,
            score=0,
            data_status=status,
            inputs=decoded,
            rules=rules,
            age_s=age_s,
            server_age_s=server_age_s,
            agent_write_time=written,
            model_rank=rank,
            gpus=check,
            inflight=inflight,
            utilization_judged=judged_utilization,
            memory_largest_free_judged_mib=judged_largest,
        )
    if per_gpu is not None:
        breakdown = combine(
            per_gpu.utilization_headroom_bp,
            fragmentation_headroom(state.memory_fragmentation),
            per_gpu.temperature_headroom_bp,
            c.weights,
        )
        below = c.chain_active and per_gpu.at_or_below_threshold
    else:
        key = (utilization_bp, state.memory_fragmentation, temperature_c)
        memoised = c.score_memo.get(key)  # a dict lookup: half an lru_cache call
        if memoised is None:
            memoised = score(utilization_bp, state.memory_fragmentation, temperature_c, c.weights)
            if len(c.score_memo) >= SCORE_MEMO_MAX:
                c.score_memo.clear()
            c.score_memo[key] = memoised
        breakdown = memoised
        below = c.chain_active and utilization_bp <= c.threshold_bp
    return NodeVerdict(
        name=name,
        passed=True,
        reason=None,
        unresolvable=False,
        score=breakdown.score,
        data_status="fresh",
        inputs=decoded,
        rules=rules,
        breakdown=breakdown,
        age_s=age_s,
        server_age_s=server_age_s,
        agent_write_time=written,
        model_rank=rank,
        at_or_below_threshold=below,
        gpus=check,
        inflight=inflight,
        utilization_judged=judged_utilization,
        memory_largest_free_judged_mib=judged_largest,
    )


def untimely(  # noqa: PLR0917 (judge_node's locals, passed positionally on the hot path)
    name: str,
    decoded: DecodedAnnotations,
    status: DataStatus,
    age_s: float | None,
    server_age_s: float | None,
    written: datetime | None,
    c: PodClass,
) -> NodeVerdict:
    """Data that cannot be judged (missing, invalid, stale, skewed): the missing-data policy."""
    state = decoded.state
    rank: int | None = None
    if c.chain_active:
        model = None if state is None else state.gpu_model
        rank = model_rank(model, c.patterns, c.any_rank)
    reason = c.status_reason[status]
    if not c.lenient:
        return NodeVerdict(
            name=name,
            passed=False,
            reason=reason,
            unresolvable=True,
            score=0,
            data_status=status,
            inputs=decoded,
            rules=c.not_checked,
            age_s=age_s,
            server_age_s=server_age_s,
            agent_write_time=written,
            model_rank=rank,
        )
    rules = c.not_checked
    if c.chain_active:
        if rank is None:
            # A model the chain does not list fails whether or not its data can be judged.
            return NodeVerdict(
                name=name,
                passed=False,
                reason=c.model_unlisted.reason,
                unresolvable=True,
                score=0,
                data_status=status,
                inputs=decoded,
                rules=c.not_checked_unlisted,
                age_s=age_s,
                server_age_s=server_age_s,
                agent_write_time=written,
                model_rank=rank,
            )
        rules = c.not_checked_listed
    return NodeVerdict(
        name=name,
        passed=True,
        reason=reason,
        unresolvable=False,
        score=0,
        data_status=status,
        inputs=decoded,
        rules=rules,
        age_s=age_s,
        server_age_s=server_age_s,
        agent_write_time=written,
        model_rank=rank,
    )
