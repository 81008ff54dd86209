"""One server of the scorer latency benchmark, in its own process, driven over stdin/stdout.

    python benchmarks/scorer_child.py scorer --tree DIR --mode names|full --port P --nodes FILE
    python benchmarks/scorer_child.py nothing --port P --reply FILE [--floor]

`scorer` serves the scorer from the source tree DIR (this checkout, or one of an earlier
version: the benchmark measures both side by side, so this file speaks both versions' APIs and
imports nothing else of the tree it lives in). `nothing` is the do-nothing server the scorer's
round trip is compared with: it reads each request (head, then exactly Content-Length bytes,
into one reused buffer) and answers with fixed bytes (the scorer's own reply, so that moving the
reply costs the same); with `--floor` it also decodes the body with msgspec into exactly what a
verdict reads (each Node's name, annotations and managedFields), which is the floor.

Commands, one JSON object per line on stdin, each answered with one line on stdout:
`{"cmd": "apply", "start": i, "count": k}` applies churn events i..i+k (watch events, as the
node cache's thread would) and answers the seconds each took; `{"cmd": "timings"}` answers the
handler times recorded inside the server since the last call; `{"cmd": "quit"}`.
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgspec

NOW = datetime(2026, 11, 30, 14, 0, 0, tzinfo=UTC)


def _answer(value: Any) -> None:
    sys.stdout.write(json.dumps(value) + "\n")
    sys.stdout.flush()


def serve_scorer(args: argparse.Namespace) -> None:
    sys.path.insert(0, str(Path(args.tree).resolve()))
    from exporter_scheduler.policy import Policy  # noqa: PLC0415 (from the tree given)

    policy = Policy()
    lines = Path(args.nodes).read_bytes().splitlines()
    churn = Path(args.churn).read_bytes().splitlines() if args.churn else []
    cache = None
    try:  # this version: a node store, an HTTP/1.1 server on blocking sockets
        from exporter_scheduler.app import ScorerApp  # noqa: PLC0415
        from exporter_scheduler.server import HttpServer  # noqa: PLC0415

        if args.mode == "names":
            from exporter_scheduler.nodecache import NodeCache  # noqa: PLC0415

            cache = NodeCache(keys=policy.keys, clock=lambda: NOW)
            for line in lines:
                cache._apply(line)  # the watch thread's entry point
            cache.store.replace(cache.store.lookup(cache.store.names()))  # as after a LIST
        app: Any = ScorerApp(
            policy=policy, clock=lambda: NOW, node_store=None if cache is None else cache.store
        )
        timed = "respond"
        HttpServer(app, host="127.0.0.1", port=args.port).start()
    except ImportError:  # the earlier version: reply cache and verdict memo, uvicorn
        from exporter_scheduler.server import (  # type: ignore[attr-defined]  # noqa: PLC0415
            RunningServer,
            ScorerApp,
            uvicorn_config,
        )

        if args.mode == "names":
            from exporter_scheduler.nodecache import NodeCache  # noqa: PLC0415

            cache = NodeCache(keys=policy.keys)
            for line in lines:
                cache._apply(line)
            cache._ready.set()  # type: ignore[attr-defined]
        app = ScorerApp(policy=policy, clock=lambda: NOW, node_source=cache)
        timed = "handle"
        config = uvicorn_config(app, host="127.0.0.1", port=args.port, log_level="warning")
        RunningServer(config).start()

    # The handler time, measured inside the server (decode, verdicts, reply; no HTTP).
    handler_s: list[float] = []
    inner = getattr(app, timed)

    def timing(*a: Any, **k: Any) -> Any:
        started = time.perf_counter()
        try:
            return inner(*a, **k)
        finally:
            handler_s.append(time.perf_counter() - started)

    setattr(app, timed, timing)
    _answer({"ready": True})
    for raw in sys.stdin:
        command = json.loads(raw)
        if command["cmd"] == "apply":
            assert cache is not None
            spent = []
            for line in churn[command["start"] : command["start"] + command["count"]]:
                started = time.perf_counter()
                cache._apply(line)
                spent.append(time.perf_counter() - started)
            _answer(spent)
        elif command["cmd"] == "timings":
            _answer(handler_s[:])
            handler_s.clear()
        else:
            return


def serve_nothing(args: argparse.Namespace) -> None:
    reply = Path(args.reply).read_bytes()
    decode = _floor_decoder() if args.floor else None
    head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n"
    response = head % len(reply) + reply
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", args.port))
    listener.listen()

    def connection(sock: socket.socket) -> None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        buffer = bytearray(64 << 20)
        view = memoryview(buffer)
        have = 0
        while True:
            while (end := buffer.find(b"\r\n\r\n", 0, have)) < 0:
                count = sock.recv_into(view[have:])
                if not count:
                    return
                have += count
            length = 0
            for line in bytes(buffer[:end]).split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            start = end + 4
            while have < start + length:
                have += sock.recv_into(view[have:])
            if decode is not None:
                decode(view[start : start + length])
            rest = have - start - length
            buffer[:rest] = buffer[start + length : have]
            have = rest
            sock.sendall(response)

    def accept() -> None:
        while True:
            sock, _ = listener.accept()
            threading.Thread(target=connection, args=(sock,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    _answer({"ready": True})
    for _ in sys.stdin:
        return


class _ManagedFieldsEntry(msgspec.Struct):
    manager: str | None = None
    time: str | None = None


class _Meta(msgspec.Struct):
    name: str | None = None
    annotations: dict[str, str] | None = None
    managedFields: list[_ManagedFieldsEntry] | None = None  # noqa: N815 (Kubernetes JSON name)


class _Node(msgspec.Struct):
    metadata: _Meta | None = None


class _NodeList(msgspec.Struct):
    items: list[_Node] | None = None


class _Args(msgspec.Struct):
    Nodes: _NodeList | None = None


def _floor_decoder() -> Any:
    """msgspec's typed decode of a full-node request to exactly what a verdict reads."""
    return msgspec.json.Decoder(_Args).decode


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("role", choices=["scorer", "nothing"])
    parser.add_argument("--tree")
    parser.add_argument("--mode", choices=["names", "full"])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--nodes")
    parser.add_argument("--churn")
    parser.add_argument("--reply")
    parser.add_argument("--floor", action="store_true")
    args = parser.parse_args()
    if args.role == "scorer":
        serve_scorer(args)
    else:
        serve_nothing(args)


if __name__ == "__main__":
    main()
