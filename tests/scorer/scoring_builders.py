"""Small builders for scorer tests: a node as the agent would annotate it, a pod with hints."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta

from exporter_scheduler.policy import Policy
from exporter_scheduler.scoring import Evaluation, NodeInput, NodeVerdict, PodInput, evaluate
from gpu_contract.schema import DEFAULT_KEYS, Field, Health, NodeGpuState, encode

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
    overrides: Mapping[Field, str | None] | None = None,
) -> NodeInput:
    """A node annotated through the real contract; `overrides` set (or with None, delete) keys."""
    state = NodeGpuState(
        health=health,
        updated_at=NOW - timedelta(seconds=age_s),
        utilization=utilization,
        memory_fragmentation=fragmentation,
        memory_free_mib=None if largest_free_mib is None else largest_free_mib * 2,
        memory_largest_free_mib=largest_free_mib,
        temperature_c=temperature_c,
        gpu_model=model,
        gpu_count=8,
    )
    annotations = encode(state)
    for f, value in (overrides or {}).items():
        if value is None:
            annotations.pop(DEFAULT_KEYS[f], None)
        else:
            annotations[DEFAULT_KEYS[f]] = value
    written = None if write_age_s is None else NOW - timedelta(seconds=write_age_s)
    return NodeInput(name, annotations, written)


def pod(
    *,
    preference: str | None = None,
    fallback: str | None = None,
    max_utilization: str | None = None,
    min_memory_mib: str | None = None,
    extra: Mapping[str, str] | None = None,
) -> PodInput:
    annotations = {"kubectl.kubernetes.io/last-applied-configuration": "{}"}
    for name, value in (
        ("gpu-model-preference", preference),
        ("gpu-fallback-utilization", fallback),
        ("max-utilization", max_utilization),
        ("min-gpu-memory-mib", min_memory_mib),
    ):
        if value is not None:
            annotations[PREFIX + name] = value
    annotations.update(extra or {})
    return PodInput("default", "gpu-pod", annotations, gpu_request=1)


def run(
    nodes: Sequence[NodeInput],
    the_pod: PodInput | None = None,
    policy: Policy | None = None,
    now: datetime = NOW,
) -> Evaluation:
    return evaluate(the_pod or pod(), nodes, now, policy or Policy())


def one(
    the_node: NodeInput,
    the_pod: PodInput | None = None,
    policy: Policy | None = None,
    now: datetime = NOW,
) -> NodeVerdict:
    evaluation = run([the_node], the_pod, policy, now)
    assert len(evaluation.verdicts) == 1
    return evaluation.verdicts[0]


STRICT = Policy(missing_data="strict")
