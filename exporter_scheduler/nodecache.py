"""Names-only mode: an in-memory map of every Node's GPU annotations, kept by list + watch.

With `nodeCacheCapable: true` kube-scheduler sends node names only, so the scorer needs the
annotations from somewhere, and the request path must never wait on the API server for them.
A background thread LISTs the Nodes once, then WATCHes from the list's resourceVersion and applies
each event to the map; requests read the map as it is at that moment.

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
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from itertools import repeat
from operator import is_
from types import MappingProxyType
from typing import Any, Final

import msgspec

from exporter_scheduler.metrics import ScorerMetrics
from exporter_scheduler.scoring import NodeInput, predecode
from exporter_scheduler.wire import agent_write_time
from gpu_contract.schema import DEFAULT_KEYS, Keys

log = logging.getLogger("exporter_scheduler.nodecache")

_NO_ANNOTATIONS: Final[Mapping[str, str]] = MappingProxyType({})


class _ManagedFieldsEntry(msgspec.Struct):
    manager: str | None = None
    time: str | None = None


class _Meta(msgspec.Struct):
    name: str | None = None
    resourceVersion: str | None = None  # noqa: N815 (Kubernetes JSON name)
    annotations: dict[str, str] | None = None
    managedFields: list[_ManagedFieldsEntry] | None = None  # noqa: N815
    # NodeList only: the token for the next page.
    # (`continue` is a Python keyword, hence the rename.)
    continue_: str | None = msgspec.field(default=None, name="continue")


class _Object(msgspec.Struct):
    """A Node, a NodeList's metadata carrier, or a `Status` in an ERROR event."""

    metadata: _Meta | None = None
    code: int | None = None
    reason: str | None = None
    message: str | None = None


class _NodeList(msgspec.Struct):
    metadata: _Meta | None = None
    items: list[_Object] | None = None


class _Event(msgspec.Struct):
    type: str = ""
    object: _Object | None = None


_LIST_DECODER: Final = msgspec.json.Decoder(_NodeList)
_EVENT_DECODER: Final = msgspec.json.Decoder(_Event)


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
    """Name -> `NodeInput` for every Node, kept current by a background list + watch.

    `lookup()`, `ready()` and `generation` are what the request path reads; none blocks or does
    I/O. The map is replaced whole after a LIST and changed one key at a time by watch events,
    both single reference/dict operations that are atomic for readers in other threads. Each
    node's annotations are decoded when its event arrives (`NodeInput.predecoded`), so requests
    never decode. `generation` grows after every change of what the scorer reads (a relist, a
    node added or deleted, a change of a node's agent annotations or agent write time; not the
    kubelet's status updates, which the scorer does not read): replies cached under one
    generation are never reused under another.
    """

    def __init__(
        self,
        *,
        kubeconfig: str | None = None,
        keys: Keys = DEFAULT_KEYS,
        metrics: ScorerMetrics | None = None,
        tuning: CacheTuning | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.kubeconfig = kubeconfig
        self.keys = keys
        self.metrics = metrics if metrics is not None else ScorerMetrics()
        self.tuning = tuning if tuning is not None else CacheTuning()
        self._rng = rng if rng is not None else random.Random()
        self._nodes: dict[str, NodeInput] = {}
        self._generation = 0
        self._ready = threading.Event()
        self._stop = threading.Event()
        self._changed = threading.Condition()
        self._resource_version: str | None = None
        self._response: Any = None
        self._api: Any = None
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ request path
    def ready(self) -> bool:
        return self._ready.is_set()

    def lookup(self, names: Sequence[str]) -> list[NodeInput]:
        nodes = self._nodes  # one snapshot for the whole request
        # `map` over the dict's `get` runs in C; the rare unknown names are filled in after.
        found: list[NodeInput | None] = list(map(nodes.get, names))
        # (`None in found` would call each NodeInput's __eq__; `is_` compares identities in C.)
        if any(map(is_, found, repeat(None))):
            return [
                node or NodeInput(name, _NO_ANNOTATIONS, None)
                for node, name in zip(found, names, strict=True)
            ]
        return found  # type: ignore[return-value]  # no None left

    @property
    def generation(self) -> int:
        """Changes whenever the data `lookup()` returns may have changed (see the class doc)."""
        return self._generation

    def __len__(self) -> int:
        return len(self._nodes)

    def names(self) -> list[str]:
        return sorted(self._nodes)

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> NodeCache:
        """Load credentials (raising at once if there are none) and start the background loop."""
        self._api = self._make_api()
        self._thread = threading.Thread(target=self._run, name="gpu-scorer-nodecache", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 10.0) -> None:
        self._stop.set()
        self._interrupt()
        with self._changed:
            self._changed.notify_all()
        if self._thread is not None:
            self._thread.join(timeout_s)

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
        fresh: dict[str, NodeInput] = {}
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
                page = _LIST_DECODER.decode(response.data)
            finally:
                response.release_conn()
            for item in page.items or ():
                node = self._node_input(item)
                if node is not None:
                    fresh[node.name] = node
            meta = page.metadata or _Meta()
            resource_version = meta.resourceVersion
            continue_token = meta.continue_
            if not continue_token:
                break
        self._nodes = fresh
        # Bumped after the map changed: a reader that saw the old generation may have read the
        # new map, never the reverse, so a reply is never filed under a newer generation than
        # its data.
        self._generation += 1
        self._resource_version = resource_version
        self.metrics.node_cache_relists.inc()
        self.metrics.node_cache_size.set(len(fresh))
        if not self._ready.is_set():
            log.info("node cache synced", extra={"fields": {"nodes": len(fresh)}})
        self._ready.set()
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
        try:
            event = _EVENT_DECODER.decode(line)
        except msgspec.DecodeError as exc:
            log.warning("undecodable watch event skipped", extra={"fields": {"error": str(exc)}})
            return
        obj = event.object or _Object()
        if event.type == "ERROR":
            if obj.code == 410:
                raise WatchExpiredError(obj.message or "410 Gone")
            raise RuntimeError(f"watch error event: {obj.code} {obj.reason}: {obj.message}")
        meta = obj.metadata or _Meta()
        if meta.resourceVersion:
            self._resource_version = meta.resourceVersion
        if event.type == "DELETED" and meta.name:
            if self._nodes.pop(meta.name, None) is not None:
                self._generation += 1
        elif event.type in ("ADDED", "MODIFIED"):
            node = self._node_input(obj)
            if node is None:
                return
            old = self._nodes.get(node.name)
            # A change the scorer does not read (kubelet status, labels, ...) keeps the entry
            # and the generation, so cached replies stay usable.
            if (
                old is None
                or old.agent_write_time != node.agent_write_time
                or old.annotations != node.annotations
            ):
                self._nodes[node.name] = node
                self._generation += 1
        else:
            # BOOKMARK (a skeleton Node with no name) or a type this client does not know.
            return
        self.metrics.node_cache_size.set(len(self._nodes))
        self._notify()

    def _node_input(self, obj: _Object) -> NodeInput | None:
        meta = obj.metadata
        if meta is None or not meta.name:
            return None
        prefix = self.keys.prefix
        # Only the agent's keys are kept: the rest (last-applied-configuration, ...) is memory
        # the scorer never reads.
        annotations = {k: v for k, v in (meta.annotations or {}).items() if k.startswith(prefix)}
        return NodeInput(
            name=meta.name,
            annotations=annotations,
            agent_write_time=agent_write_time(meta.managedFields),
            predecoded=(prefix, predecode(annotations, self.keys)),
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
