"""The scorer's HTTP edge: HTTP/1.1 on blocking sockets, one thread per connection.

This is the only scorer module that serves HTTP. Why not an ASGI server: a full-node request is
megabytes (~7 KB per Node), and uvicorn hands the body over in 64 KB pieces with a pause and
resume of the socket on the event loop for each, then the app joins them, and the reply is one
more joined copy; measured over loopback that cost more than judging the nodes. Here a request
body is read with `recv_into` straight into a buffer the connection keeps (no piece is copied
twice, no allocation per request), and a reply goes out with one `sendmsg` of its pieces (a
full-node filter reply is mostly slices of that same buffer), so the kernel copies each byte once.

Kept from before: TLS with an optional client CA (mutual TLS), an idle keep-alive that outlasts
kube-scheduler's 90 s (a server that closes first races the client's next request), TCP_NODELAY
on every accepted socket (no Nagle stall on small replies), the body limit (413, from
`Content-Length` before reading, or while reading a chunked body). The handler runs on the
connection's thread; the work is CPU-only, and the GIL lets one request run at a time, which is
what kube-scheduler's one-pod-at-a-time calls need.

After a reply, its call's counters and log lines run on the same thread. kube-scheduler sends a
names-only filter's prioritize a moment after the filter's reply, while it runs its own score
plugins; measured on the loopback control plane, that prioritize was already waiting in about
half of the filters when their counters and log lines were done. So a reply that awaits its
next request (`Response.awaits_next`) gets only its preparation for that request run at once;
its counters and log lines wait until the next request is answered, or until the connection
has idled `hold_s`, or until it closes. A scrape counts them regardless (`ScorerApp.settle`).
"""

from __future__ import annotations

import contextlib
import logging
import select
import socket
import ssl
import threading
import time
from collections.abc import Sequence
from typing import Final, Literal, Protocol
from urllib.parse import unquote

from exporter_scheduler.config.serving import DEFAULT_KEEP_ALIVE_S, TlsFiles
from exporter_scheduler.edges.http1 import (
    BadRequestError,
    MalformedHeadError,
    chunk_size,
    keeps_alive,
    parse_head,
    reply_head,
    timeval,
)
from exporter_scheduler.edges.tls import TlsContexts
from exporter_scheduler.serving import wire
from exporter_scheduler.serving.echo import Buffer
from exporter_scheduler.serving.responses import Response
from exporter_scheduler.threadcpu import retire_current_thread

# Once a request has started, the rest of it must arrive within this long.
DEFAULT_REQUEST_TIMEOUT_S: Final = 60.0
# More concurrent connections than a scheduler, its probes and a scraper need are refused (503).
DEFAULT_MAX_CONNECTIONS: Final = 128
_MAX_HEAD_BYTES: Final = 64 * 1024
_READ_CHUNK: Final = 256 * 1024
# The counters and log lines of a reply whose next request follows at once (a filter, then its
# prioritize) wait for that request this long at most; a scrape does not wait for them.
DEFAULT_HOLD_S: Final = 0.05
# Replies whose counters and log lines wait at once, at most (a client that never sends them).
_MAX_HELD: Final = 8
_IOV_MAX: Final = 1024  # buffers per sendmsg (Linux's UIO_MAXIOV)

log = logging.getLogger("exporter_scheduler.server")


class HttpApp(Protocol):
    """What the edge serves: a `ScorerApp`, or `ObservabilityApp` on a metrics port."""

    @property
    def max_body_bytes(self) -> int: ...

    def respond(self, method: str, path: str, query: bytes, body: Buffer) -> Response:
        """The answer; the edge calls its `finish()` once it is written."""
        ...

    def body_too_large(self) -> Response: ...


class _TooLargeError(Exception):
    pass


class _ClosedError(Exception):
    """The peer went away (or stayed silent past a timeout)."""


class HttpServer:
    """HTTP/1.1 in front of a `ScorerApp`; `start()` serves from a background thread,
    `serve_forever()` from the calling one."""

    def __init__(
        self,
        app: HttpApp,
        *,
        host: str,
        port: int,
        tls: TlsFiles | None = None,
        keep_alive_s: float = DEFAULT_KEEP_ALIVE_S,
        request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
        tls_check_every_s: float = 30.0,
        hold_s: float = DEFAULT_HOLD_S,
        thread_name: str = "gpu-scorer-request",
    ) -> None:
        self.app = app
        # Each connection's thread: its CPU is counted under this name's label
        # (`exporter_scheduler.threadcpu`).
        self.thread_name = thread_name
        self.keep_alive_s = keep_alive_s
        self.hold_s = hold_s
        self.request_timeout_s = request_timeout_s
        self.scheme: Literal["http", "https"] = "https" if tls else "http"
        self._tls = TlsContexts(tls, check_every_s=tls_check_every_s) if tls is not None else None
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._listener = socket.socket(family, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind((host, port))
        self._listener.listen(128)
        self._slots = threading.BoundedSemaphore(max_connections)
        self._connections: dict[_Connection, threading.Thread] = {}
        # Reentrant: `request_stop` takes it from a signal handler, which runs on the main
        # thread, possibly while the main thread holds it (`_admit` in `serve_forever`).
        self._lock = threading.RLock()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self._listener.getsockname()[1])

    @property
    def url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.port}"

    def connection_sockets(self) -> list[socket.socket]:
        """The accepted sockets now open (tests, diagnostics)."""
        with self._lock:
            return [c.sock for c in self._connections]

    # ------------------------------------------------------------------ lifecycle
    def serve_forever(self) -> None:
        """Accept connections until `request_stop()`."""
        while not self._stopping.is_set():
            try:
                sock, _ = self._listener.accept()
            except OSError:
                if self._stopping.is_set():
                    return
                time.sleep(0.05)  # e.g. out of file descriptors: do not spin
                continue
            self._admit(sock)

    def start(self) -> HttpServer:
        self._thread = threading.Thread(
            target=self.serve_forever, name="gpu-scorer-http", daemon=True
        )
        self._thread.start()
        return self

    def request_stop(self) -> None:
        """Stop accepting and close idle connections; requests in progress finish. Safe to call
        from a signal handler."""
        self._stopping.set()
        with contextlib.suppress(OSError):
            # Wakes a thread blocked in accept() (closing alone does not on Linux).
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        with self._lock:
            for connection in self._connections:
                connection.close_if_idle()

    def stop(self, timeout_s: float = 10.0) -> None:
        self.request_stop()
        deadline = time.monotonic() + timeout_s
        if self._thread is not None:
            self._thread.join(timeout_s)
        with self._lock:
            threads = list(self._connections.values())
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))

    def __enter__(self) -> HttpServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ connections
    def _admit(self, sock: socket.socket) -> None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if not self._slots.acquire(blocking=False):
            _refuse(sock)
            return
        connection = _Connection(self, sock)
        thread = threading.Thread(
            target=self._run, args=(connection,), name=self.thread_name, daemon=True
        )
        with self._lock:
            self._connections[connection] = thread
        thread.start()

    def _run(self, connection: _Connection) -> None:
        try:
            connection.serve()
        except Exception:  # a bug in the edge: close this connection, keep serving others
            log.exception("connection failed")
        finally:
            connection.close()
            with self._lock:
                self._connections.pop(connection, None)
            self._slots.release()
            retire_current_thread()  # its CPU time stays counted once its clock is gone

    def tls_wrap(self, sock: socket.socket) -> socket.socket:
        if self._tls is None:
            return sock
        sock.settimeout(self.request_timeout_s)
        return self._tls.current().wrap_socket(sock, server_side=True)

    def stopping(self) -> bool:
        return self._stopping.is_set()


def _refuse(sock: socket.socket) -> None:
    try:
        sock.settimeout(1.0)
        body = wire.encode_json({"Error": "too many connections"})
        sock.sendall(reply_head(503, b"application/json", len(body), None, keep_alive=False) + body)
    except OSError:
        pass
    finally:
        sock.close()


class _Connection:
    """One client connection: requests read and answered in turn (keep-alive)."""

    def __init__(self, server: HttpServer, sock: socket.socket) -> None:
        self.server = server
        self.sock = sock
        self._buffer = bytearray(_READ_CHUNK)  # request heads, and what follows them
        self._start = 0  # unread bytes are _buffer[_start:_end]
        self._end = 0
        self._body = bytearray()  # the last request's body, reused for the next
        self._held: list[Response] = []  # replies whose `finish` waits (`_one_request`)
        self._poller: select.poll | None = None  # made at the first wait for a next request
        self._idle = True
        self._lock = threading.Lock()
        self._closed = False
        # The receive timeout the next read must run under, and the one the socket has: it is
        # changed only when a read needs another one, which a request that arrives whole (the
        # usual case) never does, so a request costs no timeout syscall.
        self._want_timeout_s = server.keep_alive_s
        self._timeout_s: float | None = None

    def close_if_idle(self) -> None:
        with self._lock:
            if self._idle:
                self._shutdown()

    def close(self) -> None:
        with self._lock:
            self._shutdown()
            if not self._closed:
                self._closed = True
                self.sock.close()

    def _shutdown(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)

    def serve(self) -> None:
        server = self.server
        try:
            self.sock = server.tls_wrap(self.sock)
        except (OSError, ssl.SSLError):
            return  # a failed handshake (no client certificate, a port scan): nothing to say
        if isinstance(self.sock, ssl.SSLSocket):
            self._timeout_s = server.request_timeout_s  # set by `tls_wrap`
        else:
            # A plain socket stays blocking, its timeouts the kernel's (SO_RCVTIMEO and
            # SO_SNDTIMEO): Python's own timeouts cost a poll() before every recv and send.
            self.sock.settimeout(None)
            self.sock.setsockopt(
                socket.SOL_SOCKET, socket.SO_SNDTIMEO, timeval(server.request_timeout_s)
            )
        try:
            while not server.stopping():
                try:
                    if not self._one_request():
                        return
                except _ClosedError:
                    return
                except BadRequestError as exc:
                    self._answer_and_close(Response(400, wire.encode_json({"Error": str(exc)})))
                    return
                except _TooLargeError:
                    self._answer_and_close(server.app.body_too_large())
                    return
                except (OSError, ssl.SSLError):
                    return
        finally:
            self._settle()

    def _one_request(self) -> bool:
        """Read, answer; False when the connection is to be closed."""
        server = self.server
        self._want_timeout_s = server.keep_alive_s
        head = self._read_head()
        if head is None:
            return False
        with self._lock:
            self._idle = False
        try:
            self._want_timeout_s = server.request_timeout_s
            method, target, version, headers = parse_head(head)
            keep_alive = keeps_alive(version, headers)
            body = self._read_body(headers)
            path, _, query = target.partition("?")
            response = server.app.respond(method, unquote(path), query.encode("latin-1"), body)
            try:
                self._write(
                    response,
                    keep_alive=keep_alive,
                    head_only=method == "HEAD",
                    http10=version == "HTTP/1.0",
                )
            except BaseException:
                response.finish()
                raise
            # After the reply, not in the time the client waits: first what its next request
            # reads (the prioritize a filter prepares); then the counters and log lines, which
            # wait until that request is answered when it follows at once (its wait would
            # otherwise include them), or until the connection has idled `hold_s`.
            response.prepare()
            if response.awaits_next and len(self._held) < _MAX_HELD:
                self._held.append(response)
            else:
                self._settle()
                response.finish()
            del body, response  # release the views of the body buffer before it is reused
            return keep_alive
        finally:
            with self._lock:
                self._idle = True

    # ------------------------------------------------------------------ reading
    def _recv_into(self, view: memoryview) -> int:
        """`recv_into` under the wanted timeout; a timeout raises `TimeoutError`."""
        want = self._want_timeout_s
        sock = self.sock
        if want != self._timeout_s:
            if isinstance(sock, ssl.SSLSocket):
                sock.settimeout(want)
            else:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, timeval(want))
            self._timeout_s = want
        try:
            return sock.recv_into(view)
        except BlockingIOError:  # EAGAIN from a blocking socket: SO_RCVTIMEO ran out
            raise TimeoutError("timed out") from None

    def _fill(self) -> None:
        """Read more into the head buffer (moving unread bytes to its start first)."""
        buffer = self._buffer
        if self._start:
            unread = self._end - self._start
            buffer[:unread] = buffer[self._start : self._end]
            self._start, self._end = 0, unread
        if self._end == len(buffer):
            raise BadRequestError("request head too large")
        with memoryview(buffer) as view:
            count = self._recv_into(view[self._end :])
        if count == 0:
            raise _ClosedError
        self._end += count

    def _read_head(self) -> bytes | None:
        """The head up to its blank line, or None at a clean end (closed or idle too long)."""
        while True:
            end = self._buffer.find(b"\r\n\r\n", self._start, self._end)
            if end >= 0:
                head = bytes(self._buffer[self._start : end])
                self._start = end + 4
                return head
            if self._end - self._start >= _MAX_HEAD_BYTES:
                raise BadRequestError("request head too large")
            if self._held and not self._readable(self.server.hold_s):
                self._settle()
            try:
                self._fill()
            except (_ClosedError, TimeoutError):
                if self._start == self._end:
                    return None
                raise _ClosedError from None

    def _readable(self, timeout_s: float) -> bool:
        """Whether more of the client's bytes are here, waiting up to `timeout_s` for them."""
        sock = self.sock
        if isinstance(sock, ssl.SSLSocket) and sock.pending():
            return True
        try:
            poller = self._poller
            if poller is None:
                poller = self._poller = select.poll()
                poller.register(sock, select.POLLIN)
            return bool(poller.poll(timeout_s * 1000))
        except (OSError, ValueError):  # closed under us: the read says how
            return True

    def _settle(self) -> None:
        """Finish the held replies, in the order they were written."""
        held, self._held = self._held, []
        for response in held:
            response.finish()

    def _read_exact(self, view: memoryview) -> None:
        """Fill `view`: first from what is buffered, then straight from the socket."""
        buffered = min(len(view), self._end - self._start)
        view[:buffered] = self._buffer[self._start : self._start + buffered]
        self._start += buffered
        filled = buffered
        while filled < len(view):
            count = self._recv_into(view[filled:])
            if count == 0:
                raise _ClosedError
            filled += count

    def _read_line(self) -> bytes:
        while True:
            end = self._buffer.find(b"\r\n", self._start, self._end)
            if end >= 0:
                line = bytes(self._buffer[self._start : end])
                self._start = end + 2
                return line
            if self._end - self._start > 1024:
                raise BadRequestError("chunk size line too long")
            self._fill()

    def _body_buffer(self, size: int) -> bytearray:
        """A buffer of exactly `size` bytes for the body, reusing the last one's memory."""
        body = self._body
        try:
            if size < len(body):
                del body[size:]
            elif size > len(body):
                body.extend(bytes(size - len(body)))
        except BufferError:  # something still holds a view of the last body: leave it be
            body = bytearray(size)
        self._body = body
        return body

    def _read_body(self, headers: dict[str, str]) -> bytearray | bytes:
        limit = self.server.app.max_body_bytes
        encoding = headers.get("transfer-encoding")
        if encoding is not None:
            if encoding.strip().lower() != "chunked":
                raise BadRequestError(f"unsupported transfer-encoding {encoding[:40]!r}")
            if "content-length" in headers:
                raise BadRequestError("both content-length and transfer-encoding")
            self._continue(headers)
            return self._read_chunked(limit)
        length_text = headers.get("content-length")
        if length_text is None:
            return b""
        if not length_text.isdigit():
            raise BadRequestError("content-length is not a number")
        length = int(length_text)
        if length > limit:
            raise _TooLargeError
        if length == 0:
            return b""
        self._continue(headers)
        body = self._body_buffer(length)
        with memoryview(body) as view:
            self._read_exact(view)
        return body

    def _read_chunked(self, limit: int) -> bytes:
        chunks: list[bytes] = []
        size = 0
        while True:
            try:
                chunk = chunk_size(self._read_line())
            except MalformedHeadError:
                raise BadRequestError("bad chunk size") from None
            if chunk == 0:
                while self._read_line():  # trailers, up to the blank line
                    pass
                return b"".join(chunks)
            size += chunk
            if size > limit:
                raise _TooLargeError
            piece = bytearray(chunk)
            with memoryview(piece) as view:
                self._read_exact(view)
            chunks.append(bytes(piece))
            if self._read_line():
                raise BadRequestError("chunk not followed by CRLF")

    def _continue(self, headers: dict[str, str]) -> None:
        if headers.get("expect", "").lower() == "100-continue":
            self.sock.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")

    # ------------------------------------------------------------------ writing
    def _answer_and_close(self, response: Response) -> None:
        """An answer to a request whose body is left unread: sent, then the rest of what the
        client sends is read and dropped for a moment, so that closing with unread data (which
        makes the kernel reset the connection) cannot destroy the answer before it is read."""
        try:
            self._write(response, keep_alive=False, head_only=False)
            self.sock.shutdown(socket.SHUT_WR)
            self.sock.settimeout(1.0)  # Python's timeout: a blocking socket's SO_RCVTIMEO aside
            self._timeout_s = 1.0
            drained = 0
            while drained < 16 * _READ_CHUNK and self.sock.recv(_READ_CHUNK):
                drained += _READ_CHUNK
        except (OSError, ssl.SSLError):
            pass

    def _write(
        self, response: Response, *, keep_alive: bool, head_only: bool, http10: bool = False
    ) -> None:
        parts: Sequence[Buffer] = response.parts
        sock = self.sock
        if isinstance(sock, ssl.SSLSocket) and self._timeout_s != self.server.request_timeout_s:
            # One Python timeout for both directions: a reply is sent under the request's.
            sock.settimeout(self.server.request_timeout_s)
            self._timeout_s = self.server.request_timeout_s
        head = reply_head(
            response.status,
            response.content_type,
            len(response),
            response.allow,
            keep_alive=keep_alive,
            http10=http10,
        )
        if head_only:
            sock.sendall(head)
        elif isinstance(sock, ssl.SSLSocket):  # no sendmsg: one buffer to encrypt
            sock.sendall(b"".join((head, *parts)))
        else:
            _send_all(sock, [head, *parts], len(head) + len(response))


def _send_all(sock: socket.socket, buffers: list[Buffer], total: int) -> None:
    """Write every buffer (`total` bytes) in order with as few `sendmsg` calls as the kernel
    allows: the kernel copies each byte once, straight from the buffers. A reply that fits the
    socket's send buffer goes in one call, with no view made of any buffer."""
    sent = sock.sendmsg(buffers) if len(buffers) <= _IOV_MAX else 0
    left = total - sent
    if not left:
        return
    views = [memoryview(b) for b in buffers]
    index = 0
    while True:
        while sent:
            size = views[index].nbytes
            if sent < size:
                views[index] = views[index][sent:]
                break
            sent -= size
            index += 1
        if not left:
            return
        sent = sock.sendmsg(views[index : index + _IOV_MAX])
        left -= sent
