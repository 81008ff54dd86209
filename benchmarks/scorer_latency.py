"""Scorer latency: what the scheduler waits for on every pod, against two references.

For 100, 500, 1000 and 5000 realistic Nodes (`gpu_sim.nodes`, ~6-7 KB of JSON each, with the
agent's annotations and managedFields entry), in both modes:

- server time: the whole handler in-process (`ScorerApp.handle`: decode, evaluate, encode), for
  `filter` and `prioritize`. Names-only rows give four figures side by side: a repeat request
  (the same pod inputs and node list while the node data is unchanged: the reply cache answers,
  "hit"); a request after churn ("churn": `--churn` of the nodes, 2 % by default, rewritten by
  their agents since the last request, so the reply cache misses and the verdict memo judges
  only the rewritten nodes), the same with the verdict memo off ("no memo": every node judged,
  as before the memo existed), and a first request ("cold": reply cache and memo emptied);
- round trip: the same request over loopback HTTP to a real uvicorn server, on one keep-alive
  `http.client` connection, until the last reply byte is read;
- floor: `msgspec.json.decode(body)` of the same body, untyped (every value becomes a Python
  object): what merely reading the request costs without a schema;
- naive: the kubernetes client's model deserialization of the same NodeList into `V1Node`
  objects (`ApiClient.deserialize`), the obvious way to read Nodes in Python.

Each sample of a row is taken back to back with the floor's, so that noise on a shared machine
hits both; medians and p99 are reported with their ratios.

    python -m benchmarks.scorer_latency            # table
    python -m benchmarks.scorer_latency --quick    # smoke run: small sizes, few samples
    python -m benchmarks.scorer_latency --json     # one JSON object (for benchmarks.figures)
    python -m benchmarks.scorer_latency --sizes 5000 --modes names   # one row

Targets: full-node server time <= 1.5 x floor at 500 and 5000 nodes; names-only server time
<= 0.3 ms at 5000 nodes (a repeat request; the churn and first request's times are reported
beside it: at fleet scale most requests follow some writes);
round trip at 500 full nodes <= 3.3 ms (300 pods/s). The round trip repeats one request, so in
names-only mode it is a reply-cache hit.
"""

from __future__ import annotations

import argparse
import gc
import http.client
import json
import multiprocessing
import random
import socket
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

import msgspec

from benchmarks.machine import machine_description
from exporter_scheduler.nodecache import NodeCache
from exporter_scheduler.policy import Policy
from exporter_scheduler.server import RunningServer, ScorerApp, uvicorn_config
from gpu_contract.schema import Health, NodeGpuState, encode
from gpu_sim.nodes import gpu_node, with_agent_write

NOW = datetime(2026, 11, 30, 14, 0, 0, tzinfo=UTC)
SIZES = (100, 500, 1000, 5000)
QUICK_SIZES = (100, 500)
PRODUCTS = ("NVIDIA-A100-SXM4-80GB", "NVIDIA-H100-80GB-HBM3", "Tesla-V100-SXM2-32GB")
Mode = Literal["full", "names"]


def build_nodes(count: int) -> list[dict[str, Any]]:
    """Nodes with fresh agent data: utilization spread over 0..0.96 so some fail the filter."""
    return [build_node(i) for i in range(count)]


def build_node(i: int, *, rewrite: int = 0) -> dict[str, Any]:
    """Node `i`; `rewrite` > 0: as after that many later agent writes (other values, newer)."""
    moved = timedelta(seconds=rewrite % 4)
    utilization = ((i + 3 * rewrite) % 97) / 100
    state = NodeGpuState(
        health=Health.OK,
        updated_at=NOW - timedelta(seconds=5 + i % 50) + moved,
        utilization=utilization,
        utilization_max=min(1.0, utilization + 0.05),
        memory_fragmentation=(i % 10) / 20,
        memory_free_mib=320_000,
        memory_largest_free_mib=40_000 + (i % 5) * 5_000,
        temperature_c=40 + i % 45,
        gpu_model=PRODUCTS[i % len(PRODUCTS)],
        gpu_count=8,
    )
    node = gpu_node(f"gpu-node-{i:05d}", product=PRODUCTS[i % len(PRODUCTS)])
    written = NOW - timedelta(seconds=4 + i % 50) + moved
    return with_agent_write(node, encode(state), written)


POD = {
    "metadata": {"name": "train-0", "namespace": "ml", "annotations": {}},
    "spec": {"containers": [{"name": "main", "resources": {"requests": {"nvidia.com/gpu": "1"}}}]},
}


def request_body(nodes: list[dict[str, Any]], mode: Mode) -> bytes:
    """The body as kube-scheduler sends it (Go's encoding/json: compact, no spaces)."""
    if mode == "full":
        document = {"Pod": POD, "Nodes": {"metadata": {}, "items": nodes}, "NodeNames": None}
    else:
        names = [n["metadata"]["name"] for n in nodes]
        document = {"Pod": POD, "Nodes": None, "NodeNames": names}
    return json.dumps(document, separators=(",", ":")).encode()


def filled_cache(nodes: list[dict[str, Any]]) -> NodeCache:
    """A node cache holding `nodes`, fed through its watch-event path (no API server needed)."""
    cache = NodeCache()
    for node in nodes:
        cache._apply(json.dumps({"type": "ADDED", "object": node}).encode())
    cache._ready.set()
    return cache


class _Body:
    """What `ApiClient.deserialize` expects: a response with `.data`."""

    def __init__(self, data: bytes) -> None:
        self.data = data


def naive_decoder() -> Callable[[bytes], object]:
    from kubernetes import client  # type: ignore[import-untyped]  # noqa: PLC0415

    api = client.ApiClient()

    def decode(node_list: bytes) -> object:
        return api.deserialize(_Body(node_list), "V1NodeList")

    return decode


def _ms(samples_ns: list[int]) -> dict[str, float]:
    ordered = sorted(samples_ns)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return {
        "median_ms": statistics.median(ordered) / 1e6,
        "p99_ms": p99 / 1e6,
        "samples": len(ordered),
    }


def _timed(fn: Callable[[], object]) -> int:
    start = time.perf_counter_ns()
    fn()
    return time.perf_counter_ns() - start


def _timed_handle(app: ScorerApp, verb: Literal["filter", "prioritize"], body: bytes) -> int:
    start = time.perf_counter_ns()
    app.handle(verb, body)
    return time.perf_counter_ns() - start


@dataclass(frozen=True, slots=True)
class Plan:
    samples: int
    naive_samples: int
    http_samples: int


def plan_for(count: int, *, quick: bool) -> Plan:
    if quick:
        return Plan(samples=5, naive_samples=1, http_samples=5)
    if count <= 100:
        return Plan(200, 10, 200)
    if count <= 500:
        return Plan(60, 5, 60)
    if count <= 1000:
        return Plan(30, 3, 30)
    return Plan(12, 2, 12)


def post(conn: http.client.HTTPConnection, path: str, body: bytes) -> bytes:
    conn.request("POST", path, body=body, headers={"Content-Type": "application/json"})
    response = conn.getresponse()
    data = response.read()
    if response.status != 200:
        raise RuntimeError(f"{path}: HTTP {response.status}: {data[:200]!r}")
    return data


def measure(
    count: int, nodes: list[dict[str, Any]], mode: Mode, plan: Plan, *, churn: float = 0.02
) -> dict[str, Any]:
    body = request_body(nodes, mode)
    cache = filled_cache(nodes) if mode == "names" else None
    app = ScorerApp(policy=Policy(), clock=lambda: NOW, node_source=cache)
    # The same node cache without the verdict memo: every miss judges every node.
    no_memo = ScorerApp(
        policy=Policy(), clock=lambda: NOW, node_source=cache, verdict_memo_pod_keys=0
    )
    row: dict[str, Any] = {"mode": mode, "nodes": count, "body_bytes": len(body)}
    churned = max(1, round(churn * count))
    rng = random.Random(count)
    rewrites = [0] * count

    # Warm up (the decode memo of the scoring core, allocator, code paths).
    for verb in ("filter", "prioritize"):
        assert app.handle(verb, body).status == 200
        assert no_memo.handle(verb, body).status == 200

    floor_ns: list[int] = []
    floor_no_gc_ns: list[int] = []
    filter_ns: list[int] = []
    prioritize_ns: list[int] = []
    filter_miss_ns: list[int] = []
    prioritize_miss_ns: list[int] = []
    churn_ns: dict[tuple[str, bool], list[int]] = {}
    reply_cache = app.reply_cache if mode == "names" else None
    memo = app.verdict_memo

    def miss(verb: Literal["filter", "prioritize"]) -> int:
        assert reply_cache is not None
        assert memo is not None
        reply_cache.clear()  # a first request: nothing to reuse
        memo.clear()
        return _timed(lambda: app.handle(verb, body))

    def rewrite_some() -> None:
        """`churned` agents write new values (through the cache's watch-event path)."""
        assert cache is not None
        for i in rng.sample(range(count), churned):
            rewrites[i] += 1
            node = build_node(i, rewrite=rewrites[i])
            cache._apply(json.dumps({"type": "MODIFIED", "object": node}).encode())

    def after_churn(verb: Literal["filter", "prioritize"]) -> None:
        rewrite_some()  # then both apps answer about the same data (each its first time)
        for with_memo, the_app in ((True, app), (False, no_memo)):
            churn_ns.setdefault((verb, with_memo), []).append(_timed_handle(the_app, verb, body))

    for _ in range(plan.samples):
        floor_ns.append(_timed(lambda: msgspec.json.decode(body)))
        # The untyped decode allocates enough containers to trigger the cyclic GC, which is
        # part of its real cost; the GC-off figure shows the decode alone.
        gc.disable()
        try:
            floor_no_gc_ns.append(_timed(lambda: msgspec.json.decode(body)))
        finally:
            gc.enable()
        if reply_cache is not None:
            filter_miss_ns.append(miss("filter"))
            prioritize_miss_ns.append(miss("prioritize"))
            after_churn("filter")
            after_churn("prioritize")
            app.handle("filter", body)  # refill: the timed calls below are repeat requests
            app.handle("prioritize", body)
        filter_ns.append(_timed(lambda: app.handle("filter", body)))
        prioritize_ns.append(_timed(lambda: app.handle("prioritize", body)))
    row["floor"] = _ms(floor_ns)
    if reply_cache is not None:
        row["filter_miss"] = _ms(filter_miss_ns)
        row["prioritize_miss"] = _ms(prioritize_miss_ns)
        row["churn_nodes"] = churned
        row["filter_churn"] = _ms(churn_ns["filter", True])
        row["prioritize_churn"] = _ms(churn_ns["prioritize", True])
        row["filter_churn_no_memo"] = _ms(churn_ns["filter", False])
        row["prioritize_churn_no_memo"] = _ms(churn_ns["prioritize", False])
        row["churn_memo_speedup"] = (
            row["filter_churn_no_memo"]["median_ms"] / row["filter_churn"]["median_ms"]
        )
    row["floor_gc_off"] = _ms(floor_no_gc_ns)
    row["filter"] = _ms(filter_ns)
    row["prioritize"] = _ms(prioritize_ns)
    row["filter_over_floor"] = row["filter"]["median_ms"] / row["floor"]["median_ms"]
    row["filter_over_floor_gc_off"] = row["filter"]["median_ms"] / row["floor_gc_off"]["median_ms"]
    row["reply_bytes"] = len(app.handle("filter", body).body)

    if mode == "full":
        node_list = json.dumps({"metadata": {}, "items": nodes}, separators=(",", ":")).encode()
        decode = naive_decoder()
        naive_ns = [_timed(lambda: decode(node_list)) for _ in range(plan.naive_samples)]
        row["naive"] = _ms(naive_ns)
        row["naive_over_filter"] = row["naive"]["median_ms"] / row["filter"]["median_ms"]

    # The server runs in its own process, as in production: a client thread in the same
    # process would contend with it for the GIL and inflate the round trip.
    port = _free_port()
    child = multiprocessing.get_context("spawn").Process(
        target=_serve_child, args=(count, mode, port), daemon=True
    )
    child.start()
    try:
        conn = _connect_when_up(port)
        post(conn, "/filter", body)  # the connection is open and warm from here on
        rtt_ns = [_timed(lambda: post(conn, "/filter", body)) for _ in range(plan.http_samples)]
        conn.close()
    finally:
        child.terminate()
        child.join(10)
    row["round_trip"] = _ms(rtt_ns)
    return row


def _serve_child(count: int, mode: Mode, port: int) -> None:
    """A fresh interpreter serving the same app (spawned: a forked copy of the benchmark's
    heap would pay copy-on-write faults inside the measured requests)."""
    cache = filled_cache(build_nodes(count)) if mode == "names" else None
    app = ScorerApp(policy=Policy(), clock=lambda: NOW, node_source=cache)
    RunningServer(uvicorn_config(app, host="127.0.0.1", port=port, log_level="warning")).start()
    threading.Event().wait()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _connect_when_up(port: int) -> http.client.HTTPConnection:
    deadline = time.monotonic() + 30
    while True:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        try:
            conn.request("GET", "/healthz")
            conn.getresponse().read()
            return conn
        except OSError:
            conn.close()
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def targets(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    def row(mode: str, count: int) -> dict[str, Any] | None:
        return next((r for r in rows if r["mode"] == mode and r["nodes"] == count), None)

    checks = []
    for count in (500, 5000):
        r = row("full", count)
        if r is not None:
            checks.append(
                {
                    "target": f"full-node server time <= 1.5 x floor at {count} nodes",
                    "value": round(r["filter_over_floor"], 3),
                    "limit": 1.5,
                    "met": r["filter_over_floor"] <= 1.5,
                }
            )
    r = row("names", 5000)
    if r is not None:
        checks.append(
            {
                "target": "names-only server time <= 0.3 ms at 5000 nodes (repeat request)",
                "value": round(r["filter"]["median_ms"], 3),
                "limit": 0.3,
                "met": r["filter"]["median_ms"] <= 0.3,
            }
        )
        checks.append(
            {
                "target": "names-only server time <= 0.3 ms at 5000 nodes (first request)",
                "value": round(r["filter_miss"]["median_ms"], 3),
                "limit": 0.3,
                "met": r["filter_miss"]["median_ms"] <= 0.3,
            }
        )
        checks.append(
            {
                "target": (
                    "names-only server time <= 0.3 ms at 5000 nodes "
                    f"(after {r['churn_nodes']} nodes rewritten)"
                ),
                "value": round(r["filter_churn"]["median_ms"], 3),
                "limit": 0.3,
                "met": r["filter_churn"]["median_ms"] <= 0.3,
            }
        )
    r = row("full", 500)
    if r is not None:
        checks.append(
            {
                "target": "round trip at 500 full nodes <= 3.3 ms",
                "value": round(r["round_trip"]["median_ms"], 3),
                "limit": 3.3,
                "met": r["round_trip"]["median_ms"] <= 3.3,
            }
        )
    return checks


def print_table(result: dict[str, Any]) -> None:
    print(f"machine: {result['machine']}")
    print(f"samples: {result['samples_note']}")
    header = (
        f"{'mode':<6}{'nodes':>6}{'body MB':>9}{'floor':>9}{'no-gc':>9}{'filter':>9}{'p99':>9}"
        f"{'x floor':>9}{'prio':>9}{'miss':>9}{'p99':>9}{'prio ms':>9}"
        f"{'naive':>10}{'naive x':>9}{'HTTP rt':>9}{'p99':>9}"
    )
    print(header)
    print("-" * len(header))
    nan = float("nan")
    for r in result["rows"]:
        naive = r.get("naive")
        miss = r.get("filter_miss", {})
        prio_miss = r.get("prioritize_miss", {})
        print(
            f"{r['mode']:<6}{r['nodes']:>6}{r['body_bytes'] / 1e6:>9.2f}"
            f"{r['floor']['median_ms']:>9.2f}{r['floor_gc_off']['median_ms']:>9.2f}"
            f"{r['filter']['median_ms']:>9.2f}"
            f"{r['filter']['p99_ms']:>9.2f}{r['filter_over_floor']:>9.2f}"
            f"{r['prioritize']['median_ms']:>9.2f}"
            f"{miss.get('median_ms', nan):>9.2f}{miss.get('p99_ms', nan):>9.2f}"
            f"{prio_miss.get('median_ms', nan):>9.2f}"
            f"{(naive['median_ms'] if naive else float('nan')):>10.1f}"
            f"{r.get('naive_over_filter', float('nan')):>9.1f}"
            f"{r['round_trip']['median_ms']:>9.2f}{r['round_trip']['p99_ms']:>9.2f}"
        )
    print(
        "(ms, medians unless p99; floor = untyped msgspec decode, no-gc = the same with the "
        "cyclic GC off; 'x floor' = filter / floor; 'naive x' = naive / filter; names rows: "
        "filter/prio = repeat request (reply cache hit), miss/prio miss = first request)"
    )
    names_rows = [r for r in result["rows"] if "filter_churn" in r]
    if names_rows:
        print()
        header = (
            f"{'nodes':>6}{'churned':>9}{'filter':>9}{'p99':>9}{'no memo':>9}{'p99':>9}"
            f"{'speedup':>9}{'prio':>9}{'p99':>9}{'no memo':>9}{'p99':>9}"
        )
        print(header)
        print("-" * len(header))
        for r in names_rows:
            cells = [
                r["filter_churn"],
                r["filter_churn_no_memo"],
                r["prioritize_churn"],
                r["prioritize_churn_no_memo"],
            ]
            f, fn, p, pn = ((c["median_ms"], c["p99_ms"]) for c in cells)
            print(
                f"{r['nodes']:>6}{r['churn_nodes']:>9}{f[0]:>9.2f}{f[1]:>9.2f}{fn[0]:>9.2f}"
                f"{fn[1]:>9.2f}{r['churn_memo_speedup']:>9.1f}{p[0]:>9.2f}{p[1]:>9.2f}"
                f"{pn[0]:>9.2f}{pn[1]:>9.2f}"
            )
        print(
            "(names only, ms: a request after `churned` nodes were rewritten (the reply cache "
            "misses), with the verdict memo and without it; speedup = filter no memo / filter)"
        )
    for check in result["targets"]:
        verdict = "met" if check["met"] else "MISSED"
        print(f"{verdict:>6}: {check['target']} (measured {check['value']})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, few samples")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument(
        "--sizes", help="comma-separated node counts (default 100,500,1000,5000; quick 100,500)"
    )
    parser.add_argument(
        "--modes", default="full,names", help="comma-separated modes (default full,names)"
    )
    parser.add_argument(
        "--churn",
        type=float,
        default=0.02,
        help="names only: the share of nodes rewritten before each churn sample (default 0.02)",
    )
    args = parser.parse_args(argv)
    all_modes: tuple[Mode, ...] = ("full", "names")
    modes = tuple(m for m in all_modes if m in args.modes.split(","))
    if args.sizes:
        sizes = tuple(int(s) for s in args.sizes.split(","))
    else:
        sizes = QUICK_SIZES if args.quick else SIZES
    all_nodes = build_nodes(max(sizes))
    rows = []
    gc.collect()
    for count in sizes:
        for mode in modes:
            plan = plan_for(count, quick=args.quick)
            rows.append(measure(count, all_nodes[:count], mode, plan, churn=args.churn))
    result = {
        "benchmark": "scorer_latency",
        "machine": machine_description(),
        "when": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "samples_note": "per size: "
        + ", ".join(f"{c}: {plan_for(c, quick=args.quick).samples}" for c in sizes),
        "rows": rows,
        "targets": targets(rows),
    }
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print_table(result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
