"""The scorer's observability endpoints on a port of their own."""

from __future__ import annotations

from typing import Final

from exporter_scheduler.serving import wire
from exporter_scheduler.serving.app import ScorerApp
from exporter_scheduler.serving.echo import Buffer
from exporter_scheduler.serving.responses import Response


class ObservabilityApp:
    """Only `/metrics`, `/healthz` and `/readyz` of a `ScorerApp`, for a port of their own.

    A scraper allowed onto that port (by a NetworkPolicy) cannot reach the extender verbs."""

    # A GET carries no body; anything larger is refused before it is read.
    max_body_bytes: Final = 1024

    def __init__(self, app: ScorerApp) -> None:
        self._app = app

    def respond(self, method: str, path: str, query: bytes, body: Buffer) -> Response:
        if path not in ("/healthz", "/readyz", "/metrics"):
            return Response(404, wire.encode_json({"Error": f"no such path: {path[:200]}"}))
        return self._app.respond(method, path, query, body)

    def body_too_large(self) -> Response:
        error = f"request body exceeds {self.max_body_bytes} bytes"
        return Response(413, wire.encode_json({"Error": error}))
