"""What a log line says of a verdict: the fields of a rejected node and of a pod class.

Kept apart from the explanation so that whoever logs a rejection (the names-only node store
when it judges a node, the request path for the Nodes a request judged) reads the same fields
without depending on the module that renders explanations.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from exporter_scheduler.core.podclass import PodClass
from exporter_scheduler.core.records import BASIS_POINTS, NodeVerdict
from exporter_scheduler.logs import DeferredFields
from gpu_contract.schema import format_timestamp

if TYPE_CHECKING:  # types only: both modules read this one's fields
    from exporter_scheduler.serving.metrics import ScorerMetrics
    from exporter_scheduler.serving.verdicts import Judgement


def describe_pod_class(pod_class: PodClass) -> dict[str, object]:
    """The pod class in a log line: the hint annotations and the GPU request that define it."""
    _, hints, gpu_request, _, dra_choices = pod_class.key
    described = {
        "profile": pod_class.policy.profile,
        "hints": dict(hints),
        "gpu_request": gpu_request,
    }
    if dra_choices:
        # The DRA requests sized per node: each its alternatives (-1: every GPU, -2: another
        # class), as `core.dra.gpus_on_node` reads them.
        described["dra_gpu_choices"] = [list(choice) for choice in dra_choices]
    return described


def verdict_values(verdict: NodeVerdict) -> dict[str, object]:
    """The values a verdict read and the data's age, for a log line (unknown ones left out)."""
    values: dict[str, object] = {}
    state = verdict.inputs.state
    if state is not None:
        read = {
            "health": state.health.value,
            "utilization": state.utilization,
            "temperature_c": state.temperature_c,
            "memory_largest_free_mib": state.memory_largest_free_mib,
            "gpu_model": state.gpu_model,
            "updated_at": format_timestamp(state.updated_at),
        }
        values.update((k, v) for k, v in read.items() if v is not None)
        if state.gpus:
            values["per_gpu_utilization"] = [g.utilization for g in state.gpus]
    check = verdict.gpus
    if check is not None:
        values["gpus_needed"] = check.needed
        values["gpu_candidates"] = check.candidates
        values["gpu_status"] = list(check.status)
        if check.fit_bp is not None:
            values["gpu_fit_probability"] = check.fit_bp / BASIS_POINTS
    inflight = verdict.inflight
    if inflight is not None and inflight.pods:
        values["inflight_pods"] = [p.ref for p in inflight.pods]
        values["inflight_allocation_gpus"] = inflight.allocation_gpus
        values["inflight_load_gpus"] = inflight.load_gpus
    if verdict.inputs.problems:
        values["problems"] = list(verdict.inputs.problems)
    if verdict.age_s is not None:
        values["age_s"] = round(verdict.age_s, 3)
    if verdict.server_age_s is not None:
        values["server_age_s"] = round(verdict.server_age_s, 3)
    return values


def rejection_fields(verdict: NodeVerdict) -> dict[str, object]:
    """A rejected node's log fields: its uniform reason, then the values it read."""
    fields: dict[str, object] = {
        "node": verdict.name,
        "reason": verdict.reason or "",
        "unresolvable": verdict.unresolvable,
        "data_status": str(verdict.data_status),
    }
    fields.update(verdict_values(verdict))
    return fields


def log_request_rejections(  # noqa: PLR0917 (the request's tallies, passed as they are)
    log: logging.Logger,
    pod: str,
    pod_class: PodClass,
    counts: Mapping[tuple[bool, bool, str | None, str], int],
    rejected: int,
    unresolvable: int,
    logged: int,
) -> None:
    """One line per filter request with rejections: the counts by reason. The per-node values
    are in the `node rejected` lines written where each verdict was judged (`judged_rejected`
    of them by this request).

    Its fields are built by the log's writer thread (`DeferredFields`), off the request path:
    they read the pod class (immutable), `counts` (this request's own dict, not changed after
    it is made) and numbers."""

    def fields() -> dict[str, object]:
        reasons: dict[str, int] = {}
        for (passed, _, reason, _), count in counts.items():
            if not passed and reason is not None:
                reasons[reason] = reasons.get(reason, 0) + count
        return {
            "pod": pod,
            "pod_class": describe_pod_class(pod_class),
            "rejected": rejected,
            "unresolvable": unresolvable,
            "judged_rejected": logged,
            "reasons": dict(sorted(reasons.items())),
        }

    log.info("nodes rejected", extra={"fields": DeferredFields(fields)})


def count_and_log(  # noqa: PLR0917 (a request's parts, as the request path holds them)
    metrics: ScorerMetrics,
    log: logging.Logger,
    pod: str,
    pod_class: PodClass,
    judgement: Judgement,
    judged: Sequence[NodeVerdict],
) -> None:
    """A filter's verdict counters; log lines for the rejected nodes judged in this request
    (their values), and one for the request (`pod` is its namespace/name)."""
    counts = judgement.tally()
    tally = metrics.tally_counts(counts)
    metrics.add_tally(tally)
    if not tally.rejected or not log.isEnabledFor(logging.INFO):
        return
    problem = pod_class.hint_problem
    if problem is not None:
        log.info(
            "pod rejected on every node",
            extra={"fields": {"pod": pod, "reason": problem.reason}},
        )
        return
    logged = 0
    for verdict in judged:
        if not verdict.passed:
            logged += 1
            # One structured line per rejected node judged: the uniform reason plus what was
            # read.
            log.info("node rejected", extra={"fields": {"pod": pod, **rejection_fields(verdict)}})
    log_request_rejections(log, pod, pod_class, counts, tally.rejected, tally.unresolvable, logged)
