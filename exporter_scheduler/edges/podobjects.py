"""What the Pod watch reads of a Pod, and the record it keeps of a GPU pod.

The watch decodes each Pod only as far as a verdict needs (msgspec structs naming those fields
alone); a LIST page keeps its Pods raw and reads each one's spec first (`PLACEMENT`), so a pod
that is not bound or asks for no GPU is never decoded whole. `bound_pod` and `nominated_pod`
turn what is read into the `BoundPod` records in-flight accounting counts.
"""

from __future__ import annotations

import json
import sys
from datetime import datetime
from typing import Any, Final

import msgspec

from exporter_scheduler.core.hints import (
    EXPECTED_GPU_LOAD,
    MIN_GPU_MEMORY_MIB,
    SPREAD_GROUP_LABEL,
    HintError,
    parse_hints,
)
from exporter_scheduler.core.inflight import BASIS_POINTS, BoundPod
from exporter_scheduler.core.workload import Owner, workload_of
from exporter_scheduler.serving.wire import PodSpec, WireError, pod_gpu_request
from gpu_contract.schema import DEFAULT_KEYS, Keys


class _Running(msgspec.Struct):
    startedAt: str | None = None  # noqa: N815 (Kubernetes JSON name)


class _State(msgspec.Struct):
    running: _Running | None = None


class _ContainerStatus(msgspec.Struct):
    state: _State | None = None


class _Condition(msgspec.Struct):
    type: str = ""
    status: str = ""
    lastTransitionTime: str | None = None  # noqa: N815


class _Status(msgspec.Struct):
    phase: str | None = None
    startTime: str | None = None  # noqa: N815
    nominatedNodeName: str | None = None  # noqa: N815
    conditions: list[_Condition] | None = None
    containerStatuses: list[_ContainerStatus] | None = None  # noqa: N815


class _Spec(PodSpec):
    nodeName: str | None = None  # noqa: N815


class _OwnerReference(msgspec.Struct):
    kind: str = ""
    name: str = ""
    controller: bool | None = None


class _Meta(msgspec.Struct):
    name: str | None = None
    namespace: str | None = None
    uid: str | None = None
    resourceVersion: str | None = None  # noqa: N815
    creationTimestamp: str | None = None  # noqa: N815
    annotations: dict[str, str] | None = None
    labels: dict[str, str] | None = None
    ownerReferences: list[_OwnerReference] | None = None  # noqa: N815
    # PodList only: the token for the next page (`continue` is a Python keyword).
    continue_: str | None = msgspec.field(default=None, name="continue")


class _Object(msgspec.Struct):
    """A Pod, a PodList's metadata carrier, or a Status in an ERROR event."""

    metadata: _Meta | None = None
    spec: _Spec | None = None
    # A Pod's status, or a Status object's own `status` ("Failure"): an ERROR event must
    # decode, or its 410 is never seen and the watch is retried from a version that is gone.
    status: _Status | str | None = None
    code: int | None = None
    reason: str | None = None
    message: str | None = None


class _PodList(msgspec.Struct):
    """A LIST page: each Pod left as its raw JSON (a view of the page, not copied), so that
    most pods, which ask for no GPU, are read once for their spec and never built whole."""

    metadata: _Meta | None = None
    items: list[msgspec.Raw] | None = None


class _Placement(msgspec.Struct):
    """What says whether a Pod holds GPUs on a node: its spec alone."""

    spec: _Spec | None = None


class _Event(msgspec.Struct):
    type: str = ""
    object: _Object | None = None


PAGE: Final = msgspec.json.Decoder(_PodList)
PLACEMENT: Final = msgspec.json.Decoder(_Placement)
OBJECT: Final = msgspec.json.Decoder(_Object)
EVENT: Final = msgspec.json.Decoder(_Event)


def resource_key(resource: str) -> bytes:
    """What a Pod's raw JSON holds wherever it asks for `resource` (a container's requests or
    limits, whose keys are resource names): the name's last segment as the end of a JSON key,
    `/gpu":` for `nvidia.com/gpu`. A Pod without it asks for none, and a LIST reads it no
    further: the search runs in C at several times the speed of decoding the Pod's spec, and
    most pods of a large cluster ask for no GPU. A toleration or node selector naming the
    resource holds it as a value, not a key, so the pods that tolerate a GPU taint are skipped
    too. It matches the name with its `/` escaped (`\\/`, which JSON allows) as well; a key
    that only ends the same way (`amd.com/gpu`) costs a decode. kube-apiserver, like every
    common JSON encoder, writes a key's closing quote and its colon together."""
    last = resource.rsplit("/", 1)[-1]
    tail = json.dumps(last).encode()[1:]  # the closing quote, not the opening one
    return (b"/" if "/" in resource else b'"') + tail + b":"


def _time(text: str | None) -> datetime | None:
    if not text:
        return None
    try:
        return datetime.fromisoformat(text)
    except ValueError:
        return None


def bound_pod(obj: Any, *, resource: str, keys: Keys = DEFAULT_KEYS) -> BoundPod | None:
    """What a verdict reads of a decoded Pod; None for a pod that holds none of `resource` (or
    is not bound)."""
    spec = obj.spec
    if spec is None or not spec.nodeName:
        return None
    return _pod_record(obj, spec.nodeName, resource=resource, keys=keys)


def nominated_pod(obj: Any, *, resource: str, keys: Keys = DEFAULT_KEYS) -> BoundPod | None:
    """What a verdict reads of a decoded Pod that kube-scheduler nominated to a node and has not
    bound; None for one that holds none of `resource`, is bound, or is not nominated."""
    spec, status = obj.spec, obj.status
    if spec is None or spec.nodeName or not isinstance(status, _Status):
        return None
    if not status.nominatedNodeName:
        return None
    pod = _pod_record(obj, status.nominatedNodeName, resource=resource, keys=keys)
    # No time bound: it counts until the scheduler binds it or drops the nomination.
    return None if pod is None else msgspec.structs.replace(pod, bound_at=None, nominated=True)


def _pod_record(obj: Any, node: str, *, resource: str, keys: Keys) -> BoundPod | None:
    meta, spec, status = obj.metadata, obj.spec, obj.status
    if meta is None or spec is None or not meta.name:
        return None
    try:
        gpus = pod_gpu_request(spec, resource)
    except WireError:  # the API server admits whole quantities only: not from a real server
        return None
    if gpus <= 0:
        return None
    status = status if isinstance(status, _Status) else _Status()
    bound_at = None
    for condition in status.conditions or ():
        if condition.type == "PodScheduled" and condition.status == "True":
            bound_at = _time(condition.lastTransitionTime)
    if bound_at is None:  # created with spec.nodeName: never scheduled
        bound_at = _time(meta.creationTimestamp)
    running_since = None
    statuses = status.containerStatuses or ()
    if statuses and len(statuses) >= len(spec.containers or ()):
        started = [
            _time(s.state.running.startedAt)
            if s.state is not None and s.state.running is not None
            else None
            for s in statuses
        ]
        if all(t is not None for t in started):
            running_since = max(t for t in started if t is not None)
    load_bp = memory_mib = None
    annotations = meta.annotations or {}
    if keys.prefix + EXPECTED_GPU_LOAD in annotations or keys.prefix + MIN_GPU_MEMORY_MIB in (
        annotations
    ):
        hints = parse_hints(annotations, keys)
        if not isinstance(hints, HintError):  # a bad hint: the policy's estimate instead
            if hints.expected_gpu_load is not None:
                load_bp = round(hints.expected_gpu_load * BASIS_POINTS)
            memory_mib = hints.min_gpu_memory_mib
    return BoundPod(
        namespace=sys.intern(meta.namespace or ""),
        name=meta.name,
        uid=meta.uid or f"{meta.namespace}/{meta.name}",
        node=sys.intern(node),
        gpus=gpus,
        bound_at=bound_at,
        admitted_at=_time(status.startTime),
        running_since=running_since,
        gpu_load_bp=load_bp,
        memory_mib=memory_mib,
        group=(meta.labels or {}).get(keys.prefix + SPREAD_GROUP_LABEL),
        workload=_workload(meta, keys.prefix),
    )


def _workload(meta: _Meta, prefix: str) -> str | None:
    owners = [
        Owner(owner.kind, owner.name, bool(owner.controller))
        for owner in meta.ownerReferences or ()
    ]
    key = workload_of(meta.namespace or "", meta.labels, owners, meta.annotations, prefix)
    return None if key is None else sys.intern(key)
