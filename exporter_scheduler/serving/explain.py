"""Explanations: every verdict spelled out for the operator, as JSON-able data and as text.

Filter reasons are deliberately uniform (they are counted by text in the pod's events), so the
node's own values, the data's age by both clocks, each rule's outcome and the score's arithmetic
are shown here instead: `gpu-scorer explain` and `POST <prefix>/explain` come from `explain`
(the per-node log lines from `serving.logfields`). Output is deterministic: lists keep input
order and nothing iterates a set.
"""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime
from typing import Any

import msgspec

from exporter_scheduler.core.dra import DraPod
from exporter_scheduler.core.hints import HINT_NAMES
from exporter_scheduler.core.ownload import Learned, OwnLoad
from exporter_scheduler.core.ownload import describe as describe_own_load
from exporter_scheduler.core.policy import Policy, format_fraction_limit, weight_milli
from exporter_scheduler.core.records import (
    BASIS_POINTS,
    Evaluation,
    GpuStatus,
    NodeVerdict,
    PodInput,
    ScoreBreakdown,
)
from exporter_scheduler.core.score import TEMPERATURE_HEADROOM_SPAN_C
from exporter_scheduler.core.spread import SpreadCheck
from gpu_contract.schema import NodeGpuState


def _time(moment: datetime | None) -> str | None:
    if moment is None:
        return None
    aware = moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment
    return aware.astimezone(UTC).isoformat().replace("+00:00", "Z")


def _seconds(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def _fraction(bp: int) -> float:
    return bp / BASIS_POINTS


def explain(
    evaluation: Evaluation,
    pod: PodInput,
    now: datetime,
    policy: Policy,
    *,
    spread: SpreadCheck | None = None,
) -> dict[str, Any]:
    """Everything behind `evaluation`, as plain JSON-able data (str keys, no NaN, no sets).
    `spread`: the pod's spread cap as applied to the same nodes (already in the verdicts)."""
    w_util, w_frag, w_temp = weight_milli(policy)
    prefix = policy.keys.prefix
    hint_annotations = {
        prefix + name: pod.annotations[prefix + name]
        for name in HINT_NAMES
        if isinstance(pod.annotations.get(prefix + name), str)
    }
    problem = evaluation.hint_problem
    hints = evaluation.hints
    chain = evaluation.chain
    why_not = _why_not_texts(
        format_fraction_limit(evaluation.utilization_limit),
        policy.temperature_limit_c,
        hints.min_gpu_memory_mib,
    )
    nodes = [_node(v, why_not) for v in evaluation.verdicts]
    reasons: dict[str, int] = {}
    for verdict in evaluation.verdicts:
        if not verdict.passed and verdict.reason is not None:
            reasons[verdict.reason] = reasons.get(verdict.reason, 0) + 1
    return {
        "now": _time(now),
        "pod": {
            "namespace": pod.namespace,
            "name": pod.name,
            "gpu_request": pod.gpu_request,
            "hint_annotations": hint_annotations,
            # Only for a pod asking GPUs through DRA (judged on the devices the allocator may
            # give it: each GPU's status says `allocated` to another claim or `tainted`).
            **({} if pod.dra is None else {"dra": _dra(pod.dra)}),
        },
        "hints": {
            "model_preference": list(hints.model_preference),
            "fallback_utilization": hints.fallback_utilization,
            "max_utilization": hints.max_utilization,
            "min_gpu_memory_mib": hints.min_gpu_memory_mib,
            "expected_gpu_load": hints.expected_gpu_load,
            "spread_max_per_domain": hints.spread_max_per_domain,
            "spread_topology_key": hints.spread_topology_key,
            "expected_gpu_memory_mib": hints.expected_gpu_memory_mib,
        },
        "own_load": _own_load(evaluation.own_load),
        "hint_error": (
            None
            if problem is None
            else {
                "annotation": problem.annotation,
                "value": problem.value,
                "problem": problem.problem,
                "reason": problem.reason,
            }
        ),
        "policy": {
            "profile": policy.profile,
            "annotation_prefix": prefix,
            "utilization_limit": policy.utilization_limit,
            "effective_utilization_limit": evaluation.utilization_limit,
            "temperature_limit_c": policy.temperature_limit_c,
            "stale_after_s": policy.stale_after_s,
            "clock_skew_tolerance_s": policy.clock_skew_tolerance_s,
            "managed_fields_lag_tolerance_s": policy.managed_fields_lag_tolerance_s,
            "missing_data": policy.missing_data,
            "require_agent_writer": policy.require_agent_writer,
            "inflight_max_s": policy.inflight_max_s,
            "inflight_load_delay_s": policy.inflight_load_delay_s,
            "inflight_gpu_load": policy.inflight_gpu_load,
            "min_gpu_fit_probability": policy.min_gpu_fit_probability,
            "own_load": policy.own_load,
            "own_load_gpu_load": policy.own_load_gpu_load,
            "own_load_gpu_memory_mib": policy.own_load_gpu_memory_mib,
            "weights": {
                "utilization": w_util / 1000,
                "fragmentation": w_frag / 1000,
                "temperature": w_temp / 1000,
            },
        },
        "chain": (
            None
            if chain is None
            else {
                "preference": list(chain.preference),
                "threshold": chain.threshold,
                "chosen": chain.chosen,
                "basis": chain.basis,
            }
        ),
        "spread": None if spread is None else _spread(spread),
        "nodes": nodes,
        "summary": {
            "nodes": len(nodes),
            "passed": sum(1 for v in evaluation.verdicts if v.passed),
            "failed": sum(1 for v in evaluation.verdicts if not v.passed and not v.unresolvable),
            "unresolvable": sum(1 for v in evaluation.verdicts if not v.passed and v.unresolvable),
            "reasons": dict(sorted(reasons.items())),
        },
    }


def _spread(check: SpreadCheck) -> dict[str, Any]:
    cap = check.cap
    return {
        "group": cap.group,
        "namespace": cap.namespace,
        "max_per_domain": cap.max_per_domain,
        "topology_key": cap.topology_key,
        # The group's pods per domain, in-flight and the scorer's proposals included.
        "counts": dict(check.counts),
        "uncounted_pods": check.uncounted,
        "domains": dict(check.domains),
        "blocked": dict(sorted(check.blocked.items())),
    }


def _inputs(state: NodeGpuState) -> dict[str, Any]:
    return {
        "utilization": state.utilization,
        "utilization_max": state.utilization_max,
        "memory_fragmentation": state.memory_fragmentation,
        "memory_free_mib": state.memory_free_mib,
        "memory_largest_free_mib": state.memory_largest_free_mib,
        "temperature_c": state.temperature_c,
        "gpu_model": state.gpu_model,
        "gpu_count": state.gpu_count,
        "health": state.health.value,
        "health_detail": state.health_detail,
        "updated_at": _time(state.updated_at),
    }


def _rule_value(rule: str, verdict: NodeVerdict) -> Any:
    state = verdict.inputs.state
    if state is None:
        return None
    if rule == "gpus":
        return None if verdict.gpus is None else verdict.gpus.candidates
    if rule == "health":
        return state.health.value
    if rule == "utilization":
        judged = verdict.utilization_judged
        return state.utilization if judged is None else judged
    if rule == "temperature":
        return state.temperature_c
    if rule == "memory":
        judged_mib = verdict.memory_largest_free_judged_mib
        return state.memory_largest_free_mib if judged_mib is None else judged_mib
    return state.gpu_model


def _breakdown(b: ScoreBreakdown) -> dict[str, Any]:
    return {
        "utilization_headroom": _fraction(b.utilization_headroom_bp),
        "fragmentation_headroom": _fraction(b.fragmentation_headroom_bp),
        "temperature_headroom": _fraction(b.temperature_headroom_bp),
        "temperature_headroom_span_c": TEMPERATURE_HEADROOM_SPAN_C,
        "percent": b.percent_bp / 100,
        "score": b.score,
    }


def _dra(dra: DraPod) -> dict[str, Any]:
    """A DRA pod's claims as its verdicts counted them."""
    return {
        "claims": [
            {"claim": c.ref, "gpus": c.gpus, "allocated": [list(a) for a in c.allocated]}
            for c in dra.claims
        ],
        "unknown_claims": list(dra.missing),
        "claims_read_from_templates": list(dra.from_templates),
        "extended_resource_gpus": dra.extended,
    }


def _why_not_texts(
    utilization_limit: str, temperature_limit_c: int, min_memory_mib: int | None
) -> dict[GpuStatus, str]:
    """Why a GPU is not a candidate of the k-GPU rule, with the limits the pod got."""
    return {
        "candidate": "candidate",
        "unmeasured": "not measured",
        "allocated": "allocated to pods",
        "not-offered": "not offered by the kubelet",
        "tainted": "tainted (DeviceTaintRule not tolerated)",
        "in-flight": "taken by an in-flight pod",
        "utilization": f"utilization above {utilization_limit}",
        "temperature": f"temperature at or above {temperature_limit_c}C",
        "memory": f"less than {min_memory_mib}MiB free",
    }


def _gpus(v: NodeVerdict, why_not: dict[GpuStatus, str]) -> dict[str, Any] | None:
    """The per-GPU table a node published, and what the k-GPU rule made of each GPU."""
    state = v.inputs.state
    if state is None or not state.gpus:
        return None
    check = v.gpus
    counted = () if check is None else check.counted
    table = []
    for index, gpu in enumerate(state.gpus):
        status = None if check is None else check.status[index]
        table.append(
            {
                "index": index,
                "utilization": gpu.utilization,
                "memory_free_mib": gpu.memory_free_mib,
                "temperature_c": gpu.temperature_c,
                "allocated": gpu.allocated,
                # Its DRA device name as the agent published it (None: not a DRA device, or
                # not published; claims and rules then name it `gpu-<index>`).
                "device": gpu.dra_device,
                "status": status,
                "why_not": None if status in (None, "candidate") else why_not[status],
                "counted": index in counted,
            }
        )
    return {
        # None: the rule did not apply (the pod asks for no GPU, or no GPU has an NVML value).
        "needed": None if check is None else check.needed,
        "candidates": None if check is None else check.candidates,
        "allocation_checked": None if check is None else check.allocation_checked,
        # GPUs taken off the candidates for in-flight pods.
        "inflight": None if check is None else check.inflight,
        # Allocations checked: the unallocated GPUs the device plugin may hand out, and the
        # chance that the k it hands out are all candidates.
        "pool": None if check is None else check.pool,
        "fit_probability": None
        if check is None or check.fit_bp is None
        else _fraction(check.fit_bp),
        "counted": list(counted),
        "table": table,
    }


def _inflight(v: NodeVerdict) -> dict[str, Any] | None:
    """The pods bound since the node's data was sampled that the verdict counted."""
    inflight = v.inflight
    if inflight is None:
        return None
    return {
        "pods": [
            {
                "pod": p.ref,
                "gpus": p.gpus,
                "allocation_pending": p.allocation_pending,
                "load_pending": p.load_pending,
                "gpu_load": _fraction(p.load_bp),
                # hint, learned (its workload), default (own load's), policy (inflight_gpu_load)
                "gpu_load_source": p.load_source,
                "bound_at": _time(p.bound_at),
                # The scorer's own expectation, not yet seen bound in the Pod watch.
                "provisional": p.provisional,
                # Nominated to this node by kube-scheduler, not bound yet.
                "nominated": p.nominated,
            }
            for p in inflight.pods
        ],
        "allocation_gpus": inflight.allocation_gpus,
        "load_gpus": inflight.load_gpus,
        "load_gpu_equivalents": _fraction(inflight.load_bp),
        "memory_mib": inflight.memory_mib,
        # The node-level values judged: published plus the in-flight estimate (None: unchanged).
        "utilization_judged": v.utilization_judged,
        "memory_largest_free_judged_mib": v.memory_largest_free_judged_mib,
    }


def _node(v: NodeVerdict, why_not: dict[GpuStatus, str]) -> dict[str, Any]:
    state = v.inputs.state
    clock_ahead_s = None
    if state is not None and v.agent_write_time is not None:
        written = v.agent_write_time
        clock_ahead_s = round((state.updated_at - written).total_seconds(), 3)
    return {
        "name": v.name,
        "verdict": "pass" if v.passed else "fail",
        "reason": v.reason,
        "unresolvable": v.unresolvable,
        "score": v.score,
        "data_status": v.data_status,
        "age_s": _seconds(v.age_s),
        "server_age_s": _seconds(v.server_age_s),
        "agent_write_time": _time(v.agent_write_time),
        # updated-at minus the API server's write time: positive means the node clock runs ahead.
        "updated_at_minus_write_time_s": clock_ahead_s,
        # Untrusted data: the other field manager that set GPU annotations, and when.
        "foreign_writer": (
            None
            if v.foreign_writer is None
            else {"manager": v.foreign_writer.manager, "time": _time(v.foreign_writer.time)}
        ),
        "schema_version": v.inputs.schema_version,
        "inputs": None if state is None else _inputs(state),
        "problems": list(v.inputs.problems),
        "rules": [
            {
                "rule": r.rule,
                "outcome": r.outcome,
                "value": None if r.outcome == "not-checked" else _rule_value(r.rule, v),
                "limit": r.limit,
                "reason": r.reason,
            }
            for r in v.rules
        ],
        "model_rank": v.model_rank,
        "inflight": _inflight(v),
        "gpus": _gpus(v, why_not),
        "score_breakdown": None if v.breakdown is None else _breakdown(v.breakdown),
    }


def with_learned_basis(evaluation: Evaluation, learned: Learned | None) -> Evaluation:
    """`evaluation` with its learned estimate's basis (samples, pods) taken from `learned`, the
    pod's own workload's figure, where the figures are the ones the verdicts counted.

    A pod class is shared by every workload with the same learned figures (the figures make
    the class, not their sample counts), so the class's basis is that of the first workload
    compiled into it. A new sample between the two reads changes the figures, and leaves the
    class's basis shown."""
    own = evaluation.own_load
    if own is None or learned is None or not own.samples:
        return evaluation
    if own.utilization_source == "learned" and own.utilization_bp != learned.utilization_bp:
        return evaluation
    if own.memory_source == "learned" and own.memory_mib != learned.memory_mib:
        return evaluation
    own = msgspec.structs.replace(own, samples=learned.samples, pods=learned.pods)
    return dataclasses.replace(evaluation, own_load=own)


# ----------------------------------------------------------------------------- text


def _own_load(load: OwnLoad | None) -> dict[str, Any] | None:
    """The pod's own load as the verdicts counted it: the figures, their sources, the basis."""
    if load is None:
        return None
    return {
        "utilization": load.utilization_bp / BASIS_POINTS,
        "utilization_source": load.utilization_source,
        "memory_mib": load.memory_mib,
        "memory_source": load.memory_source,
        "learned_from_samples": load.samples,
        "learned_from_pods": load.pods,
        "text": describe_own_load(load),
    }


def _show(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return format_fraction_limit(value) if 0.0 <= value <= 1.0 else f"{value:g}"
    return str(value)


def render_text(explanation: dict[str, Any]) -> str:
    """The explanation for a terminal: one block per node, in request order."""
    pod = explanation["pod"]
    policy = explanation["policy"]
    lines = [
        f"pod {pod['namespace']}/{pod['name']} (gpu request {pod['gpu_request']}) "
        f"at {explanation['now']}",
        f"policy {policy['profile']}: utilization limit "
        f"{_show(policy['effective_utilization_limit'])}"
        f" (policy {_show(policy['utilization_limit'])}), "
        f"temperature limit {policy['temperature_limit_c']}C, "
        f"stale after {policy['stale_after_s']:g}s, missing data {policy['missing_data']}"
        + (", only the agent's writes trusted" if policy["require_agent_writer"] else ""),
    ]
    error = explanation["hint_error"]
    if error is not None:
        lines.append(
            f"pod hint error: {error['annotation']}={error['value']!r}: {error['problem']} "
            "(the pod is rejected on every node)"
        )
    hints = explanation["hints"]
    shown = [f"{k}={_show(v)}" for k, v in hints.items() if v not in (None, [])]
    if hints["model_preference"]:
        shown[0] = "model_preference=" + ",".join(hints["model_preference"])
    lines.append("hints: " + (", ".join(shown) if shown else "none"))
    own = explanation.get("own_load")
    lines.append(
        "own load: not counted (policy)"
        if own is None
        else f"own load per gpu: {own['text']} (each GPU judged with it added)"
    )
    chain = explanation["chain"]
    if chain is not None:
        chosen = chain["chosen"] if chain["chosen"] is not None else "none"
        lines.append(
            f"model chain {','.join(chain['preference'])} at {_show(chain['threshold'])}: "
            f"kept {chosen} ({chain['basis']})"
        )
    spread = explanation.get("spread")
    if spread is not None:
        counts = ", ".join(f"{d} {n}" for d, n in spread["counts"].items()) or "none yet"
        lines.append(
            f"spread group {spread['namespace']}/{spread['group']}: at most "
            f"{spread['max_per_domain']} per {spread['topology_key']}; pods per domain: {counts}"
        )
    for node in explanation["nodes"]:
        lines.append("")
        verdict = "PASS" if node["verdict"] == "pass" else "FAIL"
        head = f"{node['name']}: {verdict}, score {node['score']}"
        if node["reason"] is not None:
            head += f", {node['reason']}"
        if node["verdict"] == "fail":
            head += " [unresolvable]" if node["unresolvable"] else " [preemption may help]"
        lines.append(head)
        age = "unknown" if node["age_s"] is None else f"{node['age_s']:g}s"
        ages = f"  data {node['data_status']}, age {age}"
        if node["server_age_s"] is not None:
            ages += f", server age {_show(node['server_age_s'])}s"
        if node["updated_at_minus_write_time_s"] is not None:
            ages += f", updated-at minus write time {node['updated_at_minus_write_time_s']:g}s"
        lines.append(ages)
        foreign = node["foreign_writer"]
        if foreign is not None:
            lines.append(
                f"  gpu annotations also set by field manager {foreign['manager']!r} at "
                f"{foreign['time'] or 'an unknown time'}, not before the agent's last write "
                f"({node['agent_write_time'] or 'none recorded'})"
            )
        inputs = node["inputs"]
        if inputs is not None:
            lines.append(
                "  inputs: "
                + ", ".join(f"{k} {_show(v)}" for k, v in inputs.items() if v is not None)
            )
        if node["problems"]:
            lines.append("  problems: " + "; ".join(node["problems"]))
        rules = []
        for rule in node["rules"]:
            text = f"{rule['rule']} {rule['outcome']}"
            if rule["outcome"] not in ("not-checked", "per-gpu"):
                text += f" ({_show(rule['value'])} vs {_show(rule['limit'])})"
            rules.append(text)
        lines.append("  rules: " + "; ".join(rules))
        inflight = node["inflight"]
        if inflight is not None and inflight["pods"]:
            lines.extend(_inflight_lines(inflight))
        gpus = node["gpus"]
        if gpus is not None:
            lines.extend(_gpu_lines(gpus))
        breakdown = node["score_breakdown"]
        if breakdown is not None:
            weights = policy["weights"]
            total = weights["utilization"] + weights["fragmentation"] + weights["temperature"]
            lines.append(
                "  score: 100 x ("
                f"{weights['utilization']:g} x {breakdown['utilization_headroom']:g} "
                f"+ {weights['fragmentation']:g} x {breakdown['fragmentation_headroom']:g} "
                f"+ {weights['temperature']:g} x {breakdown['temperature_headroom']:g}"
                f") / {total:g} = {breakdown['percent']:.2f}% -> {breakdown['score']}/10"
            )
            if gpus is not None and gpus["counted"]:
                lines.append(
                    "    (utilization and temperature headroom: the mean over the counted gpus)"
                )
    summary = explanation["summary"]
    lines.append("")
    lines.append(
        f"summary: {summary['passed']}/{summary['nodes']} passed, {summary['failed']} failed, "
        f"{summary['unresolvable']} unresolvable"
    )
    lines.extend(f"  {count} {reason}" for reason, count in summary["reasons"].items())
    return "\n".join(lines) + "\n"


def _inflight_lines(inflight: dict[str, Any]) -> list[str]:
    pods = inflight["pods"]
    head = f"  in-flight: {len(pods)} pod" + ("" if len(pods) == 1 else "s")
    head += (
        f", {inflight['allocation_gpus']} gpus not yet allocated in the data, "
        f"{inflight['load_gpus']} gpus of load not yet shown "
        f"({_show(inflight['load_gpu_equivalents'])} gpu-equivalents)"
    )
    if inflight["memory_mib"]:
        head += f", {inflight['memory_mib']} MiB"
    lines = [head]
    judged = []
    if inflight["utilization_judged"] is not None:
        judged.append(f"utilization judged {_show(inflight['utilization_judged'])}")
    if inflight["memory_largest_free_judged_mib"] is not None:
        judged.append(f"largest free judged {inflight['memory_largest_free_judged_mib']} MiB")
    if judged:
        lines.append("    " + ", ".join(judged))
    for p in pods:
        pending = [
            name
            for name, flag in (("allocation", p["allocation_pending"]), ("load", p["load_pending"]))
            if flag
        ]
        lines.append(
            f"    {p['pod']}: {p['gpus']} gpu, {' and '.join(pending)} pending, "
            f"load {_show(p['gpu_load'])} ({p['gpu_load_source']}), "
            + (
                f"proposed by the scorer {p['bound_at']}"
                if p["provisional"]
                else "nominated by the scheduler, not bound"
                if p.get("nominated")
                else f"bound {p['bound_at'] or 'at an unknown time'}"
            )
        )
    return lines


def _gpu_lines(gpus: dict[str, Any]) -> list[str]:
    """The per-GPU table, one line per GPU, after the node's rules."""
    if gpus["needed"] is None:
        head = "  gpus: per-gpu data, not judged per gpu"
    else:
        head = f"  gpus: {gpus['needed']} needed, {gpus['candidates']} candidates"
        if gpus["counted"]:
            head += ", counted " + ", ".join(str(i) for i in gpus["counted"])
        if gpus["inflight"]:
            head += f", {gpus['inflight']} held by in-flight pods"
        if gpus["pool"] is not None:
            head += (
                f", pool {gpus['pool']}, fit probability {_show(gpus['fit_probability'])}"
                " (allocations checked)"
            )
        else:
            head += " (allocations unknown: the best k counted)"
    lines = [head, "    gpu  util  free MiB   temp  alloc  verdict"]
    for row in gpus["table"]:
        allocated = row["allocated"]
        temperature = "-" if row["temperature_c"] is None else f"{row['temperature_c']}C"
        verdict = row["why_not"] or row["status"] or ""
        if row["counted"]:
            verdict += ", counted"
        if row["device"] is not None:
            verdict += f" (device {row['device']})"
        lines.append(
            f"    {row['index']:>3}  {_show(row['utilization']):>4}  "
            f"{_show(row['memory_free_mib']):>8}  {temperature:>5}  "
            f"{'-' if allocated is None else int(allocated):>5}  {verdict}".rstrip()
        )
    return lines
