"""The LIST page reader (`exporter_scheduler.edges.pagereader`) against servers that answer as
scripted, byte by byte: chunks split anywhere, lengths, refusals, cuts, garbage, silence, TLS.

The API server's own answers reach it through the Pod and Node caches' tests (the stand-in,
plain HTTP) and the end-to-end tests (kube-apiserver, TLS)."""

from __future__ import annotations

import contextlib
import json
import random
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client  # type: ignore[import-untyped]

from exporter_scheduler.edges.listwatch import refusal_of
from exporter_scheduler.edges.pagereader import (
    Endpoint,
    ListRefusedError,
    PageReader,
    PageReadError,
    request_headers,
)
from exporter_scheduler.edges.podcache import PodCache
from exporter_scheduler.serving.metrics import ScorerMetrics
from tests.scorer._http_helpers import make_pki, needs_openssl

# Generous: a bound on a wait that ends as soon as its condition holds, never a sleep.
WAIT_S = 10.0

# One answer: the byte pieces the server writes (a short pause between them), and whether it
# closes the connection after them.
Answer = tuple[list[bytes], bool]


@dataclass
class ScriptedServer:
    """Answers each request it reads with the next scripted answer; records what it read."""

    answers: list[Answer]
    tls: ssl.SSLContext | None = None
    # A TLS connection is ended with the server's close_notify, as Go's server ends one.
    close_notify: bool = False
    requests: list[bytes] = field(default_factory=list)
    connections: int = 0
    closed: int = 0  # connections the server has closed
    port: int = 0
    # Set when the test is done: a connection whose script ran out is held open until then.
    done: threading.Event = field(default_factory=threading.Event)

    def serve(self, listener: socket.socket) -> None:
        while self.answers:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            self.connections += 1
            if self.tls is not None:
                try:
                    conn = self.tls.wrap_socket(conn, server_side=True)
                except (ssl.SSLError, OSError):
                    conn.close()
                    continue
            with conn:
                self._answer(conn)
                if isinstance(conn, ssl.SSLSocket) and self.close_notify:
                    # Sent at once; the wait for the peer's own close_notify is cut short.
                    conn.settimeout(0.05)
                    with contextlib.suppress(OSError):
                        conn.unwrap()
            self.closed += 1

    def _answer(self, conn: socket.socket) -> None:
        pending = b""
        while self.answers:
            while b"\r\n\r\n" not in pending:
                try:
                    data = conn.recv(65536)
                except OSError:
                    return
                if not data:
                    return
                pending += data
            head, _, pending = pending.partition(b"\r\n\r\n")
            self.requests.append(head)
            pieces, close = self.answers.pop(0)
            for piece in pieces:
                if piece == b"":
                    time.sleep(0.002)  # a pause: the reader has caught up and waits
                    continue
                conn.sendall(piece)
            if close:
                return
        self.done.wait(WAIT_S)


@contextmanager
def scripted(
    answers: list[Answer], tls: ssl.SSLContext | None = None, *, close_notify: bool = False
) -> Iterator[ScriptedServer]:
    server = ScriptedServer(list(answers), tls, close_notify)
    listener = socket.create_server(("127.0.0.1", 0))
    server.port = listener.getsockname()[1]
    thread = threading.Thread(target=server.serve, args=(listener,), daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.done.set()
        with contextlib.suppress(OSError):
            listener.shutdown(socket.SHUT_RDWR)  # wakes an accept() in progress; close() does not
        listener.close()
        thread.join(WAIT_S)


def configuration(host: str, **settings: Any) -> Any:
    conf = client.Configuration()
    conf.host = host
    for name, value in settings.items():
        setattr(conf, name, value)
    return conf


def reader_for(conf: Any, *, read_timeout_s: float = WAIT_S) -> PageReader:
    endpoint = Endpoint.of(conf)
    assert endpoint is not None
    return PageReader(
        endpoint,
        lambda: request_headers(conf, {"User-Agent": "test"}),
        connect_timeout_s=WAIT_S,
        read_timeout_s=read_timeout_s,
    )


def chunked(body: bytes, sizes: list[int], trailers: bytes = b"") -> bytes:
    """`body` as HTTP chunks of `sizes` (the rest in one last chunk), then the last chunk."""
    out, at = [], 0
    for size in [*sizes, len(body)]:
        piece = body[at : at + size]
        at += len(piece)
        if piece:
            out.append(b"%x\r\n%s\r\n" % (len(piece), piece))
    return b"".join(out) + b"0\r\n" + trailers + b"\r\n"


def head(status: str = "200 OK", *headers: str) -> bytes:
    return ("HTTP/1.1 " + status + "\r\n" + "".join(h + "\r\n" for h in headers) + "\r\n").encode()


# The head of a 200 whose body comes in chunks.
CHUNKED = head("200 OK", "Transfer-Encoding: chunked")


def split_anywhere(data: bytes, rng: random.Random) -> list[bytes]:
    """`data` in pieces cut at random places, with pauses between some of them."""
    pieces: list[bytes] = []
    at = 0
    while at < len(data):
        step = rng.choice([1, 2, 5, 17, 300, 4096, 20000])
        pieces.append(data[at : at + step])
        if rng.random() < 0.1:
            pieces.append(b"")
        at += step
    return pieces


def a_page(count: int, rng: random.Random) -> bytes:
    items = [
        {"metadata": {"name": f"pod-{i}"}, "pad": "x" * rng.randrange(0, 12000)}
        for i in range(count)
    ]
    return json.dumps({"kind": "PodList", "items": items}).encode()


def test_chunked_pages_split_anywhere_are_read_whole_over_one_connection() -> None:
    rng = random.Random(7)
    pages = [a_page(40, rng), a_page(3, rng)]
    answers: list[Answer] = []
    for page in pages:
        sizes = [rng.randrange(1, 15000) for _ in range(60)]
        wire = head("200 OK", "Content-Type: application/json", "Transfer-Encoding: chunked")
        wire += chunked(page, sizes, trailers=b"X-Trailer: yes\r\n")
        answers.append((split_anywhere(wire, rng), False))
    with scripted(answers) as server:
        reader = reader_for(configuration(f"http://127.0.0.1:{server.port}"))
        try:
            got = [
                reader.get("/api/v1/pods", {"limit": 500, "fieldSelector": "a!=b"}) for _ in pages
            ]
        finally:
            reader.close()
    assert got == pages
    assert server.connections == 1
    first = server.requests[0].decode()
    assert first.startswith("GET /api/v1/pods?limit=500&fieldSelector=a%21%3Db HTTP/1.1\r\n")
    assert f"Host: 127.0.0.1:{server.port}" in first
    assert "User-Agent: test" in first
    assert "Accept: application/json" in first


def test_a_length_page_and_a_connection_the_server_closes() -> None:
    body = b'{"items":[]}'
    answers: list[Answer] = [
        ([head("200 OK", f"Content-Length: {len(body)}", "Connection: close") + body], True),
        ([head("200 OK", f"Content-Length: {len(body)}") + body], False),
    ]
    with scripted(answers) as server:
        reader = reader_for(configuration(f"http://127.0.0.1:{server.port}/prefix/"))
        try:
            assert reader.get("/api/v1/nodes", {}) == body
            assert reader.get("/api/v1/nodes", {}) == body
        finally:
            reader.close()
    assert server.connections == 2  # "Connection: close" is honoured: a new one for the next
    assert server.requests[0].startswith(b"GET /prefix/api/v1/nodes HTTP/1.1\r\n")


def test_a_kept_alive_connection_closed_before_answering_is_replaced_once() -> None:
    body = b'{"items":[]}'
    page = head("200 OK", f"Content-Length: {len(body)}") + body
    # The first connection answers once and then closes, as an idle timeout would, without
    # saying so: the next request's answer is an end of stream, and a fresh connection is tried.
    answers: list[Answer] = [([page], True), ([page], False)]
    with scripted(answers) as server:
        reader = reader_for(configuration(f"http://127.0.0.1:{server.port}"))
        try:
            assert reader.get("/api/v1/pods", {}) == body
            assert reader.get("/api/v1/pods", {}) == body
        finally:
            reader.close()
    assert server.connections == 2


def test_a_refusal_carries_the_status_and_the_servers_message() -> None:
    status = json.dumps(
        {"kind": "Status", "status": "Failure", "code": 410, "reason": "Expired",
         "message": "The provided continue parameter is too old"}
    ).encode()  # fmt: skip
    body = b'{"items":[]}'
    answers: list[Answer] = [
        ([head("410 Gone", "Transfer-Encoding: chunked") + chunked(status, [9])], False),
        ([head("200 OK", f"Content-Length: {len(body)}") + body], False),
    ]
    with scripted(answers) as server:
        reader = reader_for(configuration(f"http://127.0.0.1:{server.port}"))
        try:
            with pytest.raises(ListRefusedError) as refused:
                reader.get("/api/v1/pods", {"continue": "old"})
            assert reader.get("/api/v1/pods", {}) == body  # the connection is still good
        finally:
            reader.close()
    assert (refused.value.status, refused.value.reason) == (410, "Gone")
    assert refusal_of(refused.value) == (410, "The provided continue parameter is too old")
    assert server.connections == 1


@pytest.mark.parametrize(
    ("wire", "said"),
    [
        pytest.param(b"SSH-2.0-OpenSSH\r\n\r\n", "not an HTTP/1.1 status line", id="not-http"),
        pytest.param(head("200 OK", "no colon here"), "not a header line", id="bad-header"),
        pytest.param(head("200 OK"), "neither a length nor chunks", id="no-length"),
        pytest.param(head("200 OK", "Content-Length: -3"), "a bad Content-Length", id="bad-length"),
        pytest.param(
            b"HTTP/1.1 200 OK\r\nContent-Length: \xb2\r\n\r\n",
            "a bad Content-Length",
            id="length-not-ascii-digits",
        ),
        pytest.param(
            CHUNKED + b"zz\r\n",
            "a bad chunk size",
            id="bad-size",
        ),
        pytest.param(
            CHUNKED + b"-4\r\nabcd\r\n0\r\n\r\n",
            "a bad chunk size",
            id="negative-size",
        ),
        pytest.param(
            CHUNKED + b"2\r\nabcd\r\n0\r\n\r\n",
            "a chunk does not end where its size says",
            id="chunk-overruns",
        ),
        pytest.param(
            CHUNKED + b"1" * 70000,
            "a header or chunk-size line is too long",
            id="endless-size-line",
        ),
        pytest.param(
            CHUNKED + b"10\r\nonly six",
            "the server closed the connection",
            id="cut-mid-chunk",
        ),
        pytest.param(
            b"HTTP/1.1 200 OK\r\nContent-Le", "the server closed the connection", id="cut-in-head"
        ),
    ],
)
def test_a_malformed_or_cut_answer_is_a_connection_error(wire: bytes, said: str) -> None:
    answers: list[Answer] = [([wire], True)]
    with scripted(answers) as server:
        reader = reader_for(configuration(f"http://127.0.0.1:{server.port}"))
        try:
            with pytest.raises(PageReadError, match=said) as failed:
                reader.get("/api/v1/pods", {})
        finally:
            reader.close()
    assert isinstance(failed.value, OSError)  # the loop retries it with back-off
    assert refusal_of(failed.value) is not None


def finished(call: Callable[[], Any]) -> Any:
    """What `call` returned or raised, run in a thread: a call that spins or hangs fails the
    test after WAIT_S instead of hanging it."""
    outcome: list[Any] = []

    def run() -> None:
        try:
            outcome.append(call())
        except Exception as exc:  # the call's own failure is its outcome
            outcome.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(WAIT_S)
    assert not thread.is_alive(), "the call neither returned nor raised"
    return outcome[0]


def test_an_interim_answer_is_read_past() -> None:
    body = b'{"items":[]}'
    wire = b"HTTP/1.1 100 Continue\r\n\r\n" + head("200 OK", f"Content-Length: {len(body)}") + body
    with scripted([([wire], False)]) as server:
        reader = reader_for(configuration(f"http://127.0.0.1:{server.port}"))
        try:
            assert reader.get("/api/v1/pods", {}) == body
        finally:
            reader.close()


@needs_openssl
@pytest.mark.parametrize("says_close", [True, False], ids=["connection-close", "idle-close"])
def test_a_tls_close_notify_ends_the_stream_and_the_next_page_reconnects(
    says_close: bool, tmp_path: Path
) -> None:
    """Go's server ends a TLS connection with close_notify: after a `Connection: close` answer,
    and on a kept-alive connection it closes idle. The answer before it is read whole, and the
    next page goes over a fresh connection."""
    pki = make_pki(tmp_path)
    serving_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    serving_tls.load_cert_chain(str(pki["srv"]), str(pki["srv-key"]))
    body = b'{"items":[]}'
    closing = ("Connection: close",) if says_close else ()
    first = head("200 OK", f"Content-Length: {len(body)}", *closing) + body
    answers: list[Answer] = [
        ([first], True),
        ([head("200 OK", "Content-Length: 2") + b"{}"], False),
    ]
    with scripted(answers, tls=serving_tls, close_notify=True) as server:
        conf = configuration(f"https://127.0.0.1:{server.port}", ssl_ca_cert=str(pki["ca"]))
        reader = reader_for(conf)
        try:
            assert finished(lambda: reader.get("/api/v1/pods", {})) == body
            if not says_close:
                deadline = time.monotonic() + WAIT_S
                while server.closed < 1 and time.monotonic() < deadline:
                    time.sleep(0.01)  # until the server has closed the first connection
            assert finished(lambda: reader.get("/api/v1/pods", {})) == b"{}"
        finally:
            reader.close()
    assert server.connections == 2


@needs_openssl
def test_a_server_that_never_answers_the_tls_handshake_is_left_at_the_connect_timeout() -> None:
    listener = socket.create_server(("127.0.0.1", 0))  # the kernel accepts; nobody speaks
    try:
        port = listener.getsockname()[1]
        conf = configuration(f"https://127.0.0.1:{port}", verify_ssl=False)
        endpoint = Endpoint.of(conf)
        assert endpoint is not None
        reader = PageReader(endpoint, lambda: {}, connect_timeout_s=0.2, read_timeout_s=WAIT_S * 10)
        try:
            assert isinstance(finished(lambda: reader.get("/api/v1/pods", {})), TimeoutError)
        finally:
            reader.close()
        # The connection that never finished its handshake was closed, not left open.
        listener.settimeout(WAIT_S)
        accepted, _ = listener.accept()
        with accepted:
            accepted.settimeout(WAIT_S)
            hello = accepted.recv(65536)  # the client's TLS hello, then the end of the stream
            while chunk := accepted.recv(65536):
                hello += chunk
        assert hello.startswith(b"\x16\x03")  # a TLS handshake record
    finally:
        listener.close()


def test_a_silent_server_times_out() -> None:
    answers: list[Answer] = [([CHUNKED + b"5\r\nab"], False)]
    with scripted(answers) as server:
        reader = reader_for(configuration(f"http://127.0.0.1:{server.port}"), read_timeout_s=0.2)
        try:
            with pytest.raises(TimeoutError):
                reader.get("/api/v1/pods", {})
        finally:
            reader.close()


def test_close_from_another_thread_unblocks_a_read_in_progress() -> None:
    answers: list[Answer] = [([CHUNKED + b"5\r\nab"], False)]
    outcome: list[BaseException] = []
    with scripted(answers) as server:
        reader = reader_for(configuration(f"http://127.0.0.1:{server.port}"))

        def read() -> None:
            try:
                reader.get("/api/v1/pods", {})
            except BaseException as exc:  # what the reading thread saw
                outcome.append(exc)

        thread = threading.Thread(target=read)
        thread.start()
        deadline = time.monotonic() + WAIT_S
        while not server.requests and time.monotonic() < deadline:
            time.sleep(0.01)  # the request reached the server: the read is in progress
        reader.close()
        thread.join(WAIT_S)
    assert not thread.is_alive()
    assert len(outcome) == 1
    assert isinstance(outcome[0], OSError)
    with pytest.raises(PageReadError, match="closed"):
        reader.get("/api/v1/pods", {})


def test_the_clients_credentials_are_read_at_each_request() -> None:
    tokens = iter(["first", "second"])

    def refresh(conf: Any) -> None:
        conf.api_key["BearerToken"] = next(tokens)  # as the in-cluster loader's hook does

    body = b"{}"
    page = head("200 OK", f"Content-Length: {len(body)}") + body
    with scripted([([page], False), ([page], False)]) as server:
        conf = configuration(
            f"http://127.0.0.1:{server.port}",
            api_key={"BearerToken": "stale"},
            api_key_prefix={"BearerToken": "Bearer"},
            refresh_api_key_hook=refresh,
        )
        reader = reader_for(conf)
        try:
            reader.get("/api/v1/pods", {})
            reader.get("/api/v1/pods", {})
        finally:
            reader.close()
    said = [
        next(line for line in r.split(b"\r\n") if line.startswith(b"authorization:"))
        for r in server.requests
    ]
    assert said == [b"authorization: Bearer first", b"authorization: Bearer second"]


@pytest.mark.parametrize(
    ("proxy", "no_proxy", "read_by"),
    [
        pytest.param(None, None, PageReader, id="direct"),
        pytest.param("http://proxy:3128", None, None, id="through-a-proxy-the-client-reads"),
        pytest.param("http://proxy:3128", "10.0.0.0/8", PageReader, id="api-server-not-proxied"),
    ],
)
def test_a_client_that_goes_through_a_proxy_reads_its_own_pages(
    proxy: str | None, no_proxy: str | None, read_by: type | None
) -> None:
    conf = configuration("https://10.0.0.1:6443", proxy=proxy, no_proxy=no_proxy)
    cache = PodCache(
        kubeconfig=None, metrics=ScorerMetrics(), api=client.CoreV1Api(client.ApiClient(conf))
    )
    reader = cache._open_reader()
    assert (reader is None) if read_by is None else isinstance(reader, read_by)


def test_what_the_reader_does_not_serve_stays_with_the_client() -> None:
    assert Endpoint.of(configuration("unix:///var/run/kube.sock")) is None
    endpoint = Endpoint.of(configuration("https://[::1]:6443/k8s/clusters/c-1/"))
    assert endpoint is not None
    assert (endpoint.host, endpoint.port, endpoint.path_prefix) == (
        "::1",
        6443,
        "/k8s/clusters/c-1",
    )
    assert endpoint.server_name == "::1"
    # urllib3 checks `assert_hostname` apart from the name it sends; this reader cannot.
    asserted = configuration("https://10.0.0.1", assert_hostname="apiserver.internal")
    assert Endpoint.of(asserted) is None
    assert Endpoint.of(configuration("https://10.0.0.1", assert_hostname="10.0.0.1")) is not None
    named = Endpoint.of(configuration("https://10.0.0.1", tls_server_name="kubernetes.default"))
    assert named is not None
    assert (named.port, named.server_name) == (443, "kubernetes.default")


@needs_openssl
def test_tls_with_the_clients_trust_and_certificate(tmp_path: Path) -> None:
    pki = make_pki(tmp_path)
    serving_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    serving_tls.load_cert_chain(str(pki["srv"]), str(pki["srv-key"]))
    serving_tls.verify_mode = ssl.CERT_REQUIRED  # the client must present its certificate
    serving_tls.load_verify_locations(str(pki["ca"]))
    rng = random.Random(3)
    page = a_page(200, rng)
    wire = CHUNKED + chunked(page, [rng.randrange(1, 9000) for _ in range(150)])
    with scripted([(split_anywhere(wire, rng), False)] * 2, tls=serving_tls) as server:
        conf = configuration(
            f"https://127.0.0.1:{server.port}",
            ssl_ca_cert=str(pki["ca"]),
            cert_file=str(pki["cli"]),
            key_file=str(pki["cli-key"]),
        )
        reader = reader_for(conf)
        try:
            assert reader.get("/api/v1/pods", {}) == page
            assert reader.get("/api/v1/pods", {}) == page
        finally:
            reader.close()
    assert server.connections == 1


@needs_openssl
def test_tls_refuses_a_server_the_client_does_not_trust(tmp_path: Path) -> None:
    (tmp_path / "theirs").mkdir()
    (tmp_path / "ours").mkdir()
    pki = make_pki(tmp_path / "theirs")
    ours = make_pki(tmp_path / "ours")
    serving_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    serving_tls.load_cert_chain(str(pki["srv"]), str(pki["srv-key"]))
    body = b"{}"
    page = head("200 OK", f"Content-Length: {len(body)}") + body
    with scripted([([page], False)] * 2, tls=serving_tls) as server:
        trusting_another = configuration(
            f"https://127.0.0.1:{server.port}", ssl_ca_cert=str(ours["ca"])
        )
        reader = reader_for(trusting_another)
        try:
            with pytest.raises(ssl.SSLCertVerificationError):
                reader.get("/api/v1/pods", {})
        finally:
            reader.close()
        # `verify_ssl: false` (insecure-skip-tls-verify in a kubeconfig): read, as the client would.
        insecure = configuration(f"https://127.0.0.1:{server.port}", verify_ssl=False)
        reader = reader_for(insecure)
        try:
            assert reader.get("/api/v1/pods", {}) == body
        finally:
            reader.close()
