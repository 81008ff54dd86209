"""Live GPU state for kube-scheduler's DRA allocator: which of this node's GPUs to taint, and when.

Where GPUs are Dynamic Resource Allocation devices, kube-scheduler's own allocator picks them:
first fit, no scoring, and it skips a device with a `NoSchedule` taint that the claim does not
tolerate. Node annotations cannot reach that choice; a DeviceTaintRule can. This module is the
pure part of that: it finds the node's GPUs among the DRA driver's ResourceSlices (matched to
NVML's GPUs by UUID), judges each GPU by the scorer's device rules, and decides, per GPU, whether
a taint write is worth it. It never reads a clock and does no I/O: the caller passes `now_s`.

The rules (docs/agent.md, "DRA device taints", has the operator's version):

* A GPU breaks the policy when it is lost (read by NVML before, not now), when its temperature
  is at or above the limit, or when its window-averaged utilization is above the limit. The
  limits mirror the scorer's defaults (0.90, 85 C). One rule per GPU, one taint per rule; its key
  names the most severe reason: health, then temperature, then utilization.
* Hysteresis: a held taint is released only once the value is below the limit by a margin
  (utilization below 0.80, temperature below 80 C). A value that cannot be read keeps a held
  taint of its kind: missing data is not good news.
* Write discipline per GPU, as for annotations: two attempts at least `min_write_interval_s`
  apart (60 s: at most one taint write per GPU per minute), at most `max_writes_per_hour`
  attempts in any hour, exponential backoff after a failure. Nothing is queued: each decision
  compares the newest condition with what the server holds.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any, Final, Literal

DEFAULT_DRIVER: Final = "gpu.nvidia.com"
FIELD_MANAGER: Final = "gpu-scheduler-agent"
MANAGED_BY_LABEL: Final = "app.kubernetes.io/managed-by"
MANAGED_BY: Final = "gpu-scheduler-agent"
HOUR_S: Final = 3600.0
# A DeviceTaintRule's name is a DNS subdomain: at most 253 characters.
_MAX_NAME: Final = 253


class TaintKind(StrEnum):
    """Why a GPU is tainted; the value is the taint key after the prefix. Most severe first."""

    HEALTH = "health"
    TEMPERATURE = "temperature"
    UTILIZATION = "utilization"


SEVERITY: Final = (TaintKind.HEALTH, TaintKind.TEMPERATURE, TaintKind.UTILIZATION)


def taint_key(prefix: str, kind: TaintKind) -> str:
    """`gpu-scheduler.example.com/` + `utilization`: the key a pod tolerates to opt out."""
    return f"{prefix}{kind.value}"


# ----------------------------------------------------------------------------- ResourceSlices


@dataclass(frozen=True, slots=True)
class DraDevice:
    """One device of a ResourceSlice: what a DeviceTaintRule's selector names."""

    driver: str
    pool: str
    name: str
    uuid: str


@dataclass(frozen=True, slots=True)
class NodeDevices:
    """This node's devices with a `uuid` attribute, and why any slice or device was skipped."""

    devices: tuple[DraDevice, ...]
    problems: tuple[str, ...] = ()


def _str(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


def _uuid_attribute(device: Mapping[str, Any]) -> str | None:
    # resource.k8s.io/v1 and v1beta2 put attributes on the device; v1beta1 under `basic`.
    attributes = device.get("attributes")
    if not isinstance(attributes, dict):
        basic = device.get("basic")
        attributes = basic.get("attributes") if isinstance(basic, dict) else None
    if not isinstance(attributes, dict):
        return None
    uuid = attributes.get("uuid")
    return _str(uuid.get("string")) if isinstance(uuid, dict) else None


def node_devices(slices: Iterable[object], *, driver: str, node_name: str) -> NodeDevices:
    """The devices of the ResourceSlices of `driver` whose pool is named after this node.

    NVIDIA's DRA driver publishes one pool per node, named after it, with `spec.nodeName` set;
    the admission policy lets an agent name only that pool, so slices of any other pool are
    ignored. Only the newest generation of a pool counts (older slices are being replaced).
    A malformed slice or device is skipped with a problem text, never raised.
    """
    problems: list[str] = []
    candidates: list[tuple[int, str, Sequence[object]]] = []
    for index, item in enumerate(slices):
        name = "?"
        if isinstance(item, dict) and isinstance(item.get("metadata"), dict):
            name = str(item["metadata"].get("name") or f"#{index}")
        spec = item.get("spec") if isinstance(item, dict) else None
        if not isinstance(spec, dict):
            problems.append(f"resourceslice {name}: no spec")
            continue
        if spec.get("driver") != driver:
            continue
        pool = spec.get("pool")
        if not isinstance(pool, dict) or not isinstance(pool.get("name"), str):
            problems.append(f"resourceslice {name}: no pool name")
            continue
        if pool["name"] != node_name:
            continue
        node = spec.get("nodeName")
        if node is not None and node != node_name:
            problems.append(f"resourceslice {name}: pool {node_name} on another node {node!r}")
            continue
        generation = pool.get("generation", 0)
        devices = spec.get("devices", [])
        if (
            isinstance(generation, bool)
            or not isinstance(generation, int)
            or not isinstance(devices, list)
        ):
            problems.append(f"resourceslice {name}: malformed pool generation or devices")
            continue
        candidates.append((generation, name, devices))
    if not candidates:
        return NodeDevices((), tuple(problems))
    newest = max(generation for generation, _, _ in candidates)
    found: dict[str, DraDevice] = {}
    duplicated: set[str] = set()
    for generation, name, devices in candidates:
        if generation != newest:
            continue
        for device in devices:
            device_name = _str(device.get("name")) if isinstance(device, dict) else None
            if device_name is None or not isinstance(device, dict):
                problems.append(f"resourceslice {name}: a device without a name")
                continue
            uuid = _uuid_attribute(device)
            if uuid is None:
                continue  # not a device this agent can match (no uuid attribute)
            if uuid in found:
                duplicated.add(uuid)
                continue
            found[uuid] = DraDevice(driver, node_name, device_name, uuid)
    for uuid in sorted(duplicated):
        problems.append(f"uuid {uuid} named by more than one device; not tainting it")
        found.pop(uuid, None)
    return NodeDevices(tuple(sorted(found.values(), key=lambda d: d.name)), tuple(problems))


# ----------------------------------------------------------------------------- conditions


@dataclass(frozen=True, slots=True)
class GpuCondition:
    """What the device rules read of one GPU this tick; None: not measured."""

    utilization: float | None
    temperature_c: int | None
    lost: bool = False


@dataclass(frozen=True, slots=True)
class TaintPolicy:
    """The taint rules' numbers; docs/agent.md explains each default."""

    # The scorer's defaults (exporter_scheduler/core/policy.py): a GPU the scorer would filter out
    # is one the allocator should skip.
    utilization_limit: float = 0.90
    temperature_limit_c: int = 85
    # Hysteresis: a held taint stays until the value is this far below the limit, so a GPU
    # hovering at the limit does not flap. 0.10 is the per-GPU noise of a busy GPU's window
    # mean (docs/agent.md); 5 C is the per-GPU temperature deadband.
    utilization_margin: float = 0.10
    temperature_margin_c: int = 5
    # At most one taint write per GPU per minute. Each rule write is a watch event for every
    # scheduler and makes it retry unschedulable pods, as a Node patch does.
    min_write_interval_s: float = 60.0
    # Bounds a GPU that flaps for hours despite the margins: 12 is a taint/untaint pair every
    # 10 minutes at most.
    max_writes_per_hour: int = 12
    backoff_base_s: float = 60.0
    backoff_max_s: float = 600.0

    def __post_init__(self) -> None:
        if not 0 < self.utilization_limit <= 1:
            raise ValueError(f"utilization_limit must be in (0, 1], got {self.utilization_limit}")
        if not 0 <= self.utilization_margin < self.utilization_limit:
            raise ValueError(
                f"utilization_margin must be in [0, utilization_limit), got "
                f"{self.utilization_margin}"
            )
        if not 0 <= self.temperature_margin_c < self.temperature_limit_c:
            raise ValueError(
                f"temperature_margin_c must be in [0, temperature_limit_c), got "
                f"{self.temperature_margin_c}"
            )
        for name in ("min_write_interval_s", "backoff_base_s", "backoff_max_s"):
            value = getattr(self, name)
            if not math.isfinite(value) or value <= 0:
                raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
        if self.max_writes_per_hour < 1:
            raise ValueError(f"max_writes_per_hour must be >= 1, got {self.max_writes_per_hour}")


def breaks(condition: GpuCondition, kind: TaintKind, *, held: bool, policy: TaintPolicy) -> bool:
    """Whether `condition` breaks the rule of `kind`; a held taint uses the release threshold."""
    if kind is TaintKind.HEALTH:
        return condition.lost
    if kind is TaintKind.TEMPERATURE:
        value_c = condition.temperature_c
        if value_c is None:
            return held
        if held:
            return value_c >= policy.temperature_limit_c - policy.temperature_margin_c
        return value_c >= policy.temperature_limit_c
    utilization = condition.utilization
    if utilization is None:
        return held
    if held:
        return utilization >= policy.utilization_limit - policy.utilization_margin
    return utilization > policy.utilization_limit


def wanted_taint(
    condition: GpuCondition, *, published: TaintKind | None, policy: TaintPolicy
) -> TaintKind | None:
    """The taint this GPU should carry: the most severe rule it breaks, or None."""
    for kind in SEVERITY:
        if breaks(condition, kind, held=kind is published, policy=policy):
            return kind
    return None


def conditions(
    gpus: Iterable[tuple[str, float | None, int | None]],
    devices: Iterable[DraDevice],
    *,
    seen_uuids: frozenset[str],
) -> dict[str, GpuCondition]:
    """Each device's condition this tick, by UUID, from the GPUs NVML read (uuid, utilization,
    temperature). A device NVML read before but not now is lost; one NVML never read is not this
    agent's to judge (left out)."""
    read = {uuid: (utilization, temperature_c) for uuid, utilization, temperature_c in gpus}
    found: dict[str, GpuCondition] = {}
    for device in devices:
        if device.uuid in read:
            utilization, temperature_c = read[device.uuid]
            found[device.uuid] = GpuCondition(utilization, temperature_c)
        elif device.uuid in seen_uuids:
            found[device.uuid] = GpuCondition(None, None, lost=True)
    return found


# ----------------------------------------------------------------------------- decision


class TaintReason(StrEnum):
    """Why a decision did or did not write; the values are metric labels."""

    TAINT = "taint"
    UNTAINT = "untaint"
    CHANGE = "change"
    IN_SYNC = "in-sync"
    WITHIN_MIN_INTERVAL = "within-min-interval"
    HOURLY_BUDGET = "hourly-budget"
    BACKING_OFF = "backing-off"


TAINT_WRITE_REASONS: Final = (TaintReason.TAINT, TaintReason.UNTAINT, TaintReason.CHANGE)
TAINT_SUPPRESS_REASONS: Final = (
    TaintReason.IN_SYNC,
    TaintReason.WITHIN_MIN_INTERVAL,
    TaintReason.HOURLY_BUDGET,
    TaintReason.BACKING_OFF,
)


@dataclass(frozen=True, slots=True)
class TaintState:
    """One GPU's taint as the server holds it, and its write history."""

    published: TaintKind | None = None
    # Attempt times within the last hour, oldest first (the hourly budget and the interval).
    attempts_s: tuple[float, ...] = ()
    consecutive_failures: int = 0
    retry_at_s: float | None = None


@dataclass(frozen=True, slots=True)
class TaintDecision:
    action: Literal["apply", "delete"] | None
    wanted: TaintKind | None
    reason: TaintReason


def decide_taint(
    state: TaintState, condition: GpuCondition, *, now_s: float, policy: TaintPolicy
) -> TaintDecision:
    """Whether to write this GPU's rule now: apply (create or change), delete, or nothing."""
    wanted = wanted_taint(condition, published=state.published, policy=policy)
    if wanted == state.published:
        return TaintDecision(None, wanted, TaintReason.IN_SYNC)
    if state.retry_at_s is not None and now_s < state.retry_at_s:
        return TaintDecision(None, wanted, TaintReason.BACKING_OFF)
    if state.attempts_s and now_s - state.attempts_s[-1] < policy.min_write_interval_s:
        return TaintDecision(None, wanted, TaintReason.WITHIN_MIN_INTERVAL)
    if len(_within_hour(state.attempts_s, now_s)) >= policy.max_writes_per_hour:
        return TaintDecision(None, wanted, TaintReason.HOURLY_BUDGET)
    if wanted is None:
        return TaintDecision("delete", None, TaintReason.UNTAINT)
    reason = TaintReason.TAINT if state.published is None else TaintReason.CHANGE
    return TaintDecision("apply", wanted, reason)


def _within_hour(attempts_s: tuple[float, ...], now_s: float) -> tuple[float, ...]:
    return tuple(t for t in attempts_s if now_s - t < HOUR_S)


def taint_written(state: TaintState, *, wanted: TaintKind | None, now_s: float) -> TaintState:
    """The write attempted at `now_s` succeeded: the server holds `wanted`."""
    return TaintState(
        published=wanted,
        attempts_s=(*_within_hour(state.attempts_s, now_s), now_s),
    )


def taint_failed(
    state: TaintState, *, now_s: float, policy: TaintPolicy, retry_after_s: float | None = None
) -> TaintState:
    """The write attempted at `now_s` failed: back off; `published` stays what the server has."""
    failures = state.consecutive_failures + 1
    delay_s = min(policy.backoff_max_s, policy.backoff_base_s * 2.0 ** min(failures - 1, 62))
    if retry_after_s is not None and math.isfinite(retry_after_s) and retry_after_s > 0:
        delay_s = max(delay_s, min(retry_after_s, policy.backoff_max_s))
    return replace(
        state,
        attempts_s=(*_within_hour(state.attempts_s, now_s), now_s),
        consecutive_failures=failures,
        retry_at_s=now_s + delay_s,
    )


# ----------------------------------------------------------------------------- rule objects


def rule_name(device: DraDevice) -> str:
    """A stable name per device: `gpu-scheduler.<pool>.<device>`, hashed when too long."""
    name = f"gpu-scheduler.{device.pool}.{device.name}".lower()
    if len(name) <= _MAX_NAME:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:16]
    return f"{name[: _MAX_NAME - 17]}.{digest}"


def rule_body(
    device: DraDevice,
    kind: TaintKind,
    *,
    prefix: str,
    api_version: str,
    node_uid: str | None = None,
) -> dict[str, Any]:
    """The DeviceTaintRule that taints exactly `device` with NoSchedule under `prefix`.

    NoSchedule only: the allocator skips the device for new claims, and pods already running on
    it are never evicted (NoExecute would). Owned by the Node (when its UID is known), as the
    driver's ResourceSlices are: the garbage collector removes the rules of a deleted Node, so
    a scaled-down fleet leaves none behind. No `blockOwnerDeletion`: that would need delete
    rights on Nodes.
    """
    metadata: dict[str, Any] = {
        "name": rule_name(device),
        "labels": {MANAGED_BY_LABEL: MANAGED_BY},
    }
    if node_uid:
        metadata["ownerReferences"] = [
            {"apiVersion": "v1", "kind": "Node", "name": device.pool, "uid": node_uid}
        ]
    return {
        "apiVersion": f"resource.k8s.io/{api_version}",
        "kind": "DeviceTaintRule",
        "metadata": metadata,
        "spec": {
            "deviceSelector": {"driver": device.driver, "pool": device.pool, "device": device.name},
            "taint": {"key": taint_key(prefix, kind), "effect": "NoSchedule"},
        },
    }


@dataclass(frozen=True, slots=True)
class PublishedRule:
    """A DeviceTaintRule of this agent found on the server."""

    name: str
    device: str
    kind: TaintKind | None  # None: a key this agent does not write (to be replaced)


def own_rules(
    rules: Iterable[object], *, driver: str, node_name: str, prefix: str
) -> tuple[PublishedRule, ...]:
    """The rules that name this node's pool under `driver` with a taint key under `prefix`."""
    found: list[PublishedRule] = []
    by_key = {taint_key(prefix, kind): kind for kind in TaintKind}
    for item in rules:
        if not isinstance(item, dict):
            continue
        metadata, spec = item.get("metadata"), item.get("spec")
        if not isinstance(metadata, dict) or not isinstance(spec, dict):
            continue
        selector, taint = spec.get("deviceSelector"), spec.get("taint")
        if not isinstance(selector, dict) or not isinstance(taint, dict):
            continue
        if selector.get("driver") != driver or selector.get("pool") != node_name:
            continue
        key = taint.get("key")
        name, device = _str(metadata.get("name")), _str(selector.get("device"))
        if not isinstance(key, str) or not key.startswith(prefix) or name is None or device is None:
            continue
        found.append(PublishedRule(name, device, by_key.get(key)))
    return tuple(found)
