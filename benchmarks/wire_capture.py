"""What kube-scheduler waits on each extender call, read on the wire.

The scorer's own histogram (`gpu_scorer_request_duration_seconds`) times a request from its
decode to its reply's bytes. kube-scheduler waits longer: from its request's last byte to the
reply's first, a wait that also holds the time the request lies in the kernel until a thread of
the extender has a CPU (and, in Python, the GIL), the reading of its head and body, and the
write. A null extender in Go reports no time at all. A packet capture on the loopback interface
times every extender alike: per call, from the last packet of the request to the first of the
reply, each stamped by the kernel as it crossed `lo`.

`Capture` runs `tcpdump` (it needs CAP_NET_RAW) on one port into a pcap file; `calls` pairs the
requests and replies of each connection; `summary` gives each verb's median, mean and 90th
percentile in ms. The capture keeps 128 bytes of each packet: enough for the request line, which
names the verb.
"""

from __future__ import annotations

import os
import select
import shutil
import signal
import statistics
import struct
import subprocess
import tempfile
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Final

from loopback_cluster.control_plane import free_port

# pcap's magic numbers: timestamps in microseconds or nanoseconds, in either byte order.
_MAGIC: Final = {
    b"\xd4\xc3\xb2\xa1": ("<", 1e-6),
    b"\xa1\xb2\xc3\xd4": (">", 1e-6),
    b"\x4d\x3c\xb2\xa1": ("<", 1e-9),
    b"\xa1\xb2\x3c\x4d": (">", 1e-9),
}
# Link types (the global header's last field) -> bytes before the link layer's ethertype field
# and the header's length: Ethernet (`lo` on Linux) and Linux cooked capture (`-i any`).
_LINKS: Final = {1: (12, 14), 113: (14, 16)}
_IPV4: Final = 0x0800
_IPV6: Final = 0x86DD
_TCP: Final = 6
_SNAP_BYTES: Final = 128
# libpcap hands the kernel's ring over a block at a time, a block once full or after its 1 s
# timeout (tcpdump's default, without --immediate-mode, which would wake it per packet); tcpdump
# stopped sooner leaves the last block's packets out of the file.
_DRAIN_S: Final = 1.5
_GLOBAL_HEADER: Final = 24
_RECORD_HEADER: Final = 16
# The request line's path names the call; anything else (a /metrics scrape) is not one.
VERBS: Final = ("filter", "prioritize")


@dataclass(frozen=True, slots=True)
class Segment:
    """One TCP segment that carried data."""

    at_s: float
    source_port: int
    destination_port: int
    head: bytes  # the first bytes of its payload (as many as the capture kept)


@dataclass(frozen=True, slots=True)
class Call:
    """One request and its reply on one connection."""

    verb: str
    request_last_s: float  # the request's last segment
    reply_first_s: float  # the reply's first segment

    @property
    def wait_ms(self) -> float:
        return (self.reply_first_s - self.request_last_s) * 1000


class CaptureUnavailableError(RuntimeError):
    """tcpdump is not installed, or may not capture (no CAP_NET_RAW)."""


class Capture:
    """`tcpdump` on `lo` for TCP port `port`, written to `path`, from `__enter__` to
    `__exit__`; `calls()` reads what it caught."""

    def __init__(
        self, port: int, path: Path, *, interface: str = "lo", start_timeout_s: float = 10.0
    ) -> None:
        self.port = port
        self.path = path
        self.interface = interface
        self.start_timeout_s = start_timeout_s
        self._process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Capture:
        tcpdump = shutil.which("tcpdump")
        if tcpdump is None:
            raise CaptureUnavailableError("tcpdump is not installed (Debian: apt install tcpdump)")
        argv = [tcpdump, "-i", self.interface, "-n", "-s", str(_SNAP_BYTES), "-B", "16384"]
        argv += ["-w", str(self.path), f"tcp port {self.port}"]
        process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self._process = process
        # tcpdump says "listening on ..." once its filter is in place; a refusal ends it.
        assert process.stderr is not None
        stderr = process.stderr.fileno()
        said = b""
        deadline_s = time.monotonic() + self.start_timeout_s
        while b"listening on" not in said:
            left_s = deadline_s - time.monotonic()
            if left_s <= 0 or not select.select([stderr], [], [], left_s)[0]:
                self._stop()
                raise CaptureUnavailableError(
                    f"tcpdump did not start listening in {self.start_timeout_s:g} s"
                )
            chunk = os.read(stderr, 4096)
            if not chunk:  # it exited: a refusal, in its own words
                process.wait(timeout=10)
                self._process = None
                raise CaptureUnavailableError(
                    said.decode(errors="replace").strip() or "tcpdump ended"
                )
            said += chunk
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self._process is not None:
            time.sleep(_DRAIN_S)  # the last packets, still in a ring block not yet handed over
            self._stop()

    def _stop(self) -> None:
        process, self._process = self._process, None
        if process is None:
            return
        process.send_signal(signal.SIGINT)  # tcpdump writes out what it holds and exits
        try:
            process.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.communicate()

    def calls(self) -> list[Call]:
        return calls(segments(self.path.read_bytes()), self.port)


def segments(pcap: bytes) -> Iterator[Segment]:
    """The TCP segments with data in a pcap file's bytes, in capture order. A truncated last
    record (a capture cut short) ends the reading; packets of other kinds are skipped."""
    if len(pcap) < _GLOBAL_HEADER or pcap[:4] not in _MAGIC:
        raise ValueError("not a pcap file")
    order, tick_s = _MAGIC[pcap[:4]]
    link = struct.unpack_from(order + "I", pcap, 20)[0]
    if link not in _LINKS:
        raise ValueError(f"pcap link type {link}: only Ethernet (1) and Linux cooked (113)")
    ethertype_at, link_bytes = _LINKS[link]
    record = struct.Struct(order + "IIII")
    offset = _GLOBAL_HEADER
    while offset + _RECORD_HEADER <= len(pcap):
        seconds, fraction, kept, _ = record.unpack_from(pcap, offset)
        offset += _RECORD_HEADER
        packet = pcap[offset : offset + kept]
        offset += kept
        if len(packet) < kept:
            return
        segment = _segment(packet, ethertype_at, link_bytes, seconds + fraction * tick_s)
        if segment is not None:
            yield segment


def _segment(packet: bytes, ethertype_at: int, link_bytes: int, at_s: float) -> Segment | None:
    if len(packet) < link_bytes:
        return None
    ethertype = struct.unpack_from(">H", packet, ethertype_at)[0]
    ip = packet[link_bytes:]
    if ethertype == _IPV4 and len(ip) >= 20:
        header_bytes = (ip[0] & 0x0F) * 4
        protocol = ip[9]
        ip_bytes = struct.unpack_from(">H", ip, 2)[0]
        payload_bytes = ip_bytes - header_bytes
    elif ethertype == _IPV6 and len(ip) >= 40:
        header_bytes, protocol = 40, ip[6]  # no extension headers on loopback TCP
        payload_bytes = struct.unpack_from(">H", ip, 4)[0]
    else:
        return None
    tcp = ip[header_bytes:]
    if protocol != _TCP or len(tcp) < 20:
        return None
    source_port, destination_port = struct.unpack_from(">HH", tcp, 0)
    tcp_header_bytes = (tcp[12] >> 4) * 4
    if payload_bytes - tcp_header_bytes <= 0:
        return None  # an ACK, a SYN or a FIN: no data
    return Segment(at_s, source_port, destination_port, bytes(tcp[tcp_header_bytes:]))


def calls(found: Iterable[Segment], port: int) -> list[Call]:
    """Each connection's requests to `port` paired with their replies, in the order they were
    answered. A request is every segment from the client until the server's first; its verb is
    the path of its request line. A request the capture saw no reply to is left out, and so is
    any call that is not a filter or a prioritize."""
    open_requests: dict[int, tuple[str, float]] = {}  # client port -> (verb, last segment)
    answered: list[Call] = []
    for segment in found:
        if segment.destination_port == port:
            client = segment.source_port
            opened = open_requests.get(client)
            verb = _verb(segment.head) if opened is None else opened[0]
            open_requests[client] = (verb, segment.at_s)
        elif segment.source_port == port:
            waiting = open_requests.pop(segment.destination_port, None)
            if waiting is not None and waiting[0] in VERBS:
                answered.append(Call(waiting[0], waiting[1], segment.at_s))
    return answered


def _verb(head: bytes) -> str:
    """`POST /filter HTTP/1.1` -> `filter` (the path's last part; a prefix may come first)."""
    parts = head.split(b" ", 2)
    if len(parts) < 2:
        return ""
    return parts[1].split(b"?", 1)[0].rstrip(b"/").rsplit(b"/", 1)[-1].decode(errors="replace")


def summary(found: Sequence[Call]) -> dict[str, dict[str, float]]:
    """verb -> calls, and the wait's median, mean and 90th percentile in ms."""
    by_verb: dict[str, list[float]] = {}
    for call in found:
        by_verb.setdefault(call.verb, []).append(call.wait_ms)
    result: dict[str, dict[str, float]] = {}
    for verb in VERBS:
        waits = sorted(by_verb.get(verb, ()))
        if not waits:
            continue
        result[verb] = {
            "calls": len(waits),
            "median_ms": round(statistics.median(waits), 3),
            "mean_ms": round(statistics.fmean(waits), 3),
            "p90_ms": round(waits[min(len(waits) - 1, int(len(waits) * 0.9))], 3),
        }
    return result


def check() -> None:
    """Raise `CaptureUnavailableError` unless a capture can start here (tcpdump installed and
    allowed to capture), before a run spends minutes on its setup."""
    with (
        tempfile.TemporaryDirectory(prefix="wire-capture-") as scratch,
        Capture(free_port(), Path(scratch) / "check.pcap"),
    ):
        pass
