"""Which GPUs the kubelet has handed out, and when to ask it again. Pure: no gRPC, no clock.

`allocated_by_gpu` maps the kubelet's device IDs to this node's GPUs by UUID. A GPU counts as
allocated when every schedulable share of it is assigned to a container. The shares are what the
kubelet's `GetAllocatableResources` lists for the GPU: the GPU's own UUID for a whole GPU, its
MIG devices' UUIDs (`MIG-...`, mapped to the parent GPU through NVML), or `UUID::n` replicas
under time-slicing. That list is the kubelet's own denominator, so no setting has to repeat the
device plugin's replica count, and it stays right when the plugin's configuration changes.

`AllocationTracker` is the schedule around the kubelet call: ask every tick while it answers,
back off while it does not, keep the last answer for a short grace (a restarting kubelet does not
flap the annotation), and rate-limit the log line that says why allocations are unknown.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Final

from agent.records import DeviceAllocations, GpuReading

# The NVIDIA device plugin names the n-th time-slicing replica of device D `D::n`.
_REPLICA_SEPARATOR: Final = "::"
DEFAULT_POD_RESOURCES_SOCKET: Final = "/var/lib/kubelet/pod-resources/kubelet.sock"
# Why a query failed (`agent.podresources` explains each); the agent's metric label values.
QUERY_FAILURE_REASONS: Final = (
    "socket-missing",
    "not-a-socket",
    "permission-denied",
    "refused",
    "timeout",
    "unimplemented",
    "bad-response",
    "error",
)
# The kubelet answered, but none of its devices is a GPU of this node.
NO_GPU_DEVICES: Final = "no-gpu-devices"
UNKNOWN_REASONS: Final = (*QUERY_FAILURE_REASONS, NO_GPU_DEVICES)


class AllocationQueryError(Exception):
    """A failed query of the kubelet; `reason` is one of `QUERY_FAILURE_REASONS`."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def device_base_id(device_id: str) -> str:
    """`GPU-1234::3` -> `GPU-1234`: the device a time-slicing replica shares."""
    head, separator, tail = device_id.rpartition(_REPLICA_SEPARATOR)
    return head if separator and tail.isdigit() else device_id


def gpu_index_by_device(gpus: Iterable[GpuReading]) -> dict[str, int]:
    """Device UUID (the GPU's and each of its MIG devices') -> the GPU's NVML index."""
    owner: dict[str, int] = {}
    for gpu in gpus:
        owner[gpu.uuid] = gpu.index
        for mig_uuid in gpu.mig_device_uuids:
            owner[mig_uuid] = gpu.index
    return owner


def _by_gpu(device_ids: Iterable[str], owner: Mapping[str, int]) -> dict[int, set[str]]:
    found: dict[int, set[str]] = {}
    for device_id in device_ids:
        index = owner.get(device_base_id(device_id))
        if index is not None:
            found.setdefault(index, set()).add(device_id)
    return found


def allocated_by_gpu(
    gpus: Sequence[GpuReading], allocations: DeviceAllocations
) -> dict[int, bool | None] | None:
    """GPU index -> allocated (None: unknown for that GPU); None when no device is a GPU here.

    - shares listed and all assigned: True; some unassigned: False;
    - no share listed but some assigned (the kubelet stopped offering a GPU in use, e.g. marked
      unhealthy): True, the pod still holds it;
    - neither: None. The kubelet does not hand this GPU out, so "free" would be a lie.
    When no device ID maps to any GPU of the node (no NVIDIA device plugin, GPUs given out by
    DRA, or a plugin naming devices by index), allocations are unknown as a whole.
    """
    owner = gpu_index_by_device(gpus)
    shares = _by_gpu(allocations.allocatable_ids, owner)
    assigned = _by_gpu(allocations.assigned_ids, owner)
    if not shares and not assigned:
        return None
    result: dict[int, bool | None] = {}
    for gpu in gpus:
        mine = shares.get(gpu.index)
        taken = assigned.get(gpu.index, set())
        if mine:
            result[gpu.index] = mine <= taken
        else:
            result[gpu.index] = True if taken else None
    return result


# ---------------------------------------------------------------------------- the schedule


@dataclass(frozen=True, slots=True)
class AllocationPolicy:
    """When to ask the kubelet, and how long an answer stays usable."""

    # After a failure the next call waits this long, doubling up to the maximum: a missing or
    # refusing socket costs one cheap attempt per back-off, a hung one one timeout.
    retry_base_s: float = 10.0
    retry_max_s: float = 300.0
    # A failed call keeps the last answer this long (one heartbeat): pods do not start or stop
    # while the kubelet restarts, and dropping the key for seconds would cost two writes.
    keep_last_s: float = 60.0
    # While failing for the same reason, one log line at most this often.
    log_every_s: float = 600.0

    def __post_init__(self) -> None:
        for name in ("retry_base_s", "retry_max_s", "keep_last_s", "log_every_s"):
            value = getattr(self, name)
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")


@dataclass(frozen=True, slots=True)
class AllocationTracker:
    """What the agent remembers about the kubelet between ticks. Replace, never mutate."""

    last_good: DeviceAllocations | None = None
    last_good_s: float | None = None
    next_attempt_s: float = -math.inf
    consecutive_failures: int = 0
    # The reason of the last failed call, and of the last log line about it.
    failing_reason: str | None = None
    logged_reason: str | None = None
    logged_s: float | None = None

    def due(self, now_s: float) -> bool:
        return now_s >= self.next_attempt_s

    def current(self, now_s: float, policy: AllocationPolicy) -> DeviceAllocations | None:
        """The answer to publish now: the last good one while it is within the grace."""
        if self.last_good is None or self.last_good_s is None:
            return None
        if self.failing_reason is not None and now_s - self.last_good_s > policy.keep_last_s:
            return None
        return self.last_good

    def succeeded(self, allocations: DeviceAllocations, *, now_s: float) -> AllocationTracker:
        return replace(
            self,
            last_good=allocations,
            last_good_s=now_s,
            next_attempt_s=now_s,
            consecutive_failures=0,
            failing_reason=None,
        )

    def failed(self, reason: str, *, now_s: float, policy: AllocationPolicy) -> AllocationTracker:
        failures = self.consecutive_failures + 1
        delay_s = min(policy.retry_max_s, policy.retry_base_s * 2.0 ** min(failures - 1, 30))
        return replace(
            self,
            next_attempt_s=now_s + delay_s,
            consecutive_failures=failures,
            failing_reason=reason,
        )

    def log_due(self, reason: str, *, now_s: float, policy: AllocationPolicy) -> bool:
        """A line is due for a new reason, or for an old one once per `log_every_s`."""
        if reason != self.logged_reason or self.logged_s is None:
            return True
        return now_s - self.logged_s >= policy.log_every_s

    def logged(self, reason: str | None, *, now_s: float) -> AllocationTracker:
        return replace(self, logged_reason=reason, logged_s=now_s)
