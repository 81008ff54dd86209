"""Scorer latency: the server time kube-scheduler waits for, against a floor, before and after.

Every server runs in its own process (`benchmarks/scorer_child.py`) on loopback, and one client
calls them in turn on keep-alive connections, sample after sample, so that noise on a shared
machine hits all of them alike:

- the scorer built from this checkout, and (`--before REF`) the scorer built from an earlier
  commit of the same repository, fed the same Nodes and the same watch events;
- a do-nothing server that reads each request and answers the scorer's own reply bytes;
- (full-node mode) a floor server: the do-nothing server plus msgspec's typed decode of the body
  into exactly what a verdict reads (each Node's name, annotations and managedFields).

**Server time** is a scorer's round trip minus the do-nothing server's round trip for the same
request in the same sample (the median of those differences): everything the scorer adds to
reading the request and sending the reply, HTTP parsing included. The handler time measured
inside the scorer (decode, verdicts, reply, without HTTP) is reported beside it. The floor's
server time is measured the same way.

Names-only mode runs under churn: before every sample `--churn` Nodes (100 by default) are
rewritten through each scorer's watch-event path (the agents' writes; at fleet scale every
request follows some), and the cost of each event in the node cache is recorded, with one and
with four pod classes active.

    python -m benchmarks.scorer_latency                       # table, this checkout only
    python -m benchmarks.scorer_latency --before main --json  # before/after, one JSON object
    python -m benchmarks.scorer_latency --quick               # smoke run
    python -m benchmarks.scorer_latency --per-gpu --gpus 4    # 8-GPU tables, a 4-GPU pod

Targets: names-only filter server time <= 0.3 ms at 500 names and <= 2 ms at 5000 names after
>= 100 Nodes changed; full-node filter server time <= 1.5 x the floor's at 500 Nodes.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import importlib.util
import json
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import IO, Any, Literal

from benchmarks.machine import machine_description
from gpu_contract.schema import GpuState, Health, NodeGpuState, encode
from kube_standins.nodes import gpu_node, with_agent_write

ROOT = Path(__file__).resolve().parents[1]
CHILD = Path(__file__).resolve().parent / "scorer_child.py"
NOW = datetime(2026, 11, 30, 14, 0, 0, tzinfo=UTC)
PRODUCTS = ("NVIDIA-A100-SXM4-80GB", "NVIDIA-H100-80GB-HBM3", "Tesla-V100-SXM2-32GB")
Mode = Literal["full", "names"]
# (mode, nodes, samples): the scheduler sends ~10 % of a 5000-node cluster's nodes, twice per pod.
PLAN: tuple[tuple[Mode, int, int], ...] = (
    ("names", 500, 60),
    ("names", 5000, 30),
    ("full", 500, 30),
    ("full", 5000, 6),
)
QUICK_PLAN: tuple[tuple[Mode, int, int], ...] = (("names", 500, 8), ("full", 500, 5))
# Pods of four classes (hints, GPU request), for the node cache's upkeep with several active.
CLASS_PODS = (
    {},
    {"gpu-scheduler.example.com/max-utilization": "0.70"},
    {"gpu-scheduler.example.com/gpu-model-preference": "A100,H100"},
    {"gpu-scheduler.example.com/min-gpu-memory-mib": "40000"},
)


GPUS_PER_NODE = 8


def per_gpu_table(i: int, rewrite: int) -> tuple[GpuState, ...]:
    """Node `i`'s 8 GPUs: loads spread from idle to saturated, as training and inference pods
    leave them (so that nodes differ in how many GPUs a multi-GPU pod finds)."""
    return tuple(
        GpuState(
            utilization=((i * 7 + g * 29 + 3 * rewrite) % 101) / 100,
            memory_free_mib=(80 - (i + g * 11 + rewrite) % 80) * 1_000,
            temperature_c=40 + (i + g * 5 + rewrite) % 45,
            allocated=(i + g + rewrite) % 3 == 0,
        )
        for g in range(GPUS_PER_NODE)
    )


def build_node(i: int, *, rewrite: int = 0, per_gpu: bool = False) -> dict[str, Any]:
    """Node `i` (~7 KB, with the agent's annotations and managedFields entry); `rewrite` > 0:
    as after that many later agent writes (other values, newer times). With `per_gpu`, the
    agent's per-GPU keys too, and the node-level values their summaries."""
    moved = timedelta(seconds=rewrite % 4)
    utilization = ((i + 3 * rewrite) % 97) / 100
    gpus = per_gpu_table(i, rewrite) if per_gpu else ()
    if gpus:
        utilization = sum(g.utilization or 0.0 for g in gpus) / len(gpus)
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
        gpu_count=GPUS_PER_NODE,
        gpus=gpus,
    )
    if gpus:
        state = NodeGpuState(
            health=state.health,
            updated_at=state.updated_at,
            utilization=utilization,
            utilization_max=max(g.utilization or 0.0 for g in gpus),
            memory_fragmentation=state.memory_fragmentation,
            memory_free_mib=sum(g.memory_free_mib or 0 for g in gpus),
            memory_largest_free_mib=max(g.memory_free_mib or 0 for g in gpus),
            temperature_c=max(g.temperature_c or 0 for g in gpus),
            gpu_model=state.gpu_model,
            gpu_count=GPUS_PER_NODE,
            gpus=gpus,
        )
    node = gpu_node(f"gpu-node-{i:05d}", product=PRODUCTS[i % len(PRODUCTS)])
    written = NOW - timedelta(seconds=4 + i % 50) + moved
    node = with_agent_write(node, encode(state), written)
    # As kube-scheduler sends Nodes from its informer cache: no TypeMeta.
    node.pop("kind", None)
    node.pop("apiVersion", None)
    return node


def pod(annotations: dict[str, str] | None = None, *, gpus: int = 1) -> dict[str, Any]:
    request = {"nvidia.com/gpu": str(gpus)}
    return {
        "metadata": {"name": "train-0", "namespace": "ml", "annotations": annotations or {}},
        "spec": {"containers": [{"name": "main", "resources": {"requests": request}}]},
    }


def request_body(nodes: list[dict[str, Any]], mode: Mode, the_pod: dict[str, Any]) -> bytes:
    """The body as kube-scheduler sends it (Go's encoding/json: compact, no spaces)."""
    if mode == "full":
        document = {"Pod": the_pod, "Nodes": {"metadata": {}, "items": nodes}, "NodeNames": None}
    else:
        names = [n["metadata"]["name"] for n in nodes]
        document = {"Pod": the_pod, "Nodes": None, "NodeNames": names}
    return json.dumps(document, separators=(",", ":")).encode()


def _event(kind: str, node: dict[str, Any]) -> bytes:
    return json.dumps({"type": kind, "object": node}, separators=(",", ":")).encode()


# ----------------------------------------------------------------------------- processes


@dataclass
class Child:
    name: str
    process: subprocess.Popen[bytes]
    port: int
    conn: http.client.HTTPConnection | None = None

    def command(self, **command: Any) -> Any:
        stdin, stdout = self.process.stdin, self.process.stdout
        assert stdin is not None
        assert stdout is not None
        stdin.write(json.dumps(command).encode() + b"\n")
        stdin.flush()
        return json.loads(stdout.readline())

    def post(self, path: str, body: bytes) -> tuple[int, bytes]:
        if self.conn is None:
            self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=300)
        self.conn.request("POST", path, body=body, headers={"Content-Type": "application/json"})
        response = self.conn.getresponse()
        data = response.read()
        if response.status != 200:
            raise RuntimeError(f"{self.name} {path}: HTTP {response.status}: {data[:200]!r}")
        return response.status, data

    def timed_post(self, path: str, body: bytes) -> float:
        started = time.perf_counter()
        self.post(path, body)
        return time.perf_counter() - started


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _start(name: str, *argv: str) -> Child:
    port = _free_port()
    process = subprocess.Popen(
        [sys.executable, str(CHILD), *argv, "--port", str(port)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    stdout: IO[bytes] | None = process.stdout
    assert stdout is not None
    line = stdout.readline()
    if not line:
        raise RuntimeError(f"{name} did not start")
    return Child(name, process, port)


@contextmanager
def children() -> Iterator[list[Child]]:
    started: list[Child] = []
    try:
        yield started
    finally:
        for child in started:
            if child.conn is not None:
                child.conn.close()
            with contextlib.suppress(OSError, ValueError):  # it may have gone already
                child.command(cmd="quit")
            child.process.terminate()
            child.process.wait(10)


@contextmanager
def source_tree(ref: str | None) -> Iterator[Path | None]:
    """An export of `ref` of this repository in a temporary folder; None without `--before`,
    or when it cannot be had (not a git checkout, the commit absent, or uvicorn, which the
    earlier version served with, not installed)."""
    if ref is None:
        yield None
        return
    folder = Path(tempfile.mkdtemp(prefix="scorer-before-"))
    try:
        try:
            archive = subprocess.run(
                ["git", "-C", str(ROOT), "archive", ref], check=True, capture_output=True
            ).stdout
            subprocess.run(["tar", "-x", "-C", str(folder)], input=archive, check=True)
        except (OSError, subprocess.CalledProcessError) as exc:
            print(f"--before {ref}: cannot export it ({exc}); this checkout only", file=sys.stderr)
            yield None
            return
        # Versions before the scorer's own HTTP server served with uvicorn.
        own_server = (folder / "exporter_scheduler" / "server.py").exists()
        if not own_server and importlib.util.find_spec("uvicorn") is None:
            print(
                f"--before {ref}: uvicorn is not installed; measuring this checkout only",
                file=sys.stderr,
            )
            yield None
            return
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


# ----------------------------------------------------------------------------- measuring


def _ms(seconds: list[float]) -> dict[str, float]:
    ordered = sorted(seconds)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return {"median_ms": statistics.median(ordered) * 1e3, "p99_ms": p99 * 1e3, "n": len(ordered)}


def measure(
    mode: Mode,
    count: int,
    samples: int,
    *,
    trees: dict[str, Path],
    churn: int,
    scratch: Path,
    per_gpu: bool = False,
    gpus: int = 1,
) -> dict[str, Any]:
    nodes = [build_node(i, per_gpu=per_gpu) for i in range(count)]
    nodes_file = scratch / "nodes.jsonl"
    nodes_file.write_bytes(b"\n".join(_event("ADDED", n) for n in nodes))
    rng = random.Random(count)
    rewrites = [0] * count
    churn_events: list[bytes] = []
    for _ in range(samples + 1):
        for i in rng.sample(range(count), min(churn, count)):
            rewrites[i] += 1
            churn_events.append(
                _event("MODIFIED", build_node(i, rewrite=rewrites[i], per_gpu=per_gpu))
            )
    churn_file = scratch / "churn.jsonl"
    churn_file.write_bytes(b"\n".join(churn_events))
    body = request_body(nodes, mode, pod(gpus=gpus))
    row: dict[str, Any] = {
        "mode": mode,
        "nodes": count,
        "body_bytes": len(body),
        "per_gpu": per_gpu,
        "gpus": gpus,
    }
    verbs = ("filter", "prioritize")
    with children() as started:
        scorers: dict[str, Child] = {}
        for label, tree in trees.items():
            argv = ["scorer", "--tree", str(tree), "--mode", mode, "--nodes", str(nodes_file)]
            scorers[label] = _start(label, *argv, "--churn", str(churn_file))
            started.append(scorers[label])
        # The pod classes (names only: so that the node cache keeps their verdicts).
        replies = {verb: scorers["after"].post(f"/{verb}", body)[1] for verb in verbs}
        for label, child in scorers.items():
            for verb in verbs:
                reply = child.post(f"/{verb}", body)[1]
                if label != "after" and mode == "names" and churn == 0:
                    assert reply == replies[verb], f"{label} and after differ"
            child.command(cmd="timings")
        nothing: dict[str, Child] = {}
        floor: Child | None = None
        for verb in verbs:
            reply_file = scratch / f"{verb}.reply"
            reply_file.write_bytes(replies[verb])
            nothing[verb] = _start("nothing", "nothing", "--reply", str(reply_file))
            started.append(nothing[verb])
        if mode == "full":
            floor = _start("floor", "nothing", "--reply", str(scratch / "filter.reply"), "--floor")
            started.append(floor)
        # Warm every connection.
        for child in [*nothing.values(), *([floor] if floor else [])]:
            child.post("/filter", body)

        # Names only, "again": the same filter once more right after, with nothing changed
        # in between (the scorer's caches warm again after the churn's work).
        timed = (*verbs, "again") if mode == "names" else verbs
        differences: dict[str, dict[str, list[float]]] = {
            label: {verb: [] for verb in timed} for label in scorers
        }
        floor_s: list[float] = []
        events_s: dict[str, list[float]] = {label: [] for label in scorers}
        for sample in range(samples):
            # The scorers take turns going first: the one that follows another's churn burst
            # finds the CPU caches cold (see docs/scorer.md), so a fixed order would favour one.
            turn = list(scorers.items())
            if sample % 2:
                turn.reverse()
            if mode == "names":
                for label, child in turn:
                    events_s[label] += child.command(cmd="apply", start=sample * churn, count=churn)
            for verb in timed:
                path = "/filter" if verb == "again" else f"/{verb}"
                base = nothing["filter" if verb == "again" else verb].timed_post(path, body)
                for label, child in turn:
                    differences[label][verb].append(child.timed_post(path, body) - base)
                if floor is not None and verb == "filter":
                    floor_s.append(floor.timed_post("/filter", body) - base)
        for label, child in scorers.items():
            handler = child.command(cmd="timings")
            # Recorded in call order: filter, prioritize, (again,) filter, ...
            for index, verb in enumerate(timed):
                row[f"{label}_{verb}"] = _ms(differences[label][verb])
                row[f"{label}_{verb}_handler"] = _ms(handler[index :: len(timed)])
            if mode == "names":
                row[f"{label}_event_us"] = statistics.median(events_s[label]) * 1e6
        if floor is not None:
            row["floor"] = _ms(floor_s)
            for label in scorers:
                row[f"{label}_filter_over_floor"] = (
                    row[f"{label}_filter"]["median_ms"] / row["floor"]["median_ms"]
                )
        if mode == "names":
            row["churn_nodes"] = churn
            row["classes_event_us"] = _upkeep_with_classes(
                scorers, nodes, samples * churn, count, churn, gpus
            )
    return row


def _upkeep_with_classes(  # noqa: PLR0917
    scorers: dict[str, Child],
    nodes: list[dict[str, Any]],
    start: int,
    count: int,
    churn: int,
    gpus: int,
) -> dict[str, float]:
    """The node cache's cost per watch event with four pod classes active (each kept)."""
    result = {}
    for label, child in scorers.items():
        for hints in CLASS_PODS[1:]:
            child.post("/filter", request_body(nodes, "names", pod(hints, gpus=gpus)))
        spent = child.command(cmd="apply", start=start, count=churn)
        result[label] = statistics.median(spent) * 1e6
    return result


def targets(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    checks = []
    for row in rows:
        if row["mode"] == "names" and row["nodes"] in (500, 5000):
            limit = 0.3 if row["nodes"] == 500 else 2.0
            value = row["after_filter"]["median_ms"]
            checks.append(
                {
                    "target": (
                        f"names-only filter server time <= {limit} ms at {row['nodes']} names "
                        f"after {row['churn_nodes']} nodes changed"
                    ),
                    "value": round(value, 3),
                    "limit": limit,
                    "met": value <= limit,
                }
            )
        if row["mode"] == "full" and row["nodes"] == 500:
            value = row["after_filter_over_floor"]
            checks.append(
                {
                    "target": "full-node filter server time <= 1.5 x floor at 500 nodes",
                    "value": round(value, 2),
                    "limit": 1.5,
                    "met": value <= 1.5,
                }
            )
    return checks


def print_table(result: dict[str, Any]) -> None:
    print(f"machine: {result['machine']}")
    labels = result["trees"]
    header = f"{'mode':<6}{'nodes':>6}{'verb':>11}" + "".join(
        f"{label + ' server':>15}{label + ' handler':>16}" for label in labels
    )
    print(header)
    print("-" * len(header))
    for r in result["rows"]:
        for verb in ("filter", "prioritize", "again"):
            if f"{labels[0]}_{verb}" not in r:
                continue
            cells = "".join(
                f"{r[f'{label}_{verb}']['median_ms']:>15.3f}"
                f"{r[f'{label}_{verb}_handler']['median_ms']:>16.3f}"
                for label in labels
            )
            print(f"{r['mode']:<6}{r['nodes']:>6}{verb:>11}{cells}")
        if "floor" in r:
            ratios = ", ".join(
                f"{label} {r[f'{label}_filter_over_floor']:.2f} x" for label in labels
            )
            print(f"{'':<6}{'':>6}{'floor':>11}{r['floor']['median_ms']:>15.3f}   ({ratios})")
        if "churn_nodes" in r:
            events = ", ".join(
                f"{label} {r[f'{label}_event_us']:.0f} us (4 classes: "
                f"{r['classes_event_us'][label]:.0f} us)"
                for label in labels
            )
            print(f"{'':<12}per watch event: {events}")
    print("(ms, medians; server = round trip minus the do-nothing server's; handler = inside)")
    for check in result["targets"]:
        print(f"{'met' if check['met'] else 'MISSED':>6}: {check['target']} ({check['value']})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, few samples")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--before", metavar="REF", help="also measure this commit's scorer")
    parser.add_argument("--churn", type=int, default=100, help="nodes rewritten per sample")
    parser.add_argument("--only", help="mode:nodes[,mode:nodes...] of the plan, e.g. names:500")
    parser.add_argument(
        "--per-gpu", action="store_true", help="Nodes carry the agent's per-GPU keys (8 GPUs)"
    )
    parser.add_argument("--gpus", type=int, default=1, help="the pod's GPU request (default 1)")
    args = parser.parse_args(argv)
    plan = QUICK_PLAN if args.quick else PLAN
    if args.only:
        wanted = set(args.only.split(","))
        plan = tuple(p for p in plan if f"{p[0]}:{p[1]}" in wanted)
    rows = []
    with source_tree(args.before) as before, tempfile.TemporaryDirectory() as scratch:
        trees = {"after": ROOT} | ({} if before is None else {"before": before})
        for mode, count, samples in plan:
            row = measure(
                mode,
                count,
                samples,
                trees=trees,
                churn=args.churn,
                scratch=Path(scratch),
                per_gpu=args.per_gpu,
                gpus=args.gpus,
            )
            rows.append(row)
            print(f"measured {mode} {count}", file=sys.stderr)
    result = {
        "benchmark": "scorer_latency",
        "machine": machine_description(),
        "when": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "before": args.before,
        "trees": list(trees),
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
