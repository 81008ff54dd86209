"""A seeded, realistic GPU trace, so every feature can be shown and tested without a GPU.

The trace is a pure function of (seed, seconds since `start`): the same seed and times give the
same readings, in any order and in any process, which is what makes demos repeatable and tests
exact. Nothing here reads a clock.

Shape of the trace, per GPU:
- Time is cut into 20 s slots. In each slot a job starts with a per-GPU probability (some GPUs
  are busier than others) and runs for 40 s to about 8 minutes; jobs may overlap. Between jobs the
  GPU idles near 0 %.
- A job has a utilization level (35-95 %) with bursts that change every 5 s, and holds a
  job-sized chunk of memory (8-58 % of the GPU, whole GiB) from its start to its end.
- Temperature follows the slot's load with a first-order lag (time constant 60 s) from about
  32 °C idle towards about 77 °C at full load; it is computed in closed form from steady state
  five time constants (15 slots) before the current slot, so it does not depend on which times
  were read before.
- Optionally one GPU (chosen by the seed) is lost `lose_gpu_after_s` after `start`.
- Optionally (`pods=True`) each job is a pod, so `pod-gpu-usage` can be tried without a cluster:
  every GPU is time-sliced into 4 replicas, a job's pod holds replica `start slot mod 4` of its
  GPU, and each job runs one process whose SM samples are its share of the GPU's utilization and
  whose memory is the job's. A GPU with one job is that pod's alone (whole-GPU figures); a GPU
  with overlapping jobs is shared, and the reading carries its processes and their owners as the
  agent's per-process attribution would find them. The kubelet's answer, where one is read,
  replaces these allocations.

Pushing load (for the placement demo): `set_load(extra_utilization, extra_memory_mib, now=...)`
adds utilization to every GPU and places the memory on the GPUs with the most free memory. It
is the one piece of state: readings then depend on (seed, time, the load pushed so far).
"""

from __future__ import annotations

import itertools
import math
import re
import uuid
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Final

from agent.records import (
    DeviceAllocations,
    GpuProcesses,
    GpuReading,
    NodeReading,
    PodDevices,
    ProcessOwner,
)

SLOT_S: Final = 20.0
BURST_S: Final = 5.0
MAX_JOB_SLOTS: Final = 25
THERMAL_TAU_S: Final = 60.0
# Integrating over five time constants leaves under 1 % of the older history: well below 1 °C.
THERMAL_HISTORY_S: Final = 5 * THERMAL_TAU_S
_THERMAL_HISTORY_SLOTS: Final = math.ceil(THERMAL_HISTORY_S / SLOT_S)
IDLE_TEMPERATURE_C: Final = 32.0
FULL_LOAD_RISE_C: Final = 45.0
RESERVED_FRACTION: Final = 0.006
_MIB_PER_GIB: Final = 1024
# Products whose NVML name carries no memory size.
_KNOWN_MEMORY_MIB: Final = {"H200": 143771, "H100": 81559, "B200": 183359, "T4": 15360}
_DEFAULT_MEMORY_MIB: Final = 16384
_MASK64: Final = (1 << 64) - 1
# Entries per trace cache. A read needs about 41 slots per GPU (26 for the jobs that may still
# run, 15 for the thermal history): 64 GPUs need 2624, so this holds a working set with room to
# spare, while keeping all four caches together to a few MB (at 100 000 entries each, a
# simulated 8-GPU node grew by about 20 MB a day for three days).
_CACHE_LIMIT: Final = 8192
# Time-slicing replicas per GPU when the jobs are published as pods.
SIMULATED_REPLICAS: Final = 4

# Salts for the hash streams, so that each random quantity is independent of the others.
_BUSY, _START, _LENGTH, _LEVEL, _MEMORY, _BURST, _IDLE, _UUID_HI, _UUID_LO = range(9)


def _mix(*parts: int) -> int:
    """A 64-bit hash of integers (splitmix64 steps): cheap, stateless, the same in every process."""
    h = 0x9E3779B97F4A7C15
    for part in parts:
        h = (h ^ (part & _MASK64)) & _MASK64
        h = ((h ^ (h >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
        h = ((h ^ (h >> 27)) * 0x94D049BB133111EB) & _MASK64
        h ^= h >> 31
    return h


def _uniform(*parts: int) -> float:
    """A number in [0, 1) fixed by `parts`."""
    return _mix(*parts) / 2.0**64


def memory_total_mib_for(model: str) -> int:
    """Total memory of a product, from the `80GB`-style size in its name or a small table."""
    sized = re.search(r"(\d+)\s*GB", model, re.IGNORECASE)
    if sized:
        return int(sized.group(1)) * _MIB_PER_GIB
    for product, mib in _KNOWN_MEMORY_MIB.items():
        if product in model.upper():
            return mib
    return _DEFAULT_MEMORY_MIB


@dataclass(frozen=True, slots=True)
class _Job:
    start_slot: int
    end_slot: int  # exclusive
    level: float
    memory_mib: int


@dataclass(frozen=True, slots=True)
class _LoadStep:
    since_s: float  # seconds after start; -inf for "from the beginning"
    extra_utilization: float
    extra_memory_mib: int


class SimulatedSource:
    """N GPUs of one model with a deterministic trace (see the module docstring)."""

    def __init__(
        self,
        *,
        gpus: int = 8,
        model: str = "NVIDIA A100-SXM4-80GB",
        seed: int = 0,
        lose_gpu_after_s: float | None = None,
        start: datetime | None = None,
        pods: bool = False,
    ) -> None:
        if gpus < 0:
            raise ValueError(f"simulated gpus must be >= 0, got {gpus}")
        if not model.strip():
            raise ValueError("simulated model must not be empty")
        if lose_gpu_after_s is not None and not (
            math.isfinite(lose_gpu_after_s) and lose_gpu_after_s >= 0
        ):
            raise ValueError(f"lose_gpu_after_s must be >= 0, got {lose_gpu_after_s}")
        self.gpus = gpus
        self.model = model.strip()
        self.seed = seed
        self.lose_gpu_after_s = lose_gpu_after_s
        self.pods = pods
        # None: anchored on the first read, so a fresh agent starts its trace when it starts.
        self.start = start
        self.memory_total_mib = memory_total_mib_for(self.model)
        self._reserved_mib = round(self.memory_total_mib * RESERVED_FRACTION)
        self.lost_index = seed % gpus if gpus else None
        self._uuids = tuple(self._uuid(i) for i in range(gpus))
        self._start_prob = tuple(0.04 + 0.07 * _uniform(seed, i, _BUSY) for i in range(gpus))
        self._loads: list[_LoadStep] = [_LoadStep(-math.inf, 0.0, 0)]
        # Pure-function caches: a slot's jobs never change, so caching them changes no result.
        self._job_cache: dict[tuple[int, int], _Job | None] = {}
        self._load_cache: dict[tuple[int, int], float] = {}
        self._running_cache: dict[tuple[int, int], tuple[_Job, ...]] = {}
        self._temperature_cache: dict[tuple[int, int, int], float] = {}
        # Bumped by set_load: temperatures cached under an older load history are not reused.
        self._load_version = 0
        self._closed = False

    def _uuid(self, index: int) -> str:
        value = (_mix(self.seed, index, _UUID_HI) << 64) | _mix(self.seed, index, _UUID_LO)
        return f"GPU-{uuid.UUID(int=value)}"

    # -- the trace ------------------------------------------------------------------------------

    def _job_starting(self, gpu: int, slot: int) -> _Job | None:
        key = (gpu, slot)
        if key in self._job_cache:
            return self._job_cache[key]
        job: _Job | None = None
        if _uniform(self.seed, gpu, slot, _START) < self._start_prob[gpu]:
            length = 2 + int(_uniform(self.seed, gpu, slot, _LENGTH) * (MAX_JOB_SLOTS - 1))
            fraction = 0.08 + 0.5 * _uniform(self.seed, gpu, slot, _MEMORY)
            memory_gib = max(1, round(self.memory_total_mib * fraction / _MIB_PER_GIB))
            job = _Job(
                start_slot=slot,
                end_slot=slot + length,
                level=0.35 + 0.6 * _uniform(self.seed, gpu, slot, _LEVEL),
                memory_mib=memory_gib * _MIB_PER_GIB,
            )
        if len(self._job_cache) >= _CACHE_LIMIT:
            self._job_cache.clear()
        self._job_cache[key] = job
        return job

    def _jobs_at(self, gpu: int, slot: int) -> tuple[_Job, ...]:
        """The jobs running on `gpu` during `slot` (those started up to MAX_JOB_SLOTS before)."""
        key = (gpu, slot)
        jobs = self._running_cache.get(key)
        if jobs is None:
            starts = (self._job_starting(gpu, s) for s in range(slot - MAX_JOB_SLOTS, slot + 1))
            jobs = tuple(j for j in starts if j is not None and j.end_slot > slot)
            if len(self._running_cache) >= _CACHE_LIMIT:
                self._running_cache.clear()
            self._running_cache[key] = jobs
        return jobs

    def _slot_load(self, gpu: int, slot: int) -> float:
        """Mean utilization of a slot, before pushed load: what heats the GPU."""
        key = (gpu, slot)
        load = self._load_cache.get(key)
        if load is None:
            load = min(1.0, sum(j.level for j in self._jobs_at(gpu, slot)))
            if len(self._load_cache) >= _CACHE_LIMIT:
                self._load_cache.clear()
            self._load_cache[key] = load
        return load

    def _utilization(self, gpu: int, elapsed_s: float, jobs: tuple[_Job, ...]) -> float:
        step = math.floor(elapsed_s / BURST_S)
        if not jobs:
            return 0.03 * _uniform(self.seed, gpu, step, _IDLE)
        total = 0.0
        for job in jobs:
            burst = 0.75 + 0.25 * _uniform(self.seed, gpu, job.start_slot, step, _BURST)
            total += job.level * burst
        return min(1.0, total)

    def _extra_at(self, elapsed_s: float) -> _LoadStep:
        current = self._loads[0]
        for step in self._loads:
            if step.since_s <= elapsed_s:
                current = step
        return current

    def _steady_temperature(self, gpu: int, at_s: float) -> float:
        load = self._slot_load(gpu, math.floor(at_s / SLOT_S))
        load = min(1.0, load + self._extra_at(at_s).extra_utilization)
        return IDLE_TEMPERATURE_C + FULL_LOAD_RISE_C * load

    def _integrate(self, gpu: int, from_s: float, temperature: float, to_s: float) -> float:
        """First-order lag from `temperature` at `from_s` to `to_s`, load piecewise constant."""
        breaks = {from_s, to_s}
        first_slot = math.floor(from_s / SLOT_S) + 1
        breaks.update(s * SLOT_S for s in range(first_slot, math.floor(to_s / SLOT_S) + 1))
        breaks.update(s.since_s for s in self._loads if from_s < s.since_s < to_s)
        times = sorted(b for b in breaks if from_s <= b <= to_s)
        for begin, end in itertools.pairwise(times):
            target = self._steady_temperature(gpu, begin)
            temperature = target + (temperature - target) * math.exp(-(end - begin) / THERMAL_TAU_S)
        return temperature

    def _slot_start_temperature(self, gpu: int, slot: int) -> float:
        """Temperature at the start of `slot`: the lag run from steady state five time constants
        (whole slots) earlier. Cached, because it is fixed for a slot and a pushed-load history."""
        key = (gpu, slot, self._load_version)
        cached = self._temperature_cache.get(key)
        if cached is None:
            begin_s = (slot - _THERMAL_HISTORY_SLOTS) * SLOT_S
            start = self._steady_temperature(gpu, begin_s)
            cached = self._integrate(gpu, begin_s, start, slot * SLOT_S)
            if len(self._temperature_cache) >= _CACHE_LIMIT:
                self._temperature_cache.clear()
            self._temperature_cache[key] = cached
        return cached

    def _temperature(self, gpu: int, elapsed_s: float) -> float:
        slot = math.floor(elapsed_s / SLOT_S)
        at_slot_start = self._slot_start_temperature(gpu, slot)
        return self._integrate(gpu, slot * SLOT_S, at_slot_start, elapsed_s)

    # -- the source interface --------------------------------------------------------------------

    def set_load(
        self, extra_utilization: float, extra_memory_mib: int, *, now: datetime | None = None
    ) -> None:
        """Push load onto this node, as pods landing on it would (replaces the previous push).

        `extra_utilization` (0..1) is added to every GPU's utilization (capped at 1);
        `extra_memory_mib` is taken from the GPUs with the most free memory, filling one before
        the next. From `now` on (temperature then warms with the usual lag), or from the very
        beginning when `now` is None.
        """
        if not math.isfinite(extra_utilization) or extra_utilization < 0:
            raise ValueError(f"extra_utilization must be >= 0, got {extra_utilization}")
        if extra_memory_mib < 0:
            raise ValueError(f"extra_memory_mib must be >= 0, got {extra_memory_mib}")
        step = _LoadStep(
            since_s=-math.inf if now is None else self._elapsed_s(now),
            extra_utilization=min(1.0, extra_utilization),
            extra_memory_mib=int(extra_memory_mib),
        )
        if step.since_s == -math.inf:
            self._loads = [step]
        else:
            self._loads = [s for s in self._loads if s.since_s < step.since_s]
            self._loads.append(step)
        self._load_version += 1
        self._temperature_cache.clear()

    def _elapsed_s(self, now: datetime) -> float:
        if self.start is None:
            self.start = now
        return (now - self.start).total_seconds()

    def read(self, now: datetime) -> NodeReading:
        elapsed_s = self._elapsed_s(now)
        slot = math.floor(elapsed_s / SLOT_S)
        extra = self._extra_at(elapsed_s)
        lost_now = (
            self.lose_gpu_after_s is not None
            and self.lost_index is not None
            and elapsed_s >= self.lose_gpu_after_s
        )
        usable = self.memory_total_mib - self._reserved_mib
        readings: list[GpuReading] = []
        for gpu in range(self.gpus):
            if lost_now and gpu == self.lost_index:
                continue
            jobs = self._jobs_at(gpu, slot)
            utilization = min(
                1.0, self._utilization(gpu, elapsed_s, jobs) + extra.extra_utilization
            )
            used = min(usable, sum(j.memory_mib for j in jobs))
            readings.append(
                GpuReading(
                    uuid=self._uuids[gpu],
                    index=gpu,
                    name=self.model,
                    utilization=utilization,
                    memory_total_mib=self.memory_total_mib,
                    memory_free_mib=usable - used,
                    temperature_c=round(self._temperature(gpu, elapsed_s)),
                    mig_enabled=False,
                    # No MIG here: one pod can have all of a GPU's free memory.
                    memory_largest_allocation_mib=usable - used,
                )
            )
        readings = _place_memory(readings, extra.extra_memory_mib)
        reading = NodeReading(
            sampled_at=now,
            gpus=tuple(readings),
            device_count=self.gpus,
            lost=(f"gpu {self.lost_index}: lost",) if lost_now else (),
            error_kinds=("GpuIsLost",) if lost_now else (),
        )
        return self._with_pods(reading, elapsed_s, slot) if self.pods else reading

    def _with_pods(self, reading: NodeReading, elapsed_s: float, slot: int) -> NodeReading:
        """The jobs as pods: the kubelet's allocations by pod, and the GPUs' processes."""
        step = math.floor(elapsed_s / BURST_S)
        holders: dict[str, set[str]] = {}
        owners: dict[int, ProcessOwner] = {}
        gpus: list[GpuReading] = []
        for gpu in reading.gpus:
            memory: list[tuple[int, int | None]] = []
            busy: list[tuple[int, float]] = []
            for job in self._jobs_at(gpu.index, slot):
                # A DNS label either way: slots before the trace started are negative (`s-9`).
                pod = f"sim/job-{gpu.index}-s{job.start_slot}"
                holders.setdefault(pod, set()).add(
                    f"{gpu.uuid}::{job.start_slot % SIMULATED_REPLICAS}"
                )
                pid = 1000 + (_mix(self.seed, gpu.index, job.start_slot) % 4_000_000)
                burst = 0.75 + 0.25 * _uniform(self.seed, gpu.index, job.start_slot, step, _BURST)
                memory.append((pid, job.memory_mib))
                busy.append((pid, 100.0 * job.level * burst))
                owners[pid] = ProcessOwner(pod, "pod")
            gpus.append(replace(gpu, processes=GpuProcesses(tuple(memory), tuple(busy))))
        entries = tuple(PodDevices(pod, frozenset(ids)) for pod, ids in sorted(holders.items()))
        allocations = DeviceAllocations(
            allocatable_ids=frozenset(
                f"{g.uuid}::{r}" for g in reading.gpus for r in range(SIMULATED_REPLICAS)
            ),
            assigned_ids=frozenset(i for e in entries for i in e.device_ids),
            pods=entries,
        )
        return replace(reading, gpus=tuple(gpus), allocations=allocations, process_owners=owners)

    def close(self) -> None:
        self._closed = True


def _place_memory(gpus: list[GpuReading], memory_mib: int) -> list[GpuReading]:
    """Take `memory_mib` from the GPUs with the most free memory first (ties by index)."""
    if memory_mib <= 0:
        return gpus
    left = memory_mib
    free = {g.index: g.memory_free_mib or 0 for g in gpus}
    for g in sorted(gpus, key=lambda g: (-(g.memory_free_mib or 0), g.index)):
        take = min(left, free[g.index])
        free[g.index] -= take
        left -= take
        if left <= 0:
            break
    return [
        replace(g, memory_free_mib=free[g.index], memory_largest_allocation_mib=free[g.index])
        for g in gpus
    ]
