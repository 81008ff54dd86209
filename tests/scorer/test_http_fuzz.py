"""The scorer's own HTTP/1.1 edge against arbitrary bytes: a defined answer or a closed
connection, never a crash, a hang or a wedged server.

Heads are built from HTTP's own pieces (methods, targets, versions, header lines, bodies with and
without framing) and mutated, so most inputs reach the parser's deeper branches rather than
failing at the first byte.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from exporter_scheduler.edges.server import HttpServer
from tests.scorer._http_helpers import (
    args_body,
    call,
    connect,
    gpu_annotations,
    make_app,
    node,
    pod,
)

_METHODS = st.sampled_from(["GET", "POST", "HEAD", "PUT", "G3T", "", "POST POST"])
_TARGETS = st.sampled_from(["/filter", "/prioritize", "/metrics", "/", "*", "/x?y=%zz", ""])
_VERSIONS = st.sampled_from(["HTTP/1.1", "HTTP/1.0", "HTTP/2", "HTTP/1.1 ", "", "HTTP/9"])
_HEADERS = st.lists(
    st.one_of(
        st.sampled_from(
            [
                "Content-Length: 5",
                "Content-Length: -1",
                "Content-Length: 99999999999999999999",
                "Content-Length: 3",
                "Content-Length : 3",
                "Transfer-Encoding: chunked",
                "Transfer-Encoding: gzip",
                "Expect: 100-continue",
                "Connection: close",
                " folded: line",
                "NoColon",
                "Host: x",
            ]
        ),
        st.text(alphabet=st.characters(min_codepoint=0, max_codepoint=255), max_size=40),
    ),
    max_size=6,
)
_BODIES = st.one_of(
    st.binary(max_size=64),
    st.sampled_from([b"{}", b"5\r\nhello\r\n0\r\n\r\n", b"zz\r\n", b"0\r\n\r\n"]),
)


_NODES = [node("a", gpu_annotations())]


@pytest.fixture(scope="module")
def server() -> Iterator[HttpServer]:
    # A short request timeout: a fuzzed head that leaves a body unsent costs a second, not 60.
    with HttpServer(make_app(), host="127.0.0.1", port=0, request_timeout_s=1.0) as running:
        yield running


def _exchange(port: int, data: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        try:
            sock.sendall(data)
            sock.shutdown(socket.SHUT_WR)
        except OSError:
            return b""  # the server closed first: a defined end
        received = b""
        while True:
            try:
                chunk = sock.recv(65536)
            except (ConnectionResetError, TimeoutError):
                return received
            if not chunk:
                return received
            received += chunk


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    method=_METHODS,
    target=_TARGETS,
    version=_VERSIONS,
    headers=_HEADERS,
    body=_BODIES,
    cut=st.integers(min_value=0, max_value=200),
)
def test_any_bytes_get_an_http_answer_or_a_close(  # noqa: PLR0917 (hypothesis arguments)
    server: HttpServer,
    method: str,
    target: str,
    version: str,
    headers: list[str],
    body: bytes,
    cut: int,
) -> None:
    head = "\r\n".join([f"{method} {target} {version}", *headers]).encode("latin-1")
    data = head + b"\r\n\r\n" + body
    if cut:  # a truncated request: the peer went away mid-way
        data = data[: max(1, len(data) - cut)]
    answer = _exchange(server.port, data)
    if answer:
        status_line = answer.split(b"\r\n", 1)[0]
        assert status_line.startswith(b"HTTP/1.1 "), answer[:200]
        status = int(status_line.split(b" ")[1])
        assert status in (100, 200, 400, 404, 405, 413, 503), answer[:200]
    # The server still answers a well-formed request afterwards.
    conn = connect(server)
    assert call(conn, "POST", "/filter", args_body(pod(), _NODES))[0] == 200
    conn.close()
