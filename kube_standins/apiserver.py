"""A local stand-in for kube-apiserver v1.36's Node API, answering as the real server does.

The agent's tests drive the real `kubernetes` client against it over HTTP, the scorer's caches
(Nodes, Pods, Namespaces) LIST and WATCH it, and the demo runs it as its cluster. Pods and
Namespaces are read-only over HTTP (LIST, WATCH, GET): the scorer only reads them, and tests
write them through `put_pod`/`put_namespace`, so a fault or a 410 can be had at any moment.
Every answer follows the wire captures of a real v1.36.2 server (of Nodes; Pods and Namespaces
share their list, watch and error shapes): status codes, `Status` bodies byte for byte,
headers (`Audit-Id`, the API Priority and Fairness `X-Kubernetes-Pf-*` pair except on 401),
`Content-Length` for bodies up to 2 KiB and chunked transfer above (Go net/http's buffer),
managedFields times from an injectable clock, no-op patches that change nothing, watch streams
with one chunk per event, BOOKMARKs, and the `ERROR` 410 event inside an HTTP 200 for a
too-old resourceVersion.

Faults (`Fault`) let a test make the next matching requests fail with the real server's answer for
that status, hang, or drop the connection. Object semantics live in `kube_standins.objects`; this
module is the store, the watch fan-out and the HTTP edge.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import json
import logging
import select
import socket
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import KW_ONLY, dataclass, field
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Any, Final, Literal
from urllib.parse import parse_qs, urlsplit

from kube_standins import objects as ko
from kube_standins.objects import ApiError, JsonObj

__all__ = [
    "ApiServerStandIn",
    "Fault",
    "Headers",
    "ManualClock",
    "RecordedRequest",
]

_log = logging.getLogger(__name__)

# Go net/http buffers this much of a response before it must choose: a body that fits is sent
# with Content-Length, a larger one goes chunked (the captures: 1923 B fixed, 2759 B chunked).
_CHUNKING_THRESHOLD_B: Final = 2048
# API Priority and Fairness identifies the flow schema and priority level on every response that
# got past authentication. Fixed per stand-in, like a real cluster's bootstrap objects.
_PF_ADMIN: Final = ("6de92bb8-7657-42a4-a017-227450694c0f", "c9e2161b-1d4f-49e8-a410-7793617a711c")
_PF_ANONYMOUS: Final = (
    "36d29998-1ef9-4ec5-8768-8424f8cc5c30",
    "689a5a09-e39d-437c-ac3c-49df5174a887",
)
_VERSION: Final = {
    "major": "1",
    "minor": "36",
    "emulationMajor": "1",
    "emulationMinor": "36",
    "minCompatibilityMajor": "1",
    "minCompatibilityMinor": "35",
    "gitVersion": "v1.36.2",
    "gitCommit": "98b35193b2ac7a23a673325f5e9b830ecd5ba406",
    "gitTreeState": "clean",
    "buildDate": "2026-11-20T00:00:00Z",
    "goVersion": "go1.25.4",
    "compiler": "gc",
    "platform": "linux/amd64",
}
# Paths the default RBAC lets anonymous users read (system:public-info-viewer).
_PUBLIC_PATHS: Final = frozenset({"/version", "/healthz", "/livez", "/readyz"})
# A watch without timeoutSeconds lasts the server's --min-request-timeout.
_DEFAULT_WATCH_TIMEOUT_S: Final = 1800.0
# The real watch cache sends one BOOKMARK about 2 s before a watch's deadline (17.9 s into a 20 s
# watch, 73.8 s into a 75 s one) and none in a 4 s watch.
_PRE_DEADLINE_BOOKMARK_S: Final = 2.0
_PRE_DEADLINE_MIN_TIMEOUT_S: Final = 10.0
# How often an idle watch checks whether its client is still there.
_CLIENT_POLL_S: Final = 0.1
_REASONS: Final = {
    200: "OK",
    201: "Created",
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    409: "Conflict",
    410: "Gone",
    415: "Unsupported Media Type",
    422: "Unprocessable Entity",
    429: "Too Many Requests",
    500: "Internal Server Error",
    503: "Service Unavailable",
    504: "Gateway Timeout",
}
_MERGE: Final = "application/merge-patch+json"
_STRATEGIC: Final = "application/strategic-merge-patch+json"
_JSON_PATCH: Final = "application/json-patch+json"
_APPLY: Final = "application/apply-patch+yaml"
_BOOKMARK_SKELETON_STATUS: Final = {
    "daemonEndpoints": {"kubeletEndpoint": {"Port": 0}},
    "nodeInfo": {
        "machineID": "",
        "systemUUID": "",
        "bootID": "",
        "kernelVersion": "",
        "osImage": "",
        "containerRuntimeVersion": "",
        "kubeletVersion": "",
        "kubeProxyVersion": "",
        "operatingSystem": "",
        "architecture": "",
    },
}


class Headers(dict[str, str]):
    """Request headers with case-insensitive lookups (keys are stored lower-case)."""

    def __init__(self, items: Mapping[str, str] | None = None) -> None:
        super().__init__()
        for key, value in (items or {}).items():
            self[key] = value

    def __setitem__(self, key: str, value: str) -> None:
        super().__setitem__(key.lower(), value)

    def __getitem__(self, key: str) -> str:
        return super().__getitem__(key.lower())

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and super().__contains__(key.lower())

    def get(self, key: str, default: Any = None) -> Any:
        return super().get(key.lower(), default)


@dataclass(frozen=True, slots=True)
class RecordedRequest:
    """One request as the stand-in received it, and the status it answered (0: no answer)."""

    method: str
    path: str
    query: dict[str, list[str]]
    headers: Headers
    body: bytes
    status: int
    # time.monotonic() when the answer was chosen: tests measure a client's back-off with it.
    recorded_s: float = field(default_factory=time.monotonic)

    def param(self, name: str) -> str | None:
        """The first value of query parameter `name`, or None."""
        values = self.query.get(name)
        return values[0] if values else None

    def json(self) -> Any:
        """The body decoded as JSON."""
        return json.loads(self.body)


@dataclass(frozen=True, slots=True)
class Fault:
    """Make the next `times` matching requests fail.

    `status`: answer with the real server's body and headers for that code (401, 403, 404, 409,
    422, 429, 500, 503, 504; others get a generic Status). A 429 carries `Retry-After` only when
    `retry_after_s` is given. `reset`: close the connection without answering. `delay_s`: hold
    the answer that long first (with neither status nor reset, the request is then served).
    `end_stream`: answer HTTP 200 with an empty chunked body (a watch that ends as soon as it
    opens, as a proxy in front of the server may end it).
    `method` None matches any method; `path_contains` matches against the path with its query;
    `field_selector`, when given, matches only requests whose `fieldSelector` is exactly that
    (one of two watches of the same resource, told apart by their selectors).
    """

    status: int | None = None
    _: KW_ONLY
    times: int = 1
    method: str | None = "PATCH"
    path_contains: str | None = None
    retry_after_s: int | None = None
    reset: bool = False
    delay_s: float = 0.0
    end_stream: bool = False
    field_selector: str | None = None

    def matches(self, method: str, raw_path: str) -> bool:
        if self.method is not None and self.method.upper() != method.upper():
            return False
        if self.path_contains is not None and self.path_contains not in raw_path:
            return False
        if self.field_selector is None:
            return True
        query = parse_qs(urlsplit(raw_path).query, keep_blank_values=True)
        return _param(query, "fieldSelector") == self.field_selector


@dataclass(frozen=True, slots=True)
class _Event:
    rv: int
    type: Literal["ADDED", "MODIFIED", "DELETED"]
    old: JsonObj | None
    new: JsonObj
    resource: str = "nodes"
    key: str = ""  # the store key: the name, `namespace/name` for namespaced objects


@dataclass(slots=True)
class _Watch:
    """One open watch: events are pushed here by writers and drained by the serving thread."""

    cond: threading.Condition = field(default_factory=threading.Condition)
    pending: deque[_Event] = field(default_factory=deque)
    expired: str | None = None  # the ERROR message to send before closing
    stopping: bool = False
    last_rv: int = 0
    resource: str = "nodes"
    field_selector: str = ""
    # Events queue but are not sent (nor BOOKMARKs, which would claim them sent): `hold_watches`.
    held: bool = False


@dataclass(frozen=True, slots=True)
class _Selector:
    """A parsed label or field selector: (key, operator, values) requirements."""

    requirements: tuple[tuple[str, str, tuple[str, ...]], ...] = ()

    @staticmethod
    def parse(text: str | None) -> _Selector:
        if not text:
            return _Selector()
        reqs: list[tuple[str, str, tuple[str, ...]]] = []
        parts: list[str] = []
        depth = 0
        current = ""
        for ch in text:
            if ch == "(":
                depth += 1
            elif ch == ")":
                depth -= 1
            if ch == "," and depth == 0:
                parts.append(current)
                current = ""
            else:
                current += ch
        parts.append(current)
        for raw in parts:
            part = raw.strip()
            if not part:
                continue
            for op in ("!=", "==", "="):
                if op in part:
                    key, value = part.split(op, 1)
                    reqs.append((key.strip(), "!=" if op == "!=" else "=", (value.strip(),)))
                    break
            else:
                words = part.split(None, 1)
                if len(words) == 2 and words[1].split("(")[0].strip() in ("in", "notin"):
                    op_word, _, rest = words[1].partition("(")
                    values = tuple(v.strip() for v in rest.rstrip(")").split(",") if v.strip())
                    reqs.append((words[0], op_word.strip(), values))
                elif part.startswith("!"):
                    reqs.append((part[1:].strip(), "!exists", ()))
                else:
                    reqs.append((part, "exists", ()))
        return _Selector(tuple(reqs))

    def matches(self, values: Mapping[str, str]) -> bool:
        for key, op, wanted in self.requirements:
            present = key in values
            value = values.get(key)
            if op == "=" and value != wanted[0]:
                return False
            if op == "!=" and value == wanted[0]:
                return False
            if op == "in" and value not in wanted:
                return False
            if op == "notin" and present and value in wanted:
                return False
            if op == "exists" and not present:
                return False
            if op == "!exists" and present:
                return False
        return True


def _node_fields(node: Mapping[str, Any]) -> dict[str, str]:
    return {"metadata.name": str((node.get("metadata") or {}).get("name", ""))}


def _pod_fields(pod: Mapping[str, Any]) -> dict[str, str]:
    # The field labels kube-apiserver v1.36 supports for pods (pkg/registry/core/pod
    # `ToSelectableFields`); an unset field reads as "", so `spec.nodeName!=` means bound.
    meta, spec, status = (pod.get(k) or {} for k in ("metadata", "spec", "status"))
    return {
        "metadata.name": str(meta.get("name", "")),
        "metadata.namespace": str(meta.get("namespace", "")),
        "spec.nodeName": str(spec.get("nodeName", "")),
        "spec.restartPolicy": str(spec.get("restartPolicy", "")),
        "spec.schedulerName": str(spec.get("schedulerName", "")),
        "spec.serviceAccountName": str(spec.get("serviceAccountName", "")),
        "spec.hostNetwork": "true" if spec.get("hostNetwork") else "false",
        "status.phase": str(status.get("phase", "")),
        "status.podIP": str(status.get("podIP", "")),
        "status.nominatedNodeName": str(status.get("nominatedNodeName", "")),
    }


def _namespace_fields(namespace: Mapping[str, Any]) -> dict[str, str]:
    meta, status = (namespace.get(k) or {} for k in ("metadata", "status"))
    return {
        "metadata.name": str(meta.get("name", "")),
        "status.phase": str(status.get("phase", "")),
    }


@dataclass(frozen=True, slots=True)
class _Resource:
    """What differs between the resources the stand-in serves: names, scope, the field labels
    a fieldSelector may use, and the Go zero value a BOOKMARK carries."""

    plural: str
    kind: str
    namespaced: bool
    fields: Callable[[Mapping[str, Any]], dict[str, str]]
    # The zero-value object's spec and status as Go encodes them (fields without omitempty).
    skeleton_spec: JsonObj
    skeleton_status: JsonObj
    # Nodes ignore field labels they do not know (kept as it was); the others answer 400.
    strict_fields: bool = True


_NODES: Final = _Resource(
    "nodes", "Node", False, _node_fields, {}, _BOOKMARK_SKELETON_STATUS, False
)
# PodSpec.containers has no omitempty: the zero Pod encodes it as null.
_PODS: Final = _Resource("pods", "Pod", True, _pod_fields, {"containers": None}, {})
_NAMESPACES: Final = _Resource("namespaces", "Namespace", False, _namespace_fields, {}, {})
_RESOURCES: Final = {r.plural: r for r in (_NODES, _PODS, _NAMESPACES)}


@dataclass(frozen=True, slots=True)
class _Filter:
    labels: _Selector
    fields: _Selector
    resource: _Resource = _NODES

    @classmethod
    def from_query(cls, query: Mapping[str, list[str]], resource: _Resource = _NODES) -> _Filter:
        fields = _Selector.parse(_param(query, "fieldSelector"))
        if resource.strict_fields:
            known = resource.fields({})
            for key, _, _ in fields.requirements:
                if key not in known:
                    raise ko.failure(
                        400,
                        "BadRequest",
                        f"field label not supported: {key}",
                        with_details=False,
                    )
        return cls(_Selector.parse(_param(query, "labelSelector")), fields, resource)

    def matches(self, obj: Mapping[str, Any]) -> bool:
        meta = obj.get("metadata") or {}
        return self.labels.matches(meta.get("labels") or {}) and self.fields.matches(
            self.resource.fields(obj)
        )


def _default_clock() -> datetime:
    return datetime.now(UTC)


class ManualClock:
    """A server clock that moves only when told: `ApiServerStandIn(clock=ManualClock(t0))`."""

    def __init__(self, start: datetime) -> None:
        self._lock = threading.Lock()
        self._now = start if start.tzinfo is not None else start.replace(tzinfo=UTC)

    def __call__(self) -> datetime:
        with self._lock:
            return self._now

    def set(self, now: datetime) -> None:
        with self._lock:
            self._now = now if now.tzinfo is not None else now.replace(tzinfo=UTC)

    def advance(self, seconds: float) -> datetime:
        with self._lock:
            self._now += timedelta(seconds=seconds)
            return self._now


class ApiServerStandIn:
    """The Node API of a kube-apiserver v1.36 on loopback, with fault injection.

    Objects are stored canonically (as the server would encode them) and never mutated in place,
    so watch events and snapshots can share them. `clock` stamps creationTimestamp, managedFields
    `time` and the Date header. `bookmark_interval_s` is the period of watch BOOKMARKs (the real
    server's is about 60 s). `history_limit` bounds the events kept for watches and exact LISTs
    from an older resourceVersion; older ones answer 410 like a real watch cache.
    """

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        token: str | None = "test-token",
        clock: Callable[[], datetime] | None = None,
        bookmark_interval_s: float = 60.0,
        history_limit: int = 10_000,
        initial_resource_version: int = 200,
    ) -> None:
        self._host = host
        self._port = port
        self.token = token
        self._clock = clock or _default_clock
        self.bookmark_interval_s = bookmark_interval_s
        self._history_limit = history_limit
        self._lock = threading.RLock()
        # resource -> store key -> object; one resourceVersion sequence for all, as in etcd.
        self._objects: dict[str, dict[str, JsonObj]] = {plural: {} for plural in _RESOURCES}
        self._nodes = self._objects["nodes"]
        self._rv = initial_resource_version
        self._floor_rv = initial_resource_version
        self._floor_snapshots: dict[str, dict[str, JsonObj]] = {plural: {} for plural in _RESOURCES}
        self._history: deque[_Event] = deque()
        self._writes: dict[str, int] = {}
        self._watches: list[_Watch] = []
        self._held_selectors: set[str] = set()
        self._faults: list[list[Any]] = []  # [fault, remaining]
        self._requests: list[RecordedRequest] = []
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._connections: set[socket.socket] = set()
        self._conn_threads: set[threading.Thread] = set()
        self._stopping = threading.Event()

    # ----------------------------------------------------------------------------- lifecycle

    def start(self) -> None:
        """Bind and serve in background threads."""
        if self._server is not None:
            return
        standin = self

        class _BoundHandler(_Handler):
            server_ref = standin

        class _Server(ThreadingHTTPServer):
            daemon_threads = True
            block_on_close = False

            def process_request(self, request: Any, client_address: Any) -> None:
                thread = threading.Thread(
                    target=self._serve_one, args=(request, client_address), daemon=True
                )
                with standin._lock:
                    standin._connections.add(request)
                    standin._conn_threads.add(thread)
                thread.start()

            def _serve_one(self, request: Any, client_address: Any) -> None:
                try:
                    self.finish_request(request, client_address)
                except Exception:  # a broken client must never take the server down
                    _log.debug("connection from %s ended with an error", client_address)
                finally:
                    with standin._lock:
                        standin._connections.discard(request)
                        standin._conn_threads.discard(threading.current_thread())
                    self.shutdown_request(request)

            def handle_error(self, request: Any, client_address: Any) -> None:
                _log.debug("error serving %s", client_address)

        self._stopping.clear()
        self._server = _Server((self._host, self._port), _BoundHandler)
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        """Close open watches and connections and stop serving; returns promptly."""
        server = self._server
        if server is None:
            return
        self._stopping.set()
        with self._lock:
            watches = list(self._watches)
        for watch in watches:
            with watch.cond:
                watch.stopping = True
                watch.cond.notify_all()
        server.shutdown()
        with self._lock:
            connections = list(self._connections)
            threads = list(self._conn_threads)
        for conn in connections:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        for thread in threads:
            thread.join(timeout=5.0)
        server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
        self._server = None
        self._thread = None

    def __enter__(self) -> ApiServerStandIn:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    @property
    def url(self) -> str:
        if self._server is None:
            raise RuntimeError("the API server stand-in is not started")
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def write_kubeconfig(self, path: Path) -> Path:
        """Write a kubeconfig for the real kubernetes client (server = url, bearer token)."""
        return write_kubeconfig(path, url=self.url, token=self.token)

    # ----------------------------------------------------------------------------- test surface

    def put_node(self, node: Mapping[str, Any]) -> JsonObj:
        """Create or replace a Node directly in the store (no admission, no validation).

        Assigns uid, creationTimestamp (kept when replacing) and a new resourceVersion; keeps
        whatever managedFields the given object carries. Replacing with identical content is a
        no-op, as it would be on a real server. Returns a copy of the stored object.
        """
        obj = ko.canonical_node(node)
        name = str(obj["metadata"].get("name") or "")
        if not name:
            raise ValueError("a Node needs metadata.name")
        with self._lock:
            old = self._nodes.get(name)
            meta = obj["metadata"]
            if old is not None:
                meta.setdefault("uid", old["metadata"]["uid"])
                meta.setdefault("creationTimestamp", old["metadata"]["creationTimestamp"])
            else:
                meta.setdefault("uid", str(uuid.uuid4()))
                meta.setdefault("creationTimestamp", ko.format_time(self._clock()))
            obj = ko.canonical_node(obj)
            if old is not None and _same_content(old, obj):
                return ko.clone(old)
            stored = self._commit(name, obj, "MODIFIED" if old is not None else "ADDED")
            return ko.clone(stored)

    def node(self, name: str) -> JsonObj:
        """A deep copy of the stored Node; KeyError if there is none."""
        with self._lock:
            return ko.clone(self._nodes[name])

    def nodes(self) -> list[JsonObj]:
        with self._lock:
            return [ko.clone(self._nodes[n]) for n in sorted(self._nodes)]

    def delete_node(self, name: str) -> None:
        """Delete a Node (watchers get DELETED); KeyError if there is none."""
        with self._lock:
            if name not in self._nodes:
                raise KeyError(name)
            self._delete(name)

    def put_pod(self, pod: Mapping[str, Any]) -> JsonObj:
        """Create or replace a Pod directly in the store (no admission, no defaulting beyond
        what the server sets: uid, creationTimestamp, resourceVersion, `namespace: default`
        and `status.phase: Pending` when missing). Identical content is a no-op. Returns a copy."""
        obj = ko.canonical_pod(pod)
        meta = obj["metadata"]
        return self._put("pods", f"{meta['namespace']}/{meta['name']}", obj)

    def pod(self, namespace: str, name: str) -> JsonObj:
        """A deep copy of the stored Pod; KeyError if there is none."""
        with self._lock:
            return ko.clone(self._objects["pods"][f"{namespace}/{name}"])

    def delete_pod(self, namespace: str, name: str) -> None:
        """Delete a Pod (watchers get DELETED); KeyError if there is none."""
        with self._lock:
            if f"{namespace}/{name}" not in self._objects["pods"]:
                raise KeyError(f"{namespace}/{name}")
            self._delete(f"{namespace}/{name}", "pods")

    def put_namespace(self, namespace: Mapping[str, Any]) -> JsonObj:
        """Create or replace a Namespace directly in the store. As the real server does on
        every write, it gets the `kubernetes.io/metadata.name` label, `spec.finalizers:
        [kubernetes]` and `status.phase: Active` (when missing). Returns a copy."""
        obj = ko.canonical_namespace(namespace)
        return self._put("namespaces", obj["metadata"]["name"], obj)

    def namespace(self, name: str) -> JsonObj:
        """A deep copy of the stored Namespace; KeyError if there is none."""
        with self._lock:
            return ko.clone(self._objects["namespaces"][name])

    def delete_namespace(self, name: str) -> None:
        """Delete a Namespace at once (no Terminating phase: no controller runs here)."""
        with self._lock:
            if name not in self._objects["namespaces"]:
                raise KeyError(name)
            self._delete(name, "namespaces")

    def _put(self, resource: str, key: str, obj: JsonObj) -> JsonObj:
        with self._lock:
            old = self._objects[resource].get(key)
            meta = obj["metadata"]
            if old is not None:
                meta.setdefault("uid", old["metadata"]["uid"])
                meta.setdefault("creationTimestamp", old["metadata"]["creationTimestamp"])
            else:
                meta.setdefault("uid", str(uuid.uuid4()))
                meta.setdefault("creationTimestamp", ko.format_time(self._clock()))
            obj["metadata"] = ko.ordered_meta(meta)
            if old is not None and _same_content(old, obj):
                return ko.clone(old)
            kind: Literal["ADDED", "MODIFIED"] = "MODIFIED" if old is not None else "ADDED"
            return ko.clone(self._commit(key, obj, kind, resource))

    @property
    def requests(self) -> list[RecordedRequest]:
        with self._lock:
            return list(self._requests)

    def inject(self, fault: Fault) -> None:
        """Queue a fault; queued faults are consumed in order by the requests they match."""
        if fault.times < 1:
            raise ValueError("Fault.times must be at least 1")
        with self._lock:
            self._faults.append([fault, fault.times])

    def clear_faults(self) -> None:
        """Drop every queued fault (the outage is over)."""
        with self._lock:
            self._faults.clear()

    def expire_watches(self, *, restart: bool = True, field_selector: str | None = None) -> None:
        """Make every resourceVersion seen so far too old, as an apiserver restart does.

        Open watches get the ERROR 410 event ("too old resource version: X (Y)") and close; later
        watches from an older RV get the same event in an HTTP 200, exact LISTs and continue
        tokens from an older RV get a real HTTP 410. With `restart` the resourceVersion also
        moves on by one, as the restarted server's own writes move etcd's revision.
        With `field_selector`, only the open watches with exactly that `fieldSelector` get the
        event (a watcher that fell behind the server's window); the others stay open.
        """
        with self._lock:
            if restart:
                self._rv += 1
            self._floor_rv = self._rv
            self._floor_snapshots = {plural: dict(objs) for plural, objs in self._objects.items()}
            self._history.clear()
            watches = [
                w
                for w in self._watches
                if field_selector is None or w.field_selector == field_selector
            ]
            floor = self._floor_rv
        for watch in watches:
            with watch.cond:
                watch.expired = f"too old resource version: {watch.last_rv} ({floor})"
                watch.cond.notify_all()

    @contextlib.contextmanager
    def hold_watches(self, field_selector: str) -> Iterator[None]:
        """Hold the events of every watch (open now or opened inside the block) whose
        `fieldSelector` is exactly `field_selector`, and send them, in order, at the end.

        A real server's watches of one resource are independent streams: one may deliver a
        change well before another (a slower watch cache, a congested connection). Holding one
        makes that order happen on demand; the store, lists and other watches carry on.
        """
        self._hold(field_selector, held=True)
        try:
            yield
        finally:
            self._hold(field_selector, held=False)

    def _hold(self, field_selector: str, *, held: bool) -> None:
        with self._lock:
            if held:
                self._held_selectors.add(field_selector)
            else:
                self._held_selectors.discard(field_selector)
            watches = [w for w in self._watches if w.field_selector == field_selector]
        for watch in watches:
            with watch.cond:
                watch.held = held
                watch.cond.notify_all()

    @property
    def clock(self) -> Callable[[], datetime]:
        """The server's clock (a `ManualClock` when one was given)."""
        return self._clock

    @property
    def watch_count(self) -> int:
        with self._lock:
            return len(self._watches)

    @property
    def resource_version(self) -> int:
        with self._lock:
            return self._rv

    def node_writes(self, name: str) -> int:
        """Successful changing writes to `name` made over HTTP (create, patch, update)."""
        with self._lock:
            return self._writes.get(name, 0)

    # ----------------------------------------------------------------------------- store

    def _commit(
        self,
        name: str,
        obj: JsonObj,
        kind: Literal["ADDED", "MODIFIED", "DELETED"],
        resource: str = "nodes",
    ) -> JsonObj:
        """Store a new version under the lock, assign the next RV and fan it out to the
        watches of its resource. `name` is the store key (`namespace/name` for pods)."""
        self._rv += 1
        ko.with_resource_version(obj, self._rv)
        store = self._objects[resource]
        old = store.get(name)
        if kind == "DELETED":
            store.pop(name, None)
        else:
            store[name] = obj
        event = _Event(self._rv, kind, old, obj, resource, name)
        self._history.append(event)
        while len(self._history) > self._history_limit:
            dropped = self._history.popleft()
            _apply_event(self._floor_snapshots[dropped.resource], dropped)
            self._floor_rv = dropped.rv
        for watch in self._watches:
            if watch.resource != resource:
                continue
            with watch.cond:
                watch.pending.append(event)
                watch.cond.notify_all()
        return obj

    def _delete(self, name: str, resource: str = "nodes") -> JsonObj:
        obj = ko.clone(self._objects[resource][name])
        return self._commit(name, obj, "DELETED", resource)

    def _snapshot(self, rv: int, resource: str = "nodes") -> dict[str, JsonObj]:
        """The store of `resource` as it was at `rv` (floor <= rv <= current)."""
        state = dict(self._floor_snapshots[resource])
        for event in self._history:
            if event.rv > rv:
                break
            if event.resource == resource:
                _apply_event(state, event)
        return state

    def _now(self) -> datetime:
        return self._clock()

    # ----------------------------------------------------------------------------- faults

    def _take_fault(self, method: str, raw_path: str) -> Fault | None:
        with self._lock:
            for slot in self._faults:
                fault: Fault = slot[0]
                if fault.matches(method, raw_path):
                    slot[1] -= 1
                    if slot[1] <= 0:
                        self._faults.remove(slot)
                    return fault
        return None

    def _record(self, request: RecordedRequest) -> None:
        with self._lock:
            self._requests.append(request)

    def _count_write(self, name: str) -> None:
        self._writes[name] = self._writes.get(name, 0) + 1

    # ----------------------------------------------------------------------------- API verbs

    def api_get(self, name: str) -> JsonObj:
        with self._lock:
            node = self._nodes.get(name)
            if node is None:
                raise ko.not_found(name)
            return node

    def api_get_object(self, resource: str, key: str) -> JsonObj:
        """GET of a Pod (`namespace/name`) or Namespace: the object, or the real 404."""
        with self._lock:
            obj = self._objects[resource].get(key)
        if obj is None:
            name = key.rsplit("/", 1)[-1]
            raise ko.failure(
                404,
                "NotFound",
                f'{resource} "{name}" not found',
                {"name": name, "kind": resource},
            )
        return obj

    def api_list(self, query: Mapping[str, list[str]], resource: str = "nodes") -> JsonObj:
        kind = _RESOURCES[resource]
        rv_param = _param(query, "resourceVersion")
        match = _param(query, "resourceVersionMatch")
        limit = _int_param(query, "limit")
        token = _param(query, "continue")
        filt = _Filter.from_query(query, kind)
        live = self._objects[resource]
        with self._lock:
            start_after = ""
            if token:
                list_rv, start_after = self._decode_continue(token)
                if list_rv < self._floor_rv:
                    raise _expired(
                        "The provided continue parameter is too old to display a consistent "
                        "list result. You can start a new list without the continue parameter."
                    )
                state = self._snapshot(list_rv, resource)
            elif rv_param and rv_param != "0":
                list_rv = _rv_value(rv_param)
                if list_rv > self._rv:
                    raise _too_large_rv(list_rv, self._rv)
                if match == "Exact":
                    if list_rv < self._floor_rv:
                        raise _expired("The resourceVersion for the provided list is too old.")
                    state = self._snapshot(list_rv, resource)
                else:
                    list_rv, state = self._rv, dict(live)
            else:
                list_rv, state = self._rv, dict(live)
        names = sorted(n for n in state if n > start_after and filt.matches(state[n]))
        meta: JsonObj = {"resourceVersion": str(list_rv)}
        page = names
        if limit and limit > 0 and len(names) > limit:
            page = names[:limit]
            meta["continue"] = _encode_continue(list_rv, page[-1])
            if not filt.labels.requirements and not filt.fields.requirements:
                meta["remainingItemCount"] = len(names) - limit
        items = [_list_item(state[n]) for n in page]
        return {"kind": f"{kind.kind}List", "apiVersion": "v1", "metadata": meta, "items": items}

    def _decode_continue(self, token: str) -> tuple[int, str]:
        try:
            padded = token + "=" * (-len(token) % 4)
            data = json.loads(base64.urlsafe_b64decode(padded))
            rv = int(data["rv"])
            start = str(data["start"])
            if data.get("v") != "meta.k8s.io/v1" or not start.startswith("/"):
                raise ValueError(start)
        except (ValueError, KeyError, TypeError, binascii.Error) as exc:
            raise ko.bad_request(f"continue key is not valid: {exc}") from None
        # The token's start key is "/<last name>\x00": the next page starts after that name.
        return rv, start[1:].rstrip("\x00")

    def api_create(self, body: bytes, query: Mapping[str, list[str]], user_agent: str) -> JsonObj:
        obj = _decode_node_body(body)
        raw_meta = obj.get("metadata")
        meta: JsonObj = raw_meta if isinstance(raw_meta, dict) else {}
        name = str(meta.get("name") or "")
        if not name:
            raise ko.failure(
                422,
                "Invalid",
                'Node "" is invalid: metadata.name: Required value: name or generateName is '
                "required",
                {
                    "kind": "Node",
                    "causes": [
                        {
                            "reason": "FieldValueRequired",
                            "message": "Required value: name or generateName is required",
                            "field": "metadata.name",
                        }
                    ],
                },
            )
        bad = ko.non_string_map_value(obj, obj)
        if bad is not None:
            raise bad
        errors = ko.validate_node_meta(obj)
        if errors:
            raise ko.invalid_node(name, errors)
        manager = _field_manager(query, user_agent)
        now = self._now()
        with self._lock:
            if name in self._nodes:
                raise ko.already_exists(name)
            for key in ("uid", "resourceVersion", "managedFields", "creationTimestamp"):
                meta.pop(key, None)
            obj["metadata"] = meta
            new = ko.canonical_node(obj)
            # The creator owns what it sent, not the defaults the server fills in.
            new["metadata"]["managedFields"] = ko.created_managed_fields(
                obj, ko.Manager(manager, "Update", ""), now
            )
            new["metadata"]["uid"] = str(uuid.uuid4())
            new["metadata"]["creationTimestamp"] = ko.format_time(now)
            # The admission chain taints every new Node not-ready until a kubelet reports.
            spec = new.setdefault("spec", {})
            taints = spec.setdefault("taints", [])
            if not any(t.get("key") == "node.kubernetes.io/not-ready" for t in taints):
                taints.append({"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"})
            new = ko.canonical_node(new)
            stored = self._commit(name, new, "ADDED")
            self._count_write(name)
            return stored

    def api_delete(self, name: str) -> JsonObj:
        with self._lock:
            if name not in self._nodes:
                raise ko.not_found(name)
            uid = self._nodes[name]["metadata"].get("uid", "")
            self._delete(name)
        return {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Success",
            "details": {"name": name, "kind": "nodes", "uid": uid},
        }

    def api_patch(  # noqa: PLR0917  (the verb's inputs, as the HTTP edge has them)
        self,
        name: str,
        subresource: str,
        content_type: str,
        body: bytes,
        query: Mapping[str, list[str]],
        user_agent: str,
    ) -> JsonObj:
        media = content_type.split(";", 1)[0].strip().lower()
        if media not in (_MERGE, _STRATEGIC, _JSON_PATCH, _APPLY):
            raise ko.unsupported_media_type()
        manager_param = _param(query, "fieldManager")
        if media == _APPLY and not manager_param:
            raise ko.apply_without_field_manager()
        manager = _field_manager(query, user_agent)
        force = (_param(query, "force") or "").lower() == "true"
        with self._lock:
            live = self._nodes.get(name)
            if live is None:
                raise ko.not_found(name)
            now = self._now()
            patch_doc = _decode_patch(media, body)
            ident = ko.Manager(manager, "Apply" if media == _APPLY else "Update", subresource)
            live_doc = live  # every patch function below works on its own copy
            managed: list[JsonObj] | None = None
            if media == _MERGE:
                patched = ko.merge_patch(live_doc, patch_doc)
            elif media == _STRATEGIC:
                patched = ko.strategic_merge_patch(live_doc, patch_doc)
            elif media == _JSON_PATCH:
                try:
                    patched = ko.json_patch(live_doc, patch_doc)
                except ko.JsonPatchError:
                    raise ko.json_patch_rejected() from None
            else:
                if not isinstance(patch_doc, dict):
                    raise ko.bad_request(
                        "error decoding YAML: the apply configuration is not a map"
                    )
                patched = None
            if patched is not None:
                if not isinstance(patched, dict):
                    raise ko.json_patch_rejected()
                bad = ko.non_string_map_value(patched, patch_doc)
                if bad is not None:
                    raise bad
            self._check_precondition(name, live, patched if patched is not None else patch_doc)
            if patched is None:
                bad = ko.non_string_map_value(patch_doc, patch_doc)
                if bad is not None:
                    raise bad
                result = ko.server_side_apply(live, patch_doc, ident, now, force=force)
                patched, managed = result.obj, result.managed_fields
            new = _restrict_to_subresource(live, patched, subresource)
            new = ko.canonical_node(new)
            errors = ko.validate_node_meta(new)
            if errors:
                raise ko.invalid_node(name, errors)
            if managed is None:
                managed = ko.updated_managed_fields(live, new, ident, now)
            new["metadata"]["managedFields"] = managed
            new = ko.canonical_node(new)
            if _same_content(live, new) and _same_managed_sets(live, new):
                return live  # a no-op write: neither resourceVersion nor managedFields move
            stored = self._commit(name, new, "MODIFIED")
            self._count_write(name)
            return stored

    def api_update(
        self, name: str, subresource: str, body: bytes, query: Mapping[str, list[str]], ua: str
    ) -> JsonObj:
        obj = _decode_node_body(body)
        manager = _field_manager(query, ua)
        with self._lock:
            live = self._nodes.get(name)
            if live is None:
                raise ko.not_found(name)
            now = self._now()
            self._check_precondition(name, live, obj)
            bad = ko.non_string_map_value(obj, obj)
            if bad is not None:
                raise bad
            new = _restrict_to_subresource(live, obj, subresource)
            new = ko.canonical_node(new)
            errors = ko.validate_node_meta(new)
            if errors:
                raise ko.invalid_node(name, errors)
            new["metadata"]["managedFields"] = ko.updated_managed_fields(
                live, new, ko.Manager(manager, "Update", subresource), now
            )
            new = ko.canonical_node(new)
            if _same_content(live, new):
                return live
            stored = self._commit(name, new, "MODIFIED")
            self._count_write(name)
            return stored

    def _check_precondition(self, name: str, live: JsonObj, requested: Any) -> None:
        meta = requested.get("metadata") if isinstance(requested, dict) else None
        wanted = meta.get("resourceVersion") if isinstance(meta, dict) else None
        if wanted not in (None, "") and str(wanted) != live["metadata"]["resourceVersion"]:
            raise ko.conflict_modified(name)

    # ----------------------------------------------------------------------------- watch

    def _open_watch(
        self, query: Mapping[str, list[str]], resource: str = "nodes"
    ) -> tuple[_Watch | None, list[JsonObj], str | None, int]:
        """Register a watch; returns (watch, initial event lines, too-old error, start RV)."""
        kind = _RESOURCES[resource]
        rv_param = _param(query, "resourceVersion")
        bookmarks = _bool_param(query, "allowWatchBookmarks")
        initial_events = _bool_param(query, "sendInitialEvents")
        filt = _Filter.from_query(query, kind)
        live = self._objects[resource]
        with self._lock:
            lines: list[JsonObj] = []
            if rv_param and rv_param != "0" and not initial_events:
                start = _rv_value(rv_param)
                if start < self._floor_rv:
                    return None, [], f"too old resource version: {start} ({self._floor_rv})", start
                backlog = [e for e in self._history if e.rv > start and e.resource == resource]
            else:
                # No RV (or "0", or a streaming list): synthetic ADDED for the current state,
                # then the initial-events-end BOOKMARK, as the captures show.
                start = self._rv
                backlog = []
                for key in sorted(live):
                    if filt.matches(live[key]):
                        lines.append({"type": "ADDED", "object": live[key]})
                if bookmarks or initial_events:
                    lines.append(_bookmark(self._rv, initial_events_end=True, resource=kind))
            selector = _param(query, "fieldSelector") or ""
            watch = _Watch(
                last_rv=start,
                resource=resource,
                field_selector=selector,
                held=selector in self._held_selectors,
            )
            watch.pending.extend(backlog)
            self._watches.append(watch)
        return watch, lines, None, start

    def _close_watch(self, watch: _Watch) -> None:
        with self._lock:
            if watch in self._watches:
                self._watches.remove(watch)


def _apply_event(state: dict[str, JsonObj], event: _Event) -> None:
    if event.type == "DELETED":
        state.pop(event.key, None)
    else:
        state[event.key] = event.new


def _strip_volatile(obj: Mapping[str, Any]) -> JsonObj:
    # Shallow copies: only the top level and metadata change, the rest is compared as is.
    out = dict(obj)
    meta = dict(out.get("metadata") or {})
    for key in ("resourceVersion", "managedFields"):
        meta.pop(key, None)
    out["metadata"] = meta
    return out


def _same_content(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    return _strip_volatile(a) == _strip_volatile(b)


def _managed_sets(obj: Mapping[str, Any]) -> list[tuple[str, str, str, Any]]:
    return sorted(
        (
            (
                str(e.get("manager")),
                str(e.get("operation")),
                str(e.get("subresource", "")),
                json.dumps(e.get("fieldsV1"), sort_keys=True),
            )
            for e in (obj.get("metadata") or {}).get("managedFields") or []
        ),
    )


def _same_managed_sets(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    return _managed_sets(a) == _managed_sets(b)


def _restrict_to_subresource(live: JsonObj, patched: JsonObj, subresource: str) -> JsonObj:
    """Apply the Node strategies: the main resource ignores status, /status changes only status,
    and identity fields never change through a write."""
    new = ko.clone(patched)
    if subresource == "status":
        new = {**ko.clone(live), "status": new.get("status", {})}
    else:
        new["status"] = ko.clone(live.get("status", {}))
    meta = new.get("metadata")
    if not isinstance(meta, dict):
        meta = new["metadata"] = {}
    for key in ("name", "uid", "creationTimestamp", "resourceVersion", "managedFields"):
        if key in live["metadata"]:
            meta[key] = ko.clone(live["metadata"][key])
        else:
            meta.pop(key, None)
    return new


def _decode_patch(media: str, body: bytes) -> Any:
    try:
        doc = ko.decode_json(body)
    except ValueError as exc:
        if media == _APPLY:
            doc = _decode_yaml(body)
        else:
            raise ko.bad_request(f"error decoding patch: {exc}") from None
    if media == _JSON_PATCH and not isinstance(doc, list):
        raise ko.bad_request(
            f"error decoding patch: json: cannot unmarshal {ko.go_json_type(doc)} into Go value "
            "of type []handlers.jsonPatchOp"
        )
    if media in (_MERGE, _STRATEGIC) and not isinstance(doc, dict):
        raise ko.bad_request(
            f"error decoding patch: json: cannot unmarshal {ko.go_json_type(doc)} into Go value "
            "of type map[string]interface {}"
        )
    return doc


def _decode_yaml(body: bytes) -> Any:
    try:
        import yaml  # noqa: PLC0415  (optional: apply bodies are normally JSON)
    except ImportError:  # pragma: no cover - pyyaml ships with the kubernetes client
        raise ko.bad_request("error decoding YAML: yaml support unavailable") from None
    try:
        return yaml.safe_load(body)
    except yaml.YAMLError as exc:
        raise ko.bad_request(f"error decoding YAML: {exc}") from None


def write_kubeconfig(path: Path, *, url: str, token: str | None) -> Path:
    """Write a kubeconfig that points the kubernetes client at `url` (bearer `token`, if any)."""
    user = f"    token: {token}\n" if token is not None else "    {}\n"
    path.write_text(
        "apiVersion: v1\n"
        "kind: Config\n"
        "clusters:\n"
        "- name: standin\n"
        "  cluster:\n"
        f"    server: {url}\n"
        "contexts:\n"
        "- name: standin\n"
        "  context:\n"
        "    cluster: standin\n"
        "    user: standin\n"
        "current-context: standin\n"
        "users:\n"
        "- name: standin\n"
        "  user:\n" + user,
        encoding="utf-8",
    )
    return path


def _decode_node_body(body: bytes) -> JsonObj:
    """A create or update body: a JSON object, or the 400 a real server sends."""
    try:
        obj = ko.decode_json(body)
    except ValueError as exc:
        raise ko.bad_request(f"error decoding body: {exc}") from None
    if not isinstance(obj, dict):
        raise ko.bad_request(
            f"json: cannot unmarshal {ko.go_json_type(obj)} into Go value of type v1.Node"
        )
    return obj


def _expired(message: str) -> ApiError:
    return ko.failure(410, "Expired", message, with_details=False)


def _too_large_rv(wanted: int, current: int) -> ApiError:
    return ko.failure(
        504,
        "Timeout",
        f"Timeout: Too large resource version: {wanted}, current: {current}",
        {
            "causes": [
                {"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}
            ],
            "retryAfterSeconds": 1,
        },
    )


def _encode_continue(rv: int, last_name: str) -> str:
    token = ko.encode({"v": "meta.k8s.io/v1", "rv": rv, "start": f"/{last_name}\x00"})
    return base64.urlsafe_b64encode(token).decode("ascii").rstrip("=")


def _json_body(obj: Any) -> bytes:
    # Go's json.Encoder ends every document with a newline, and the server counts it.
    return ko.encode(obj) + b"\n"


def _list_item(node: JsonObj) -> JsonObj:
    # NodeList items carry no kind/apiVersion (the captures).
    return {k: v for k, v in node.items() if k not in ("kind", "apiVersion")}


def _bookmark(
    rv: int, *, initial_events_end: bool = False, resource: _Resource = _NODES
) -> JsonObj:
    meta: JsonObj = {"resourceVersion": str(rv)}
    if initial_events_end:
        meta["annotations"] = {"k8s.io/initial-events-end": "true"}
    return {
        "type": "BOOKMARK",
        "object": {
            "kind": resource.kind,
            "apiVersion": "v1",
            "metadata": meta,
            "spec": ko.clone(resource.skeleton_spec),
            "status": ko.clone(resource.skeleton_status),
        },
    }


def _error_event(message: str) -> JsonObj:
    return {
        "type": "ERROR",
        "object": ko.status_body(410, "Expired", message, with_details=False),
    }


def _param(query: Mapping[str, list[str]], name: str) -> str | None:
    values = query.get(name)
    return values[0] if values else None


def _int_param(query: Mapping[str, list[str]], name: str) -> int | None:
    value = _param(query, name)
    if value is None or value == "":
        return None
    try:
        return int(value)
    except ValueError:
        raise ko.bad_request(f"invalid value {value!r} for {name}") from None


def _bool_param(query: Mapping[str, list[str]], name: str) -> bool:
    return (_param(query, name) or "").lower() in ("1", "true")


def _rv_value(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise ko.failure(
            400, "BadRequest", f'invalid resource version: "{text}"', with_details=False
        )
    return value


def _field_manager(query: Mapping[str, list[str]], user_agent: str) -> str:
    # Without fieldManager the server names the manager after the User-Agent's product token.
    manager = _param(query, "fieldManager")
    if manager:
        return manager
    return user_agent.split("/", 1)[0] or "unknown"


def _fault_answer(fault: Fault, path: str, verb: str) -> tuple[int, bytes, list[tuple[str, str]]]:
    """The body and extra headers a real server sends with `fault.status`."""
    code = fault.status or 500
    name = _name_of(path)
    details: JsonObj = {"name": name, "kind": "nodes"} if name else {"kind": "nodes"}
    extra: list[tuple[str, str]] = []
    if code == 401:
        body = ko.status_body(401, "Unauthorized", "Unauthorized", with_details=False)
    elif code == 403:
        extra.append(("X-Content-Type-Options", "nosniff"))
        target = f'nodes "{name}"' if name else "nodes"
        body = ko.status_body(
            403,
            "Forbidden",
            f'{target} is forbidden: User "system:serviceaccount:default:nobody" cannot {verb} '
            'resource "nodes" in API group "" at the cluster scope',
            details,
        )
    elif code == 404:
        body = ko.not_found(name).body
    elif code == 409:
        body = ko.conflict_modified(name).body
    elif code == 422:
        body = ko.json_patch_rejected().body
    elif code == 429:
        # API Priority and Fairness rejects with Go's http.Error: plain text, not a Status.
        if fault.retry_after_s is not None:
            extra.append(("Retry-After", str(fault.retry_after_s)))
        extra.append(("X-Content-Type-Options", "nosniff"))
        return 429, b"Too many requests, please try again later.\n", extra
    elif code == 500:
        body = ko.status_body(
            500,
            "InternalError",
            "Internal error occurred: injected fault",
            {"causes": [{"message": "injected fault"}]},
        )
    elif code == 503:
        body = ko.status_body(
            503,
            "ServiceUnavailable",
            "The server is currently unable to handle the request",
            {},
        )
    elif code == 504:
        body = ko.status_body(
            504,
            "Timeout",
            "Timeout: request did not complete within requested timeout - context deadline "
            "exceeded",
            {},
        )
    else:
        body = ko.status_body(code, "Unknown", f"injected fault {code}", {})
    if fault.retry_after_s is not None and code != 429:
        extra.append(("Retry-After", str(fault.retry_after_s)))
    return code, _json_body(body), extra


def _name_of(path: str) -> str:
    parts = path.strip("/").split("/")
    return parts[3] if len(parts) >= 4 and parts[:3] == ["api", "v1", "nodes"] else ""


def _verb(method: str, path: str, query: Mapping[str, list[str]]) -> str:
    named = bool(_name_of(path))
    if method == "GET":
        if named:
            return "get"
        return "watch" if _bool_param(query, "watch") else "list"
    return {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}.get(
        method, method.lower()
    )


class _Handler(BaseHTTPRequestHandler):
    """HTTP/1.1 edge: parse, record, apply faults and auth, route, encode like Go net/http."""

    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # watch events must leave as soon as they are written
    server_ref: ApiServerStandIn

    def log_message(self, format: str, *args: Any) -> None:
        _log.debug("%s " + format, self.address_string(), *args)

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        # What Go net/http writes for a request it cannot parse, before any handler runs.
        self.close_connection = True
        status = f"{code} {_REASONS.get(code, 'Bad Request')}"
        with contextlib.suppress(OSError):
            self.wfile.write(
                f"HTTP/1.1 {status}\r\nContent-Type: text/plain; charset=utf-8\r\n"
                f"Connection: close\r\n\r\n{status}".encode("latin-1")
            )

    def do_GET(self) -> None:
        self._dispatch()

    def do_POST(self) -> None:
        self._dispatch()

    def do_PUT(self) -> None:
        self._dispatch()

    def do_PATCH(self) -> None:
        self._dispatch()

    def do_DELETE(self) -> None:
        self._dispatch()

    # -- plumbing

    def _read_body(self) -> bytes:
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            data = b""
            while True:
                size_line = self.rfile.readline()
                size = int(size_line.split(b";", 1)[0].strip() or b"0", 16)
                if size == 0:
                    self.rfile.readline()
                    return data
                data += self.rfile.read(size)
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length > 0 else b""

    def _head(
        self,
        code: int,
        *,
        content_type: str = "application/json",
        apf: tuple[str, str] | None = _PF_ADMIN,
        extra: list[tuple[str, str]] | None = None,
        length: int | None = None,
    ) -> bytes:
        # Go writes the handler's headers sorted by name, then Date, then the framing header.
        headers = [
            ("Audit-Id", str(uuid.uuid4())),
            ("Cache-Control", "no-cache, private"),
            ("Content-Type", content_type),
            *(extra or []),
        ]
        if apf is not None:
            headers += [
                ("X-Kubernetes-Pf-Flowschema-Uid", apf[0]),
                ("X-Kubernetes-Pf-Prioritylevel-Uid", apf[1]),
            ]
        headers.sort(key=lambda h: h[0])
        now = self.server_ref._now()
        if now.tzinfo is None:
            now = now.replace(tzinfo=UTC)
        headers.append(("Date", format_datetime(now.astimezone(UTC), usegmt=True)))
        if length is None:
            headers.append(("Transfer-Encoding", "chunked"))
        else:
            headers.append(("Content-Length", str(length)))
        lines = [f"HTTP/1.1 {code} {_REASONS.get(code, 'Unknown')}\r\n"]
        lines += [f"{k}: {v}\r\n" for k, v in headers]
        lines.append("\r\n")
        return "".join(lines).encode("latin-1")

    def _send(
        self,
        code: int,
        body: bytes,
        *,
        content_type: str = "application/json",
        apf: tuple[str, str] | None = _PF_ADMIN,
        extra: list[tuple[str, str]] | None = None,
    ) -> None:
        # One socket write per response: a head written apart from its body meets Nagle's
        # algorithm and the peer's delayed ACK, a 40 ms stall per request.
        if len(body) <= _CHUNKING_THRESHOLD_B:
            head = self._head(
                code, content_type=content_type, apf=apf, extra=extra, length=len(body)
            )
            self.wfile.write(head + body)
        else:
            # A single handler write larger than the buffer goes out as one chunk.
            head = self._head(code, content_type=content_type, apf=apf, extra=extra)
            self.wfile.write(head + b"%x\r\n" % len(body) + body + b"\r\n0\r\n\r\n")
        self.wfile.flush()

    def _client_gone(self) -> bool:
        """True when the watching client closed its end (a readable socket with no data)."""
        try:
            readable, _, _ = select.select([self.connection], [], [], 0)
            return bool(readable) and self.connection.recv(1, socket.MSG_PEEK) == b""
        except (OSError, ValueError):
            return True

    def _chunk(self, obj: JsonObj) -> None:
        data = ko.encode(obj) + b"\n"
        self.wfile.write(b"%x\r\n" % len(data) + data + b"\r\n")
        self.wfile.flush()

    # -- request flow

    def _dispatch(self) -> None:
        srv = self.server_ref
        try:
            body = self._read_body()
        except (OSError, ValueError):
            self.close_connection = True
            return
        split = urlsplit(self.path)
        path = split.path
        query = parse_qs(split.query, keep_blank_values=True)
        method = self.command.upper()

        def record(status: int) -> None:
            srv._record(
                RecordedRequest(method, path, query, Headers(dict(self.headers)), body, status)
            )

        fault = srv._take_fault(method, self.path)
        if fault is not None:
            if fault.delay_s > 0:
                srv._stopping.wait(fault.delay_s)
            if fault.reset:
                record(0)
                self.close_connection = True
                with contextlib.suppress(OSError):
                    self.connection.shutdown(socket.SHUT_RDWR)
                return
            if fault.end_stream:
                record(200)
                self.wfile.write(self._head(200) + b"0\r\n\r\n")
                self.wfile.flush()
                return
            if fault.status is not None:
                code, payload, extra = _fault_answer(fault, path, _verb(method, path, query))
                record(code)
                if code == 401:
                    self._send(code, payload, apf=None, extra=extra)
                elif code == 429:
                    self._send(code, payload, content_type="text/plain; charset=utf-8", extra=extra)
                else:
                    self._send(code, payload, extra=extra)
                return
        try:
            self._authorized_route(method, path, query, body, record)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        except Exception:  # a bug or a bad request must never kill the server
            _log.exception("stand-in failed on %s %s", method, self.path)
            error = ko.status_body(
                500, "InternalError", "Internal error occurred: stand-in failure", {}
            )
            record(500)
            with contextlib.suppress(OSError):
                self._send(500, _json_body(error))

    def _authorized_route(
        self,
        method: str,
        path: str,
        query: dict[str, list[str]],
        body: bytes,
        record: Callable[[int], None],
    ) -> None:
        srv = self.server_ref
        if srv.token is not None:
            auth = self.headers.get("Authorization")
            if auth is not None:
                scheme, _, presented = auth.partition(" ")
                if scheme.lower() != "bearer" or presented.strip() != srv.token:
                    error = ko.status_body(401, "Unauthorized", "Unauthorized", with_details=False)
                    record(401)
                    self._send(401, _json_body(error), apf=None)
                    return
            elif path not in _PUBLIC_PATHS:
                name = _name_of(path)
                verb = _verb(method, path, query)
                resource = "nodes/status" if path.endswith("/status") and name else "nodes"
                target = f'nodes "{name}"' if name else "nodes"
                details: JsonObj = {"name": name, "kind": "nodes"} if name else {"kind": "nodes"}
                error = ko.status_body(
                    403,
                    "Forbidden",
                    f'{target} is forbidden: User "system:anonymous" cannot {verb} resource '
                    f'"{resource}" in API group "" at the cluster scope',
                    details,
                )
                record(403)
                self._send(
                    403,
                    _json_body(error),
                    apf=_PF_ANONYMOUS,
                    extra=[("X-Content-Type-Options", "nosniff")],
                )
                return
        collection = path.rstrip("/").removeprefix("/api/v1/")
        if method == "GET" and collection in _RESOURCES and _bool_param(query, "watch"):
            self._serve_watch(query, record, collection)
            return
        try:
            code, obj = self._route(method, path, query, body)
        except ApiError as err:
            code, obj = err.code, err.body
        record(code)
        if path == "/version" and code == 200:
            payload = json.dumps(obj, indent=2).encode()
        else:
            payload = _json_body(obj)
        self._send(code, payload)

    def _route(
        self, method: str, path: str, query: dict[str, list[str]], body: bytes
    ) -> tuple[int, JsonObj]:
        srv = self.server_ref
        ua = self.headers.get("User-Agent") or ""
        parts = [p for p in path.split("/") if p]
        if path == "/version":
            if method != "GET":
                raise _method_not_allowed()
            return 200, dict(_VERSION)
        if parts[:3] in (["api", "v1", "pods"], ["api", "v1", "namespaces"]):
            return self._route_read_only(method, parts, query)
        subresource = parts[4] if len(parts) == 5 else ""
        if (
            parts[:3] != ["api", "v1", "nodes"]
            or len(parts) > 5
            or subresource not in ("", "status")
        ):
            raise ko.failure(
                404, "NotFound", "the server could not find the requested resource", {}
            )
        if len(parts) == 3:
            if method == "GET":
                return 200, srv.api_list(query)
            if method == "POST":
                return 201, srv.api_create(body, query, ua)
            raise _method_not_allowed()
        name = parts[3]
        if method == "GET":
            return 200, srv.api_get(name)
        if method == "PATCH":
            ctype = self.headers.get("Content-Type") or ""
            return 200, srv.api_patch(name, subresource, ctype, body, query, ua)
        if method == "PUT":
            return 200, srv.api_update(name, subresource, body, query, ua)
        if method == "DELETE" and not subresource:
            return 200, srv.api_delete(name)
        raise _method_not_allowed()

    def _route_read_only(
        self, method: str, parts: list[str], query: dict[str, list[str]]
    ) -> tuple[int, JsonObj]:
        """Pods and Namespaces: LIST (all namespaces for pods), GET of one, nothing else."""
        srv = self.server_ref
        if method != "GET":
            raise _method_not_allowed()
        if len(parts) == 3:
            return 200, srv.api_list(query, parts[2])
        if parts[2] == "namespaces" and len(parts) == 4:
            return 200, srv.api_get_object("namespaces", parts[3])
        if parts[2] == "namespaces" and len(parts) == 6 and parts[4] == "pods":
            return 200, srv.api_get_object("pods", f"{parts[3]}/{parts[5]}")
        raise ko.failure(404, "NotFound", "the server could not find the requested resource", {})

    def _serve_watch(
        self, query: dict[str, list[str]], record: Callable[[int], None], resource: str = "nodes"
    ) -> None:
        srv = self.server_ref
        kind = _RESOURCES[resource]
        try:
            requested = _int_param(query, "timeoutSeconds")
            watch, initial, too_old, _ = srv._open_watch(query, resource)
        except ApiError as err:
            record(err.code)
            self._send(err.code, _json_body(err.body))
            return
        record(200)
        timeout_s = _DEFAULT_WATCH_TIMEOUT_S
        if requested is not None and requested > 0:
            timeout_s = float(requested)
        bookmarks = _bool_param(query, "allowWatchBookmarks")
        filt = _Filter.from_query(query, kind)
        try:
            self.wfile.write(self._head(200))
            self.wfile.flush()
            if too_old is not None or watch is None:
                # A too-old RV: HTTP 200, one ERROR event, and the stream ends at once.
                self._chunk(_error_event(too_old or "too old resource version"))
                return
            self._stream(watch, initial, filt, timeout_s=timeout_s, bookmarks=bookmarks)
        except (BrokenPipeError, ConnectionResetError, OSError):
            self.close_connection = True
        finally:
            if watch is not None:
                srv._close_watch(watch)
            if not self.close_connection:
                with contextlib.suppress(OSError):
                    self.wfile.write(b"0\r\n\r\n")
                    self.wfile.flush()

    def _stream(
        self,
        watch: _Watch,
        initial: list[JsonObj],
        filt: _Filter,
        *,
        timeout_s: float,
        bookmarks: bool,
    ) -> None:
        srv = self.server_ref
        started = time.monotonic()
        deadline = started + timeout_s
        interval = max(srv.bookmark_interval_s, 0.01)
        next_bookmark = started + interval
        pre_deadline: float | None = None
        if bookmarks and timeout_s >= _PRE_DEADLINE_MIN_TIMEOUT_S:
            pre_deadline = deadline - _PRE_DEADLINE_BOOKMARK_S
        for first in initial:
            self._chunk(first)
        start_rv = watch.last_rv
        while True:
            now = time.monotonic()
            if now >= deadline:
                return
            wake = deadline
            if bookmarks:
                wake = min(wake, next_bookmark)
                if pre_deadline is not None:
                    wake = min(wake, pre_deadline)
            with watch.cond:
                idle = not watch.pending or watch.held
                if idle and watch.expired is None and not watch.stopping:
                    # Wake at least every poll period to notice a client that hung up.
                    watch.cond.wait(timeout=min(max(wake - now, 0.0), _CLIENT_POLL_S))
                held = watch.held
                events = [] if held else list(watch.pending)
                if not held:
                    watch.pending.clear()
                expired = watch.expired
                stopping = watch.stopping
            for event in events:
                # Events up to the requested RV (even a future one) are skipped silently.
                if event.rv <= start_rv:
                    continue
                line = _event_line(event, filt)
                watch.last_rv = event.rv
                if line is not None:
                    self._chunk(line)
            if expired is not None:
                self._chunk(_error_event(expired))
                return
            if stopping or self._client_gone():
                self.close_connection = True
                return
            now = time.monotonic()
            due = (
                bookmarks
                and not held
                and (now >= next_bookmark or (pre_deadline is not None and now >= pre_deadline))
            )
            if due and now < deadline:
                if pre_deadline is not None and now >= pre_deadline:
                    pre_deadline = None
                if now >= next_bookmark:
                    next_bookmark = now + interval
                self._chunk(_bookmark(srv.resource_version, resource=filt.resource))


def _event_line(event: _Event, filt: _Filter) -> JsonObj | None:
    """The watch line for `event` as seen through a selector (objects entering or leaving the
    selection appear as ADDED or DELETED)."""
    new_match = filt.matches(event.new)
    if event.type == "DELETED":
        return {"type": "DELETED", "object": event.new} if new_match else None
    old_match = event.old is not None and filt.matches(event.old)
    if event.type == "ADDED" or (new_match and not old_match):
        return {"type": "ADDED", "object": event.new} if new_match else None
    if new_match:
        return {"type": "MODIFIED", "object": event.new}
    if old_match:
        return {"type": "DELETED", "object": event.new}
    return None


def _method_not_allowed() -> ApiError:
    return ko.failure(
        405,
        "MethodNotAllowed",
        "the server does not allow this method on the requested resource",
        {},
    )
