"""The Pod watch: every GPU pod bound or nominated to a node, so that verdicts count the in-flight
ones.

A node's annotations cannot show a pod placed on it until the kubelet, the agent and the watch
have all caught up (`exporter_scheduler.core.inflight`), so the scorer learns placements from the
pods themselves: a list + watch (`exporter_scheduler.edges.listwatch`) of the pods that are bound
and not finished, narrowed on the server by a field selector
(`spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed`: a pod that finishes leaves the
selection, and the server sends it as DELETED). Pods that ask for none of the GPU resource are
dropped as they are decoded; of the others only what a verdict reads is kept (`BoundPod`),
page by page as the first LIST arrives, so that no more than one page of decoded Pods is held.

kube-scheduler also says where it expects an unbound pod to go, in `status.nominatedNodeName`:
a gang member waiting at Permit for the rest of its gang, a pod whose PreBind takes time (a
volume being provisioned), both since v1.35 (KEP-5278), and a preemptor waiting for its victims
to leave. Such a pod holds its GPUs on that node in the scheduler's own accounting and will hold
them on the node once bound, so it counts as in flight there until it is bound (the bound record
replaces it), its nomination is cleared, or it is gone. A second list + watch selects exactly
those pods (`spec.nodeName=,status.nominatedNodeName!=`, not finished): widening the first
selector to every unfinished pod would also stream every pending pod's status update, one per
failed scheduling attempt, to learn of the few that are nominated. The cost is one more watch
connection and one more LIST at start and after each expiry, carrying only nominated pods. The
two watches are not ordered with each other: when a nominated pod binds, the second watch may
drop it a moment before the first shows it bound (milliseconds in which it does not count).
The scorer's own proposals (`propose`) cover the time before the scheduler nominates or binds;
a nomination replaces them as a binding does.

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
import threading
from collections.abc import Mapping, Sequence
from datetime import datetime
from types import MappingProxyType
from typing import Any, Final, Protocol, Self

import msgspec

from exporter_scheduler.core.inflight import NO_PODS, PROVISIONAL_MAX_S, BoundPod
from exporter_scheduler.edges.listwatch import CacheTuning, ListWatch, refusal_of
from exporter_scheduler.edges.podobjects import (
    EVENT,
    OBJECT,
    PAGE,
    PLACEMENT,
    bound_pod,
    nominated_pod,
    resource_key,
)
from exporter_scheduler.serving.metrics import ScorerMetrics
from exporter_scheduler.serving.wire import WireError, pod_gpu_request
from gpu_contract.schema import DEFAULT_KEYS, Keys

log = logging.getLogger("exporter_scheduler.podcache")

# Bound, and not finished: what can hold GPUs on a node.
FIELD_SELECTOR: Final = "spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed"
# Not bound, nominated to a node, not finished: what the scheduler expects to bind there.
NOMINATED_FIELD_SELECTOR: Final = (
    "spec.nodeName=,status.nominatedNodeName!=,status.phase!=Succeeded,status.phase!=Failed"
)

PodsByNode = Mapping[str, tuple[BoundPod, ...]]


class PodSink(Protocol):
    """Who is told of each node's bound GPU pods (the names-only node store)."""

    def set_pods(self, name: str, pods: tuple[BoundPod, ...]) -> bool: ...

    def replace_pods(self, pods: PodsByNode) -> None: ...


_EMPTY: Final[PodsByNode] = MappingProxyType({})


class PodCache(ListWatch):
    """Every bound or nominated GPU pod by node, kept current by two background list + watches
    (this loop for the bound pods, `_NominationWatch` for the nominated ones)."""

    kind = "pod"
    batched = True

    def __init__(
        self,
        *,
        kubeconfig: str | None = None,
        keys: Keys = DEFAULT_KEYS,
        gpu_resource_name: str = "nvidia.com/gpu",
        label_selector: str | None = None,
        metrics: ScorerMetrics | None = None,
        tuning: CacheTuning | None = None,
        rng: random.Random | None = None,
        api: Any = None,
    ) -> None:
        super().__init__(kubeconfig=kubeconfig, metrics=metrics, tuning=tuning, rng=rng, api=api)
        self.keys = keys
        self.resource = gpu_resource_name
        self._resource_key = resource_key(gpu_resource_name)
        # Both watches' label selector: {} for every pod the field selectors leave.
        self.selector: dict[str, str] = (
            {} if label_selector is None else {"label_selector": label_selector}
        )
        self._page = PAGE
        self._event = EVENT
        self._lock = threading.Lock()
        self._by_uid: dict[str, BoundPod] = {}
        self._by_node: dict[str, tuple[BoundPod, ...]] = {}
        # The scorer's own proposals (`propose`) by pod uid, until the watch shows the pod.
        self._proposed: dict[str, tuple[BoundPod, ...]] = {}
        # Pods kube-scheduler nominated and has not bound, by uid (the second watch's).
        self._nominated: dict[str, BoundPod] = {}
        self._nominations_failing = False
        self._nominations = _NominationWatch(
            self, kubeconfig=kubeconfig, metrics=self.metrics, tuning=tuning, rng=rng, api=api
        )
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

    def nominations(self) -> int:
        """Nominated, unbound GPU pods held (counted only while accounting is on)."""
        return len(self._nominated)

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> Self:
        super().start()
        self._nominations.share_api(self._api)
        self._nominations.start()
        return self

    def stop(self, timeout_s: float = 10.0) -> None:
        self._nominations.stop(timeout_s)
        super().stop(timeout_s)

    # ------------------------------------------------------------------ proposals
    def propose(self, pod: BoundPod, nodes: Sequence[str], now: datetime) -> None:
        """Count `pod` as in flight on each of `nodes`, where the scorer expects the scheduler
        to bind it, until the watch shows the pod bound (anywhere) or `PROVISIONAL_MAX_S`.

        Called on the request thread right after the reply is written, before the connection's
        next request is read: only dictionary work and the changed nodes judged again, no I/O.
        Ignored while in-flight accounting is off (no watch would ever confirm or drop the
        proposal)."""
        if not self._active or not pod.uid:
            return
        with self._lock:
            # Already bound, or nominated by the scheduler: the watch's record is the truth.
            if pod.uid in self._by_uid or pod.uid in self._nominated:
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
        return self._api.list_pod_for_all_namespaces(
            field_selector=FIELD_SELECTOR, **self.selector, **kwargs
        )

    def _list_path(self) -> tuple[str, dict[str, str]]:
        # Every bound pod, GPU or not unless the label selects: the largest LIST there is.
        query = {"fieldSelector": FIELD_SELECTOR}
        if "label_selector" in self.selector:
            query["labelSelector"] = self.selector["label_selector"]
        return "/api/v1/pods", query

    def _keep(self, items: list[Any]) -> list[Any]:
        # Only the bound GPU pods, as records. A raw Pod without the resource name as a key asks
        # for none (in a cluster that shares its GPU nodes with CPU work, most pods); any other
        # is read for its spec, and only a bound pod that asks for the resource is decoded whole.
        kept = []
        key = self._resource_key
        for raw in items:
            if key not in bytes(raw):  # a copy, and one scan in C: msgspec.Raw is no bytes
                continue
            spec = PLACEMENT.decode(raw).spec
            if spec is None or not spec.nodeName:
                continue
            try:
                if pod_gpu_request(spec, self.resource) <= 0:
                    continue
            except WireError:  # as `bound_pod` answers it
                continue
            pod = bound_pod(OBJECT.decode(raw), resource=self.resource, keys=self.keys)
            if pod is not None:
                kept.append(pod)
        return kept

    def _replace(self, items: list[Any]) -> None:
        by_uid: dict[str, BoundPod] = {pod.uid: pod for pod in items}
        by_node: dict[str, list[BoundPod]] = {}
        for pod in by_uid.values():
            by_node.setdefault(pod.node, []).append(pod)
        with self._lock:
            # A pod the LIST shows bound is no longer only nominated.
            self._nominated = {u: p for u, p in self._nominated.items() if u not in by_uid}
            for pod in self._nominated.values():
                by_node.setdefault(pod.node, []).append(pod)
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
            # Bound now: the nomination is over, whichever watch says so first.
            nominated = None if pod is None else self._nominated.get(uid)
            if pod == old and uid not in self._proposed and nominated is None:
                return False  # a change no verdict reads (labels, the kubelet's probes, ...)
            if nominated is not None:
                self._drop_nomination(uid)
            if pod is None:
                self._by_uid.pop(uid, None)
            else:
                self._by_uid[uid] = pod
            # The watch shows where the pod went, the truth: its proposals leave in the same
            # publish as its record arrives, so each node is judged again once (a bind where
            # the scorer proposed is one node, not two publishes of it), and no request sees
            # the node with neither.
            proposals = self._proposed.pop(uid, ())
            dropped = {id(proposal) for proposal in proposals}
            for node in sorted({p.node for p in (old, pod, *proposals) if p is not None}):
                pods = tuple(
                    p
                    for p in self.pods_of(node)
                    if (p.uid != uid or p.provisional) and id(p) not in dropped
                )
                if pod is not None and pod.node == node:
                    pods = _ordered([*pods, pod])
                self._publish(node, pods)
            self.metrics.pod_cache_pods.set(len(self._by_uid))
        return True

    def _on_failure(self, exc: Exception) -> None:
        # The nominations are the second watch's and stay with it; they are published again
        # with the bound pods by the next successful LIST.
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

    # ------------------------------------------------------------------ the nominations' hooks
    def _replace_nominations(self, items: list[Any]) -> None:
        nominated: dict[str, BoundPod] = {}
        for item in items:
            pod = nominated_pod(item, resource=self.resource, keys=self.keys)
            if pod is not None:
                nominated[pod.uid] = pod
        with self._lock:
            self._nominations_failing = False
            nodes = {p.node for p in (*self._nominated.values(), *nominated.values())}
            self._nominated = {u: p for u, p in nominated.items() if u not in self._by_uid}
            if self._active:
                for uid in self._nominated:
                    self._drop_proposals(uid)
                self._republish_nominations(nodes)

    def _on_nomination(self, kind: str, obj: Any) -> bool:
        meta = obj.metadata
        uid = meta.uid or f"{meta.namespace}/{meta.name}"
        pod = (
            None
            if kind == "DELETED"
            else nominated_pod(obj, resource=self.resource, keys=self.keys)
        )
        with self._lock:
            old = self._nominated.get(uid)
            if pod == old:
                return False
            if pod is not None and uid in self._by_uid:
                return False  # seen bound already (the watches are not ordered): bound wins
            if pod is None:
                self._drop_nomination(uid)
                return True
            self._nominated[uid] = pod
            if self._active:
                self._drop_proposals(uid)  # the scheduler's own expectation replaces the scorer's
                self._republish_nominations({pod.node} | ({old.node} if old is not None else set()))
        return True

    def _nominations_failed(self, exc: Exception) -> None:
        with self._lock:
            nodes = {p.node for p in self._nominated.values()}
            self._nominated = {}
            if self._active:
                self._republish_nominations(nodes)
            if not self._nominations_failing:
                self._nominations_failing = True
                log.warning(
                    "nominated pods not counted: verdicts count the bound pods alone",
                    extra={"fields": {"why": _why(exc)}},
                )

    def _drop_nomination(self, uid: str) -> None:
        """Under the lock: `uid` is no longer nominated (bound, cleared or gone)."""
        old = self._nominated.pop(uid, None)
        if old is not None and self._active:
            node = old.node
            self._publish(node, tuple(p for p in self.pods_of(node) if p is not old))

    def _republish_nominations(self, nodes: set[str]) -> None:
        """Under the lock: each of `nodes` publishes its pods with the nominations held now."""
        for node in sorted(nodes):
            pods = [p for p in self.pods_of(node) if not p.nominated]
            pods += [p for p in self._nominated.values() if p.node == node]
            self._publish(node, _ordered(pods))

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


class _NominationWatch(ListWatch):
    """The second list + watch: unbound pods with `status.nominatedNodeName`, handed to the
    `PodCache` that owns it (its loop's metrics: `gpu_scorer_nominated_pod_cache_*`)."""

    kind = "nominated_pod"

    def __init__(self, owner: PodCache, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._owner = owner
        self._page = PAGE
        self._event = EVENT

    def share_api(self, api: Any) -> None:
        """Use the owner's client (built once, at the owner's start)."""
        self._api = api

    def _list(self, **kwargs: Any) -> Any:
        return self._api.list_pod_for_all_namespaces(
            field_selector=NOMINATED_FIELD_SELECTOR, **self._owner.selector, **kwargs
        )

    def _keep(self, items: list[Any]) -> list[Any]:
        # A page holds its Pods raw (`PAGE`); the selector leaves only nominated, unbound pods,
        # few at any time, so each is decoded whole.
        return [OBJECT.decode(raw) for raw in items]

    def _replace(self, items: list[Any]) -> None:
        self._owner._replace_nominations(items)

    def _on_event(self, kind: str, obj: Any) -> bool:
        return self._owner._on_nomination(kind, obj)

    def _on_failure(self, exc: Exception) -> None:
        self._owner._nominations_failed(exc)
        self._resource_version = None  # relist: events missed while down are not replayed

    def _notify(self) -> None:
        super()._notify()
        self._owner._notify()  # whoever waits on the cache waits on both of its watches


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
    refusal = refusal_of(exc)
    if refusal is not None and refusal[0]:
        status, message = refusal
        return f"the pod list/watch failed: the API server answered {status}: {message[:200]}"
    return f"the pod list/watch failed: {type(exc).__name__}: {str(exc)[:200]}"
