"""Placement simulation: one GPU pod stream scheduled by four policies over one simulated fleet.

What it compares, on the same pods, nodes, background load and seeds:

- ``project``: the scorer's real filter and scores (`exporter_scheduler.scoring.evaluate`), fed the
  annotations each node's agent last *wrote* (real `aggregate`, real write limiter, real `encode`),
  so the scorer sees data as stale as it would be in a cluster, never the truth;
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
run GPU work the scheduler does not account for (a pod that sets `NVIDIA_VISIBLE_DEVICES=all`
without requesting GPUs, a burn-in, a stray process): episodes of load and memory with no
allocation. A few nodes have poor cooling.

Judging is done against the truth at the moment of binding (`judge`), never against what the
scorer saw, so staleness counts against the project like any other cause.
"""

from __future__ import annotations

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
from agent.records import GpuReading, NodeReading
from exporter_scheduler.hints import FALLBACK_UTILIZATION, MIN_GPU_MEMORY_MIB, MODEL_PREFERENCE
from exporter_scheduler.policy import Policy
from exporter_scheduler.scoring import NodeInput, PodInput, evaluate
from gpu_contract import DEFAULT_KEYS, Field, decode, encode, normalize_model_name
from gpu_sim.traces import A100_80GB, H100_80GB, L4_24GB, T4_16GB, V100_32GB, GpuModel

PolicyName = Literal["project", "utilization-only", "allocation-spread", "random"]
POLICIES: Final[tuple[PolicyName, ...]] = (
    "project",
    "utilization-only",
    "allocation-spread",
    "random",
)
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
    # Share of nodes with episodes of GPU work the scheduler does not account for.
    unaccounted_share: float = 0.15
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
    # (start_s, end_s, utilization, memory fraction) of load the scheduler does not account for.
    episodes: tuple[tuple[float, float, float, float], ...] = ()

    @property
    def model_name(self) -> str:
        return normalize_model_name(self.model.name)


# ----------------------------------------------------------------------------------------------
# Judging one placement against the truth (pure; the tests drive it with hand-built cases)


@dataclass(frozen=True, slots=True)
class NodeTruth:
    """A node as it really is when a pod is bound (not as its annotations say)."""

    name: str
    model_name: str
    utilization: float
    temperature_c: float
    # The most free memory on one GPU that still has a free slot.
    largest_free_mib: int


@dataclass(frozen=True, slots=True)
class Judgement:
    above_limit: bool
    chain_violation: bool
    memory_fit_failure: bool
    hot: bool


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
    - chain violation: a feasible node of a better-ranked model was below the fallback
      threshold, at or below the utilization limit, under the temperature limit and had the
      memory the pod needs on one GPU;
    - memory-fit failure: the pod's memory did not fit on a GPU it was given;
    - hot: the node's hottest GPU was at or above the temperature limit.

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
        violation = any(
            chain_rank(n.model_name, pod.chain) < rank
            and n.utilization <= threshold - margin
            and n.utilization <= utilization_limit - margin
            and n.temperature_c < temperature_limit_c
            and n.largest_free_mib >= pod.memory_mib
            for n in feasible
        )
    return Judgement(
        above_limit=above,
        chain_violation=violation,
        memory_fit_failure=not fits_in_memory,
        hot=chosen.temperature_c >= temperature_limit_c,
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
            episodes: list[tuple[float, float, float, float]] = []
            if rng.random() < config.unaccounted_share:
                t = rng.uniform(0.0, 1800.0)
                while t < config.duration_s:
                    length = rng.expovariate(1 / 1800.0)
                    episodes.append((t, t + length, rng.uniform(0.5, 0.95), rng.uniform(0.3, 0.8)))
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


def make_pods(config: PlacementConfig, nodes: Sequence[NodeSetup]) -> list[PodRequest]:
    """A Poisson stream of training, inference and notebook pods sized to `offered_load`."""
    rng = random.Random(config.seed * 31 + 1)
    slots = sum(n.gpu_count * n.slots_per_gpu for n in nodes)
    # Mean GPUs x mean run time of the mix below, for the arrival rate that offers the load.
    mean_gpus = 0.40 * 3.05 + 0.45 * 1.0 + 0.15 * 1.5
    mean_run_s = 0.40 * 2400.0 + 0.45 * 1800.0 + 0.15 * 1200.0
    rate_per_s = config.offered_load * slots / (mean_gpus * mean_run_s)
    pods: list[PodRequest] = []
    t = 0.0
    while True:
        t += rng.expovariate(rate_per_s)
        if t >= config.duration_s:
            break
        kind = rng.random()
        name = f"pod-{len(pods):05d}"
        declares = rng.random() < 0.7
        if kind < 0.40:
            gpus = rng.choices([g for g, _ in _TRAINING_GPUS], [w for _, w in _TRAINING_GPUS])[0]
            pick = rng.random()
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
                )
            )
        elif kind < 0.85:
            pick = rng.random()
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
                )
            )
        else:
            pods.append(
                PodRequest(
                    name=name,
                    arrival_s=t,
                    gpus=rng.choice([1, 2]),
                    memory_mib=int(rng.uniform(2_000, 30_000)),
                    utilization=rng.uniform(0.05, 0.30),
                    run_s=rng.expovariate(1 / 1200.0),
                    declares_memory=declares,
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
    write_time: datetime | None = None
    last_fragmentation: float = 0.0
    bg_util: float = 0.0
    bg_mem_mib: int = 0

    @property
    def free_slots(self) -> int:
        return self.setup.gpu_count * self.setup.slots_per_gpu - sum(self.tenants)

    def gpu_util(self, g: int) -> float:
        return min(1.0, self.util[g] + self.bg_util)

    def utilization(self) -> float:
        return sum(self.gpu_util(g) for g in range(self.setup.gpu_count)) / self.setup.gpu_count

    def gpu_free_mib(self, g: int) -> int:
        return max(0, self.total_mib - self.mem_mib[g] - self.bg_mem_mib)

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
        )

    def truth(self) -> NodeTruth:
        slots = self.setup.slots_per_gpu
        free = [
            self.gpu_free_mib(g) for g in range(self.setup.gpu_count) if self.tenants[g] < slots
        ]
        return NodeTruth(
            name=self.setup.name,
            model_name=self.setup.model_name,
            utilization=self.utilization(),
            temperature_c=max(self.temperature_c),
            largest_free_mib=max(free, default=0),
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
    # Of those: pods that declared no `min-gpu-memory-mib`, and pods of more than one GPU (the
    # hint is checked against the single largest free GPU, not against each GPU the pod gets).
    memory_fit_failures_undeclared: int = 0
    memory_fit_failures_multi_gpu: int = 0
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
) -> dict[str, float]:
    inputs = [
        NodeInput(name=n.setup.name, annotations=n.annotations, agent_write_time=n.write_time)
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
    if policy == "project":
        scores = _score_project(pod, pod_annotations, candidates, now, scorer_policy)
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
            bg_u, bg_m = 0.0, 0
            for start, end, u, m in node.setup.episodes:
                if start <= t < end:
                    bg_u, bg_m = u, int(m * node.total_mib)
                    break
            node.bg_util, node.bg_mem_mib = bg_u, bg_m
            for g in range(node.setup.gpu_count):
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
            gpus, fits = _assign(chosen, pod)
            verdict = judge(
                pod,
                chosen.truth(),
                truths,
                fits_in_memory=fits,
                utilization_limit=limit_u,
                temperature_limit_c=limit_t,
            )
            clear = judge(
                pod,
                chosen.truth(),
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
    """What NVML would read on this node now: the truth plus a little sampling noise."""
    setup = node.setup
    jitter = noise.normal(0.0, 0.015, size=setup.gpu_count).tolist()
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
    return NodeReading(sampled_at=now, gpus=gpus, device_count=setup.gpu_count)


def compare(
    config: PlacementConfig, policies: Sequence[PolicyName] = POLICIES
) -> dict[PolicyName, PlacementResult]:
    """Every policy on the same fleet, pod stream and seeds."""
    return {p: run(config, p) for p in policies}


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m gpu_sim.placement --nodes 80 --duration-s 10800`: every policy, as JSON."""
    import argparse  # noqa: PLC0415  (only the command line needs it)
    import json  # noqa: PLC0415

    parser = argparse.ArgumentParser(prog="python -m gpu_sim.placement", description=__doc__)
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
