"""The list + watch loop the scorer's caches share (Nodes, Pods), off the request path.

A background thread LISTs the objects once (in pages), then WATCHes from the list's
resourceVersion and hands each event to the cache. What the API server does, and what this
does about it (see the v1.36 wire captures):
- a watch from a resourceVersion the server no longer holds answers HTTP 200 and then one
  `ERROR` event with a `Status` of code 410 (after every API server restart too): relist;
- `BOOKMARK` events carry a skeleton object with no name: only their resourceVersion is kept;
- a watch ends at its `timeoutSeconds` with a clean end of stream: rewatch from the last version;
- any connection or server error: retry with capped exponential back-off (with jitter, so a
  restarted API server is not hit by every scorer at once), telling the cache (`_on_failure`),
  which keeps or drops what it holds as its data requires.

The real client's calls are used (so credentials, TLS and proxies behave as everywhere else),
except for the pages of a large LIST (every bound Pod, every Node), which a `PageReader` reads
over a connection of its own in batches, with the client's credentials and trust (pagereader.py
says why). Bodies are read with msgspec into structs that name only what the cache keeps: the
rest of each object is skipped in C, never built as Python objects. This module and the caches
built on it are the scorer's only Kubernetes edge; the client is imported lazily, so the
default full-node mode without a pod watch never loads it.
"""

from __future__ import annotations

import ctypes
import json
import logging
import random
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, ClassVar, Final, Self, cast

import msgspec
from prometheus_client import Counter, Gauge, Histogram

from exporter_scheduler.edges.pagereader import (
    Endpoint,
    ListRefusedError,
    PageReader,
    request_headers,
)
from exporter_scheduler.serving.metrics import ScorerMetrics
from gpu_contract.media import JSON, METADATA_LIST, METADATA_WATCH

log = logging.getLogger("exporter_scheduler.listwatch")

# A watch that ends sooner than this after opening is reopened after the back-off.
_SHORT_WATCH_S: Final = 1.0
# A read of the watch stream that took longer than this waited on the server (one the socket's
# buffer answers takes microseconds): the event it returned starts a batch (`event_batch_s`).
_IDLE_READ_S: Final = 0.002


def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's `malloc_trim`, where the C library has one (musl has not)."""
    try:
        return cast("Callable[[int], int]", ctypes.CDLL(None).malloc_trim)
    except (AttributeError, OSError):
        return None


# After a LIST the pages it read are free, but glibc keeps most of such a heap (in the watch
# thread's arena, above the records kept) unless asked. Measured at 20,000 Pods, one in five a
# GPU pod: 13.7-15.4 MiB of RSS added by the LIST, 3.5-4.5 MiB after a trim (performance.md).
_TRIM: Final = _malloc_trim()


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
    # An event that arrives on an idle watch of a batched kind (`ListWatch.batched`: Nodes and
    # bound Pods) waits this long before it is applied, and the events that come within it are
    # then read and applied back to back. The thread's wake-up is most of an event's cost: its
    # code and data leave the CPU's caches while it waits, and one Node event took 30 us
    # applied back to back against 240 us 10 ms after the last (performance.md). A Node's data
    # or a bind is seen up to this much later; proposals (`PodCache.propose`) already count a
    # pod before its bind is seen. 0: each as it comes.
    event_batch_s: float = 0.05


class WatchExpiredError(Exception):
    """The server no longer holds our resourceVersion (410 Gone): a relist is needed."""


@dataclass(frozen=True, slots=True)
class LoopMetrics:
    """The loop's own metrics, one set per watched kind."""

    relists: Counter
    restarts: Counter  # labelled by cause (`metrics.WATCH_RESTART_CAUSES`)
    ready: Gauge
    event_seconds: Histogram

    @classmethod
    def of(cls, metrics: ScorerMetrics, kind: str) -> LoopMetrics:
        """The `gpu_scorer_<kind>_cache_*` metrics of one watched kind."""
        prefix = f"{kind}_cache_"
        return cls(
            getattr(metrics, prefix + "relists"),
            getattr(metrics, prefix + "watch_restarts"),
            getattr(metrics, prefix + "ready"),
            getattr(metrics, prefix + "event_seconds"),
        )


def make_api(kubeconfig: str | None) -> Any:
    """A `CoreV1Api` from a kubeconfig, or the in-cluster credentials; raises when neither."""
    from kubernetes import client, config  # type: ignore[import-untyped]  # noqa: PLC0415

    configuration = client.Configuration()
    if kubeconfig:
        config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
    else:
        config.load_incluster_config(client_configuration=configuration)
    return client.CoreV1Api(client.ApiClient(configuration))


def refusal_of(exc: BaseException) -> tuple[int, str] | None:
    """What a failed client call says: (HTTP status, the server's message) for a refusal,
    (0, the error) for a connection that failed or dropped, None for anything else."""
    from kubernetes.client.exceptions import ApiException  # type: ignore[import-untyped]  # noqa: PLC0415
    from urllib3.exceptions import HTTPError  # noqa: PLC0415

    if isinstance(exc, ApiException | ListRefusedError):
        return int(exc.status or 0), _status_message(exc)
    if isinstance(exc, HTTPError | OSError):
        return 0, f"{type(exc).__name__}: {exc}"
    return None


def _status_message(exc: Any) -> str:
    """The API server's Status message of a refusal, else its reason phrase."""
    try:
        return str(json.loads(exc.body)["message"])
    except (TypeError, ValueError, KeyError):
        return str(exc.reason or "")


def watch_error(obj: Any) -> Exception:
    """An `ERROR` event's Status as the exception the loop acts on."""
    code, reason, message = (
        (None, None, None) if obj is None else (obj.code, obj.reason, obj.message)
    )
    if code == 410:
        return WatchExpiredError(message or "410 Gone")
    return RuntimeError(f"watch error event: {code} {reason}: {message}")


class ListWatch:
    """One kind's list + watch thread. Subclasses say how to list, decode and apply.

    Hooks: `_list(**kwargs)` (the client's list call), `_page` and `_event` (msgspec decoders
    of a list page and of a watch event, whose object has `metadata.resourceVersion`),
    `_keep(items)` for each page as it arrives (what the cache keeps of its objects),
    `_replace(kept)` after a full LIST with what `_keep` returned for every page,
    `_on_event(type, obj)` for each ADDED, MODIFIED or DELETED, and `_on_failure(exc)` when a
    list or watch failed.
    """

    kind: str = "object"
    # Whether this kind's events wait out `CacheTuning.event_batch_s`. Only the kinds whose
    # events are many and whose lateness something else covers (a bind: the proposal). Nothing
    # stands in for a claim's allocation until it is seen, so DRA pods are not held to it.
    batched: ClassVar[bool] = False
    # Whether the cache reads only its objects' metadata: its LIST pages and WATCH events then
    # ask for `PartialObjectMetadata` (`METADATA_LIST`, `METADATA_WATCH`).
    metadata_only: ClassVar[bool] = False
    _page: msgspec.json.Decoder[Any]
    _event: msgspec.json.Decoder[Any]

    def __init__(
        self,
        *,
        kubeconfig: str | None,
        metrics: ScorerMetrics | None,
        tuning: CacheTuning | None = None,
        rng: random.Random | None = None,
        api: Any = None,
    ) -> None:
        self.kubeconfig = kubeconfig
        self.metrics = metrics if metrics is not None else ScorerMetrics()
        self.tuning = tuning if tuning is not None else CacheTuning()
        self._loop_metrics = LoopMetrics.of(self.metrics, self.kind)
        self._rng = rng if rng is not None else random.Random()
        self._stop = threading.Event()
        self._changed = threading.Condition()
        self._resource_version: str | None = None
        self._response: Any = None
        self._reader: PageReader | None = None
        self._threads: list[threading.Thread] = []
        self._api = api  # built at `start` unless given (tests: a fake of the client's calls)

    # ------------------------------------------------------------------ hooks
    def _list(self, **kwargs: Any) -> Any:
        raise NotImplementedError

    def _list_path(self) -> tuple[str, dict[str, str]] | None:
        """The LIST's URL path and query (selectors), for a cache whose LIST is large enough to
        be read through a `PageReader`; None lists through the client's call (`_list`)."""
        return None

    def _keep(self, items: list[Any]) -> list[Any]:
        """What the cache keeps of one LIST page's decoded objects (all of them, unless a cache
        keeps less): called as each page arrives, so a page's objects are freed before the next
        page is read."""
        return items

    def _replace(self, items: list[Any]) -> None:
        raise NotImplementedError

    def _on_event(self, kind: str, obj: Any) -> bool:
        """Apply one event; False when it changed nothing the cache keeps."""
        raise NotImplementedError

    def _on_failure(self, exc: Exception) -> None:
        """A list or watch failed (the loop retries with back-off)."""

    def _extra_threads(self) -> list[threading.Thread]:
        return []

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> Self:
        """Load credentials (raising at once if there are none) and start the background loops."""
        if self._api is None:
            self._api = make_api(self.kubeconfig)
        self._threads = [
            threading.Thread(target=self._run, name=f"gpu-scorer-{self.kind}-watch", daemon=True),
            *self._extra_threads(),
        ]
        for thread in self._threads:
            thread.start()
        return self

    def stop(self, timeout_s: float = 10.0) -> None:
        self._stop.set()
        self._interrupt()
        self._notify()
        for thread in self._threads:
            thread.join(timeout_s)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def wait_until(self, predicate: Callable[[Self], bool], timeout_s: float) -> bool:
        """Block until `predicate(self)` holds after a change, or the timeout (start-up, tests)."""
        with self._changed:
            return self._changed.wait_for(lambda: predicate(self), timeout_s)

    # ------------------------------------------------------------------ the loop
    def _run(self) -> None:
        backoff_s = self.tuning.backoff_initial_s
        restarts = self._loop_metrics.restarts
        while not self._stop.is_set():
            try:
                if self._resource_version is None:
                    self._relist()
                    if self._stop.is_set():
                        break
                opened = time.monotonic()
                self._watch_once()
                restarts.labels("timeout").inc()
                if time.monotonic() - opened >= _SHORT_WATCH_S:
                    backoff_s = self.tuning.backoff_initial_s
                    continue
                # A stream closed as soon as it opened (a proxy, an overloaded server) is
                # retried with back-off, not at once: the loop must not spin.
            except WatchExpiredError as exc:
                log.info(
                    f"{self.kind} watch expired; relisting",
                    extra={"fields": {"detail": str(exc)}},
                )
                restarts.labels("expired").inc()
                self._resource_version = None
                continue
            except Exception as exc:
                if self._stop.is_set():
                    break
                restarts.labels("error").inc()
                log.warning(
                    f"{self.kind} list/watch failed; retrying",
                    extra={
                        "fields": {
                            "error": f"{type(exc).__name__}: {str(exc)[:300]}",
                            "retry_in_s": round(backoff_s, 3),
                        }
                    },
                )
                try:
                    self._on_failure(exc)
                except Exception:  # the cache's reaction must not stop the loop
                    log.exception(f"{self.kind} cache failure handling raised")
                self._notify()
            # Jitter in [backoff/2, backoff] spreads a fleet's reconnects after an outage.
            self._stop.wait(self._rng.uniform(backoff_s / 2, backoff_s))
            backoff_s = min(backoff_s * 2, self.tuning.backoff_max_s)

    def _accept(self, *, watch: bool) -> str:
        """The `Accept` header of this cache's LIST (`watch` False) or WATCH requests."""
        if not self.metadata_only:
            return JSON
        return METADATA_WATCH if watch else METADATA_LIST

    def _timeouts(self, read_s: float) -> tuple[float, float]:
        return (self.tuning.connect_timeout_s, read_s)

    def _relist(self) -> None:
        items: list[Any] = []
        continue_token: str | None = None
        resource_version: str | None = None
        located = self._list_path()
        self._reader = reader = None if located is None else self._open_reader()
        try:
            while True:
                if self._stop.is_set():
                    return  # stopped before the reader could be interrupted
                paging: dict[str, Any] = {"limit": self.tuning.list_page_size}
                if continue_token:
                    paging["continue"] = continue_token
                if reader is not None and located is not None:
                    body = reader.get(located[0], {**located[1], **paging})
                else:
                    body = self._client_page(paging)
                page = self._page.decode(body)
                del body
                # Page by page: a large cluster's LIST (150,000 pods) decoded whole before any
                # is dropped would be the process's peak memory, and CPython keeps most of a peak.
                items.extend(self._keep(page.items or []))
                meta = page.metadata
                del page  # before the next page is read and decoded
                resource_version = None if meta is None else meta.resourceVersion
                continue_token = None if meta is None else meta.continue_
                if not continue_token:
                    break
        finally:
            self._reader = None
            if reader is not None:
                reader.close()
        self._replace(items)
        del items
        if _TRIM is not None:
            # Once a LIST: up to tens of ms, each arena locked only while it is trimmed.
            _TRIM(0)
        self._resource_version = resource_version
        self._loop_metrics.relists.inc()
        self._loop_metrics.ready.set(1)
        self._notify()

    def _open_reader(self) -> PageReader | None:
        """A `PageReader` for this cache's LIST, where the client connects to the API server
        directly (no proxy)."""
        from urllib3 import ProxyManager  # noqa: PLC0415

        api_client = getattr(self._api, "api_client", None)
        if api_client is None:
            return None  # a fake of the client's calls (tests)
        if isinstance(getattr(api_client.rest_client, "pool_manager", None), ProxyManager):
            return None  # the client goes through a proxy (its configuration or HTTPS_PROXY)
        configuration = api_client.configuration
        endpoint = Endpoint.of(configuration)
        if endpoint is None:
            return None
        defaults = dict(api_client.default_headers)
        accept = self._accept(watch=False)
        return PageReader(
            endpoint,
            lambda: request_headers(configuration, defaults, accept),
            connect_timeout_s=self.tuning.connect_timeout_s,
            read_timeout_s=self.tuning.watch_timeout_s,
        )

    def _client_page(self, paging: dict[str, Any]) -> bytes:
        """One LIST page's body, through the client's list call."""
        if "continue" in paging:
            paging["_continue"] = paging.pop("continue")
        response = self._list(
            _preload_content=False,
            _request_timeout=self._timeouts(self.tuning.watch_timeout_s),
            **paging,
        )
        try:
            data: bytes = response.data
            return data
        finally:
            response.release_conn()

    def _watch_once(self) -> None:
        response = self._list(
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
        batch_s = self.tuning.event_batch_s if self.batched else 0.0
        try:
            if self._stop.is_set():
                return
            read_from = time.monotonic()
            for line in lines_of(response):
                # A read that waited on the server: this event woke the thread. Those that
                # follow within the batch gather in the socket's buffer meanwhile.
                woke = batch_s > 0 and time.monotonic() - read_from > _IDLE_READ_S
                if woke and self._stop.wait(batch_s):
                    return
                self._apply(line)
                read_from = time.monotonic()
        finally:
            self._response = None
            response.release_conn()

    def _apply(self, line: bytes) -> None:
        """One watch event, applied and timed."""
        started = time.perf_counter()
        try:
            event = self._event.decode(line)
        except msgspec.DecodeError as exc:
            log.warning(
                f"undecodable {self.kind} watch event skipped",
                extra={"fields": {"error": str(exc)}},
            )
            return
        obj = event.object
        if event.type == "ERROR":
            raise watch_error(obj)
        meta = None if obj is None else obj.metadata
        if meta is None:
            return
        if meta.resourceVersion:
            self._resource_version = meta.resourceVersion
        # BOOKMARK (a skeleton object with no name) or a type this client does not know.
        if event.type not in ("ADDED", "MODIFIED", "DELETED") or not meta.name:
            return
        if self._on_event(event.type, obj):
            self._loop_metrics.event_seconds.observe(time.perf_counter() - started)
            self._notify()

    def _interrupt(self) -> None:
        reader = self._reader
        if reader is not None:
            reader.close()  # unblocks a LIST page being read
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


def lines_of(response: Any) -> Iterator[bytes]:
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


def call_list(api: Any, path: str, *, accept: str = JSON, **kwargs: Any) -> Any:
    """A LIST or WATCH of `path` with the arguments the list + watch loop passes to a typed
    list call, through the client's `call_api` (the raw response, read by msgspec), asking for
    `accept` (a typed call sets its own)."""
    names = {
        "limit": "limit",
        "_continue": "continue",
        "resource_version": "resourceVersion",
        "allow_watch_bookmarks": "allowWatchBookmarks",
        "timeout_seconds": "timeoutSeconds",
        "watch": "watch",
    }
    query: list[tuple[str, str]] = []
    for arg, name in names.items():
        value = kwargs.get(arg)
        if value is None or value is False:
            continue
        query.append((name, "true" if value is True else str(value)))
    return api.api_client.call_api(
        path,
        "GET",
        query_params=query,
        header_params={"Accept": accept},
        auth_settings=["BearerToken"],
        _return_http_data_only=True,
        _preload_content=False,
        _request_timeout=kwargs.get("_request_timeout"),
    )
