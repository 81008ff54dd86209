"""What in-flight accounting costs a names-only scorer per pod, in process, step by step.

With the Pod watch on, each pod costs the scorer more than its filter and prioritize: the
prioritize records where it expects the pod to bind (a proposal, which judges that node again),
and the pod's bind then arrives as a watch event (decoded, recorded, and its node judged again,
for every pod class the store keeps verdicts for). This runs that cycle in one process, without
HTTP or a network, so that each step's time is its own:

- a names-only node store of `--nodes` nodes (8 GPUs each, utilizations from a Beta(2, 2.2) draw,
  as `benchmarks.real_scheduler`'s fleet), the Pod watch's cache wired to it as `gpu-scorer serve`
  wires it (the store and the workloads' loads as its sinks, its proposals the app's);
- per pod, as kube-scheduler sends it (`benchmarks.kube_requests`): a fresh Pod of the mix (or of
  its first class alone, `--classes one`), the filter of the next window of the scheduler's
  rotation, the prioritize of the names it passed, then the bind as the API server's watch event
  (the Pod bound to the top-scored node, with its `PodScheduled` condition and the scheduler's
  managedFields entry) applied by the watch's own event handler; the pod bound `--keep` pods
  earlier is deleted (a `DELETED` event), so that the nodes hold a steady number of pods;
- the store's clock advances 6 ms per pod (a burst at about 170 pods/s), so the nodes' data ages
  from 1 s to 25 s over a default run, as an agent's data does between two of its writes; once
  the earliest verdict window of a class has ended, the verdict-expiry timer's work runs before
  the next pod, as the served scorer's timer thread runs it (its CPU counts in the CPU per pod,
  in no step). Runs compare at equal `--pods`: the nodes' data ages as a run goes on.

Reported per step (medians over `--pods` pods after as many untimed ones): `filter` and
`prioritize` (until the reply is made: what kube-scheduler waits for), `after` (what runs on the
request thread once a reply is written: the prioritize a filter prepares, the proposal, the
counters and the log line), `bind` and `delete` (one watch event each, applied), and the
scorer's CPU per pod, every step included. The harness's own work (encoding each request body
and watch event, reading the replies) is outside every timer and out of the CPU. `--before REF`
measures the scorer of an earlier commit the same way, in turns with this checkout's; each tree
runs in a process of its own, which imports that tree's modules.

`--pause-ms 0,10` idles before each timed pod, the pauses taking turns pod by pod: a scheduler
at 100 pods/s leaves the scorer idle about 10 ms between pods, and a machine may run other work
on that core meanwhile, so that the pod's steps start with the CPU's caches emptied of what they
read. The steps are reported per pause, with a reference that is not the scorer's: the median
time of 2,000 lookups of random node names in a dictionary of 5,000 after the same pause (the
kind of read a verdict table's is, with nothing of the scorer), which moves only as much as the
machine's caches make it move.

    python -m benchmarks.inflight_cost
    python -m benchmarks.inflight_cost --classes one --before HEAD~3 --json
    python -m benchmarks.inflight_cost --pause-ms 0,1,10 --pods 1200
"""

from __future__ import annotations

import argparse
import importlib
import json
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from benchmarks.kube_requests import (
    POD_MIX,
    PodStream,
    Rotation,
    filter_body,
    informer_order,
    passing_names,
)
from benchmarks.machine import machine_description

ROOT = Path(__file__).resolve().parents[1]
STEPS = ("filter", "prioritize", "after", "bind", "delete")
PER_POD_S = 0.006  # the store's clock per pod: a burst at about 170 pods/s
# The reference walk: 2,000 random names looked up in a dictionary of 5,000 (under 1 MiB).
_WALK_TABLE = 5_000
_WALK_KEYS = 2_000


class _Clock:
    def __init__(self, start: datetime) -> None:
        self.now = start

    def __call__(self) -> datetime:
        return self.now


def _watch_line(kind: str, pod: dict[str, Any], node: str, bound_at: datetime, rv: int) -> bytes:
    """The API server's watch event for `pod` bound to `node` (what a bind makes it send)."""
    bound = json.loads(json.dumps(pod))
    bound["spec"]["nodeName"] = node
    stamp = bound_at.strftime("%Y-%m-%dT%H:%M:%SZ")
    bound["status"]["conditions"] = [
        {"type": "PodScheduled", "status": "True", "lastProbeTime": None,
         "lastTransitionTime": stamp},
    ]  # fmt: skip
    bound["metadata"]["resourceVersion"] = str(rv)
    bound["metadata"]["managedFields"] = [
        {"manager": "kube-scheduler", "operation": "Update", "apiVersion": "v1", "time": stamp,
         "fieldsType": "FieldsV1", "subresource": "status",
         "fieldsV1": {"f:status": {"f:conditions": {".": {}, 'k:{"type":"PodScheduled"}': {
             ".": {}, "f:lastProbeTime": {}, "f:lastTransitionTime": {}, "f:status": {},
             "f:type": {}}}}}},
    ]  # fmt: skip
    return json.dumps({"type": kind, "object": bound}, separators=(",", ":")).encode()


def _walk(table: dict[str, int], keys: list[str]) -> int:
    """The machine's reference: node names looked up in a dictionary by name, as the scorer's
    tables are read; no allocation, nothing of the scorer."""
    total = 0
    for key in keys:
        total += table[key]
    return total


def measure(
    tree: Path,
    *,
    nodes: int,
    pods: int,
    keep: int,
    classes: str,
    pauses_s: Sequence[float] = (0.0,),
) -> dict[str, Any]:
    """One tree's medians per step (us) and CPU per pod (us), per pause before a pod. Call in a
    process of its own: `tree`'s modules are imported in place of this checkout's."""
    sys.path.insert(0, str(tree))
    # By name: the modules of the tree under test, whose API may differ from this checkout's.
    decoding = importlib.import_module("exporter_scheduler.core.decoding")
    policies = importlib.import_module("exporter_scheduler.core.policy")
    records = importlib.import_module("exporter_scheduler.core.records")
    app_module = importlib.import_module("exporter_scheduler.serving.app")
    nodestore = importlib.import_module("exporter_scheduler.serving.nodestore")
    workloads_module = importlib.import_module("exporter_scheduler.serving.workloads")
    metrics_module = importlib.import_module("exporter_scheduler.serving.metrics")
    podcache = importlib.import_module("exporter_scheduler.edges.podcache")
    schema = importlib.import_module("gpu_contract.schema")
    builders = importlib.import_module("tests.scorer.scoring_builders")

    rng = random.Random(nodes)
    clock = _Clock(builders.NOW)
    policy = policies.Policy()

    def node_input(name: str) -> Any:
        utilization = round(min(1.0, rng.betavariate(2.0, 2.2)), 2)
        plain = builders.node(name, utilization=utilization, age_s=1.0)
        predecoded = (builders.PREFIX, decoding.predecode(plain.annotations, schema.DEFAULT_KEYS))
        return records.NodeInput(name, plain.annotations, plain.agent_write_time, predecoded)

    workloads = workloads_module.WorkloadLoads(
        keys_prefix=policy.keys.prefix,
        load_delay_s=policy.inflight_load_delay_s,
        settle_s=300.0,
        settle_floor=policy.own_load_gpu_load,
        max_age_s=3600.0,
        min_pods=2,
        max_workloads=10_000,
    )
    store = nodestore.NodeStore(clock=clock, learned=workloads)
    names = [f"node-{i:05d}" for i in range(nodes)]
    store.replace([node_input(n) for n in names])
    metrics = metrics_module.ScorerMetrics()
    cache = podcache.PodCache(metrics=metrics, api=object())  # no API: events are fed below
    cache.add_sink(store)
    cache.add_sink(workloads)
    cache._replace([])  # the first LIST, empty: in-flight accounting on
    app = app_module.ScorerApp(
        policy=policy,
        clock=clock,
        node_store=store,
        metrics=metrics,
        placements=cache,
        groups=cache,
        workloads=workloads,
    )
    rotation = Rotation(informer_order(names, seed=nodes), 0)
    stream = PodStream(seed=nodes, mix=POD_MIX[:1] if classes == "one" else POD_MIX)
    bound: list[tuple[dict[str, Any], str]] = []
    by_pause: dict[float, dict[str, list[float]]] = {
        pause: {step: [] for step in STEPS} for pause in pauses_s
    }
    times = by_pause[pauses_s[0]]
    version = [1000]

    # The scorer's own CPU over the timed pods: the harness's work (encoding the requests and
    # the watch events, reading the replies) is outside every timer.
    scorer_cpu_s = [0.0]

    def event(kind: str, pod: dict[str, Any], node: str) -> None:
        version[0] += 1
        line = _watch_line(kind, pod, node, clock.now, version[0])
        cpu_started_s, started = time.thread_time(), time.perf_counter()
        cache._apply(line)  # the watch's handler
        spent_s = time.perf_counter() - started
        if timed:
            scorer_cpu_s[0] += time.thread_time() - cpu_started_s
            times["delete" if kind == "DELETED" else "bind"].append(spent_s)

    # The verdict-expiry timer's work (`NodeCache._expire`), once the earliest window of an
    # active class has ended, as the served scorer's timer thread does it. Without it the table's
    # bounds stay ended, and every filter after the first window's end reads each name's entry
    # for its window, which a served filter does only until the timer has run.
    next_expiry_ts = getattr(store, "next_expiry_ts", None)

    def expire() -> None:
        due_ts = None if next_expiry_ts is None else next_expiry_ts()
        if due_ts is None or clock.now.timestamp() < due_ts:
            return
        cpu_started_s = time.thread_time()
        store.refresh_expired()
        if timed:
            scorer_cpu_s[0] += time.thread_time() - cpu_started_s

    def one_pod() -> None:
        pod = stream.next()
        clock.now += timedelta(seconds=PER_POD_S)
        expire()
        body = filter_body(pod, rotation.window())
        cpu_started_s, t0 = time.thread_time(), time.perf_counter()
        filtered = app.answer("filter", body)
        t1 = time.perf_counter()
        filtered.prepare()  # the edge runs it once the reply is written
        t2, cpu_s = time.perf_counter(), time.thread_time() - cpu_started_s
        passed = passing_names(filtered.body)
        body = filter_body(pod, passed)
        cpu_started_s, t3 = time.thread_time(), time.perf_counter()
        prioritized = app.answer("prioritize", body)
        t4 = time.perf_counter()
        prioritized.finish()
        filtered.finish()
        t5 = time.perf_counter()
        cpu_s += time.thread_time() - cpu_started_s
        if timed:
            scorer_cpu_s[0] += cpu_s
            times["filter"].append(t1 - t0)
            times["prioritize"].append(t4 - t3)
            times["after"].append((t2 - t1) + (t5 - t4))
        scores = json.loads(prioritized.body)
        if scores:
            node = max(scores, key=lambda s: s["Score"])["Host"]
        else:
            node = passed[0] if passed else names[len(bound) % len(names)]
        event("ADDED", pod, node)
        bound.append((pod, node))
        if len(bound) > keep:
            event("DELETED", *bound.pop(0))

    timed = False
    for _ in range(pods):
        one_pod()
    timed = True
    for index in range(pods):
        # The pauses take turns pod by pod, so that each meets the same state of the store.
        pause_s = pauses_s[index % len(pauses_s)]
        times = by_pause[pause_s]
        if pause_s:
            time.sleep(pause_s)
        one_pod()
    cpu_us = scorer_cpu_s[0] / pods * 1e6
    walks: dict[float, list[float]] = {pause: [] for pause in pauses_s}
    table = {f"node-{i:05d}": i for i in range(_WALK_TABLE)}
    draw = random.Random(0)
    keys = [f"node-{draw.randrange(_WALK_TABLE):05d}" for _ in range(_WALK_KEYS)]
    for index in range(max(len(pauses_s), pods // 4)):
        pause_s = pauses_s[index % len(pauses_s)]
        if pause_s:
            time.sleep(pause_s)
        started = time.perf_counter()
        _walk(table, keys)
        walks[pause_s].append(time.perf_counter() - started)

    def medians(steps: dict[str, list[float]]) -> dict[str, float]:
        return {step: round(statistics.median(v) * 1e6, 1) for step, v in steps.items()}

    return {
        "median_us": medians(by_pause[pauses_s[0]]),
        "by_pause_ms": {
            f"{pause * 1e3:g}": {
                **medians(by_pause[pause]),
                "reference": round(statistics.median(walks[pause]) * 1e6, 1),
            }
            for pause in pauses_s
        },
        "cpu_us_per_pod": round(cpu_us, 1),
        "pod_classes": len(store._tables),
        # The watch's record of bound pods: the events were applied, not dropped.
        "bound_at_end": sum(len(store.pods_of(n)) for n in names),
    }


def _child(tree: Path, args: argparse.Namespace) -> dict[str, Any]:
    done = subprocess.run(
        [
            *(sys.executable, "-m", "benchmarks.inflight_cost", "--child", str(tree)),
            *("--nodes", str(args.nodes), "--pods", str(args.pods), "--keep", str(args.keep)),
            *("--classes", args.classes, "--pause-ms", args.pause_ms),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def run(args: argparse.Namespace) -> dict[str, Any]:
    # Not at the top: it imports this checkout's scorer modules, which a child must not.
    from benchmarks.scorer_latency import in_turns  # noqa: PLC0415

    rounds = in_turns(args.before, args.rounds, lambda tree: _child(tree, args))
    summary: dict[str, Any] = {}
    for label, results in rounds.items():
        summary[label] = {
            "median_us": {
                step: statistics.median(r["median_us"][step] for r in results) for step in STEPS
            },
            "cpu_us_per_pod": statistics.median(r["cpu_us_per_pod"] for r in results),
            "cpu_us_per_pod_rounds": [r["cpu_us_per_pod"] for r in results],
            "by_pause_ms": {
                pause: {
                    step: statistics.median(r["by_pause_ms"][pause][step] for r in results)
                    for step in (*STEPS, "reference")
                }
                for pause in results[0]["by_pause_ms"]
            },
            "pod_classes": results[0]["pod_classes"],
            "bound_at_end": results[0]["bound_at_end"],
        }
    return {
        "machine": machine_description(),
        "config": {
            "nodes": args.nodes,
            "pods": args.pods,
            "keep": args.keep,
            "classes": args.classes,
            "rounds": args.rounds,
            "pause_ms": args.pause_ms,
        },
        "trees": summary,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.inflight_cost", description=__doc__)
    parser.add_argument("--nodes", type=int, default=300)
    parser.add_argument("--pods", type=int, default=2000, help="timed pods (as many untimed first)")
    parser.add_argument("--keep", type=int, default=600, help="pods bound at once")
    parser.add_argument(
        "--classes", choices=("mix", "one"), default="mix", help="the pod mix, or its first class"
    )
    parser.add_argument("--before", metavar="REF", help="also measure this commit's scorer")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--pause-ms",
        default="0",
        help="idle time before each timed pod, ms; a list (0,10) takes turns pod by pod",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if not 0 < args.keep < args.pods:
        parser.error("--keep must be above 0 and below --pods: the pods beyond it are deleted")
    try:
        pauses_s = tuple(float(ms) / 1e3 for ms in args.pause_ms.split(","))
    except ValueError:
        parser.error("--pause-ms takes milliseconds, comma-separated")
    if any(pause < 0 for pause in pauses_s) or len(set(pauses_s)) != len(pauses_s):
        parser.error("--pause-ms takes distinct pauses of 0 ms or more")
    if args.child is not None:
        result = measure(
            args.child,
            nodes=args.nodes,
            pods=args.pods,
            keep=args.keep,
            classes=args.classes,
            pauses_s=pauses_s,
        )
        print(json.dumps(result))
        return 0
    document = run(args)
    if args.json:
        print(json.dumps(document, indent=2))
        return 0
    print(f"machine: {document['machine']}")
    config = document["config"]
    print(
        f"{config['nodes']} nodes, {config['pods']} pods timed, {config['keep']} bound at once, "
        f"classes: {config['classes']}; medians of {config['rounds']} rounds, us"
    )
    print(f"{'':>24} {'  '.join(f'{s:>10}' for s in STEPS)}  {'CPU/pod':>8}  classes")
    for label, tree in document["trees"].items():
        steps = "  ".join(f"{tree['median_us'][s]:>10.1f}" for s in STEPS)
        print(f"{label:>24} {steps}  {tree['cpu_us_per_pod']:>8.1f}  {tree['pod_classes']}")
    if len(pauses_s) > 1:
        print(f"per pause before the pod, us (reference: {_WALK_KEYS:,} names looked up)")
        print(f"{'':>24} {'  '.join(f'{s:>10}' for s in (*STEPS, 'reference'))}")
        for label, tree in document["trees"].items():
            for pause, steps_us in tree["by_pause_ms"].items():
                cells = "  ".join(f"{steps_us[s]:>10.1f}" for s in (*STEPS, "reference"))
                print(f"{f'{label}, {pause} ms':>24} {cells}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
