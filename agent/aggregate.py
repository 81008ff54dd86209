"""Turn one tick's per-GPU reading into the node-level state of the annotation contract.

Pure: no NVML, no clock, no I/O. The exact definition of every aggregate, its edge cases and what
each kind of fault does to `health` are in docs/fragmentation.md; this module is that text as code.
A value that no GPU could measure stays `None` (the key is then omitted), never 0. The per-GPU
table (`NodeGpuState.gpus`) comes from the same readings, one entry per GPU in NVML index order,
and so do the pods' figures (`NodeGpuState.pods`, `agent.attribution`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime

from agent.allocations import allocated_by_gpu
from agent.attribution import attribute
from agent.records import GpuReading, NodeReading
from gpu_contract.schema import (
    MIXED_MODELS,
    GpuState,
    Health,
    NodeGpuState,
    normalize_model_name,
)


def memory_fragmentation(
    free_mib_per_gpu: Sequence[int],
    largest_allocation_mib_per_gpu: Sequence[int] | None = None,
) -> float:
    """`1 - largest / total` of the node's free memory, in [0, 1).

    `largest` is the biggest single allocation any GPU offers (`largest_allocation_mib_per_gpu`,
    which differs from the free memory only on MIG-enabled GPUs); without it, the biggest per-GPU
    free amount. 0.0 when nothing is free, and when all free memory is one block (at most one
    GPU without MIG). Negative inputs (a driver glitch) count as 0 free.
    """
    free = [max(0, int(v)) for v in free_mib_per_gpu]
    total = sum(free)
    if total == 0:
        return 0.0
    largest_per_gpu = (
        free if largest_allocation_mib_per_gpu is None else largest_allocation_mib_per_gpu
    )
    largest = max((max(0, int(v)) for v in largest_per_gpu), default=0)
    return max(0.0, 1.0 - min(largest, total) / total)


def _fraction(value: float | None) -> float | None:
    if value is None or not math.isfinite(value):
        return None
    return min(1.0, max(0.0, value))


def _finite_fractions(values: Iterable[float | None]) -> list[float]:
    # A NaN or infinite value from a source is as good as no value; out-of-range ones are clamped
    # because a fraction is what the contract publishes.
    return [f for f in map(_fraction, values) if f is not None]


def _counts(values: Iterable[int | None]) -> list[int]:
    return [max(0, int(v)) for v in values if v is not None]


def _largest_allocation_mib(gpu: GpuReading) -> int | None:
    """The biggest single request `gpu` can take: its free memory unless MIG splits it."""
    free = gpu.memory_free_mib
    largest = gpu.memory_largest_allocation_mib
    if largest is None:
        # A MIG-enabled GPU's free memory is a sum over instances and slices, never one block:
        # without its largest allocation it offers no known single-request size.
        return None if gpu.mig_enabled else free
    # One allocation cannot exceed what is free on the GPU, whatever a source claims.
    return largest if free is None else min(largest, free)


def _per_gpu(
    reading: NodeReading, gpu_count: int, dra_devices: Mapping[str, str]
) -> tuple[GpuState, ...]:
    """One `GpuState` per GPU in NVML index order; a lost GPU's values are all unknown.

    The values are the same reads as the node aggregates (no other source), so a reader can
    recompute `utilization`, `temperature` and `memory-largest-free-mib` from them. A GPU's DRA
    device name is looked up by its UUID in `dra_devices`.
    """
    by_index = {g.index: g for g in reading.gpus}
    if len(by_index) != len(reading.gpus) or any(not 0 <= i < gpu_count for i in by_index):
        # Indexes a source got wrong cannot be put in NVML order: publish no per-GPU data.
        return ()
    allocated = (
        None if reading.allocations is None else allocated_by_gpu(reading.gpus, reading.allocations)
    )
    table: list[GpuState] = []
    for index in range(gpu_count):
        gpu = by_index.get(index)
        if gpu is None:
            table.append(GpuState())
            continue
        largest = _largest_allocation_mib(gpu)
        table.append(
            GpuState(
                utilization=_fraction(gpu.utilization),
                memory_free_mib=None if largest is None else max(0, int(largest)),
                temperature_c=None if gpu.temperature_c is None else int(gpu.temperature_c),
                allocated=None if allocated is None else allocated.get(index),
                dra_device=dra_devices.get(gpu.uuid),
            )
        )
    return tuple(table)


def _model(gpus: Sequence[GpuReading]) -> str | None:
    models = {normalize_model_name(g.name) for g in gpus if g.name and g.name.strip()}
    if not models:
        return None
    if len(models) > 1:
        return MIXED_MODELS
    return models.pop()


def _updated_at(sampled_at: datetime) -> datetime:
    # A naive time is taken as UTC rather than refused: the sources always pass aware times, and
    # the contract's writer needs some defined answer.
    aware = sampled_at if sampled_at.tzinfo is not None else sampled_at.replace(tzinfo=UTC)
    return aware.astimezone(UTC).replace(microsecond=0)


def _detail(parts: Iterable[str]) -> str | None:
    seen: dict[str, None] = {}
    for part in parts:
        text = part.strip()
        if text:
            seen.setdefault(text, None)
    return "; ".join(seen) or None


def aggregate(reading: NodeReading, dra_devices: Mapping[str, str] | None = None) -> NodeGpuState:
    """The contract's node state for one tick (see docs/fragmentation.md for each rule).

    `dra_devices`: GPU UUID -> its device name in the DRA driver's ResourceSlice, where the
    agent found the node's GPUs among DRA devices (`agent.tainter`); published per GPU so the
    scorer can match claims and rules, which name devices, to the GPUs' readings.
    """
    updated_at = _updated_at(reading.sampled_at)
    if reading.fatal is not None:
        return NodeGpuState(
            health=Health.UNAVAILABLE,
            updated_at=updated_at,
            health_detail=_detail([f"nvml: {reading.fatal}"]) or "nvml failed",
        )

    gpus = reading.gpus
    device_count = max(0, reading.device_count)
    problems = [*reading.lost, *(p for g in gpus for p in g.problems)]
    if not gpus:
        reason = problems or (["no gpus reported"] if device_count == 0 else ["no usable gpu"])
        return NodeGpuState(
            health=Health.UNAVAILABLE,
            updated_at=updated_at,
            gpu_count=device_count,
            health_detail=_detail(reason),
        )

    utilizations = _finite_fractions(g.utilization for g in gpus)
    free_mib = _counts(g.memory_free_mib for g in gpus)
    largest_mib = _counts(_largest_allocation_mib(g) for g in gpus if g.memory_free_mib is not None)
    temperatures = [int(g.temperature_c) for g in gpus if g.temperature_c is not None]
    detail = _detail(problems)
    # NVML's own count, lost GPUs included, so a lost GPU shows as degraded, not as a smaller
    # node; never below the GPUs actually read.
    gpu_count = max(device_count, len(gpus))
    per_gpu = _per_gpu(reading, gpu_count, dra_devices or {})
    return NodeGpuState(
        health=Health.DEGRADED if detail else Health.OK,
        updated_at=updated_at,
        utilization=sum(utilizations) / len(utilizations) if utilizations else None,
        utilization_max=max(utilizations) if utilizations else None,
        # Both come from the per-GPU largest allocation, so a reader can recompute one from the
        # other and `memory-largest-free-mib` is a request size that really fits.
        memory_fragmentation=(
            memory_fragmentation(free_mib, largest_mib) if free_mib and largest_mib else None
        ),
        memory_free_mib=sum(free_mib) if free_mib else None,
        memory_largest_free_mib=max(largest_mib) if largest_mib else None,
        temperature_c=max(temperatures) if temperatures else None,
        gpu_model=_model(gpus),
        gpu_count=gpu_count,
        health_detail=detail,
        gpus=per_gpu,
        # Pods are placed on GPUs by NVML index: only where the per-GPU table could be built.
        pods=attribute(reading).pods if per_gpu else (),
    )
