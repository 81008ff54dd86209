"""DRA pods against device-plugin pods: the scorer's filter time for the same pods, in one run.

A pod that asks for its GPUs through a ResourceClaim is judged on the GPUs the allocator may
still give it (`core.dra`), so its verdicts depend on every other claim and device taint; a
device-plugin pod's come from the node store's tables. This measures what that costs on the
request path, names-only mode, in one process (the handler, `ScorerApp.handle`, without HTTP):

- `--nodes` nodes of 8 GPUs (per-GPU readings, one GPU in five above the utilization limit),
  30,000 ResourceClaims of one GPU (three in four of the nodes' GPUs allocated, the other claims
  on pools outside the store: pending pods' claims and other nodes'), 500 DeviceTaintRules on
  allocated-or-free GPUs;
- per sample, one pod of the kube-scheduler model (`benchmarks.kube_requests`: a fresh Pod from
  the mix of classes, the next window of names of the rotation) sent twice with the same window:
  as is (a device-plugin pod) and as a claim pod of the same GPU count (its GPU limit replaced
  by a fresh claim of that many GPUs, known to the DRA watch before the filter, as the claim is
  made before the pod is scheduled); the order alternates per sample;
- after each sample the claim pod's claim is allocated on a node that passed and an older
  claim released, as binding does: two DRA watch events, applied between requests as the
  watch thread applies them (with the node store judging that node again for the classes that
  have it, `NodeStore.exclusions_changed`); their cost is reported beside.

The first `--warm` samples fill both pods' verdicts for the classes of the mix (as any running
scorer has them); the table gives the medians of the next `--samples`, and their ratio.

    python -m benchmarks.dra_filter                   # 500 and 5,000 nodes
    python -m benchmarks.dra_filter --nodes 5000 --json
"""

from __future__ import annotations

import argparse
import copy
import json
import random
import statistics
import sys
import time
from typing import Any

from benchmarks.kube_requests import (
    GPU_RESOURCE,
    PodStream,
    Rotation,
    filter_body,
    informer_order,
    passing_names,
)
from benchmarks.machine import machine_description
from exporter_scheduler.core.decoding import predecode
from exporter_scheduler.core.dra import ClaimInfo, DeviceTaint
from exporter_scheduler.core.policy import Policy
from exporter_scheduler.core.records import NodeInput
from exporter_scheduler.edges.dradata import DraData
from exporter_scheduler.serving.app import ScorerApp
from gpu_contract.schema import DEFAULT_KEYS
from tests.scorer._http_helpers import fixed_clock, store_of
from tests.scorer.scoring_builders import NOW, PREFIX, Gpu, gpu_node

DRIVER = "gpu.nvidia.com"
GPUS_PER_NODE = 8
CLAIMS = 30_000
RULES = 500


def _node(name: str, rng: random.Random) -> NodeInput:
    table = [
        Gpu(utilization=0.95 if rng.random() < 0.2 else round(rng.uniform(0.0, 0.6), 2))
        for _ in range(GPUS_PER_NODE)
    ]
    plain = gpu_node(name, table)
    return NodeInput(
        name,
        plain.annotations,
        plain.agent_write_time,
        (PREFIX, predecode(plain.annotations, DEFAULT_KEYS)),
    )


def _claims(names: list[str], rng: random.Random) -> list[ClaimInfo]:
    """`CLAIMS` one-GPU claims: three in four of the nodes' GPUs allocated, the rest elsewhere."""
    # Interned, as the watch keeps pools and devices (`dracache.claim_info`).
    devices = [
        (sys.intern(name), sys.intern(f"gpu-{i}")) for name in names for i in range(GPUS_PER_NODE)
    ]
    rng.shuffle(devices)
    allocated = devices[: min(CLAIMS, len(devices) * 3 // 4)]
    claims = [ClaimInfo(f"ns/c{i}", 1, (device,)) for i, device in enumerate(allocated)]
    claims += [
        ClaimInfo(f"ns/c{i}", 1, ((f"other-{i // GPUS_PER_NODE}", f"gpu-{i % GPUS_PER_NODE}"),))
        for i in range(len(claims), CLAIMS)
    ]
    return claims


def _claim_pod(pod: dict[str, Any], claim: str) -> dict[str, Any]:
    """`pod` asking its GPUs through the claim `claim` instead of the extended resource."""
    dra = copy.deepcopy(pod)
    container = dra["spec"]["containers"][0]
    for part in ("limits", "requests"):
        container["resources"][part].pop(GPU_RESOURCE)
    container["resources"]["claims"] = [{"name": "gpu"}]
    dra["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": "gpus"}]
    dra["status"]["resourceClaimStatuses"] = [{"name": "gpu", "resourceClaimName": claim}]
    return dra


def measure(nodes: int, *, warm: int, samples: int, seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    names = [f"node-{i:05d}" for i in range(nodes)]
    store = store_of(_node(name, rng) for name in names)
    data = DraData(driver=DRIVER, device_classes=[DRIVER])
    data.on_exclusions = store.exclusions_changed  # as `gpu-scorer serve` wires them
    claims = _claims(names, rng)
    data.replace_claims(claims)
    taint = DeviceTaint(PREFIX + "utilization", "NoSchedule")
    data.replace_rules(
        {
            f"r{i}": (rng.choice(names), f"gpu-{rng.randrange(GPUS_PER_NODE)}", taint)
            for i in range(RULES)
        }
    )
    app = ScorerApp(policy=Policy(), clock=fixed_clock(NOW), node_store=store, dra=data)
    rotation = Rotation(informer_order(names, seed))
    pods = PodStream(seed)
    released = [claim.ref for claim in claims]
    rng.shuffle(released)
    plugin_ms: list[float] = []
    dra_ms: list[float] = []
    dra_prioritize_ms: list[float] = []
    event_ms: list[float] = []  # the watch thread's, per claim event
    for sample in range(warm + samples):
        pod = pods.next()
        gpus = int(pod["spec"]["containers"][0]["resources"]["limits"][GPU_RESOURCE])
        claim = f"{pod['metadata']['name']}-gpu"
        data.put_claim(ClaimInfo(f"{pod['metadata']['namespace']}/{claim}", gpus))
        window = rotation.window()
        bodies = {
            "plugin": filter_body(pod, window),
            "dra": filter_body(_claim_pod(pod, claim), window),
        }
        times: dict[str, float] = {}
        passed: list[str] = []
        for kind in ("plugin", "dra") if sample % 2 else ("dra", "plugin"):
            started = time.perf_counter()
            reply = app.handle("filter", bodies[kind]).body
            times[kind] = (time.perf_counter() - started) * 1000
            if kind == "dra":
                passed = passing_names(bytes(reply))
        body = json.loads(bodies["dra"])
        body["NodeNames"] = passed
        prioritize = json.dumps(body, separators=(",", ":")).encode()
        started = time.perf_counter()
        app.handle("prioritize", prioritize)
        prioritize_ms = (time.perf_counter() - started) * 1000
        if sample >= warm:
            plugin_ms.append(times["plugin"])
            dra_ms.append(times["dra"])
            dra_prioritize_ms.append(prioritize_ms)
        # Binding: the claim allocated on a node that passed, an older claim released.
        started = time.perf_counter()
        if passed:
            where = (rng.choice(passed), f"gpu-{rng.randrange(GPUS_PER_NODE)}")
            ref = f"{pod['metadata']['namespace']}/{claim}"
            data.put_claim(ClaimInfo(ref, gpus, (where,)))
        data.delete_claim(released.pop())
        if sample >= warm:
            event_ms.append((time.perf_counter() - started) * 1000 / 2)
    plugin, dra = statistics.median(plugin_ms), statistics.median(dra_ms)
    return {
        "nodes": nodes,
        "window": len(window),
        "claims": len(data),
        "rules": RULES,
        "samples": samples,
        "plugin_filter_ms": round(plugin, 3),
        "dra_filter_ms": round(dra, 3),
        "ratio": round(dra / plugin, 2),
        "dra_prioritize_ms": round(statistics.median(dra_prioritize_ms), 3),
        "claim_event_ms": round(statistics.median(event_ms), 3),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[500, 5000])
    parser.add_argument("--warm", type=int, default=300)
    parser.add_argument("--samples", type=int, default=300)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    rows = [measure(n, warm=args.warm, samples=args.samples, seed=args.seed) for n in args.nodes]
    if args.json:
        print(json.dumps({"machine": machine_description(), "rows": rows}, indent=2))
        return 0
    print(f"machine: {machine_description()}")
    print(
        "| nodes | names per filter | claims | device-plugin pod filter, median | claim pod "
        "filter, median | ratio | claim pod prioritize, median | claim event (watch thread), "
        "median |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['nodes']:,} | {r['window']} | {r['claims']:,} | {r['plugin_filter_ms']} ms | "
            f"{r['dra_filter_ms']} ms | {r['ratio']} x | {r['dra_prioritize_ms']} ms | "
            f"{r['claim_event_ms']} ms |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
