"""The records a verdict is made of: what goes in (a node, a pod) and what comes out (each
rule's outcome, the score's parts, one node's verdict, the chain, a whole evaluation).

Kept apart from the rules so that the serving layer and the explanation can read a verdict
without the code that makes one, and so that each rule module imports only the shapes it fills.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Final, Literal, NamedTuple

import msgspec

from exporter_scheduler.core.dra import DraPod, Exclusion
from exporter_scheduler.core.hints import NO_HINTS, HintError, PodHints
from exporter_scheduler.core.inflight import NO_PODS, BoundPod, InFlight
from exporter_scheduler.core.ownload import Learned, OwnLoad
from gpu_contract.schema import DecodedAnnotations

DataStatus = Literal["fresh", "missing", "stale", "clock-skew", "invalid", "untrusted"]
RuleName = Literal["health", "utilization", "temperature", "memory", "model", "gpus"]
# `per-gpu`: a node-level rule the `gpus` rule applied to each GPU instead (see `core.gpus`).
Outcome = Literal["pass", "fail", "unknown", "not-checked", "per-gpu"]
ChainBasis = Literal["at-or-below-threshold", "all-above-threshold", "no-candidate"]
# One GPU under the k-GPU rule: a candidate, or the first criterion it failed, in `GPU_STEPS`
# order (`not-offered`: allocations are published but the kubelet does not hand this GPU out;
# `in-flight`: taken, as the rule assumes, by a pod bound since the data was sampled; a DRA
# pod's `allocated`/`tainted`: allocated to another claim, or tainted against its claims).
GpuStatus = Literal[
    "candidate",
    "unmeasured",
    "allocated",
    "not-offered",
    "tainted",
    "in-flight",
    "utilization",
    "temperature",
    "memory",
]

# The k-GPU rule's criteria in the order it counts them: a node short of k GPUs is rejected with
# the reason of the first criterion after which fewer than k GPUs remain.
GPU_STEPS: Final = ("gpu-count", "unmeasured", "allocated", "utilization", "temperature", "memory")
BASIS_POINTS: Final = 10_000
MAX_SCORE: Final = 10  # kube-scheduler's MaxExtenderPriority


class ForeignWriter(NamedTuple):
    """A field manager other than the agent that owns GPU annotation keys of a Node."""

    manager: str
    # The API server's time of that manager's last change of the Node (any field); None when
    # its entry has none.
    time: datetime | None


class NodeInput(msgspec.Struct, frozen=True, gc=False):
    """One node as the scorer sees it: its name, its annotations, and the server's write time.

    A msgspec struct, as `PodInput` is: the Pod watch makes one for every bind and proposal
    (`with_pods`), and a frozen dataclass costs about ten times as much to construct."""

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
    # A DRA pod's verdict only: the node's devices kube-scheduler's allocator will not give it
    # (device name -> why, `core.dra.excluded_gpus`). None for any other pod.
    dra_excluded: Mapping[str, Exclusion] | None = None


def with_pods(node: NodeInput, pods: tuple[BoundPod, ...]) -> NodeInput:
    """`node` with `pods` as its bound GPU pods (the Pod watch, on every bind and proposal)."""
    return msgspec.structs.replace(node, pods=pods)


class PodInput(msgspec.Struct, frozen=True, gc=False):
    """The pod as a verdict reads it, made for every request (a struct: see `NodeInput`)."""

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
    # Its workload (`workload.workload_of`): the key its learned load is looked up by. No
    # verdict reads it (`learned` is what counts).
    workload: str | None = None
    # What the running pods of its workload use per GPU (`ownload.learn`), from the scorer's
    # watches; None when nothing is learned. Part of the pod's class (`pod_class_key`).
    learned: Learned | None = None
    # The pod's ResourceClaims by name in its namespace (`pod.spec.resourceClaims`, templates
    # resolved through `pod.status.resourceClaimStatuses`); a template claim not made yet is
    # left out. Read by the serving layer to look the claims up; no verdict reads it.
    claim_names: tuple[str, ...] = ()
    # (claim name, template name) of each of those claims made from a ResourceClaimTemplate:
    # until the watch has the claim, the template says what it asks.
    claim_templates: tuple[tuple[str, str], ...] = ()
    # A DRA pod as its verdicts read it (its claims looked up); None for any other pod.
    dra: DraPod | None = None


class RuleOutcome(msgspec.Struct, frozen=True, gc=False):
    """One rule's result for one node. Instances are shared between nodes: no per-node values."""

    rule: RuleName
    outcome: Outcome
    limit: str | None = None
    reason: str | None = None
    # True when evicting pods from the node (preemption) could not make this rule pass.
    unresolvable: bool = False


class Rules(msgspec.Struct, frozen=True, gc=False):
    """Each rule's outcome for one node, in the order the rules run: the first that fails gives
    the node's reason. Named, so that a step that changes one rule (the chain's model rule)
    says which. A msgspec struct, built per node judged: a NamedTuple costs several times as
    much to construct."""

    health: RuleOutcome
    utilization: RuleOutcome
    temperature: RuleOutcome
    memory: RuleOutcome
    model: RuleOutcome
    gpus: RuleOutcome

    def __iter__(self) -> Iterator[RuleOutcome]:
        """The outcomes in rule order (the explanation lists them so)."""
        return iter(
            (self.health, self.utilization, self.temperature, self.memory, self.model, self.gpus)
        )


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
    rules: Rules
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
    # The k-GPU rule's per-GPU findings; None where it did not apply (see `core.gpus`).
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


def as_utc(moment: datetime) -> datetime:
    """Kubernetes times are UTC: a naive datetime from a caller is read as UTC rather than failing
    the whole request on a subtraction of naive and aware times."""
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment
