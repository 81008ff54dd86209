"""The three public steps of a verdict, which every caller shares.

`PodClass.of` (`core.podclass`) compiles what is the same for every node (the policy, the pod's
hints and GPU request); `judge_node` judges one node for that class at `now`; `resolve_chain` is
the one step that looks across nodes (the model preference chain). A node's input carries,
beside its annotations, the GPU pods bound to it that its data cannot show yet
(`core.inflight`): they are counted in `judge_node` like any other node value, so a verdict
holds after binding and not only at the moment of the decision. `evaluate` runs the three over
a node list; the names-only node store runs `judge_node` when a node's watch event arrives and
the chain per request. Reason texts are uniform per rule and limit (kube-scheduler's
`FailedScheduling` event counts each distinct text); the node's own values live in the verdict
and are rendered by `exporter_scheduler.serving.explain`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime

import msgspec

from exporter_scheduler.core.decoding import unreadable_status
from exporter_scheduler.core.hints import ANY_MODEL
from exporter_scheduler.core.inflight import SharedCounts, count_inflight
from exporter_scheduler.core.overrides import NO_BLOCKS, Overrides
from exporter_scheduler.core.podclass import PodClass
from exporter_scheduler.core.policy import Policy
from exporter_scheduler.core.records import (
    BASIS_POINTS,
    ChainBasis,
    ChainOutcome,
    DataStatus,
    Evaluation,
    NodeInput,
    NodeVerdict,
    PodInput,
    RuleOutcome,
    as_utc,
)
from exporter_scheduler.core.rules import judge_fresh, untimely
from exporter_scheduler.core.validity import valid_until


def evaluate(
    pod: PodInput,
    nodes: Sequence[NodeInput],
    now: datetime,
    policy: Policy,
    *,
    pod_class: PodClass | None = None,
    blocked: Mapping[str, str] | None = None,
) -> Evaluation:
    """Judge every node for `pod` at `now`. Never raises for any annotation content.

    `pod_class` is `PodClass.of(pod, policy)` when the caller has it compiled already;
    `blocked` is a spread cap's rejections (node name -> reason), applied with the other
    overrides (`core.overrides`).
    """
    now = as_utc(now)
    c = pod_class if pod_class is not None else PodClass.of(pod, policy)
    verdicts = [judge_node(node, now, c) for node in nodes]
    until = valid_until(verdicts, now, c)
    chain = resolve_chain(c, *best_chain_ranks(verdicts)) if c.chain_active else None
    overrides = Overrides(
        hint=c.hint_problem,
        chain=chain,
        blocked=NO_BLOCKS if blocked is None else blocked,
    )
    if overrides.active:
        verdicts = [overrides.apply(v) for v in verdicts]
    problem = c.hint_problem
    return Evaluation(
        verdicts=tuple(verdicts),
        hint_error=None if problem is None else problem.reason,
        hint_problem=problem,
        hints=c.hints,
        chain=chain,
        utilization_limit=c.utilization_limit,
        now=now,
        valid_until=until,
        own_load=c.own,
    )


def judge_node(
    node: NodeInput, now: datetime, c: PodClass, shared: SharedCounts | None = None
) -> NodeVerdict:
    """One node's verdict for pod class `c` at `now` (aware), before the overrides (a bad
    hint, the model chain, a spread cap: `core.overrides`).

    Steps: read the annotations, date them by both clocks, then either the missing-data
    policy (data that cannot be judged) or the rules and the score. `shared`: the in-flight
    counts of `node.pods` at `now`, kept for the other classes the node is judged for.
    """
    policy = c.policy
    pre = node.predecoded
    decoded = (
        pre[1] if pre is not None and pre[0] == policy.keys.prefix else c.decode(node.annotations)
    )
    state = decoded.state
    written = node.agent_write_time
    server_age_s: float | None = None
    if written is not None:
        written = as_utc(written)
        server_age_s = (now - written).total_seconds()
    if state is None:
        verdict = untimely(
            node.name, decoded, unreadable_status(decoded), None, server_age_s, written, c
        )
    elif policy.require_agent_writer and not written_by_agent(node):
        age_s = (now - state.updated_at).total_seconds()
        verdict = untimely(node.name, decoded, "untrusted", age_s, server_age_s, written, c)
        verdict = msgspec.structs.replace(verdict, foreign_writer=node.foreign_writer)
    else:
        age_s = (now - state.updated_at).total_seconds()
        # updated-at's lead over the server's write time, from the two stored times: exact and
        # the same at every `now` (a difference of two float ages drifts by rounding, so a
        # lead of exactly the tolerance would flip with the clock inside a validity window).
        lead_s = None if written is None else (state.updated_at - written).total_seconds()
        status = _freshness(age_s, server_age_s, lead_s, c)
        if status == "fresh":
            inflight = None
            if shared is not None and node.pods:
                inflight = shared.count(
                    state.updated_at,
                    policy.inflight_max_s,
                    policy.inflight_load_delay_s,
                    c.inflight_load_bp,
                    c.inflight_own,
                )
            elif node.pods:
                inflight = count_inflight(
                    node.pods,
                    state.updated_at,
                    now,
                    policy.inflight_max_s,
                    policy.inflight_load_delay_s,
                    c.inflight_load_bp,
                    c.inflight_own,
                )
            verdict = judge_fresh(
                node.name,
                decoded,
                state,
                age_s,
                server_age_s,
                written,
                c,
                inflight,
                node.dra_excluded,
            )
        else:
            verdict = untimely(node.name, decoded, status, age_s, server_age_s, written, c)
    return verdict


def written_by_agent(node: NodeInput) -> bool:
    """Whether the Node's GPU annotations are the agent's, by the API server's managedFields.

    They are when the agent has an entry and no other manager owning a contract key changed the
    Node since the agent's last write: the agent's merge patch states every key it publishes, so
    after it the values are the agent's even where another manager still owns a key whose value
    the agent wrote unchanged. A foreign change in the same second as the agent's write cannot
    be ordered and counts against it (the agent's next write settles it).
    """
    agent_time = node.agent_write_time
    if agent_time is None:
        return False
    foreign = node.foreign_writer
    if foreign is None:
        return True
    return foreign.time is not None and as_utc(foreign.time) < as_utc(agent_time)


def best_chain_ranks(verdicts: Iterable[NodeVerdict]) -> tuple[int | None, int | None]:
    """The chain's inputs over `verdicts`: the most preferred rank with a node at or below the
    threshold, and the most preferred rank with any node that passed (each `None` if none)."""
    below: int | None = None
    passed: int | None = None
    for v in verdicts:
        rank = v.model_rank
        if not v.passed or rank is None:
            continue
        if passed is None or rank < passed:
            passed = rank
        if v.at_or_below_threshold and (below is None or rank < below):
            below = rank
    return below, passed


def resolve_chain(
    c: PodClass, best_below_threshold: int | None, best_passed: int | None
) -> ChainOutcome:
    """Keep the most preferred rank with a node at or below the threshold; reject the other ranks.

    When no rank has such a node, keep the most preferred rank with any node that passed the
    filter (the pod still fits there; a less preferred model is not better for the pod merely
    because it is less loaded). The two ranks come from the nodes of one request, so this is the
    one step of a verdict that depends on other nodes (see `best_chain_ranks`).
    """
    preference = c.hints.model_preference
    threshold = c.threshold_bp / BASIS_POINTS
    basis: ChainBasis
    if best_below_threshold is not None:
        chosen: int | None = best_below_threshold
        basis = "at-or-below-threshold"
    else:
        chosen = best_passed
        basis = "all-above-threshold" if chosen is not None else "no-candidate"
    if chosen is None:
        return ChainOutcome(preference, threshold, None, basis)
    entry = preference[chosen]
    label = "any model" if entry == ANY_MODEL else entry
    not_preferred = RuleOutcome(
        "model",
        "fail",
        ",".join(preference),
        f"gpu model not preferred ({label} available)",
        unresolvable=True,
    )
    return ChainOutcome(preference, threshold, chosen, basis, not_preferred)


def _freshness(
    age_s: float, server_age_s: float | None, lead_s: float | None, c: PodClass
) -> DataStatus:
    """Clock checks, most specific first. updated-at is the node's clock at sampling; the
    managedFields time is the server's clock at the write that followed, so updated-at may lead
    it (`lead_s`) by at most the lag tolerance (a lead of exactly the tolerance is accepted), and
    the server's time also bounds how old the data can really be."""
    policy = c.policy
    if -age_s > policy.clock_skew_tolerance_s or (
        lead_s is not None and lead_s > policy.managed_fields_lag_tolerance_s
    ):
        return "clock-skew"
    stale_s = policy.stale_after_s
    if age_s > stale_s or (server_age_s is not None and server_age_s > stale_s):
        return "stale"
    return "fresh"
