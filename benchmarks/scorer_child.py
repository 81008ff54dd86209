"""One process of the scorer latency benchmark, driven over stdin/stdout.

    python benchmarks/scorer_child.py scorer --tree DIR --mode names|full --port P
                                             [--kubeconfig FILE --expect N] [--log FILE]
    python benchmarks/scorer_child.py nothing --port P --reply FILE [--floor full|names]
    python benchmarks/scorer_child.py null --tree DIR --port P
    python benchmarks/scorer_child.py apiserver --port P --nodes FILE --churn FILE
                                                --kubeconfig FILE [--per-gpu]

`scorer` serves the scorer from the source tree DIR (this checkout, or one of an earlier
version: the benchmark measures both side by side, so this role speaks both versions' APIs and
imports nothing of the tree this file lives in). In names-only mode its node cache is the
production one, started as `gpu-scorer serve` starts it: a LIST, then a WATCH on its own thread
against the API server of `--kubeconfig`, so watch events meet requests in this process (the
GIL, the store's locks, the CPU caches) exactly as they do in production. As `serve` does, the
app and the node cache share one metrics registry, and the log is on at INFO: records are queued
on the request path and written as JSON lines by the log's writer thread (`logs.configure_logging`),
here to the file `--log` (a pod's filter with rejections logs a line, and so does a node whose
verdict for a class turns to a rejection). The garbage collector is paced as `serve` paces it
(`exporter_scheduler.heap`, where the tree has it). Not started, unlike `serve`'s defaults: the Pod,
Namespace and DRA watches (the stand-in serves Nodes only), so this is `serve --no-pod-watch`.

`nothing` is the do-nothing server the scorer's round trip is compared with: it reads each
request (head, then exactly Content-Length bytes, into one reused buffer) and answers with fixed
bytes (the scorer's own reply, so that moving the reply costs the same); with `--floor` it also
decodes the body with msgspec into exactly what a verdict reads, which is the floor: for `full`,
each Node's name, annotations and managedFields; for `names`, the node names and what the
scorer reads of the Pod (its name, namespace, uid, annotations and labels, its owners, its
containers' resources and its ResourceClaims).

`null` is the extender that decides nothing on the scorer's own HTTP edge
(`benchmarks.null_extender`, from the tree DIR), which the benchmark's `--nulls` times beside the
compiled one.

`apiserver` is the project's API server stand-in (`kube_standins.apiserver`, which answers LIST
and WATCH as kube-apiserver v1.36 does) holding the Nodes of `--nodes`, and the agents' writes:
on `churn` a thread rewrites Nodes from the `--churn` pool at a given mean rate (Poisson
arrivals), each write fanned out to every open watch as one chunk.

Commands, one JSON object per line on stdin, each answered with one line on stdout:
- scorer: `{"cmd": "timings"}` answers `{"handler": [[start, end], ...], "events": [...]}`,
  the `time.monotonic()` intervals of each request's handler (decode, verdicts, reply; no HTTP)
  and of each watch event the node cache applied, since the last call;
- apiserver: `{"cmd": "churn", "rate": r, "seed": s}` starts the writes,
  `{"cmd": "pause"}` stops them and answers how many were written, over how many seconds;
- all: `{"cmd": "quit"}`.
"""

from __future__ import annotations

import argparse
import importlib
import json
import random
import socket
import sys
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgspec

NOW = datetime(2026, 11, 30, 14, 0, 0, tzinfo=UTC)
# The node cache's first LIST of 5,000 ~8 KB Nodes from the stand-in takes seconds on 2 cores.
_SYNC_TIMEOUT_S = 300.0

Interval = list[float]  # [start, end], time.monotonic() (CLOCK_MONOTONIC: one clock per machine)


def _answer(value: object) -> None:
    sys.stdout.write(json.dumps(value) + "\n")
    sys.stdout.flush()


def _recording(inner: Callable[..., Any], spans: list[Interval]) -> Callable[..., Any]:
    """`inner`, appending the interval of each call to `spans` (a list append is atomic under
    the GIL, so the request threads and the watch thread can share the wrapper's pattern)."""

    def timed(*args: Any, **kwargs: Any) -> Any:
        started = time.monotonic()
        try:
            return inner(*args, **kwargs)
        finally:
            spans.append([started, time.monotonic()])

    return timed


def _module(name: str) -> Any:
    """A module of the tree under test (imported by name: its API differs between versions)."""
    return importlib.import_module(name)


def _start_logging(path: str | None) -> Any:
    """The log as `serve` starts it (INFO, the writer thread), into the file `path`; None when
    there is no `path` or the tree has no log writer of its own."""
    if path is None:
        return None
    for name in ("exporter_scheduler.logs", "exporter_scheduler.cli"):  # it moved once
        try:
            configure = getattr(_module(name), "configure_logging", None)
        except ImportError:
            continue
        if configure is not None:
            # The writer writes to `sys.stderr` as it is when started.
            sys.stderr = Path(path).open("w", encoding="utf-8")  # noqa: SIM115 (until exit)
            return configure("info")
    return None


def _start_pacing(tree: Path) -> Any:
    """The garbage collector's pacing as `serve` starts it; None for a tree without it."""
    if not (tree / "exporter_scheduler" / "heap.py").is_file():
        # Not imported by name: an editable install of this checkout would supply the module
        # to a tree that has none.
        return None
    return _module("exporter_scheduler.heap").CollectorPacing().start()


def _start_scorer(args: argparse.Namespace, keys: Any) -> tuple[Any, Any, str]:
    """(app, node cache or None, name of the app's handler method), serving on `args.port`."""
    names_only = args.mode == "names"
    try:  # this version: a node store, an HTTP/1.1 server on blocking sockets
        app_module = _module("exporter_scheduler.serving.app")
        server_module = _module("exporter_scheduler.edges.server")
    except ImportError:
        app_module = server_module = None
    nodecache = _module("exporter_scheduler.edges.nodecache") if names_only else None
    policy = _module("exporter_scheduler.core.policy").Policy()
    if app_module is not None and server_module is not None and hasattr(app_module, "ScorerApp"):
        # One registry for the app and the node cache, as `serve` makes it.
        metrics = _module("exporter_scheduler.serving.metrics").ScorerMetrics()
        cache = None
        if nodecache is not None:
            cache = nodecache.NodeCache(
                kubeconfig=args.kubeconfig, keys=keys, clock=lambda: NOW, metrics=metrics
            )
        app = app_module.ScorerApp(
            policy=policy,
            clock=lambda: NOW,
            node_store=None if cache is None else cache.store,
            metrics=metrics,
        )
        server_module.HttpServer(app, host="127.0.0.1", port=args.port).start()
        return app, cache, "respond"
    # The earlier version: reply cache and verdict memo, served by uvicorn.
    server_module = _module("exporter_scheduler.edges.server")
    cache = (
        None if nodecache is None else nodecache.NodeCache(kubeconfig=args.kubeconfig, keys=keys)
    )
    app = server_module.ScorerApp(policy=policy, clock=lambda: NOW, node_source=cache)
    config = server_module.uvicorn_config(
        app, host="127.0.0.1", port=args.port, log_level="warning"
    )
    server_module.RunningServer(config).start()
    return app, cache, "handle"


def serve_scorer(args: argparse.Namespace) -> None:
    tree = Path(args.tree).resolve()
    sys.path.insert(0, str(tree))
    keys = _module("gpu_contract.schema").DEFAULT_KEYS
    writer = _start_logging(args.log)
    pacing = _start_pacing(tree)
    app, cache, handler_name = _start_scorer(args, keys)
    handler_spans: list[Interval] = []
    event_spans: list[Interval] = []
    # The handler time, measured inside the server (decode, verdicts, reply; no HTTP).
    setattr(app, handler_name, _recording(getattr(app, handler_name), handler_spans))
    if cache is not None:
        # The watch loop calls `self._apply(line)` for each event line: an instance attribute
        # wins over the method, so every event the real loop applies is timed.
        cache._apply = _recording(cache._apply, event_spans)
        cache.start()
        expect = args.expect
        if not cache.wait_until(lambda c: c.ready() and len(c) >= expect, _SYNC_TIMEOUT_S):
            raise SystemExit(f"node cache not synced: {len(cache)} of {expect} nodes")
        event_spans.clear()  # the LIST is not a watch event
    _answer({"ready": True})
    for raw in sys.stdin:
        command = json.loads(raw)
        if command["cmd"] == "timings":
            handler, events = handler_spans[:], event_spans[:]
            del handler_spans[: len(handler)], event_spans[: len(events)]
            _answer({"handler": handler, "events": events})
        else:
            break
    if cache is not None:
        cache.stop(timeout_s=2.0)
    if pacing is not None:
        pacing.stop()
    if writer is not None:
        writer.stop()


# ----------------------------------------------------------------------------- null extender


def serve_null(args: argparse.Namespace) -> None:
    sys.path.insert(0, str(Path(args.tree).resolve()))
    server = _module("exporter_scheduler.edges.server")
    null = _module("benchmarks.null_extender")
    running = server.HttpServer(null.NullApp(), host="127.0.0.1", port=args.port).start()
    _answer({"ready": True})
    for _ in sys.stdin:  # the first command is `quit`
        break
    running.stop()


# ----------------------------------------------------------------------------- do-nothing


def serve_nothing(args: argparse.Namespace) -> None:
    reply = Path(args.reply).read_bytes()
    decode = None if args.floor is None else _floor_decoder(args.floor)
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


class _Owner(msgspec.Struct):
    kind: str | None = None
    name: str | None = None
    controller: bool | None = None


class _PodMeta(msgspec.Struct):
    name: str | None = None
    namespace: str | None = None
    uid: str | None = None
    annotations: dict[str, str] | None = None
    labels: dict[str, str] | None = None
    ownerReferences: list[_Owner] | None = None  # noqa: N815 (Kubernetes JSON name)


class _Resources(msgspec.Struct):
    limits: dict[str, str | int | float] | None = None
    requests: dict[str, str | int | float] | None = None


class _Container(msgspec.Struct):
    resources: _Resources | None = None


class _Claim(msgspec.Struct):
    name: str | None = None
    resourceClaimName: str | None = None  # noqa: N815 (Kubernetes JSON name)


class _PodSpec(msgspec.Struct):
    containers: list[_Container] | None = None
    initContainers: list[_Container] | None = None  # noqa: N815 (Kubernetes JSON name)
    resourceClaims: list[_Claim] | None = None  # noqa: N815 (Kubernetes JSON name)


class _PodStatus(msgspec.Struct):
    resourceClaimStatuses: list[_Claim] | None = None  # noqa: N815 (Kubernetes JSON name)


class _Pod(msgspec.Struct):
    metadata: _PodMeta | None = None
    spec: _PodSpec | None = None
    status: _PodStatus | None = None


class _NamesArgs(msgspec.Struct):
    Pod: _Pod | None = None
    NodeNames: list[str] | None = None


def _floor_decoder(form: str) -> Callable[[memoryview], object]:
    """msgspec's typed decode of a request to exactly what a verdict reads: a full-node
    request's Nodes (`full`), or a names-only request's names and Pod (`names`)."""
    return msgspec.json.Decoder(_Args if form == "full" else _NamesArgs).decode


# ----------------------------------------------------------------------------- API server


class _Churn:
    """The agents' writes: Nodes from a pool rewritten at a mean rate, Poisson arrivals."""

    def __init__(
        self, put: Callable[[dict[str, Any]], object], pool: list[dict[str, Any]], nodes: int
    ) -> None:
        self._put = put
        self._pool = pool
        self._nodes = nodes
        self._next = 0
        self._rewrites: dict[int, int] = {}
        self._per_gpu = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.written = 0
        self.built_live = 0
        self.started_s = 0.0

    def start(self, rate_per_s: float, seed: int, *, per_gpu: bool) -> None:
        self._per_gpu = per_gpu
        self._stop.clear()
        self.written = 0
        self.started_s = time.monotonic()
        rng = random.Random(seed)
        self._thread = threading.Thread(target=self._run, args=(rate_per_s, rng), daemon=True)
        self._thread.start()

    def pause(self) -> dict[str, float]:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        seconds = time.monotonic() - self.started_s
        return {"written": self.written, "seconds": seconds, "built_live": self.built_live}

    def _run(self, rate_per_s: float, rng: random.Random) -> None:
        due = time.monotonic()
        while True:
            # Each gap drawn on its own, written against a schedule (not after the last write),
            # so that the mean rate holds however long a write takes.
            due += rng.expovariate(rate_per_s)
            if self._stop.wait(max(0.0, due - time.monotonic())):
                return
            self._put(self._take())
            self.written += 1

    def _take(self) -> dict[str, Any]:
        if self._next < len(self._pool):
            entry = self._pool[self._next]
            self._next += 1
            self._rewrites[entry["i"]] = entry["rewrite"]
            node: dict[str, Any] = entry["node"]
            return node
        # The pool is spent (a longer run than it was built for): build the next write here, a
        # later version of a node than any written (an identical write would change nothing).
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
        build_node = _module("benchmarks.scorer_latency").build_node
        i = self.built_live % self._nodes
        self._rewrites[i] = self._rewrites.get(i, 0) + 1
        self.built_live += 1
        live: dict[str, Any] = build_node(i, rewrite=self._rewrites[i], per_gpu=self._per_gpu)
        return live


def serve_apiserver(args: argparse.Namespace) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    apiserver = _module("kube_standins.apiserver")
    # The clock stamps creation times only: the agents' own managedFields times are kept.
    standin = apiserver.ApiServerStandIn(
        port=args.port, clock=apiserver.ManualClock(NOW), history_limit=100_000
    )
    lines = Path(args.nodes).read_bytes().splitlines()
    for line in lines:
        standin.put_node(json.loads(line))
    pool = [json.loads(line) for line in Path(args.churn).read_bytes().splitlines()]
    standin.start()
    standin.write_kubeconfig(Path(args.kubeconfig))
    churn = _Churn(standin.put_node, pool, len(lines))
    _answer({"ready": True})
    for raw in sys.stdin:
        command = json.loads(raw)
        if command["cmd"] == "churn":
            churn.start(float(command["rate"]), int(command["seed"]), per_gpu=args.per_gpu)
            _answer({"started": True})
        elif command["cmd"] == "pause":
            _answer(churn.pause())
        elif command["cmd"] == "watches":
            _answer({"watches": standin.watch_count})
        else:
            break
    churn.pause()
    standin.stop()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("role", choices=["scorer", "nothing", "null", "apiserver"])
    parser.add_argument("--tree")
    parser.add_argument("--mode", choices=["names", "full"])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--kubeconfig")
    parser.add_argument("--expect", type=int, default=0, help="nodes the first LIST must hold")
    parser.add_argument("--nodes")
    parser.add_argument("--churn")
    parser.add_argument("--per-gpu", action="store_true")
    parser.add_argument("--reply")
    parser.add_argument("--floor", choices=["full", "names"])
    parser.add_argument("--log", help="scorer: the log's file (INFO, as `serve` logs)")
    args = parser.parse_args()
    if args.role == "scorer":
        serve_scorer(args)
    elif args.role == "apiserver":
        serve_apiserver(args)
    elif args.role == "null":
        serve_null(args)
    else:
        serve_nothing(args)


if __name__ == "__main__":
    main()
