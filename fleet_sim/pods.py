"""Which pods hold each simulated GPU, and what their processes use: the input of `pod-gpu-usage`.

The write-budget simulation (`fleet_sim.fleet`) publishes what each pod uses of each GPU, as the
agent does, so the pods' figures take part in the write rules. This module says, for one node at
one tick, which pods hold which GPU (the kubelet's pod-resources answer, by pod) and, on GPUs
shared by time-slicing, what NVML's per-process accounting would say and whose each process is.
The agent's own attribution (`agent.attribution`) then turns that into the published figures.

Model, per node profile (the loads themselves are `fleet_sim.traces`'):

- ``training``: one pod holds every GPU (whole GPUs): its figures are the GPUs' own.
- ``diurnal``: one serving pod per GPU (whole GPUs).
- ``batch``: one pod per job run on each GPU it uses; a new run is a new pod.
- ``inference``: each GPU is time-sliced into 4 replicas and shared by 2-4 serving pods of
  different models, all replicas assigned. Each pod's part of the GPU's SM time is a weight that
  wanders (log-normal, autocorrelated over about a minute) around a per-pod level; its memory is a
  fixed part of the GPU's used memory (its model and cache). One process per pod.
- ``idle``: no pod.

Deterministic in (seed, node): the same fleet has the same pods in every run.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Final

import numpy as np

from agent.records import DeviceAllocations, GpuProcesses, PodDevices, ProcessOwner
from fleet_sim.traces import NodeSpec, Profile

REPLICAS_PER_GPU: Final = 4
# Autocorrelation of a pod's SM weight per 5 s tick: about a minute to forget.
_WEIGHT_RHO: Final = 0.92
_WEIGHT_SIGMA: Final = 0.35
_PID_BASE: Final = 10_000


class NodePods:
    """The pods of one simulated node, tick by tick (call `at` with increasing ticks)."""

    def __init__(self, spec: NodeSpec, *, node: int, uuids: Sequence[str], ticks: int, seed: int):
        self.spec = spec
        self.node = node
        self.uuids = list(uuids[: spec.gpu_count])
        gpus = spec.gpu_count
        rng = np.random.default_rng([seed, node, 0x90D5])
        self._run_start: list[int | None] = [None] * gpus
        self._shared = spec.profile is Profile.INFERENCE
        if self._shared:
            self._pods_per_gpu = rng.integers(2, REPLICAS_PER_GPU + 1, size=gpus).tolist()
            levels = rng.uniform(0.3, 1.0, size=(gpus, REPLICAS_PER_GPU))
            noise = rng.normal(
                0.0,
                _WEIGHT_SIGMA * np.sqrt(1 - _WEIGHT_RHO**2),
                size=(ticks, gpus, REPLICAS_PER_GPU),
            )
            walk = np.empty_like(noise)
            walk[0] = rng.normal(0.0, _WEIGHT_SIGMA, size=(gpus, REPLICAS_PER_GPU))
            for t in range(1, ticks):
                walk[t] = _WEIGHT_RHO * walk[t - 1] + noise[t]
            self._weights = levels[None, :, :] * np.exp(walk)
            memory = rng.uniform(0.5, 1.5, size=(gpus, REPLICAS_PER_GPU)).tolist()
            # The pods' parts of the GPU's used memory (the driver's own reserve is in "used").
            self._memory_parts = [
                [0.97 * m / sum(row[:count]) for m in row[:count]]
                for row, count in zip(memory, self._pods_per_gpu, strict=True)
            ]
            self._allocatable = frozenset(
                f"{uuid}::{r}" for uuid in self.uuids for r in range(REPLICAS_PER_GPU)
            )
        else:
            self._allocatable = frozenset(self.uuids)

    def _pod(self, g: int, i: int) -> str:
        return f"serve/model-{self.node}-{g}-{i}"

    def _pid(self, g: int, i: int) -> int:
        return _PID_BASE + g * REPLICAS_PER_GPU + i

    def at(
        self,
        tick: int,
        *,
        allocated: Sequence[bool],
        utilization: Sequence[float],
        memory_used_mib: Sequence[int],
    ) -> tuple[DeviceAllocations, Mapping[int, GpuProcesses], Mapping[int, ProcessOwner]]:
        """The kubelet's allocations by pod, the shared GPUs' processes, and their owners."""
        del utilization  # the processes' SM weights split whatever the GPU measured
        profile = self.spec.profile
        holders: dict[str, set[str]] = {}
        processes: dict[int, GpuProcesses] = {}
        owners: dict[int, ProcessOwner] = {}
        for g, uuid in enumerate(self.uuids):
            if not allocated[g]:
                self._run_start[g] = None
                continue
            if self._run_start[g] is None:
                self._run_start[g] = tick
            if profile is Profile.TRAINING:
                holders.setdefault(f"train/job-{self.node}", set()).add(uuid)
            elif profile is Profile.BATCH:
                holders.setdefault(f"batch/job-{self.node}-{g}-{self._run_start[g]}", set()).add(
                    uuid
                )
            elif self._shared:
                count = self._pods_per_gpu[g]
                memory: list[tuple[int, int | None]] = []
                busy: list[tuple[int, float]] = []
                # Every replica is assigned: the pods beyond the first hold the spare ones.
                for r in range(REPLICAS_PER_GPU):
                    holders.setdefault(self._pod(g, min(r, count - 1)), set()).add(f"{uuid}::{r}")
                for i in range(count):
                    pid = self._pid(g, i)
                    memory.append((pid, int(memory_used_mib[g] * self._memory_parts[g][i])))
                    busy.append((pid, 100.0 * float(self._weights[tick, g, i])))
                    owners[pid] = ProcessOwner(self._pod(g, i), "pod")
                processes[g] = GpuProcesses(tuple(memory), tuple(busy))
            else:
                holders.setdefault(f"serve/web-{self.node}-{g}", set()).add(uuid)
        pods = tuple(PodDevices(pod, frozenset(ids)) for pod, ids in sorted(holders.items()))
        allocations = DeviceAllocations(
            allocatable_ids=self._allocatable,
            assigned_ids=frozenset(i for p in pods for i in p.device_ids),
            pods=pods,
        )
        return allocations, processes, owners
