"""What the agent's DRA device taints add to a fleet's write budget.

The same seeded traces as `fleet_sim.fleet` (same fleet, same seeds, so the same load), run
through the agent's pure taint path: `agent.dra.conditions` and `decide_taint` per GPU per tick,
with `TaintPolicy`'s defaults (taint above 0.90 or at 85 C, release below 0.80 or 80 C, one write
per GPU per minute at most, 12 per hour). Every decision that writes is one DeviceTaintRule
create or delete; the API accepts every write (the annotations' storms are simulated there).

What it reports: taint writes per node per minute (fleet mean) and the busiest GPU's most writes
in any 60 s window (the target is at most one), so they can be added to the annotation writes.
Nodes do not interact, so the fleet's totals are the sum of its nodes'.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from agent.dra import (
    DraDevice,
    TaintPolicy,
    TaintState,
    conditions,
    decide_taint,
    taint_written,
)
from fleet_sim.traces import NodeSpec, generate, make_fleet

# The same batch size and seeds as fleet_sim.fleet.simulate, so both see the same traces.
CHUNK_NODES = 250


@dataclass(frozen=True, slots=True)
class TaintRun:
    nodes: int
    # Simulated time the rates are measured over: the run after its warm-up.
    measured_s: float
    writes: int
    by_reason: dict[str, int]
    # The most writes one GPU made in any 60 s window, over the whole fleet.
    max_writes_per_gpu_per_minute: int
    # GPUs that were tainted at least once, and the mean share of GPU-time spent tainted.
    gpus_ever_tainted: int
    tainted_fraction: float

    @property
    def writes_per_node_per_minute(self) -> float:
        return self.writes / self.nodes / (self.measured_s / 60.0)

    def summary(self) -> dict[str, object]:
        return {
            "taint_writes": self.writes,
            "taint_writes_by_reason": dict(sorted(self.by_reason.items())),
            "taint_writes_per_node_per_minute": round(self.writes_per_node_per_minute, 4),
            "taint_max_writes_per_gpu_per_minute": self.max_writes_per_gpu_per_minute,
            "gpus_ever_tainted": self.gpus_ever_tainted,
            "tainted_gpu_time_fraction": round(self.tainted_fraction, 4),
        }


@dataclass
class _Gpu:
    device: DraDevice
    state: TaintState = field(default_factory=TaintState)
    writes_s: list[float] = field(default_factory=list)
    tainted_ticks: int = 0


def _max_in_window(times_s: Sequence[float], window_s: float) -> int:
    best, start = 0, 0
    for end, t in enumerate(times_s):
        while t - times_s[start] >= window_s:
            start += 1
        best = max(best, end - start + 1)
    return best


def simulate_taints(
    *,
    nodes: int,
    duration_s: float = 3600.0,
    interval_s: float = 5.0,
    seed: int = 7,
    gpus_per_node: int = 8,
    warmup_s: float = 120.0,
    policy: TaintPolicy | None = None,
    specs: Sequence[NodeSpec] | None = None,
) -> TaintRun:
    """Every node's taint decisions over `duration_s` of simulated time. Writes before
    `warmup_s` (every hot or busy GPU's first taint) are left out of the rates, as the
    annotation writes' start-up transient is in `fleet_sim.fleet`."""
    policy = policy or TaintPolicy()
    ticks = int(duration_s // interval_s)
    fleet = list(specs) if specs is not None else make_fleet(
        nodes, seed=seed, gpus_per_node=gpus_per_node
    )  # fmt: skip
    writes = 0
    by_reason: Counter[str] = Counter()
    max_per_minute = 0
    ever = 0
    tainted_ticks = 0
    for lo in range(0, len(fleet), CHUNK_NODES):
        chunk = fleet[lo : lo + CHUNK_NODES]
        traces = generate(chunk, ticks=ticks, interval_s=interval_s, seed=seed * 7919 + lo)
        for j, spec in enumerate(chunk):
            uuids = traces.uuids(j)
            gpus = {
                uuid: _Gpu(DraDevice("gpu.nvidia.com", spec.name, f"gpu-{g}", uuid))
                for g, uuid in enumerate(uuids)
            }
            seen = frozenset(uuids)
            util_rows = traces.utilization[:, j, :].tolist()
            temp_rows = traces.temperature_c[:, j, :].tolist()
            for k in range(ticks):
                now_s = k * interval_s
                read = zip(uuids, util_rows[k], temp_rows[k], strict=True)
                found = conditions(
                    ((u, float(x), int(t)) for u, x, t in read),
                    (g.device for g in gpus.values()),
                    seen_uuids=seen,
                )
                for uuid, condition in found.items():
                    gpu = gpus[uuid]
                    decision = decide_taint(gpu.state, condition, now_s=now_s, policy=policy)
                    if decision.action is not None:
                        gpu.state = taint_written(gpu.state, wanted=decision.wanted, now_s=now_s)
                        gpu.writes_s.append(now_s)
                        if now_s >= warmup_s:
                            writes += 1
                            by_reason[decision.reason.value] += 1
                    if gpu.state.published is not None:
                        gpu.tainted_ticks += 1
            for gpu in gpus.values():
                max_per_minute = max(max_per_minute, _max_in_window(gpu.writes_s, 60.0))
                ever += bool(gpu.writes_s)
                tainted_ticks += gpu.tainted_ticks
    gpu_ticks = max(1, sum(s.gpu_count for s in fleet) * ticks)
    return TaintRun(
        nodes=len(fleet),
        measured_s=max(interval_s, duration_s - warmup_s),
        writes=writes,
        by_reason=dict(by_reason),
        max_writes_per_gpu_per_minute=max_per_minute,
        gpus_ever_tainted=ever,
        tainted_fraction=tainted_ticks / gpu_ticks,
    )
