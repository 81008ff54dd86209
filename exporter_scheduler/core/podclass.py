"""The pod class: everything about (policy, pod hints, GPU request) that is the same for every
node, compiled once.

A verdict reads the policy's limits as integers and hands out rule outcomes whose reason texts
are uniform per rule and limit (kube-scheduler's `FailedScheduling` event counts each distinct
text). Both are the same for every node a pod class is judged on, so they are built here once
and shared between nodes: judging a node then only compares integers and picks outcomes.
"""

from __future__ import annotations

import msgspec

from exporter_scheduler.core.decoding import Decoder
from exporter_scheduler.core.dra import first_gpu_count, gpus_on_node
from exporter_scheduler.core.hints import (
    NO_HINTS,
    HintError,
    PodHints,
    match_patterns,
    parse_hints,
)
from exporter_scheduler.core.inflight import OwnDefault
from exporter_scheduler.core.ownload import Learned, own_load
from exporter_scheduler.core.policy import (
    Policy,
    format_fraction_limit,
    format_seconds,
    weight_milli,
)
from exporter_scheduler.core.records import (
    BASIS_POINTS,
    DataStatus,
    PodInput,
    RuleOutcome,
    Rules,
    ScoreBreakdown,
)
from exporter_scheduler.core.score import ScoreWeights

# What makes two pods the same for every verdict: the policy (by identity), the pod's
# annotations under the prefix (its hints), its GPU request, its workload's learned figures,
# and its DRA requests whose size depends on the node (`core.dra.gpus_on_node`).
PodClassKey = tuple[
    int,
    tuple[tuple[str, str], ...],
    int,
    tuple[int | None, int | None] | None,
    tuple[tuple[int, ...], ...],
]


def pod_class_key(pod: PodInput, policy: Policy) -> PodClassKey:
    prefix = policy.keys.prefix
    hints = tuple(sorted((k, v) for k, v in pod.annotations.items() if k.startswith(prefix)))
    learned = pod.learned
    # The learned figures (already rounded to their steps), not their sample counts: a class
    # changes only when a figure does, so cached verdicts stay exact and few.
    figures = (
        None
        if learned is None or not policy.own_load
        else (learned.utilization_bp, learned.memory_mib)
    )
    choices = () if pod.dra is None else pod.dra.choices
    return (id(policy), hints, pod.gpu_request, figures, choices)


class PodClass:
    """Everything about (policy, pod hints, GPU request) that is the same for every node.

    Compiled once per class: the limits as integers, every rule outcome and reason text a node
    can get (shared between nodes), the chain's match patterns. Pods with equal `key`s get equal
    verdicts on every node, so the names-only node store keeps verdicts per class.

    A setting used as the policy states it is read from `policy` where it is used
    (`c.policy.stale_after_s`), never copied here: a new setting is added to the table in
    `core.policy` and read where it matters. Only what is compiled from the policy and the
    pod lives here, each derived once: basis points, score weights, outcomes and their texts.
    """

    __slots__ = (
        "any_rank",
        "by_gpus",
        "chain_active",
        "decode",
        "dra_choices",
        "dra_fixed",
        "gpu_request",
        "gpus_fail",
        "gpus_pass",
        "gpus_skip",
        "gpus_unlikely",
        "health_fail",
        "health_pass",
        "hint_problem",
        "hints",
        "inflight_load_bp",
        "inflight_own",
        "key",
        "learned",
        "lenient",
        "limit_bp",
        "mem_fail",
        "mem_pass",
        "mem_per_gpu",
        "mem_skip",
        "mem_unknown",
        "min_fit_bp",
        "min_memory_mib",
        "model_pass",
        "model_skip",
        "model_unlisted",
        "not_checked",
        "not_checked_listed",
        "not_checked_unlisted",
        "own",
        "own_bp",
        "patterns",
        "policy",
        "score_memo",
        "status_reason",
        "temp_fail",
        "temp_pass",
        "temp_unknown",
        "threshold_bp",
        "util_fail",
        "util_pass",
        "util_per_gpu",
        "util_unknown",
        "weights",
    )

    @classmethod
    def of(cls, pod: PodInput, policy: Policy) -> PodClass:
        """The class of `pod` under `policy` (hints parsed; a bad hint is kept as the problem)."""
        parsed = parse_hints(pod.annotations, policy.keys)
        problem = parsed if isinstance(parsed, HintError) else None
        hints = NO_HINTS if isinstance(parsed, HintError) else parsed
        key = pod_class_key(pod, policy)
        return cls(
            key, policy, hints, problem, pod.gpu_request, learned=pod.learned, dra_choices=key[4]
        )

    def __init__(
        self,
        key: PodClassKey,
        policy: Policy,
        hints: PodHints,
        hint_problem: HintError | None,
        gpu_request: int,
        *,
        learned: Learned | None = None,
        dra_choices: tuple[tuple[int, ...], ...] = (),
    ) -> None:
        self.key = key
        self.policy = policy
        self.hints = hints
        self.hint_problem = hint_problem
        self.gpu_request = gpu_request
        self.learned = learned
        # DRA requests whose size depends on the node (`All`, `firstAvailable`), each counted
        # by its first GPU alternative in `gpu_request`: on a node whose GPUs are known, the
        # alternative the allocator takes there decides (`for_node`).
        self.dra_choices = dra_choices
        # The GPUs of its requests that are the same on every node, taken first there.
        self.dra_fixed = gpu_request - sum(first_gpu_count(c) for c in dra_choices)
        self.by_gpus: dict[int, PodClass] = {}
        self.decode = Decoder(policy.keys)
        lenient = policy.missing_data == "lenient"
        self.lenient = lenient
        limit = policy.utilization_limit
        if hints.max_utilization is not None and hints.max_utilization < limit:
            limit = hints.max_utilization
        self.limit_bp = round(limit * BASIS_POINTS)
        threshold = limit
        if hints.fallback_utilization is not None and hints.fallback_utilization < limit:
            threshold = hints.fallback_utilization
        self.threshold_bp = round(threshold * BASIS_POINTS)
        # The pod's own load (ownload.py): None when the policy does not count it, or the
        # pod holds no GPU to add it to (such pods reach the scorer only in tests and tools).
        self.own = (
            own_load(
                hints.expected_gpu_load,
                hints.expected_gpu_memory_mib,
                learned,
                policy.own_load_gpu_load,
                policy.own_load_gpu_memory_mib,
            )
            if policy.own_load and gpu_request > 0
            else None
        )
        # Counted at most up to the limit: a pod whose own load alone is above it (a training
        # worker that fills its GPU) still fits an idle GPU, where it pushes no other work
        # over the limit, and only such a GPU.
        self.own_bp = 0 if self.own is None else min(self.own.utilization_bp, self.limit_bp)
        # The memory a GPU must have free: the pod's `min-gpu-memory-mib`, or the memory its
        # processes will hold, whichever is more (None: not checked).
        need_mib = hints.min_gpu_memory_mib
        own_mib = 0 if self.own is None else self.own.memory_mib
        if own_mib > 0 and (need_mib is None or own_mib > need_mib):
            need_mib = own_mib
        self.min_memory_mib = need_mib
        self.inflight_load_bp = round(policy.inflight_gpu_load * BASIS_POINTS)
        # In-flight pods count their own estimates when the policy counts a pod's own load.
        self.inflight_own = (
            OwnDefault(
                round(policy.own_load_gpu_load * BASIS_POINTS), policy.own_load_gpu_memory_mib
            )
            if policy.own_load
            else None
        )
        self.min_fit_bp = round(policy.min_gpu_fit_probability * BASIS_POINTS)
        self.weights = ScoreWeights(policy.temperature_limit_c, *weight_milli(policy))
        # The class's own scores, in front of the shared `score.score` cache (`rules.judge_fresh`).
        self.score_memo: dict[tuple[int, float | None, int | None], ScoreBreakdown] = {}
        self.status_reason: dict[DataStatus, str] = {
            "missing": "gpu data missing",
            "invalid": "gpu data invalid",
            "stale": f"gpu data stale (older than {format_seconds(policy.stale_after_s)}s)",
            "clock-skew": "gpu data clock skew",
            "untrusted": "gpu data not written by the agent",
        }

        util_limit = format_fraction_limit(limit)
        temp_limit = f"{policy.temperature_limit_c}C"
        self.health_pass = RuleOutcome("health", "pass", "unavailable")
        self.health_fail = RuleOutcome(
            "health", "fail", "unavailable", "gpu health unavailable", unresolvable=True
        )
        self.util_pass = RuleOutcome("utilization", "pass", util_limit)
        self.util_fail = RuleOutcome(
            "utilization", "fail", util_limit, f"gpu utilization above {util_limit}"
        )
        # Fresh timestamps but no usable utilization: the node-level "missing"/"invalid" policy.
        self.util_unknown: dict[DataStatus, RuleOutcome] = {
            status: (
                RuleOutcome("utilization", "unknown", util_limit)
                if lenient
                else RuleOutcome(
                    "utilization", "fail", util_limit, self.status_reason[status], True
                )
            )
            for status in ("missing", "invalid")
        }
        self.temp_pass = RuleOutcome("temperature", "pass", temp_limit)
        self.temp_fail = RuleOutcome(
            "temperature", "fail", temp_limit, f"gpu temperature at or above {temp_limit}"
        )
        self.temp_unknown = (
            RuleOutcome("temperature", "unknown", temp_limit)
            if lenient
            else RuleOutcome("temperature", "fail", temp_limit, "gpu temperature unknown", True)
        )
        mem_limit = None if need_mib is None else f"{need_mib}MiB"
        self.mem_skip = RuleOutcome("memory", "not-checked")
        self.mem_pass = RuleOutcome("memory", "pass", mem_limit)
        self.mem_fail = RuleOutcome(
            "memory", "fail", mem_limit, f"gpu memory below {mem_limit} free on one gpu"
        )
        self.mem_unknown = (
            RuleOutcome("memory", "unknown", mem_limit)
            if lenient
            else RuleOutcome("memory", "fail", mem_limit, "gpu memory unknown", True)
        )
        self.chain_active = bool(hints.model_preference)
        self.patterns, self.any_rank = match_patterns(hints.model_preference)
        chain = ",".join(hints.model_preference) if hints.model_preference else None
        self.model_skip = RuleOutcome("model", "not-checked")
        self.model_pass = RuleOutcome("model", "pass", chain)
        self.model_unlisted = RuleOutcome(
            "model", "fail", chain, "gpu model not in preference list", True
        )
        # The k-GPU rule (`core.gpus`): on a node that publishes per-GPU data it takes over
        # the node-level utilization and memory rules, which then read `per-gpu`.
        self.util_per_gpu = RuleOutcome("utilization", "per-gpu", util_limit)
        self.mem_per_gpu = (
            self.mem_skip if mem_limit is None else RuleOutcome("memory", "per-gpu", mem_limit)
        )
        self.gpus_skip = RuleOutcome("gpus", "not-checked")
        gpus_limit = f"{gpu_request} gpu" + ("" if gpu_request == 1 else "s")
        self.gpus_pass = RuleOutcome("gpus", "pass", gpus_limit)
        self.gpus_fail = tuple(
            RuleOutcome("gpus", "fail", gpus_limit, reason, unresolvable)
            for reason, unresolvable in zip(
                gpu_shortfall_reasons(gpu_request, util_limit, temp_limit, mem_limit),
                # Eviction frees GPUs and their load; it cannot add or repair one.
                (True, True, False, False, False, False),
                strict=True,
            )
        )
        fit_limit = format_fraction_limit(policy.min_gpu_fit_probability)
        self.gpus_unlikely = RuleOutcome(
            "gpus", "fail", gpus_limit, f"gpu fit probability below {fit_limit}"
        )
        self.not_checked = Rules(
            health=RuleOutcome("health", "not-checked"),
            utilization=RuleOutcome("utilization", "not-checked"),
            temperature=RuleOutcome("temperature", "not-checked"),
            memory=self.mem_skip,
            model=self.model_skip,
            gpus=self.gpus_skip,
        )
        # Data that cannot be judged, under a preference chain: the model rule still reads
        # the node's model (see `rules.untimely`).
        self.not_checked_listed = msgspec.structs.replace(self.not_checked, model=self.model_pass)
        self.not_checked_unlisted = msgspec.structs.replace(
            self.not_checked, model=self.model_unlisted
        )

    def for_node(self, node_gpus: int, free: int) -> PodClass:
        """The class as the k-GPU rule judges it on a node of `node_gpus` GPUs of which `free`
        the allocator may give: itself, unless a DRA request's size depends on the node, when
        k is what the allocator would give there (`core.dra.gpus_on_node`; the same class
        otherwise, kept per k: nodes come in few sizes)."""
        if not self.dra_choices:
            return self
        k = gpus_on_node(self.dra_choices, self.dra_fixed, node_gpus, free)
        if k == self.gpu_request:
            return self
        found = self.by_gpus.get(k)
        if found is None:
            found = PodClass(
                self.key, self.policy, self.hints, self.hint_problem, k, learned=self.learned
            )
            self.by_gpus[k] = found
        return found

    @property
    def utilization_limit(self) -> float:
        """The utilization limit applied: the policy's, or the pod's tighter `max-utilization`."""
        return self.limit_bp / BASIS_POINTS


def gpu_shortfall_reasons(
    k: int, util_limit: str, temp_limit: str, mem_limit: str | None
) -> tuple[str, ...]:
    """The k-GPU rule's reason texts, one per step of `GPU_STEPS`: uniform per pod class (the
    GPU count and the limits), never a node's own values."""
    few, gpus = ("no", "gpu") if k == 1 else (f"fewer than {k}", "gpus")
    return (
        f"{few} {gpus} on the node",
        f"{few} {gpus} measured",
        f"{few} unallocated {gpus}",
        f"{few} {gpus} at or below utilization {util_limit}",
        f"{few} {gpus} below temperature {temp_limit}",
        f"{few} {gpus} with {mem_limit} free",
    )
