"""The requests kube-scheduler v1.36 sends an extender, pod after pod: the benchmarks' input.

A benchmark that repeats one request (same names, same pod) measures the scorer's memos of that
list and that pod class, which stay warm; kube-scheduler never sends them that way at scale. It
sends each pod once, with a window of node names that moves on from pod to pod. This module
models that window and the pods, so that `scorer_latency` and `scorer_cpu` send what the real
caller sends; `window_check` compares the model with what a real kube-scheduler sent.

The model, read from kube-scheduler v1.36 (`pkg/scheduler/schedule_one.go`,
`pkg/scheduler/backend/cache/node_tree.go`):

- **Node order.** The snapshot lists nodes zone by zone in turn (round robin over the zones in
  the order they were first seen, each zone's nodes in the order they were added), not by name.
  The order they were added is the informer's first sync, which v1.36 gets by watch-list and
  hands over from a map: a random order per scheduler start (seen in `window_check`: each window
  holds as many nodes of each zone, scattered over the names), modelled as a seeded shuffle.
- **How many.** Below 100 nodes, every node. Otherwise `percentageOfNodesToScore` of them, and
  when that is unset (0, the default) an adaptive share: 50 % less one point per 125 nodes, at
  least 5 %; never fewer than 100 nodes. 300 nodes: 48 % = 144; 5,000: 10 % = 500; 10,000: 5 %.
- **Which.** The filter plugins run from `nextStartNodeIndex` around the list and stop once that
  many nodes passed them; the start then moves on by the nodes examined (passed + failed), so
  the next pod's window begins where this one's ended.
- **What the extender gets.** Its filter call names the nodes that passed the plugins; its
  prioritize call names the nodes its filter passed, in its reply's order. When a single node
  is left after the filters, kube-scheduler skips prioritizing.
- **The pod.** Each call carries the whole Pod from the scheduler's informer (no
  managedFields): a fresh object per pod, with its own name, uid and resourceVersion.

Left out: the filter plugins run in parallel (16 workers take chunks of the list), so the names
can arrive in chunk-interleaved order, and when nodes fail the plugins a few more may be examined
than a sequential scan would; a nominated node or an OpportunisticBatching hint is tried first.
"""

from __future__ import annotations

import json
import random
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Final

# kube-scheduler's constants (schedule_one.go).
MIN_FEASIBLE_NODES: Final = 100
MIN_FEASIBLE_PERCENTAGE: Final = 5
ADAPTIVE_BASE_PERCENTAGE: Final = 50
NODES_PER_PERCENTAGE_POINT: Final = 125

PREFIX: Final = "gpu-scheduler.example.com/"
GPU_RESOURCE: Final = "nvidia.com/gpu"
ZONE_LABEL: Final = "topology.kubernetes.io/zone"
REGION_LABEL: Final = "topology.kubernetes.io/region"


def nodes_to_find(total: int, percentage: int = 0) -> int:
    """How many feasible nodes kube-scheduler looks for among `total` (`percentage`: the
    configured percentageOfNodesToScore, 0 for the adaptive default)."""
    if total < MIN_FEASIBLE_NODES:
        return total
    if percentage == 0:
        percentage = max(
            MIN_FEASIBLE_PERCENTAGE, ADAPTIVE_BASE_PERCENTAGE - total // NODES_PER_PERCENTAGE_POINT
        )
    return max(MIN_FEASIBLE_NODES, total * percentage // 100)


def zone_key(node: Mapping[str, Any]) -> str:
    """The node tree's zone of a Node object (region and zone labels; empty when it has none)."""
    labels = node.get("metadata", {}).get("labels") or {}
    region, zone = labels.get(REGION_LABEL, ""), labels.get(ZONE_LABEL, "")
    return f"{region}:\x00:{zone}" if region or zone else ""


def informer_order(names: Sequence[str], seed: int) -> list[str]:
    """The order a scheduler's node informer adds `names` in: random, per start (seeded)."""
    shuffled = list(names)
    random.Random(seed).shuffle(shuffled)
    return shuffled


def snapshot_order(added: Iterable[tuple[str, str]]) -> list[str]:
    """Node names in the order kube-scheduler's snapshot lists them, from (name, zone key) in
    the order the nodes were added (an informer's first LIST: by name)."""
    zones: dict[str, list[str]] = {}
    for name, zone in added:
        zones.setdefault(zone, []).append(name)
    ordered: list[str] = []
    columns = list(zones.values())
    for depth in range(max((len(c) for c in columns), default=0)):
        ordered.extend(column[depth] for column in columns if depth < len(column))
    return ordered


@dataclass
class Rotation:
    """kube-scheduler's walk over the node list: one window of names per pod."""

    names: Sequence[str]
    percentage: int = 0
    start: int = 0

    def window(self, fits: Callable[[str], bool] | None = None) -> list[str]:
        """The names the extender's filter gets for the next pod (`fits`: whether a node passes
        kube-scheduler's own filter plugins; every node when None), moving the start on."""
        total = len(self.names)
        wanted = nodes_to_find(total, self.percentage)
        if fits is None:  # every node passes: the next `wanted` names, around the list
            start, self.start = self.start, (self.start + wanted) % total
            end = start + wanted
            tail = self.names[: end - total] if end > total else []
            return [*self.names[start:end], *tail]
        passed: list[str] = []
        examined = 0
        while examined < total and len(passed) < wanted:
            name = self.names[(self.start + examined) % total]
            examined += 1
            if fits is None or fits(name):
                passed.append(name)
        self.start = (self.start + examined) % total
        return passed


@dataclass(frozen=True, slots=True)
class PodClass:
    """One kind of pod of the mix: what a verdict reads of it."""

    weight: float
    gpus: int
    namespace: str
    hints: Mapping[str, str] = field(default_factory=dict)


# A mix of what GPU clusters run: mostly single-GPU pods without hints (inference replicas,
# notebooks), some multi-GPU training, and the hints of docs/scorer.md, across four tenants.
POD_MIX: Final[tuple[PodClass, ...]] = (
    PodClass(0.35, 1, "inference"),
    PodClass(0.10, 1, "notebooks"),
    PodClass(0.10, 2, "training"),
    PodClass(0.06, 4, "training"),
    PodClass(0.03, 8, "training"),
    PodClass(0.10, 1, "inference", {PREFIX + "max-utilization": "0.70"}),
    PodClass(
        0.08,
        1,
        "research",
        {PREFIX + "gpu-model-preference": "A100,H100", PREFIX + "gpu-fallback-utilization": "0.8"},
    ),
    PodClass(0.08, 2, "research", {PREFIX + "min-gpu-memory-mib": "40000"}),
    PodClass(0.05, 1, "notebooks", {PREFIX + "expected-gpu-load": "0.30"}),
    PodClass(0.05, 4, "training", {PREFIX + "max-utilization": "0.85"}),
)
_CREATED: Final = datetime(2026, 11, 30, 14, 0, 0, tzinfo=UTC)


class PodStream:
    """Fresh Pod objects, as kube-scheduler's informer holds them, drawn from a mix of classes."""

    def __init__(self, seed: int, mix: Sequence[PodClass] = POD_MIX) -> None:
        self._rng = random.Random(seed)
        self._mix = tuple(mix)
        self._weights = [c.weight for c in self._mix]
        self._serial = 0

    def next(self) -> dict[str, Any]:
        chosen = self._rng.choices(self._mix, self._weights)[0]
        self._serial += 1
        return pod_object(chosen, self._serial, self._rng)


def pod_object(chosen: PodClass, serial: int, rng: random.Random) -> dict[str, Any]:
    """Pod number `serial` of class `chosen` (the shape of the v1.36 captures: a Job's pod)."""
    job = f"job-{rng.randrange(10_000):04d}"
    quantity = str(chosen.gpus)
    created = _CREATED + timedelta(seconds=serial)
    return {
        "metadata": {
            "name": f"{job}-{serial:06d}-{rng.randrange(36**5):x}",
            "generateName": f"{job}-",
            "namespace": chosen.namespace,
            "uid": str(uuid.UUID(int=rng.getrandbits(128), version=4)),
            "resourceVersion": str(100_000 + serial),
            "generation": 1,
            "creationTimestamp": created.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "labels": {"job-name": job, "batch.kubernetes.io/job-name": job, "app": job},
            "annotations": dict(chosen.hints),
            "ownerReferences": [
                {
                    "apiVersion": "batch/v1",
                    "kind": "Job",
                    "name": job,
                    "uid": str(uuid.UUID(int=rng.getrandbits(128), version=4)),
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": {
            "containers": [
                {
                    "name": "main",
                    "image": "registry.example.com/ml/trainer:2026.11",
                    "resources": {
                        "limits": {"memory": "32Gi", GPU_RESOURCE: quantity},
                        "requests": {"cpu": "4", "memory": "32Gi", GPU_RESOURCE: quantity},
                    },
                    "terminationMessagePath": "/dev/termination-log",
                    "terminationMessagePolicy": "File",
                    "imagePullPolicy": "IfNotPresent",
                }
            ],
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 30,
            "dnsPolicy": "ClusterFirst",
            "serviceAccountName": "default",
            "serviceAccount": "default",
            "securityContext": {},
            "schedulerName": "gpu-scheduler",
            "tolerations": [
                {
                    "key": "node.kubernetes.io/not-ready",
                    "operator": "Exists",
                    "effect": "NoExecute",
                    "tolerationSeconds": 300,
                },
                {
                    "key": "node.kubernetes.io/unreachable",
                    "operator": "Exists",
                    "effect": "NoExecute",
                    "tolerationSeconds": 300,
                },
                {"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"},
            ],
            "priority": 0,
            "enableServiceLinks": True,
            "preemptionPolicy": "PreemptLowerPriority",
        },
        "status": {"phase": "Pending", "qosClass": "Burstable"},
    }


def _compact(document: object) -> bytes:
    """As Go's encoding/json writes it: no spaces."""
    return json.dumps(document, separators=(",", ":")).encode()


def filter_body(
    pod: Mapping[str, Any],
    names: Sequence[str],
    nodes: Mapping[str, Mapping[str, Any]] | None = None,
) -> bytes:
    """The filter call's body: names only, or (`nodes`: name -> Node object) full Nodes."""
    if nodes is None:
        return _compact({"Pod": pod, "Nodes": None, "NodeNames": list(names)})
    items = [nodes[name] for name in names]
    return _compact({"Pod": pod, "Nodes": {"metadata": {}, "items": items}, "NodeNames": None})


def passing_names(filter_reply: bytes) -> list[str]:
    """The names a filter reply passes (names-only `NodeNames`, or full `Nodes.items`)."""
    reply = json.loads(filter_reply)
    names = reply.get("NodeNames") or reply.get("nodenames")
    if names is not None:
        return [str(n) for n in names]
    items = (reply.get("Nodes") or reply.get("nodes") or {}).get("items") or []
    return [str(item["metadata"]["name"]) for item in items]
