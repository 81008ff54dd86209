"""A raw HTTP/1.1 client for wire-level assertions on the API server stand-in.

`http.client` hides the framing (chunk boundaries, chunked vs Content-Length), which is exactly
what some contract tests check, so this reads the socket itself.
"""

from __future__ import annotations

import json
import socket
import time
from dataclasses import dataclass, field
from typing import Any, BinaryIO
from urllib.parse import urlsplit

from tests.fixture_paths import APISERVER_FIXTURES

# The kube-apiserver wire captures the stand-in is checked against.
FIXTURES = APISERVER_FIXTURES


def fixture(name: str) -> dict[str, Any]:
    with open(f"{FIXTURES}/{name}", encoding="utf-8") as f:
        data: dict[str, Any] = json.load(f)
    return data


def fixture_lines(name: str) -> list[bytes]:
    with open(f"{FIXTURES}/{name}", "rb") as f:
        return f.read().splitlines(keepends=True)


def _header(headers: list[tuple[str, str]], name: str) -> str | None:
    """The first value of header `name` (names compare case-insensitively), None if absent."""
    return next((v for k, v in headers if k.lower() == name.lower()), None)


@dataclass
class RawResponse:
    status: int
    reason: str
    headers: list[tuple[str, str]]
    body: bytes
    chunk_sizes: list[int] | None  # None: the body came with Content-Length

    def header(self, name: str) -> str | None:
        return _header(self.headers, name)

    @property
    def header_names(self) -> list[str]:
        return [k for k, _ in self.headers]

    def json(self) -> Any:
        return json.loads(self.body)


def _read_head(f: BinaryIO) -> tuple[int, str, list[tuple[str, str]]]:
    status_line = f.readline().decode("latin-1")
    if not status_line:
        raise ConnectionError("connection closed before a response")
    _, code, reason = status_line.rstrip("\r\n").split(" ", 2)
    headers: list[tuple[str, str]] = []
    while True:
        line = f.readline().decode("latin-1").rstrip("\r\n")
        if not line:
            break
        key, _, value = line.partition(":")
        headers.append((key, value.strip()))
    return int(code), reason, headers


def _read_chunk(f: BinaryIO) -> bytes | None:
    size_line = f.readline()
    if not size_line:
        raise ConnectionError("connection closed inside a chunked body")
    size = int(size_line.strip(), 16)
    if size == 0:
        f.readline()
        return None
    data = f.read(size)
    f.readline()
    return data


def _connect(url: str, timeout_s: float) -> socket.socket:
    parts = urlsplit(url)
    return socket.create_connection((parts.hostname or "127.0.0.1", parts.port or 80), timeout_s)


def _request_bytes(
    method: str, path: str, body: bytes | None, headers: dict[str, str] | None
) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1", "Accept: application/json"]
    for key, value in (headers or {}).items():
        lines.append(f"{key}: {value}")
    if body is not None:
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + (body or b"")


def request(
    url: str,
    method: str,
    path: str,
    *,
    body: bytes | str | None = None,
    content_type: str | None = None,
    token: str | None = "test-token",
    headers: dict[str, str] | None = None,
    timeout_s: float = 5.0,
) -> RawResponse:
    """One request on a fresh connection; the body is read by its own framing."""
    all_headers = dict(headers or {})
    if token is not None:
        all_headers["Authorization"] = f"Bearer {token}"
    if content_type is not None:
        all_headers["Content-Type"] = content_type
    data = body.encode() if isinstance(body, str) else body
    with _connect(url, timeout_s) as sock, sock.makefile("rb") as f:
        sock.sendall(_request_bytes(method, path, data, all_headers))
        code, reason, head = _read_head(f)
        length = next((v for k, v in head if k.lower() == "content-length"), None)
        if length is not None:
            return RawResponse(code, reason, head, f.read(int(length)), None)
        chunks: list[bytes] = []
        while (chunk := _read_chunk(f)) is not None:
            chunks.append(chunk)
        return RawResponse(code, reason, head, b"".join(chunks), [len(c) for c in chunks])


@dataclass
class WatchStream:
    """An open watch: the head at once, then one chunk per event as the server sends it."""

    status: int
    headers: list[tuple[str, str]]
    sock: socket.socket
    f: BinaryIO
    opened_at: float
    chunks: list[bytes] = field(default_factory=list)
    closed_after_s: float | None = None

    def header(self, name: str) -> str | None:
        return _header(self.headers, name)

    def next_event(self) -> dict[str, Any] | None:
        """The next event, or None when the server ended the stream."""
        chunk = _read_chunk(self.f)
        if chunk is None:
            self.closed_after_s = time.monotonic() - self.opened_at
            return None
        self.chunks.append(chunk)
        # One chunk is exactly one newline-terminated JSON event.
        assert chunk.endswith(b"\n")
        assert chunk.count(b"\n") == 1
        event: dict[str, Any] = json.loads(chunk)
        return event

    def events_until_close(self) -> list[dict[str, Any]]:
        events = []
        while (event := self.next_event()) is not None:
            events.append(event)
        return events

    def close(self) -> None:
        self.f.close()
        self.sock.close()


def open_watch(
    url: str, path: str, *, token: str | None = "test-token", timeout_s: float = 10.0
) -> WatchStream:
    sock = _connect(url, timeout_s)
    f = sock.makefile("rb")
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    started = time.monotonic()
    sock.sendall(_request_bytes("GET", path, None, headers))
    code, _, head = _read_head(f)
    return WatchStream(code, head, sock, f, started)
