"""Write-budget simulation: what a fleet of agents costs the API server, and how fresh its data is.

Each simulated node runs the agent's real decision path on a seeded trace (`fleet_sim.traces`):
`agent.aggregate.aggregate` turns the tick's `NodeReading` (with the kubelet's allocations, as the
agent reads them) into the contract's `NodeGpuState`, per-GPU table included, the
pure limiter (`agent.limiter.decide`) says whether to write, and a write is sized as the real
merge-patch body (`gpu_contract.encode` + `merge_patch`, serialised as the client sends it). There
is no network: the API server is a function of time that either accepts a write or answers 429
with a `Retry-After` during a configured storm window.

Nodes do not interact (each agent decides alone on its own Node), so a fleet's totals are the sum
of its nodes'. The naive baseline writes every sample: one patch per node per interval, whatever
the API says.

The second cost of a write: kube-scheduler retries every unschedulable pod within milliseconds of
any node annotation change (seen on a real v1.36 scheduler), so the model here charges one extender
filter call per pending pod per write. That is an upper bound: a pod already waiting in the
scheduler's back-off queue is not retried twice, so at very high write rates the real cost
saturates at the pending pods divided by their back-off (1 s doubling to 10 s).
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Final

import numpy as np

from agent.aggregate import aggregate
from agent.limiter import (
    LimiterState,
    WritePolicy,
    decide,
    heartbeat_lead_s,
    record_failure,
    record_success,
)
from fleet_sim.pods import NodePods
from fleet_sim.traces import DEFAULT_MIX, NodeSpec, Profile, generate, make_fleet, node_reading
from gpu_contract import DEFAULT_KEYS, encode, merge_patch

EPOCH: Final = datetime(2026, 1, 5, 0, 0, tzinfo=UTC)
# Nodes simulated per trace batch: bounds the arrays' memory (ticks x nodes x GPUs floats).
CHUNK_NODES: Final = 250


@dataclass(frozen=True, slots=True)
class ApiStorm:
    """A window in which the API server answers every write with 429 and `Retry-After`."""

    start_s: float
    end_s: float
    retry_after_s: float = 30.0


@dataclass(frozen=True, slots=True)
class FleetConfig:
    nodes: int = 200
    duration_s: float = 3600.0
    interval_s: float = 5.0
    seed: int = 7
    gpus_per_node: int = 8
    mix: Mapping[Profile, float] = field(default_factory=lambda: dict(DEFAULT_MIX))
    policy: WritePolicy = field(default_factory=WritePolicy)
    # Writes and ages before this are start-up transient (every agent's first write) and are left
    # out of the steady-state rates; the timeline still shows them.
    warmup_s: float = 120.0
    storms: tuple[ApiStorm, ...] = ()
    # Bin width of the timeline series.
    bin_s: float = 10.0
    # Publish the per-GPU keys (with allocations) as the agent does; False: node-level keys only,
    # as before per-GPU data existed, for comparison.
    per_gpu: bool = True
    # Publish what each pod uses of each GPU (`pod-gpu-usage`, pods from `fleet_sim.pods`), as the
    # agent does with per-process attribution on; False: no pod figures, for comparison.
    pods: bool = True

    def __post_init__(self) -> None:
        if self.nodes < 1:
            raise ValueError("nodes must be >= 1")
        if self.duration_s <= self.warmup_s:
            raise ValueError("duration_s must exceed warmup_s")
        if self.interval_s <= 0 or self.bin_s <= 0:
            raise ValueError("interval_s and bin_s must be > 0")


@dataclass(slots=True)
class FleetResult:
    """Totals, rates and distributions of one simulation run (project and naive side by side)."""

    config: FleetConfig
    # Steady state (after warm-up), whole fleet.
    measured_s: float
    writes: int
    naive_writes: int
    bytes_written: int
    naive_bytes_written: int
    attempts: int
    failed_attempts: int
    naive_failed_attempts: int
    reasons: Counter[str]
    # For successful change-driven writes: how often each contract field was among the triggers.
    triggers: Counter[str]
    # Age (s) of the data a scorer would read, one sample per node per interval, after warm-up.
    ages_s: np.ndarray
    ages_api_up_s: np.ndarray
    naive_max_age_s: float
    # Timeline, one entry per bin from t=0: attempts, successes, failures and the oldest data.
    bin_starts_s: np.ndarray
    bin_attempts: np.ndarray
    bin_successes: np.ndarray
    bin_naive_attempts: np.ndarray
    bin_max_age_s: np.ndarray
    bin_p50_age_s: np.ndarray
    # Steady-state successful writes of each node, and each node's profile, in fleet order.
    node_writes: np.ndarray
    node_profiles: list[str]

    @property
    def writes_per_s(self) -> float:
        return self.writes / self.measured_s

    @property
    def naive_writes_per_s(self) -> float:
        return self.naive_writes / self.measured_s

    @property
    def bytes_per_s(self) -> float:
        return self.bytes_written / self.measured_s

    @property
    def naive_bytes_per_s(self) -> float:
        return self.naive_bytes_written / self.measured_s

    @property
    def write_ratio(self) -> float:
        return self.writes / self.naive_writes if self.naive_writes else math.nan

    def writes_per_s_first(self, nodes: int) -> float:
        """Writes/s of the fleet made of the first `nodes` simulated nodes (exact, no scaling)."""
        if not 1 <= nodes <= len(self.node_writes):
            raise ValueError(f"nodes must be between 1 and {len(self.node_writes)}")
        return float(self.node_writes[:nodes].sum()) / self.measured_s

    def writes_per_node_per_s_by_profile(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for profile in sorted(set(self.node_profiles)):
            mask = np.array([p == profile for p in self.node_profiles])
            out[profile] = float(self.node_writes[mask].mean()) / self.measured_s
        return out

    def extender_calls_per_s(self, pending_pods: int) -> float:
        """Upper bound: every write retries every pending pod once (see the module docstring)."""
        return self.writes_per_s * pending_pods

    def naive_extender_calls_per_s(self, pending_pods: int) -> float:
        return self.naive_writes_per_s * pending_pods

    def age_percentiles(self, *, api_up_only: bool = True) -> dict[str, float]:
        ages = self.ages_api_up_s if api_up_only else self.ages_s
        if ages.size == 0:
            return {"p50": math.nan, "p99": math.nan, "max": math.nan}
        p50, p99 = np.percentile(ages, [50, 99])
        return {"p50": float(p50), "p99": float(p99), "max": float(ages.max())}

    def summary(self, pending_pods: int = 50) -> dict[str, object]:
        """A JSON-ready digest of the run."""
        ages = self.age_percentiles()
        return {
            "nodes": self.config.nodes,
            "duration_s": self.config.duration_s,
            "interval_s": self.config.interval_s,
            "seed": self.config.seed,
            "per_gpu": self.config.per_gpu,
            "pods": self.config.pods,
            "measured_s": self.measured_s,
            "writes_per_s": self.writes_per_s,
            "naive_writes_per_s": self.naive_writes_per_s,
            "write_ratio": self.write_ratio,
            "bytes_per_s": self.bytes_per_s,
            "naive_bytes_per_s": self.naive_bytes_per_s,
            "pending_pods": pending_pods,
            "extender_calls_per_s": self.extender_calls_per_s(pending_pods),
            "naive_extender_calls_per_s": self.naive_extender_calls_per_s(pending_pods),
            "age_p50_s": ages["p50"],
            "age_p99_s": ages["p99"],
            "age_max_s": ages["max"],
            "naive_age_max_s": self.naive_max_age_s,
            "failed_attempts": self.failed_attempts,
            "naive_failed_attempts": self.naive_failed_attempts,
            "reasons": dict(sorted(self.reasons.items())),
            "triggers": dict(sorted(self.triggers.items())),
        }


def patch_bytes(annotations: Mapping[str, str]) -> int:
    """Size of the merge-patch body as the client sends it (compact JSON, UTF-8)."""
    body = merge_patch(annotations, DEFAULT_KEYS)
    return len(json.dumps(body, separators=(",", ":")).encode())


def _storm_at(storms: Sequence[ApiStorm], t_s: float) -> ApiStorm | None:
    for storm in storms:
        if storm.start_s <= t_s < storm.end_s:
            return storm
    return None


def simulate(config: FleetConfig, *, specs: Sequence[NodeSpec] | None = None) -> FleetResult:
    """Run every node's agent over `config.duration_s` of simulated time."""
    policy = config.policy
    interval = config.interval_s
    ticks = int(config.duration_s // interval)
    if specs is not None and len(specs) != config.nodes:
        raise ValueError(f"got {len(specs)} node specs for a fleet of {config.nodes}")
    fleet = (
        list(specs)
        if specs is not None
        else make_fleet(
            config.nodes, seed=config.seed, gpus_per_node=config.gpus_per_node, mix=config.mix
        )
    )
    rng = np.random.default_rng(config.seed + 1)
    # Start-up jitter up to one interval (the agent's own rule); it also sets each node's tick
    # phase, so the fleet never samples in lockstep.
    jitters = rng.uniform(0.0, interval, size=len(fleet)).tolist()
    # The scorer reads at arbitrary moments: offset each node's age sample by a uniform fraction
    # of an interval after its tick.
    read_offsets = rng.uniform(0.0, interval, size=len(fleet)).tolist()
    # Each agent's one-off heartbeat lead (the agent's own rule), so quiet nodes started together
    # do not keep writing their heartbeats in the same seconds.
    leads = [
        heartbeat_lead_s(policy=config.policy, fraction=f)
        for f in rng.uniform(0.0, 1.0, size=len(fleet)).tolist()
    ]
    bins = math.ceil(config.duration_s / config.bin_s) + 1
    bin_attempts = np.zeros(bins, dtype=np.int64)
    bin_successes = np.zeros(bins, dtype=np.int64)
    bin_naive = np.zeros(bins, dtype=np.int64)
    ages = np.full((ticks, len(fleet)), np.nan)
    api_up = np.ones((ticks, len(fleet)), dtype=bool)
    reasons: Counter[str] = Counter()
    triggers: Counter[str] = Counter()
    node_writes = np.zeros(len(fleet), dtype=np.int64)
    writes = naive_writes = attempts = failed = naive_failed = 0
    bytes_written = naive_bytes = 0
    storms = config.storms
    warm = config.warmup_s
    bin_s = config.bin_s

    for lo in range(0, len(fleet), CHUNK_NODES):
        chunk = fleet[lo : lo + CHUNK_NODES]
        traces = generate(chunk, ticks=ticks, interval_s=interval, seed=config.seed * 7919 + lo)
        for j, spec in enumerate(chunk):
            n = lo + j
            jitter = jitters[n]
            uuids = traces.uuids(j)
            total_mib = spec.model.memory_total_mib * spec.gpu_count
            util_rows = traces.utilization[:, j, :].tolist()
            mem_rows = traces.memory_used_mib[:, j, :].tolist()
            temp_rows = traces.temperature_c[:, j, :].tolist()
            alloc_rows = traces.allocated[:, j, :].tolist()
            limiter = LimiterState.initial(now_s=0.0, jitter_s=jitter, heartbeat_lead_s=leads[n])
            pods = (
                NodePods(spec, node=n, uuids=uuids, ticks=ticks, seed=config.seed)
                if config.pods and config.per_gpu
                else None
            )
            last_written_at: float | None = None
            last_bytes = 0
            for k in range(ticks):
                now = jitter + k * interval
                allocations = processes = owners = None
                if pods is not None:
                    allocations, processes, owners = pods.at(
                        k,
                        allocated=alloc_rows[k],
                        utilization=util_rows[k],
                        memory_used_mib=mem_rows[k],
                    )
                reading = node_reading(
                    spec,
                    uuids=uuids,
                    sampled_at=EPOCH + timedelta(seconds=now),
                    utilization=util_rows[k],
                    memory_used_mib=mem_rows[k],
                    temperature_c=temp_rows[k],
                    allocated=alloc_rows[k] if config.per_gpu else None,
                    allocations=allocations,
                    processes=processes,
                    process_owners=owners,
                )
                state = aggregate(reading)
                if not config.per_gpu:
                    state = replace(state, gpus=())
                decision = decide(
                    limiter, state, now_s=now, memory_total_mib=total_mib, policy=policy
                )
                storm = _storm_at(storms, now)
                counted = now >= warm
                b = int(now // bin_s)
                # The naive agent patches every sample, whatever the API answered last.
                bin_naive[b] += 1
                if counted:
                    naive_writes += 1
                    if storm is not None:
                        naive_failed += 1
                if decision.write:
                    bin_attempts[b] += 1
                    if counted:
                        attempts += 1
                    if storm is not None:
                        limiter = record_failure(
                            limiter, now_s=now, policy=policy, retry_after_s=storm.retry_after_s
                        )
                        if counted:
                            failed += 1
                    else:
                        size = patch_bytes(encode(state, DEFAULT_KEYS))
                        last_bytes = size
                        limiter = record_success(limiter, written=state, now_s=now)
                        last_written_at = now
                        bin_successes[b] += 1
                        if counted:
                            writes += 1
                            node_writes[n] += 1
                            bytes_written += size
                if counted:
                    reasons[decision.reason.value] += 1
                    if decision.write and storm is None:
                        triggers.update(decision.changed)
                    # The naive body differs from ours only in digits; charge it the size of
                    # the last body this node sent (every value formats to a fixed width but
                    # the integer fields).
                    naive_bytes += last_bytes
                if last_written_at is not None:
                    ages[k, n] = now + read_offsets[n] - last_written_at
                api_up[k, n] = storm is None and _storm_at(storms, now + read_offsets[n]) is None

    start_tick = math.ceil(warm / interval)
    steady = ages[start_tick:]
    up = api_up[start_tick:]
    # After a storm a node may still sit out its back-off, then wait for its next tick: "while the
    # API is up" for the freshness bound excludes the storm and the back-off + heartbeat + interval
    # after it.
    recovered = _recovered_mask(config, ticks, jitters)[start_tick:] & up
    finite = ~np.isnan(steady)
    measured_s = ticks * interval - warm
    bin_max, bin_p50 = _age_per_bin(ages, jitters, interval, bin_s, bins)
    return FleetResult(
        config=config,
        measured_s=measured_s,
        writes=writes,
        naive_writes=naive_writes,
        bytes_written=bytes_written,
        naive_bytes_written=naive_bytes,
        attempts=attempts,
        failed_attempts=failed,
        naive_failed_attempts=naive_failed,
        reasons=reasons,
        triggers=triggers,
        ages_s=steady[finite],
        ages_api_up_s=steady[finite & recovered],
        naive_max_age_s=interval,
        bin_starts_s=np.arange(bins) * bin_s,
        bin_attempts=bin_attempts,
        bin_successes=bin_successes,
        bin_naive_attempts=bin_naive,
        bin_max_age_s=bin_max,
        bin_p50_age_s=bin_p50,
        node_writes=node_writes,
        node_profiles=[s.profile.value for s in fleet],
    )


def _recovered_mask(config: FleetConfig, ticks: int, jitters: Sequence[float]) -> np.ndarray:
    """False during a storm and the back-off + heartbeat + interval after it; True elsewhere."""
    times = np.arange(ticks)[:, None] * config.interval_s + np.asarray(jitters)[None, :]
    mask = np.ones(times.shape, dtype=bool)
    # After a storm the agent may still be waiting out its back-off (up to backoff_max_s).
    settle = config.policy.heartbeat_s + config.interval_s + config.policy.backoff_max_s
    for storm in config.storms:
        mask &= ~((times >= storm.start_s) & (times < storm.end_s + settle))
    return mask


def _age_per_bin(
    ages: np.ndarray, jitters: Sequence[float], interval_s: float, bin_s: float, bins: int
) -> tuple[np.ndarray, np.ndarray]:
    ticks = ages.shape[0]
    times = np.arange(ticks)[:, None] * interval_s + np.asarray(jitters)[None, :]
    which = (times // bin_s).astype(np.int64)
    out_max = np.full(bins, np.nan)
    out_p50 = np.full(bins, np.nan)
    flat_bins = which.ravel()
    flat_ages = ages.ravel()
    keep = ~np.isnan(flat_ages)
    flat_bins, flat_ages = flat_bins[keep], flat_ages[keep]
    order = np.argsort(flat_bins, kind="stable")
    flat_bins, flat_ages = flat_bins[order], flat_ages[order]
    edges = np.searchsorted(flat_bins, np.arange(bins + 1))
    for b in range(bins):
        part = flat_ages[edges[b] : edges[b + 1]]
        if part.size:
            out_max[b] = part.max()
            out_p50[b] = float(np.median(part))
    return out_max, out_p50


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m fleet_sim.fleet --nodes 5000 --duration-s 3600`: one run, summary as JSON."""
    import argparse  # noqa: PLC0415  (only the command line needs it)

    parser = argparse.ArgumentParser(prog="python -m fleet_sim.fleet", description=__doc__)
    parser.add_argument("--nodes", type=int, default=500)
    parser.add_argument("--duration-s", type=float, default=3600.0)
    parser.add_argument("--interval-s", type=float, default=5.0)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--pending-pods", type=int, default=50)
    parser.add_argument(
        "--no-per-gpu", action="store_true", help="publish node-level keys only (for comparison)"
    )
    parser.add_argument(
        "--taints",
        action="store_true",
        help="add the DRA device-taint writes (fleet_sim.taints) and the per-node total",
    )
    parser.add_argument(
        "--no-pods", action="store_true", help="publish no pod-gpu-usage (for comparison)"
    )
    parser.add_argument(
        "--storm",
        metavar="START:END:RETRY_AFTER",
        help="a 429 window in seconds of simulated time, e.g. 600:900:30",
    )
    args = parser.parse_args(argv)
    storms: tuple[ApiStorm, ...] = ()
    if args.storm:
        try:
            start, end, retry = (float(x) for x in args.storm.split(":"))
        except ValueError:
            parser.error("--storm takes START:END:RETRY_AFTER in seconds")
        storms = (ApiStorm(start, end, retry),)
    config = FleetConfig(
        nodes=args.nodes,
        duration_s=args.duration_s,
        interval_s=args.interval_s,
        seed=args.seed,
        storms=storms,
        per_gpu=not args.no_per_gpu,
        pods=not args.no_pods,
    )
    result = simulate(config)
    summary = result.summary(args.pending_pods)
    if args.taints:
        from fleet_sim.taints import simulate_taints  # noqa: PLC0415  (only this option)

        run = simulate_taints(
            nodes=config.nodes,
            duration_s=config.duration_s,
            interval_s=config.interval_s,
            seed=config.seed,
            gpus_per_node=config.gpus_per_node,
            warmup_s=config.warmup_s,
        )
        summary.update(run.summary())
        annotation_per_node_per_min = result.writes_per_s * 60.0 / config.nodes
        summary["annotation_writes_per_node_per_minute"] = round(annotation_per_node_per_min, 4)
        summary["writes_per_node_per_minute"] = round(
            annotation_per_node_per_min + run.writes_per_node_per_minute, 4
        )
    print(json.dumps(summary, indent=2, sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
