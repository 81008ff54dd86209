"""What the request path hands the HTTP edge: a status, a content type and the body's buffers.

Below both the request path (`serving.app`), which makes responses, and the HTTP edge
(`edges.server`), which writes them, so that the edge does not depend on the request path's
module for the shape of its output.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Final

from exporter_scheduler.serving import wire
from exporter_scheduler.serving.echo import Buffer
from exporter_scheduler.serving.metrics import Verb

JSON: Final = b"application/json"
TEXT: Final = b"text/plain; charset=utf-8"


class Response:
    """A status, a content type and the body as buffers to write in order (a full-node filter
    reply is mostly slices of the request's own Node bytes, written without joining them), and
    what is left to do once it is written (`finish`)."""

    __slots__ = ("after", "allow", "content_type", "parts", "status")

    def __init__(
        self,
        status: int,
        body: bytes | Sequence[Buffer] = b"",
        content_type: bytes = JSON,
        *,
        allow: bytes | None = None,
    ) -> None:
        self.status = status
        self.parts: tuple[Buffer, ...] = (body,) if isinstance(body, bytes) else tuple(body)
        self.content_type = content_type
        self.allow = allow  # the `Allow` header of a 405
        # The call's counters and log lines: the HTTP edge writes the reply first, since
        # kube-scheduler waits for the reply and for nothing else.
        self.after: Callable[[], None] | None = None

    def finish(self) -> None:
        """Do what was left for after the reply (once, however often it is called)."""
        after, self.after = self.after, None
        if after is not None:
            after()

    @property
    def body(self) -> bytes:
        """The whole body as one bytes object (tests, small replies)."""
        parts = self.parts
        if len(parts) == 1 and isinstance(parts[0], bytes):
            return parts[0]
        return b"".join(parts)

    def __len__(self) -> int:
        return sum(map(len, self.parts))


def normalize_path_prefix(prefix: str) -> str:
    """`/` -> ``, `scheduler/` -> `/scheduler`: the part before `/filter`."""
    stripped = prefix.strip().strip("/")
    return f"/{stripped}" if stripped else ""


def bad_request(verb: Verb, message: str) -> Response:
    """400: the body is not a usable request, and why."""
    if verb == "filter":
        # Shaped like an ExtenderFilterResult, so even a lenient reader sees `Error`.
        return Response(400, wire.encode_filter_error(None, message))
    return Response(400, wire.encode_json({"Error": message}))


def method_not_allowed(allowed: str) -> Response:
    """405, naming the methods the path takes."""
    body = wire.encode_json({"Error": f"method not allowed; use {allowed}"})
    return Response(405, body, allow=allowed.encode())
