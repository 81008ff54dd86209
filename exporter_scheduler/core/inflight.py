"""In-flight pods: GPU pods placed on a node that the node's published data cannot show yet.

A node's annotations show a placement only after the kubelet has admitted the pod, the agent has
sampled and written, and the watch has delivered; its load shows only once the pod's containers
have run long enough to move the agent's window-averaged utilization. Until then the node looks
as free as before, and a burst would pile onto it. So each pod bound to a node (by any
scheduler, or by `spec.nodeName`) is an input to the node's verdict, from the scorer's Pod watch,
for as long as the node's data cannot show it:

- **allocation pending** while the node's data was sampled no later than the kubelet's first
  status of the pod (`status.startTime`, written after admission, when the device plugin has
  allocated its GPUs): `updated-at <= startTime`, or the kubelet has not reported it yet. Both
  times are the node's own clock, so no skew enters; equal seconds count as pending because
  both are truncated to the second;
- **load pending** while the data was sampled before every container had run for the policy's
  `inflight_load_delay_s` (the agent's utilization window plus the start-up of a GPU process):
  `updated-at < running_since + delay`, or not every container runs yet;
- **never** once `inflight_max_s` has passed since the pod was bound (server time), whatever the
  node publishes, so a node whose kubelet or agent never catches up is not blocked forever;
- a pod deleted, or in a terminal phase, is gone from the input at once (the watch drops it).

A pod kube-scheduler has nominated to a node and not bound (`status.nominatedNodeName`: a gang
member waiting at Permit, a pod in a slow PreBind, a preemptor) is an input to that node's
verdict as well, pending in both ways and with no time bound: it counts until it is bound (then
as above), its nomination is cleared, or it is gone.

Within a burst the watch is not quick enough: kube-scheduler binds asynchronously, and the next
pod's filter can arrive before the previous pod's bind is in the watch. So the scorer also
counts its own expectation: a pod it has just scored is *proposed* on the node(s) it expects
the scheduler to pick (`PodCache.propose`), as a provisional in-flight pod, until the watch
shows where the pod really went (which replaces the proposal) or `PROVISIONAL_MAX_S` passes.

Each pod counts with its own estimate (`pod_estimate`): with the pod's own load counted
(`own_load`, ownload.py), what it was judged to add when it was placed (its hint, else its
workload's learned load, else the own-load default), so a pod adds the same load before and
after its bind; without, its hint or the policy's `inflight_gpu_load`. The learned figure is an
input carried on the pod (`BoundPod.learned`, set where the pods are handed to the verdicts).

`count_inflight` is pure: a function of (the node's bound pods, the node's `updated-at`, now,
the policy numbers), so verdicts stay a pure function of their inputs, and the moment the time
bound changes the count is part of each verdict's validity window.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Final, Literal

import msgspec

from exporter_scheduler.core.ownload import Learned, OwnLoad, own_load

BASIS_POINTS: Final = 10_000
# A proposal the watch has not confirmed within this long is dropped: kube-scheduler's bind
# takes milliseconds, and one that failed is retried with a new filter (a new proposal).
PROVISIONAL_MAX_S: Final = 10.0


class BoundPod(msgspec.Struct, frozen=True, gc=False):
    """What the scorer keeps of one GPU pod bound to a node (from the Pod watch)."""

    namespace: str
    name: str
    uid: str
    node: str
    # Units of the GPU resource the pod holds (`max(sum of containers, largest init)`).
    gpus: int
    # Server time the pod was bound: its `PodScheduled` condition's transition, else its
    # creation (a pod created with `spec.nodeName` is never scheduled). None: unknown.
    bound_at: datetime | None
    # `status.startTime`: the kubelet's first status of the pod, after admission (node clock).
    admitted_at: datetime | None = None
    # The latest `state.running.startedAt` once every container runs (node clock), else None.
    running_since: datetime | None = None
    # The pod's `expected-gpu-load` hint in basis points per GPU unit; None: the policy default.
    gpu_load_bp: int | None = None
    # The pod's `min-gpu-memory-mib` hint (memory it takes on each GPU), if it gave one.
    memory_mib: int | None = None
    # The scorer's own expectation of where the pod goes, not yet seen bound in the watch
    # (`bound_at` is then the scorer's time of the proposal).
    provisional: bool = False
    # Its `<prefix>spread-group` label: the group a spread cap counts it in (spread.py).
    group: str | None = None
    # Not bound: kube-scheduler's `status.nominatedNodeName` names `node` (`bound_at` is None).
    nominated: bool = False
    # Its workload (`workload.workload_of`): whose load its usage teaches (ownload.py).
    workload: str | None = None
    # The pod's `expected-gpu-memory-mib` hint, if it gave one (its own load, ownload.py).
    expected_memory_mib: int | None = None
    # Its workload's learned load when the scorer last recorded the pod (`ownload.learn`; set by
    # whoever hands the pods to a verdict): what it adds once it runs, short of its hints.
    learned: Learned | None = None

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}"


NO_PODS: Final[tuple[BoundPod, ...]] = ()
LoadSource = Literal["hint", "learned", "default", "policy"]


class OwnDefault(msgspec.Struct, frozen=True, gc=False):
    """The own-load defaults an in-flight pod's estimate falls back to (`own_load` on)."""

    load_bp: int
    memory_mib: int


def pod_estimate(
    pod: BoundPod, own: OwnDefault | None, policy_load_bp: int
) -> tuple[int, int | None, LoadSource]:
    """What an in-flight pod adds to each GPU it holds: (utilization bp, memory MiB or None,
    where the utilization came from).

    With the pod's own load counted (`own`), an in-flight pod adds what it was judged to add
    when it was placed: its hint, else its workload's learned load, else the own-load default
    (`ownload.own_load`); its memory is the larger of its `min-gpu-memory-mib` and that
    estimate's memory (none when neither says). Without (`own` None), as before own load was
    counted: its hint, else the policy's `inflight_gpu_load`, and its `min-gpu-memory-mib`.
    """
    if own is None:
        if pod.gpu_load_bp is None:
            return policy_load_bp, pod.memory_mib, "policy"
        return pod.gpu_load_bp, pod.memory_mib, "hint"
    estimate: OwnLoad = own_load(
        None if pod.gpu_load_bp is None else pod.gpu_load_bp / BASIS_POINTS,
        pod.expected_memory_mib,
        pod.learned,
        own.load_bp / BASIS_POINTS,
        own.memory_mib,
    )
    memory_mib = pod.memory_mib
    if estimate.memory_mib > 0 and (memory_mib is None or estimate.memory_mib > memory_mib):
        memory_mib = estimate.memory_mib
    return estimate.utilization_bp, memory_mib, estimate.utilization_source


class CountedPod(msgspec.Struct, frozen=True, gc=False):
    """One in-flight pod as a verdict counted it."""

    ref: str
    gpus: int
    allocation_pending: bool
    load_pending: bool
    load_bp: int  # utilization it is expected to add to each of its GPUs, basis points
    bound_at: datetime | None
    provisional: bool = False
    nominated: bool = False
    # Where `load_bp` came from: its hint, its workload's learned load, the own-load default
    # (`own_load` on), or the policy's `inflight_gpu_load` (`own_load` off).
    load_source: LoadSource = "policy"


class InFlight(msgspec.Struct, frozen=True, gc=False):
    """The in-flight pods a node's verdict counted, summed the ways the rules read them."""

    pods: tuple[CountedPod, ...]
    # GPUs held by pods whose allocation the node's data cannot show yet.
    allocation_gpus: int
    # GPUs of pods whose load the node's utilization cannot show yet.
    load_gpus: int
    # Sum of gpus x load over the load-pending pods: GPU-equivalents of load, basis points.
    load_bp: int
    # Sum of gpus x memory per GPU over the load-pending pods whose memory is known
    # (`pod_estimate`).
    memory_mib: int
    # Seconds until the first counted pod reaches `inflight_max_s` (inf: none will).
    left_s: float
    # Seconds since the last pod that no longer counts by time alone reached it (inf: none).
    since_s: float


def count_inflight(  # noqa: PLR0917 (one call per node judged, on the hot path)
    pods: Sequence[BoundPod],
    updated_at: datetime,
    now: datetime,
    max_s: float,
    load_delay_s: float,
    default_load_bp: int,
    own: OwnDefault | None = None,
) -> InFlight | None:
    """The pods of `pods` that the data sampled at `updated_at` cannot show, at `now`.

    Each counts with its own estimate (`pod_estimate`): `own` holds the own-load defaults when
    the policy counts a pod's own load, None when it does not (`default_load_bp` then).
    None when no pod counts and no time bound lies behind (nothing to show or to date).
    """
    counted: list[CountedPod] = []
    alloc_gpus = load_gpus = load_bp = memory_mib = 0
    left_s = since_s = math.inf
    delay = timedelta(seconds=load_delay_s)
    for pod in pods:
        if pod.gpus <= 0:
            continue
        allocation = pod.admitted_at is None or updated_at <= pod.admitted_at
        load = pod.running_since is None or updated_at < pod.running_since + delay
        if not (allocation or load):
            continue
        if pod.bound_at is not None:
            bound_s = PROVISIONAL_MAX_S if pod.provisional else max_s
            remaining_s = bound_s - (now - pod.bound_at).total_seconds()
            if remaining_s <= 0:
                since_s = min(since_s, -remaining_s)
                continue
            left_s = min(left_s, remaining_s)
        per_gpu_bp, per_gpu_mib, source = pod_estimate(pod, own, default_load_bp)
        counted.append(
            CountedPod(
                pod.ref,
                pod.gpus,
                allocation,
                load,
                per_gpu_bp,
                pod.bound_at,
                pod.provisional,
                pod.nominated,
                source,
            )
        )
        if allocation:
            alloc_gpus += pod.gpus
        if load:
            load_gpus += pod.gpus
            load_bp += pod.gpus * per_gpu_bp
            if per_gpu_mib is not None:
                memory_mib += pod.gpus * per_gpu_mib
    if not counted and since_s == math.inf:
        return None
    counted.sort(key=lambda p: p.ref)  # the pods' order in the input is the watch's, not ours
    return InFlight(tuple(counted), alloc_gpus, load_gpus, load_bp, memory_mib, left_s, since_s)


# What `count_inflight` reads besides the pods and the time: (updated_at, max_s, load_delay_s,
# default_load_bp, own).
_CountNumbers = tuple[datetime, float, float, int, OwnDefault | None]


class SharedCounts:
    """`count_inflight` of one node's pods at one instant, counted once for all the pod classes
    that count them with the same numbers. A bind, a proposal or a node's new data judges the
    node again for every active class, and most classes share their policy's numbers, so the
    count (a pass over the node's pods, a record per pod counted) is made once per change
    instead of once per class. Its results are immutable and shared by the verdicts."""

    __slots__ = ("_kept", "_now", "_pods")

    def __init__(self, pods: Sequence[BoundPod], now: datetime) -> None:
        self._pods = pods
        self._now = now
        # The count for each set of numbers asked for so far: a class or two.
        self._kept: list[tuple[_CountNumbers, InFlight | None]] = []

    def count(
        self,
        updated_at: datetime,
        max_s: float,
        load_delay_s: float,
        default_load_bp: int,
        own: OwnDefault | None,
    ) -> InFlight | None:
        """`count_inflight(pods, updated_at, now, max_s, load_delay_s, default_load_bp, own)`."""
        numbers = (updated_at, max_s, load_delay_s, default_load_bp, own)
        for known, counted in self._kept:
            if known == numbers:
                return counted
        counted = count_inflight(
            self._pods, updated_at, self._now, max_s, load_delay_s, default_load_bp, own
        )
        self._kept.append((numbers, counted))
        return counted
