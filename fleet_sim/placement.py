"""Placement simulation: one GPU pod stream scheduled by twelve policies over one simulated fleet.

What it compares, on the same pods, nodes, background load and seeds:

- ``per-gpu``: the scorer's real filter and scores (`exporter_scheduler.core.judge.evaluate`) with
  its defaults, fed the annotations each node's agent last *wrote* (real `aggregate` with the
  kubelet's allocations, real write limiter, real `encode`), so the scorer sees data as stale as
  it would be in a cluster, never the truth; multi-GPU pods get the k-GPU rule on the per-GPU
  keys; each node's bound pods are passed as in-flight pods (`NodeInput.pods`, as the scorer's
  Pod watch and its own proposals give them) and the blind-device-plugin rule is on; the pod's
  own load is counted, learned from its workload's running pods by the scorer's real store
  (`exporter_scheduler.serving.workloads.WorkloadLoads`) out of the agents' written
  `pod-gpu-usage`, else the policy default (no pod of the stream hints its load);
- ``per-gpu-without-own-load``: the same under `Policy(own_load=False)`: GPUs judged by their load
  now (the scorer before it counted the pod's own load);
- ``per-gpu-oracle-load``: the same with every pod's true mean load and memory as its estimate
  (the best any estimator could do);
- ``per-gpu-default-load``: the same with nothing learned: every pod's estimate is the policy
  default (`own_load_gpu_load`);
- ``per-gpu-without-inflight``: the same, without the bound pods (a scorer without pod RBAC);
- ``per-gpu-without-blind-plugin``: the same with in-flight pods, under
  `Policy(blind_device_plugin=False)` (the best k candidates counted, as for a load-aware
  allocator, although the simulated device plugin is blind);
- ``per-gpu-without-either``: neither part (the scorer before in-flight accounting);
- ``node-aggregate``: the scorer (with in-flight pods) on the same writes with the per-GPU keys
  left out, which is what a scorer that reads only the node-level keys decides (and this scorer
  on an older agent);
- ``utilization-only``: the original design's `(1 - utilization) x 100` on the same annotations;
- ``allocation-spread``: the node with the most free GPUs, roughly the default scheduler alone;
- ``random``: uniform among the nodes with enough free GPUs.

The default scheduler model comes first for every policy: allocation accounting of
`nvidia.com/gpu` (a node without enough free GPU slots is no candidate), updated the moment a pod
is bound (kube-scheduler's assumed pods). Each policy then ranks the remaining nodes by its own
score and picks uniformly among the best (as kube-scheduler does with equal totals); the default
plugins' own scores are not modelled. A pod no node accepts stays pending and is retried with
kube-scheduler's back-off (1 s doubling to 10 s).

After binding, a pod goes through the lag model (`LAG_MODEL`, numbers and reasons there): the
kubelet admits it about a second later (the device plugin allocates its GPUs then, and the pod's
`status.startTime` is set), its containers run once the image is pulled (seconds when cached,
a minute or more for a large GPU image that is not), its memory is taken then, and its load
reaches the GPUs only after a ramp (CUDA initialisation, weights loaded). The agent sees the
allocation at its first sample after admission and the load in its window-averaged
utilization (the mean over the seconds since its previous sample) once the ramp is over; its
real rate limiter decides when either reaches the annotations. So a burst's pods all see a fleet
that does not show the pods bound a moment before: the case in-flight accounting is for.

The fleet mixes exclusive nodes (A100, H100, V100: one pod per GPU) and time-sliced inference
nodes (T4, L4: two pods per GPU, NVIDIA's time-slicing, which shares compute and memory without
isolation), so load and free memory are not what allocation accounting believes. Some nodes also
run GPU work the scheduler does not account for: episodes of load and memory with no allocation,
on every GPU of the node (a pod that sets `NVIDIA_VISIBLE_DEVICES=all` without requesting GPUs)
or on a few (a burn-in, a stray process). A few nodes have poor cooling. The pod stream mixes
multi-GPU training (1 to 8 GPUs), single-GPU inference, shared inference (2 time-sliced GPUs,
tensor-parallel replicas on T4/L4 nodes) and notebooks, and bursts: training jobs whose workers
arrive within a second, and inference scale-ups that add several replicas at once.

Pods belong to workloads as in a real fleet (`_as_workloads`): every inference pod, of the
stream or of a scale-up, is a replica of one of 24 inference Deployments (8 for shared
inference), which share the Deployment's template and its load; that load moves with traffic
(the base load times 1 +- 0.3 over a 2-hour cycle, each Deployment at its own phase, a replica
+-0.05 from the rest, constant over the replica's life). A training job's workers are alike
(one Job); the stream's training pods and the notebooks are singletons, with no siblings to
learn from. The simulated agent publishes what the real one would in `pod-gpu-usage`, for each
pod whose containers run: the memory its processes hold, and on an exclusive GPU the whole GPU's
window-averaged utilization (whole-GPU attribution: unaccounted work on that GPU is counted as
the pod's), on a time-sliced GPU the pod's own load (per-process attribution). The device
plugin gives a pod the least-shared GPUs with a free slot, lowest index first, without looking at
their load (the scorer does not rely on that order: it takes the plugin's pick as random).

Judging is done against the truth at the moment of binding (`judge`), never against what the
scorer saw, so staleness counts against the project like any other cause; a GPU pushed over the
utilization limit is judged when the pod's load arrives, and a memory-fit failure when its
containers start.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import math
import random
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any, Final, Literal

import msgspec
import numpy as np

from agent.aggregate import aggregate
from agent.limiter import LimiterState, WritePolicy, decide, record_success
from agent.records import DeviceAllocations, GpuReading, NodeReading
from exporter_scheduler.core.decoding import predecode
from exporter_scheduler.core.hints import (
    EXPECTED_GPU_LOAD,
    FALLBACK_UTILIZATION,
    MAX_UTILIZATION,
    MIN_GPU_MEMORY_MIB,
    MODEL_PREFERENCE,
)
from exporter_scheduler.core.inflight import BASIS_POINTS, NO_PODS, BoundPod
from exporter_scheduler.core.judge import evaluate
from exporter_scheduler.core.ownload import Learned
from exporter_scheduler.core.policy import Policy
from exporter_scheduler.core.records import NodeInput, PodInput
from exporter_scheduler.serving.workloads import WorkloadLoads
from fleet_sim.traces import A100_80GB, H100_80GB, L4_24GB, T4_16GB, V100_32GB, GpuModel
from gpu_contract import DEFAULT_KEYS, Field, decode, encode, normalize_model_name
from gpu_contract.podusage import GpuShare, PodUsage

PolicyName = Literal[
    "per-gpu",
    "per-gpu-without-own-load",
    "per-gpu-oracle-load",
    "per-gpu-default-load",
    "per-gpu-without-inflight",
    "per-gpu-without-blind-plugin",
    "per-gpu-without-either",
    "node-aggregate",
    "utilization-only",
    "allocation-spread",
    "random",
]
POLICIES: Final[tuple[PolicyName, ...]] = (
    "per-gpu",
    "per-gpu-without-own-load",
    "per-gpu-oracle-load",
    "per-gpu-default-load",
    "per-gpu-without-inflight",
    "per-gpu-without-blind-plugin",
    "per-gpu-without-either",
    "node-aggregate",
    "utilization-only",
    "allocation-spread",
    "random",
)


@dataclass(frozen=True, slots=True)
class ScorerVariant:
    """How a policy runs the project's scorer: which keys it reads, whether it gets each node's
    bound pods (in-flight accounting), and the policy's `blind_device_plugin`."""

    per_gpu_keys: bool
    inflight: bool
    blind_device_plugin: bool
    # How the pod's own load is estimated: learned from its workload's running pods (what
    # ships), the pod's true mean load and memory (an oracle), the policy default alone, or not
    # counted at all (`Policy(own_load=False)`).
    own_load: OwnLoadSource = "learned"


# The policies that run the project's scorer. `per-gpu` is the scorer's defaults; each variant's
# name says which part it goes without.
SCORER_VARIANTS: Final[Mapping[PolicyName, ScorerVariant]] = {
    "per-gpu": ScorerVariant(per_gpu_keys=True, inflight=True, blind_device_plugin=True),
    "per-gpu-without-own-load": ScorerVariant(
        per_gpu_keys=True, inflight=True, blind_device_plugin=True, own_load="off"
    ),
    "per-gpu-oracle-load": ScorerVariant(
        per_gpu_keys=True, inflight=True, blind_device_plugin=True, own_load="oracle"
    ),
    "per-gpu-default-load": ScorerVariant(
        per_gpu_keys=True, inflight=True, blind_device_plugin=True, own_load="default"
    ),
    "per-gpu-without-inflight": ScorerVariant(
        per_gpu_keys=True, inflight=False, blind_device_plugin=True
    ),
    "per-gpu-without-blind-plugin": ScorerVariant(
        per_gpu_keys=True, inflight=True, blind_device_plugin=False
    ),
    "per-gpu-without-either": ScorerVariant(
        per_gpu_keys=True, inflight=False, blind_device_plugin=False
    ),
    "node-aggregate": ScorerVariant(per_gpu_keys=False, inflight=True, blind_device_plugin=True),
}
SCORER_POLICIES: Final[frozenset[PolicyName]] = frozenset(SCORER_VARIANTS)
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
BurstKind = Literal["job", "scale-up"]
OwnLoadSource = Literal["learned", "oracle", "default", "off"]
# What the other work on a GPU pushed over the limit was, seen from the pushing pod's bind, in
# the order they are told apart:
# - in-flight: a pod bound before it whose load arrived only after its bind (the case in-flight
#   accounting is for);
# - busy-at-bind: the GPU was above the limit at the bind, no candidate, and the device plugin
#   handed it out anyway (the case the blind-device-plugin rule is for, or data gone stale);
# - after-bind: the work came after the bind (unaccounted work starting, a pod bound later);
# - within-limit: the work was there at the bind and the GPU at or below the limit (a candidate:
#   the scorer does not know what the pod being placed will add).
PushCause = Literal["in-flight", "busy-at-bind", "after-bind", "within-limit"]
PUSH_CAUSES: Final[tuple[PushCause, ...]] = (
    "in-flight",
    "busy-at-bind",
    "after-bind",
    "within-limit",
)
EPOCH: Final = datetime(2026, 1, 5, 8, 0, tzinfo=UTC)
FULL_LOAD_RISE_C: Final = 45.0
THERMAL_TIME_CONSTANT_S: Final = 60.0
# A pod that does not fit in its GPU's memory dies soon after its containers start (CUDA out of
# memory) and frees its slot.
CRASH_AFTER_S: Final = 30.0
BACKOFF_INITIAL_S: Final = 1.0
BACKOFF_MAX_S: Final = 10.0


def backoff_s(attempts: int) -> float:
    """kube-scheduler's back-off before a pod's next try, after `attempts` failed ones. The
    exponent is capped: a pod that fits nowhere for hours is retried thousands of times, and
    2.0 ** 1024 overflows a float."""
    return min(BACKOFF_MAX_S, BACKOFF_INITIAL_S * 2.0 ** min(attempts, 32))


# The namespace of the simulated pods, as the scorer sees them.
SIM_NAMESPACE: Final = "sim"


@dataclass(frozen=True, slots=True)
class LagModel:
    """What happens between a pod's bind and its load showing in the node's annotations.

    The numbers, and why:

    - admission `admission_delay_s` (1 s): the kubelet's pod watch delivers the binding within
      milliseconds; admission (the device plugin's `Allocate`) and the first status sync, which
      writes `status.startTime`, follow within about a second;
    - containers running, after admission: with the image on the node (`image_cached_share`,
      0.6: a fleet runs few base images, and the same node runs the same workloads again),
      `cached_start_s` (1-4 s: sandbox, network, container creation); without it, a pull of a
      GPU image (PyTorch/CUDA images are 7-13 GB, NGC ones 4.5 GB and more compressed), drawn
      log-normal with median `pull_median_s` (75 s) and spread `pull_sigma` (0.7: 10 % of
      pulls under 30 s, 10 % over 3 min), at most `pull_max_s` (15 min: beyond that a pull is
      an incident, not a lag);
    - the ramp from containers running to load on the GPUs (CUDA context, NCCL rendezvous,
      weights read and copied to the GPU, warm-up), uniform per workload kind in `ramp_s`:
      training 20-120 s, inference 15-90 s (a 7-70 B model's weights at 1-2 GB/s from local
      disk, then CUDA-graph capture), notebooks 30-300 s (the load comes when someone runs a
      cell);
    - the pod's memory is taken when its containers start (the CUDA context and the weights come
      before the compute), and a pod that does not fit dies then;
    - the agent reads the allocation at its first sample after admission and the load as the
      mean utilization since its previous sample (5 s), so a load shows fully one sample after
      it arrives; its write limiter decides when either is published.
    """

    admission_delay_s: float = 1.0
    image_cached_share: float = 0.6
    cached_start_s: tuple[float, float] = (1.0, 4.0)
    pull_median_s: float = 75.0
    pull_sigma: float = 0.7
    pull_max_s: float = 900.0
    # (kind, shortest, longest) ramp in seconds.
    ramp_s: tuple[tuple[WorkloadKind, float, float], ...] = (
        ("training", 20.0, 120.0),
        ("inference", 15.0, 90.0),
        ("shared-inference", 15.0, 90.0),
        ("notebook", 30.0, 300.0),
    )

    def ramp_range_s(self, kind: WorkloadKind) -> tuple[float, float]:
        for candidate, low, high in self.ramp_s:
            if candidate == kind:
                return low, high
        raise ValueError(f"no ramp for workload kind {kind!r}")

    def start_delay_s(self, rng: random.Random) -> float:
        """One draw of admission -> containers running."""
        if rng.random() < self.image_cached_share:
            return rng.uniform(*self.cached_start_s)
        pull = rng.lognormvariate(math.log(self.pull_median_s), self.pull_sigma)
        return min(self.pull_max_s, pull)


LAG_MODEL: Final = LagModel()


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
    # Share of the offered load that comes in bursts (training jobs whose workers arrive within
    # a second, inference scale-ups adding replicas at once), and of those the jobs' share.
    burst_share: float = 0.35
    job_share_of_bursts: float = 0.5
    # Share of nodes with episodes of GPU work the scheduler does not account for, and of those
    # episodes the share that loads every GPU of the node (the rest load one to half of them).
    unaccounted_share: float = 0.25
    unaccounted_all_gpus_share: float = 0.3
    hot_share: float = 0.05
    pools: tuple[Pool, ...] = DEFAULT_POOLS
    write_policy: WritePolicy = field(default_factory=WritePolicy)
    # The scorer's policy; each scorer variant sets `blind_device_plugin` its own way.
    scorer_policy: Policy = field(default_factory=Policy)
    lag: LagModel = LAG_MODEL
    # Every pod declares `max-utilization` = the scorer's utilization limit less its own load
    # (at least `MIN_DECLARED_MAX_UTILIZATION`): "a GPU with room for my load". Off by default:
    # an experiment on what the scorer would do if it counted the pod's own load.
    declare_max_utilization: bool = False
    # Fleet-wide series (fragmentation, pending pods) are sampled this often.
    sample_every_s: float = 60.0


@dataclass(frozen=True, slots=True)
class Traffic:
    """A replica's load over time: its Deployment's base load times the traffic swing at that
    time, plus the replica's own offset (module constants `TRAFFIC_*`, `REPLICA_SPREAD`)."""

    base: float
    phase: float
    offset: float

    def load_at(self, time_s: float) -> float:
        swing = 1.0 + TRAFFIC_SWING * math.sin(2 * math.pi * time_s / TRAFFIC_PERIOD_S + self.phase)
        return round(min(1.0, max(0.02, self.base * swing + self.offset)), 3)


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
    # The pod's `expected-gpu-load` hint (utilization per GPU unit), if it gives one.
    expected_gpu_load: float | None = None
    # The pod's `max-utilization` hint, if it gives one.
    max_utilization: float | None = None
    # The job or scale-up the pod came with; "" for a pod of the Poisson stream.
    burst: str = ""
    # The workload it shares with its siblings (a Deployment, a Job); "" for a pod without.
    workload: str = ""
    # The lag model's draws: admission to containers running (image pull and start), and
    # containers running to load on the GPUs (the ramp).
    start_delay_s: float = 0.0
    ramp_s: float = 0.0
    # A Deployment's replica: its load follows the Deployment's traffic while it runs
    # (`Traffic`); `utilization` is its load at arrival. None: a constant load.
    traffic: Traffic | None = None

    def load_at(self, time_s: float) -> float:
        """The pod's load per GPU slot at `time_s` (its true mean load then)."""
        return self.utilization if self.traffic is None else self.traffic.load_at(time_s)

    @property
    def burst_kind(self) -> BurstKind | None:
        if not self.burst:
            return None
        return "job" if self.burst.startswith("job-") else "scale-up"

    def annotations(self) -> dict[str, str]:
        prefix = DEFAULT_KEYS.prefix
        out: dict[str, str] = {}
        if self.chain:
            out[prefix + MODEL_PREFERENCE] = ",".join(self.chain)
        if self.fallback_utilization is not None:
            out[prefix + FALLBACK_UTILIZATION] = f"{self.fallback_utilization:.2f}"
        if self.declares_memory:
            out[prefix + MIN_GPU_MEMORY_MIB] = str(self.memory_mib)
        if self.expected_gpu_load is not None:
            out[prefix + EXPECTED_GPU_LOAD] = f"{self.expected_gpu_load:.2f}"
        if self.max_utilization is not None:
            out[prefix + MAX_UTILIZATION] = f"{self.max_utilization:.2f}"
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


def accepts_model(pod: PodRequest, model_name: str) -> bool:
    """Whether the pod may run on this model at all: it names no chain, or its chain lists the
    model (or ends with `*`)."""
    return not pod.chain or chain_rank(model_name, pod.chain) < len(pod.chain)


def short_of_suitable(
    pod: PodRequest,
    chosen: NodeTruth,
    feasible: Sequence[NodeTruth],
    *,
    utilization_limit: float,
    temperature_limit_c: float,
) -> bool:
    """Whether the pod went to a node with fewer suitable GPUs than it asks (`suitable_gpus`,
    slots held by pods bound before it counting as taken) while another node allocation
    accounting allowed, of a model the pod accepts, had enough: a placement a scheduler that
    knew what was bound could have avoided."""
    limits = {"utilization_limit": utilization_limit, "temperature_limit_c": temperature_limit_c}
    if not chosen.gpus or suitable_gpus(chosen, pod, **limits) >= pod.gpus:
        return False
    return any(
        n.name != chosen.name
        and accepts_model(pod, n.model_name)
        and suitable_gpus(n, pod, **limits) >= pod.gpus
        for n in feasible
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
# (kind, share of pods, mean GPUs, mean run time in s): the Poisson stream's mix.
WORKLOADS: Final[tuple[tuple[WorkloadKind, float, float, float], ...]] = (
    ("training", 0.35, sum(g * w for g, w in _TRAINING_GPUS), 2400.0),
    ("inference", 0.40, 1.0, 1800.0),
    ("shared-inference", 0.10, 2.0, 1800.0),
    ("notebook", 0.15, sum(g * w for g, w in _NOTEBOOK_GPUS), 1200.0),
)
# A training job: (workers, weight) and (GPUs per worker, weight). A job's workers are copies of
# one template (GPUs, memory, load, chain, run time) and arrive within `JOB_SPREAD_S`.
JOB_WORKERS: Final = ((2, 0.4), (3, 0.2), (4, 0.4))
JOB_WORKER_GPUS: Final = ((2, 0.3), (4, 0.4), (8, 0.3))
JOB_SPREAD_S: Final = 1.0
# An inference scale-up: (replicas, weight), of an inference template (1 GPU) or, for this
# share, a shared-inference one (2 time-sliced GPUs); the ReplicaSet controller creates the
# replicas within `SCALE_UP_SPREAD_S` (its slow-start batches take milliseconds each).
SCALE_UP_REPLICAS: Final = ((3, 0.3), (4, 0.3), (6, 0.25), (8, 0.15))
SCALE_UP_SHARED_SHARE: Final = 0.3
SCALE_UP_SPREAD_S: Final = 0.2


# Inference Deployments: the stream's single inference pods and the scale-ups are replicas of
# these (a fleet serves a few dozen models, not one per pod). Replicas of one Deployment share
# its template (GPUs, memory, chain) and its load, which moves with traffic: at time t each
# running replica carries the Deployment's base load times `1 + TRAFFIC_SWING x sin(2 pi t /
# period + phase)`, with a little spread between replicas (`REPLICA_SPREAD`, fixed per
# replica). A load balancer spreads the requests over the replicas, so their loads rise and fall
# together (`Traffic`), and a new replica carries what its siblings carry then.
INFERENCE_DEPLOYMENTS: Final = 24
SHARED_DEPLOYMENTS: Final = 8
TRAFFIC_SWING: Final = 0.3
TRAFFIC_PERIOD_S: Final = 2 * 3600.0
REPLICA_SPREAD: Final = 0.05


# An idle GPU reads a few hundredths busy (sampling noise): a declared `max-utilization` below
# this would refuse idle GPUs too.
MIN_DECLARED_MAX_UTILIZATION: Final = 0.05


def _mean(choices: Sequence[tuple[int, float]]) -> float:
    return sum(v * w for v, w in choices) / sum(w for _, w in choices)


def _draw(rng: random.Random, choices: Sequence[tuple[int, float]]) -> int:
    return rng.choices([v for v, _ in choices], [w for _, w in choices])[0]


def _run_mean_s(kind: WorkloadKind) -> float:
    return next(run_s for k, _, _, run_s in WORKLOADS if k == kind)


def _template(kind: WorkloadKind, rng: random.Random, *, gpus: int | None = None) -> PodRequest:
    """One pod of `kind` with its own draws (name and arrival filled in by the caller)."""
    declares = rng.random() < 0.7
    pick = rng.random()
    if kind == "training":
        chain: tuple[str, ...] = (
            ("A100", "H100") if pick < 0.5 else ("H100", "A100") if pick < 0.7 else ()
        )
        return PodRequest(
            name="",
            arrival_s=0.0,
            gpus=gpus if gpus is not None else _draw(rng, _TRAINING_GPUS),
            memory_mib=int(rng.uniform(16_000, 70_000)),
            utilization=rng.uniform(0.85, 0.98),
            run_s=rng.expovariate(1 / _run_mean_s(kind)),
            chain=chain,
            fallback_utilization=0.80 if chain else None,
            declares_memory=declares,
            kind=kind,
        )
    if kind == "inference":
        chain = ("L4", "T4") if pick < 0.4 else ("A100", "V100") if pick < 0.6 else ()
        return PodRequest(
            name="",
            arrival_s=0.0,
            gpus=1,
            memory_mib=int(rng.uniform(4_000, 14_000)),
            utilization=rng.uniform(0.15, 0.55),
            run_s=rng.expovariate(1 / _run_mean_s(kind)),
            chain=chain,
            fallback_utilization=0.80 if chain else None,
            declares_memory=declares,
            kind=kind,
        )
    if kind == "shared-inference":
        # A tensor-parallel replica over two time-sliced GPUs, sharing each with others. No pod
        # of the stream hints its load (`expected-gpu-load`): the scorer learns it or assumes.
        utilization = round(rng.uniform(0.25, 0.45), 2)
        return PodRequest(
            name="",
            arrival_s=0.0,
            gpus=2,
            memory_mib=int(rng.uniform(5_000, 11_000)),
            utilization=utilization,
            run_s=rng.expovariate(1 / _run_mean_s(kind)),
            chain=("L4", "T4"),
            fallback_utilization=0.80,
            declares_memory=True,
            kind=kind,
        )
    return PodRequest(
        name="",
        arrival_s=0.0,
        gpus=_draw(rng, _NOTEBOOK_GPUS),
        memory_mib=int(rng.uniform(2_000, 30_000)),
        utilization=rng.uniform(0.05, 0.30),
        run_s=rng.expovariate(1 / _run_mean_s(kind)),
        declares_memory=declares,
        kind=kind,
    )


def _stream(rng: random.Random, rate_per_s: float, duration_s: float) -> list[PodRequest]:
    """A Poisson stream of single pods of the `WORKLOADS` mix."""
    bounds = list(itertools.accumulate(share for _, share, _, _ in WORKLOADS))
    pods: list[PodRequest] = []
    t = 0.0
    while rate_per_s > 0:
        t += rng.expovariate(rate_per_s)
        if t >= duration_s:
            break
        draw = rng.random()
        kind: WorkloadKind = WORKLOADS[-1][0]
        for (candidate, *_), bound in zip(WORKLOADS, bounds, strict=True):
            if draw < bound:
                kind = candidate
                break
        pods.append(replace(_template(kind, rng), name=f"pod-{len(pods):05d}", arrival_s=t))
    return pods


def _bursts(
    rng: random.Random, kind: BurstKind, rate_per_s: float, duration_s: float
) -> list[PodRequest]:
    """Poisson-timed bursts: training jobs (N workers of one template within a second) or
    inference scale-ups (R replicas of one template at once, each with its own run time)."""
    pods: list[PodRequest] = []
    t = 0.0
    index = 0
    while rate_per_s > 0:
        t += rng.expovariate(rate_per_s)
        if t >= duration_s:
            break
        burst = f"{kind}-{index:04d}"
        index += 1
        if kind == "job":
            template = _template("training", rng, gpus=_draw(rng, JOB_WORKER_GPUS))
            for worker in range(_draw(rng, JOB_WORKERS)):
                arrival = t + rng.uniform(0.0, JOB_SPREAD_S)
                pods.append(
                    replace(template, name=f"{burst}-w{worker}", arrival_s=arrival, burst=burst)
                )
        else:
            shared = rng.random() < SCALE_UP_SHARED_SHARE
            template = _template("shared-inference" if shared else "inference", rng)
            for replica in range(_draw(rng, SCALE_UP_REPLICAS)):
                pods.append(
                    replace(
                        template,
                        name=f"{burst}-r{replica}",
                        arrival_s=t + rng.uniform(0.0, SCALE_UP_SPREAD_S),
                        run_s=rng.expovariate(1 / _run_mean_s(template.kind)),
                        burst=burst,
                    )
                )
    return pods


def make_pods(config: PlacementConfig, nodes: Sequence[NodeSetup]) -> list[PodRequest]:
    """The pod stream sized to `offered_load`: a Poisson stream of the `WORKLOADS` mix and,
    for `burst_share` of the load, jobs and scale-ups; each pod with its lag-model draws.
    Sorted by arrival."""
    slots = sum(n.gpu_count * n.slots_per_gpu for n in nodes)
    offered_gpus = config.offered_load * slots  # GPU slots busy on average
    # GPU-seconds one pod (or one burst) asks on average, for the rates that offer the load.
    stream_gpu_s = sum(share * gpus * run_s for _, share, gpus, run_s in WORKLOADS)
    job_gpu_s = _mean(JOB_WORKERS) * _mean(JOB_WORKER_GPUS) * _run_mean_s("training")
    scale_up_gpu_s = _mean(SCALE_UP_REPLICAS) * (
        (1 - SCALE_UP_SHARED_SHARE) * _run_mean_s("inference")
        + SCALE_UP_SHARED_SHARE * 2 * _run_mean_s("shared-inference")
    )
    bursts = config.burst_share
    jobs = bursts * config.job_share_of_bursts
    pods = [
        *_stream(
            random.Random(config.seed * 31 + 1),
            (1 - bursts) * offered_gpus / stream_gpu_s,
            config.duration_s,
        ),
        *_bursts(
            random.Random(config.seed * 43 + 2),
            "job",
            jobs * offered_gpus / job_gpu_s,
            config.duration_s,
        ),
        *_bursts(
            random.Random(config.seed * 47 + 3),
            "scale-up",
            (bursts - jobs) * offered_gpus / scale_up_gpu_s,
            config.duration_s,
        ),
    ]
    pods.sort(key=lambda p: (p.arrival_s, p.name))
    pods = _as_workloads(pods, random.Random(config.seed * 59 + 5))
    lag = config.lag
    lag_rng = random.Random(config.seed * 53 + 4)
    limit = config.scorer_policy.utilization_limit
    out: list[PodRequest] = []
    for drawn in pods:
        start_delay_s = lag.start_delay_s(lag_rng)
        pod = replace(
            drawn,
            start_delay_s=start_delay_s,
            ramp_s=lag_rng.uniform(*lag.ramp_range_s(drawn.kind)),
        )
        if config.declare_max_utilization:
            room = math.floor((limit - pod.utilization) * 100) / 100
            pod = replace(pod, max_utilization=max(MIN_DECLARED_MAX_UTILIZATION, room))
        out.append(pod)
    return out


def _as_workloads(pods: Sequence[PodRequest], rng: random.Random) -> list[PodRequest]:
    """Each pod in its workload: a job's workers in their Job (alike already), every inference
    pod and scale-up in one of the Deployments (their template and traffic-driven load), the
    rest (training pods of the stream, notebooks) without siblings."""
    deployments: dict[WorkloadKind, list[tuple[PodRequest, float]]] = {}
    kinds: tuple[tuple[WorkloadKind, int], ...] = (
        ("inference", INFERENCE_DEPLOYMENTS),
        ("shared-inference", SHARED_DEPLOYMENTS),
    )
    for kind, count in kinds:
        deployments[kind] = [
            (_template(kind, rng), rng.uniform(0.0, 2 * math.pi)) for _ in range(count)
        ]
    chosen: dict[str, int] = {}  # a scale-up's Deployment
    out: list[PodRequest] = []
    for pod in pods:
        if pod.burst_kind == "job":
            out.append(replace(pod, workload=f"job/{pod.burst}"))
            continue
        if pod.kind not in deployments:
            out.append(pod)
            continue
        pool = deployments[pod.kind]
        if pod.burst:
            index = chosen.setdefault(pod.burst, rng.randrange(len(pool)))
        else:
            index = rng.randrange(len(pool))
        template, phase = pool[index]
        offset = rng.uniform(-REPLICA_SPREAD, REPLICA_SPREAD)
        follows = Traffic(template.utilization, phase, offset)
        out.append(
            replace(
                pod,
                utilization=follows.load_at(pod.arrival_s),
                traffic=follows,
                memory_mib=template.memory_mib,
                chain=template.chain,
                fallback_utilization=template.fallback_utilization,
                workload=f"deploy/{pod.kind}-{index:02d}",
            )
        )
    return out


def lag_summary(pods: Sequence[PodRequest], config: PlacementConfig) -> dict[str, float]:
    """The lag model's figures over a stream: what the docs quote, from the draws themselves.

    `load_after_delay_share`: pods whose load reaches the agent's window only after the
    scorer's `inflight_load_delay_s` has passed since their containers started (ramp plus one
    sample interval): for those, the scorer stops counting the load before the node shows it.
    """
    if not pods:
        return {}
    start = np.asarray([p.start_delay_s for p in pods])
    ramp = np.asarray([p.ramp_s for p in pods])
    delay_s = config.scorer_policy.inflight_load_delay_s
    bind_to_load = config.lag.admission_delay_s + start + ramp
    return {
        "admission_delay_s": config.lag.admission_delay_s,
        "start_delay_p50_s": float(np.percentile(start, 50)),
        "start_delay_p90_s": float(np.percentile(start, 90)),
        "start_delay_max_s": float(start.max()),
        "ramp_p50_s": float(np.percentile(ramp, 50)),
        "ramp_p90_s": float(np.percentile(ramp, 90)),
        "bind_to_load_p50_s": float(np.percentile(bind_to_load, 50)),
        "bind_to_load_p90_s": float(np.percentile(bind_to_load, 90)),
        "load_after_delay_share": float(np.mean(ramp + config.interval_s > delay_s)),
        "burst_pods": float(sum(bool(p.burst) for p in pods)),
        "pods": float(len(pods)),
    }


# ----------------------------------------------------------------------------------------------
# The simulation


@dataclass(slots=True)
class _Node:
    setup: NodeSetup
    total_mib: int
    # Per GPU: the load and memory of the pods whose load (memory) has arrived, and how many
    # slots are taken by pods bound to it (the scheduler's and the device plugin's view: a slot
    # is taken from the bind on).
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
    # Per GPU: slots of admitted pods, what the kubelet reports as allocated (default: every
    # tenant admitted).
    allocated: list[int] = field(default_factory=list)
    # Per GPU: utilization summed over the seconds since the agent's last sample, and how many.
    util_acc: list[float] = field(default_factory=list)
    acc_s: int = 0
    # The pods bound to the node as the scorer's Pod watch (and its proposals) give them.
    bound: dict[str, BoundPod] = field(default_factory=dict)
    pods_view: tuple[BoundPod, ...] = NO_PODS
    # Per GPU: the kubelet's device IDs of its shares (built at the first reading).
    share_ids: list[list[str]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.allocated:
            self.allocated = list(self.tenants)
        if not self.util_acc:
            self.util_acc = [0.0] * self.setup.gpu_count

    @property
    def free_slots(self) -> int:
        return self.setup.gpu_count * self.setup.slots_per_gpu - sum(self.tenants)

    def gpu_util(self, g: int) -> float:
        return min(1.0, self.util[g] + self.bg_util[g])

    def window_util(self, g: int) -> float:
        """GPU `g`'s mean utilization since the agent's last sample (what NVML's samples since
        then average to); the current value before any second has passed."""
        return self.util_acc[g] / self.acc_s if self.acc_s else self.gpu_util(g)

    def utilization(self) -> float:
        return sum(self.gpu_util(g) for g in range(self.setup.gpu_count)) / self.setup.gpu_count

    def gpu_free_mib(self, g: int) -> int:
        return max(0, self.total_mib - self.mem_mib[g] - self.bg_mem_mib[g])

    def set_bound(self, pod: BoundPod) -> None:
        self.bound[pod.name] = pod
        self.pods_view = tuple(self.bound.values())

    def drop_bound(self, name: str) -> None:
        if self.bound.pop(name, None) is not None:
            self.pods_view = tuple(self.bound.values())

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
        """The node as it really is: a slot is taken from its pod's bind (the device plugin's
        pick is fixed by then), load and memory count once they have arrived."""
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
    # Pods whose memory did not fit on a GPU they were given, when their containers started.
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
    # Placements short of suitable GPUs while another accepted node had enough
    # (`short_of_suitable`), of all pods and of the pods of bursts.
    short_placements: int = 0
    burst_short_placements: int = 0
    # GPUs the pod's load took above the utilization limit on top of other work there, when its
    # load arrived; of those, GPUs whose other work was unaccounted (no other pod's load on
    # it), and GPUs pushed by pods of bursts.
    gpus_pushed_over_limit: int = 0
    gpus_pushed_over_limit_unaccounted: int = 0
    gpus_pushed_over_limit_burst: int = 0
    # Every pushed GPU by what its other work was, seen from the pod's bind (`PUSH_CAUSES`).
    gpus_pushed_over_limit_by_cause: dict[PushCause, int] = field(
        default_factory=lambda: dict.fromkeys(PUSH_CAUSES, 0)
    )
    # Every pushed GPU by the pushing pod's own-load estimate (`_estimate_label`).
    gpus_pushed_over_limit_by_estimate: dict[str, int] = field(default_factory=dict)
    # Placed pods by workload kind (the stream's mix), and placed pods of more than one GPU.
    placed_by_kind: dict[str, int] = field(default_factory=dict)
    placed_multi_gpu: int = 0
    burst_pods: int = 0
    burst_placed: int = 0
    hot_placements: int = 0
    pending_at_end: int = 0
    # Of those: pods that named a model chain, pods of 4 or more GPUs, pods of bursts.
    pending_with_chain: int = 0
    pending_multi_gpu: int = 0
    pending_burst: int = 0
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
            "short_placements": self.short_placements,
            "burst_short_placements": self.burst_short_placements,
            "gpus_pushed_over_limit": self.gpus_pushed_over_limit,
            "gpus_pushed_over_limit_unaccounted": self.gpus_pushed_over_limit_unaccounted,
            "gpus_pushed_over_limit_burst": self.gpus_pushed_over_limit_burst,
            "gpus_pushed_over_limit_by_cause": dict(self.gpus_pushed_over_limit_by_cause),
            "gpus_pushed_over_limit_by_estimate": dict(
                sorted(self.gpus_pushed_over_limit_by_estimate.items())
            ),
            "placed_multi_gpu": self.placed_multi_gpu,
            "placed_by_kind": dict(sorted(self.placed_by_kind.items())),
            "burst_pods": self.burst_pods,
            "burst_placed": self.burst_placed,
            "hot_placements": self.hot_placements,
            "pending_at_end": self.pending_at_end,
            "pending_with_chain": self.pending_with_chain,
            "pending_multi_gpu": self.pending_multi_gpu,
            "pending_burst": self.pending_burst,
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
    inflight: bool = False,
    learned: Learned | None = None,
) -> dict[str, float]:
    """The scorer's filter and scores over what each agent last wrote (with `per_gpu` False,
    without the per-GPU keys, as a node-level reader has it), with each node's bound pods when
    `inflight` (as the scorer's Pod watch gives them)."""
    inputs = [
        NodeInput(
            name=n.setup.name,
            annotations=n.annotations if per_gpu else n.node_level,
            agent_write_time=n.write_time,
            pods=n.pods_view if inflight else NO_PODS,
        )
        for n in candidates
    ]
    evaluation = evaluate(
        PodInput(
            namespace=SIM_NAMESPACE,
            name=pod.name,
            annotations=pod_annotations,
            gpu_request=pod.gpus,
            uid=pod.name,
            learned=learned,
        ),
        inputs,
        now,
        policy,
    )
    passed = set(evaluation.passed_names())
    return {name: float(score) for name, score in evaluation.scores() if name in passed}


_WITHOUT_OWN_LOAD: dict[int, Policy] = {}


def _without_own_load(policy: Policy) -> Policy:
    """`policy` with own load off, one object per policy (the scorer's pod classes are keyed
    by the policy's identity, so a fresh copy per call would compile a class per pod)."""
    off = _WITHOUT_OWN_LOAD.get(id(policy))
    if off is None:
        off = _WITHOUT_OWN_LOAD[id(policy)] = replace(policy, own_load=False)
    return off


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
    learner: WorkloadLoads | None = None,
) -> _Node | None:
    if not candidates:
        return None
    scores: dict[str, float]
    variant = SCORER_VARIANTS.get(policy)
    if variant is not None:
        if scorer_policy.blind_device_plugin != variant.blind_device_plugin:
            scorer_policy = replace(scorer_policy, blind_device_plugin=variant.blind_device_plugin)
        learned: Learned | None = None
        if variant.own_load == "off":
            scorer_policy = _without_own_load(scorer_policy)
        elif variant.own_load == "oracle":
            load = pod.load_at((now - EPOCH).total_seconds())
            learned = Learned(round(load * BASIS_POINTS), pod.memory_mib, 1, 1)
        elif variant.own_load == "learned" and learner is not None and pod.workload:
            learned = learner.learned_for(f"{SIM_NAMESPACE}/{pod.workload}", now)
        scores = _score_project(
            pod,
            pod_annotations,
            candidates,
            now,
            scorer_policy,
            per_gpu=variant.per_gpu_keys,
            inflight=variant.inflight,
            learned=learned,
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


def _estimate_label(
    policy: PolicyName,
    pod: PodRequest,
    scorer_policy: Policy,
    learner: WorkloadLoads | None,
    now: datetime,
) -> str:
    """The source of the scorer's estimate of `pod`'s own load (learned, default, oracle, off,
    or the policy's name for policies without one), and for learned and default estimates
    whether it was below the pod's true load (`-under`) or not (`-covered`)."""
    variant = SCORER_VARIANTS.get(policy)
    if variant is None or variant.own_load in ("off", "oracle"):
        return policy if variant is None else variant.own_load
    learned = None
    if variant.own_load == "learned" and learner is not None and pod.workload:
        learned = learner.learned_for(f"{SIM_NAMESPACE}/{pod.workload}", now)
    if learned is not None and learned.utilization_bp is not None:
        source, estimate = "learned", learned.utilization_bp / BASIS_POINTS
    else:
        source, estimate = "default", scorer_policy.own_load_gpu_load
    truth = pod.load_at((now - EPOCH).total_seconds())
    return f"{source}-{pod.kind}-" + ("under" if estimate < truth else "covered")


def _memory_fits(node: _Node, gpus: Sequence[int], memory_mib: int) -> bool:
    """Whether a pod taking `memory_mib` per slot on `gpus` (a GPU listed once per slot) fits in
    what those GPUs have free now."""
    need: dict[int, int] = {}
    for g in gpus:
        need[g] = need.get(g, 0) + memory_mib
    return all(node.gpu_free_mib(g) >= mib for g, mib in need.items())


def _assign(node: _Node, pod: PodRequest) -> tuple[list[int], bool]:
    """The device plugin's pick: slots on the least-shared GPUs, lowest index first, blind to
    load; and whether the pod's memory fits on them now."""
    slots = node.setup.slots_per_gpu
    tenants = list(node.tenants)
    chosen: list[int] = []
    for _ in range(pod.gpus):
        g = min(
            (i for i in range(node.setup.gpu_count) if tenants[i] < slots),
            key=lambda i: (tenants[i], i),
        )
        tenants[g] += 1
        chosen.append(g)
    return chosen, _memory_fits(node, chosen, pod.memory_mib)


# What happens to a bound pod, in this order when due in the same second: a pod that ends
# frees its slots before another is admitted to them.
_END, _ADMIT, _START, _LOAD = 0, 1, 2, 3
_EPSILON: Final = 1e-9


@dataclass(slots=True)
class _Placed:
    """A pod from its bind to its end: where it went and how far it has got."""

    pod: PodRequest
    node: _Node
    gpus: list[int]
    record: BoundPod
    bound_s: float
    # Per GPU of the node at the bind: the real utilization, and whether unaccounted work ran.
    util_at_bind: tuple[float, ...]
    unaccounted_at_bind: tuple[bool, ...]
    started: bool = False
    fits: bool = True
    loaded_s: float | None = None
    # The load per slot it adds to its GPUs now (from its load's arrival; `PodRequest.load_at`).
    load: float = 0.0
    ended: bool = False
    # Where the scorer's estimate of the pod's own load came from, and whether it was below
    # the pod's true load (`_estimate_label`).
    estimate: str = ""

    @property
    def loaded(self) -> bool:
        return self.loaded_s is not None


def bound_pod(pod: PodRequest, node: str, bound_at: datetime, *, provisional: bool) -> BoundPod:
    """The pod as the scorer's Pod watch (or, `provisional`, its own proposal) records it."""
    load = pod.expected_gpu_load
    return BoundPod(
        namespace=SIM_NAMESPACE,
        name=pod.name,
        uid=pod.name,
        node=node,
        gpus=pod.gpus,
        bound_at=bound_at,
        gpu_load_bp=None if load is None else round(load * BASIS_POINTS),
        memory_mib=pod.memory_mib if pod.declares_memory else None,
        provisional=provisional,
        workload=f"{SIM_NAMESPACE}/{pod.workload}" if pod.workload else None,
    )


class _Run:
    """One policy's run, a second at a time (`step`): the fleet, the pods waiting and pending,
    the bound pods' events, and the counts."""

    def __init__(
        self,
        config: PlacementConfig,
        policy: PolicyName,
        *,
        setups: Sequence[NodeSetup] | None = None,
        pods: Sequence[PodRequest] | None = None,
    ) -> None:
        setups = make_nodes(config) if setups is None else setups
        pods = (
            make_pods(config, setups) if pods is None else sorted(pods, key=lambda p: p.arrival_s)
        )
        phase_rng = random.Random(config.seed * 17 + 3)
        self.noise = np.random.default_rng(config.seed * 13 + 5)
        self.choice_rng = random.Random(config.seed * 19 + 7)
        interval = config.interval_s
        self.nodes = [
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
        self.config = config
        self.policy = policy
        self.result = PlacementResult(
            policy=policy,
            pods=len(pods),
            interval_s=interval,
            burst_pods=sum(bool(p.burst) for p in pods),
        )
        self.arrivals = deque(pods)
        # (pod, next try time, attempts so far)
        self.queue: list[tuple[PodRequest, float, int]] = []
        self.annotations_of = {p.name: p.annotations() for p in pods}
        self.next_sample_s = 0.0
        self.alpha = 1.0 - math.exp(-1.0 / THERMAL_TIME_CONSTANT_S)
        # (time, kind, sequence, pod) of what happens next to the bound pods.
        self.events: list[tuple[float, int, int, _Placed]] = []
        # The loaded replicas whose load follows traffic (`_follow_traffic`).
        self.following: list[_Placed] = []
        self.seq = itertools.count()
        # The pods bound to each node, by name.
        self.on_node: dict[str, dict[str, _Placed]] = {n.setup.name: {} for n in self.nodes}
        # What the scorer learns of each workload from the agents' `pod-gpu-usage` and its Pod
        # watch (the real store), for the policy that learns.
        variant = SCORER_VARIANTS.get(policy)
        self.learner = (
            WorkloadLoads(
                keys_prefix=DEFAULT_KEYS.prefix,
                load_delay_s=config.scorer_policy.inflight_load_delay_s,
                settle_floor=config.scorer_policy.own_load_gpu_load,
            )
            if variant is not None and variant.own_load == "learned"
            else None
        )

    def push(self, time_s: float, kind: int, placed: _Placed) -> None:
        # Events happen on the sim's whole-second steps: the first step at or after `time_s`.
        heapq.heappush(self.events, (float(math.ceil(time_s)), kind, next(self.seq), placed))

    def due(self, t: float) -> None:
        """Every event due by `t`: admissions, container starts, loads arriving, ends."""
        limit_u = self.config.scorer_policy.utilization_limit
        while self.events and self.events[0][0] <= t:
            time_s, kind, _, placed = heapq.heappop(self.events)
            if placed.ended:
                continue
            node, pod = placed.node, placed.pod
            at = EPOCH + timedelta(seconds=time_s)
            if kind == _ADMIT:
                # The kubelet admitted the pod: the device plugin's allocation is what the
                # agent reads from now on, and `status.startTime` is set.
                for g in placed.gpus:
                    node.allocated[g] += 1
                placed.record = msgspec.structs.replace(placed.record, admitted_at=at)
                node.set_bound(placed.record)
                self.push(time_s + pod.start_delay_s, _START, placed)
            elif kind == _START:
                self._start(placed, time_s, at)
            elif kind == _LOAD:
                before = [node.gpu_util(g) for g in range(node.setup.gpu_count)]
                load = pod.load_at(time_s)
                pushed = pushed_over_limit(before, placed.gpus, load, limit_u)
                result = self.result
                result.gpus_pushed_over_limit += len(pushed)
                result.gpus_pushed_over_limit_unaccounted += sum(
                    node.util[g] <= _EPSILON for g in pushed
                )
                if pod.burst:
                    result.gpus_pushed_over_limit_burst += len(pushed)
                for g in pushed:
                    cause = self._push_cause(placed, g, limit_u)
                    result.gpus_pushed_over_limit_by_cause[cause] += 1
                by_estimate = result.gpus_pushed_over_limit_by_estimate
                by_estimate[placed.estimate] = by_estimate.get(placed.estimate, 0) + len(pushed)
                for g in placed.gpus:
                    node.util[g] += load
                placed.loaded_s, placed.load = time_s, load
                if pod.traffic is not None:
                    self.following.append(placed)
            else:
                self._end(placed)

    def _follow_traffic(self, t: float) -> None:
        """The running replicas' loads follow their Deployments' traffic (every agent interval:
        the traffic moves over hours)."""
        following: list[_Placed] = []
        for placed in self.following:
            if placed.ended:
                continue
            load = placed.pod.load_at(t)
            if load != placed.load:
                util = placed.node.util
                for g in placed.gpus:
                    util[g] += load - placed.load
                placed.load = load
            following.append(placed)
        self.following = following

    def _push_cause(self, placed: _Placed, g: int, limit: float) -> PushCause:
        """What the other work on GPU `g` was, from the viewpoint of the pod's bind."""
        node = placed.node
        others = [
            q
            for q in self.on_node[node.setup.name].values()
            if q is not placed and q.loaded_s is not None and g in q.gpus
        ]
        if any(q.bound_s <= placed.bound_s < (q.loaded_s or 0.0) for q in others):
            return "in-flight"
        if placed.util_at_bind[g] > limit:
            return "busy-at-bind"
        if any(q.bound_s > placed.bound_s for q in others) or (
            node.bg_util[g] > 0 and not placed.unaccounted_at_bind[g]
        ):
            return "after-bind"
        return "within-limit"

    def _start(self, placed: _Placed, time_s: float, at: datetime) -> None:
        """Containers running: the pod's memory is taken; one that does not fit dies soon."""
        node, pod = placed.node, placed.pod
        placed.started = True
        placed.fits = _memory_fits(node, placed.gpus, pod.memory_mib)
        placed.record = msgspec.structs.replace(placed.record, running_since=at)
        node.set_bound(placed.record)
        if not placed.fits:
            result = self.result
            result.memory_fit_failures += 1
            result.memory_fit_failures_undeclared += not pod.declares_memory
            result.memory_fit_failures_multi_gpu += pod.gpus > 1
            self.push(time_s + CRASH_AFTER_S, _END, placed)
            return
        for g in placed.gpus:
            node.mem_mib[g] += pod.memory_mib
        self.push(time_s + pod.ramp_s, _LOAD, placed)
        self.push(time_s + pod.run_s, _END, placed)

    def _end(self, placed: _Placed) -> None:
        node, pod = placed.node, placed.pod
        placed.ended = True
        for g in placed.gpus:
            node.tenants[g] -= 1
            node.allocated[g] -= 1
            if placed.started and placed.fits:
                node.mem_mib[g] -= pod.memory_mib
            if placed.loaded:
                node.util[g] -= placed.load
        node.drop_bound(pod.name)
        self.on_node[node.setup.name].pop(pod.name, None)

    def bind(self, pod: PodRequest, chosen: _Node, t: float, now: datetime) -> _Placed:
        """The scheduler binds: the slots are taken (the device plugin's pick depends only on
        the allocations, so it is fixed now), and the scorer holds the pod as its own proposal
        until the bind shows in its watch (`visible`)."""
        gpus, _ = _assign(chosen, pod)
        count = chosen.setup.gpu_count
        placed = _Placed(
            pod,
            chosen,
            gpus,
            bound_pod(pod, chosen.setup.name, now, provisional=True),
            t,
            tuple(chosen.gpu_util(g) for g in range(count)),
            tuple(chosen.bg_util[g] > 0 for g in range(count)),
        )
        for g in gpus:
            chosen.tenants[g] += 1
        chosen.set_bound(placed.record)
        self.on_node[chosen.setup.name][pod.name] = placed
        self.push(t + self.config.lag.admission_delay_s, _ADMIT, placed)
        return placed

    @staticmethod
    def visible(placed: _Placed) -> None:
        """The bind is in the scorer's Pod watch: the proposal becomes the watch's record."""
        if not placed.ended and placed.record.provisional:
            placed.record = msgspec.structs.replace(placed.record, provisional=False)
            placed.node.set_bound(placed.record)

    def step(self, t: float) -> None:
        """One second: events due, load and temperatures, agents' samples and writes, arrivals,
        then one scheduling pass."""
        config, result, nodes = self.config, self.result, self.nodes
        scorer_policy = config.scorer_policy
        write_policy = config.write_policy
        limit_u = scorer_policy.utilization_limit
        limit_t = float(scorer_policy.temperature_limit_c)
        margin = write_policy.utilization_deadband
        interval, alpha, noise = config.interval_s, self.alpha, self.noise
        policy, arrivals = self.policy, self.arrivals
        now = EPOCH + timedelta(seconds=t)
        self.due(t)
        if t % interval == 0.0:
            self._follow_traffic(t)
        # Unaccounted load switches on and off; temperatures follow the load; each GPU's
        # utilization adds to the agent's window.
        for node in nodes:
            count = node.setup.gpu_count
            node.bg_util, node.bg_mem_mib = [0.0] * count, [0] * count
            for start, end, u, m, on in node.setup.episodes:
                if start <= t < end:
                    for g in on:
                        node.bg_util[g], node.bg_mem_mib[g] = u, int(m * node.total_mib)
                    break
            acc = node.util_acc
            for g in range(count):
                used = node.gpu_util(g)
                acc[g] += used
                target = node.setup.ambient_c + FULL_LOAD_RISE_C * used
                node.temperature_c[g] += alpha * (target - node.temperature_c[g])
            node.acc_s += 1
        # Agents whose tick falls in this second sample, aggregate, decide and maybe write.
        for node in nodes:
            if (t - node.phase_s) % interval != 0.0:
                continue
            state = aggregate(_reading(node, now, noise))
            state = dataclasses.replace(
                state, pods=_pod_usage(node, self.on_node[node.setup.name].values())
            )
            node.util_acc = [0.0] * node.setup.gpu_count
            node.acc_s = 0
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
                if self.learner is not None:
                    self.learner.set_pods(node.setup.name, node.pods_view)
                    self.learner.observe(
                        NodeInput(
                            node.setup.name,
                            node.annotations,
                            predecoded=(
                                DEFAULT_KEYS.prefix,
                                predecode(node.annotations, DEFAULT_KEYS),
                            ),
                        )
                    )
        while arrivals and arrivals[0].arrival_s <= t:
            pod = arrivals.popleft()
            self.queue.append((pod, pod.arrival_s, 0))
        # Scheduling: FIFO over the pods whose back-off has passed. The pods bound in this
        # second are the scorer's own proposals until the second ends (their binds reach its
        # watch milliseconds later), then bound pods of the watch.
        waiting: list[tuple[PodRequest, float, int]] = []
        proposed: list[_Placed] = []
        for pod, next_try, attempts in self.queue:
            if next_try > t:
                waiting.append((pod, next_try, attempts))
                continue
            feasible = [n for n in nodes if n.free_slots >= pod.gpus]
            chosen = _choose(
                policy,
                pod,
                pod_annotations=self.annotations_of[pod.name],
                candidates=feasible,
                now=now,
                scorer_policy=scorer_policy,
                rng=self.choice_rng,
                learner=self.learner,
            )
            if chosen is None:
                delay = backoff_s(attempts)
                waiting.append((pod, t + delay, attempts + 1))
                continue
            truths = [n.truth() for n in feasible]
            chosen_truth = next(tr for n, tr in zip(feasible, truths, strict=True) if n is chosen)
            _grade(
                result,
                pod,
                chosen,
                chosen_truth,
                feasible,
                truths,
                limit_u=limit_u,
                limit_t=limit_t,
                margin=margin,
            )
            result.waits_s.append(t - pod.arrival_s)
            placed = self.bind(pod, chosen, t, now)
            placed.estimate = _estimate_label(policy, pod, scorer_policy, self.learner, now)
            proposed.append(placed)
        for placed in proposed:
            self.visible(placed)
        self.queue = waiting
        if t >= self.next_sample_s:
            self.next_sample_s += config.sample_every_s
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
            result.pending.append(len(self.queue))

    def finish(self) -> PlacementResult:
        """The counts, with the pods still pending (waiting or not yet arrived) at the end."""
        result = self.result
        left = [p for p, _, _ in self.queue] + list(self.arrivals)
        result.pending_at_end = len(left)
        result.pending_with_chain = sum(bool(p.chain) for p in left)
        result.pending_multi_gpu = sum(p.gpus >= 4 for p in left)
        result.pending_burst = sum(bool(p.burst) for p in left)
        return result


def run(
    config: PlacementConfig, policy: PolicyName, *, pods: Sequence[PodRequest] | None = None
) -> PlacementResult:
    """Schedule the configured pod stream (or `pods`) with one policy; deterministic in
    `config.seed`."""
    sim = _Run(config, policy, pods=pods)
    for step in range(int(config.duration_s)):
        sim.step(float(step))
    return sim.finish()


def _grade(  # noqa: PLR0917 (the placement loop's locals, one call per placement)
    result: PlacementResult,
    pod: PodRequest,
    chosen: _Node,
    chosen_truth: NodeTruth,
    feasible: Sequence[_Node],
    truths: Sequence[NodeTruth],
    *,
    limit_u: float,
    limit_t: float,
    margin: float,
) -> None:
    """Grade one binding against the truth at that moment (memory fit and pushed GPUs are
    graded later, when the pod's containers start and its load arrives)."""
    limits = {"utilization_limit": limit_u, "temperature_limit_c": limit_t}
    verdict = judge(pod, chosen_truth, truths, fits_in_memory=True, **limits)
    clear = judge(pod, chosen_truth, truths, fits_in_memory=True, margin=margin, **limits)
    result.above_limit_clear += clear.above_limit
    result.chain_violations_clear += clear.chain_violation
    if verdict.above_limit or verdict.chain_violation:
        seen = _judge_published(pod, chosen, feasible, limit_u, limit_t)
        if seen is not None:
            result.above_limit_unseen += verdict.above_limit and not seen.above_limit
            result.chain_violations_unseen += verdict.chain_violation and not seen.chain_violation
    result.placed += 1
    result.above_limit += verdict.above_limit
    result.chain_pods += bool(pod.chain)
    result.chain_violations += verdict.chain_violation
    result.hot_placements += verdict.hot
    result.fewer_suitable += verdict.fewer_suitable
    if verdict.fewer_suitable:
        result.fewer_suitable_multi_gpu += pod.gpus > 1
        result.fewer_suitable_undeclared += not pod.declares_memory
        published = chosen.published()
        if published is not None and published.gpus:
            result.fewer_suitable_unseen += suitable_gpus(published, pod, **limits) >= pod.gpus
        if short_of_suitable(pod, chosen_truth, truths, **limits):
            result.short_placements += 1
            result.burst_short_placements += bool(pod.burst)
    result.placed_multi_gpu += pod.gpus > 1
    result.placed_by_kind[pod.kind] = result.placed_by_kind.get(pod.kind, 0) + 1
    result.burst_placed += bool(pod.burst)


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


def _pod_usage(node: _Node, placed: Iterable[_Placed]) -> tuple[PodUsage, ...]:
    """What the agent publishes of each pod on the node (`pod-gpu-usage`), once its containers
    run: the memory its processes hold, and its utilization: the whole GPU's window average on
    an exclusive GPU (NVML's per-process utilization is not needed there, and the agent
    attributes the GPU to its one pod: unaccounted work on it is counted as the pod's), its own
    load on a time-sliced one (per-process attribution; none yet while it ramps)."""
    exclusive = node.setup.slots_per_gpu == 1
    usage: list[PodUsage] = []
    for entry in sorted(placed, key=lambda q: q.pod.name):
        if not entry.started or not entry.fits or entry.ended:
            continue
        pod = entry.pod
        shares = tuple(
            GpuShare(
                g,
                round(min(1.0, node.window_util(g)), 2)
                if exclusive
                else (entry.load if entry.loaded else 0.0),
                pod.memory_mib,
            )
            for g in sorted(set(entry.gpus))
        )
        usage.append(PodUsage(f"{SIM_NAMESPACE}/{pod.name}", shares))
    return tuple(usage)


def _reading(node: _Node, now: datetime, noise: np.random.Generator) -> NodeReading:
    """What NVML would read on this node now (each GPU's mean utilization since the agent's
    last sample plus a little sampling noise, its memory and temperature now), and the
    kubelet's allocations: one share per slot (`UUID::n` replicas when time-sliced), the first
    `allocated` of them assigned."""
    setup = node.setup
    jitter = noise.normal(0.0, 0.015, size=setup.gpu_count).tolist()
    if not node.share_ids:
        node.share_ids = [
            [uuid]
            if setup.slots_per_gpu == 1
            else [f"{uuid}::{n}" for n in range(setup.slots_per_gpu)]
            for uuid in (f"GPU-{setup.name}-{g}" for g in range(setup.gpu_count))
        ]
    shares = frozenset(itertools.chain.from_iterable(node.share_ids))
    assigned = frozenset(
        itertools.chain.from_iterable(
            ids[:taken] for ids, taken in zip(node.share_ids, node.allocated, strict=True)
        )
    )
    gpus = tuple(
        GpuReading(
            uuid=f"GPU-{setup.name}-{g}",
            index=g,
            name=setup.model.name,
            utilization=round(min(1.0, max(0.0, node.window_util(g) + jitter[g])), 2),
            memory_total_mib=node.total_mib,
            memory_free_mib=node.gpu_free_mib(g),
            temperature_c=round(node.temperature_c[g]),
            mig_enabled=False,
        )
        for g in range(setup.gpu_count)
    )
    allocations = DeviceAllocations(shares, assigned)
    return NodeReading(
        sampled_at=now, gpus=gpus, device_count=setup.gpu_count, allocations=allocations
    )


def compare(
    config: PlacementConfig, policies: Sequence[PolicyName] = POLICIES, *, workers: int = 1
) -> dict[PolicyName, PlacementResult]:
    """Every policy on the same fleet, pod stream and seeds; with `workers` > 1, that many
    policies at a time in their own processes (each run is deterministic on its own)."""
    if workers <= 1 or len(policies) <= 1:
        return {p: run(config, p) for p in policies}
    with ProcessPoolExecutor(max_workers=min(workers, len(policies))) as pool:
        futures = {p: pool.submit(run, config, p) for p in policies}
        return {p: f.result() for p, f in futures.items()}


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m fleet_sim.placement --nodes 80 --duration-s 10800`: every policy, as JSON."""
    import argparse  # noqa: PLC0415  (only the command line needs it)
    import json  # noqa: PLC0415

    parser = argparse.ArgumentParser(prog="python -m fleet_sim.placement", description=__doc__)
    parser.add_argument("--nodes", type=int, default=80)
    parser.add_argument("--duration-s", type=float, default=3 * 3600.0)
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument(
        "--seeds",
        type=lambda text: [int(part) for part in text.split(",")],
        help="comma-separated seeds: one run per seed, JSON keyed by seed (overrides --seed)",
    )
    parser.add_argument("--offered-load", type=float, default=0.85)
    parser.add_argument("--burst-share", type=float, default=PlacementConfig().burst_share)
    parser.add_argument("--policy", choices=POLICIES, action="append")
    default_policy = Policy()
    parser.add_argument(
        "--inflight-load-delay-s", type=float, default=default_policy.inflight_load_delay_s
    )
    parser.add_argument(
        "--min-gpu-fit-probability", type=float, default=default_policy.min_gpu_fit_probability
    )
    parser.add_argument(
        "--own-load-gpu-load",
        type=float,
        default=default_policy.own_load_gpu_load,
        help="the scorer's default estimate of a pod's load per GPU (own_load_gpu_load)",
    )
    parser.add_argument(
        "--declare-max-utilization",
        action="store_true",
        help="every pod asks for GPUs with room for its own load (an experiment)",
    )
    parser.add_argument("--workers", type=int, default=1, help="policies run at a time")
    args = parser.parse_args(argv)
    base = PlacementConfig(
        nodes=args.nodes,
        duration_s=args.duration_s,
        seed=args.seed,
        offered_load=args.offered_load,
        burst_share=args.burst_share,
        declare_max_utilization=args.declare_max_utilization,
        scorer_policy=replace(
            default_policy,
            inflight_load_delay_s=args.inflight_load_delay_s,
            min_gpu_fit_probability=args.min_gpu_fit_probability,
            own_load_gpu_load=args.own_load_gpu_load,
        ),
    )
    policies = args.policy or POLICIES
    if args.seeds is None:
        results = compare(base, policies, workers=args.workers)
        print(json.dumps({p: r.summary() for p, r in results.items()}, indent=2))
        return 0
    # Several seeds: fleets, streams and episodes all differ, so the spread between seeds shows
    # how much of a difference between policies one seed can be trusted with.
    by_seed = {
        seed: {
            p: r.summary()
            for p, r in compare(replace(base, seed=seed), policies, workers=args.workers).items()
        }
        for seed in args.seeds
    }
    print(json.dumps(by_seed, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
