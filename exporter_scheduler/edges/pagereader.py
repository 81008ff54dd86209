"""LIST pages read over a connection of their own, in batches of what the server has sent.

The API server sends a LIST page's items one HTTP chunk each (a Pod of about 10 KB, in two TLS
records), as fast as it encodes them. Through the Kubernetes client (urllib3 over `http.client`
over an `ssl.SSLSocket`) every record is its own `SSL_read`, and a reader that has caught up
with the server blocks on each: a thread sleep and a wake-up per record, which on a two-core
machine cost more CPU than decrypting and decoding the Pod. At 150,000 bound pods that was most
of the scorer's CPU to sync its Pod watch.

Here the socket is read in large reads, through an `ssl.MemoryBIO`, and a reader that has caught
up waits a couple of milliseconds before the next read, so that it wakes once per batch of Pods,
not once per record. Measured side by side on the loopback control plane (10,000 Pods in pages of
500 from kube-apiserver v1.37.2, 2 logical CPUs; docs/performance.md): 22 µs of CPU a Pod
against 44 through the client, and the pages arrived sooner.

Only GETs of LIST pages come through here (their bodies are read whole, then decoded); watches,
writes, and every request of a client that goes through a proxy stay with the client. The
credentials, trust and server name are the client's configuration, read at each request, so a
rotated token is used as the client would use it.
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import urlencode, urlsplit

from exporter_scheduler.edges.http1 import (
    MalformedHeadError,
    chunk_size,
    header_fields,
    keeps_alive,
)

# A read that found less than half the buffer means the reader caught up with the server; it
# then waits this long before reading again, so that the next read takes a batch of Pods. At
# the server's pace on the loopback control plane (about 100 MB/s per LIST), 2 ms is about
# 20 Pods; a page of 500 Pods arrives in about 5 to 10 ms either way.
CAUGHT_UP_WAIT_S: Final = 0.002
READ_BYTES: Final = 256 * 1024
# A status line and headers, or a chunk-size line, longer than this is no API server's answer.
MAX_HEAD_BYTES: Final = 64 * 1024
# What is kept of a refusal's body (a Status object, a few hundred bytes).
MAX_REFUSAL_BYTES: Final = 64 * 1024
# Bytes consumed from the front of the buffer are dropped once there are this many.
_COMPACT_BYTES: Final = 1 << 20


class PageReadError(ConnectionError):
    """The server's answer was not HTTP/1.1 as this reader speaks it, or the stream ended early.
    A connection error, so the list + watch loop retries it with back-off."""


class ListRefusedError(Exception):
    """The server answered a LIST page with a status other than 200 (the body: its Status)."""

    def __init__(self, status: int, reason: str, body: bytes) -> None:
        super().__init__(f"{status} {reason}")
        self.status = status
        self.reason = reason
        self.body = body


@dataclass(frozen=True, slots=True)
class Endpoint:
    """Where and how to connect: the parts of the client's configuration this reader uses."""

    scheme: str
    host: str
    port: int
    path_prefix: str
    tls: ssl.SSLContext | None
    server_name: str | None

    @classmethod
    def of(cls, configuration: Any) -> Endpoint | None:
        """The endpoint of a Kubernetes client `Configuration`; None for a scheme other than http
        and https, and for a name to check the certificate against other than the one sent as
        the TLS server name (`assert_hostname`), which urllib3 checks apart and this cannot.
        (Whether the client goes through a proxy is the caller's to ask.)"""
        url = urlsplit(configuration.host)
        if url.scheme not in ("http", "https") or not url.hostname:
            return None
        port = url.port or (443 if url.scheme == "https" else 80)
        prefix = url.path.rstrip("/")
        if url.scheme == "http":
            return cls("http", url.hostname, port, prefix, None, None)
        context = ssl.create_default_context(cafile=configuration.ssl_ca_cert)
        if configuration.cert_file:
            context.load_cert_chain(configuration.cert_file, configuration.key_file)
        server_name = getattr(configuration, "tls_server_name", None) or url.hostname
        assert_hostname = getattr(configuration, "assert_hostname", None)
        if not configuration.verify_ssl:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        elif assert_hostname is False:
            context.check_hostname = False
        elif isinstance(assert_hostname, str) and assert_hostname != server_name:
            return None
        return cls("https", url.hostname, port, prefix, context, server_name)


def request_headers(
    configuration: Any, default_headers: Mapping[str, str], accept: str = "application/json"
) -> dict[str, str]:
    """The headers the client would send with a GET asking for `accept`: its defaults (which
    win, as in the client's `call_api`) and its credentials, read now (the configuration's
    hook reloads a rotated token)."""
    headers = {"Accept": accept, **default_headers}
    for setting in configuration.auth_settings().values():
        if setting.get("in") == "header" and setting.get("value"):
            headers[setting["key"]] = setting["value"]
    return headers


class _Connection:
    """One HTTP/1.1 connection, plain or TLS through memory BIOs, read in large batches."""

    def __init__(self, endpoint: Endpoint, connect_timeout_s: float, read_timeout_s: float) -> None:
        self._sock = socket.create_connection((endpoint.host, endpoint.port), connect_timeout_s)
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._scratch = bytearray(READ_BYTES)
        self._view = memoryview(self._scratch)
        self._last_read = READ_BYTES
        self.buffer = bytearray()  # received (decrypted) bytes not yet consumed, from `pos`
        self.pos = 0
        self.received_any = False
        self._ended = False  # the server's close_notify came: nothing more will
        self._tls: ssl.SSLObject | None = None
        if endpoint.tls is not None:
            self._incoming = ssl.MemoryBIO()
            self._outgoing = ssl.MemoryBIO()
            self._tls = endpoint.tls.wrap_bio(
                self._incoming, self._outgoing, server_hostname=endpoint.server_name
            )
            try:
                self._handshake()  # under the connect timeout, as the client's
            except BaseException:
                self._sock.close()  # not left to the collector
                raise
        self._sock.settimeout(read_timeout_s)

    def _handshake(self) -> None:
        assert self._tls is not None
        while True:
            try:
                self._tls.do_handshake()
                break
            except ssl.SSLWantReadError:
                self._send_pending()
                self._receive_raw(wait=False)
        self._send_pending()

    def _send_pending(self) -> None:
        data = self._outgoing.read()
        if data:
            self._sock.sendall(data)

    def send(self, data: bytes) -> None:
        if self._tls is None:
            self._sock.sendall(data)
            return
        self._tls.write(data)
        self._send_pending()

    def _receive_raw(self, *, wait: bool) -> None:
        if wait and self._last_read < READ_BYTES // 2:
            time.sleep(CAUGHT_UP_WAIT_S)
        count = self._sock.recv_into(self._scratch)
        self._last_read = count
        if count == 0:
            raise PageReadError("the server closed the connection")
        if self._tls is None:
            self.buffer += self._view[:count]
        else:
            self._incoming.write(self._view[:count])

    def fill(self) -> None:
        """Receive at least one more byte into `buffer` (or raise)."""
        if self._tls is None:
            self._receive_raw(wait=True)
            self.received_any = True
            return
        before = len(self.buffer)
        while len(self.buffer) == before:
            if self._ended:
                raise PageReadError("the server closed the TLS session")
            try:
                while chunk := self._tls.read(READ_BYTES):  # every whole record received
                    self.buffer += chunk
                # An empty read is the server's close_notify (Python 3.11 returns b"" where
                # later versions raise): whatever came before it is still read.
                self._ended = True
            except ssl.SSLWantReadError:
                if len(self.buffer) == before:
                    self._receive_raw(wait=True)
            except ssl.SSLZeroReturnError:
                self._ended = True
        self.received_any = True

    def compact(self) -> None:
        if self.pos >= _COMPACT_BYTES:
            del self.buffer[: self.pos]
            self.pos = 0

    def line(self) -> bytes:
        """The next CRLF-ended line, without its end."""
        while (end := self.buffer.find(b"\r\n", self.pos)) < 0:
            if len(self.buffer) - self.pos > MAX_HEAD_BYTES:
                raise PageReadError("a header or chunk-size line is too long")
            self.fill()
        line = bytes(self.buffer[self.pos : end])
        self.pos = end + 2
        return line

    def need(self, count: int) -> None:
        while len(self.buffer) - self.pos < count:
            self.fill()

    def close(self) -> None:
        with contextlib.suppress(OSError):  # already closed by either side
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()


@dataclass(frozen=True, slots=True)
class _Head:
    status: int
    reason: str
    headers: dict[str, str]
    keep_alive: bool


class PageReader:
    """GETs of LIST pages over one kept-alive connection; `close` from another thread unblocks
    a read in progress (the loop's stop)."""

    def __init__(
        self,
        endpoint: Endpoint,
        headers: Callable[[], Mapping[str, str]],  # read at each request
        *,
        connect_timeout_s: float,
        read_timeout_s: float,
    ) -> None:
        self._endpoint = endpoint
        self._headers = headers
        self._connect_timeout_s = connect_timeout_s
        self._read_timeout_s = read_timeout_s
        self._lock = threading.Lock()
        self._connection: _Connection | None = None
        self._closed = False

    def get(self, path: str, query: Mapping[str, str | int]) -> bytes | bytearray:
        """The body of a 200 answer to GET `path?query`; raises `ListRefusedError` for another
        status, an `OSError` (`PageReadError`, `ssl.SSLError`, a timeout) when the exchange
        fails. A kept-alive connection the server had closed before answering is replaced once."""
        target = f"{self._endpoint.path_prefix}{path}"
        if query:
            target += "?" + urlencode(query)
        lines = [f"GET {target} HTTP/1.1", f"Host: {self._host_header()}"]
        lines += [f"{name}: {value}" for name, value in self._headers().items()]
        request = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        for attempt in (0, 1):
            connection, reused = self._connect()
            try:
                connection.send(request)
                head = self._head(connection)
            except OSError:
                self._drop(connection)
                if attempt == 0 and reused and not connection.received_any:
                    continue  # the server closed an idle connection: one fresh try
                raise
            break
        try:
            body = self._body(connection, head)
        except BaseException:
            self._drop(connection)
            raise
        if not head.keep_alive:
            self._drop(connection)
        if head.status != 200:
            raise ListRefusedError(head.status, head.reason, bytes(body[:MAX_REFUSAL_BYTES]))
        return body

    def close(self) -> None:
        with self._lock:
            self._closed = True
            connection, self._connection = self._connection, None
        if connection is not None:
            connection.close()

    def _host_header(self) -> str:
        endpoint = self._endpoint
        default = 443 if endpoint.scheme == "https" else 80
        host = f"[{endpoint.host}]" if ":" in endpoint.host else endpoint.host
        return host if endpoint.port == default else f"{host}:{endpoint.port}"

    def _connect(self) -> tuple[_Connection, bool]:
        with self._lock:
            if self._closed:
                raise PageReadError("the reader is closed")
            if self._connection is not None:
                self._connection.received_any = False
                return self._connection, True
        connection = _Connection(self._endpoint, self._connect_timeout_s, self._read_timeout_s)
        with self._lock:
            if self._closed:  # closed while connecting
                connection.close()
                raise PageReadError("the reader is closed")
            self._connection = connection
        return connection, False

    def _drop(self, connection: _Connection) -> None:
        with self._lock:
            if self._connection is connection:
                self._connection = None
        connection.close()

    @classmethod
    def _head(cls, connection: _Connection) -> _Head:
        while True:  # an interim (1xx) answer is read past; none is expected for a GET
            head = cls._one_head(connection)
            if not 100 <= head.status < 200 or head.status == 101:
                return head

    @staticmethod
    def _one_head(connection: _Connection) -> _Head:
        status_line = connection.line()
        parts = status_line.split(b" ", 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
            raise PageReadError(f"not an HTTP/1.1 status line: {status_line[:80]!r}")
        lines: list[str] = []
        size = len(status_line)
        while line := connection.line():
            size += len(line)
            if size > MAX_HEAD_BYTES:
                raise PageReadError("the response's headers are too long")
            lines.append(line.decode("latin-1"))
        try:
            headers = header_fields(lines)
        except MalformedHeadError as exc:
            raise PageReadError(f"not a header line: {exc}") from None
        reason = parts[2].decode("latin-1") if len(parts) > 2 else ""
        version = parts[0].decode("latin-1")
        return _Head(int(parts[1]), reason, headers, keeps_alive(version, headers))

    @staticmethod
    def _body(connection: _Connection, head: _Head) -> bytes | bytearray:
        if "chunked" in head.headers.get("transfer-encoding", "").lower():
            return _chunked_body(connection)
        length = head.headers.get("content-length")
        if length is None:
            raise PageReadError("a response with neither a length nor chunks")
        if not (length.isascii() and length.isdigit()):
            raise PageReadError(f"a bad Content-Length: {length[:40]!r}")
        count = int(length)
        connection.need(count)
        body = bytes(connection.buffer[connection.pos : connection.pos + count])
        connection.pos += count
        connection.compact()
        return body


def _chunked_body(connection: _Connection) -> bytearray:
    body = bytearray()
    while True:
        try:
            size = chunk_size(connection.line())
        except MalformedHeadError as exc:
            raise PageReadError(f"a bad chunk size: {exc}") from None
        if size == 0:
            while connection.line():  # trailers, up to the empty line that ends them
                pass
            connection.compact()
            return body
        connection.need(size + 2)
        start = connection.pos
        body += connection.buffer[start : start + size]
        if connection.buffer[start + size : start + size + 2] != b"\r\n":
            raise PageReadError("a chunk does not end where its size says")
        connection.pos = start + size + 2
        connection.compact()
