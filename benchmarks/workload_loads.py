"""What learning each workload's load costs the scorer: memory and time at 150,000 pods.

    python -m benchmarks.workload_loads [--pods 150000] [--replicas 10] [--gpus-per-node 8]
        [--max-workloads 10000]

Builds `--pods` running GPU pods, one GPU each, in workloads of `--replicas` pods (Deployments),
on nodes of `--gpus-per-node` GPUs, each node's `pod-gpu-usage` decoded as the node watch
decodes it; then feeds every node once to a `WorkloadLoads` store (the pods already known from
the Pod watch) and reports the memory the store grew by (tracemalloc: the samples and learned
figures kept; the pods and nodes built beforehand are not counted) and the time per node. The
store keeps at most `--max-workloads` workloads (least recently sampled dropped first) of at most
`MAX_SAMPLES_PER_WORKLOAD` samples each, so the memory is bounded whatever the fleet's size.
"""

from __future__ import annotations

import argparse
import time
import tracemalloc
from datetime import UTC, datetime, timedelta

from exporter_scheduler.core.decoding import predecode
from exporter_scheduler.core.inflight import BoundPod
from exporter_scheduler.core.records import NodeInput
from exporter_scheduler.serving.workloads import WorkloadLoads
from gpu_contract.podusage import GpuShare, PodUsage
from gpu_contract.schema import DEFAULT_KEYS, GpuState, Health, NodeGpuState, encode

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def _fleet(
    pods: int, replicas: int, per_node: int
) -> list[tuple[str, tuple[BoundPod, ...], NodeInput]]:
    fleet = []
    for node_index in range(pods // per_node):
        name = f"gpu-{node_index:05d}"
        bound = tuple(
            BoundPod(
                namespace="ml",
                name=f"p{node_index * per_node + i}",
                uid=f"u{node_index * per_node + i}",
                node=name,
                gpus=1,
                bound_at=NOW - timedelta(hours=1),
                admitted_at=NOW - timedelta(hours=1),
                running_since=NOW - timedelta(minutes=50),
                workload=f"ml/Deployment/w{(node_index * per_node + i) // replicas}",
            )
            for i in range(per_node)
        )
        state = NodeGpuState(
            health=Health.OK,
            updated_at=NOW,
            utilization=0.5,
            gpu_count=per_node,
            gpus=tuple(GpuState(0.5, 40_000, 50) for _ in range(per_node)),
            pods=tuple(
                PodUsage(pod.ref, (GpuShare(i, 0.5, 20_000),)) for i, pod in enumerate(bound)
            ),
        )
        annotations = encode(state)
        node = NodeInput(
            name,
            annotations,
            predecoded=(DEFAULT_KEYS.prefix, predecode(annotations, DEFAULT_KEYS)),
        )
        fleet.append((name, bound, node))
    return fleet


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.workload_loads", description=__doc__
    )
    parser.add_argument("--pods", type=int, default=150_000)
    parser.add_argument("--replicas", type=int, default=10)
    parser.add_argument("--gpus-per-node", type=int, default=8)
    parser.add_argument("--max-workloads", type=int, default=10_000)
    args = parser.parse_args()
    fleet = _fleet(args.pods, args.replicas, args.gpus_per_node)
    store = WorkloadLoads(keys_prefix=DEFAULT_KEYS.prefix, max_workloads=args.max_workloads)
    for name, bound, _ in fleet:
        store.set_pods(name, bound)
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    started = time.perf_counter()
    samples = sum(store.observe(node) for _, _, node in fleet)
    elapsed_s = time.perf_counter() - started
    grown_mib = (tracemalloc.get_traced_memory()[0] - before) / 2**20
    tracemalloc.stop()
    print(
        f"{args.pods} pods in {args.pods // args.replicas} workloads on {len(fleet)} nodes: "
        f"{samples} samples recorded, {len(store)} workloads kept, {grown_mib:.1f} MiB, "
        f"{elapsed_s / len(fleet) * 1e6:.0f} us per node event (under tracemalloc)"
    )


if __name__ == "__main__":
    main()
