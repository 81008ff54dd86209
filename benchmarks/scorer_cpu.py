"""Server CPU per names-only filter + prioritize pair, with the scorer's log lines on.

On two shared cores every CPU millisecond the scorer spends on a pod is taken from
kube-scheduler and the API server, so its CPU per pod is what the real-scheduler throughput
feels; wall time alone hides a thread hand-off or a syscall that another process pays for.

One scorer process per tree (this checkout and, with `--before REF`, an export of REF) serves a
names-only node store of `--nodes` nodes, one in ten above the utilization limit, so that every
filter logs its rejections, as `gpu-scorer serve` does: JSON lines at INFO through
`logs.configure_logging`, to /dev/null, and the prioritize's proposals recorded, as with the
Pod watch (`RecordedProposals`). One keep-alive connection sends what kube-scheduler sends
(`benchmarks.kube_requests`): per pod, a fresh Pod object from a mix of classes, a filter of the
next window of its rotation over the nodes (500 names at 5,000 nodes, each window starting where
the last ended), then a prioritize of the names that filter passed. The figure is the process's
CPU over `--pairs` pairs, per pair, every thread's, as the process reads it itself
(`time.process_time`, to the nanosecond: /proc counts it in ticks of 10 ms, more than a short
run's whole CPU). The trees alternate for
`--rounds` rounds; the table gives medians and the ratio between the trees.

`--cool-mib N`: before each request the client reads one byte of every cache line of an N MiB
buffer, as kube-scheduler, the API server and etcd read their own memory between a pod's calls
on a machine they saturate. From the other core it evicts the scorer's store from the shared
last-level cache, not from the scorer core's own caches; it brings the CPU per pair near what
the real scheduler's runs show (with 0, the default, back-to-back pairs keep the store warm, and
a change in what a request reads shows less than it does under the real scheduler).

`--fresh-lists`: each window is rotated by a random offset not used for it yet, so that a list's
bytes come back only after every rotation of its window has been sent (500 times at 5,000 nodes).
kube-scheduler's parallel filter hands a window's names over in the order its chunks finish
(`benchmarks.window_check`), so a window that comes back need not come back byte for byte, and
what the scorer keeps per list (keyed by its bytes) need not be found. Without it, at 5,000 nodes
each window comes back, in the same order, every tenth pod.

    python -m benchmarks.scorer_cpu --before HEAD~1
    python -m benchmarks.scorer_cpu --json
"""

from __future__ import annotations

import argparse
import importlib
import json
import random
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.kube_requests import (
    PodStream,
    Rotation,
    filter_body,
    informer_order,
    nodes_to_find,
    passing_names,
)
from benchmarks.machine import machine_description

ROOT = Path(__file__).resolve().parents[1]
WARM_PAIRS = 200
_CACHE_LINE_BYTES = 64  # x86-64's


def tree_app(tree: Path, nodes: int, log_level: str) -> tuple[Any, Any]:
    """The names-only `ScorerApp` of `tree` over `nodes` nodes, one in ten above the
    utilization limit (so that filters log their rejections), and its started log writer.
    Call in a process of its own: `tree`'s modules are imported in place of this checkout's."""
    sys.path.insert(0, str(tree))
    # By name: the modules of the tree under test, whose API may differ from this checkout's.
    helpers = importlib.import_module("tests.scorer._http_helpers")
    gpu_node = importlib.import_module("tests.scorer.test_nodestore").gpu_node
    # The log writer's module: `logs` in this tree, `cli` in trees from before it moved.
    try:
        logs = importlib.import_module("exporter_scheduler.logs")
    except ModuleNotFoundError:
        logs = importlib.import_module("exporter_scheduler.cli")
    writer = logs.configure_logging(log_level)
    store = helpers.store_of(
        gpu_node(f"node-{i:05d}", utilization=0.95 if i % 10 == 0 else 0.1) for i in range(nodes)
    )
    app = helpers.make_app(node_store=store)
    app.placements = RecordedProposals()  # as `serve` wires its Pod watch, on by default
    return app, writer


class RecordedProposals:
    """Where `serve`'s Pod watch (`PodCache`) records the node each prioritize proposes for
    its pod: here they are only counted. The scorer's own work for a proposal (the top-scored
    nodes of the reply) is what this measures; counting the pod on its node is the Pod watch's."""

    def __init__(self) -> None:
        self.proposed = 0

    def propose(self, pod: object, nodes: object, now: object) -> None:
        self.proposed += 1

    def forget(self, uid: str) -> None:
        pass


def serve(tree: Path, nodes: int, log_level: str) -> None:
    """The scorer of `tree` on an ephemeral port (printed), until stdin closes; each line read
    is answered with the process's CPU seconds so far."""
    app, writer = tree_app(tree, nodes, log_level)
    http_server = importlib.import_module("exporter_scheduler.edges.server").HttpServer
    server = http_server(app, host="127.0.0.1", port=0).start()
    print(server.port, flush=True)
    for _ in sys.stdin:
        print(time.process_time(), flush=True)
    server.stop()
    writer.stop()


def _cpu_s(proc: subprocess.Popen[str]) -> float:
    """The serving child's CPU seconds so far (`serve` answers each line with them)."""
    assert proc.stdin is not None
    assert proc.stdout is not None
    proc.stdin.write("cpu\n")
    proc.stdin.flush()
    return float(proc.stdout.readline())


def _call(sock: socket.socket, path: bytes, body: bytes) -> bytes:
    sock.sendall(
        b"POST %s HTTP/1.1\r\nHost: scorer\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n" % (path, len(body)) + body
    )
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536)
    head, _, rest = data.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    while len(rest) < length:
        rest += sock.recv(65536)
    return rest


class FreshOrders:
    """`--fresh-lists`: each window rotated by an offset not used for its names yet, drawn at
    random, so that a window's bytes come back only once every rotation of it has been sent."""

    def __init__(self, seed: int) -> None:
        self._rng = random.Random(seed)
        self._left: dict[tuple[str, ...], list[int]] = {}

    def __call__(self, names: list[str]) -> list[str]:
        left = self._left.get(tuple(names))
        if not left:
            left = self._left[tuple(names)] = self._rng.sample(range(len(names)), len(names))
        at = left.pop()
        return names[at:] + names[:at]


def measure_tree(
    tree: Path,
    *,
    nodes: int,
    percentage: int,
    pairs: int,
    log_level: str,
    cool_mib: int = 0,
    fresh_lists: bool = False,
) -> float:
    """Server CPU (us) per filter + prioritize pair of one fresh scorer process of `tree`."""
    cooler = memoryview(bytearray(cool_mib << 20))
    fresh = FreshOrders(seed=nodes) if fresh_lists else None  # the same lists for every tree

    def cool() -> None:
        if cool_mib:
            cooler[::_CACHE_LINE_BYTES].tobytes()  # one byte per cache line, in C

    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "benchmarks.scorer_cpu", "--serve", str(tree)),
            *("--nodes", str(nodes), "--log-level", log_level),
        ],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,  # the log lines are written, then dropped
        text=True,
    )
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline())
        # The store's nodes carry no zone labels: one zone, listed in the informer's order.
        names = informer_order([f"node-{i:05d}" for i in range(nodes)], seed=nodes)
        rotation = Rotation(names, percentage)
        pods = PodStream(seed=nodes)
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

            def pair() -> None:
                the_pod = pods.next()
                cool()
                window = rotation.window()
                window = window if fresh is None else fresh(window)
                reply = _call(sock, b"/filter", filter_body(the_pod, window))
                if not json.loads(reply)["FailedNodes"]:
                    raise SystemExit("no node rejected: the log lines would not be measured")
                cool()  # kube-scheduler's own score plugins run here
                _call(sock, b"/prioritize", filter_body(the_pod, passing_names(reply)))

            for _ in range(WARM_PAIRS):
                pair()
            before_s = _cpu_s(proc)
            for _ in range(pairs):
                pair()
            time.sleep(0.3)  # the log writer's last batch is the requests' CPU too
            used_s = _cpu_s(proc) - before_s
        return used_s / pairs * 1e6
    finally:
        if proc.stdin is not None:
            proc.stdin.close()
        proc.wait(timeout=30)


def run(args: argparse.Namespace) -> dict[str, Any]:
    # Not at the top: the serving child must import the tree under test, this checkout's
    # modules that scorer_latency imports among them, only after putting that tree first.
    from benchmarks.scorer_latency import in_turns  # noqa: PLC0415

    rounds = in_turns(
        args.before,
        args.rounds,
        lambda tree: measure_tree(
            tree,
            nodes=args.nodes,
            percentage=args.percentage,
            pairs=args.pairs,
            log_level=args.log_level,
            cool_mib=args.cool_mib,
            fresh_lists=args.fresh_lists,
        ),
    )
    medians = {label: statistics.median(values) for label, values in rounds.items()}
    result: dict[str, Any] = {
        "machine": machine_description(),
        "config": {
            "nodes": args.nodes,
            "percentage_of_nodes_to_score": args.percentage,
            "window_names": nodes_to_find(args.nodes, args.percentage),
            "pairs": args.pairs,
            "rounds": args.rounds,
            "log_level": args.log_level,
            "cool_mib": args.cool_mib,
            "fresh_lists": args.fresh_lists,
        },
        "cpu_us_per_pair": {
            label: [round(v, 1) for v in values] for label, values in rounds.items()
        },
        "cpu_us_per_pair_median": {label: round(v, 1) for label, v in medians.items()},
    }
    if len(medians) == 2:
        first, now = medians.values()
        result["ratio_to_before"] = round(now / first, 3)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.scorer_cpu", description=__doc__)
    parser.add_argument("--before", metavar="REF", help="also measure this commit's scorer")
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument(
        "--percentage",
        type=int,
        default=0,
        help="kube-scheduler's percentageOfNodesToScore (default 0: its adaptive share)",
    )
    parser.add_argument("--pairs", type=int, default=1500, help="measured pairs per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--log-level", default="info")
    parser.add_argument(
        "--cool-mib",
        type=int,
        default=0,
        help="MiB the client reads before each request, to leave the scorer's caches cold",
    )
    parser.add_argument(
        "--fresh-lists",
        action="store_true",
        help="rotate each window by an offset not used for it yet, so that lists do not come back",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    parser.add_argument("--serve", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve is not None:
        serve(args.serve, args.nodes, args.log_level)
        return 0
    result = run(args)
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"machine: {result['machine']}")
    for label, median in result["cpu_us_per_pair_median"].items():
        values = ", ".join(f"{v:.0f}" for v in result["cpu_us_per_pair"][label])
        print(f"{label:>24}: median {median:.0f} us per pair (rounds: {values})")
    if "ratio_to_before" in result:
        print(f"ratio, this checkout to before: {result['ratio_to_before']:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
