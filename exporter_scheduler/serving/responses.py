"""What the request path hands the HTTP edge: a status, a content type and the body's buffers.

Below both the request path (`serving.app`), which makes responses, and the HTTP edge
(`edges.server`), which writes them, so that the edge does not depend on the request path's
module for the shape of its output.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Final

from exporter_scheduler.serving import wire
from exporter_scheduler.serving.echo import Buffer
from exporter_scheduler.serving.metrics import Verb

JSON: Final = b"application/json"
TEXT: Final = b"text/plain; charset=utf-8"

# The request path's logger: a failed step after a reply is the request path's error.
log = logging.getLogger("exporter_scheduler.server")
# Taken while a reply's steps are claimed: the HTTP edge and a scrape (`ScorerApp.settle`)
# may both finish one reply, and its steps run once.
_CLAIM: Final = threading.Lock()


@dataclass(slots=True)
class Steps:
    """What a call leaves for after its reply (`Response.then`)."""

    later: list[Callable[[], object]] = field(default_factory=list)
    first: list[Callable[[], object]] = field(default_factory=list)
    # The client's next request follows at once (`Response.awaits_next`).
    awaits_next: bool = False


class Response:
    """A status, a content type and the body as buffers to write in order (a full-node filter
    reply is mostly slices of the request's own Node bytes, written without joining them), and
    what is left to do once it is written (`finish`)."""

    __slots__ = (
        "__weakref__",
        "after",
        "allow",
        "awaits_next",
        "content_type",
        "first",
        "parts",
        "status",
    )

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
        # What the next request will read, made right after the reply (`prepare`).
        self.first: Callable[[], None] | None = None
        # The client's next request follows at once (a prioritize after its filter): the
        # HTTP edge answers it before it runs `after`.
        self.awaits_next = False

    def then(self, steps: Steps) -> None:
        """Leave `steps.later` for after the reply (its counters and log lines) and
        `steps.first` for right after it, before the connection's next request is read (the
        prioritize a filter prepares, which kube-scheduler sends next; where the scorer expects
        the pod to be bound). Each step runs even when one before it raised; the bug is logged
        (the reply, the only thing kube-scheduler reads, is gone already)."""
        self.after = partial(_run_each, steps.later)
        if steps.first:
            self.first = partial(_run_each, steps.first)
        self.awaits_next = steps.awaits_next

    def prepare(self) -> None:
        """Run `first` (once, however often and from whichever thread it is called)."""
        with _CLAIM:
            first, self.first = self.first, None
        if first is not None:
            first()

    def finish(self) -> None:
        """`prepare`, then what was left for after the reply (once, as `prepare`)."""
        self.prepare()
        with _CLAIM:
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


def _run_each(steps: Sequence[Callable[[], object]]) -> None:
    for step in steps:
        try:
            step()
        except Exception:
            log.exception("work after a reply failed")


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


def fallback_reply(verb: Verb | None, request: wire.ExtenderRequest | None, error: str) -> Response:
    """The answer when judging failed, one kube-scheduler can act on: a filter's `Error` with no
    node passing; a prioritize's neutral 0 for every node named (none when the request is
    unknown: the scheduler ranks as without the extender); explain's error; else 503."""
    if verb == "filter":
        return Response(200, wire.encode_filter_error(request, error))
    if verb == "prioritize":
        names = () if request is None else request.node_names
        return Response(200, wire.encode_prioritize_reply((name, 0) for name in names))
    return Response(
        200 if verb == "explain" or request is not None else 503, wire.encode_json({"Error": error})
    )
