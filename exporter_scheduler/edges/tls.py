"""The HTTPS listener's certificate: an SSL context, reloaded when its files change on disk.

Kept apart from the HTTP server so that the server reads as its connection loop; this is the
one place that reads certificate files.
"""

from __future__ import annotations

import logging
import os
import ssl
import threading
import time

from exporter_scheduler.config.serving import TlsFiles

# The server's logger: a reload is the server's news.
log = logging.getLogger("exporter_scheduler.server")


class TlsContexts:
    """The server's SSL context, rebuilt when its files change on disk.

    Mounted Secrets are updated in place when a certificate is renewed (cert-manager renews well
    before expiry), so a long-running scorer must pick the new files up without a restart. The
    files' modification times are looked at most every `check_every_s`, on a new connection; a
    set of files that fails to load (caught mid-update) keeps the previous context.
    """

    def __init__(self, tls: TlsFiles, *, check_every_s: float = 30.0) -> None:
        self._tls = tls
        self._check_every_s = check_every_s
        self._lock = threading.Lock()
        self._stamp = self._mtimes()
        self.context = tls_context(tls)
        self._checked_at = time.monotonic()

    def _mtimes(self) -> tuple[float, ...]:
        tls = self._tls
        paths = [tls.cert_file, tls.key_file] + ([tls.client_ca_file] if tls.client_ca_file else [])
        stamps = []
        for path in paths:
            try:
                stamps.append(os.stat(path).st_mtime)
            except OSError:
                stamps.append(-1.0)
        return tuple(stamps)

    def current(self) -> ssl.SSLContext:
        now = time.monotonic()
        if now - self._checked_at < self._check_every_s:
            return self.context
        with self._lock:
            self._checked_at = now
            stamp = self._mtimes()
            if stamp != self._stamp:
                try:
                    self.context = tls_context(self._tls)
                    self._stamp = stamp
                    log.info("TLS certificate files changed; reloaded")
                except (OSError, ssl.SSLError) as exc:
                    log.warning("TLS certificate files changed but do not load yet: %s", exc)
            return self.context


def tls_context(tls: TlsFiles) -> ssl.SSLContext:
    """A server context for the extender: the certificate, and a client CA when mutual TLS."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(tls.cert_file, tls.key_file)
    if tls.client_ca_file:
        # The scheduler's tlsConfig presents a client certificate; require and verify it.
        context.load_verify_locations(tls.client_ca_file)
        context.verify_mode = ssl.CERT_REQUIRED
    return context
