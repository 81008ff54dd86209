"""Group caps: at most N pods of a group per topology domain.

A pod joins a group with the label `<prefix>spread-group: <name>` (scoped to its namespace) and
caps it with the annotations `<prefix>spread-max-per-domain` (a whole number, at least 1) and
`<prefix>spread-topology-key` (a node label; default `kubernetes.io/hostname`). A node whose
domain (its value of that label) already holds the cap of the group's pods fails; so does a node
without the label, as kube-scheduler's own spread constraint treats it. Neither can be cured by
preemption (evicting lower-priority pods frees no slot of the cap unless they are the group's own,
which have the same priority), so both go to `FailedAndUnresolvableNodes`.

The group's pods are those the Pod watch holds bound, and the scorer's own proposals (pods it
has just placed whose bind the watch has not shown yet, see `exporter_scheduler.core.inflight`): so
two pods of a group decided within one burst see each other, and cannot both take the last slot.

This is a cross-node step like the model chain, applied after the per-node verdicts: pure, a
function of (the pod's cap, the group's bound pods, the nodes' labels).
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

import msgspec

from exporter_scheduler.core.inflight import BoundPod
from exporter_scheduler.core.records import Evaluation

HOSTNAME_KEY: Final = "kubernetes.io/hostname"


@dataclass(frozen=True, slots=True)
class SpreadCap:
    """What a pod asks: at most `max_per_domain` of `group` (in `namespace`) per `topology_key`."""

    namespace: str
    group: str
    max_per_domain: int
    topology_key: str = HOSTNAME_KEY

    @property
    def full_reason(self) -> str:
        return f"spread group at most {self.max_per_domain} per {self.topology_key}"

    @property
    def unlabelled_reason(self) -> str:
        return f"node has no {self.topology_key} label"


@dataclass(frozen=True, slots=True)
class SpreadCheck:
    """The cap applied to one request's nodes, for the reply and the explanation."""

    cap: SpreadCap
    # Group pods per domain (in-flight and proposed ones included), sorted by domain.
    counts: tuple[tuple[str, int], ...]
    # Pods of the group on nodes whose domain is unknown (not counted in any domain).
    uncounted: int
    # Node -> its domain (None: the node has no such label), in request order.
    domains: tuple[tuple[str, str | None], ...]
    # Rejected nodes -> the uniform reason.
    blocked: Mapping[str, str]


LabelsOf = Callable[[str], Mapping[str, str] | None]


def domain_of(name: str, labels: Mapping[str, str] | None, key: str) -> str | None:
    """A node's domain for `key`; a node whose labels are unknown is its own hostname domain
    (kubernetes.io/hostname is the node's name unless the kubelet was told otherwise)."""
    if labels is None:
        return name if key == HOSTNAME_KEY else None
    return labels.get(key)


def check_spread(
    cap: SpreadCap,
    group_pods: Iterable[BoundPod],
    nodes: Sequence[tuple[str, Mapping[str, str] | None]],
    labels_of: LabelsOf,
) -> SpreadCheck:
    """Which of `nodes` ((name, labels) in request order) the cap rejects, given the group's
    bound pods (whose nodes' labels come from `labels_of`)."""
    key = cap.topology_key
    counts: Counter[str] = Counter()
    uncounted = 0
    # A pod proposed on several nodes (a tie at the top score) counts on each: it may take any.
    for pod in group_pods:
        domain = domain_of(pod.node, labels_of(pod.node), key)
        if domain is None:
            uncounted += 1
        else:
            counts[domain] += 1
    domains: list[tuple[str, str | None]] = []
    blocked: dict[str, str] = {}
    for name, labels in nodes:
        domain = domain_of(name, labels, key)
        domains.append((name, domain))
        if domain is None:
            blocked[name] = cap.unlabelled_reason
        elif counts[domain] >= cap.max_per_domain:
            blocked[name] = cap.full_reason
    return SpreadCheck(cap, tuple(sorted(counts.items())), uncounted, tuple(domains), blocked)


def block_evaluation(evaluation: Evaluation, blocked: Mapping[str, str]) -> Evaluation:
    """`evaluation` with the passing nodes of `blocked` rejected (unresolvable), for `explain`."""
    if not blocked:
        return evaluation
    verdicts = tuple(
        msgspec.structs.replace(
            v, passed=False, reason=blocked[v.name], unresolvable=True, score=0, breakdown=None
        )
        if v.passed and v.name in blocked
        else v
        for v in evaluation.verdicts
    )
    return dataclasses.replace(evaluation, verdicts=verdicts)
