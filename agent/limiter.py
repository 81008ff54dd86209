"""The write decision: whether this tick's state is worth a Node patch.

Every Node patch fans out as a watch event to every Node watcher in the cluster and makes
kube-scheduler retry its unschedulable pods, so writes are the agent's real cost. This module
decides when one is worth it. It is pure: the caller passes the state, the monotonic time `now_s`
and the total GPU memory; the module never reads a clock, never sleeps and never does I/O, so every
rule is tested by feeding it times.

The rules (docs/agent.md has the operator's version):

* A write happens when the agent has never written, when a discrete field changed (`health`,
  `health-detail`, `gpu-model`, `gpu-count`, a GPU's allocation, a per-GPU value appearing or
  disappearing, a change in which pods hold which GPU or which of a pod's figures are known),
  when a numeric field moved by at least its deadband since the last *written* value (a pod's
  figures on a GPU included), or when the last successful write is older than the heartbeat.
* Deadbands are direction-aware: a move towards less headroom (busier, hotter, less free memory,
  more fragmented) counts at the deadband, a move towards more headroom only at
  `improving_deadband_factor` times it. Bad news reaches readers at once; good news at the latest
  with the heartbeat, so a published value errs towards less headroom than the GPU has.
* Per-GPU values are compared as a multiset: no write while each new GPU can be paired with its
  own written GPU within every per-GPU deadband (a GPU crossing a deadband is a change unless
  another GPU took its place). The scheduler chooses a node and the device plugin the GPU, so a
  permutation of the same GPU states changes no decision; noise that merely reorders GPUs of a
  node is not worth a write.
* Any two write attempts, successful or not, are at least `min_write_interval_s` apart. This holds
  for discrete changes too (a GPU going unavailable waits at most one interval) and for the first
  attempt after an error: a flapping GPU or a recovering API server must never cause a burst.
* After a failed attempt the next one waits an exponential backoff (`backoff_base_s` doubling up to
  `backoff_max_s`), or the server's `Retry-After` when that is longer (capped at `backoff_max_s`).
* Start-up waits a jitter chosen by the caller (up to one interval), so a fleet does not write in
  lockstep. The caller also picks a heartbeat lead: the first heartbeat after start comes that
  much early, once. Without it, agents started together by a DaemonSet rollout keep writing the
  heartbeats of their quiet nodes in the same few seconds of every minute; with a lead drawn
  uniformly from [0, heartbeat - min interval) their phases spread over the whole heartbeat,
  for the price of one early write per agent.
* There is no queue: each decision looks at the newest state only, compared with what was last
  written, so a state that was never sent because of a backoff is simply superseded.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Literal

from gpu_contract.podusage import PodUsage
from gpu_contract.schema import GpuState, NodeGpuState


class Reason(StrEnum):
    """Why a tick did or did not write. The values are the metric label values."""

    # Written.
    FIRST_WRITE = "first-write"
    DISCRETE_CHANGE = "discrete-change"
    DEADBAND_EXCEEDED = "deadband-exceeded"
    HEARTBEAT_DUE = "heartbeat-due"
    # Suppressed.
    WITHIN_MIN_INTERVAL = "within-min-interval"
    BELOW_DEADBAND = "below-deadband"
    BACKING_OFF = "backing-off"
    JITTER_PENDING = "jitter-pending"


WRITE_REASONS = frozenset(
    {Reason.FIRST_WRITE, Reason.DISCRETE_CHANGE, Reason.DEADBAND_EXCEEDED, Reason.HEARTBEAT_DUE}
)
SUPPRESS_REASONS = frozenset(Reason) - WRITE_REASONS


class PolicyError(ValueError):
    """A `WritePolicy` bound is violated; the message names the field and the bound."""


@dataclass(frozen=True, slots=True)
class WritePolicy:
    """The write rules' numbers; docs/agent.md explains each default."""

    min_write_interval_s: float = 10.0
    heartbeat_s: float = 60.0
    utilization_deadband: float = 0.05
    # The busiest single GPU swings far more than the node mean (one bursty inference server is
    # enough), and no scoring rule reads it: it is for operators, and every write and heartbeat
    # refreshes it anyway. Its own, wider deadband keeps it from driving most of the writes.
    utilization_max_deadband: float = 0.10
    fragmentation_deadband: float = 0.05
    # 5, not DESIGN.md's 3: in the score a degree is worth 0.15/40 of a point in 10, so only the
    # filter limit (85 C) makes it matter, and a 3 C step made temperature the trigger of most
    # change-driven writes (docs/performance.md, "Write budget").
    temperature_deadband_c: float = 5.0
    # A fraction of the node's total GPU memory, applied to memory-free-mib and
    # memory-largest-free-mib alike.
    memory_deadband_fraction: float = 0.05
    # An improving move (cooler, less busy, more free memory, less fragmented) must be this many
    # times the deadband: bad news is written at once, good news can wait for the heartbeat, so
    # what readers see errs towards less headroom, never more.
    improving_deadband_factor: float = 3.0
    # Per-GPU values (the per-gpu-* keys). 0.15 is one score step (0.10 of the score at weight
    # 0.70) and about three standard deviations of one GPU's 5 s utilization noise; a GPU's mean
    # over the node already moves the node deadband.
    per_gpu_utilization_deadband: float = 0.15
    per_gpu_temperature_deadband_c: float = 5.0
    # A fraction of one GPU's memory (the node's total over its GPU count).
    per_gpu_memory_deadband_fraction: float = 0.05
    # Each pod's figures on each GPU it holds (`pod-gpu-usage`), each against its own written
    # value. Utilization 0.15, the per-GPU deadband: a pod's figure is read as an estimate of what
    # its workload adds to a GPU, where one score step is 0.14 of utilization, and on a GPU a pod
    # holds alone it is the GPU's own figure; at 0.05 the pods' figures doubled the fleet's writes
    # (docs/performance.md, "Write budget"). Memory 5 % of one GPU's memory, the most a pod's
    # figure on one GPU can be. Which pods hold which GPU, and a figure appearing or
    # disappearing, are discrete changes.
    pod_utilization_deadband: float = 0.15
    pod_memory_deadband_fraction: float = 0.05
    # "multiset": GPUs are compared as a set (a write when the new GPUs cannot be paired one to one
    # with the written ones within the deadbands), because the scheduler picks a node and the
    # device plugin the GPU, so a permutation of the same GPU states changes no decision;
    # "by-index": each GPU against its own written value.
    per_gpu_compare: Literal["multiset", "by-index"] = "multiset"
    # The first backoff equals the minimum write interval, so a failure never shortens spacing.
    backoff_base_s: float = 10.0
    # Two heartbeats: after an outage the agent notices recovery within two minutes.
    backoff_max_s: float = 120.0

    def __post_init__(self) -> None:
        for name in (
            "min_write_interval_s",
            "heartbeat_s",
            "backoff_base_s",
            "backoff_max_s",
        ):
            value = getattr(self, name)
            if not math.isfinite(value) or value <= 0:
                raise PolicyError(f"{name} must be a finite number > 0, got {value!r}")
        for name in (
            "utilization_deadband",
            "utilization_max_deadband",
            "fragmentation_deadband",
            "temperature_deadband_c",
            "memory_deadband_fraction",
            "per_gpu_utilization_deadband",
            "per_gpu_temperature_deadband_c",
            "per_gpu_memory_deadband_fraction",
            "pod_utilization_deadband",
            "pod_memory_deadband_fraction",
        ):
            value = getattr(self, name)
            if not math.isfinite(value) or value < 0:
                raise PolicyError(f"{name} must be a finite number >= 0, got {value!r}")
        factor = self.improving_deadband_factor
        if not math.isfinite(factor) or factor < 1:
            raise PolicyError(
                f"improving_deadband_factor must be a finite number >= 1, got {factor!r}"
            )
        if self.heartbeat_s < self.min_write_interval_s:
            raise PolicyError(
                f"heartbeat_s ({self.heartbeat_s}) must be >= min_write_interval_s "
                f"({self.min_write_interval_s})"
            )
        if self.backoff_max_s < self.backoff_base_s:
            raise PolicyError(
                f"backoff_max_s ({self.backoff_max_s}) must be >= backoff_base_s "
                f"({self.backoff_base_s})"
            )


@dataclass(frozen=True, slots=True)
class LimiterState:
    """What the limiter remembers between ticks. Replace, never mutate."""

    # No attempt before this time (the start-up jitter).
    not_before_s: float
    # The state of the last successful write and the total memory it was judged against.
    last_written: NodeGpuState | None = None
    last_success_s: float | None = None
    # Every attempt, successful or not, counts for the minimum write interval.
    last_attempt_s: float | None = None
    consecutive_failures: int = 0
    # After a failure: no attempt before this time.
    retry_at_s: float | None = None
    # How much earlier than the heartbeat the gap after the first write ends; cleared by the
    # second successful write, so it shifts the node's heartbeat phase once and never shortens
    # the heartbeat itself.
    heartbeat_lead_s: float = 0.0

    @classmethod
    def initial(
        cls, *, now_s: float, jitter_s: float = 0.0, heartbeat_lead_s: float = 0.0
    ) -> LimiterState:
        """A limiter that has never written and may first write `jitter_s` after `now_s`."""
        return cls(
            not_before_s=now_s + max(0.0, jitter_s), heartbeat_lead_s=max(0.0, heartbeat_lead_s)
        )


@dataclass(frozen=True, slots=True)
class Decision:
    write: bool
    reason: Reason
    # The contract field names that triggered a write (discrete changes, deadbands crossed).
    changed: tuple[str, ...] = ()


# "Moved by at least the deadband" must hold for 0.40 -> 0.45, which is 0.04999... in binary.
_EPSILON = 1e-9


def _fraction(value: float | None) -> float | None:
    # Compare fractions as readers see them (two decimals), so a change invisible in the written
    # text never triggers a write and a visible 0.05 step always does.
    return None if value is None else round(value, 2)


def _moved(
    old: float | None,
    new: float | None,
    deadband: float,
    *,
    worse_when_higher: bool = True,
    improving_factor: float = 1.0,
) -> bool:
    if old is None or new is None:
        # A field appearing or disappearing is always worth telling readers.
        return (old is None) != (new is None)
    delta = new - old
    worse = delta > 0 if worse_when_higher else delta < 0
    band = deadband if worse else deadband * improving_factor
    if band <= 0:
        # A zero deadband means "any change", not "always": an unchanged value must not count
        # (the epsilon below would otherwise make 0 >= -1e-9 true on every tick).
        return new != old
    return abs(delta) >= band - _EPSILON


def _discrete_changes(old: NodeGpuState, new: NodeGpuState) -> tuple[str, ...]:
    changed: list[str] = []
    if old.health != new.health:
        changed.append("health")
    if old.health_detail != new.health_detail:
        changed.append("health-detail")
    if old.gpu_model != new.gpu_model:
        changed.append("gpu-model")
    if old.gpu_count != new.gpu_count:
        changed.append("gpu-count")
    changed.extend(_per_gpu_discrete(old.gpus, new.gpus))
    if _pod_layout(old.pods) != _pod_layout(new.pods):
        changed.append(POD_GPU_USAGE)
    return tuple(changed)


POD_GPU_USAGE = "pod-gpu-usage"


def _pod_layout(pods: Sequence[PodUsage]) -> set[tuple[str, int, bool, bool]]:
    """Which pod holds which GPU, and which of its figures are known: the discrete part."""
    return {
        (pod.pod, share.gpu_index, share.utilization is None, share.memory_used_mib is None)
        for pod in pods
        for share in pod.gpus
    }


def _pod_numeric(
    old: Sequence[PodUsage],
    new: Sequence[PodUsage],
    policy: WritePolicy,
    memory_total_mib: int | None,
    gpu_count: int,
) -> bool:
    """Whether any pod's figure on any GPU moved past its deadband (the layout is unchanged)."""
    memory_deadband_mib = (
        policy.pod_memory_deadband_fraction * memory_total_mib / gpu_count
        if memory_total_mib is not None and memory_total_mib > 0 and gpu_count > 0
        else 0.0
    )
    factor = policy.improving_deadband_factor
    written = {(p.pod, s.gpu_index): s for p in old for s in p.gpus}
    for pod in new:
        for share in pod.gpus:
            before = written.get((pod.pod, share.gpu_index))
            if before is None:
                return True
            if _moved(
                _fraction(before.utilization),
                _fraction(share.utilization),
                policy.pod_utilization_deadband,
                improving_factor=factor,
            ) or _moved(
                None if before.memory_used_mib is None else float(before.memory_used_mib),
                None if share.memory_used_mib is None else float(share.memory_used_mib),
                memory_deadband_mib,
                improving_factor=factor,
            ):
                return True
    return False


_PER_GPU_FIELDS = (
    ("per-gpu-utilization", "utilization"),
    ("per-gpu-memory-free-mib", "memory_free_mib"),
    ("per-gpu-temperature", "temperature_c"),
)


def _per_gpu_discrete(old: Sequence[GpuState], new: Sequence[GpuState]) -> list[str]:
    """Allocation flips and per-GPU values appearing or disappearing, GPU by GPU."""
    if len(old) != len(new):
        return ["per-gpu"]
    changed: list[str] = []
    if any(o.allocated != n.allocated for o, n in zip(old, new, strict=True)):
        changed.append("per-gpu-allocated")
    if any(o.dra_device != n.dra_device for o, n in zip(old, new, strict=True)):
        changed.append("per-gpu-dra-device")
    for key, attr in _PER_GPU_FIELDS:
        if any(
            (getattr(o, attr) is None) != (getattr(n, attr) is None)
            for o, n in zip(old, new, strict=True)
        ):
            changed.append(key)
    return changed


def _per_gpu_close(
    policy: WritePolicy, memory_deadband_mib: float
) -> Callable[[GpuState, GpuState], tuple[str, ...]]:
    factor = policy.improving_deadband_factor

    def moved_fields(old: GpuState, new: GpuState) -> tuple[str, ...]:
        out: list[str] = []
        if _moved(
            _fraction(old.utilization),
            _fraction(new.utilization),
            policy.per_gpu_utilization_deadband,
            improving_factor=factor,
        ):
            out.append("per-gpu-utilization")
        if _moved(
            None if old.memory_free_mib is None else float(old.memory_free_mib),
            None if new.memory_free_mib is None else float(new.memory_free_mib),
            memory_deadband_mib,
            worse_when_higher=False,
            improving_factor=factor,
        ):
            out.append("per-gpu-memory-free-mib")
        if _moved(
            None if old.temperature_c is None else float(old.temperature_c),
            None if new.temperature_c is None else float(new.temperature_c),
            policy.per_gpu_temperature_deadband_c,
            improving_factor=factor,
        ):
            out.append("per-gpu-temperature")
        if old.allocated != new.allocated:
            out.append("per-gpu-allocated")
        if old.dra_device != new.dra_device:
            out.append("per-gpu-dra-device")
        return tuple(out)

    return moved_fields


def _perfect_matching(n: int, fits: Callable[[int, int], bool]) -> bool:
    """Whether every new GPU i can be paired with its own old GPU j where `fits(i, j)`."""
    candidates = [[j for j in range(n) if fits(i, j)] for i in range(n)]
    owner = [-1] * n

    def place(i: int, seen: list[bool]) -> bool:
        for j in candidates[i]:
            if not seen[j]:
                seen[j] = True
                if owner[j] < 0 or place(owner[j], seen):
                    owner[j] = i
                    return True
        return False

    return all(place(i, [False] * n) for i in range(n))


def _per_gpu_numeric(
    old: Sequence[GpuState],
    new: Sequence[GpuState],
    policy: WritePolicy,
    memory_total_mib: int | None,
) -> tuple[str, ...]:
    if not new or len(old) != len(new):
        return ()
    memory_deadband_mib = (
        policy.per_gpu_memory_deadband_fraction * memory_total_mib / len(new)
        if memory_total_mib is not None and memory_total_mib > 0
        else 0.0
    )
    moved_fields = _per_gpu_close(policy, memory_deadband_mib)
    moved = [moved_fields(o, n) for o, n in zip(old, new, strict=True)]
    if not any(moved):
        return ()
    if policy.per_gpu_compare == "multiset" and _perfect_matching(
        len(new), lambda i, j: not moved_fields(old[j], new[i])
    ):
        return ()
    return tuple(dict.fromkeys(f for fields in moved for f in fields))


def _deadband_changes(
    old: NodeGpuState, new: NodeGpuState, policy: WritePolicy, memory_total_mib: int | None
) -> tuple[str, ...]:
    changed: list[str] = []
    factor = policy.improving_deadband_factor
    if _moved(
        _fraction(old.utilization),
        _fraction(new.utilization),
        policy.utilization_deadband,
        improving_factor=factor,
    ):
        changed.append("utilization")
    if _moved(
        _fraction(old.utilization_max),
        _fraction(new.utilization_max),
        policy.utilization_max_deadband,
        improving_factor=factor,
    ):
        changed.append("utilization-max")
    if _moved(
        _fraction(old.memory_fragmentation),
        _fraction(new.memory_fragmentation),
        policy.fragmentation_deadband,
        improving_factor=factor,
    ):
        changed.append("memory-fragmentation")
    if _moved(
        None if old.temperature_c is None else float(old.temperature_c),
        None if new.temperature_c is None else float(new.temperature_c),
        policy.temperature_deadband_c,
        improving_factor=factor,
    ):
        changed.append("temperature")
    # Without a known total the memory deadband cannot be sized; any change counts (still bounded
    # by the minimum write interval).
    memory_deadband_mib = (
        policy.memory_deadband_fraction * memory_total_mib
        if memory_total_mib is not None and memory_total_mib > 0
        else 0.0
    )
    for name, old_mib, new_mib in (
        ("memory-free-mib", old.memory_free_mib, new.memory_free_mib),
        ("memory-largest-free-mib", old.memory_largest_free_mib, new.memory_largest_free_mib),
    ):
        if _moved(
            None if old_mib is None else float(old_mib),
            None if new_mib is None else float(new_mib),
            memory_deadband_mib,
            worse_when_higher=False,
            improving_factor=factor,
        ):
            changed.append(name)
    changed.extend(_per_gpu_numeric(old.gpus, new.gpus, policy, memory_total_mib))
    gpu_count = len(new.gpus) or (new.gpu_count or 0)
    if _pod_numeric(old.pods, new.pods, policy, memory_total_mib, gpu_count):
        changed.append(POD_GPU_USAGE)
    return tuple(changed)


def decide(
    limiter: LimiterState,
    state: NodeGpuState,
    *,
    now_s: float,
    memory_total_mib: int | None,
    policy: WritePolicy,
) -> Decision:
    """Whether to write `state` now. Pure: same inputs, same answer."""
    if now_s < limiter.not_before_s:
        return Decision(False, Reason.JITTER_PENDING)
    if limiter.retry_at_s is not None and now_s < limiter.retry_at_s:
        return Decision(False, Reason.BACKING_OFF)

    last = limiter.last_written
    wanted: Decision
    if last is None:
        wanted = Decision(True, Reason.FIRST_WRITE)
    elif discrete := _discrete_changes(last, state):
        wanted = Decision(True, Reason.DISCRETE_CHANGE, discrete)
    elif numeric := _deadband_changes(last, state, policy, memory_total_mib):
        wanted = Decision(True, Reason.DEADBAND_EXCEEDED, numeric)
    elif (
        limiter.last_success_s is None
        or now_s - limiter.last_success_s >= policy.heartbeat_s - limiter.heartbeat_lead_s
    ):
        wanted = Decision(True, Reason.HEARTBEAT_DUE)
    else:
        return Decision(False, Reason.BELOW_DEADBAND)

    if (
        limiter.last_attempt_s is not None
        and now_s - limiter.last_attempt_s < policy.min_write_interval_s
    ):
        return Decision(False, Reason.WITHIN_MIN_INTERVAL, wanted.changed)
    return wanted


def record_success(limiter: LimiterState, *, written: NodeGpuState, now_s: float) -> LimiterState:
    """The write of `written`, attempted at `now_s`, succeeded."""
    return replace(
        limiter,
        last_written=written,
        last_success_s=now_s,
        last_attempt_s=now_s,
        consecutive_failures=0,
        retry_at_s=None,
        # The lead applies to the gap after the first write only.
        heartbeat_lead_s=limiter.heartbeat_lead_s if limiter.last_written is None else 0.0,
    )


def heartbeat_lead_s(*, policy: WritePolicy, fraction: float) -> float:
    """The heartbeat lead for a uniform `fraction` in [0, 1): spread over what the rules allow."""
    span_s = max(0.0, policy.heartbeat_s - policy.min_write_interval_s)
    return min(max(fraction, 0.0), 1.0) * span_s


def backoff_delay_s(
    consecutive_failures: int, *, policy: WritePolicy, retry_after_s: float | None = None
) -> float:
    """The wait after the n-th failure in a row: base * 2**(n-1), capped, at least Retry-After."""
    exponent = max(0, consecutive_failures - 1)
    # Cap the exponent before computing so a long outage cannot overflow a float.
    delay = min(policy.backoff_max_s, policy.backoff_base_s * 2.0 ** min(exponent, 62))
    if retry_after_s is not None and math.isfinite(retry_after_s) and retry_after_s > 0:
        delay = max(delay, min(retry_after_s, policy.backoff_max_s))
    return delay


def record_failure(
    limiter: LimiterState,
    *,
    now_s: float,
    policy: WritePolicy,
    retry_after_s: float | None = None,
) -> LimiterState:
    """The write attempted at `now_s` failed; back off. `last_written` stays what the server has."""
    failures = limiter.consecutive_failures + 1
    delay = backoff_delay_s(failures, policy=policy, retry_after_s=retry_after_s)
    return replace(
        limiter,
        last_attempt_s=now_s,
        consecutive_failures=failures,
        retry_at_s=now_s + delay,
    )
