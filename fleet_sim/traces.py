"""Seeded per-node GPU load traces that look like the load of real clusters.

The write-budget simulation (`fleet_sim.fleet`) needs thousands of nodes' worth of GPU readings over
hours of cluster time, fast. This module produces them as numpy arrays, one row per sampling tick,
so that the only per-node per-tick Python work left is building the agent's own `NodeReading`.

Each node follows one workload profile, drawn from a configurable, seeded mix:

- ``training``: one job holds every GPU at a steady 90-98 % with small noise, memory nearly full,
  and a short dip at each checkpoint (every 20-40 minutes);
- ``inference``: a modest base load with bursts of traffic (Poisson arrivals, 30 s to 3 min long),
  a model resident in memory plus a KV cache that grows with the load;
- ``idle``: nothing but rare, tiny blips;
- ``diurnal``: serving load that swings over a 24-hour day, phase shifted per node;
- ``batch``: jobs that start and end (exponential run and gap lengths), each with its own load
  and memory footprint, idle in between.

Temperature follows the load with a first-order thermal lag (time constant 60 s) above a
per-node ambient; a few nodes run hot (poor airflow). Every value a trace holds is what the agent
would read for one sampling window: utilization is the window's mean SM-busy fraction. Each GPU
is also allocated (a pod holds it, as the kubelet's pod-resources API would say) or not: always
under training, inference and diurnal serving, never on idle nodes, and for the length of each
job on the GPUs a batch job uses.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Final

import numpy as np
import numpy.typing as npt

from agent.records import (
    DeviceAllocations,
    GpuProcesses,
    GpuReading,
    NodeReading,
    ProcessOwner,
)


class Profile(StrEnum):
    TRAINING = "training"
    INFERENCE = "inference"
    IDLE = "idle"
    DIURNAL = "diurnal"
    BATCH = "batch"


@dataclass(frozen=True, slots=True)
class GpuModel:
    """A GPU product as NVML names it, with its memory size."""

    name: str
    memory_total_mib: int


A100_80GB: Final = GpuModel("NVIDIA A100-SXM4-80GB", 81920)
H100_80GB: Final = GpuModel("NVIDIA H100 80GB HBM3", 81559)
V100_32GB: Final = GpuModel("Tesla V100-SXM2-32GB", 32768)
T4_16GB: Final = GpuModel("Tesla T4", 15360)
L4_24GB: Final = GpuModel("NVIDIA L4", 23034)

DEFAULT_MODELS: Final[tuple[GpuModel, ...]] = (A100_80GB, H100_80GB, V100_32GB, T4_16GB, L4_24GB)

DEFAULT_MIX: Final[Mapping[Profile, float]] = {
    Profile.TRAINING: 0.30,
    Profile.INFERENCE: 0.25,
    Profile.IDLE: 0.15,
    Profile.DIURNAL: 0.15,
    Profile.BATCH: 0.15,
}

DAY_S: Final = 86_400.0
THERMAL_TIME_CONSTANT_S: Final = 60.0
# Degrees a GPU at 100 % utilization runs above its node's ambient, once warmed up.
FULL_LOAD_RISE_C: Final = 45.0


@dataclass(frozen=True, slots=True)
class NodeSpec:
    """One simulated node: its GPUs and the workload it runs."""

    name: str
    model: GpuModel
    gpu_count: int
    profile: Profile
    ambient_c: float


def make_fleet(
    node_count: int,
    *,
    seed: int,
    gpus_per_node: int = 8,
    mix: Mapping[Profile, float] = DEFAULT_MIX,
    models: Sequence[GpuModel] = DEFAULT_MODELS,
) -> list[NodeSpec]:
    """Draw `node_count` nodes: a profile from `mix` (weights, normalised), a model, an ambient."""
    if node_count < 0:
        raise ValueError("node_count must be >= 0")
    if gpus_per_node < 1:
        raise ValueError("gpus_per_node must be >= 1")
    profiles = [p for p in Profile if mix.get(p, 0.0) > 0.0]
    if not profiles:
        raise ValueError("the mix must give at least one profile a positive weight")
    weights = np.array([mix[p] for p in profiles], dtype=float)
    rng = np.random.default_rng(seed)
    drawn = rng.choice(len(profiles), size=node_count, p=weights / weights.sum())
    model_idx = rng.integers(0, len(models), size=node_count)
    # Most nodes sit in a 25-35 degree inlet; one in twenty runs about 15 degrees hotter.
    ambient = rng.uniform(25.0, 35.0, size=node_count) + 15.0 * (rng.random(node_count) < 0.05)
    return [
        NodeSpec(
            name=f"gpu-node-{i:05d}",
            model=models[int(model_idx[i])],
            gpu_count=gpus_per_node,
            profile=profiles[int(drawn[i])],
            ambient_c=float(ambient[i]),
        )
        for i in range(node_count)
    ]


FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]


@dataclass(slots=True)
class FleetTraces:
    """Arrays of shape (ticks, nodes, gpus): what each GPU reads at each sampling tick."""

    specs: list[NodeSpec]
    interval_s: float
    utilization: FloatArray
    memory_used_mib: IntArray
    temperature_c: IntArray
    # Whether a pod holds the GPU (what the kubelet's pod-resources API would say).
    allocated: npt.NDArray[np.bool_]
    _uuids: list[list[str]] = field(default_factory=list)

    @property
    def ticks(self) -> int:
        return int(self.utilization.shape[0])

    def uuids(self, node: int) -> list[str]:
        if not self._uuids:
            self._uuids = [
                [f"GPU-{n:05d}-{g:02d}-sim" for g in range(spec.gpu_count)]
                for n, spec in enumerate(self.specs)
            ]
        return self._uuids[node]


def node_reading(
    spec: NodeSpec,
    *,
    uuids: Sequence[str],
    sampled_at: datetime,
    utilization: Sequence[float],
    memory_used_mib: Sequence[int],
    temperature_c: Sequence[int],
    allocated: Sequence[bool] | None = None,
    allocations: DeviceAllocations | None = None,
    processes: Mapping[int, GpuProcesses] | None = None,
    process_owners: Mapping[int, ProcessOwner] | None = None,
) -> NodeReading:
    """The `NodeReading` the agent's NVML source would produce for one node at one tick, with
    the kubelet's allocations (every GPU allocatable, the `allocated` ones assigned) when given.

    `allocations` (with pods, `fleet_sim.pods`) replaces the ones built from `allocated`;
    `processes` (GPU index -> what NVML says of its processes) and `process_owners` are what the
    agent reads for GPUs shared by several pods."""
    total = spec.model.memory_total_mib
    name = spec.model.name
    gpus = tuple(
        GpuReading(
            uuid=uuids[g],
            index=g,
            name=name,
            utilization=utilization[g],
            memory_total_mib=total,
            memory_free_mib=total - memory_used_mib[g],
            temperature_c=temperature_c[g],
            mig_enabled=False,
            processes=None if processes is None else processes.get(g),
        )
        for g in range(spec.gpu_count)
    )
    if allocations is None:
        allocations = (
            None
            if allocated is None
            else DeviceAllocations(
                allocatable_ids=frozenset(uuids[: spec.gpu_count]),
                assigned_ids=frozenset(uuids[g] for g in range(spec.gpu_count) if allocated[g]),
            )
        )
    return NodeReading(
        sampled_at=sampled_at,
        gpus=gpus,
        device_count=spec.gpu_count,
        allocations=allocations,
        process_owners=process_owners,
    )


def generate(
    specs: Sequence[NodeSpec],
    *,
    ticks: int,
    interval_s: float,
    seed: int,
    start_s: float = 0.0,
) -> FleetTraces:
    """Generate every node's trace for `ticks` samples `interval_s` apart, from `start_s`.

    All nodes must have the same GPU count (the arrays are rectangular). Deterministic in `seed`.
    """
    if ticks < 1:
        raise ValueError("ticks must be >= 1")
    if interval_s <= 0:
        raise ValueError("interval_s must be > 0")
    nodes = len(specs)
    gpus = specs[0].gpu_count if specs else 1
    if any(s.gpu_count != gpus for s in specs):
        raise ValueError("every node in one trace set must have the same gpu_count")
    rng = np.random.default_rng(seed)
    times = start_s + interval_s * np.arange(ticks, dtype=float)
    util = np.zeros((ticks, nodes, gpus))
    mem_frac = np.zeros((ticks, nodes, gpus))
    allocated = np.zeros((ticks, nodes, gpus), dtype=bool)
    by_profile: dict[Profile, list[int]] = {p: [] for p in Profile}
    for i, s in enumerate(specs):
        by_profile[s.profile].append(i)

    for profile, members in by_profile.items():
        if not members:
            continue
        idx = np.array(members)
        u, m, a = _PROFILE_GENERATORS[profile](rng, times, len(members), gpus, interval_s)
        util[:, idx, :] = u
        mem_frac[:, idx, :] = m
        allocated[:, idx, :] = a

    np.clip(util, 0.0, 1.0, out=util)
    np.clip(mem_frac, 0.0, 0.98, out=mem_frac)
    totals = np.array([s.model.memory_total_mib for s in specs], dtype=float).reshape(1, nodes, 1)
    ambient = np.array([s.ambient_c for s in specs], dtype=float).reshape(nodes, 1)
    temperature = _thermal(util, ambient, interval_s, rng)
    return FleetTraces(
        specs=list(specs),
        interval_s=interval_s,
        # NVML reports whole percents; the window mean the agent publishes keeps two decimals.
        utilization=np.round(util, 2),
        memory_used_mib=np.rint(mem_frac * totals).astype(np.int64),
        temperature_c=np.rint(temperature).astype(np.int64),
        allocated=allocated,
    )


def _ar1(
    rng: np.random.Generator, shape: tuple[int, ...], sigma: float, rho: float = 0.9
) -> FloatArray:
    """Autocorrelated noise along axis 0, so readings wander instead of jumping each sample."""
    noise = rng.normal(0.0, sigma * math.sqrt(1 - rho * rho), size=shape)
    out = np.empty(shape)
    out[0] = rng.normal(0.0, sigma, size=shape[1:])
    for t in range(1, shape[0]):
        out[t] = rho * out[t - 1] + noise[t]
    return out


def _training(
    rng: np.random.Generator, times: FloatArray, n: int, g: int, interval_s: float
) -> tuple[FloatArray, FloatArray, BoolArray]:
    ticks = len(times)
    level = rng.uniform(0.90, 0.98, size=(1, n, 1))
    u = level + _ar1(rng, (ticks, n, g), 0.015)
    period = rng.uniform(1200.0, 2400.0, size=(1, n, 1))
    phase = rng.uniform(0.0, 1.0, size=(1, n, 1)) * period
    # A checkpoint stalls the GPUs for about a minute while state goes to storage.
    in_checkpoint = np.mod(times.reshape(-1, 1, 1) + phase, period) < 60.0
    u = np.where(in_checkpoint, 0.08, u)
    m = rng.uniform(0.80, 0.95, size=(1, n, 1)) + np.zeros((ticks, n, g))
    # The job holds every GPU through its checkpoints too.
    return u, m, np.ones((ticks, n, g), dtype=bool)


def _bursts(
    rng: np.random.Generator, ticks: int, n: int, interval_s: float, rate_per_s: float
) -> FloatArray:
    """Per node, 0/1 along time: inside a traffic burst or not (Poisson arrivals)."""
    starts = rng.random((ticks, n)) < rate_per_s * interval_s
    lengths_ticks = np.maximum(1, (rng.uniform(30.0, 180.0, size=(ticks, n)) / interval_s))
    out = np.zeros((ticks, n))
    remaining = np.zeros(n)
    for t in range(ticks):
        remaining = np.where(starts[t], np.maximum(remaining, lengths_ticks[t]), remaining)
        out[t] = remaining > 0
        remaining = remaining - 1
    return out


def _inference(
    rng: np.random.Generator, times: FloatArray, n: int, g: int, interval_s: float
) -> tuple[FloatArray, FloatArray, BoolArray]:
    ticks = len(times)
    base = rng.uniform(0.10, 0.35, size=(1, n, 1))
    burst = _bursts(rng, ticks, n, interval_s, rate_per_s=1 / 600).reshape(ticks, n, 1)
    height = rng.uniform(0.30, 0.60, size=(1, n, g))
    u = base + burst * height + _ar1(rng, (ticks, n, g), 0.05, rho=0.6)
    resident = rng.uniform(0.35, 0.55, size=(1, n, g))
    m = resident + 0.25 * np.clip(u, 0.0, 1.0)
    # One serving pod per GPU, bursts or not.
    return u, m, np.ones((ticks, n, g), dtype=bool)


def _idle(
    rng: np.random.Generator, times: FloatArray, n: int, g: int, interval_s: float
) -> tuple[FloatArray, FloatArray, BoolArray]:
    ticks = len(times)
    blips = (rng.random((ticks, n, g)) < 0.002) * rng.uniform(0.02, 0.2, size=(ticks, n, g))
    m = np.full((ticks, n, g), 0.006)
    return blips, m, np.zeros((ticks, n, g), dtype=bool)


def _diurnal(
    rng: np.random.Generator, times: FloatArray, n: int, g: int, interval_s: float
) -> tuple[FloatArray, FloatArray, BoolArray]:
    ticks = len(times)
    phase = rng.uniform(0.0, DAY_S, size=(1, n, 1))
    day = 0.5 + 0.5 * np.sin(2 * math.pi * (times.reshape(-1, 1, 1) + phase) / DAY_S)
    u = 0.10 + 0.70 * day + _ar1(rng, (ticks, n, g), 0.04, rho=0.8)
    m = rng.uniform(0.40, 0.60, size=(1, n, g)) + 0.15 * day
    return u, m, np.ones((ticks, n, g), dtype=bool)


def _batch(
    rng: np.random.Generator, times: FloatArray, n: int, g: int, interval_s: float
) -> tuple[FloatArray, FloatArray, BoolArray]:
    ticks = len(times)
    u = np.zeros((ticks, n, g))
    m = np.zeros((ticks, n, g))
    span_s = ticks * interval_s
    for node in range(n):
        # Start somewhere inside a run or a gap, so the fleet is not in phase at t=0.
        t_s = -rng.uniform(0.0, 1800.0)
        running = bool(rng.random() < 0.6)
        while t_s < span_s:
            length_s = rng.exponential(1200.0 if running else 600.0)
            lo = max(0, math.ceil(t_s / interval_s))
            hi = min(ticks, math.ceil((t_s + length_s) / interval_s))
            if running and hi > lo:
                used = int(rng.integers(1, g + 1))
                u[lo:hi, node, :used] = rng.uniform(0.55, 0.98)
                m[lo:hi, node, :used] = rng.uniform(0.30, 0.90)
            t_s += length_s
            running = not running
    # A job's pod holds its GPUs from start to end; the gaps leave them free.
    busy = u > 0
    u += _ar1(rng, (ticks, n, g), 0.02, rho=0.7) * busy
    return u, m, busy


_PROFILE_GENERATORS: Final = {
    Profile.TRAINING: _training,
    Profile.INFERENCE: _inference,
    Profile.IDLE: _idle,
    Profile.DIURNAL: _diurnal,
    Profile.BATCH: _batch,
}


def _thermal(
    util: FloatArray, ambient: FloatArray, interval_s: float, rng: np.random.Generator
) -> FloatArray:
    """Temperature that follows the load with a first-order lag, starting warmed up."""
    ticks, nodes, gpus = util.shape
    # Each GPU in a chassis sits in slightly different airflow.
    offset = rng.uniform(-2.0, 2.0, size=(nodes, gpus))
    target = ambient + offset + FULL_LOAD_RISE_C * util
    alpha = 1.0 - math.exp(-interval_s / THERMAL_TIME_CONSTANT_S)
    out = np.empty_like(util)
    current = target[0]
    for t in range(ticks):
        current = current + alpha * (target[t] - current)
        out[t] = current
    return out
