"""Names-only mode: every Node's GPU annotations and verdicts, kept current by list + watch.

With `nodeCacheCapable: true` kube-scheduler sends node names only, so the scorer needs the
annotations from somewhere, and the request path must never wait on the API server for them.
The list + watch loop (`exporter_scheduler.edges.listwatch`) LISTs the Nodes once, then WATCHes from
the list's resourceVersion and hands each changed Node to a `NodeStore`, which judges it for
every active pod class there and then; a second thread re-judges verdicts whose time window ends
(a node turning stale). Requests read the store as it is at that moment. A list or watch error
keeps the map as it was: the last known data of each node, dated by its own `updated-at`.

Only names, labels, annotations under the prefix and the agent's `managedFields` time are kept
of each Node, all of them metadata: the LIST and the WATCH ask for `PartialObjectMetadata`
(about 2.6 of a realistic GPU Node's 6.4 KB; the kubelet's status is most of the rest), and
from a server that sends whole Nodes instead the rest is skipped in C.
"""

from __future__ import annotations

import logging
import random
import sys
import threading
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any, Final

import msgspec

from exporter_scheduler.core.decoding import predecode
from exporter_scheduler.core.records import NodeInput
from exporter_scheduler.edges.listwatch import (
    CacheTuning,
    ListWatch,
    WatchExpiredError,
    call_list,
)
from exporter_scheduler.serving.metrics import ScorerMetrics
from exporter_scheduler.serving.nodeobjects import (
    agent_write_time,
    annotations_of,
    foreign_writer,
    gpu_annotations_type,
    gpu_keys,
    managed_fields_entry_type,
)
from exporter_scheduler.serving.nodestore import DEFAULT_MAX_CLASSES, Clock, NodeStore, utc_now
from exporter_scheduler.serving.workloads import WorkloadLoads
from gpu_contract.schema import DEFAULT_KEYS, Keys

__all__ = ["CacheTuning", "NodeCache", "WatchExpiredError"]

log = logging.getLogger("exporter_scheduler.nodecache")

# The expiry timer wakes at least this often (a window ending sooner is waited for exactly),
# and at most this often, so that a verdict whose boundary is exactly now (judged again until
# its clock has moved past it) cannot spin the thread.
_EXPIRY_POLL_MAX_S: Final = 5.0
_EXPIRY_POLL_MIN_S: Final = 0.01
_NO_LABELS: Final[Mapping[str, str]] = MappingProxyType({})


class _Decoders:
    """What is read of a LIST page or a watch event, for one annotation prefix: names,
    resourceVersions, labels, the annotations under the prefix (the rest of a Node is skipped in C,
    not built as Python objects), managedFields' manager and time, an ERROR event's Status."""

    def __init__(self, keys: Keys) -> None:
        meta = msgspec.defstruct(
            "Meta",
            [
                ("name", str | None, None),
                ("resourceVersion", str | None, None),
                ("labels", dict[str, str] | None, None),
                ("annotations", gpu_annotations_type(keys) | None, None),
                ("managedFields", tuple[managed_fields_entry_type(keys), ...] | None, None),  # type: ignore[misc]
                # A list's only: the token for the next page (`continue` is a Python keyword).
                ("continue_", str | None, msgspec.field(default=None, name="continue")),
            ],
        )
        obj = msgspec.defstruct(
            # A Node or its PartialObjectMetadata, a list's metadata carrier, or a Status in an
            # ERROR event (which the API server sends as it is, whatever was asked for).
            "Object",
            [
                ("metadata", meta | None, None),
                ("code", int | None, None),
                ("reason", str | None, None),
                ("message", str | None, None),
            ],
        )
        node_list = msgspec.defstruct(
            "NodeList",
            [("metadata", meta | None, None), ("items", list[obj] | None, None)],  # type: ignore[valid-type]
        )
        event = msgspec.defstruct("Event", [("type", str, ""), ("object", obj | None, None)])
        self.gpu_fields = gpu_keys(keys)
        self.page: msgspec.json.Decoder[Any] = msgspec.json.Decoder(node_list)
        self.event: msgspec.json.Decoder[Any] = msgspec.json.Decoder(event)


class NodeCache(ListWatch):
    """Keeps a `NodeStore` (`store`) current with every Node, by a background list + watch.

    `lookup()`, `ready()`, `names()` and `store` are what the request path and the metrics read;
    none blocks or does I/O. Each node's annotations are decoded when its event arrives
    (`NodeInput.predecoded`) and a change the scorer does not read (the kubelet's status
    updates) leaves the store alone.
    """

    kind = "node"
    batched = True
    metadata_only = True  # names, labels, annotations and managedFields are all it reads

    def __init__(
        self,
        *,
        kubeconfig: str | None = None,
        keys: Keys = DEFAULT_KEYS,
        metrics: ScorerMetrics | None = None,
        tuning: CacheTuning | None = None,
        rng: random.Random | None = None,
        clock: Clock = utc_now,
        max_classes: int = DEFAULT_MAX_CLASSES,
        workloads: WorkloadLoads | None = None,
    ) -> None:
        super().__init__(kubeconfig=kubeconfig, metrics=metrics, tuning=tuning, rng=rng)
        self.keys = keys
        self.store = NodeStore(clock=clock, max_classes=max_classes, learned=workloads)
        # Told of each node's data, to learn what each workload's pods use (workloads.py).
        self.workloads = workloads
        decoders = _Decoders(keys)
        self._gpu_fields = decoders.gpu_fields
        self._page = decoders.page
        self._event = decoders.event

    # ------------------------------------------------------------------ request path
    def ready(self) -> bool:
        return self.store.ready()

    def lookup(self, names: Sequence[str]) -> list[NodeInput]:
        return self.store.lookup(names)

    def __len__(self) -> int:
        return len(self.store)

    def names(self) -> list[str]:
        return self.store.names()

    # ------------------------------------------------------------------ the loop's hooks
    def _list(self, **kwargs: Any) -> Any:
        accept = self._accept(watch=bool(kwargs.get("watch")))
        return call_list(self._api, "/api/v1/nodes", accept=accept, **kwargs)

    def _list_path(self) -> tuple[str, dict[str, str]]:
        return "/api/v1/nodes", {}

    def _extra_threads(self) -> list[threading.Thread]:
        return [
            threading.Thread(target=self._expire, name="gpu-scorer-verdict-expiry", daemon=True)
        ]

    def _replace(self, items: list[Any]) -> None:
        fresh = [node for node in map(self._node_input, items) if node is not None]
        first = not self.store.ready()
        self.store.replace(fresh)  # unchanged nodes keep their verdicts
        if self.workloads is not None:
            for node in fresh:
                self.workloads.observe(node)
        self.metrics.node_cache_size.set(len(self.store))
        if first:
            log.info("node cache synced", extra={"fields": {"nodes": len(self.store)}})

    def _on_event(self, kind: str, obj: Any) -> bool:
        """One Node event: the changed node judged for every active pod class."""
        if kind == "DELETED":
            self.store.delete(obj.metadata.name)
        else:
            node = self._node_input(obj)
            if node is None:
                return False
            # A change the scorer does not read (kubelet status, labels, ...) changes nothing.
            self.store.put(node)
            if self.workloads is not None:
                self.workloads.observe(node)
        self.metrics.node_cache_size.set(len(self.store))
        return True

    def _expire(self) -> None:
        """Re-judge verdicts when their time window ends, so that requests find them current."""
        store = self.store
        while not self._stop.is_set():
            next_ts = store.next_expiry_ts()
            wait_s = _EXPIRY_POLL_MAX_S
            if next_ts is not None:
                wait_s = next_ts - store.clock().timestamp()
                wait_s = min(max(wait_s, _EXPIRY_POLL_MIN_S), _EXPIRY_POLL_MAX_S)
            if self._stop.wait(wait_s):
                return
            try:
                store.refresh_expired()
            except Exception:  # a bug must not stop the timer: requests still judge themselves
                log.exception("refreshing expired verdicts failed")

    def _node_input(self, obj: Any) -> NodeInput | None:
        meta = obj.metadata
        if meta is None or not meta.name:
            return None
        prefix = self.keys.prefix
        # Only the contract's keys were decoded: the rest (last-applied-configuration, ...) is
        # memory and time the scorer never needs.
        annotations = annotations_of(meta.annotations, self._gpu_fields)
        return NodeInput(
            # Interned: every event of a node then carries the same name object, and the node
            # store's lookups by it compare identities (a request's names are other objects).
            name=sys.intern(meta.name),
            annotations=annotations,
            agent_write_time=agent_write_time(meta.managedFields),
            predecoded=(prefix, predecode(annotations, self.keys)),
            foreign_writer=foreign_writer(meta.managedFields),
            labels=_frozen_labels(meta.labels),
        )


def _frozen_labels(labels: dict[str, str] | None) -> Mapping[str, str]:
    return _NO_LABELS if not labels else MappingProxyType(labels)
