"""Does the benchmarks' model of kube-scheduler's requests match what a real one sends?

    python -m benchmarks.window_check [--nodes 5000] [--pods 200] [--json]

`scorer_latency` and `scorer_cpu` send the requests of `benchmarks.kube_requests`: per pod, the
next window of kube-scheduler's rotation over its node list. A model is only as good as its check,
so this runs the real-scheduler benchmark's setup (`benchmarks.real_scheduler`: the loopback
control plane, N GPU Nodes in three zones, the fleet's annotation patches) with the Python null
extender recording every request, lets a real kube-scheduler place a burst of 1-GPU pods, and
compares each filter call's NodeNames with the model's window for that pod (`compare` says
what can be compared), and whether each prioritize call names what the filter before it passed
(the null extender passes every node).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from benchmarks.kube_requests import nodes_to_find, zone_key
from benchmarks.machine import machine_description
from benchmarks.real_scheduler import Config, bench, measure, node_plan
from kube_standins.nodes import gpu_node

MODE = "null-py-names"


def zones_of(nodes: int) -> dict[str, str]:
    """Each node of the benchmark's fleet and its zone key."""
    zones = {}
    for i in range(nodes):
        name, model, gpus = node_plan(i)
        zones[name] = zone_key(gpu_node(name, gpu_count=gpus, product=model))
    return zones


def interval_overlap(first: int, second: int, size: int, total: int) -> int:
    """How many positions two windows of `size` starting at `first` and `second` share, on a
    ring of `total`."""
    a = {(first + i) % total for i in range(size)}
    return sum((second + i) % total in a for i in range(size))


def compare(zones: Mapping[str, str], recorded: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The recorded calls against the model, in call order.

    The node order itself is random per scheduler start (the informer's first sync), so it is
    not compared name by name; what the model says of it is: every window has the model's size;
    while every zone still has nodes at those positions, as many nodes of each zone (the zones
    taken in turn); and window j shares with window i the names the model's intervals share (the
    start moving on by one window per pod, around the list). The parallel filter can swap a chunk
    of the list (chunks of sqrt(nodes), at most nodes / 16 + 1) between neighbouring windows,
    which the model leaves out: the overlaps are counted exact and within one chunk.
    """
    total = len(zones)
    size = nodes_to_find(total)
    chunk = max(1, min(math.isqrt(total), total // 16 + 1))
    filters = [r["names"] for r in recorded if r["verb"] == "filter"]
    prioritizes = [r["names"] for r in recorded if r["verb"] == "prioritize"]
    per_zone_total = Counter(zones.values())
    # Positions below this hold every zone in turn; past it the smallest zone has run out.
    all_zones_until = len(per_zone_total) * min(per_zone_total.values())
    sizes = [len(f) for f in filters]
    balanced = balanced_near = balanced_checked = 0
    for index, names in enumerate(filters):
        start = index * size % total
        if start + size > all_zones_until:
            continue
        balanced_checked += 1
        per_zone = Counter(zones[name] for name in names)
        spread = max(per_zone.values()) - min(per_zone.values())
        every_zone = len(per_zone) == len(per_zone_total)
        balanced += every_zone and spread <= 1
        balanced_near += every_zone and spread <= chunk
    exact = near = checked = 0
    sets = [set(f) for f in filters]
    for i in range(len(sets)):
        for j in range(i + 1, min(len(sets), i + 4)):
            checked += 1
            off = abs(len(sets[i] & sets[j]) - interval_overlap(i * size, j * size, size, total))
            exact += off == 0
            near += off <= chunk
    # kube-scheduler calls prioritize with what the filter passed: all of it, here.
    prioritize_ok = sum(
        set(p) == set(f) for f, p in zip(filters, prioritizes, strict=False) if len(f) > 1
    )
    return {
        "filters": len(filters),
        "prioritizes": len(prioritizes),
        "window_model": size,
        "window_sizes": {
            "median": statistics.median(sizes) if sizes else None,
            "min": min(sizes, default=None),
            "max": max(sizes, default=None),
        },
        "windows_with_zones_in_turn": f"{balanced} of {balanced_checked}",
        "windows_with_zones_in_turn_within_a_chunk": f"{balanced_near} of {balanced_checked}",
        "window_overlaps_exact": f"{exact} of {checked}",
        "window_overlaps_within_a_chunk": f"{near} of {checked} (chunk {chunk})",
        "prioritize_names_what_filter_passed": prioritize_ok,
        "names_in_name_order": sum(f == sorted(f) for f in filters),
    }


def run(nodes: int, pods: int) -> dict[str, Any]:
    config = Config(nodes=nodes, pods=pods, rounds=1, modes=(MODE,))
    with tempfile.TemporaryDirectory(prefix="window-check-") as scratch:
        record = Path(scratch) / "requests.jsonl"
        with bench(config, progress=lambda line: print(line, file=sys.stderr), record=record) as b:
            measured = measure(b.plane, MODE, 0, config, b.made)
        recorded = [json.loads(line) for line in record.read_text().splitlines() if line]
    return {
        "benchmark": "window_check",
        "machine": machine_description(),
        "nodes": nodes,
        "pods": pods,
        "pods_per_s": measured.pods_per_s,
        **compare(zones_of(nodes), recorded),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.window_check", description=__doc__)
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--pods", type=int, default=200)
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    args = parser.parse_args(argv)
    result = run(args.nodes, args.pods)
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    for key, value in result.items():
        print(f"{key}: {value}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
