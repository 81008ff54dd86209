"""Defaults of the serving layer and the HTTP edge that the settings expose.

The settings (below both in the layering) offer these as flags; the request path and the server
start from the same values when built without settings (tests, benchmarks). Defined here, below
all three, so that the settings do not import the modules they configure.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

# 5000 full Nodes of ~7 KB are ~38 MB; twice that leaves room for bigger Node objects
# (many images, long annotations) without letting one request exhaust memory.
DEFAULT_MAX_BODY_BYTES: Final = 64 * 1024 * 1024
# Longer than kube-scheduler's 90 s idle-connection timeout (Go's default transport).
DEFAULT_KEEP_ALIVE_S: Final = 120


@dataclass(frozen=True, slots=True)
class TlsFiles:
    """The files of an HTTPS listener: its certificate and key, and the CA that client
    certificates must be signed by (mutual TLS) when set."""

    cert_file: str
    key_file: str
    client_ca_file: str | None = None
