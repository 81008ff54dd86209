"""The scorer over real HTTP on loopback: routes, keep-alive, TCP_NODELAY, TLS, logs, metrics."""

from __future__ import annotations

import json
import logging
import os
import socket
import ssl
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from exporter_scheduler.config.serving import DEFAULT_KEEP_ALIVE_S, TlsFiles
from exporter_scheduler.core.policy import Policy
from exporter_scheduler.core.records import NodeInput
from exporter_scheduler.edges.server import HttpServer
from exporter_scheduler.serving.observability import ObservabilityApp
from exporter_scheduler.serving.responses import Response, Steps, normalize_path_prefix
from tests.scorer._http_helpers import (
    NOW,
    args_body,
    call,
    check_filter_reply,
    check_prioritize_reply,
    connect,
    gpu_annotations,
    make_app,
    make_pki,
    needs_openssl,
    node,
    pod,
    serving,
    store_of,
)
from tests.scorer.test_nodestore import gpu_node


def _mixed_nodes() -> list[dict[str, object]]:
    return [
        node("cool", gpu_annotations(utilization=0.10)),
        node("hot", gpu_annotations(utilization=0.95)),
        node("warm", gpu_annotations(utilization=0.60)),
    ]


def test_filter_prioritize_explain_over_http() -> None:
    body = args_body(pod(), _mixed_nodes())
    with serving(make_app()) as server:
        conn = connect(server)
        status, headers, data = call(conn, "POST", "/filter", body)
        assert (status, headers["content-type"]) == (200, "application/json")
        reply = json.loads(data)
        passed = check_filter_reply(reply, given=["cool", "hot", "warm"], form="nodes")
        assert passed == ["cool", "warm"]
        assert reply["FailedNodes"] == {"hot": "gpu utilization above 0.90"}

        status, _, data = call(conn, "POST", "/prioritize", body)
        scores = check_prioritize_reply(json.loads(data), given=["cool", "hot", "warm"])
        assert scores["cool"] > scores["warm"]

        status, _, data = call(conn, "POST", "/explain", body)
        assert status == 200
        assert json.loads(data)  # the explanation document
        status, headers, data = call(conn, "POST", "/explain?output=text", body)
        assert status == 200
        assert headers["content-type"].startswith("text/plain")
        assert b"hot" in data
        conn.close()


def test_same_request_same_now_gives_identical_bytes() -> None:
    body = args_body(pod(), _mixed_nodes())
    with serving(make_app()) as server:
        conn = connect(server)
        first = call(conn, "POST", "/filter", body)[2]
        second = call(conn, "POST", "/filter", body)[2]
        conn.close()
    assert first == second


def test_keep_alive_reuses_one_connection_after_idling() -> None:
    body = args_body(pod(), _mixed_nodes())
    with serving(make_app()) as server:
        conn = connect(server)
        call(conn, "POST", "/filter", body)
        sock = conn.sock
        assert sock is not None
        local = sock.getsockname()
        for _ in range(5):
            assert call(conn, "POST", "/prioritize", body)[0] == 200
        time.sleep(1.0)  # an idle gap, as between two pods
        assert call(conn, "POST", "/filter", body)[0] == 200
        assert conn.sock is sock
        assert sock.getsockname() == local
        assert len(server.connection_sockets()) == 1
        conn.close()


def test_keep_alive_timeout_outlasts_the_schedulers_idle_connections() -> None:
    server = HttpServer(make_app(), host="127.0.0.1", port=0)
    assert server.keep_alive_s == DEFAULT_KEEP_ALIVE_S > 90
    server.stop()


def test_an_idle_connection_is_closed_after_the_keep_alive_timeout() -> None:
    body = args_body(pod(), _mixed_nodes())
    app = make_app()
    with HttpServer(app, host="127.0.0.1", port=0, keep_alive_s=0.3) as server:
        conn = connect(server)
        assert call(conn, "POST", "/filter", body)[0] == 200
        deadline = time.monotonic() + 5
        while server.connection_sockets() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert server.connection_sockets() == []
        conn.close()


def test_pipelined_requests_and_http_1_0() -> None:
    """Two requests in one write are answered in order; an HTTP/1.0 client without keep-alive
    gets its answer and a closed connection."""
    with serving(make_app()) as server, socket.create_connection(("127.0.0.1", server.port)) as s:
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\nGET /nope HTTP/1.1\r\nHost: x\r\n\r\n")
        data = b""
        while data.count(b"HTTP/1.1 ") < 2 or not data.endswith(b"}"):
            data += s.recv(4096)
        first, second = data.split(b"HTTP/1.1 ")[1:]
        assert first.startswith(b"200")
        assert first.endswith(b"ok\n")
        assert second.startswith(b"404")
    with serving(make_app()) as server, socket.create_connection(("127.0.0.1", server.port)) as s:
        s.sendall(b"GET /healthz HTTP/1.0\r\n\r\n")
        data = b""
        while chunk := s.recv(4096):
            data += chunk
        assert data.startswith(b"HTTP/1.1 200")
        assert b"connection: close" in data


def test_head_and_expect_continue() -> None:
    with serving(make_app()) as server, socket.create_connection(("127.0.0.1", server.port)) as s:
        s.sendall(b"HEAD /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        head = s.recv(4096)
        assert head.startswith(b"HTTP/1.1 200")
        assert b"content-length: 3\r\n" in head
        assert head.endswith(b"\r\n\r\n")  # the head alone, no body
        body = args_body(pod(), _mixed_nodes())
        s.sendall(
            b"POST /filter HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n"
            b"Content-Length: %d\r\n\r\n" % len(body)
        )
        assert s.recv(4096) == b"HTTP/1.1 100 Continue\r\n\r\n"
        s.sendall(body)
        data = b""
        while b"\r\n\r\n" not in data or not data.endswith(b"}"):
            data += s.recv(65536)
        assert data.startswith(b"HTTP/1.1 200")


@pytest.mark.parametrize(
    "head",
    [
        pytest.param(b"GARBAGE\r\n\r\n", id="request-line"),
        pytest.param(b"GET /healthz HTTP/2.0\r\n\r\n", id="version"),
        pytest.param(b"POST /filter HTTP/1.1\r\nContent-Length: x\r\n\r\n", id="length"),
        pytest.param(
            b"POST /filter HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
            id="two-lengths",
        ),
        pytest.param(b"POST /filter HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n", id="encoding"),
        pytest.param(b"GET /healthz HTTP/1.1\r\n Folded: x\r\n\r\n", id="folded-header"),
        pytest.param(b"GET /healthz HTTP/1.1\r\nName : x\r\n\r\n", id="space-before-colon"),
        pytest.param(
            b"POST /filter HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n-4\r\nabcd\r\n0\r\n\r\n",
            id="negative-chunk-size",
        ),
    ],
)
def test_malformed_http_is_400_and_closed(head: bytes) -> None:
    with serving(make_app()) as server, socket.create_connection(("127.0.0.1", server.port)) as s:
        s.sendall(head)
        data = b""
        while chunk := s.recv(4096):
            data += chunk
    assert data.startswith(b"HTTP/1.1 400")
    assert json.loads(data.split(b"\r\n\r\n", 1)[1])["Error"]


def test_accepted_sockets_have_tcp_nodelay() -> None:
    with serving(make_app()) as server:
        conn = connect(server)
        assert call(conn, "GET", "/healthz")[0] == 200
        (accepted,) = server.connection_sockets()
        assert accepted.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
        conn.close()


@pytest.mark.parametrize(
    ("prefix", "expected"),
    [
        pytest.param("/", "", id="root"),
        pytest.param("", "", id="empty"),
        pytest.param("/scheduler", "/scheduler", id="plain"),
        pytest.param("scheduler/", "/scheduler", id="slashes"),
        pytest.param("/a/b/", "/a/b", id="nested"),
    ],
)
def test_path_prefix_normalized(prefix: str, expected: str) -> None:
    assert normalize_path_prefix(prefix) == expected


def test_path_prefix_routes() -> None:
    body = args_body(pod(), _mixed_nodes())
    with serving(make_app(path_prefix="/gpu/")) as server:
        conn = connect(server)
        assert call(conn, "POST", "/gpu/filter", body)[0] == 200
        assert call(conn, "POST", "/gpu/prioritize", body)[0] == 200
        assert call(conn, "POST", "/filter", body)[0] == 404
        assert call(conn, "GET", "/healthz")[0] == 200
        conn.close()


def test_health_readiness_and_metrics() -> None:
    store = store_of(None)
    body = args_body(pod(), names=["a", "b"])
    with serving(make_app(node_store=store)) as server:
        conn = connect(server)
        assert call(conn, "GET", "/healthz")[:1] == (200,)
        assert call(conn, "GET", "/readyz")[0] == 503
        store.replace([NodeInput("a", gpu_annotations(), None)])
        assert call(conn, "GET", "/readyz")[0] == 200
        status, _, data = call(conn, "POST", "/filter", body)
        assert status == 200
        reply = json.loads(data)
        # b is unknown to the cache: missing data, lenient by default, so it passes.
        assert check_filter_reply(reply, given=["a", "b"], form="names") == ["a", "b"]
        call(conn, "POST", "/filter", b"{")
        status, headers, data = call(conn, "GET", "/metrics")
        assert status == 200
        assert headers["content-type"].startswith("text/plain")
        text = data.decode()
        conn.close()
    for expected in (
        'gpu_scorer_request_duration_seconds_bucket{le="0.0001",verb="filter"}',
        'gpu_scorer_request_nodes_count{verb="filter"} 1.0',
        'gpu_scorer_filter_verdicts_total{outcome="passed",reason="gpu data missing"} 1.0',
        'gpu_scorer_node_data_total{status="missing"} 1.0',
        'gpu_scorer_node_data_total{status="fresh"} 1.0',
        'gpu_scorer_rejected_requests_total{cause="malformed_json"} 1.0',
        "gpu_scorer_node_cache_nodes",
    ):
        assert expected in text


def test_explain_a_names_only_request_from_the_node_cache() -> None:
    store = store_of([NodeInput("a", gpu_annotations(utilization=0.95), None)])
    response = make_app(node_store=store).handle(
        "explain", args_body(pod(), names=["a", "b"]), query=b"output=text"
    )
    assert response.status == 200
    text = response.body.decode()
    assert "gpu utilization above 0.90" in text
    assert "b" in text


def test_one_structured_log_record_per_rejected_node(caplog: pytest.LogCaptureFixture) -> None:
    nodes = [
        *_mixed_nodes(),
        node("old", gpu_annotations(updated_at=NOW - timedelta(seconds=600))),
    ]
    app = make_app(policy=Policy(missing_data="strict"))
    with caplog.at_level(logging.INFO, logger="exporter_scheduler.server"):
        response = app.handle("filter", args_body(pod(), nodes))
    assert response.status == 200
    rejected = [r for r in caplog.records if r.getMessage() == "node rejected"]
    by_node = {r.fields["node"]: r.fields for r in rejected}  # type: ignore[attr-defined]
    assert set(by_node) == {"hot", "old"}
    assert by_node["hot"]["reason"] == "gpu utilization above 0.90"
    assert by_node["hot"]["utilization"] == 0.95
    assert by_node["hot"]["age_s"] == 5.0
    assert by_node["old"]["reason"] == "gpu data stale (older than 180s)"
    assert by_node["old"]["age_s"] == 600.0
    assert by_node["old"]["pod"] == "default/p"


def test_invalid_hint_is_logged_once_per_request(caplog: pytest.LogCaptureFixture) -> None:
    hint = {"gpu-scheduler.example.com/max-utilization": "lots"}
    with caplog.at_level(logging.INFO, logger="exporter_scheduler.server"):
        response = make_app().handle("filter", args_body(pod(hint), _mixed_nodes()))
    reply = json.loads(response.body)
    assert len(reply["FailedAndUnresolvableNodes"]) == 3
    assert [r.getMessage() for r in caplog.records] == ["pod rejected on every node"]


# ----------------------------------------------------------------------------- TLS


@needs_openssl
def test_https_with_and_without_client_certificates(tmp_path: Path) -> None:
    pki = make_pki(tmp_path)
    body = args_body(pod(), _mixed_nodes())
    trusting = ssl.create_default_context(cafile=str(pki["ca"]))

    plain_tls = TlsFiles(str(pki["srv"]), str(pki["srv-key"]))
    with serving(make_app(), tls=plain_tls) as server:
        assert server.url.startswith("https://")
        conn = connect(server, context=trusting)
        assert call(conn, "POST", "/filter", body)[0] == 200
        conn.close()

    mutual = TlsFiles(str(pki["srv"]), str(pki["srv-key"]), client_ca_file=str(pki["ca"]))
    with serving(make_app(), tls=mutual) as server:
        anonymous = connect(server, context=trusting)
        with pytest.raises((ssl.SSLError, ConnectionError, OSError)):
            call(anonymous, "POST", "/filter", body)
        anonymous.close()
        with_cert = ssl.create_default_context(cafile=str(pki["ca"]))
        with_cert.load_cert_chain(str(pki["cli"]), str(pki["cli-key"]))
        conn = connect(server, context=with_cert)
        assert call(conn, "POST", "/filter", body)[0] == 200
        conn.close()


def test_metrics_port_serves_only_metrics_and_probes() -> None:
    app = make_app()
    with serving(ObservabilityApp(app)) as metrics_server:
        conn = connect(metrics_server)
        assert call(conn, "GET", "/healthz")[0] == 200
        assert call(conn, "GET", "/readyz")[0] == 200
        status, _, data = call(conn, "GET", "/metrics")
        assert status == 200
        assert b"gpu_scorer_request_duration_seconds" in data
        # The extender verbs are not there: a scraper allowed onto this port cannot call them.
        for path in ("/filter", "/prioritize", "/explain"):
            status, _, data = call(conn, "POST", path, args_body(pod(), names=["a"]))
            assert status == 404, path
            assert b"no such path" in data
        conn.close()


def test_renewed_certificate_files_are_picked_up_without_a_restart(tmp_path: Path) -> None:
    from loopback_cluster.control_plane import Pki  # noqa: PLC0415  (cryptography, a development dependency)

    old, new = Pki(tmp_path / "old").generate(), Pki(tmp_path / "new").generate()
    cert, key = old.issue_serving_cert("serving", ["127.0.0.1"])
    renewed_cert, renewed_key = new.issue_serving_cert("serving", ["127.0.0.1"])
    trusts_old = ssl.create_default_context(cafile=str(old.ca_cert))
    trusts_new = ssl.create_default_context(cafile=str(new.ca_cert))
    body = args_body(pod(), _mixed_nodes())
    tls = TlsFiles(str(cert), str(key))
    with HttpServer(make_app(), host="127.0.0.1", port=0, tls=tls, tls_check_every_s=0) as server:
        conn = connect(server, context=trusts_old)
        assert call(conn, "POST", "/filter", body)[0] == 200
        # A renewal rewrites the mounted files; a half-written set keeps the old context.
        cert.write_bytes(renewed_cert.read_bytes())
        conn = connect(server, context=trusts_old)
        assert call(conn, "POST", "/filter", body)[0] == 200
        key.write_bytes(renewed_key.read_bytes())
        os.utime(key, (time.time() + 5, time.time() + 5))
        conn = connect(server, context=trusts_new)
        assert call(conn, "POST", "/filter", body)[0] == 200
        stale = connect(server, context=trusts_old)
        with pytest.raises(ssl.SSLError):
            call(stale, "POST", "/filter", body)


def test_stop_can_be_asked_by_a_thread_that_holds_the_connection_table() -> None:
    """SIGTERM's handler calls `request_stop` on the main thread, which may be holding the
    server's connection table as it admits a connection (`serve_forever`): the stop must not
    wait for the thread it runs on. A daemon thread plays the main thread here, so that a
    stop that did wait fails the test instead of hanging it."""
    server = HttpServer(make_app(), host="127.0.0.1", port=0)
    stopped = threading.Event()

    def admitting_then_signalled() -> None:
        with server._lock:  # as `_admit` holds it
            server.request_stop()
        stopped.set()

    threading.Thread(target=admitting_then_signalled, daemon=True).start()
    assert stopped.wait(10.0)
    server.serve_forever()  # returns at once: stopping


def test_a_served_call_is_counted_once_its_reply_is_written() -> None:
    app = make_app()
    replied = threading.Event()
    seen: list[bool] = []
    answer = app.answer

    def answer_watched(verb: Any, body: Any, *, query: bytes = b"") -> Any:
        response = answer(verb, body, query=query)
        after = response.after
        assert after is not None  # the counters wait for the reply

        def finish_watched() -> None:
            # Set by the client once it holds the reply: had the accounting come first, the
            # reply would not have been sent yet, and this would wait in vain.
            seen.append(replied.wait(5.0))
            after()

        response.after = finish_watched
        return response

    app.answer = answer_watched  # type: ignore[method-assign]
    with serving(app) as server:
        conn = connect(server)
        status, _, _ = call(conn, "POST", "/filter", args_body(pod(), nodes=[node("a")]))
        replied.set()
        # The next request on the connection is read after the last one's accounting.
        metrics = call(conn, "GET", "/metrics")[2].decode()
        conn.close()
    assert status == 200
    assert seen == [True]
    assert 'gpu_scorer_requests_total{profile="default",verb="filter"} 1.0' in metrics


def test_a_handled_call_is_counted_before_handle_returns() -> None:
    app = make_app()
    response = app.handle("filter", args_body(pod(), nodes=[node("a")]))
    assert response.after is None  # finished already
    count = app.metrics.render()[0].decode()
    assert 'gpu_scorer_requests_total{profile="default",verb="filter"} 1.0' in count


class _Steps:
    """An app whose replies record when their steps run: a filter's reply prepares for the
    request that follows it, as the scorer's names-only filter prepares its prioritize."""

    max_body_bytes = 1024

    def __init__(self) -> None:
        self.events: list[str] = []
        self.finished = {"filter": threading.Event(), "prioritize": threading.Event()}

    def respond(self, method: str, path: str, query: bytes, body: Any) -> Response:
        verb = path.strip("/")
        self.events.append(f"answer {verb}")
        response = Response(200, b"{}")
        first = [lambda: self.events.append(f"prepare {verb}")]
        # Both replies have a step for right after them (a prioritize's proposal); only the
        # filter's next request follows at once.
        steps = Steps(later=[lambda: self._later(verb)], first=first, awaits_next=verb == "filter")
        response.then(steps)
        return response

    def _later(self, verb: str) -> None:
        self.events.append(f"count {verb}")
        self.finished[verb].set()

    def body_too_large(self) -> Response:
        return Response(413, b"{}")


def test_a_reply_whose_next_request_follows_is_counted_after_that_one() -> None:
    """The filter's preparation runs right after its reply; its counters and log lines wait
    until the prioritize that follows is answered, so that the prioritize does not wait for
    them."""
    app = _Steps()
    with HttpServer(app, host="127.0.0.1", port=0, hold_s=60.0) as server:
        conn = connect(server)
        assert call(conn, "POST", "/filter", b"{}")[0] == 200
        assert call(conn, "POST", "/prioritize", b"{}")[0] == 200
        assert app.finished["prioritize"].wait(10.0)
        conn.close()
    assert app.events == [
        "answer filter",
        "prepare filter",
        "answer prioritize",
        "prepare prioritize",
        "count filter",
        "count prioritize",
    ]


def test_a_reply_whose_next_request_does_not_follow_is_counted_at_once() -> None:
    """A prioritize's step for right after its reply (its proposal) runs before its counters,
    and nothing of it waits for a next request that may not come for a while."""
    app = _Steps()
    with HttpServer(app, host="127.0.0.1", port=0, hold_s=60.0) as server:
        conn = connect(server)
        assert call(conn, "POST", "/prioritize", b"{}")[0] == 200
        # Counted with the connection still open and idle: not held for `hold_s`.
        assert app.finished["prioritize"].wait(10.0)
        assert app.events == ["answer prioritize", "prepare prioritize", "count prioritize"]
        conn.close()


@pytest.mark.parametrize("ending", ["idle", "closed"])
def test_a_held_reply_is_counted_when_no_request_follows(ending: str) -> None:
    """No request after the filter: its counters and log lines wait `hold_s` at most, and
    are not lost when the connection closes before that."""
    app = _Steps()
    hold_s = 0.05 if ending == "idle" else 60.0
    with HttpServer(app, host="127.0.0.1", port=0, hold_s=hold_s) as server:
        conn = connect(server)
        assert call(conn, "POST", "/filter", b"{}")[0] == 200
        if ending == "closed":
            conn.close()
        assert app.finished["filter"].wait(10.0)
        assert app.events == ["answer filter", "prepare filter", "count filter"]
        conn.close()


def test_a_scrape_counts_every_reply_written_before_it() -> None:
    """A filter's counters wait for its prioritize (hold), but a scrape from another
    connection meanwhile still counts the filter."""
    names = [f"n{i}" for i in range(4)]
    app = make_app(node_store=store_of(gpu_node(n) for n in names))
    with HttpServer(app, host="127.0.0.1", port=0, hold_s=60.0) as server:
        scheduler = connect(server)
        body = args_body(pod(), names=names)
        call(scheduler, "POST", "/prioritize", body)  # the scheduler sends them
        status, _, reply = call(scheduler, "POST", "/filter", body)
        assert status == 200
        assert len(json.loads(reply)["NodeNames"]) >= 2  # its prioritize is prepared
        scrape = connect(server)
        metrics = call(scrape, "GET", "/metrics")[2].decode()
        scrape.close()
        scheduler.close()
    assert 'gpu_scorer_requests_total{profile="default",verb="filter"} 1.0' in metrics
