"""Plain records of what one sampling tick read from the GPUs, before any aggregation.

Sources (real NVML, simulated traces) produce a `NodeReading`; `agent.aggregate` turns it into the
contract's `NodeGpuState`. Units are in the field names. `None` means "this GPU could not tell us",
which is different from zero and is never published as zero. `SourceUnavailable`, the one error a
source raises when it cannot start, lives here too, beside what sources produce, so that a source
(`agent.nvml`) need not import `agent.sources`, which opens the sources.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Final


@dataclass(frozen=True, slots=True)
class GpuReading:
    """One GPU at one tick. GPUs are keyed by UUID: NVML indexes can change across reboots."""

    uuid: str
    index: int
    name: str | None
    # Mean SM-busy fraction (0..1) over the sampling window, not an instantaneous reading.
    utilization: float | None
    memory_total_mib: int | None
    # For a MIG-enabled GPU: the free memory of the capacity that can still be handed out as GPU
    # instances, not the raw free memory (see docs/fragmentation.md).
    memory_free_mib: int | None
    temperature_c: int | None
    mig_enabled: bool | None = None
    # The largest single allocation one pod could get on this GPU, in MiB. Without MIG it is the
    # free memory; with MIG, free memory is split between MIG devices and unpartitioned slices, so
    # it is the most free memory of one existing MIG device or of one GPU instance that can still
    # be created, whichever is larger. `None` on a non-MIG GPU means "same as memory_free_mib".
    memory_largest_allocation_mib: int | None = None
    # Per-field faults, e.g. "temperature not supported": reported as `health: degraded`.
    problems: tuple[str, ...] = ()
    # UUIDs of this GPU's MIG devices (`MIG-...`): the kubelet hands those out instead of the GPU.
    mig_device_uuids: tuple[str, ...] = ()
    # The processes on this GPU (NVML), read only when per-process attribution is on and the GPU
    # is shared by several pods; None: not read, or NVML could not list them.
    processes: GpuProcesses | None = None


@dataclass(frozen=True, slots=True)
class GpuProcesses:
    """What NVML said about the processes on one GPU during one sampling window.

    `memory_used_mib`: (pid, GPU memory the process holds in MiB, or None where NVML gives no
    figure), from the compute and graphics process lists; None when the lists were unreadable.
    `sm_busy`: (pid, the sum of the process's SM-busy percent over its utilization samples in the
    window); a process without samples had no SM activity; None when the samples were unreadable
    (not supported, or a failing call). An empty tuple is an answer: no process was busy.
    """

    memory_used_mib: tuple[tuple[int, int | None], ...] | None
    sm_busy: tuple[tuple[int, float], ...] | None


@dataclass(frozen=True, slots=True)
class PodDevices:
    """The device IDs assigned to the containers of one pod (`namespace/name`)."""

    pod: str
    device_ids: frozenset[str]


@dataclass(frozen=True, slots=True)
class DeviceAllocations:
    """What the kubelet's pod-resources API said about devices, every resource name together.

    `allocatable_ids` are the device IDs the kubelet can hand out (healthy ones, assigned or not);
    `assigned_ids` those assigned to a container. IDs are GPU UUIDs, MIG device UUIDs, or either
    with a `::n` replica suffix under time-slicing, mixed with other plugins' IDs.
    """

    allocatable_ids: frozenset[str]
    assigned_ids: frozenset[str]
    # The same assignments by pod, for who holds which GPU (`pod-gpu-usage`); pods holding no
    # device are left out.
    pods: tuple[PodDevices, ...] = ()


@dataclass(frozen=True, slots=True)
class NodeReading:
    """Everything one tick read on this node."""

    sampled_at: datetime
    gpus: tuple[GpuReading, ...]
    # GPUs NVML reports (including lost ones), so `gpu-count` stays honest when a GPU is lost.
    device_count: int
    # Device faults, e.g. "gpu 3: lost"; such GPUs are absent from `gpus`.
    lost: tuple[str, ...] = field(default=())
    # Set when NVML itself failed this tick: no GPU could be read at all.
    fatal: str | None = None
    # The NVML error kinds met this tick ("NotSupported", "GpuIsLost", "FunctionNotFound", ...),
    # one entry per failed call, for the agent's `nvml errors by kind` metric.
    error_kinds: tuple[str, ...] = ()
    # The kubelet's device allocations read this tick; None when not read or not known.
    allocations: DeviceAllocations | None = None
    # Whose each GPU process is (pid -> owner), for the GPUs shared by several pods; None when
    # per-process attribution is off (the agent cannot see the host's processes).
    process_owners: Mapping[int, ProcessOwner] | None = None


@dataclass(frozen=True, slots=True)
class ProcessOwner:
    """The pod a GPU process belongs to (`namespace/name`), or why it has none.

    `outcome` is the metric label: `pod` (found), `no-pod` (a process outside any pod's cgroup),
    `vanished` (the process exited before its cgroup was read), `unreadable` (the cgroup file
    could not be read), `unnamed` (a pod UID the API server did not name).
    """

    pod: str | None
    outcome: str


class SourceUnavailable(RuntimeError):  # noqa: N818  (the name is part of the interface)
    """The source cannot start at all (NVML library missing, driver not loaded, ...).

    The message is one line an operator can act on; the agent exits non-zero on it, so the kubelet
    backs off instead of the pod spinning.
    """


# About a minute at the default 5 s sample interval.
MIG_UUID_REFRESH_READS: Final = 12


@dataclass(slots=True)
class GpuMemo:
    """What the NVML source remembers about one GPU between ticks, keyed by UUID (kept here,
    beside the readings, because it holds no NVML handle: only numbers and UUIDs)."""

    last_sample_us: int = 0
    samples_unsupported: bool = False
    # Per-process utilization samples: the newest timestamp read, and whether the GPU has none.
    last_process_sample_us: int = 0
    process_samples_unsupported: bool = False
    # GPU instance profiles (id, memory MiB) of a MIG-enabled GPU: fixed while MIG stays on.
    mig_profiles: tuple[tuple[int, int], ...] | None = None
    # MIG slot -> (the MIG device's total memory in MiB, its UUID). A MIG device's UUID is fixed
    # for its life, so it is read once, not every tick; an empty slot or a different size means a
    # new device. Re-read every `MIG_UUID_REFRESH_READS` reads, for a device destroyed and
    # re-created with the same profile between two ticks.
    mig_uuids: dict[int, tuple[int, str]] = field(default_factory=dict)
    mig_uuid_reads: int = 0
