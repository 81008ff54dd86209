"""Small builders for scorer tests: a node as the agent would annotate it, a pod with hints, a
GPU pod bound to a node as the pod watch keeps it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import msgspec

from agent.aggregate import aggregate
from agent.records import DeviceAllocations, GpuReading, NodeReading
from exporter_scheduler.core.inflight import BASIS_POINTS, BoundPod
from exporter_scheduler.core.judge import evaluate
from exporter_scheduler.core.policy import Policy
from exporter_scheduler.core.records import Evaluation, NodeInput, NodeVerdict, PodInput
from gpu_contract.schema import DEFAULT_KEYS, Field, GpuState, Health, NodeGpuState, encode

NOW = datetime(2026, 11, 30, 14, 0, 0, tzinfo=UTC)
PREFIX = DEFAULT_KEYS.prefix
A100 = "NVIDIA-A100-SXM4-80GB"
V100 = "Tesla-V100-SXM2-16GB"
T4 = "Tesla-T4"
_UNSET = object()


def node(
    name: str = "node-a",
    *,
    age_s: float = 10.0,
    write_age_s: float | None = None,
    health: Health = Health.OK,
    utilization: float | None = 0.50,
    fragmentation: float | None = 0.0,
    temperature_c: int | None = 50,
    model: str | None = A100,
    largest_free_mib: int | None = 80_000,
    per_gpu: Sequence[GpuState] | None = None,
    overrides: Mapping[Field, str | None] | None = None,
) -> NodeInput:
    """A node annotated through the real contract; `overrides` set (or with None, delete) keys.

    `per_gpu` publishes that per-GPU table as given, beside the node-level values as given
    (which need not summarise it: `gpu_node` builds a node the way the agent would)."""
    state = NodeGpuState(
        health=health,
        updated_at=NOW - timedelta(seconds=age_s),
        utilization=utilization,
        memory_fragmentation=fragmentation,
        memory_free_mib=None if largest_free_mib is None else largest_free_mib * 2,
        memory_largest_free_mib=largest_free_mib,
        temperature_c=temperature_c,
        gpu_model=model,
        gpu_count=8 if per_gpu is None else len(per_gpu),
        gpus=() if per_gpu is None else tuple(per_gpu),
    )
    annotations = encode(state)
    for f, value in (overrides or {}).items():
        if value is None:
            annotations.pop(DEFAULT_KEYS[f], None)
        else:
            annotations[DEFAULT_KEYS[f]] = value
    written = None if write_age_s is None else NOW - timedelta(seconds=write_age_s)
    return NodeInput(name, annotations, written)


@dataclass(frozen=True, slots=True)
class Gpu:
    """One GPU of `gpu_node`, as NVML and the kubelet would report it. `None`: not measured.

    `allocated` None: allocations unknown on the node (the key is left out when every GPU says
    so); `offered` False: the kubelet does not hand the GPU out; `mig`: a MIG-enabled GPU, whose
    utilization NVML does not report and whose free memory is `free_mib` in slices of
    `mig_slice_mib`; `lost`: NVML lost the GPU (every value `-`)."""

    utilization: float | None = 0.0
    free_mib: int | None = 80_000
    temperature_c: int | None = 50
    allocated: bool | None = None
    offered: bool = True
    mig_slice_mib: int | None = None
    lost: bool = False


def runs(*specs: tuple[int, Gpu]) -> tuple[Gpu, ...]:
    """`runs((4, Gpu()), (4, Gpu(utilization=0.97)))`: a GPU table in runs of identical GPUs."""
    return tuple(spec for count, spec in specs for _ in range(count))


def gpu_node(
    name: str,
    table: Sequence[Gpu],
    *,
    age_s: float = 10.0,
    product: str = "NVIDIA A100-SXM4-80GB",
    total_mib: int = 81_920,
    overrides: Mapping[Field, str | None] | None = None,
    dra_devices: Sequence[str] | None = None,
) -> NodeInput:
    """A node annotated by the real agent aggregation from per-GPU readings: the node-level
    keys are the summaries the agent computes from the same GPUs (mean, maxima, fragmentation),
    and the per-GPU keys are published as the agent publishes them (`dra_devices`: each GPU's
    DRA device name, in index order, as the agent finds them by UUID in the driver's slice)."""
    readings: list[GpuReading] = []
    lost: list[str] = []
    shares: set[str] = set()
    taken: set[str] = set()
    for index, spec in enumerate(table):
        uuid = f"GPU-{name}-{index}"
        if spec.lost:
            lost.append(f"gpu {index}: lost")
            continue
        mig = spec.mig_slice_mib is not None
        devices = (f"MIG-{name}-{index}-0",) if mig else ()
        readings.append(
            GpuReading(
                uuid=uuid,
                index=index,
                name=product,
                utilization=None if mig else spec.utilization,
                memory_total_mib=total_mib,
                memory_free_mib=spec.free_mib,
                temperature_c=spec.temperature_c,
                mig_enabled=mig,
                memory_largest_allocation_mib=spec.mig_slice_mib,
                mig_device_uuids=devices,
            )
        )
        share = devices[0] if mig else uuid
        if spec.offered:
            shares.add(share)
        if spec.allocated:
            taken.add(share)
    known = any(spec.allocated is not None for spec in table)
    reading = NodeReading(
        sampled_at=NOW - timedelta(seconds=age_s),
        gpus=tuple(readings),
        device_count=len(table),
        lost=tuple(lost),
        allocations=DeviceAllocations(frozenset(shares), frozenset(taken)) if known else None,
    )
    named = {} if dra_devices is None else {f"GPU-{name}-{i}": d for i, d in enumerate(dra_devices)}
    annotations = encode(aggregate(reading, named))
    for f, value in (overrides or {}).items():
        if value is None:
            annotations.pop(DEFAULT_KEYS[f], None)
        else:
            annotations[DEFAULT_KEYS[f]] = value
    return NodeInput(name, annotations)


PER_GPU_FIELDS = (
    Field.PER_GPU_UTILIZATION,
    Field.PER_GPU_MEMORY_FREE_MIB,
    Field.PER_GPU_TEMPERATURE,
    Field.PER_GPU_ALLOCATED,
)


def without_per_gpu(the_node: NodeInput) -> NodeInput:
    """The same node as a writer (or reader) without per-GPU keys has it."""
    dropped = {DEFAULT_KEYS[f] for f in PER_GPU_FIELDS}
    annotations = {k: v for k, v in the_node.annotations.items() if k not in dropped}
    return NodeInput(the_node.name, annotations, the_node.agent_write_time)


def pod(
    *,
    gpus: int = 1,
    preference: str | None = None,
    fallback: str | None = None,
    max_utilization: str | None = None,
    min_memory_mib: str | None = None,
    expected_gpu_load: str | None = None,
    extra: Mapping[str, str] | None = None,
) -> PodInput:
    annotations = {"kubectl.kubernetes.io/last-applied-configuration": "{}"}
    for name, value in (
        ("gpu-model-preference", preference),
        ("gpu-fallback-utilization", fallback),
        ("max-utilization", max_utilization),
        ("min-gpu-memory-mib", min_memory_mib),
        ("expected-gpu-load", expected_gpu_load),
    ):
        if value is not None:
            annotations[PREFIX + name] = value
    annotations.update(extra or {})
    return PodInput("default", "gpu-pod", annotations, gpu_request=gpus)


def _before_now(age_s: float | None) -> datetime | None:
    return None if age_s is None else NOW - timedelta(seconds=age_s)


def bound_pod(
    name: str = "inflight",
    *,
    node_name: str = "node-a",
    gpus: int = 1,
    bound_age_s: float | None = 5.0,
    admitted_age_s: float | None = None,
    running_age_s: float | None = None,
    gpu_load: float | None = None,
    memory_mib: int | None = None,
    provisional: bool = False,
) -> BoundPod:
    """A GPU pod bound to `node_name` as the pod watch keeps it. Each `*_age_s` is how long
    before NOW it was bound, admitted by the kubelet (`status.startTime`) and had every
    container running; None: not yet (or, for the bind, unknown). By default it was bound 5 s
    ago and the kubelet has not reported it: allocation and load pending on any node data."""
    return BoundPod(
        namespace="default",
        name=name,
        uid=f"uid-{name}",
        node=node_name,
        gpus=gpus,
        bound_at=_before_now(bound_age_s),
        admitted_at=_before_now(admitted_age_s),
        running_since=_before_now(running_age_s),
        gpu_load_bp=None if gpu_load is None else round(gpu_load * BASIS_POINTS),
        memory_mib=memory_mib,
        provisional=provisional,
    )


def with_pods(the_node: NodeInput, *pods: BoundPod) -> NodeInput:
    """`the_node` with `pods` bound to it (as the pod watch hands them to a verdict)."""
    return msgspec.structs.replace(the_node, pods=tuple(pods))


def run(
    nodes: Sequence[NodeInput],
    the_pod: PodInput | None = None,
    policy: Policy | None = None,
    now: datetime = NOW,
) -> Evaluation:
    return evaluate(the_pod or pod(), nodes, now, policy or Policy(own_load=False))


def one(
    the_node: NodeInput,
    the_pod: PodInput | None = None,
    policy: Policy | None = None,
    now: datetime = NOW,
) -> NodeVerdict:
    evaluation = run([the_node], the_pod, policy, now)
    assert len(evaluation.verdicts) == 1
    return evaluation.verdicts[0]


STRICT = Policy(own_load=False, missing_data="strict")
