"""The agent's only HTTP server: `/metrics`, `/healthz` and `/readyz` for Prometheus and kubelet.

A small threaded WSGI server from the standard library is enough: it serves a scrape every few
seconds and two probes, and a slow scrape must not block a probe. The probes' answers are
callables the daemon provides, so this module knows nothing of ticks or the API.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app

# (ok, one-line explanation) for a probe.
Probe = Callable[[], tuple[bool, str]]
StartResponse = Callable[..., Any]


class _ThreadingWSGIServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True
    allow_reuse_address = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        # Probes every few seconds would drown the agent's own log.
        return


def make_app(
    *, registry: CollectorRegistry, healthz: Probe, readyz: Probe
) -> Callable[[dict[str, Any], StartResponse], Iterable[bytes]]:
    metrics_app = make_wsgi_app(registry)

    def app(environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if path == "/metrics":
            return metrics_app(environ, start_response)  # type: ignore[no-any-return]
        if path in ("/healthz", "/readyz"):
            ok, detail = (healthz if path == "/healthz" else readyz)()
            body = (("ok" if ok else "not ok") + ": " + detail + "\n").encode()
            start_response(
                "200 OK" if ok else "503 Service Unavailable",
                [("Content-Type", "text/plain; charset=utf-8"), ("Content-Length", str(len(body)))],
            )
            return [body]
        body = b"not found: try /metrics, /healthz or /readyz\n"
        start_response(
            "404 Not Found",
            [("Content-Type", "text/plain; charset=utf-8"), ("Content-Length", str(len(body)))],
        )
        return [body]

    return app


class HealthServer:
    """Serves the app on a background thread until `stop()`."""

    def __init__(
        self,
        *,
        registry: CollectorRegistry,
        healthz: Probe,
        readyz: Probe,
        host: str = "0.0.0.0",
        port: int = 0,
    ) -> None:
        app = make_app(registry=registry, healthz=healthz, readyz=readyz)
        self._server = make_server(
            host, port, app, server_class=_ThreadingWSGIServer, handler_class=_QuietHandler
        )
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.2},
            name="gpu-agent-http",
            daemon=True,
        )

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def start(self) -> HealthServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> HealthServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
