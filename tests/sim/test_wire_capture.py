"""Extender calls timed on the wire: pcap files read and paired, and tcpdump's life cycle, with
pcaps written here and a stand-in tcpdump (the real one needs CAP_NET_RAW)."""

from __future__ import annotations

import os
import stat
import struct
import sys
import time
from pathlib import Path

import pytest

from benchmarks import wire_capture
from benchmarks.wire_capture import Call, Segment

EXTENDER_PORT = 8888
CLIENT_PORT = 40000
SECOND_CLIENT_PORT = 40001


def _tcp(source: int, destination: int, payload: bytes, *, ack_only: bool = False) -> bytes:
    data = b"" if ack_only else payload
    tcp = struct.pack(">HHIIBBHHH", source, destination, 1, 1, 8 << 4, 0x18, 65535, 0, 0)
    tcp += b"\x00" * 12  # options: 32-byte header, as Linux writes it with timestamps
    return tcp + data


def _ipv4(tcp: bytes, *, protocol: int = 6) -> bytes:
    header = struct.pack(">BBHHHBBH4s4s", 0x45, 0, 20 + len(tcp), 0, 0, 64, protocol, 0,
                         b"\x7f\x00\x00\x01", b"\x7f\x00\x00\x01")  # fmt: skip
    return header + tcp


def _ethernet(ip: bytes, ethertype: int = 0x0800) -> bytes:
    return b"\x00" * 12 + struct.pack(">H", ethertype) + ip


def _pcap(
    packets: list[tuple[float, bytes]], *, nanoseconds: bool = False, snap: int = 128
) -> bytes:
    """A little-endian pcap of Ethernet frames, each cut to `snap` bytes as tcpdump -s cuts."""
    magic = 0xA1B23C4D if nanoseconds else 0xA1B2C3D4
    out = struct.pack("<IHHiIII", magic, 2, 4, 0, 0, snap, 1)
    for at_s, frame in packets:
        seconds = int(at_s)
        fraction = round((at_s - seconds) * (1e9 if nanoseconds else 1e6))
        kept = frame[:snap]
        out += struct.pack("<IIII", seconds, fraction, len(kept), len(frame)) + kept
    return out


def _request(verb: str, body_bytes: int = 40) -> bytes:
    return f"POST /{verb} HTTP/1.1\r\nHost: x\r\n\r\n".encode() + b"{" * body_bytes


def _to_extender(client: int, payload: bytes) -> bytes:
    return _ethernet(_ipv4(_tcp(client, EXTENDER_PORT, payload)))


def _from_extender(client: int, payload: bytes) -> bytes:
    return _ethernet(_ipv4(_tcp(EXTENDER_PORT, client, payload)))


def test_each_call_is_timed_from_the_requests_last_segment_to_the_replys_first() -> None:
    reply = b"HTTP/1.1 200 OK\r\n\r\n{}"
    packets = [
        # A filter in two segments, acknowledged, answered in two segments.
        (10.000000, _to_extender(CLIENT_PORT, _request("filter"))),
        (10.000200, _to_extender(CLIENT_PORT, b"more of the body")),
        (10.000210, _ethernet(_ipv4(_tcp(EXTENDER_PORT, CLIENT_PORT, b"", ack_only=True)))),
        (10.001700, _from_extender(CLIENT_PORT, reply)),
        (10.001800, _from_extender(CLIENT_PORT, b"rest of the reply")),
        # Its prioritize on the same connection, and another filter on a second one meanwhile.
        (10.004000, _to_extender(CLIENT_PORT, _request("prioritize"))),
        (10.004100, _to_extender(SECOND_CLIENT_PORT, _request("filter"))),
        (10.004600, _from_extender(CLIENT_PORT, reply)),
        (10.005100, _from_extender(SECOND_CLIENT_PORT, reply)),
    ]
    calls = list(wire_capture.calls(wire_capture.segments(_pcap(packets)), EXTENDER_PORT))
    assert [(c.verb, round(c.wait_ms, 3)) for c in calls] == [
        ("filter", 1.5),
        ("prioritize", 0.6),
        ("filter", 1.0),
    ]


def test_nanosecond_captures_keep_their_resolution() -> None:
    packets = [
        (5.000000100, _to_extender(CLIENT_PORT, _request("filter"))),
        (5.000250300, _from_extender(CLIENT_PORT, b"HTTP/1.1 200 OK\r\n\r\n")),
    ]
    (call,) = wire_capture.calls(
        wire_capture.segments(_pcap(packets, nanoseconds=True)), EXTENDER_PORT
    )
    assert call.wait_ms == pytest.approx(0.2502, abs=1e-6)


def test_calls_that_are_not_verdicts_or_were_never_answered_are_left_out() -> None:
    packets = [
        # A scrape of /metrics between rounds is no extender call.
        (1.0, _to_extender(CLIENT_PORT, b"GET /metrics HTTP/1.1\r\n\r\n")),
        (1.1, _from_extender(CLIENT_PORT, b"HTTP/1.1 200 OK\r\n\r\n# HELP")),
        # A path under a prefix still names its verb; a query is not part of it.
        (2.0, _to_extender(CLIENT_PORT, b"POST /scheduler/filter?x=1 HTTP/1.1\r\n\r\n")),
        (2.002, _from_extender(CLIENT_PORT, b"HTTP/1.1 200 OK\r\n\r\n")),
        # The capture stopped before this one's reply.
        (3.0, _to_extender(SECOND_CLIENT_PORT, _request("prioritize"))),
        # A UDP datagram and an IPv6 frame of another port: not the extender's.
        (3.1, _ethernet(_ipv4(_tcp(CLIENT_PORT, EXTENDER_PORT, b"x"), protocol=17))),
        (3.2, _ethernet(b"\x60" + b"\x00" * 39, ethertype=0x86DD)),
    ]
    calls = wire_capture.calls(wire_capture.segments(_pcap(packets)), EXTENDER_PORT)
    assert [(c.verb, round(c.wait_ms, 3)) for c in calls] == [("filter", 2.0)]


def test_a_capture_cut_short_is_read_up_to_its_last_whole_packet() -> None:
    packets = [
        (1.0, _to_extender(CLIENT_PORT, _request("filter"))),
        (1.001, _from_extender(CLIENT_PORT, b"HTTP/1.1 200 OK\r\n\r\n")),
        (1.002, _to_extender(CLIENT_PORT, _request("prioritize"))),
    ]
    data = _pcap(packets)
    cut = data[:-10]  # tcpdump killed in the middle of a record
    found = list(wire_capture.segments(cut))
    assert [s.destination_port for s in found] == [EXTENDER_PORT, CLIENT_PORT]


@pytest.mark.parametrize(
    ("data", "message"),
    [
        pytest.param(b"", "not a pcap file", id="empty"),
        pytest.param(b"GIF89a" + b"\x00" * 40, "not a pcap file", id="another-format"),
        pytest.param(
            struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 128, 105),
            "link type 105",
            id="wifi-link-type",
        ),
    ],
)
def test_a_file_that_is_not_a_loopback_capture_is_a_clear_error(data: bytes, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        list(wire_capture.segments(data))


def test_the_summary_gives_each_verbs_median_mean_and_90th_percentile() -> None:
    waits_ms = {"filter": [1.0, 2.0, 3.0, 4.0, 10.0], "prioritize": [0.5]}
    calls = [
        Call(verb, 100.0, 100.0 + wait_ms / 1000)
        for verb, waits in waits_ms.items()
        for wait_ms in waits
    ]
    summary = wire_capture.summary(calls)
    assert summary["filter"] == {"calls": 5, "median_ms": 3.0, "mean_ms": 4.0, "p90_ms": 10.0}
    assert summary["prioritize"]["median_ms"] == pytest.approx(0.5)
    assert wire_capture.summary([]) == {}


def _stand_in_tcpdump(folder: Path, script: str) -> None:
    """A `tcpdump` first on PATH: a Python script with the given body (argv in `sys.argv`)."""
    path = folder / "tcpdump"
    path.write_text(f"#!{sys.executable}\nimport signal, sys, time\n{script}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def test_a_capture_runs_until_the_block_ends_and_its_calls_are_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """tcpdump is stopped with SIGINT, as its own ^C, so that it writes out what it holds; a
    warning before it says it listens is not a refusal."""
    pcap = _pcap(
        [
            (1.0, _to_extender(CLIENT_PORT, _request("filter"))),
            (1.0008, _from_extender(CLIENT_PORT, b"HTTP/1.1 200 OK\r\n\r\n")),
        ]
    )
    (tmp_path / "capture.bin").write_bytes(pcap)
    _stand_in_tcpdump(
        tmp_path,
        "out = sys.argv[sys.argv.index('-w') + 1]\n"
        "assert sys.argv[-1] == 'tcp port 8888', sys.argv\n"
        "def stop(*_):\n"
        f"    open(out, 'wb').write(open({str(tmp_path / 'capture.bin')!r}, 'rb').read())\n"
        "    sys.exit(0)\n"
        "signal.signal(signal.SIGINT, stop)\n"
        "print('tcpdump: WARNING: lo: no IPv4 address assigned', file=sys.stderr, flush=True)\n"
        "print('listening on lo, link-type EN10MB', file=sys.stderr, flush=True)\n"
        "time.sleep(60)\n"
        "sys.exit(3)",
    )
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    with wire_capture.Capture(EXTENDER_PORT, tmp_path / "out.pcap") as capture:
        pass
    assert [round(c.wait_ms, 3) for c in capture.calls()] == [0.8]


def test_a_capture_that_may_not_start_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _stand_in_tcpdump(
        tmp_path,
        'print("tcpdump: lo: You don\'t have permission to capture on that device",'
        " file=sys.stderr)\nsys.exit(1)",
    )
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(wire_capture.CaptureUnavailableError, match="permission to capture"):
        wire_capture.check()
    monkeypatch.setenv("PATH", str(tmp_path / "nothing-here"))
    with pytest.raises(wire_capture.CaptureUnavailableError, match="not installed"):
        wire_capture.check()


def test_a_tcpdump_that_never_says_it_listens_is_stopped_not_waited_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    started = tmp_path / "started"
    _stand_in_tcpdump(tmp_path, f"open({str(started)!r}, 'w').write('1')\ntime.sleep(60)")
    monkeypatch.setenv("PATH", str(tmp_path))
    capture = wire_capture.Capture(EXTENDER_PORT, tmp_path / "out.pcap", start_timeout_s=0.5)
    began_s = time.monotonic()
    with pytest.raises(wire_capture.CaptureUnavailableError, match="did not start listening"):
        capture.__enter__()
    assert time.monotonic() - began_s < 20  # stopped, not waited on for its 60 s
    assert started.exists()


def test_a_segment_keeps_the_start_of_its_payload() -> None:
    packets = [(1.0, _to_extender(CLIENT_PORT, _request("filter", body_bytes=500)))]
    (segment,) = wire_capture.segments(_pcap(packets))
    assert segment == Segment(1.0, CLIENT_PORT, EXTENDER_PORT, segment.head)
    assert segment.head.startswith(b"POST /filter HTTP/1.1")
    assert len(segment.head) == 128 - 14 - 20 - 32  # what the snap length left of it
