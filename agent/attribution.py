"""Who uses each GPU, and how much: the figures behind `pod-gpu-usage`. Pure: no NVML, no I/O.

The scorer learns the load a new pod will add from what the running pods of its workload use, so
the agent says, per pod and per GPU the pod holds, the pod's share of the GPU's window-averaged
utilization and the GPU memory it holds. Which pod holds which GPU comes from the kubelet's
pod-resources API (device IDs mapped to GPUs by UUID, as for `per-gpu-allocated`). Then:

* **A GPU one pod holds alone** (whole GPU, or the only pod on a time-sliced GPU): the GPU's own
  figures are the pod's, utilization as published for the GPU and memory used = total - free.
  Nothing else could be using it through the kubelet, and this needs no host access.
* **A GPU several pods hold** (time-slicing or MPS replicas, `<UUID>::<n>`), and any MIG-enabled
  GPU (its raw free memory is not one pod's, and NVML reports no utilization for it): the figures
  come from NVML's per-process accounting, each process mapped to its pod by its cgroup
  (`agent.cgroups`). A pod's utilization is the GPU's window utilization times the pod's part of
  all processes' SM-busy samples in the window, so the pods' shares add up to the GPU's figure
  and a process of no pod keeps its own part; its memory is the sum of its processes' memory.
  Where the agent cannot see the host's processes, or NVML could not say, the figures are unknown
  (`-`), never the whole GPU's load, which would teach a reader several times the real share.

Every (pod, GPU) figure is counted by `Outcome`, and every process on a shared GPU by its owner's
outcome, so an operator can see how much of what is published is measured.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from agent.allocations import device_base_id, gpu_index_by_device
from agent.records import DeviceAllocations, GpuReading, NodeReading, ProcessOwner
from gpu_contract.podusage import GpuShare, PodUsage


class Outcome(StrEnum):
    """How one pod's figures on one GPU were found. The values are the metric label values."""

    # The pod holds the GPU alone: the GPU's own figures.
    WHOLE_GPU = "whole-gpu"
    # Shared GPU: from NVML's per-process figures (the pod may have no process there: 0).
    PROCESSES = "processes"
    # Shared GPU, per-process attribution off (no view of the host's processes): unknown.
    NO_HOST_PROCESSES = "no-host-processes"
    # Shared GPU, NVML could not list the processes or their samples this tick: unknown (in part).
    NO_PROCESS_DATA = "no-process-data"


# A process on a shared GPU whose pod holds no share of that GPU (it was given the device some
# other way, e.g. NVIDIA_VISIBLE_DEVICES=all): like a process of no pod, it keeps its own part.
OTHER_POD = "other-pod"
OWNER_OUTCOMES = ("pod", OTHER_POD, "no-pod", "vanished", "unreadable", "unnamed")


@dataclass(frozen=True, slots=True)
class Attribution:
    pods: tuple[PodUsage, ...]
    # Outcome value -> (pod, GPU) figures found that way this tick.
    outcomes: Counter[str] = field(default_factory=Counter)
    # Owner outcome (`OWNER_OUTCOMES`) -> processes on shared GPUs this tick.
    owners: Counter[str] = field(default_factory=Counter)


def holders(gpus: Sequence[GpuReading], allocations: DeviceAllocations) -> dict[int, set[str]]:
    """GPU index -> the pods holding a share of it (device IDs of other resources ignored)."""
    index_of = gpu_index_by_device(gpus)
    held: dict[int, set[str]] = {}
    for entry in allocations.pods:
        for device_id in entry.device_ids:
            index = index_of.get(device_base_id(device_id))
            if index is not None:
                held.setdefault(index, set()).add(entry.pod)
    return held


def shared_gpus(gpus: Sequence[GpuReading], allocations: DeviceAllocations | None) -> set[int]:
    """The GPUs whose figures need per-process data: held by several pods, or MIG-enabled."""
    if allocations is None:
        return set()
    by_index = {g.index: g for g in gpus}
    return {
        index
        for index, pods in holders(gpus, allocations).items()
        if len(pods) > 1 or by_index[index].mig_enabled
    }


def _whole_gpu(gpu: GpuReading) -> GpuShare:
    total, free = gpu.memory_total_mib, gpu.memory_free_mib
    used = None if total is None or free is None else max(0, int(total) - int(free))
    return GpuShare(gpu.index, gpu.utilization, used)


def _owner_of(pid: int, owners: Mapping[int, ProcessOwner]) -> ProcessOwner:
    # A pid the edge did not resolve (it appeared between the two NVML lists): unknown owner.
    return owners.get(pid, ProcessOwner(None, "vanished"))


def _from_processes(
    gpu: GpuReading,
    pods: set[str],
    owners: Mapping[int, ProcessOwner],
    outcomes: Counter[str],
    owner_counts: Counter[str],
) -> dict[str, GpuShare]:
    processes = gpu.processes
    memory = None if processes is None else processes.memory_used_mib
    busy = None if processes is None else processes.sm_busy
    pod_of: dict[int, str | None] = {}
    for pid in sorted({p for p, _ in memory or ()} | {p for p, _ in busy or ()}):
        owner = _owner_of(pid, owners)
        if owner.pod is not None and owner.pod not in pods:
            owner_counts[OTHER_POD] += 1
            pod_of[pid] = None
        else:
            owner_counts[owner.outcome] += 1
            pod_of[pid] = owner.pod
    total_busy = sum(max(0.0, b) for _, b in busy or ())
    shares: dict[str, GpuShare] = {}
    for pod in sorted(pods):
        utilization: float | None = None
        if busy is not None and gpu.utilization is not None:
            mine = sum(max(0.0, b) for pid, b in busy if pod_of.get(pid) == pod)
            # No process busy in the window: the pods used none of the GPU's SM time.
            utilization = gpu.utilization * mine / total_busy if total_busy > 0 else 0.0
        used: int | None = None
        if memory is not None:
            figures = [mib for pid, mib in memory if pod_of.get(pid) == pod]
            # One process without a figure makes the sum an understatement: unknown instead.
            if all(mib is not None for mib in figures):
                used = sum(int(mib) for mib in figures if mib is not None)
        known = utilization is not None and used is not None
        outcomes[(Outcome.PROCESSES if known else Outcome.NO_PROCESS_DATA).value] += 1
        shares[pod] = GpuShare(gpu.index, utilization, used)
    return shares


def pod_usage(
    gpus: Sequence[GpuReading],
    allocations: DeviceAllocations | None,
    owners: Mapping[int, ProcessOwner] | None,
) -> Attribution:
    """Each pod's figures on each GPU it holds; `owners` None: per-process attribution is off."""
    if allocations is None:
        return Attribution(())
    by_index = {g.index: g for g in gpus}
    outcomes: Counter[str] = Counter()
    owner_counts: Counter[str] = Counter()
    per_pod: dict[str, list[GpuShare]] = {}
    for index, pods in sorted(holders(gpus, allocations).items()):
        gpu = by_index[index]
        if len(pods) == 1 and not gpu.mig_enabled:
            (pod,) = pods
            per_pod.setdefault(pod, []).append(_whole_gpu(gpu))
            outcomes[Outcome.WHOLE_GPU.value] += 1
            continue
        if owners is None:
            for pod in pods:
                per_pod.setdefault(pod, []).append(GpuShare(index))
            outcomes[Outcome.NO_HOST_PROCESSES.value] += len(pods)
            continue
        for pod, share in _from_processes(gpu, pods, owners, outcomes, owner_counts).items():
            per_pod.setdefault(pod, []).append(share)
    usage = tuple(PodUsage(pod, tuple(sorted(shares))) for pod, shares in sorted(per_pod.items()))
    return Attribution(usage, outcomes, owner_counts)


def attribute(reading: NodeReading) -> Attribution:
    """`pod_usage` of one tick's reading (no pods without the kubelet's allocations)."""
    return pod_usage(reading.gpus, reading.allocations, reading.process_owners)
