"""The scorer's HTTP edge: a bare ASGI app served by uvicorn (httptools, asyncio).

This is the only scorer module that serves HTTP. kube-scheduler calls the extender for every pod
it schedules and waits for the answer, so the handler is kept to decode, evaluate, encode, all in
the event-loop thread (the work is CPU-only and short; a thread hop would cost more than it
saves) and with no I/O on the request path: node data in names-only mode comes from an in-memory
snapshot, and log records go through a queue (see `cli.configure_logging`).

Answers, by design:
- a request the scorer cannot use (malformed JSON, wrong types, no `Pod`, a body over the limit,
  a names-only request without `--node-cache`) gets 400 / 413 with a JSON body whose `Error`
  says why; for the scheduler any non-200 is an extender error (with `ignorable: true` it then
  schedules without the extender);
- an unexpected exception while evaluating never becomes a 500: `filter` answers 200 with
  `Error` set and no node passing (the scheduler shows the text in the pod's events and retries
  with back-off), `prioritize` answers 200 with a neutral score 0 for every node (scores only
  rank, so a neutral answer cannot place a pod where the filter refused it), and both are
  counted in `gpu_scorer_internal_errors` and logged with the traceback; an exception anywhere
  else in the handler gets the same kind of answer (prioritize: no scores at all);
- a names-only request before the node cache's first LIST is not judged blind: `filter`
  answers `Error` (the scheduler retries the pod with back-off), `prioritize` neutral scores.

Names-only replies are reused while nothing they depend on has changed (see `replycache`): the
scheduler asks about pod after pod with the same node list.

kube-scheduler's HTTP client keeps idle connections for 90 s, so the keep-alive timeout defaults
to 120 s: a server that closes first races the client's next request on that connection. asyncio
sets TCP_NODELAY on every accepted TCP socket, so small replies are not held back by Nagle.
"""

from __future__ import annotations

import logging
import ssl
import threading
import time
from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final, Literal, Protocol
from urllib.parse import parse_qs

import uvicorn

from exporter_scheduler import wire
from exporter_scheduler.explain import explain, render_text
from exporter_scheduler.metrics import ScorerMetrics, Verb, VerdictTally
from exporter_scheduler.policy import Policy
from exporter_scheduler.replycache import (
    DEFAULT_REPLY_CACHE_ENTRIES,
    CachedReply,
    ReplyCache,
    ReplyKey,
    pod_hint_items,
)
from exporter_scheduler.scoring import Evaluation, NodeInput, NodeVerdict, evaluate
from exporter_scheduler.verdictmemo import DEFAULT_MEMO_POD_KEYS, NamesJudgement, VerdictMemo
from gpu_contract.schema import format_timestamp

# 5000 full Nodes of ~6 KB are ~30 MB; twice that leaves room for bigger Node objects
# (many images, long annotations) without letting one request exhaust memory.
DEFAULT_MAX_BODY_BYTES: Final = 64 * 1024 * 1024
# Longer than kube-scheduler's 90 s idle-connection timeout (Go's default transport).
DEFAULT_KEEP_ALIVE_S: Final = 120

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
Clock = Callable[[], datetime]

JSON: Final = b"application/json"
NOT_READY_ERROR: Final = "gpu scorer node cache not synced yet (first Node LIST pending)"
TEXT: Final = b"text/plain; charset=utf-8"

log = logging.getLogger("exporter_scheduler.server")


def utc_now() -> datetime:
    return datetime.now(UTC)


class NodeSource(Protocol):
    """Where names-only requests find node data: an in-memory snapshot, never a remote call.

    A source that also has an integer `generation` attribute, changed whenever the data it
    returns may have changed (as `NodeCache` does), lets the app reuse replies; without one
    every request is evaluated.
    """

    def ready(self) -> bool: ...

    def lookup(self, names: Sequence[str]) -> list[NodeInput]:
        """One `NodeInput` per name, in order; an unknown name gets one with no annotations."""
        ...


@dataclass(frozen=True, slots=True)
class Response:
    status: int
    body: bytes
    content_type: bytes = JSON


class _TooLargeError(Exception):
    pass


class _DisconnectedError(Exception):
    pass


def normalize_path_prefix(prefix: str) -> str:
    """`/` -> ``, `scheduler/` -> `/scheduler`: the part before `/filter`."""
    stripped = prefix.strip().strip("/")
    return f"/{stripped}" if stripped else ""


class ScorerApp:
    """The ASGI application. `handle()` is the whole request path, usable without a server."""

    def __init__(
        self,
        *,
        policy: Policy,
        clock: Clock = utc_now,
        node_source: NodeSource | None = None,
        path_prefix: str = "/",
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        metrics: ScorerMetrics | None = None,
        reply_cache_entries: int = DEFAULT_REPLY_CACHE_ENTRIES,
        verdict_memo_pod_keys: int = DEFAULT_MEMO_POD_KEYS,
    ) -> None:
        self.policy = policy
        self.clock = clock
        self.node_source = node_source
        self.max_body_bytes = max_body_bytes
        self.metrics = metrics if metrics is not None else ScorerMetrics()
        # Names-only replies are reused while nothing they depend on changed (replycache.py);
        # only with a node source that says when its data changed (`generation`).
        self.reply_cache = ReplyCache(reply_cache_entries) if reply_cache_entries > 0 else None
        # Names-only misses judge only the nodes that changed (verdictmemo.py).
        self.verdict_memo = (
            VerdictMemo(verdict_memo_pod_keys) if verdict_memo_pod_keys > 0 else None
        )
        prefix = normalize_path_prefix(path_prefix)
        self._verbs: dict[str, Verb] = {
            f"{prefix}/filter": "filter",
            f"{prefix}/prioritize": "prioritize",
            f"{prefix}/explain": "explain",
        }

    # ------------------------------------------------------------------ ASGI
    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        method: str = scope["method"]
        path: str = scope["path"]
        try:
            if method == "POST" and path in self._verbs:
                body = await self._read_body(scope, receive)
                response = self.handle(
                    self._verbs[path], body, query=scope.get("query_string", b"")
                )
            else:
                response = self.handle_get(method, path)
        except _TooLargeError:
            self.metrics.bad_requests.labels("body_too_large").inc()
            response = Response(
                413,
                wire.encode_json(
                    {"Error": f"request body exceeds {self.max_body_bytes} bytes (max-body-bytes)"}
                ),
            )
        except _DisconnectedError:
            return
        except Exception as exc:  # a bug outside evaluate(): still a defined answer, never a 500
            response = self._unexpected(self._verbs.get(path), exc)
        await _respond(send, response)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _read_body(self, scope: Scope, receive: Receive) -> bytes:
        for name, value in scope["headers"]:
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    declared = 0
                if declared > self.max_body_bytes:
                    raise _TooLargeError
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise _DisconnectedError
            chunk: bytes = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:
                raise _TooLargeError
            chunks.append(chunk)
            if not message.get("more_body", False):
                return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    # ------------------------------------------------------------------ routes
    def handle_get(self, method: str, path: str) -> Response:
        if path in self._verbs:
            return _method_not_allowed("POST")
        if path not in ("/healthz", "/readyz", "/metrics"):
            return Response(404, wire.encode_json({"Error": f"no such path: {path[:200]}"}))
        if method not in ("GET", "HEAD"):
            return _method_not_allowed("GET")
        if path == "/healthz":
            return Response(200, b"ok\n", TEXT)
        if path == "/readyz":
            if self.node_source is None or self.node_source.ready():
                return Response(200, b"ok\n", TEXT)
            return Response(503, b"node cache has not completed its first list\n", TEXT)
        body, content_type = self.metrics.render()
        return Response(200, body, content_type.encode())

    def handle(self, verb: Verb, body: bytes, *, query: bytes = b"") -> Response:
        """Answer one extender call (`filter`, `prioritize` or `explain`) for a request body."""
        started = time.perf_counter()
        try:
            request = wire.decode_args(
                body, gpu_resource_name=self.policy.gpu_resource_name, decode_names=False
            )
        except wire.WireError as exc:
            self.metrics.bad_requests.labels(exc.cause).inc()
            return _bad_request(verb, str(exc))
        if request.form == "names" and self.node_source is None:
            try:
                wire.with_node_names(request)  # a malformed list is reported as such first
            except wire.WireError as exc:
                self.metrics.bad_requests.labels(exc.cause).inc()
                return _bad_request(verb, str(exc))
            self.metrics.bad_requests.labels("names_without_node_cache").inc()
            return _bad_request(
                verb,
                "the request carries NodeNames (nodeCacheCapable: true) but the scorer runs "
                "without --node-cache",
            )
        if request.form == "names" and verb != "explain" and not self._source_ready():
            return self._not_ready(verb, request, started)
        now = self.clock()
        key: ReplyKey | None = None
        if request.form == "names" and verb != "explain" and self.reply_cache is not None:
            # Read before the node lookup: a reply is never filed under a newer generation than
            # the data it was computed from (see NodeCache.generation).
            generation = getattr(self.node_source, "generation", None)
            if isinstance(generation, int):
                pod = request.pod
                hints = pod_hint_items(pod.annotations, self.policy.keys.prefix)
                key = (verb, generation, hints, pod.gpu_request, request.node_names_json)
                cached = self.reply_cache.get(key, now, self.policy)
                if cached is not None:
                    return self._reuse(verb, request, cached, started)
        try:
            request = wire.with_node_names(request)
        except wire.WireError as exc:
            self.metrics.bad_requests.labels(exc.cause).inc()
            return _bad_request(verb, str(exc))
        nodes = self._nodes_of(request)
        try:
            judgement = None
            if request.form == "names" and verb != "explain" and self.verdict_memo is not None:
                judgement = self.verdict_memo.judge(
                    request.pod, nodes, now, self.policy, view_key=request.node_names_json
                )
            if judgement is not None:
                response, tally = self._judged_reply(verb, request, judgement)
                if key is not None and self.reply_cache is not None:
                    self.metrics.reply_cache_misses[verb].inc()
                    self.reply_cache.put(
                        key, self._judged_entry(request, judgement, response, tally)
                    )
                self.metrics.request_seconds_by_verb[verb].observe(time.perf_counter() - started)
                self.metrics.nodes_per_request_by_verb[verb].observe(len(nodes))
                return response
            evaluation = evaluate(request.pod, nodes, now, self.policy)
            tally = None
            if verb == "filter":
                tally = self.metrics.tally_verdicts(evaluation.verdicts)
                response = Response(200, self._filter_reply(request, evaluation, now, tally))
            elif verb == "prioritize":
                response = Response(200, wire.encode_prioritize_reply(evaluation.scores()))
            else:
                response = self._explain_reply(request, evaluation, now, query)
            if key is not None and self.reply_cache is not None:
                self.metrics.reply_cache_misses[verb].inc()
                self.reply_cache.put(key, self._entry(request, evaluation, response, tally))
        except Exception as exc:
            response = self._internal_error(verb, request, nodes, exc)
        self.metrics.request_seconds_by_verb[verb].observe(time.perf_counter() - started)
        self.metrics.nodes_per_request_by_verb[verb].observe(len(nodes))
        return response

    def _judged_reply(
        self, verb: Verb, request: wire.ExtenderRequest, judgement: NamesJudgement
    ) -> tuple[Response, VerdictTally | None]:
        """The reply `evaluate` would give, from memoised per-node verdicts (names only)."""
        if verb == "prioritize":
            return Response(200, judgement.prioritize_reply()), None
        passed, failed, unresolvable, counts = judgement.filter_parts()
        tally = self.metrics.tally_counts(counts)
        body = wire.encode_names_filter_reply(passed, failed=failed, unresolvable=unresolvable)
        self.metrics.add_tally(tally)
        if tally.rejected and log.isEnabledFor(logging.INFO):
            _log_judged_rejections(request, judgement, tally)
        return Response(200, body), tally

    def _judged_entry(
        self,
        request: wire.ExtenderRequest,
        judgement: NamesJudgement,
        response: Response,
        tally: VerdictTally | None,
    ) -> CachedReply:
        return CachedReply(
            body=response.body,
            computed_at=judgement.now,
            valid_until=judgement.valid_until,
            policy=self.policy,
            nodes=len(judgement.entries),
            tally=tally,
            rejected=0 if tally is None else tally.rejected,
            unresolvable=0 if tally is None else tally.unresolvable,
            hint_error=None,
            computed_for=_pod_ref(request),
        )

    def _source_ready(self) -> bool:
        return self.node_source is not None and self.node_source.ready()

    def _not_ready(self, verb: Verb, request: wire.ExtenderRequest, started: float) -> Response:
        """Names only, before the node cache's first LIST: no answer rather than a blind one.

        Evaluated now, every node would be "missing data": passed blind (lenient) or rejected
        as unresolvable (strict, leaving the pod unschedulable until a cluster change). A
        filter `Error` instead makes the scheduler retry the pod with back-off, by when the
        LIST is in; prioritize (called only after a filter) gives the neutral 0.
        """
        try:
            request = wire.with_node_names(request)
        except wire.WireError as exc:
            self.metrics.bad_requests.labels(exc.cause).inc()
            return _bad_request(verb, str(exc))
        self.metrics.unready_requests.labels(verb).inc()
        if verb == "filter":
            response = Response(200, wire.encode_filter_error(request, NOT_READY_ERROR))
        else:
            response = Response(
                200, wire.encode_prioritize_reply((name, 0) for name in request.node_names)
            )
        self.metrics.request_seconds_by_verb[verb].observe(time.perf_counter() - started)
        self.metrics.nodes_per_request_by_verb[verb].observe(len(request.node_names))
        return response

    def _entry(
        self,
        request: wire.ExtenderRequest,
        evaluation: Evaluation,
        response: Response,
        tally: VerdictTally | None,
    ) -> CachedReply:
        assert evaluation.now is not None  # set by evaluate()
        # Only a reused filter reply logs its rejections; prioritize needs no counts.
        rejected = 0 if tally is None else tally.rejected
        unresolvable = 0 if tally is None else tally.unresolvable
        return CachedReply(
            body=response.body,
            computed_at=evaluation.now,
            valid_until=evaluation.valid_until,
            policy=self.policy,
            nodes=len(evaluation.verdicts),
            tally=tally,
            rejected=rejected,
            unresolvable=unresolvable,
            hint_error=evaluation.hint_error,
            computed_for=_pod_ref(request),
        )

    def _reuse(
        self, verb: Verb, request: wire.ExtenderRequest, cached: CachedReply, started: float
    ) -> Response:
        """A cache hit: the same bytes, the same verdict counts, one log line for the pod."""
        metrics = self.metrics
        if cached.tally is not None:
            metrics.add_tally(cached.tally)
        metrics.reply_cache_hits[verb].inc()
        if verb == "filter" and cached.rejected and log.isEnabledFor(logging.INFO):
            _log_reused_rejections(request, cached)
        metrics.request_seconds_by_verb[verb].observe(time.perf_counter() - started)
        metrics.nodes_per_request_by_verb[verb].observe(cached.nodes)
        return Response(200, cached.body)

    def _nodes_of(self, request: wire.ExtenderRequest) -> Sequence[NodeInput]:
        if request.form == "nodes":
            return request.nodes
        if request.form == "names" and self.node_source is not None:
            return self.node_source.lookup(request.node_names)
        return ()

    def _filter_reply(
        self,
        request: wire.ExtenderRequest,
        evaluation: Evaluation,
        now: datetime,
        tally: VerdictTally,
    ) -> bytes:
        failed = evaluation.failed()
        unresolvable = evaluation.unresolvable()
        reply = wire.encode_filter_reply(
            request,
            passed=set(evaluation.passed_names()),
            failed=failed,
            unresolvable=unresolvable,
        )
        self.metrics.add_tally(tally)
        if (failed or unresolvable) and log.isEnabledFor(logging.INFO):
            _log_rejections(request, evaluation, now)
        return reply

    def _explain_reply(
        self,
        request: wire.ExtenderRequest,
        evaluation: Evaluation,
        now: datetime,
        query: bytes,
    ) -> Response:
        document = explain(evaluation, request.pod, now, self.policy)
        output = parse_qs(query.decode("latin-1")).get("output", ["json"])[-1]
        if output == "text":
            return Response(200, render_text(document).encode(), TEXT)
        return Response(200, wire.encode_json(document))

    def _unexpected(self, verb: Verb | None, exc: Exception) -> Response:
        """The answer when `handle` itself raised (nothing known of the request)."""
        self.metrics.internal_errors.labels(verb or "other").inc()
        log.error("request failed", exc_info=exc, extra={"fields": {"verb": verb or "other"}})
        message = f"gpu scorer internal error: {type(exc).__name__}"
        if verb == "filter":
            return Response(200, wire.encode_filter_error(None, message))
        if verb == "prioritize":
            # No node named, no score added: the scheduler ranks as without the extender.
            return Response(200, wire.encode_prioritize_reply(()))
        if verb == "explain":
            return Response(200, wire.encode_json({"Error": message}))
        return Response(503, wire.encode_json({"Error": message}))

    def _internal_error(
        self,
        verb: Verb,
        request: wire.ExtenderRequest,
        nodes: Sequence[NodeInput],
        exc: Exception,
    ) -> Response:
        self.metrics.internal_errors.labels(verb).inc()
        log.error(
            "evaluation failed",
            exc_info=exc,
            extra={"fields": {"verb": verb, "pod": _pod_ref(request), "nodes": len(nodes)}},
        )
        message = f"gpu scorer internal error: {type(exc).__name__}"
        if verb == "filter":
            return Response(200, wire.encode_filter_error(request, message))
        if verb == "prioritize":
            return Response(200, wire.encode_prioritize_reply((n.name, 0) for n in nodes))
        return Response(200, wire.encode_json({"Error": message}))


def _pod_ref(request: wire.ExtenderRequest) -> str:
    return f"{request.pod.namespace}/{request.pod.name}"


def _log_rejections(request: wire.ExtenderRequest, evaluation: Evaluation, now: datetime) -> None:
    """One structured line per rejected node: the uniform reason plus what was read, and its age.

    An invalid pod hint rejects every node for the same cause, so it is logged once per request.
    """
    pod = _pod_ref(request)
    if evaluation.hint_error:
        log.info(
            "pod rejected on every node",
            extra={"fields": {"pod": pod, "reason": evaluation.hint_error}},
        )
        return
    for verdict in evaluation.verdicts:
        if verdict.passed:
            continue
        fields: dict[str, object] = {
            "pod": pod,
            "node": verdict.name,
            "reason": verdict.reason or "",
            "unresolvable": verdict.unresolvable,
            "data_status": str(verdict.data_status),
        }
        fields.update(_verdict_values(verdict))
        log.info("node rejected", extra={"fields": fields})


def _log_judged_rejections(
    request: wire.ExtenderRequest, judgement: NamesJudgement, tally: VerdictTally
) -> None:
    """Names only: one full line per rejected node judged in this request, one summary line for
    the rejected nodes whose verdicts were reused from the memo (their full lines were written
    when they were judged, with the values they read, which have not changed since)."""
    pod = _pod_ref(request)
    logged = 0
    for verdict in judgement.computed:
        if verdict.passed and not judgement.rejected_by_chain(verdict):
            continue
        reason, unresolvable = judgement.final_verdict(verdict)
        logged += 1
        fields: dict[str, object] = {
            "pod": pod,
            "node": verdict.name,
            "reason": reason or "",
            "unresolvable": unresolvable,
            "data_status": str(verdict.data_status),
        }
        fields.update(_verdict_values(verdict))
        log.info("node rejected", extra={"fields": fields})
    reused = tally.rejected - logged
    if reused > 0:
        log.info(
            "nodes rejected (verdicts memoised)",
            extra={"fields": {"pod": pod, "rejected": reused, "judged_rejected": logged}},
        )


def _log_reused_rejections(request: wire.ExtenderRequest, cached: CachedReply) -> None:
    """A reused filter reply logs one line: the per-node lines were written when it was computed.

    `verdicts_from` names the pod whose request computed the verdicts; its `node rejected` lines
    carry the per-node values, which are the same for this pod.
    """
    fields: dict[str, object] = {
        "pod": _pod_ref(request),
        "rejected": cached.rejected,
        "unresolvable": cached.unresolvable,
        "verdicts_from": cached.computed_for,
        "verdicts_computed_at": format_timestamp(cached.computed_at),
    }
    if cached.hint_error:
        fields["reason"] = cached.hint_error
    log.info("nodes rejected (verdicts reused)", extra={"fields": fields})


def _verdict_values(verdict: NodeVerdict) -> dict[str, object]:
    """The values a verdict read and the data's age, for the log line (unknown ones left out)."""
    values: dict[str, object] = {}
    state = verdict.inputs.state
    if state is not None:
        read = {
            "health": state.health.value,
            "utilization": state.utilization,
            "temperature_c": state.temperature_c,
            "memory_largest_free_mib": state.memory_largest_free_mib,
            "gpu_model": state.gpu_model,
            "updated_at": format_timestamp(state.updated_at),
        }
        values.update((k, v) for k, v in read.items() if v is not None)
    if verdict.inputs.problems:
        values["problems"] = list(verdict.inputs.problems)
    if verdict.age_s is not None:
        values["age_s"] = round(verdict.age_s, 3)
    if verdict.server_age_s is not None:
        values["server_age_s"] = round(verdict.server_age_s, 3)
    return values


def _bad_request(verb: Verb, message: str) -> Response:
    if verb == "filter":
        # Shaped like an ExtenderFilterResult, so even a lenient reader sees `Error`.
        return Response(400, wire.encode_filter_error(None, message))
    return Response(400, wire.encode_json({"Error": message}))


def _method_not_allowed(allowed: str) -> Response:
    return Response(405, wire.encode_json({"Error": f"method not allowed; use {allowed}"}))


async def _respond(send: Send, response: Response) -> None:
    headers = [
        (b"content-type", response.content_type),
        (b"content-length", str(len(response.body)).encode()),
    ]
    if response.status == 405:
        allowed = b"GET, HEAD" if response.body.endswith(b'GET"}') else b"POST"
        headers.append((b"allow", allowed))
    await send({"type": "http.response.start", "status": response.status, "headers": headers})
    await send({"type": "http.response.body", "body": response.body})


# ---------------------------------------------------------------------------- serving


@dataclass(frozen=True, slots=True)
class TlsFiles:
    cert_file: str
    key_file: str
    client_ca_file: str | None = None


def uvicorn_config(
    app: ScorerApp,
    *,
    host: str,
    port: int,
    tls: TlsFiles | None = None,
    keep_alive_s: int = DEFAULT_KEEP_ALIVE_S,
    log_level: str = "info",
) -> uvicorn.Config:
    """uvicorn settings for the extender: httptools on asyncio, long keep-alive, optional TLS."""
    tls_options: dict[str, Any] = {}
    if tls is not None:
        tls_options = {"ssl_certfile": tls.cert_file, "ssl_keyfile": tls.key_file}
        if tls.client_ca_file:
            # The scheduler's tlsConfig presents a client certificate; require and verify it.
            tls_options |= {"ssl_ca_certs": tls.client_ca_file, "ssl_cert_reqs": ssl.CERT_REQUIRED}
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        http="httptools",
        loop="asyncio",
        lifespan="on",
        interface="asgi3",
        timeout_keep_alive=keep_alive_s,
        access_log=False,
        log_config=None,
        log_level=log_level.lower(),
        server_header=False,
        **tls_options,
    )


class RunningServer:
    """A uvicorn server on a background thread (tests, the benchmark, the demo)."""

    def __init__(self, config: uvicorn.Config) -> None:
        self.server = uvicorn.Server(config)
        self.scheme: Literal["http", "https"] = "https" if config.ssl_certfile else "http"
        self._thread = threading.Thread(target=self.server.run, name="gpu-scorer-http", daemon=True)

    def start(self, timeout_s: float = 10.0) -> RunningServer:
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self.server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("the scorer's HTTP server did not start")
            time.sleep(0.005)
        return self

    @property
    def port(self) -> int:
        sockets = self.server.servers[0].sockets
        return int(sockets[0].getsockname()[1])

    @property
    def url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.port}"

    def stop(self, timeout_s: float = 10.0) -> None:
        self.server.should_exit = True
        if self._thread.is_alive():
            self._thread.join(timeout_s)

    def __enter__(self) -> RunningServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
