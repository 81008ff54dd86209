"""Names-only mode: every Node's GPU annotations and verdicts, kept current by list + watch.

With `nodeCacheCapable: true` kube-scheduler sends node names only, so the scorer needs the
annotations from somewhere, and the request path must never wait on the API server for them.
A background thread LISTs the Nodes once, then WATCHes from the list's resourceVersion and hands
each changed Node to a `NodeStore`, which judges it for every active pod class there and then; a
second thread re-judges verdicts whose time window ends (a node turning stale). Requests read the
store as it is at that moment.

This is the only scorer module that talks to the Kubernetes API, and it imports the `kubernetes`
client lazily, so the default full-node mode never loads it. It uses the real client's
`CoreV1Api.list_node` (so credentials, TLS and proxies behave as everywhere else) but reads the
bodies with msgspec instead of the client's model classes: a 5000-node LIST is ~30 MB, and only
names, annotations and the agent's `managedFields` time are kept.

What the API server does, and what this does about it (see the v1.36 wire captures):
- a watch from a resourceVersion the server no longer holds answers HTTP 200 and then one
  `ERROR` event with a `Status` of code 410 (after every API server restart too): relist;
- `BOOKMARK` events carry a skeleton Node with no name: only their resourceVersion is kept;
- a watch ends at its `timeoutSeconds` with a clean end of stream: rewatch from the last version;
- any connection or server error: retry with capped exponential back-off (with jitter, so a
  restarted API server is not hit by every scorer at once), keeping the map as it was.
"""

from __future__ import annotations

import logging
import random
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Final

import msgspec

from exporter_scheduler.metrics import ScorerMetrics
from exporter_scheduler.nodestore import DEFAULT_MAX_CLASSES, Clock, NodeStore, utc_now
from exporter_scheduler.scoring import NodeInput, predecode
from exporter_scheduler.wire import (
    agent_write_time,
    annotations_of,
    foreign_writer,
    gpu_annotations_type,
    gpu_keys,
    managed_fields_entry_type,
)
from gpu_contract.schema import DEFAULT_KEYS, Keys

log = logging.getLogger("exporter_scheduler.nodecache")

# The expiry timer wakes at least this often (a window ending sooner is waited for exactly),
# and at most this often, so that a verdict whose boundary is exactly now (judged again until
# its clock has moved past it) cannot spin the thread.
_EXPIRY_POLL_MAX_S: Final = 5.0
_EXPIRY_POLL_MIN_S: Final = 0.01


class _Decoders:
    """What is read of a LIST page or a watch event, for one annotation prefix: names,
    resourceVersions, the annotations under the prefix (the rest of a Node is skipped in C,
    not built as Python objects), managedFields' manager and time, an ERROR event's Status."""

    def __init__(self, keys: Keys) -> None:
        meta = msgspec.defstruct(
            "Meta",
            [
                ("name", str | None, None),
                ("resourceVersion", str | None, None),
                ("annotations", gpu_annotations_type(keys) | None, None),
                ("managedFields", tuple[managed_fields_entry_type(keys), ...] | None, None),  # type: ignore[misc]
                # NodeList only: the token for the next page (`continue` is a Python keyword).
                ("continue_", str | None, msgspec.field(default=None, name="continue")),
            ],
        )
        obj = msgspec.defstruct(
            "Object",  # a Node, a NodeList's metadata carrier, or a Status in an ERROR event
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


@dataclass(frozen=True, slots=True)
class CacheTuning:
    """Timeouts and back-off of the list + watch loop."""

    # The server ends each watch after this long (it may pick a little less); a fresh watch
    # then continues from the last resourceVersion seen.
    watch_timeout_s: int = 300
    # The client gives up on a silent connection this long after the server should have
    # spoken (bookmarks come about once a minute), to notice a half-open TCP connection.
    read_timeout_margin_s: float = 60.0
    connect_timeout_s: float = 10.0
    list_page_size: int = 500
    backoff_initial_s: float = 0.5
    backoff_max_s: float = 30.0


class WatchExpiredError(Exception):
    """The server no longer holds our resourceVersion (410 Gone): a relist is needed."""


class NodeCache:
    """Keeps a `NodeStore` (`store`) current with every Node, by a background list + watch.

    `lookup()`, `ready()`, `names()` and `store` are what the request path and the metrics read;
    none blocks or does I/O. Each node's annotations are decoded when its event arrives
    (`NodeInput.predecoded`) and a change the scorer does not read (the kubelet's status
    updates) leaves the store alone.
    """

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
    ) -> None:
        self.kubeconfig = kubeconfig
        self.keys = keys
        self.metrics = metrics if metrics is not None else ScorerMetrics()
        self.tuning = tuning if tuning is not None else CacheTuning()
        self.store = NodeStore(clock=clock, max_classes=max_classes)
        self._decoders = _Decoders(keys)
        self._rng = rng if rng is not None else random.Random()
        self._stop = threading.Event()
        self._changed = threading.Condition()
        self._resource_version: str | None = None
        self._response: Any = None
        self._api: Any = None
        self._threads: list[threading.Thread] = []

    # ------------------------------------------------------------------ request path
    def ready(self) -> bool:
        return self.store.ready()

    def lookup(self, names: Sequence[str]) -> list[NodeInput]:
        return self.store.lookup(names)

    def __len__(self) -> int:
        return len(self.store)

    def names(self) -> list[str]:
        return self.store.names()

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> NodeCache:
        """Load credentials (raising at once if there are none) and start the background loops."""
        self._api = self._make_api()
        self._threads = [
            threading.Thread(target=self._run, name="gpu-scorer-nodecache", daemon=True),
            threading.Thread(target=self._expire, name="gpu-scorer-verdict-expiry", daemon=True),
        ]
        for thread in self._threads:
            thread.start()
        return self

    def stop(self, timeout_s: float = 10.0) -> None:
        self._stop.set()
        self._interrupt()
        with self._changed:
            self._changed.notify_all()
        for thread in self._threads:
            thread.join(timeout_s)

    def __enter__(self) -> NodeCache:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def wait_until(self, predicate: Callable[[NodeCache], bool], timeout_s: float) -> bool:
        """Block until `predicate(self)` holds after a change, or the timeout (start-up, tests)."""
        with self._changed:
            return self._changed.wait_for(lambda: predicate(self), timeout_s)

    # ------------------------------------------------------------------ the loop
    def _make_api(self) -> Any:
        from kubernetes import client, config  # type: ignore[import-untyped]  # noqa: PLC0415

        configuration = client.Configuration()
        if self.kubeconfig:
            config.load_kube_config(config_file=self.kubeconfig, client_configuration=configuration)
        else:
            config.load_incluster_config(client_configuration=configuration)
        return client.CoreV1Api(client.ApiClient(configuration))

    def _run(self) -> None:
        backoff_s = self.tuning.backoff_initial_s
        while not self._stop.is_set():
            try:
                if self._resource_version is None:
                    self._relist()
                self._watch_once()
                self.metrics.node_cache_watch_restarts.labels("timeout").inc()
                backoff_s = self.tuning.backoff_initial_s
                continue
            except WatchExpiredError as exc:
                log.info("node watch expired; relisting", extra={"fields": {"detail": str(exc)}})
                self.metrics.node_cache_watch_restarts.labels("expired").inc()
                self._resource_version = None
                continue
            except Exception as exc:
                if self._stop.is_set():
                    break
                self.metrics.node_cache_watch_restarts.labels("error").inc()
                log.warning(
                    "node list/watch failed; retrying",
                    extra={
                        "fields": {
                            "error": f"{type(exc).__name__}: {str(exc)[:300]}",
                            "retry_in_s": round(backoff_s, 3),
                        }
                    },
                )
                self._notify()
            # Jitter in [backoff/2, backoff] spreads a fleet's reconnects after an outage.
            self._stop.wait(self._rng.uniform(backoff_s / 2, backoff_s))
            backoff_s = min(backoff_s * 2, self.tuning.backoff_max_s)

    def _timeouts(self, read_s: float) -> tuple[float, float]:
        return (self.tuning.connect_timeout_s, read_s)

    def _relist(self) -> None:
        fresh: list[NodeInput] = []
        continue_token: str | None = None
        resource_version: str | None = None
        while True:
            kwargs: dict[str, Any] = {"limit": self.tuning.list_page_size}
            if continue_token:
                kwargs["_continue"] = continue_token
            response = self._api.list_node(
                _preload_content=False,
                _request_timeout=self._timeouts(self.tuning.watch_timeout_s),
                **kwargs,
            )
            try:
                page = self._decoders.page.decode(response.data)
            finally:
                response.release_conn()
            for item in page.items or ():
                node = self._node_input(item)
                if node is not None:
                    fresh.append(node)
            meta = page.metadata
            resource_version = None if meta is None else meta.resourceVersion
            continue_token = None if meta is None else meta.continue_
            if not continue_token:
                break
        first = not self.store.ready()
        self.store.replace(fresh)  # unchanged nodes keep their verdicts
        self._resource_version = resource_version
        self.metrics.node_cache_relists.inc()
        self.metrics.node_cache_size.set(len(self.store))
        if first:
            log.info("node cache synced", extra={"fields": {"nodes": len(self.store)}})
        self.metrics.node_cache_ready.set(1)
        self._notify()

    def _watch_once(self) -> None:
        response = self._api.list_node(
            watch=True,
            resource_version=self._resource_version,
            allow_watch_bookmarks=True,
            timeout_seconds=self.tuning.watch_timeout_s,
            _preload_content=False,
            _request_timeout=self._timeouts(
                self.tuning.watch_timeout_s + self.tuning.read_timeout_margin_s
            ),
        )
        self._response = response
        try:
            if self._stop.is_set():
                return
            for line in _lines(response):
                self._apply(line)
        finally:
            self._response = None
            response.release_conn()

    def _apply(self, line: bytes) -> None:
        """One watch event: the changed node judged for every active pod class (timed)."""
        started = time.perf_counter()
        try:
            event = self._decoders.event.decode(line)
        except msgspec.DecodeError as exc:
            log.warning("undecodable watch event skipped", extra={"fields": {"error": str(exc)}})
            return
        obj = event.object
        if event.type == "ERROR":
            code, reason, message = (
                (None, None, None) if obj is None else (obj.code, obj.reason, obj.message)
            )
            if code == 410:
                raise WatchExpiredError(message or "410 Gone")
            raise RuntimeError(f"watch error event: {code} {reason}: {message}")
        if obj is None:
            return
        meta = obj.metadata
        if meta is None:
            return
        if meta.resourceVersion:
            self._resource_version = meta.resourceVersion
        if event.type == "DELETED" and meta.name:
            self.store.delete(meta.name)
        elif event.type in ("ADDED", "MODIFIED"):
            node = self._node_input(obj)
            if node is None:
                return
            # A change the scorer does not read (kubelet status, labels, ...) changes nothing.
            self.store.put(node)
        else:
            # BOOKMARK (a skeleton Node with no name) or a type this client does not know.
            return
        self.metrics.node_cache_size.set(len(self.store))
        self.metrics.node_cache_event_seconds.observe(time.perf_counter() - started)
        self._notify()

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
        annotations = annotations_of(meta.annotations, self._decoders.gpu_fields)
        return NodeInput(
            # Interned: every event of a node then carries the same name object, and the node
            # store's lookups by it compare identities (a request's names are other objects).
            name=sys.intern(meta.name),
            annotations=annotations,
            agent_write_time=agent_write_time(meta.managedFields),
            predecoded=(prefix, predecode(annotations, self.keys)),
            foreign_writer=foreign_writer(meta.managedFields),
        )

    def _interrupt(self) -> None:
        response = self._response
        if response is None:
            return
        try:
            # urllib3's shutdown() unblocks a read in progress in another thread.
            getattr(response, "shutdown", response.close)()
        except Exception:  # nothing left to interrupt
            log.debug("closing the watch response failed", exc_info=True)

    def _notify(self) -> None:
        with self._changed:
            self._changed.notify_all()


def _lines(response: Any) -> Iterator[bytes]:
    """Newline-delimited events from a streamed watch body (one event per chunk, usually)."""
    pending = b""
    for chunk in response.stream(amt=None, decode_content=False):
        pending += chunk
        while True:
            end = pending.find(b"\n")
            if end < 0:
                break
            line = pending[:end]
            pending = pending[end + 1 :]
            if line.strip():
                yield line
    if pending.strip():
        yield pending
