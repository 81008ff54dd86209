"""What each workload's running pods use per GPU, learned off the request path.

The scorer counts the load a pod will add (`exporter_scheduler.core.ownload`); short of the pod's
hint, the best estimate is what its siblings use. The agent publishes, per node, each pod's
share of each GPU it holds (`pod-gpu-usage`); the Pod watch says which workload each bound pod
belongs to (`exporter_scheduler.core.workload`) and since when its containers run. This store
joins the two on the watch threads: each Node event with usage data records one sample per pod
and GPU, for the pods past their ramp (the node's data sampled at least
`inflight_load_delay_s` after every container of the pod ran: before that the window-averaged
utilization still shows the start-up, the same rule that ends a pod's in-flight load), and
recomputes that workload's figure with the pure `ownload.learn`.

A ramp can outlast that delay: a training worker still loading its data, or a large model still
copying its weights and capturing its CUDA graphs, reads idle for minutes. So until a pod has run
`settle_s`, a utilization it shows below `settle_floor` (the default estimate) is not recorded
(its memory is): a young pod's reading may raise its workload's figure, never pull it below the
default. An idle reading taken for the load is the costly error: the next replica lands on a GPU
it then pushes over the limit; a busy reading ignored for a few minutes only keeps the default.

The request path only reads a dict entry (`learned_for`), so a verdict takes the estimate as an
input, like the in-flight pods.

Both modes learn from the same data. In names-only mode the Node watch hands each node's data
to `observe`; in full-node mode the Nodes arrive in the requests themselves:
`observe_requested` records each Node whose annotations it has not seen yet, before the
request's verdicts are judged, so the same agent writes teach the same figures. A Node the
scheduler never sends (kube-scheduler sends only Nodes that pass its own filters, so never one
whose GPUs a workload's replicas all hold) teaches nothing that way; with
`--own-load-node-watch` a Node watch of its own hands every node's data to `observe` instead.

The pods handed to a verdict carry their workload's figure (`stamp`), so an in-flight pod
counts the load its workload's running pods show (`inflight.pod_estimate`): an input of the
verdict like the pods themselves. A pod is stamped when its node's pods are handed over (in
names-only mode on each Pod event of the node; in full-node mode per request, again only when a
figure changed since: `generation`).

Bounded: each workload keeps the latest sample of each pod and GPU, at most
`MAX_SAMPLES_PER_WORKLOAD` (the oldest go first), and at most `max_workloads` workloads are kept,
the least recently sampled dropped first (an LRU; the request path never writes, so a lookup
does not refresh an entry). A workload dropped comes back
with its pods' next samples. Bad usage data is the contract's decoder's to drop (`decode` keeps
the problems); a pod the usage names that the Pod watch does not know (deleted since, or another
scheduler's pod on a node whose pods are not all GPU pods) is skipped.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any, Final

import msgspec

from exporter_scheduler.core.decoding import predecode
from exporter_scheduler.core.inflight import BoundPod
from exporter_scheduler.core.ownload import (
    BASIS_POINTS,
    DEFAULT_SETTLE_S,
    Learned,
    UsageSample,
    learn,
)
from exporter_scheduler.core.records import NodeInput
from exporter_scheduler.serving.nodeobjects import annotations_of, gpu_keys
from gpu_contract.schema import Keys

# A workload of many replicas: the newest 256 pod-GPU samples say as much as all of them.
MAX_SAMPLES_PER_WORKLOAD: Final = 256
DEFAULT_MAX_WORKLOADS: Final = 10_000
# Full-node mode remembers this many Nodes' last `updated-at` and stamped pods (then starts
# over: a Node read twice records the same samples twice, which changes no figure).
_MAX_REQUESTED_NODES: Final = 65_536


class _Workload:
    __slots__ = ("learned", "newest", "samples")

    def __init__(self) -> None:
        # (pod, gpu index) -> its latest sample, oldest first (re-inserted on each update).
        self.samples: OrderedDict[tuple[str, int], UsageSample] = OrderedDict()
        self.learned: Learned | None = None
        self.newest: datetime | None = None


class WorkloadLoads:
    """Per workload, its pods' recent per-GPU samples and the figure learned from them."""

    def __init__(
        self,
        *,
        keys_prefix: str = "",
        load_delay_s: float = 60.0,
        settle_s: float = DEFAULT_SETTLE_S,
        settle_floor: float = 0.0,
        max_age_s: float = 3600.0,
        min_pods: int = 2,
        max_workloads: int = DEFAULT_MAX_WORKLOADS,
    ) -> None:
        if max_workloads < 1:
            raise ValueError(f"max_workloads must be at least 1, got {max_workloads}")
        self.prefix = keys_prefix
        self.load_delay = timedelta(seconds=load_delay_s)
        self.settle = timedelta(seconds=max(settle_s, load_delay_s))
        self.settle_floor_bp = round(settle_floor * BASIS_POINTS)
        self.max_age_s = max_age_s
        self.min_pods = min_pods
        self.max_workloads = max_workloads
        self._workloads: OrderedDict[str, _Workload] = OrderedDict()
        self._pods: dict[str, dict[str, BoundPod]] = {}  # node -> pod ref -> pod
        self._lock = threading.Lock()
        # Bumped whenever a workload's figure changes: pods stamped at an older generation
        # may carry an old figure (`stamp`).
        self.generation = 0
        # Full-node mode: each Node's annotations last recorded (`observe_requested`).
        self._requested: dict[str, Any] = {}
        # Full-node mode: each node's pods as last stamped, by its pods' tuple and generation.
        self._stamped: dict[str, tuple[tuple[BoundPod, ...], int, tuple[BoundPod, ...]]] = {}

    # ------------------------------------------------------------------ request path
    def learned_for(self, workload: str | None, now: datetime) -> Learned | None:
        """The workload's learned figure, None when unknown or its newest sample is too old."""
        if workload is None:
            return None
        entry = self._workloads.get(workload)
        if entry is None or entry.newest is None:
            return None
        if (now - entry.newest).total_seconds() > self.max_age_s:
            return None
        return entry.learned

    def __len__(self) -> int:
        return len(self._workloads)

    def stamp(self, pods: tuple[BoundPod, ...], now: datetime) -> tuple[BoundPod, ...]:
        """`pods`, each with its workload's current figure (`BoundPod.learned`); the same
        tuple when none changes."""
        stamped: list[BoundPod] | None = None
        for index, pod in enumerate(pods):
            if pod.workload is None:
                continue
            figure = self.learned_for(pod.workload, now)
            if figure != pod.learned:
                if stamped is None:
                    stamped = list(pods)
                stamped[index] = msgspec.structs.replace(pod, learned=figure)
        return pods if stamped is None else tuple(stamped)

    def stamped_pods_of(
        self, pods_of: Callable[[str], tuple[BoundPod, ...]], now: datetime
    ) -> Callable[[str], tuple[BoundPod, ...]]:
        """Full-node mode: `pods_of` with each node's pods stamped (`stamp`), the same tuple
        while neither the node's pods nor any figure changes (it is part of the verdict
        cache's key)."""
        stamped = self._stamped

        def stamped_pods_of(name: str) -> tuple[BoundPod, ...]:
            raw = pods_of(name)
            if not raw:
                return raw
            generation = self.generation
            known = stamped.get(name)
            if known is not None and known[0] is raw and known[1] == generation:
                return known[2]
            pods = self.stamp(raw, now)
            if len(stamped) >= _MAX_REQUESTED_NODES:
                stamped.clear()
            stamped[name] = (raw, generation, pods)
            return pods

        return stamped_pods_of

    def observe_requested(self, records: Sequence[Any], keys: Keys) -> int:
        """Full-node mode: record the samples of a request's Node records whose annotations
        changed since they were last sent (compared as decoded); the number of Nodes read."""
        requested = self._requested
        fields = gpu_keys(keys)
        read = 0
        for record in records:
            meta = record.metadata
            name, raw = meta.name, meta.annotations
            if raw is None or requested.get(name) == raw:
                continue
            if len(requested) >= _MAX_REQUESTED_NODES:
                requested.clear()
            requested[name] = raw
            values = annotations_of(raw, fields)
            decoded = predecode(values, keys)
            self.observe(NodeInput(name, values, predecoded=(keys.prefix, decoded)))
            read += 1
        return read

    # ------------------------------------------------------------------ the Pod watch (a sink)
    def set_pods(self, name: str, pods: tuple[BoundPod, ...]) -> bool:
        with self._lock:
            if pods:
                self._pods[name] = {pod.ref: pod for pod in pods if pod.workload is not None}
            else:
                self._pods.pop(name, None)
        return False  # no verdict changes by it

    def replace_pods(self, pods: Mapping[str, tuple[BoundPod, ...]]) -> None:
        with self._lock:
            self._pods = {
                node: {pod.ref: pod for pod in bound if pod.workload is not None}
                for node, bound in pods.items()
            }

    # ------------------------------------------------------------------ the Node watch
    def observe(self, node: NodeInput) -> int:
        """Record the samples of one node's data; the number recorded."""
        pre = node.predecoded
        if pre is None or pre[0] != self.prefix:
            return 0
        state = pre[1].state
        if state is None or not state.pods:
            return 0
        sampled_at = state.updated_at
        recorded = 0
        with self._lock:
            bound = self._pods.get(node.name)
            if not bound:
                return 0
            touched: set[str] = set()
            for usage in state.pods:
                pod = bound.get(usage.pod)
                if pod is None or pod.workload is None or pod.running_since is None:
                    continue
                if sampled_at < pod.running_since + self.load_delay:
                    continue  # still ramping: its window still shows the start-up
                settling = sampled_at < pod.running_since + self.settle
                entry = self._entry(pod.workload)
                for share in usage.gpus:
                    util_bp = (
                        None
                        if share.utilization is None
                        else round(share.utilization * BASIS_POINTS)
                    )
                    if settling and util_bp is not None and util_bp < self.settle_floor_bp:
                        util_bp = None  # perhaps its start-up, not its load (module docstring)
                    if util_bp is None and share.memory_used_mib is None:
                        continue
                    key = (usage.pod, share.gpu_index)
                    entry.samples.pop(key, None)
                    entry.samples[key] = UsageSample(
                        usage.pod, share.gpu_index, sampled_at, util_bp, share.memory_used_mib
                    )
                    while len(entry.samples) > MAX_SAMPLES_PER_WORKLOAD:
                        entry.samples.popitem(last=False)
                    recorded += 1
                touched.add(pod.workload)
            for workload in touched:
                entry = self._workloads[workload]
                entry.newest = max(s.sampled_at for s in entry.samples.values())
                before = entry.learned
                entry.learned = learn(
                    entry.samples.values(),
                    entry.newest,
                    max_age_s=self.max_age_s,
                    min_pods=self.min_pods,
                )
                if entry.learned != before:
                    self.generation += 1
        return recorded

    def _entry(self, workload: str) -> _Workload:
        entry = self._workloads.get(workload)
        if entry is None:
            entry = self._workloads[workload] = _Workload()
            while len(self._workloads) > self.max_workloads:
                self._workloads.popitem(last=False)
        else:
            self._workloads.move_to_end(workload)
        return entry
