"""Placement simulation: one GPU pod stream scheduled by five policies over one simulated fleet.

What it compares, on the same pods, nodes, background load and seeds:

- ``per-gpu``: the scorer's real filter and scores (`exporter_scheduler.scoring.evaluate`), fed the
  annotations each node's agent last *wrote* (real `aggregate` with the kubelet's allocations,
  real write limiter, real `encode`), so the scorer sees data as stale as it would be in a
  cluster, never the truth; multi-GPU pods get the k-GPU rule on the per-GPU keys;
- ``node-aggregate``: the same scorer on the same writes with the per-GPU keys left out, which is
  what a scorer that reads only the node-level keys decides (and this scorer on an older agent);
- ``utilization-only``: the original design's `(1 - utilization) x 100` on the same annotations;
- ``allocation-spread``: the node with the most free GPUs, roughly the default scheduler alone;
- ``random``: uniform among the nodes with enough free GPUs.

The default scheduler model comes first for every policy: allocation accounting of
`nvidia.com/gpu` (a node without enough free GPU slots is no candidate), updated the moment a pod
is bound. Each policy then ranks the remaining nodes by its own score and picks uniformly among the
best (as kube-scheduler does with equal totals); the default plugins' own scores are not modelled.
A pod no node accepts stays pending and is retried with kube-scheduler's back-off (1 s doubling to
10 s).

The fleet mixes exclusive nodes (A100, H100, V100: one pod per GPU) and time-sliced inference
nodes (T4, L4: two pods per GPU, NVIDIA's time-slicing, which shares compute and memory without
isolation), so load and free memory are not what allocation accounting believes. Some nodes also
run GPU work the scheduler does not account for: episodes of load and memory with no allocation,
on every GPU of the node (a pod that sets `NVIDIA_VISIBLE_DEVICES=all` without requesting GPUs)
or on a few (a burn-in, a stray process). A few nodes have poor cooling. The pod stream mixes
multi-GPU training (1 to 8 GPUs), single-GPU inference, shared inference (2 time-sliced GPUs,
tensor-parallel replicas on T4/L4 nodes) and notebooks. The device plugin gives a pod the
least-shared GPUs with a free slot, lowest index first, without looking at their load.

Judging is done against the truth at the moment of binding (`judge`), never against what the
scorer saw, so staleness counts against the project like any other cause.
"""

from __future__ import annotations

import itertools
import math
import random
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Final, Literal

import numpy as np

from agent.aggregate import aggregate
from agent.limiter import LimiterState, WritePolicy, decide, record_success
from agent.records import DeviceAllocations, GpuReading, NodeReading
from exporter_scheduler.hints import FALLBACK_UTILIZATION, MIN_GPU_MEMORY_MIB, MODEL_PREFERENCE
from exporter_scheduler.policy import Policy
from exporter_scheduler.scoring import NodeInput, PodInput, evaluate
from fleet_sim.traces import A100_80GB, H100_80GB, L4_24GB, T4_16GB, V100_32GB, GpuModel
from gpu_contract import DEFAULT_KEYS, Field, decode, encode, normalize_model_name

PolicyName = Literal["per-gpu", "node-aggregate", "utilization-only", "allocation-spread", "random"]
POLICIES: Final[tuple[PolicyName, ...]] = (
    "per-gpu",
    "node-aggregate",
    "utilization-only",
    "allocation-spread",
    "random",
)
# The two policies that run the project's scorer.
SCORER_POLICIES: Final[frozenset[PolicyName]] = frozenset({"per-gpu", "node-aggregate"})
PER_GPU_KEYS: Final = frozenset(
    DEFAULT_KEYS[f]
    for f in (
        Field.PER_GPU_UTILIZATION,
        Field.PER_GPU_MEMORY_FREE_MIB,
        Field.PER_GPU_TEMPERATURE,
        Field.PER_GPU_ALLOCATED,
    )
)
WorkloadKind = Literal["training", "inference", "shared-inference", "notebook"]
EPOCH: Final = datetime(2026, 1, 5, 8, 0, tzinfo=UTC)
FULL_LOAD_RISE_C: Final = 45.0
THERMAL_TIME_CONSTANT_S: Final = 60.0
# A pod that does not fit in its GPU's memory dies at start (CUDA out of memory) and frees its slot.
CRASH_AFTER_S: Final = 30.0
BACKOFF_INITIAL_S: Final = 1.0
BACKOFF_MAX_S: Final = 10.0


@dataclass(frozen=True, slots=True)
class Pool:
    """A node pool: its GPUs, how many pods share one GPU, and its share of the fleet."""

    name: str
    model: GpuModel
    gpu_count: int
    slots_per_gpu: int
    share: float


DEFAULT_POOLS: Final[tuple[Pool, ...]] = (
    Pool("a100", A100_80GB, 8, 1, 0.20),
    Pool("h100", H100_80GB, 8, 1, 0.15),
    Pool("v100", V100_32GB, 8, 1, 0.20),
    Pool("t4", T4_16GB, 4, 2, 0.20),
    Pool("l4", L4_24GB, 4, 2, 0.25),
)


@dataclass(frozen=True, slots=True)
class PlacementConfig:
    nodes: int = 80
    duration_s: float = 3 * 3600.0
    interval_s: float = 5.0
    seed: int = 11
    # Mean share of all GPU slots the pod stream asks for; above ~0.8 pods start to queue.
    offered_load: float = 0.85
    # Share of nodes with episodes of GPU work the scheduler does not account for, and of those
    # episodes the share that loads every GPU of the node (the rest load one to half of them).
    unaccounted_share: float = 0.25
    unaccounted_all_gpus_share: float = 0.3
    hot_share: float = 0.05
    pools: tuple[Pool, ...] = DEFAULT_POOLS
    write_policy: WritePolicy = field(default_factory=WritePolicy)
    scorer_policy: Policy = field(default_factory=Policy)
    # Fleet-wide series (fragmentation, pending pods) are sampled this often.
    sample_every_s: float = 60.0


@dataclass(frozen=True, slots=True)
class PodRequest:
    """One pod of the stream. Memory and utilization are per GPU slot."""

    name: str
    arrival_s: float
    gpus: int
    memory_mib: int
    utilization: float
    run_s: float
    chain: tuple[str, ...] = ()
    fallback_utilization: float | None = None
    declares_memory: bool = False
    kind: WorkloadKind = "training"

    def annotations(self) -> dict[str, str]:
        prefix = DEFAULT_KEYS.prefix
        out: dict[str, str] = {}
        if self.chain:
            out[prefix + MODEL_PREFERENCE] = ",".join(self.chain)
        if self.fallback_utilization is not None:
            out[prefix + FALLBACK_UTILIZATION] = f"{self.fallback_utilization:.2f}"
        if self.declares_memory:
            out[prefix + MIN_GPU_MEMORY_MIB] = str(self.memory_mib)
        return out


@dataclass(frozen=True, slots=True)
class NodeSetup:
    name: str
    model: GpuModel
    gpu_count: int
    slots_per_gpu: int
    ambient_c: float
    # (start_s, end_s, utilization, memory fraction, GPU indexes) of load the scheduler does not
    # account for, on those GPUs.
    episodes: tuple[tuple[float, float, float, float, tuple[int, ...]], ...] = ()

    @property
    def model_name(self) -> str:
        return normalize_model_name(self.model.name)


# ----------------------------------------------------------------------------------------------
# Judging one placement against the truth (pure; the tests drive it with hand-built cases)


@dataclass(frozen=True, slots=True)
class GpuTruth:
    """One GPU as it really is when a pod is bound."""

    free_slot: bool
    utilization: float
    temperature_c: float
    free_mib: int


@dataclass(frozen=True, slots=True)
class NodeTruth:
    """A node as it really is when a pod is bound (not as its annotations say)."""

    name: str
    model_name: str
    utilization: float
    temperature_c: float
    # The most free memory on one GPU that still has a free slot.
    largest_free_mib: int
    gpus: tuple[GpuTruth, ...] = ()


@dataclass(frozen=True, slots=True)
class Judgement:
    above_limit: bool
    chain_violation: bool
    memory_fit_failure: bool
    hot: bool
    # Fewer than the pod's k GPUs of the node were suitable (see `suitable_gpus`).
    fewer_suitable: bool = False


def suitable_gpus(
    node: NodeTruth, pod: PodRequest, *, utilization_limit: float, temperature_limit_c: float
) -> int:
    """GPUs of `node` that could really take `pod` at binding: a free slot, utilization at or
    below the limit, temperature below the limit and the pod's memory free (its real need,
    declared or not)."""
    return sum(
        g.free_slot
        and g.utilization <= utilization_limit
        and g.temperature_c < temperature_limit_c
        and g.free_mib >= pod.memory_mib
        for g in node.gpus
    )


def pushed_over_limit(
    before: Sequence[float], assigned: Sequence[int], pod_utilization: float, limit: float
) -> tuple[int, ...]:
    """The GPUs that the pod's slots (`assigned`, a GPU index per slot: a time-sliced GPU can
    appear twice) take above the utilization limit while they already ran other work (`before`:
    each GPU's utilization just before binding). A GPU the pod has alone is not counted: a
    training pod is meant to fill it."""
    slots: dict[int, int] = {}
    for g in assigned:
        slots[g] = slots.get(g, 0) + 1
    return tuple(
        g for g, n in slots.items() if before[g] > 0.0 and before[g] + n * pod_utilization > limit
    )


def chain_rank(model_name: str, chain: Sequence[str]) -> int:
    """Index of the first chain entry naming this model (whole `-` tokens); unlisted: len(chain)."""
    padded = "-" + model_name.lower() + "-"
    for index, entry in enumerate(chain):
        if entry == "*" or "-" + normalize_model_name(entry).lower() + "-" in padded:
            return index
    return len(chain)


def judge(
    pod: PodRequest,
    chosen: NodeTruth,
    feasible: Sequence[NodeTruth],
    *,
    fits_in_memory: bool,
    utilization_limit: float,
    temperature_limit_c: float,
    default_fallback_utilization: float = 0.80,
    margin: float = 0.0,
) -> Judgement:
    """Grade one binding. `feasible`: every node allocation accounting allowed (chosen included).

    - above limit: the node was above the utilization limit while a feasible node at or below
      it existed;
    - chain violation: a feasible node of a better-ranked model was under the temperature
      limit and could take the pod at or below the fallback threshold (and the utilization
      limit): k GPUs suitable at that threshold (`suitable_gpus`), or where the per-GPU truth
      is not given, a node utilization at or below it and the pod's memory on one GPU;
    - memory-fit failure: the pod's memory did not fit on a GPU it was given;
    - hot: the node's hottest GPU was at or above the temperature limit;
    - fewer suitable: fewer than the pod's GPUs were suitable on the node (`suitable_gpus`).

    With `margin` > 0 only clear cases count: the better node must be below each limit and
    threshold by at least `margin` (the agent's deadband lets published utilization trail the
    truth by up to that much between writes, so closer calls are a coin toss for any reader).
    """
    above = chosen.utilization > utilization_limit + margin and any(
        n.utilization <= utilization_limit - margin for n in feasible
    )
    violation = False
    if pod.chain:
        threshold = (
            pod.fallback_utilization
            if pod.fallback_utilization is not None
            else default_fallback_utilization
        )
        rank = chain_rank(chosen.model_name, pod.chain)

        below = min(threshold, utilization_limit) - margin

        def could_take_below(n: NodeTruth) -> bool:
            # With per-GPU truth the chain's question is the pod's: k GPUs that could take it
            # at or below the threshold (a node mean below it can hide busy GPUs, one above it
            # can hold k idle ones). Without it, the node-level reading.
            if not n.gpus:
                return n.utilization <= below and n.largest_free_mib >= pod.memory_mib
            suitable = suitable_gpus(
                n, pod, utilization_limit=below, temperature_limit_c=temperature_limit_c
            )
            return suitable >= pod.gpus

        violation = any(
            chain_rank(n.model_name, pod.chain) < rank
            and n.temperature_c < temperature_limit_c
            and could_take_below(n)
            for n in feasible
        )
    suitable = suitable_gpus(
        chosen, pod, utilization_limit=utilization_limit, temperature_limit_c=temperature_limit_c
    )
    return Judgement(
        above_limit=above,
        chain_violation=violation,
        memory_fit_failure=not fits_in_memory,
        hot=chosen.temperature_c >= temperature_limit_c,
        fewer_suitable=bool(chosen.gpus) and suitable < pod.gpus,
    )


def stranded_fraction(free_slots: Sequence[int], total_slots: Sequence[int]) -> float:
    """Share of free GPU slots on partly used nodes: capacity a whole-node job cannot use."""
    free_total = sum(free_slots)
    if free_total == 0:
        return 0.0
    whole = sum(f for f, t in zip(free_slots, total_slots, strict=True) if f == t)
    return 1.0 - whole / free_total


# ----------------------------------------------------------------------------------------------
# The fleet and the pod stream (seeded; identical for every policy)


def make_nodes(config: PlacementConfig) -> list[NodeSetup]:
    rng = random.Random(config.seed)
    weights = [p.share for p in config.pools]
    nodes: list[NodeSetup] = []
    # Pools get whole-number shares (largest remainder), so small fleets still hold every pool.
    raw = [w / sum(weights) * config.nodes for w in weights]
    counts = [int(r) for r in raw]
    for i in sorted(range(len(raw)), key=lambda i: raw[i] - counts[i], reverse=True)[
        : config.nodes - sum(counts)
    ]:
        counts[i] += 1
    index = 0
    for pool, count in zip(config.pools, counts, strict=True):
        for _ in range(count):
            hot = rng.random() < config.hot_share
            ambient = rng.uniform(25.0, 35.0) + (15.0 if hot else 0.0)
            episodes: list[tuple[float, float, float, float, tuple[int, ...]]] = []
            if rng.random() < config.unaccounted_share:
                t = rng.uniform(0.0, 1800.0)
                while t < config.duration_s:
                    length = rng.expovariate(1 / 1800.0)
                    if rng.random() < config.unaccounted_all_gpus_share:
                        on = tuple(range(pool.gpu_count))
                    else:  # a burn-in or a stray process: one GPU to half of them
                        picked = rng.sample(
                            range(pool.gpu_count), rng.randint(1, pool.gpu_count // 2)
                        )
                        on = tuple(sorted(picked))
                    load = (rng.uniform(0.5, 0.95), rng.uniform(0.3, 0.8))
                    episodes.append((t, t + length, *load, on))
                    t += length + rng.expovariate(1 / 2400.0)
            nodes.append(
                NodeSetup(
                    name=f"{pool.name}-{index:03d}",
                    model=pool.model,
                    gpu_count=pool.gpu_count,
                    slots_per_gpu=pool.slots_per_gpu,
                    ambient_c=ambient,
                    episodes=tuple(episodes),
                )
            )
            index += 1
    return nodes


_TRAINING_GPUS: Final = ((1, 0.35), (2, 0.25), (4, 0.25), (8, 0.15))
_NOTEBOOK_GPUS: Final = ((1, 0.5), (2, 0.5))
# (kind, share of pods, mean GPUs, mean run time in s): the stream's mix.
WORKLOADS: Final[tuple[tuple[WorkloadKind, float, float, float], ...]] = (
    ("training", 0.35, sum(g * w for g, w in _TRAINING_GPUS), 2400.0),
    ("inference", 0.40, 1.0, 1800.0),
    ("shared-inference", 0.10, 2.0, 1800.0),
    ("notebook", 0.15, sum(g * w for g, w in _NOTEBOOK_GPUS), 1200.0),
)


def make_pods(config: PlacementConfig, nodes: Sequence[NodeSetup]) -> list[PodRequest]:
    """A Poisson stream of the `WORKLOADS` mix sized to `offered_load`."""
    rng = random.Random(config.seed * 31 + 1)
    slots = sum(n.gpu_count * n.slots_per_gpu for n in nodes)
    # GPU-seconds one pod of the mix asks on average, for the arrival rate that offers the load.
    mean_gpu_s = sum(share * gpus * run_s for _, share, gpus, run_s in WORKLOADS)
    rate_per_s = config.offered_load * slots / mean_gpu_s
    bounds = list(itertools.accumulate(share for _, share, _, _ in WORKLOADS))
    pods: list[PodRequest] = []
    t = 0.0
    while True:
        t += rng.expovariate(rate_per_s)
        if t >= config.duration_s:
            break
        draw = rng.random()
        kind: WorkloadKind = WORKLOADS[-1][0]
        for (candidate, *_), bound in zip(WORKLOADS, bounds, strict=True):
            if draw < bound:
                kind = candidate
                break
        name = f"pod-{len(pods):05d}"
        declares = rng.random() < 0.7
        pick = rng.random()
        if kind == "training":
            gpus = rng.choices([g for g, _ in _TRAINING_GPUS], [w for _, w in _TRAINING_GPUS])[0]
            chain: tuple[str, ...] = (
                ("A100", "H100") if pick < 0.5 else ("H100", "A100") if pick < 0.7 else ()
            )
            pods.append(
                PodRequest(
                    name=name,
                    arrival_s=t,
                    gpus=gpus,
                    memory_mib=int(rng.uniform(16_000, 70_000)),
                    utilization=rng.uniform(0.85, 0.98),
                    run_s=rng.expovariate(1 / 2400.0),
                    chain=chain,
                    fallback_utilization=0.80 if chain else None,
                    declares_memory=declares,
                    kind=kind,
                )
            )
        elif kind == "inference":
            chain = ("L4", "T4") if pick < 0.4 else ("A100", "V100") if pick < 0.6 else ()
            pods.append(
                PodRequest(
                    name=name,
                    arrival_s=t,
                    gpus=1,
                    memory_mib=int(rng.uniform(4_000, 14_000)),
                    utilization=rng.uniform(0.15, 0.55),
                    run_s=rng.expovariate(1 / 1800.0),
                    chain=chain,
                    fallback_utilization=0.80 if chain else None,
                    declares_memory=declares,
                    kind=kind,
                )
            )
        elif kind == "shared-inference":
            # A tensor-parallel replica over two time-sliced GPUs, sharing each with others.
            pods.append(
                PodRequest(
                    name=name,
                    arrival_s=t,
                    gpus=2,
                    memory_mib=int(rng.uniform(5_000, 11_000)),
                    utilization=rng.uniform(0.25, 0.45),
                    run_s=rng.expovariate(1 / 1800.0),
                    chain=("L4", "T4"),
                    fallback_utilization=0.80,
                    declares_memory=True,
                    kind=kind,
                )
            )
        else:
            pods.append(
                PodRequest(
                    name=name,
                    arrival_s=t,
                    gpus=rng.choices(
                        [g for g, _ in _NOTEBOOK_GPUS], [w for _, w in _NOTEBOOK_GPUS]
                    )[0],
                    memory_mib=int(rng.uniform(2_000, 30_000)),
                    utilization=rng.uniform(0.05, 0.30),
                    run_s=rng.expovariate(1 / 1200.0),
                    declares_memory=declares,
                    kind=kind,
                )
            )
    return pods


# ----------------------------------------------------------------------------------------------
# The simulation


@dataclass(slots=True)
class _Node:
    setup: NodeSetup
    total_mib: int
    # Per GPU: tenants' summed utilization and memory, and how many slots are taken.
    util: list[float]
    mem_mib: list[int]
    tenants: list[int]
    temperature_c: list[float]
    phase_s: float
    limiter: LimiterState
    annotations: dict[str, str] = field(default_factory=dict)
    # The same write without the per-GPU keys: what a node-level reader has of it.
    node_level: dict[str, str] = field(default_factory=dict)
    write_time: datetime | None = None
    last_fragmentation: float = 0.0
    # Per GPU: the load and memory of work the scheduler does not account for.
    bg_util: list[float] = field(default_factory=list)
    bg_mem_mib: list[int] = field(default_factory=list)

    @property
    def free_slots(self) -> int:
        return self.setup.gpu_count * self.setup.slots_per_gpu - sum(self.tenants)

    def gpu_util(self, g: int) -> float:
        return min(1.0, self.util[g] + self.bg_util[g])

    def utilization(self) -> float:
        return sum(self.gpu_util(g) for g in range(self.setup.gpu_count)) / self.setup.gpu_count

    def gpu_free_mib(self, g: int) -> int:
        return max(0, self.total_mib - self.mem_mib[g] - self.bg_mem_mib[g])

    def published(self) -> NodeTruth | None:
        """The node as its last written annotations describe it (what a reader could know)."""
        state = decode(self.annotations, DEFAULT_KEYS).state
        if state is None or state.utilization is None:
            return None
        return NodeTruth(
            name=self.setup.name,
            model_name=state.gpu_model or "",
            utilization=state.utilization,
            temperature_c=float(state.temperature_c) if state.temperature_c is not None else 0.0,
            largest_free_mib=state.memory_largest_free_mib or 0,
            gpus=tuple(
                GpuTruth(
                    free_slot=g.allocated is not True,
                    utilization=g.utilization or 0.0,
                    temperature_c=float(g.temperature_c or 0),
                    free_mib=g.memory_free_mib or 0,
                )
                for g in state.gpus
            ),
        )

    def truth(self) -> NodeTruth:
        slots = self.setup.slots_per_gpu
        # Temperatures in whole degrees, as NVML reads them: the limit is defined on those.
        gpus = tuple(
            GpuTruth(
                free_slot=self.tenants[g] < slots,
                utilization=self.gpu_util(g),
                temperature_c=float(round(self.temperature_c[g])),
                free_mib=self.gpu_free_mib(g),
            )
            for g in range(self.setup.gpu_count)
        )
        return NodeTruth(
            name=self.setup.name,
            model_name=self.setup.model_name,
            utilization=self.utilization(),
            temperature_c=max(g.temperature_c for g in gpus),
            largest_free_mib=max((g.free_mib for g in gpus if g.free_slot), default=0),
            gpus=gpus,
        )


@dataclass(slots=True)
class PlacementResult:
    policy: PolicyName
    pods: int
    placed: int = 0
    above_limit: int = 0
    chain_pods: int = 0
    chain_violations: int = 0
    # The same two counts, only where the truth was clear of the agent's utilization deadband.
    above_limit_clear: int = 0
    chain_violations_clear: int = 0
    # ... and where the published data hid the problem: graded on what the annotations said
    # (instead of the truth), the placement would have been clean.
    above_limit_unseen: int = 0
    chain_violations_unseen: int = 0
    memory_fit_failures: int = 0
    # Of those: pods that declared no `min-gpu-memory-mib`, and pods of more than one GPU (a
    # node-level reader checks the hint against the single largest free GPU only).
    memory_fit_failures_undeclared: int = 0
    memory_fit_failures_multi_gpu: int = 0
    # Placements on a node where fewer than the pod's k GPUs were really suitable at binding
    # (`suitable_gpus`), and of those, pods of more than one GPU.
    fewer_suitable: int = 0
    fewer_suitable_multi_gpu: int = 0
    # ... of those, pods that declared no memory need, and placements the published per-GPU
    # values showed as suitable (the truth had moved since the agent's last write).
    fewer_suitable_undeclared: int = 0
    fewer_suitable_unseen: int = 0
    # GPUs the pod's load took above the utilization limit on top of other work there, and of
    # those, GPUs whose other work was unaccounted (no pod of the scheduler's on it).
    gpus_pushed_over_limit: int = 0
    gpus_pushed_over_limit_unaccounted: int = 0
    # Placed pods by workload kind (the stream's mix), and placed pods of more than one GPU.
    placed_by_kind: dict[str, int] = field(default_factory=dict)
    placed_multi_gpu: int = 0
    hot_placements: int = 0
    pending_at_end: int = 0
    # Of those: pods that named a model chain, and pods of 4 or more GPUs.
    pending_with_chain: int = 0
    pending_multi_gpu: int = 0
    waits_s: list[float] = field(default_factory=list)
    sample_times_s: list[float] = field(default_factory=list)
    stranded: list[float] = field(default_factory=list)
    memory_fragmentation: list[float] = field(default_factory=list)
    pending: list[int] = field(default_factory=list)
    writes: int = 0
    agent_ticks: int = 0
    interval_s: float = 5.0

    def summary(self) -> dict[str, Any]:
        waits = np.asarray(self.waits_s) if self.waits_s else np.zeros(1)
        return {
            "policy": self.policy,
            "pods": self.pods,
            "placed": self.placed,
            "above_limit": self.above_limit,
            "chain_pods": self.chain_pods,
            "chain_violations": self.chain_violations,
            "above_limit_clear": self.above_limit_clear,
            "chain_violations_clear": self.chain_violations_clear,
            "above_limit_unseen": self.above_limit_unseen,
            "chain_violations_unseen": self.chain_violations_unseen,
            "memory_fit_failures": self.memory_fit_failures,
            "memory_fit_failures_undeclared": self.memory_fit_failures_undeclared,
            "memory_fit_failures_multi_gpu": self.memory_fit_failures_multi_gpu,
            "fewer_suitable": self.fewer_suitable,
            "fewer_suitable_multi_gpu": self.fewer_suitable_multi_gpu,
            "fewer_suitable_undeclared": self.fewer_suitable_undeclared,
            "fewer_suitable_unseen": self.fewer_suitable_unseen,
            "gpus_pushed_over_limit": self.gpus_pushed_over_limit,
            "gpus_pushed_over_limit_unaccounted": self.gpus_pushed_over_limit_unaccounted,
            "placed_multi_gpu": self.placed_multi_gpu,
            "placed_by_kind": dict(sorted(self.placed_by_kind.items())),
            "hot_placements": self.hot_placements,
            "pending_at_end": self.pending_at_end,
            "pending_with_chain": self.pending_with_chain,
            "pending_multi_gpu": self.pending_multi_gpu,
            "wait_p50_s": float(np.percentile(waits, 50)),
            "wait_p95_s": float(np.percentile(waits, 95)),
            "stranded_mean": float(np.mean(self.stranded)) if self.stranded else 0.0,
            "memory_fragmentation_mean": (
                float(np.mean(self.memory_fragmentation)) if self.memory_fragmentation else 0.0
            ),
            "writes_per_node_per_min": (
                self.writes / self.agent_ticks * 60.0 / self.interval_s if self.agent_ticks else 0.0
            ),
        }


def _score_project(
    pod: PodRequest,
    pod_annotations: Mapping[str, str],
    candidates: Sequence[_Node],
    now: datetime,
    policy: Policy,
    *,
    per_gpu: bool,
) -> dict[str, float]:
    """The scorer's filter and scores over what each agent last wrote (with `per_gpu` False,
    without the per-GPU keys, as a node-level reader has it)."""
    inputs = [
        NodeInput(
            name=n.setup.name,
            annotations=n.annotations if per_gpu else n.node_level,
            agent_write_time=n.write_time,
        )
        for n in candidates
    ]
    evaluation = evaluate(
        PodInput(namespace="sim", name=pod.name, annotations=pod_annotations, gpu_request=pod.gpus),
        inputs,
        now,
        policy,
    )
    passed = set(evaluation.passed_names())
    return {name: float(score) for name, score in evaluation.scores() if name in passed}


def _seen_utilization(node: _Node) -> float | None:
    """What the original design's reader takes from the annotations: `utilization` alone."""
    text = node.annotations.get(DEFAULT_KEYS[Field.UTILIZATION])
    if text is None:
        return None
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def _choose(
    policy: PolicyName,
    pod: PodRequest,
    *,
    pod_annotations: Mapping[str, str],
    candidates: Sequence[_Node],
    now: datetime,
    scorer_policy: Policy,
    rng: random.Random,
) -> _Node | None:
    if not candidates:
        return None
    scores: dict[str, float]
    if policy in SCORER_POLICIES:
        scores = _score_project(
            pod, pod_annotations, candidates, now, scorer_policy, per_gpu=policy == "per-gpu"
        )
    elif policy == "utilization-only":
        scores = {}
        for n in candidates:
            seen = _seen_utilization(n)
            scores[n.setup.name] = 0.0 if seen is None else (1.0 - seen) * 100.0
    elif policy == "allocation-spread":
        scores = {n.setup.name: float(n.free_slots) for n in candidates}
    else:
        scores = {n.setup.name: 0.0 for n in candidates}
    if not scores:
        return None
    best = max(scores.values())
    top = [n for n in candidates if scores.get(n.setup.name) == best]
    return top[0] if len(top) == 1 else rng.choice(top)


def _assign(node: _Node, pod: PodRequest) -> tuple[list[int], bool]:
    """The device plugin's pick: slots on the least-shared GPUs; and whether the memory fit."""
    slots = node.setup.slots_per_gpu
    tenants = list(node.tenants)
    extra_mib = [0] * node.setup.gpu_count
    chosen: list[int] = []
    fits = True
    for _ in range(pod.gpus):
        g = min(
            (i for i in range(node.setup.gpu_count) if tenants[i] < slots),
            key=lambda i: (tenants[i], i),
        )
        tenants[g] += 1
        chosen.append(g)
        if node.gpu_free_mib(g) - extra_mib[g] < pod.memory_mib:
            fits = False
        extra_mib[g] += pod.memory_mib
    return chosen, fits


def run(config: PlacementConfig, policy: PolicyName) -> PlacementResult:
    """Schedule the configured pod stream with one policy; deterministic in `config.seed`."""
    setups = make_nodes(config)
    pods = make_pods(config, setups)
    phase_rng = random.Random(config.seed * 17 + 3)
    noise = np.random.default_rng(config.seed * 13 + 5)
    choice_rng = random.Random(config.seed * 19 + 7)
    interval = config.interval_s
    nodes = [
        _Node(
            setup=s,
            total_mib=s.model.memory_total_mib,
            util=[0.0] * s.gpu_count,
            mem_mib=[0] * s.gpu_count,
            tenants=[0] * s.gpu_count,
            temperature_c=[s.ambient_c] * s.gpu_count,
            phase_s=float(phase_rng.randrange(int(interval))),
            limiter=LimiterState.initial(now_s=0.0),
            bg_util=[0.0] * s.gpu_count,
            bg_mem_mib=[0] * s.gpu_count,
        )
        for s in setups
    ]
    write_policy = config.write_policy
    scorer_policy = config.scorer_policy
    limit_u = scorer_policy.utilization_limit
    limit_t = float(scorer_policy.temperature_limit_c)
    margin = write_policy.utilization_deadband
    alpha = 1.0 - math.exp(-1.0 / THERMAL_TIME_CONSTANT_S)
    result = PlacementResult(policy=policy, pods=len(pods), interval_s=interval)
    arrivals = deque(pods)
    # (pod, next try time, attempts so far)
    queue: list[tuple[PodRequest, float, int]] = []
    # (end time, node index, GPU indexes, utilization, memory) of running pods.
    running: list[tuple[float, int, list[int], float, int]] = []
    annotations_of = {p.name: p.annotations() for p in pods}
    steps = int(config.duration_s)
    next_sample = 0.0

    for step in range(steps):
        t = float(step)
        now = EPOCH + timedelta(seconds=t)
        # Pods that end free their slots and their load.
        if running:
            still: list[tuple[float, int, list[int], float, int]] = []
            for entry in running:
                end, ni, gpus, util, mem = entry
                if end <= t:
                    node = nodes[ni]
                    for g in gpus:
                        node.tenants[g] -= 1
                        node.util[g] -= util
                        node.mem_mib[g] -= mem
                else:
                    still.append(entry)
            running = still
        # Unaccounted load switches on and off.
        for node in nodes:
            count = node.setup.gpu_count
            node.bg_util, node.bg_mem_mib = [0.0] * count, [0] * count
            for start, end, u, m, on in node.setup.episodes:
                if start <= t < end:
                    for g in on:
                        node.bg_util[g], node.bg_mem_mib[g] = u, int(m * node.total_mib)
                    break
            for g in range(count):
                target = node.setup.ambient_c + FULL_LOAD_RISE_C * node.gpu_util(g)
                node.temperature_c[g] += alpha * (target - node.temperature_c[g])
        # Agents whose tick falls in this second sample, aggregate, decide and maybe write.
        for node in nodes:
            if (t - node.phase_s) % interval != 0.0:
                continue
            state = aggregate(_reading(node, now, noise))
            result.agent_ticks += 1
            node.last_fragmentation = state.memory_fragmentation or 0.0
            decision = decide(
                node.limiter,
                state,
                now_s=t,
                memory_total_mib=node.total_mib * node.setup.gpu_count,
                policy=write_policy,
            )
            if decision.write:
                node.annotations = encode(state, DEFAULT_KEYS)
                node.node_level = {
                    k: v for k, v in node.annotations.items() if k not in PER_GPU_KEYS
                }
                node.write_time = now
                node.limiter = record_success(node.limiter, written=state, now_s=t)
                result.writes += 1
        while arrivals and arrivals[0].arrival_s <= t:
            pod = arrivals.popleft()
            queue.append((pod, pod.arrival_s, 0))
        # Scheduling: FIFO over the pods whose back-off has passed.
        waiting: list[tuple[PodRequest, float, int]] = []
        for pod, next_try, attempts in queue:
            if next_try > t:
                waiting.append((pod, next_try, attempts))
                continue
            feasible = [n for n in nodes if n.free_slots >= pod.gpus]
            chosen = _choose(
                policy,
                pod,
                pod_annotations=annotations_of[pod.name],
                candidates=feasible,
                now=now,
                scorer_policy=scorer_policy,
                rng=choice_rng,
            )
            if chosen is None:
                delay = min(BACKOFF_MAX_S, BACKOFF_INITIAL_S * 2.0**attempts)
                waiting.append((pod, t + delay, attempts + 1))
                continue
            truths = [n.truth() for n in feasible]
            chosen_truth = chosen.truth()
            gpus, fits = _assign(chosen, pod)
            verdict = judge(
                pod,
                chosen_truth,
                truths,
                fits_in_memory=fits,
                utilization_limit=limit_u,
                temperature_limit_c=limit_t,
            )
            clear = judge(
                pod,
                chosen_truth,
                truths,
                fits_in_memory=fits,
                utilization_limit=limit_u,
                temperature_limit_c=limit_t,
                margin=margin,
            )
            result.above_limit_clear += clear.above_limit
            result.chain_violations_clear += clear.chain_violation
            if verdict.above_limit or verdict.chain_violation:
                seen = _judge_published(pod, chosen, feasible, limit_u, limit_t)
                if seen is not None:
                    result.above_limit_unseen += verdict.above_limit and not seen.above_limit
                    result.chain_violations_unseen += (
                        verdict.chain_violation and not seen.chain_violation
                    )
            result.placed += 1
            result.waits_s.append(t - pod.arrival_s)
            result.above_limit += verdict.above_limit
            result.chain_pods += bool(pod.chain)
            result.chain_violations += verdict.chain_violation
            result.memory_fit_failures += verdict.memory_fit_failure
            if verdict.memory_fit_failure:
                result.memory_fit_failures_undeclared += not pod.declares_memory
                result.memory_fit_failures_multi_gpu += pod.gpus > 1
            result.hot_placements += verdict.hot
            result.fewer_suitable += verdict.fewer_suitable
            if verdict.fewer_suitable:
                result.fewer_suitable_multi_gpu += pod.gpus > 1
                result.fewer_suitable_undeclared += not pod.declares_memory
                published = chosen.published()
                if published is not None and published.gpus:
                    result.fewer_suitable_unseen += (
                        suitable_gpus(
                            published, pod, utilization_limit=limit_u, temperature_limit_c=limit_t
                        )
                        >= pod.gpus
                    )
            result.placed_multi_gpu += pod.gpus > 1
            result.placed_by_kind[pod.kind] = result.placed_by_kind.get(pod.kind, 0) + 1
            if fits:  # a pod that dies at start adds no load
                before = [g.utilization for g in chosen_truth.gpus]
                pushed = pushed_over_limit(before, gpus, pod.utilization, limit_u)
                result.gpus_pushed_over_limit += len(pushed)
                result.gpus_pushed_over_limit_unaccounted += sum(
                    chosen.tenants[g] == 0 for g in pushed
                )
            util = pod.utilization if fits else 0.0
            mem = pod.memory_mib if fits else 0
            ni = nodes.index(chosen)
            for g in gpus:
                chosen.tenants[g] += 1
                chosen.util[g] += util
                chosen.mem_mib[g] += mem
            end = t + (pod.run_s if fits else CRASH_AFTER_S)
            running.append((end, ni, gpus, util, mem))
        queue = waiting
        if t >= next_sample:
            next_sample += config.sample_every_s
            result.sample_times_s.append(t)
            result.stranded.append(
                stranded_fraction(
                    [n.free_slots for n in nodes],
                    [n.setup.gpu_count * n.setup.slots_per_gpu for n in nodes],
                )
            )
            result.memory_fragmentation.append(
                sum(n.last_fragmentation for n in nodes) / len(nodes)
            )
            result.pending.append(len(queue))
    result.pending_at_end = len(queue) + len(arrivals)
    left = [p for p, _, _ in queue] + list(arrivals)
    result.pending_with_chain = sum(bool(p.chain) for p in left)
    result.pending_multi_gpu = sum(p.gpus >= 4 for p in left)
    return result


def _judge_published(
    pod: PodRequest,
    chosen: _Node,
    feasible: Sequence[_Node],
    utilization_limit: float,
    temperature_limit_c: float,
) -> Judgement | None:
    """The same grading on the published values; `None` if the chosen node had published none."""
    chosen_seen = chosen.published()
    if chosen_seen is None:
        return None
    seen = [v for v in (n.published() for n in feasible) if v is not None]
    return judge(
        pod,
        chosen_seen,
        seen,
        fits_in_memory=True,
        utilization_limit=utilization_limit,
        temperature_limit_c=temperature_limit_c,
    )


def _reading(node: _Node, now: datetime, noise: np.random.Generator) -> NodeReading:
    """What NVML would read on this node now (the truth plus a little sampling noise), and the
    kubelet's allocations: one share per slot (`UUID::n` replicas when time-sliced), the
    first `tenants` of them assigned."""
    setup = node.setup
    jitter = noise.normal(0.0, 0.015, size=setup.gpu_count).tolist()
    shares: list[str] = []
    assigned: list[str] = []
    for g in range(setup.gpu_count):
        uuid = f"GPU-{setup.name}-{g}"
        ids = (
            [uuid]
            if setup.slots_per_gpu == 1
            else [f"{uuid}::{n}" for n in range(setup.slots_per_gpu)]
        )
        shares.extend(ids)
        assigned.extend(ids[: node.tenants[g]])
    gpus = tuple(
        GpuReading(
            uuid=f"GPU-{setup.name}-{g}",
            index=g,
            name=setup.model.name,
            utilization=round(min(1.0, max(0.0, node.gpu_util(g) + jitter[g])), 2),
            memory_total_mib=node.total_mib,
            memory_free_mib=node.gpu_free_mib(g),
            temperature_c=round(node.temperature_c[g]),
            mig_enabled=False,
        )
        for g in range(setup.gpu_count)
    )
    allocations = DeviceAllocations(frozenset(shares), frozenset(assigned))
    return NodeReading(
        sampled_at=now, gpus=gpus, device_count=setup.gpu_count, allocations=allocations
    )


def compare(
    config: PlacementConfig, policies: Sequence[PolicyName] = POLICIES
) -> dict[PolicyName, PlacementResult]:
    """Every policy on the same fleet, pod stream and seeds."""
    return {p: run(config, p) for p in policies}


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m fleet_sim.placement --nodes 80 --duration-s 10800`: every policy, as JSON."""
    import argparse  # noqa: PLC0415  (only the command line needs it)
    import json  # noqa: PLC0415

    parser = argparse.ArgumentParser(prog="python -m fleet_sim.placement", description=__doc__)
    parser.add_argument("--nodes", type=int, default=80)
    parser.add_argument("--duration-s", type=float, default=3 * 3600.0)
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--offered-load", type=float, default=0.85)
    parser.add_argument("--policy", choices=POLICIES, action="append")
    args = parser.parse_args(argv)
    config = PlacementConfig(
        nodes=args.nodes,
        duration_s=args.duration_s,
        seed=args.seed,
        offered_load=args.offered_load,
    )
    results = compare(config, args.policy or POLICIES)
    print(json.dumps({p: r.summary() for p, r in results.items()}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
