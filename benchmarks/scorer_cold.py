"""The request path hot and cold: the same pods in process, back to back and with idle gaps.

Served, the scorer's filter takes about three times what it takes in an in-process loop; this
measures how much of that is the pause between requests itself. kube-scheduler calls once per
pod, a few milliseconds apart, and in between the core runs other processes (and, on a
virtual machine, other guests), so each call starts with cold caches. One process per tree
builds a names-only store of `--nodes` nodes (one in ten above the utilization limit, so that
filters log their rejections, at INFO as `serve` writes them) and sends, through
`ScorerApp.respond` with no HTTP, what kube-scheduler sends (`benchmarks.kube_requests`): per
pod a fresh Pod, a filter of the next window of its rotation, then the prioritize of the names
that passed. Between pods it sleeps `gap` (0: back to back). Per stage it records the wall time:
the filter's answer, the work after its reply (`Response.finish`: the prepared prioritize, the
counters, the log records), the prioritize's answer, and the work after it. The table gives
the medians over `--pairs` pods per gap, the median over `--rounds` rounds, trees alternating.

    python -m benchmarks.scorer_cold                       # this checkout, gaps 0, 1 and 3 ms
    python -m benchmarks.scorer_cold --before HEAD --json  # side by side with a commit
"""

from __future__ import annotations

import argparse
import json
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
from benchmarks.scorer_cpu import tree_app

ROOT = Path(__file__).resolve().parents[1]
STAGES = ("filter", "filter_after", "prioritize", "prioritize_after")
WARM_PAIRS = 300


def measure(tree: Path, nodes: int, gaps_ms: list[float], pairs: int) -> dict[str, Any]:
    """Per gap, each stage's median wall time (us) in this process, with `tree` imported."""
    app, writer = tree_app(tree, nodes, "info")
    rotation = Rotation(informer_order([f"node-{i:05d}" for i in range(nodes)], nodes), 0)
    pods = PodStream(seed=nodes)

    def pair(the_pod: dict[str, Any], body: bytes) -> tuple[float, ...]:
        started = time.perf_counter()
        filtered = app.respond("POST", "/filter", b"", body)
        answered = time.perf_counter()
        filtered.finish()
        finished = time.perf_counter()
        following = filter_body(the_pod, passing_names(filtered.body))
        begun = time.perf_counter()
        prioritized = app.respond("POST", "/prioritize", b"", following)
        done = time.perf_counter()
        prioritized.finish()
        return (answered - started, finished - answered, done - begun, time.perf_counter() - done)

    def requests(count: int) -> list[tuple[dict[str, Any], bytes]]:
        made = []
        for _ in range(count):
            the_pod = pods.next()
            made.append((the_pod, filter_body(the_pod, rotation.window())))
        return made

    for the_pod, body in requests(WARM_PAIRS):
        pair(the_pod, body)
    result: dict[str, Any] = {}
    for gap_ms in gaps_ms:
        samples = []
        for the_pod, body in requests(pairs):  # made before: not in the gap's pause
            samples.append(pair(the_pod, body))
            if gap_ms:
                time.sleep(gap_ms / 1000)
        result[str(gap_ms)] = {
            stage: round(statistics.median(s[i] for s in samples) * 1e6, 1)
            for i, stage in enumerate(STAGES)
        }
    writer.stop()
    return result


def measure_tree(tree: Path, args: argparse.Namespace) -> dict[str, Any]:
    """`measure` in a fresh process: each tree's modules, caches and allocator its own."""
    gaps = ",".join(str(g) for g in args.gaps_ms)
    argv = [sys.executable, "-m", "benchmarks.scorer_cold", "--measure", str(tree)]
    argv += ["--nodes", str(args.nodes), "--pairs", str(args.pairs), "--gaps-ms", gaps]
    out = subprocess.run(
        argv, cwd=ROOT, check=True, capture_output=True, text=True, timeout=1800
    ).stdout
    document: dict[str, Any] = json.loads(out.splitlines()[-1])
    return document


def run(args: argparse.Namespace) -> dict[str, Any]:
    # Not at the top: scorer_latency imports this checkout's scorer modules.
    from benchmarks.scorer_latency import in_turns  # noqa: PLC0415

    rounds = in_turns(args.before, args.rounds, lambda tree: measure_tree(tree, args))
    medians = {
        label: {
            str(gap): {
                stage: statistics.median(r[str(gap)][stage] for r in runs) for stage in STAGES
            }
            for gap in args.gaps_ms
        }
        for label, runs in rounds.items()
    }
    return {
        "machine": machine_description(),
        "config": {
            "nodes": args.nodes,
            "window_names": nodes_to_find(args.nodes),
            "pairs": args.pairs,
            "rounds": args.rounds,
            "gaps_ms": args.gaps_ms,
        },
        "us_median": medians,
        "rounds": rounds,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.scorer_cold", description=__doc__)
    parser.add_argument("--before", metavar="REF", help="also measure this commit's scorer")
    parser.add_argument("--nodes", type=int, default=300)
    parser.add_argument("--pairs", type=int, default=1000, help="pods per gap and round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--gaps-ms",
        type=lambda text: [float(g) for g in text.split(",")],
        default=[0.0, 1.0, 3.0],
        help="pauses between pods, comma-separated (default 0,1,3)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    parser.add_argument("--measure", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.measure is not None:
        print(json.dumps(measure(args.measure, args.nodes, args.gaps_ms, args.pairs)))
        return 0
    result = run(args)
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"machine: {result['machine']}")
    print(f"{result['config']['nodes']} nodes, {result['config']['window_names']}-name windows")
    print(f"{'tree':>24} {'gap ms':>7} " + " ".join(f"{s:>17}" for s in STAGES))
    for label, by_gap in result["us_median"].items():
        for gap, stages in by_gap.items():
            cells = " ".join(f"{stages[s]:>14.1f} us" for s in STAGES)
            print(f"{label:>24} {float(gap):>7.1f} {cells}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
