"""HTTP/1.1 framing for the scorer's edge (`edges.server`): request heads read, reply heads
written. Pure functions on bytes and strings, no sockets."""

from __future__ import annotations

import struct
from http import HTTPStatus
from typing import Final

# Response heads less their length, by (status, content type, allow, keep-alive, HTTP/1.0):
# a handful in practice; the bound only keeps odd inputs from growing it.
_HEADS: dict[tuple[int, bytes, bytes | None, bool, bool], tuple[bytes, bytes]] = {}
_MAX_HEADS: Final = 64


class MalformedHeadError(Exception):
    """A head or a chunk-size line that cannot be read as HTTP/1.1."""


class BadRequestError(MalformedHeadError):
    """The request cannot be read as HTTP/1.1; answered 400 and the connection closed."""


_HEX_DIGITS: Final = b"0123456789abcdefABCDEF"


def reply_head(
    status: int,
    content_type: bytes,
    length: int,
    allow: bytes | None,
    *,
    keep_alive: bool,
    http10: bool = False,
) -> bytes:
    """The response head; all but the length is built once per kind of reply."""
    key = (status, content_type, allow, keep_alive, http10)
    framing = _HEADS.get(key)
    if framing is None:
        if len(_HEADS) >= _MAX_HEADS:
            _HEADS.clear()
        framing = _HEADS[key] = _head_framing(*key)
    before, after = framing
    return b"%s%d%s" % (before, length, after)


def _head_framing(
    status: int, content_type: bytes, allow: bytes | None, keep_alive: bool, http10: bool
) -> tuple[bytes, bytes]:
    """The head's bytes before and after its content length."""
    phrase = HTTPStatus(status).phrase.encode()
    before = b"HTTP/1.1 %d %s\r\ncontent-type: %s\r\ncontent-length: " % (
        status,
        phrase,
        content_type,
    )
    lines = [b""]
    if allow is not None:
        lines.append(b"allow: " + allow)
    if not keep_alive:
        lines.append(b"connection: close")
    elif http10:  # an HTTP/1.0 client keeps the connection only when told so
        lines.append(b"connection: keep-alive")
    return before, b"\r\n".join(lines) + b"\r\n\r\n"


def parse_head(head: bytes) -> tuple[str, str, str, dict[str, str]]:
    """Request line and headers (names lower-cased). Strict where leniency lets one request be
    read as two (obsolete line folding, space before the colon, repeated lengths)."""
    try:
        text = head.decode("latin-1")
    except UnicodeDecodeError:  # pragma: no cover - latin-1 decodes every byte
        raise BadRequestError("undecodable head") from None
    request_line, *lines = text.split("\r\n")
    parts = request_line.split(" ")
    if len(parts) != 3 or not parts[0].isalpha() or not parts[1]:
        raise BadRequestError("malformed request line")
    method, target, version = parts
    if version not in ("HTTP/1.1", "HTTP/1.0"):
        raise BadRequestError(f"unsupported version {version[:16]!r}")
    try:
        return method, target, version, header_fields(lines)
    except MalformedHeadError as exc:
        raise BadRequestError(str(exc)) from None


def header_fields(lines: list[str]) -> dict[str, str]:
    """Header lines (a request's or a response's) by lower-cased name, strict as `parse_head`."""
    headers: dict[str, str] = {}
    for line in lines:
        name, colon, value = line.partition(":")
        if not colon or not name or name != name.strip() or line[0] in " \t":
            raise MalformedHeadError(f"malformed header line {line[:80]!r}")
        key = name.lower()
        value = value.strip()
        if key in headers:
            if key == "content-length" and headers[key] != value:
                raise MalformedHeadError("conflicting content-length headers")
            if key in ("transfer-encoding", "connection"):
                value = f"{headers[key]}, {value}"
        headers[key] = value
    return headers


def chunk_size(line: bytes) -> int:
    """The size a chunk-size line gives (extensions ignored): hex digits only, no sign."""
    digits = line.split(b";", 1)[0].strip()
    if not digits or digits.strip(_HEX_DIGITS) or len(digits) > 16:
        raise MalformedHeadError(f"bad chunk size {digits[:40]!r}")
    return int(digits, 16)


def keeps_alive(version: str, headers: dict[str, str]) -> bool:
    connection = headers.get("connection")
    if connection is None:  # kube-scheduler's Go client sends none
        return version != "HTTP/1.0"
    tokens = {t.strip().lower() for t in connection.split(",")}
    if version == "HTTP/1.0":
        return "keep-alive" in tokens
    return "close" not in tokens


def timeval(seconds: float) -> bytes:
    """`seconds` as the `struct timeval` that SO_RCVTIMEO and SO_SNDTIMEO take."""
    whole = int(seconds)
    micros = int((seconds - whole) * 1_000_000)
    # All zero would mean no timeout at all; the shortest one is meant.
    return struct.pack("@ll", whole, micros if whole or micros else 1)
