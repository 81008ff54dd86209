"""The Pod watch: every GPU pod bound to a node, so that verdicts count the in-flight ones.

A node's annotations cannot show a pod placed on it until the kubelet, the agent and the watch
have all caught up (`exporter_scheduler.core.inflight`), so the scorer learns placements from the
pods themselves: a list + watch (`exporter_scheduler.edges.listwatch`) of the pods that are bound
and not finished, narrowed on the server by a field selector
(`spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed`: a pod that finishes leaves the
selection, and the server sends it as DELETED). Pods that ask for none of the GPU resource are
dropped as they are decoded; of the others only what a verdict reads is kept (`BoundPod`).

Each change of a node's pods is handed to the sinks (the names-only node store, which judges
that node again for every active pod class; the full-node path reads `pods_of` per request).

Degradation: without RBAC for pods, or with the watch failing, the scorer schedules as it would
without in-flight accounting (every node's pods are forgotten, so a pod deleted meanwhile
cannot hold GPUs it no longer has). `gpu_scorer_inflight_accounting` says which state holds,
and one log line says why it changed; the next successful LIST turns it back on.
"""

from __future__ import annotations

import logging
import random
import sys
import threading
from collections.abc import Mapping, Sequence
from datetime import datetime
from types import MappingProxyType
from typing import Any, Final, Protocol

import msgspec

from exporter_scheduler.core.hints import (
    EXPECTED_GPU_LOAD,
    MIN_GPU_MEMORY_MIB,
    SPREAD_GROUP_LABEL,
    HintError,
    parse_hints,
)
from exporter_scheduler.core.inflight import BASIS_POINTS, NO_PODS, PROVISIONAL_MAX_S, BoundPod
from exporter_scheduler.core.workload import Owner, workload_of
from exporter_scheduler.edges.listwatch import CacheTuning, ListWatch
from exporter_scheduler.serving.metrics import ScorerMetrics
from exporter_scheduler.serving.wire import PodSpec, WireError, pod_gpu_request
from gpu_contract.schema import DEFAULT_KEYS, Keys

log = logging.getLogger("exporter_scheduler.podcache")

# Bound, and not finished: what can hold GPUs on a node.
FIELD_SELECTOR: Final = "spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed"

PodsByNode = Mapping[str, tuple[BoundPod, ...]]


class PodSink(Protocol):
    """Who is told of each node's bound GPU pods (the names-only node store)."""

    def set_pods(self, name: str, pods: tuple[BoundPod, ...]) -> bool: ...

    def replace_pods(self, pods: PodsByNode) -> None: ...


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
    metadata: _Meta | None = None
    items: list[_Object] | None = None


class _Event(msgspec.Struct):
    type: str = ""
    object: _Object | None = None


_PAGE: Final = msgspec.json.Decoder(_PodList)
_EVENT: Final = msgspec.json.Decoder(_Event)
_EMPTY: Final[PodsByNode] = MappingProxyType({})


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
    meta, spec, status = obj.metadata, obj.spec, obj.status
    if meta is None or spec is None or not spec.nodeName or not meta.name:
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
        node=sys.intern(spec.nodeName),
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


class PodCache(ListWatch):
    """Every bound GPU pod by node, kept current by a background list + watch."""

    kind = "pod"

    def __init__(
        self,
        *,
        kubeconfig: str | None = None,
        keys: Keys = DEFAULT_KEYS,
        gpu_resource_name: str = "nvidia.com/gpu",
        metrics: ScorerMetrics | None = None,
        tuning: CacheTuning | None = None,
        rng: random.Random | None = None,
        api: Any = None,
    ) -> None:
        super().__init__(kubeconfig=kubeconfig, metrics=metrics, tuning=tuning, rng=rng, api=api)
        self.keys = keys
        self.resource = gpu_resource_name
        self._page = _PAGE
        self._event = _EVENT
        self._lock = threading.Lock()
        self._by_uid: dict[str, BoundPod] = {}
        self._by_node: dict[str, tuple[BoundPod, ...]] = {}
        # The scorer's own proposals (`propose`) by pod uid, until the watch shows the pod.
        self._proposed: dict[str, tuple[BoundPod, ...]] = {}
        # Spread groups: (namespace, group) -> the members held, bound or proposed.
        self._groups: dict[tuple[str, str], dict[tuple[str, str, bool], BoundPod]] = {}
        self._sinks: list[PodSink] = []
        self._active: bool | None = None  # None until the first LIST or failure
        self.metrics.inflight_accounting.set(0)

    # ------------------------------------------------------------------ readers
    def add_sink(self, sink: PodSink) -> None:
        with self._lock:
            self._sinks.append(sink)
            sink.replace_pods(dict(self._by_node))

    @property
    def active(self) -> bool:
        """Whether in-flight accounting is on (the pods held are the server's, as of the watch)."""
        return self._active is True

    def pods_of(self, node: str) -> tuple[BoundPod, ...]:
        """The GPU pods bound to `node` (no I/O, no lock: one dict read)."""
        return self._by_node.get(node, NO_PODS)

    def group_pods(self, namespace: str, group: str) -> tuple[BoundPod, ...]:
        """The bound (and proposed) pods of spread group `group` in `namespace`."""
        members = self._groups.get((namespace, group))
        return () if members is None else tuple(members.values())

    def by_node(self) -> PodsByNode:
        return dict(self._by_node)

    def __len__(self) -> int:
        return len(self._by_uid)

    # ------------------------------------------------------------------ proposals
    def propose(self, pod: BoundPod, nodes: Sequence[str], now: datetime) -> None:
        """Count `pod` as in flight on each of `nodes`, where the scorer expects the scheduler
        to bind it, until the watch shows the pod bound (anywhere) or `PROVISIONAL_MAX_S`.

        Called on the request path after a reply is made: only dictionary work and the changed
        nodes judged again, no I/O. Ignored while in-flight accounting is off (no watch would
        ever confirm or drop the proposal)."""
        if not self._active or not pod.uid:
            return
        with self._lock:
            if pod.uid in self._by_uid:  # already bound: the watch's record is the truth
                return
            self._expire_proposals(now)
            self._drop_proposals(pod.uid)
            proposals = tuple(
                msgspec.structs.replace(pod, node=node, bound_at=now, provisional=True)
                for node in nodes
            )
            self._proposed[pod.uid] = proposals
            for proposal in proposals:
                self._publish(proposal.node, _ordered([*self.pods_of(proposal.node), proposal]))

    def forget(self, uid: str) -> None:
        """The pod is being scheduled again: its earlier proposals did not bind."""
        if uid in self._proposed:  # a dict read on the request path; the lock only when needed
            with self._lock:
                self._drop_proposals(uid)

    def proposals(self) -> int:
        return sum(map(len, self._proposed.values()))

    def _drop_proposals(self, uid: str) -> None:
        for proposal in self._proposed.pop(uid, ()):
            node = proposal.node
            self._publish(node, tuple(p for p in self.pods_of(node) if p is not proposal))

    def _ungroup(self, pod: BoundPod) -> None:
        assert pod.group is not None
        key = (pod.namespace, pod.group)
        members = self._groups.get(key)
        if members is not None:
            members.pop(_member(pod), None)
            if not members:
                del self._groups[key]

    def _regroup(self) -> None:
        """Under the lock: the group index rebuilt from every node's pods (after a LIST)."""
        groups: dict[tuple[str, str], dict[tuple[str, str, bool], BoundPod]] = {}
        for pods in self._by_node.values():
            for pod in pods:
                if pod.group is not None:
                    groups.setdefault((pod.namespace, pod.group), {})[_member(pod)] = pod
        self._groups = groups

    def _expire_proposals(self, now: datetime) -> None:
        for uid, proposals in list(self._proposed.items()):
            bound_at = proposals[0].bound_at if proposals else None
            if bound_at is None or (now - bound_at).total_seconds() >= PROVISIONAL_MAX_S:
                self._drop_proposals(uid)

    def _publish(self, node: str, pods: tuple[BoundPod, ...]) -> None:
        """Under the lock: `node`'s pods are now `pods`; every sink is told."""
        for pod in self._by_node.get(node, NO_PODS):
            if pod.group is not None:
                self._ungroup(pod)
        for pod in pods:
            if pod.group is not None:
                self._groups.setdefault((pod.namespace, pod.group), {})[_member(pod)] = pod
        if pods:
            self._by_node[node] = pods
        else:
            self._by_node.pop(node, None)
        for sink in self._sinks:
            sink.set_pods(node, pods)

    # ------------------------------------------------------------------ the loop's hooks
    def _list(self, **kwargs: Any) -> Any:
        return self._api.list_pod_for_all_namespaces(field_selector=FIELD_SELECTOR, **kwargs)

    def _replace(self, items: list[Any]) -> None:
        by_uid: dict[str, BoundPod] = {}
        for item in items:
            pod = bound_pod(item, resource=self.resource, keys=self.keys)
            if pod is not None:
                by_uid[pod.uid] = pod
        by_node: dict[str, list[BoundPod]] = {}
        for pod in by_uid.values():
            by_node.setdefault(pod.node, []).append(pod)
        with self._lock:
            self._by_uid = by_uid
            self._proposed = {}
            self._by_node = {node: _ordered(pods) for node, pods in by_node.items()}
            self._regroup()
            for sink in self._sinks:
                sink.replace_pods(self._by_node)
            self._set_active(True, "pod watch synced")
            self.metrics.pod_cache_pods.set(len(by_uid))

    def _on_event(self, kind: str, obj: Any) -> bool:
        meta = obj.metadata
        uid = meta.uid or f"{meta.namespace}/{meta.name}"
        pod = None if kind == "DELETED" else bound_pod(obj, resource=self.resource, keys=self.keys)
        with self._lock:
            old = self._by_uid.get(uid)
            if pod == old and uid not in self._proposed:
                return False  # a change no verdict reads (labels, the kubelet's probes, ...)
            self._drop_proposals(uid)  # the watch shows where the pod went: the truth
            if pod is None:
                self._by_uid.pop(uid, None)
            else:
                self._by_uid[uid] = pod
            for node in sorted({p.node for p in (old, pod) if p is not None}):
                pods = tuple(p for p in self.pods_of(node) if p.uid != uid or p.provisional)
                if pod is not None and pod.node == node:
                    pods = _ordered([*pods, pod])
                self._publish(node, pods)
            self.metrics.pod_cache_pods.set(len(self._by_uid))
        return True

    def _on_failure(self, exc: Exception) -> None:
        with self._lock:
            self._by_uid = {}
            self._proposed = {}
            self._by_node = {}
            self._groups = {}
            self._resource_version = None  # relist: events missed while down are not replayed
            for sink in self._sinks:
                sink.replace_pods(_EMPTY)
            self.metrics.pod_cache_pods.set(0)
            self._set_active(False, _why(exc))

    def _set_active(self, active: bool, why: str) -> None:
        if active == self._active:
            return
        self._active = active
        self.metrics.inflight_accounting.set(1 if active else 0)
        if active:
            log.info("in-flight accounting on", extra={"fields": {"why": why}})
        else:
            log.warning(
                "in-flight accounting off: verdicts read the nodes' annotations alone",
                extra={"fields": {"why": why}},
            )


def _member(pod: BoundPod) -> tuple[str, str, bool]:
    return (pod.uid, pod.node, pod.provisional)


def _ordered(pods: list[BoundPod] | tuple[BoundPod, ...]) -> tuple[BoundPod, ...]:
    # By uid (proposals after the pod's own record): the same pods give the same tuple,
    # whatever order their events came in.
    return tuple(sorted(pods, key=lambda p: (p.uid, p.provisional)))


def _why(exc: Exception) -> str:
    status = getattr(exc, "status", None)
    if status == 403:
        return (
            "the API server forbids listing pods (403): grant the scorer's service account "
            "list and watch on pods"
        )
    if status == 401:
        return "the API server rejected the scorer's credentials (401)"
    return f"the pod list/watch failed: {type(exc).__name__}: {str(exc)[:200]}"
