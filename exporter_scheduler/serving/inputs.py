"""What the request path reads from the caches the edges keep (namespaces, pods, workloads).

Protocols, so that `ScorerApp` depends on these reads alone and never on the watches behind
them: each is an in-memory read, with no I/O, on the request path.
"""

from __future__ import annotations

from collections.abc import Callable, Container, Mapping, Sequence
from datetime import datetime
from typing import Any, Protocol

from exporter_scheduler.core.dra import ClaimInfo, ExcludedKey, NodeDevices
from exporter_scheduler.core.inflight import BoundPod
from exporter_scheduler.core.ownload import Learned
from gpu_contract.schema import Keys


class NamespaceLabels(Protocol):
    """Namespace labels from a watch (`namespacecache.NamespaceCache`)."""

    generation: int

    def labels(self, namespace: str) -> Mapping[str, str]: ...


class Placements(Protocol):
    """Where the scorer records the placements it expects (`podcache.PodCache`)."""

    def propose(self, pod: BoundPod, nodes: Sequence[str], now: datetime) -> None: ...

    def forget(self, uid: str) -> None: ...


class LearnedLoads(Protocol):
    """Each workload's learned load per GPU (serving/workloads.py): reads, no I/O; in
    full-node mode it also records the Nodes a request carries (`observe_requested`)."""

    generation: int

    def learned_for(self, workload: str | None, now: datetime) -> Learned | None: ...

    def stamp(self, pods: tuple[BoundPod, ...], now: datetime) -> tuple[BoundPod, ...]: ...

    def stamped_pods_of(
        self, pods_of: Callable[[str], tuple[BoundPod, ...]], now: datetime
    ) -> Callable[[str], tuple[BoundPod, ...]]: ...

    def observe_requested(self, records: Sequence[Any], keys: Keys) -> int: ...


class Groups(Protocol):
    """The bound pods of each spread group (`podcache.PodCache`)."""

    @property
    def active(self) -> bool: ...

    def group_pods(self, namespace: str, group: str) -> tuple[BoundPod, ...]: ...


class DraSource(Protocol):
    """ResourceClaims and device taints from the DRA watch (`dracache.DraData`)."""

    claims_ready: bool

    @property
    def base_exclusions(self) -> Mapping[str, ExcludedKey]:
        """pool -> `core.dra.base_exclusions` of its devices, for pools that have any."""

    @property
    def default_exclusions(self) -> ExcludedKey:
        """Those of a pool not in `base_exclusions` (taint rules without a pool make some)."""

    def claim(self, namespace: str, name: str) -> ClaimInfo | None: ...

    def template(self, namespace: str, name: str) -> ClaimInfo | None:
        """What a claim made from the namespace's ResourceClaimTemplate `name` asks."""

    def tainted_pools(self) -> Container[str]: ...

    def devices(self, pool: str) -> NodeDevices: ...
