"""Verdicts: which nodes a pod may use and how much the scorer likes each, from annotations alone.

The decision is a pure function of (pod, nodes, now, policy), in three public steps that every
caller shares: `PodClass.of` compiles what is the same for every node (the policy, the pod's
hints and GPU request), `judge_node` judges one node for that class at `now`, and
`resolve_chain` is the one step that looks across nodes (the model preference chain). A node's
input carries, beside its annotations, the GPU pods bound to it that its data cannot show yet
(`exporter_scheduler.core.inflight`): they are counted in `judge_node` like any other node value, so
a verdict holds after binding and not only at the moment of the decision. `evaluate`
runs the three over a node list; the names-only node store runs `judge_node` when a node's
watch event arrives and the chain per request. Reason texts are uniform per rule and limit
(kube-scheduler's `FailedScheduling` event counts each distinct text); the node's own values live
in the verdict and are rendered by `exporter_scheduler.serving.explain`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Final, Literal, NamedTuple

import msgspec

from exporter_scheduler.core.hints import (
    ANY_MODEL,
    NO_HINTS,
    HintError,
    PodHints,
    match_patterns,
    model_rank,
    parse_hints,
)
from exporter_scheduler.core.inflight import NO_PODS, BoundPod, InFlight, count_inflight
from exporter_scheduler.core.ownload import Learned, OwnLoad, own_load
from exporter_scheduler.core.policy import (
    Policy,
    format_fraction_limit,
    format_seconds,
    weight_milli,
)
from gpu_contract.schema import (
    DecodedAnnotations,
    Field,
    GpuState,
    Health,
    Keys,
    NodeGpuState,
    decode,
)

DataStatus = Literal["fresh", "missing", "stale", "clock-skew", "invalid", "untrusted"]
RuleName = Literal["health", "utilization", "temperature", "memory", "model", "gpus"]
# `per-gpu`: a node-level rule the `gpus` rule applied to each GPU instead (see `_judge_gpus`).
Outcome = Literal["pass", "fail", "unknown", "not-checked", "per-gpu"]
ChainBasis = Literal["at-or-below-threshold", "all-above-threshold", "no-candidate"]
# One GPU under the k-GPU rule: a candidate, or the first criterion it failed, in `GPU_STEPS`
# order (`not-offered`: allocations are published but the kubelet does not hand this GPU out;
# `in-flight`: taken, as the rule assumes, by a pod bound since the data was sampled).
GpuStatus = Literal[
    "candidate",
    "unmeasured",
    "allocated",
    "not-offered",
    "in-flight",
    "utilization",
    "temperature",
    "memory",
]

RULE_ORDER: Final[tuple[RuleName, ...]] = (
    "health",
    "utilization",
    "temperature",
    "memory",
    "model",
    "gpus",
)
# The k-GPU rule's criteria in the order it counts them: a node short of k GPUs is rejected with
# the reason of the first criterion after which fewer than k GPUs remain.
GPU_STEPS: Final = ("gpu-count", "unmeasured", "allocated", "utilization", "temperature", "memory")
# Temperature headroom reaches its full value this many degrees below the limit.
TEMPERATURE_HEADROOM_SPAN_C: Final = 40
BASIS_POINTS: Final = 10_000
MAX_SCORE: Final = 10  # kube-scheduler's MaxExtenderPriority


class ForeignWriter(NamedTuple):
    """A field manager other than the agent that owns GPU annotation keys of a Node."""

    manager: str
    # The API server's time of that manager's last change of the Node (any field); None when
    # its entry has none.
    time: datetime | None


@dataclass(frozen=True, slots=True)
class NodeInput:
    """One node as the scorer sees it: its name, its annotations, and the server's write time."""

    name: str
    annotations: Mapping[str, str]
    # `metadata.managedFields[manager=gpu-scheduler-agent].time`: the API server's clock at the
    # agent's last change of this Node. `None` when unknown (no such entry).
    agent_write_time: datetime | None = None
    # `(prefix, predecode(annotations, keys))`, computed ahead of the request by whoever holds the
    # node (the names-only node cache does it when a watch event arrives). Used only when the
    # prefix is the policy's; otherwise, and when `None`, the annotations are decoded here.
    predecoded: tuple[str, DecodedAnnotations] | None = None
    # From managedFields: the newest manager other than the agent that owns one of the
    # contract's annotation keys (it set that key's current value). None when none does.
    foreign_writer: ForeignWriter | None = None
    # The GPU pods bound to the node (from the Pod watch), in-flight or not: `judge_node`
    # counts those the node's data cannot show yet (`inflight.count_inflight`).
    pods: tuple[BoundPod, ...] = NO_PODS
    # The Node's labels, read only by the spread cap's topology domains (`spread.py`); None
    # when unknown (a full-node request's Nodes carry theirs, decoded only when a cap needs
    # them).
    labels: Mapping[str, str] | None = None


@dataclass(frozen=True, slots=True)
class PodInput:
    namespace: str
    name: str
    annotations: Mapping[str, str]
    # GPUs the pod asks for (`max(sum of containers, largest init container)`).
    gpu_request: int = 0
    # Read only to record where the scorer expects it to go (`podcache.PodCache.propose`);
    # no verdict reads it.
    uid: str = ""
    # The pod's `<prefix>spread-group` label: the group its spread cap counts (spread.py).
    spread_group: str | None = None
    # What the running pods of its workload use per GPU (`ownload.learn`), from the scorer's
    # watches; None when nothing is learned. Part of the pod's class (`pod_class_key`).
    learned: Learned | None = None


class RuleOutcome(msgspec.Struct, frozen=True, gc=False):
    """One rule's result for one node. Instances are shared between nodes: no per-node values."""

    rule: RuleName
    outcome: Outcome
    limit: str | None = None
    reason: str | None = None
    # True when evicting pods from the node (preemption) could not make this rule pass.
    unresolvable: bool = False


class ScoreBreakdown(msgspec.Struct, frozen=True, gc=False):
    """The score's parts, in basis points (10000 = 1.0) so that every step is exact integer math."""

    utilization_headroom_bp: int
    fragmentation_headroom_bp: int
    temperature_headroom_bp: int
    percent_bp: int  # the weighted mean on 0..100.00, in hundredths of a percent
    score: int  # 0..10


class GpuCheck(msgspec.Struct, frozen=True, gc=False):
    """What the k-GPU rule found on one node's GPUs, for the explanation (no reason text here:
    the rule's outcome carries it)."""

    needed: int  # k, the GPUs the pod asks for
    candidates: int
    # Per GPU in NVML index order: `candidate` or the first criterion it failed.
    status: tuple[GpuStatus, ...]
    # The candidates whose headrooms make the score, best first (empty when too few).
    counted: tuple[int, ...]
    # Whether `per-gpu-allocated` was published (an unpublished one is not checked).
    allocation_checked: bool
    # GPUs taken off the candidates for in-flight pods (their status `in-flight`).
    inflight: int = 0
    # Allocations checked: the device plugin's pool (the unallocated GPUs, less the in-flight
    # ones), and the chance, in basis points, that k GPUs it hands out blindly are all
    # candidates. None where allocations are unknown (the best k are counted instead).
    pool: int | None = None
    fit_bp: int | None = None


class NodeVerdict(msgspec.Struct, frozen=True, gc=False):
    """The decision for one node, with everything an explanation needs.

    A msgspec struct rather than a dataclass: one is built per node judged, and a frozen
    dataclass costs about ten times as much to construct.
    """

    name: str
    passed: bool
    # Failed: why (uniform text). Passed: why the score is lowest (lenient on unknown data).
    reason: str | None
    unresolvable: bool
    score: int
    data_status: DataStatus
    inputs: DecodedAnnotations
    rules: tuple[RuleOutcome, ...]
    breakdown: ScoreBreakdown | None = None
    age_s: float | None = None  # scorer clock minus updated-at
    server_age_s: float | None = None  # scorer clock minus the API server's write time
    agent_write_time: datetime | None = None
    model_rank: int | None = None
    # Chain only: passed with fresh utilization at or below the chain's fallback threshold, so
    # its rank counts in the chain's first step (see `resolve_chain`).
    at_or_below_threshold: bool = False
    # Untrusted data only: who set GPU annotations after the agent's last write.
    foreign_writer: ForeignWriter | None = None
    # The k-GPU rule's per-GPU findings; None where it did not apply (see `_judge_gpus`).
    gpus: GpuCheck | None = None
    # The in-flight pods counted (fresh data only); None when none counts or is dated.
    inflight: InFlight | None = None
    # Node-level rules with in-flight load: the utilization and largest free memory judged
    # (the node's values plus the in-flight estimate); None when nothing was added.
    utilization_judged: float | None = None
    memory_largest_free_judged_mib: int | None = None


@dataclass(frozen=True, slots=True)
class ChainOutcome:
    """How the pod's model preference chain resolved over the nodes given."""

    preference: tuple[str, ...]
    threshold: float
    chosen_rank: int | None
    basis: ChainBasis
    # The model rule's outcome for passing nodes of the other ranks (None: no rank kept).
    not_preferred: RuleOutcome | None = None

    @property
    def chosen(self) -> str | None:
        return None if self.chosen_rank is None else self.preference[self.chosen_rank]

    def rejects(self, verdict: NodeVerdict) -> bool:
        """A node that passed every rule but is of a rank the chain did not keep."""
        return (
            verdict.passed
            and self.chosen_rank is not None
            and verdict.model_rank != self.chosen_rank
        )


@dataclass(frozen=True, slots=True)
class Evaluation:
    verdicts: tuple[NodeVerdict, ...]  # in input order
    hint_error: str | None = None
    hint_problem: HintError | None = None
    hints: PodHints = NO_HINTS
    chain: ChainOutcome | None = None
    # The utilization limit applied: the policy's, or the pod's tighter `max-utilization`.
    utilization_limit: float = 0.90
    now: datetime | None = field(default=None)
    # Until when (exclusive) the passage of time alone cannot change any verdict: the earliest
    # moment at which a node's data turns stale or stops counting as clock skew, less a
    # millisecond. `None` when no verdict depends on time (e.g. every node's data is missing).
    # Verdicts are a pure function of (pod, nodes, now, policy); for the same pod, nodes and
    # policy, every `now` in [this evaluation's `now`, `valid_until`) gives the same verdicts.
    valid_until: datetime | None = None
    # The pod's own load the verdicts counted per GPU, and its sources; None when the policy
    # does not count it.
    own_load: OwnLoad | None = None

    def passed_names(self) -> list[str]:
        return [v.name for v in self.verdicts if v.passed]

    def failed(self) -> dict[str, str]:
        """Rejections preemption might cure, for `FailedNodes`."""
        return {
            v.name: v.reason or "" for v in self.verdicts if not v.passed and not v.unresolvable
        }

    def unresolvable(self) -> dict[str, str]:
        """Rejections preemption cannot cure, for `FailedAndUnresolvableNodes`."""
        return {v.name: v.reason or "" for v in self.verdicts if not v.passed and v.unresolvable}

    def scores(self) -> list[tuple[str, int]]:
        return [(v.name, v.score) for v in self.verdicts]


# ----------------------------------------------------------------------------- decoding
# The same nodes come back in every request and the agent rewrites them at most every few
# seconds, so decoding is memoised on the values of the contract's keys. `decode` is a pure
# function of those values (except when `schema-version` is absent: then it looks at every key,
# and the memo is bypassed), so the memo changes speed, never results.
_DECODE_MEMO_MAX: Final = 32_768
_decode_memos: dict[str, dict[tuple[str | None, ...], DecodedAnnotations]] = {}
_UNREADABLE: Final = "annotation value unreadable"
_VERSION_INDEX: Final = tuple(Field).index(Field.SCHEMA_VERSION)


def clear_decode_cache() -> None:
    """Forget memoised decodes and scores (benchmarks measuring the cold path; tests)."""
    _decode_memos.clear()
    _score_memos.clear()


def predecode(annotations: Mapping[str, str], keys: Keys) -> DecodedAnnotations:
    """What `judge_node` reads from a node's annotations; never raises (bad data is a result).

    For a `NodeInput.predecoded` computed off the request path.
    """
    try:
        return decode(annotations, keys)
    except Exception:  # a value the contract's parser trips on is bad data, not a crash
        return DecodedAnnotations(None, (_UNREADABLE,))


class _Decoder:
    """`predecode` memoised on the values of the contract's keys (bounded, shared per prefix)."""

    __slots__ = ("key_tuple", "keys", "memo")

    def __init__(self, keys: Keys) -> None:
        self.keys = keys
        self.key_tuple = tuple(keys[f] for f in Field)
        self.memo = _decode_memos.setdefault(keys.prefix, {})

    def __call__(self, annotations: Mapping[str, str]) -> DecodedAnnotations:
        try:
            values = tuple(map(annotations.get, self.key_tuple))
            hit = self.memo.get(values)
        except TypeError:  # an unhashable value: not what the contract writes
            return predecode(annotations, self.keys)
        if hit is not None:
            return hit
        decoded = predecode(annotations, self.keys)
        if values[_VERSION_INDEX] is not None:
            if len(self.memo) >= _DECODE_MEMO_MAX:
                self.memo.clear()
            self.memo[values] = decoded
        return decoded


# ----------------------------------------------------------------------------- the pod class

# What makes two pods the same for every verdict: the policy (by identity), the pod's
# annotations under the prefix (its hints), its GPU request, and its workload's learned figures.
PodClassKey = tuple[int, tuple[tuple[str, str], ...], int, tuple[int | None, int | None] | None]


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
    return (id(policy), hints, pod.gpu_request, figures)


class PodClass:
    """Everything about (policy, pod hints, GPU request) that is the same for every node.

    Compiled once per class: the limits as integers, every rule outcome and reason text a node
    can get (shared between nodes), the chain's match patterns. Pods with equal `key`s get equal
    verdicts on every node, so the names-only node store keeps verdicts per class.
    """

    __slots__ = (
        "any_rank",
        "blind",
        "chain_active",
        "decode",
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
        "inflight_load_delay_s",
        "inflight_max_s",
        "key",
        "lag_tolerance_s",
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
        "own",
        "own_bp",
        "patterns",
        "policy",
        "prefix",
        "require_writer",
        "score_memo",
        "skew_tolerance_s",
        "stale_after_s",
        "status_reason",
        "temp_fail",
        "temp_limit_c",
        "temp_pass",
        "temp_unknown",
        "threshold_bp",
        "util_fail",
        "util_pass",
        "util_per_gpu",
        "util_unknown",
        "w_frag",
        "w_temp",
        "w_total",
        "w_util",
    )

    @classmethod
    def of(cls, pod: PodInput, policy: Policy) -> PodClass:
        """The class of `pod` under `policy` (hints parsed; a bad hint is kept as the problem)."""
        parsed = parse_hints(pod.annotations, policy.keys)
        problem = parsed if isinstance(parsed, HintError) else None
        hints = NO_HINTS if isinstance(parsed, HintError) else parsed
        return cls(
            pod_class_key(pod, policy), policy, hints, problem, pod.gpu_request, learned=pod.learned
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
    ) -> None:
        self.key = key
        self.policy = policy
        self.hints = hints
        self.hint_problem = hint_problem
        self.gpu_request = gpu_request
        self.decode = _Decoder(policy.keys)
        lenient = policy.missing_data == "lenient"
        self.lenient = lenient
        self.prefix = policy.keys.prefix
        limit = policy.utilization_limit
        if hints.max_utilization is not None and hints.max_utilization < limit:
            limit = hints.max_utilization
        self.limit_bp = round(limit * BASIS_POINTS)
        threshold = limit
        if hints.fallback_utilization is not None and hints.fallback_utilization < limit:
            threshold = hints.fallback_utilization
        self.threshold_bp = round(threshold * BASIS_POINTS)
        self.temp_limit_c = policy.temperature_limit_c
        self.stale_after_s = policy.stale_after_s
        self.skew_tolerance_s = policy.clock_skew_tolerance_s
        self.lag_tolerance_s = policy.managed_fields_lag_tolerance_s
        self.require_writer = policy.require_agent_writer
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
        self.own_bp = 0 if self.own is None else self.own.utilization_bp
        # The memory a GPU must have free: the pod's `min-gpu-memory-mib`, or the memory its
        # processes will hold, whichever is more (None: not checked).
        need_mib = hints.min_gpu_memory_mib
        own_mib = 0 if self.own is None else self.own.memory_mib
        if own_mib > 0 and (need_mib is None or own_mib > need_mib):
            need_mib = own_mib
        self.min_memory_mib = need_mib
        self.inflight_max_s = policy.inflight_max_s
        self.inflight_load_delay_s = policy.inflight_load_delay_s
        self.inflight_load_bp = round(policy.inflight_gpu_load * BASIS_POINTS)
        self.min_fit_bp = round(policy.min_gpu_fit_probability * BASIS_POINTS)
        self.blind = policy.blind_device_plugin
        self.w_util, self.w_frag, self.w_temp = weight_milli(policy)
        self.w_total = self.w_util + self.w_frag + self.w_temp
        self.score_memo = _score_memo((self.temp_limit_c, self.w_util, self.w_frag, self.w_temp))
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
        # The k-GPU rule (`_judge_gpus`): on a node that publishes per-GPU data it takes over
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
        self.not_checked = (
            RuleOutcome("health", "not-checked"),
            RuleOutcome("utilization", "not-checked"),
            RuleOutcome("temperature", "not-checked"),
            self.mem_skip,
            self.model_skip,
            self.gpus_skip,
        )

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


# The score is a pure function of three node values and four policy numbers, and the values
# repeat across nodes and requests (two-decimal fractions, whole degrees), so breakdowns are
# memoised per policy. Bounded: a memo that outgrows its limit is started afresh.
_SCORE_MEMO_MAX: Final = 65_536
_score_memos: dict[
    tuple[int, int, int, int], dict[tuple[int, float | None, int | None], ScoreBreakdown]
] = {}


def _score_memo(
    policy_key: tuple[int, int, int, int],
) -> dict[tuple[int, float | None, int | None], ScoreBreakdown]:
    memo = _score_memos.get(policy_key)
    if memo is None or len(memo) > _SCORE_MEMO_MAX:
        if len(_score_memos) > 64:
            _score_memos.clear()
        memo = _score_memos[policy_key] = {}
    return memo


def as_utc(moment: datetime) -> datetime:
    """Kubernetes times are UTC: a naive datetime from a caller is read as UTC rather than failing
    the whole request on a subtraction of naive and aware times."""
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment


# ----------------------------------------------------------------------------- the three steps


def evaluate(
    pod: PodInput,
    nodes: Sequence[NodeInput],
    now: datetime,
    policy: Policy,
    *,
    pod_class: PodClass | None = None,
) -> Evaluation:
    """Judge every node for `pod` at `now`. Never raises for any annotation content.

    `pod_class` is `PodClass.of(pod, policy)` when the caller has it compiled already.
    """
    now = as_utc(now)
    c = pod_class if pod_class is not None else PodClass.of(pod, policy)
    verdicts = [judge_node(node, now, c) for node in nodes]
    valid_until = _valid_until(verdicts, now, c)
    chain = resolve_chain(c, *best_chain_ranks(verdicts)) if c.chain_active else None
    if chain is not None and chain.not_preferred is not None:
        verdicts = [reject_unkept_rank(v, chain) for v in verdicts]
    problem = c.hint_problem
    return Evaluation(
        tuple(verdicts),
        None if problem is None else problem.reason,
        problem,
        c.hints,
        chain,
        c.utilization_limit,
        now,
        valid_until,
        c.own,
    )


def judge_node(node: NodeInput, now: datetime, c: PodClass) -> NodeVerdict:
    """One node's verdict for pod class `c` at `now` (aware), before the model chain.

    Steps: read the annotations, date them by both clocks, then either the missing-data
    policy (data that cannot be judged) or the rules and the score; last, a pod whose hint is
    invalid is rejected on every node (with everything else kept for the explanation).
    """
    pre = node.predecoded
    decoded = pre[1] if pre is not None and pre[0] == c.prefix else c.decode(node.annotations)
    state = decoded.state
    written = node.agent_write_time
    server_age_s: float | None = None
    if written is not None:
        written = as_utc(written)
        server_age_s = (now - written).total_seconds()
    if state is None:
        verdict = _untimely(
            node.name, decoded, _unreadable_status(decoded), None, server_age_s, written, c
        )
    elif c.require_writer and not written_by_agent(node):
        age_s = (now - state.updated_at).total_seconds()
        verdict = _untimely(node.name, decoded, "untrusted", age_s, server_age_s, written, c)
        verdict = msgspec.structs.replace(verdict, foreign_writer=node.foreign_writer)
    else:
        age_s = (now - state.updated_at).total_seconds()
        status = _freshness(age_s, server_age_s, c)
        if status == "fresh":
            inflight = (
                count_inflight(
                    node.pods,
                    state.updated_at,
                    now,
                    c.inflight_max_s,
                    c.inflight_load_delay_s,
                    c.inflight_load_bp,
                )
                if node.pods
                else None
            )
            verdict = _judge_fresh(
                node.name, decoded, state, age_s, server_age_s, written, c, inflight
            )
        else:
            verdict = _untimely(node.name, decoded, status, age_s, server_age_s, written, c)
    if c.hint_problem is not None:
        verdict = _rejected_for_hint(verdict, c.hint_problem)
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


def reject_unkept_rank(verdict: NodeVerdict, chain: ChainOutcome) -> NodeVerdict:
    """`verdict` after the chain: a passing node of a rank not kept is rejected (unresolvable)."""
    rejection = chain.not_preferred
    if rejection is None or not chain.rejects(verdict):
        return verdict
    return msgspec.structs.replace(
        verdict,
        passed=False,
        reason=rejection.reason,
        unresolvable=True,
        score=0,
        breakdown=None,
        rules=(*verdict.rules[:4], rejection, *verdict.rules[5:]),
        at_or_below_threshold=False,
    )


# ----------------------------------------------------------------------------- time windows

# Verdict boundaries are compared in float seconds; stopping a millisecond short of the exact
# boundary keeps rounding from ever placing a changed verdict inside a validity window.
VALIDITY_MARGIN_S: Final = 0.001
_VALIDITY_MARGIN: Final = timedelta(seconds=VALIDITY_MARGIN_S)


def time_left_s(
    age_s: float | None,
    server_age_s: float | None,
    stale_s: float,
    skew_s: float,
    inflight: InFlight | None = None,
) -> float:
    """Seconds until time alone changes one node's verdict; `inf` when no boundary lies ahead.

    Only freshness depends on `now`: a node turns stale once `age_s` or `server_age_s` exceeds
    `stale_s`, and stops being clock skew once `-age_s` no longer exceeds `skew_s` (the
    managedFields lag check compares two stored times and does not move). Each remaining time is
    `threshold - current`; a negative one is a boundary already passed, which time cannot cross
    again. Boundaries that do not apply to a node (a stale node's skew one, say) only make the
    answer earlier, which is safe. An in-flight pod stops counting when its time bound ends.
    """
    left_s = math.inf if inflight is None else inflight.left_s
    if age_s is not None:
        remaining = stale_s - age_s
        if 0 <= remaining < left_s:
            left_s = remaining
        remaining = -age_s - skew_s
        if 0 <= remaining < left_s:
            left_s = remaining
    if server_age_s is not None:
        remaining = stale_s - server_age_s
        if 0 <= remaining < left_s:
            left_s = remaining
    return left_s


def time_since_s(
    age_s: float | None,
    server_age_s: float | None,
    stale_s: float,
    skew_s: float,
    inflight: InFlight | None = None,
) -> float:
    """Seconds since the last of the same boundaries (`inf` when none lies behind): going back
    in time no further than this, the verdict was the same. See `time_left_s`."""
    since_s = math.inf if inflight is None else inflight.since_s
    if age_s is not None:
        elapsed = age_s - stale_s
        if 0 <= elapsed < since_s:
            since_s = elapsed
        elapsed = age_s + skew_s
        if 0 <= elapsed < since_s:
            since_s = elapsed
    if server_age_s is not None:
        elapsed = server_age_s - stale_s
        if 0 <= elapsed < since_s:
            since_s = elapsed
    return since_s


def validity_window(verdict: NodeVerdict, now_ts: float, c: PodClass) -> tuple[float, float]:
    """`[from, until)` in POSIX seconds around `now_ts` (when `verdict` was judged) in which
    time alone cannot change it, a millisecond short of each boundary; unbounded sides are
    infinite. `now_ts` itself always lies inside, unless a boundary is exactly at `now_ts`."""
    stale_s, skew_s = c.stale_after_s, c.skew_tolerance_s
    inflight = verdict.inflight
    left_s = time_left_s(verdict.age_s, verdict.server_age_s, stale_s, skew_s, inflight)
    since_s = time_since_s(verdict.age_s, verdict.server_age_s, stale_s, skew_s, inflight)
    from_ts = min(now_ts, now_ts - since_s + VALIDITY_MARGIN_S)
    return from_ts, now_ts + left_s - VALIDITY_MARGIN_S


def _valid_until(verdicts: Sequence[NodeVerdict], now: datetime, c: PodClass) -> datetime | None:
    """The earliest time-driven change of any verdict (see `Evaluation.valid_until`)."""
    stale_s = c.stale_after_s
    skew_s = c.skew_tolerance_s
    left_s = min(
        (time_left_s(v.age_s, v.server_age_s, stale_s, skew_s, v.inflight) for v in verdicts),
        default=math.inf,
    )
    if left_s == math.inf:
        return None
    return now + timedelta(seconds=left_s) - _VALIDITY_MARGIN


# ----------------------------------------------------------------------------- judge_node's steps


def _unreadable_status(decoded: DecodedAnnotations) -> DataStatus:
    # The record-level problem is the last one (a version-less record notes that first).
    problems = decoded.problems
    if problems and problems[-1] in ("updated-at unparsable", _UNREADABLE):
        return "invalid"
    return "missing"


def _freshness(age_s: float, server_age_s: float | None, c: PodClass) -> DataStatus:
    """Clock checks, most specific first. updated-at is the node's clock at sampling; the
    managedFields time is the server's clock at the write that followed, so updated-at may not
    run ahead of it, and the server's time also bounds how old the data can really be."""
    if -age_s > c.skew_tolerance_s or (
        server_age_s is not None and server_age_s - age_s > c.lag_tolerance_s
    ):
        return "clock-skew"
    if age_s > c.stale_after_s or (server_age_s is not None and server_age_s > c.stale_after_s):
        return "stale"
    return "fresh"


def _judge_fresh(  # noqa: PLR0917 (judge_node's locals, passed positionally on the hot path)
    name: str,
    decoded: DecodedAnnotations,
    state: NodeGpuState,
    age_s: float,
    server_age_s: float | None,
    written: datetime | None,
    c: PodClass,
    inflight: InFlight | None = None,
) -> NodeVerdict:
    """Fresh data: the node-level rules in order (the first failure gives the reason), the
    k-GPU rule where the node publishes per-GPU data and the pod asks for GPUs, then the score
    of what passed. In-flight pods count as the rules read them: on node-level data their
    estimated load and memory are added to what the node published; under the k-GPU rule they
    hold GPUs (`_judge_gpus`)."""
    rank = model_rank(state.gpu_model, c.patterns, c.any_rank) if c.chain_active else None
    # Per-GPU truth decides for a pod asking k GPUs: the k-GPU rule replaces the node-level
    # utilization and memory rules, whose values are summaries (mean, maximum) of the same
    # per-GPU readings. The temperature rule stays: a node's GPUs share its cooling, and an
    # idle GPU's temperature says nothing about its temperature under load (docs/scoring.md).
    per_gpu = _judge_gpus(state.gpus, c, inflight) if state.gpus and c.gpu_request > 0 else None
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
        temp = c.temp_fail if temperature_c >= c.temp_limit_c else c.temp_pass
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

    rules = (health, util, temp, mem, model, gpus)
    if failed is not None:
        return NodeVerdict(
            name, False, failed.reason, failed.unresolvable, 0, status, decoded, rules, None,
            age_s, server_age_s, written, rank, False, gpus=check, inflight=inflight,
            utilization_judged=judged_utilization,
            memory_largest_free_judged_mib=judged_largest,
        )  # fmt: skip
    if status != "fresh":
        # Lenient on a node whose utilization is unknown: passes, scores lowest, says why.
        return NodeVerdict(
            name, True, c.status_reason[status], False, 0, status, decoded, rules, None,
            age_s, server_age_s, written, rank, False, gpus=check, inflight=inflight,
            utilization_judged=judged_utilization,
            memory_largest_free_judged_mib=judged_largest,
        )  # fmt: skip
    if per_gpu is not None:
        breakdown = _combine(
            per_gpu.utilization_headroom_bp,
            _fragmentation_headroom(state.memory_fragmentation),
            per_gpu.temperature_headroom_bp,
            c,
        )
        below = c.chain_active and per_gpu.at_or_below_threshold
    else:
        breakdown = _score(utilization_bp, state.memory_fragmentation, temperature_c, c)
        below = c.chain_active and utilization_bp <= c.threshold_bp
    return NodeVerdict(
        name, True, None, False, breakdown.score, "fresh", decoded, rules, breakdown,
        age_s, server_age_s, written, rank, below, gpus=check, inflight=inflight,
        utilization_judged=judged_utilization,
        memory_largest_free_judged_mib=judged_largest,
    )  # fmt: skip


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


class _GpuJudgement(NamedTuple):
    """The k-GPU rule's result on one node: its outcome, the findings for the explanation,
    and what the score and the chain read of the GPUs the pod may get."""

    outcome: RuleOutcome
    check: GpuCheck
    utilization_headroom_bp: int  # expected over the GPUs the pod may get (see `_judge_gpus`)
    temperature_headroom_bp: int
    # The pod is as likely to get k GPUs at or below the chain's threshold as the rule asks.
    at_or_below_threshold: bool


def fit_bp(suitable: int, pool: int, k: int) -> int:
    """The chance, in basis points rounded down, that k GPUs drawn at random without
    replacement from `pool` GPUs of which `suitable` are candidates are all candidates:
    C(suitable, k) / C(pool, k), in integers so that it is exact and the same everywhere."""
    if k <= 0:
        return BASIS_POINTS
    if suitable < k or pool < k:
        return 0
    return math.comb(suitable, k) * BASIS_POINTS // math.comb(pool, k)


def _judge_gpus(
    gpus: tuple[GpuState, ...], c: PodClass, inflight: InFlight | None = None
) -> _GpuJudgement | None:
    """The k-GPU rule (k = the pod's GPU request, at least 1) on a node's per-GPU table, or
    None when no GPU has an NVML value (nothing per GPU to judge: the node-level rules apply).

    A GPU is a candidate when it passes, in this order: it is measured (lenient: some NVML
    value is; strict: every value the rules read is), it is unallocated (only when allocations
    are published; a GPU the kubelet does not offer, `-`, is not), its utilization is at or
    below the pod's limit, its temperature below the limit, and it has the pod's
    `min-gpu-memory-mib` free (when set). Lenient, an unmeasured utilization, temperature or
    memory does not disqualify the GPU, and scores as no headroom.

    In-flight pods hold GPUs the data cannot show as theirs: the pods whose allocation is
    pending where allocations are published, else those whose load is pending. Which GPUs the
    device plugin gave them is unknown, so they are taken to hold candidates, the best first:
    the worst case for this pod, and the one that never counts a GPU twice.

    Which GPUs this pod will get is the device plugin's choice too, blind to load. Where
    allocations are published, the plugin hands out k of its pool (the unallocated GPUs that
    are measured at all, less the in-flight ones), any k as far as the scorer can tell; so the
    node passes when the chance that k drawn at random are all candidates (`fit_bp`) reaches
    the policy's `min_gpu_fit_probability`, and the score reads the expected headroom of the
    GPUs handed out: the mean over the pool, a GPU that is no candidate counting as none.
    Where allocations are unknown, the pool is unknown too: the node passes with k candidates
    and the score reads the best k (by the headrooms under the policy's weights, ties by
    index), as they are under the policy's `blind_device_plugin: false` (a load-aware
    allocator). A node short of k candidates is rejected with the reason of the first criterion
    after which fewer than k GPUs remain (in-flight GPUs count as allocated).
    """
    k = c.gpu_request
    limit_bp, threshold_bp = c.limit_bp, c.threshold_bp
    # The pod's own load: a GPU is a candidate only if it stays within the limit under it,
    # and its headroom is what is left after it.
    own_bp = c.own_bp
    fit_limit_bp = limit_bp - own_bp
    temp_limit_c = c.temp_limit_c
    min_mib = c.min_memory_mib
    strict = not c.lenient
    w_util, w_temp = c.w_util, c.w_temp
    allocation_checked = False
    for gpu in gpus:
        if gpu.allocated is not None:
            allocation_checked = True
            break
    status: list[GpuStatus] = []
    add = status.append
    # The GPUs that failed each criterion first (GPU_STEPS after `gpu-count`), counted as
    # plain locals: this loop runs per GPU of every node judged.
    unmeasured = allocated_n = hot_util = hot_temp = short_mem = 0
    lost = 0
    pool: list[int] = []  # the device plugin's pool (allocations published): GPU indexes
    # (-merit, index, utilization headroom, temperature headroom, at or below the threshold)
    ranked: list[tuple[int, int, int, int, bool]] = []
    for index, (u, mib, temp_c, allocated) in enumerate(gpus):
        if u is None and mib is None and temp_c is None:
            lost += 1  # lost, or nothing NVML could read: not a GPU the pod can use
            unmeasured += 1
            add("unmeasured")
            continue
        offered = not allocation_checked or allocated is False
        if offered and allocation_checked:
            pool.append(index)
        u_bp = -1 if u is None else round(u * BASIS_POINTS)
        if strict and (u_bp < 0 or temp_c is None or (min_mib is not None and mib is None)):
            unmeasured += 1
            add("unmeasured")
            continue
        if not offered:
            allocated_n += 1
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
        else:  # inline `_temperature_headroom`: above 0 here, capped at the full headroom
            temp_headroom = (temp_limit_c - temp_c) * BASIS_POINTS // TEMPERATURE_HEADROOM_SPAN_C
            temp_headroom = min(temp_headroom, BASIS_POINTS)
        if min_mib is not None and mib is not None and mib < min_mib:
            short_mem += 1
            add("memory")
            continue
        add("candidate")
        util_headroom = 0 if u_bp < 0 else max(0, BASIS_POINTS - u_bp - own_bp)
        ranked.append(
            (
                -(w_util * util_headroom + w_temp * temp_headroom),
                index,
                util_headroom,
                temp_headroom,
                0 <= u_bp <= threshold_bp,
            )
        )
    if lost == len(gpus):
        return None
    ranked.sort()
    held = 0
    if inflight is not None:
        held = inflight.allocation_gpus if allocation_checked else inflight.load_gpus
    taken = 0
    if held:
        # The in-flight pods' GPUs: the best candidates, then (more GPUs held than there are
        # candidates) the pool's other GPUs in index order. Each is allocated, not a candidate.
        taken_candidates = ranked[:held]
        del ranked[:held]
        for entry in taken_candidates:
            status[entry[1]] = "in-flight"
        taken = len(taken_candidates)
        for index in pool:
            if taken >= held:
                break
            if status[index] != "in-flight":
                failed_step = status[index]
                status[index] = "in-flight"
                taken += 1
                if failed_step == "unmeasured":
                    unmeasured -= 1
                elif failed_step == "utilization":
                    hot_util -= 1
                elif failed_step == "temperature":
                    hot_temp -= 1
                elif failed_step == "memory":
                    short_mem -= 1
        allocated_n += taken
        if allocation_checked:
            pool = [i for i in pool if status[i] != "in-flight"]
    candidates = len(ranked)
    if candidates < k:
        failed = (unmeasured, allocated_n, hot_util, hot_temp, short_mem)
        check = GpuCheck(
            k, candidates, tuple(status), (), allocation_checked, taken,
            len(pool) if allocation_checked else None, 0 if allocation_checked else None,
        )  # fmt: skip
        return _GpuJudgement(c.gpus_fail[_shortfall_step(len(gpus), failed, k)], check, 0, 0, False)
    if allocation_checked and c.blind:
        # A blind device plugin: any k of the pool. Expected headrooms are means over the pool.
        pool_size = len(pool)
        chance_bp = fit_bp(candidates, pool_size, k)
        below_bp = fit_bp(sum(1 for entry in ranked if entry[4]), pool_size, k)
        util_sum = sum(entry[2] for entry in ranked)
        temp_sum = sum(entry[3] for entry in ranked)
        counted = tuple(sorted(entry[1] for entry in ranked))
        check = GpuCheck(
            k, candidates, tuple(status), counted, allocation_checked, taken, pool_size, chance_bp
        )
        outcome = c.gpus_pass if chance_bp >= c.min_fit_bp else c.gpus_unlikely
        return _GpuJudgement(
            outcome,
            check,
            (2 * util_sum + pool_size) // (2 * pool_size),
            (2 * temp_sum + pool_size) // (2 * pool_size),
            below_bp >= c.min_fit_bp,
        )
    util_sum = temp_sum = 0
    best: list[int] = []
    for _, index, util_headroom, temp_headroom, _ in ranked[:k]:
        best.append(index)
        util_sum += util_headroom
        temp_sum += temp_headroom
    below = sum(1 for entry in ranked if entry[4])
    check = GpuCheck(k, candidates, tuple(status), tuple(best), allocation_checked, taken)
    # Means in basis points, rounded half up (integers, as every step of the score).
    return _GpuJudgement(
        c.gpus_pass,
        check,
        (2 * util_sum + k) // (2 * k),
        (2 * temp_sum + k) // (2 * k),
        below >= k,
    )


def _untimely(  # noqa: PLR0917 (judge_node's locals, passed positionally on the hot path)
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
            name, False, reason, True, 0, status, decoded, c.not_checked, None,
            age_s, server_age_s, written, rank,
        )  # fmt: skip
    rules = c.not_checked
    if c.chain_active:
        if rank is None:
            rules = (*rules[:4], c.model_unlisted, *rules[5:])
            return NodeVerdict(
                name, False, c.model_unlisted.reason, True, 0, status, decoded, rules, None,
                age_s, server_age_s, written, rank,
            )  # fmt: skip
        rules = (*rules[:4], c.model_pass, *rules[5:])
    return NodeVerdict(
        name, True, reason, False, 0, status, decoded, rules, None,
        age_s, server_age_s, written, rank,
    )  # fmt: skip


def _rejected_for_hint(verdict: NodeVerdict, problem: HintError) -> NodeVerdict:
    return msgspec.structs.replace(
        verdict,
        passed=False,
        reason=problem.reason,
        unresolvable=True,
        score=0,
        breakdown=None,
        at_or_below_threshold=False,
    )


def _score(
    utilization_bp: int,
    fragmentation: float | None,
    temperature_c: int | None,
    c: PodClass,
) -> ScoreBreakdown:
    """Weighted mean of three headrooms, in integers; an unknown headroom counts as none."""
    key = (utilization_bp, fragmentation, temperature_c)
    memoised = c.score_memo.get(key)
    if memoised is not None:
        return memoised
    breakdown = c.score_memo[key] = _combine(
        BASIS_POINTS - utilization_bp,
        _fragmentation_headroom(fragmentation),
        _temperature_headroom(temperature_c, c.temp_limit_c),
        c,
    )
    return breakdown


def _fragmentation_headroom(fragmentation: float | None) -> int:
    return 0 if fragmentation is None else BASIS_POINTS - round(fragmentation * BASIS_POINTS)


def _temperature_headroom(temperature_c: int | None, limit_c: int) -> int:
    if temperature_c is None:
        return 0
    headroom = (limit_c - temperature_c) * BASIS_POINTS // TEMPERATURE_HEADROOM_SPAN_C
    return max(0, min(BASIS_POINTS, headroom))


def _combine(
    utilization_headroom: int, fragmentation_headroom: int, temperature_headroom: int, c: PodClass
) -> ScoreBreakdown:
    """The weighted mean of three headrooms (basis points) and the score it rounds to."""
    weighted = (
        c.w_util * utilization_headroom
        + c.w_frag * fragmentation_headroom
        + c.w_temp * temperature_headroom
    )
    w_total = c.w_total
    # Round half up twice, each step shown in explanations: to 0.01 %, then to 0..10.
    percent_bp = (2 * weighted + w_total) // (2 * w_total)
    percent_bp = max(0, min(BASIS_POINTS, percent_bp))
    score = (percent_bp + BASIS_POINTS // (2 * MAX_SCORE)) // (BASIS_POINTS // MAX_SCORE)
    return ScoreBreakdown(
        utilization_headroom, fragmentation_headroom, temperature_headroom, percent_bp, score
    )
