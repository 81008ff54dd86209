"""Where the scorer expects kube-scheduler to bind a pod it has just answered for: a proposal.

Within a burst the next pod's filter can come before the previous pod's bind is in the Pod
watch, so each decision is recorded as a provisional placement (`core/inflight.py`,
`PodCache.propose`): the one node that passed a filter (kube-scheduler binds there without
scoring), else the top of a prioritize. Pure: what to propose, from the reply's verdicts; the
request path records it once the reply is written.
"""

from __future__ import annotations

from datetime import datetime
from typing import Final

from exporter_scheduler.core.inflight import BASIS_POINTS, BoundPod
from exporter_scheduler.core.podclass import PodClass
from exporter_scheduler.core.records import PodInput
from exporter_scheduler.serving import wire
from exporter_scheduler.serving.metrics import Verb
from exporter_scheduler.serving.verdicts import Judgement

# A prioritize whose top score is shared by more nodes than this proposes none of them: the
# scheduler's own scores pick among them, and counting the pod on each would hold them all.
MAX_PROPOSED_NODES: Final = 3
# A spread-capped pod is proposed on every tied node up to this many (a bound on the work).
MAX_CAPPED_PROPOSED_NODES: Final = 256


def spread_capped(pod_class: PodClass) -> bool:
    """Whether the pod's spread cap applies (it has one, and its hints are valid)."""
    return pod_class.hints.spread_max_per_domain is not None and pod_class.hint_problem is None


def proposes(pod: PodInput, pod_class: PodClass) -> bool:
    """Whether an answer for `pod` can propose a node for it at all: it asks for GPUs (the
    only pods in-flight accounting counts), its hints are valid (else no node passes) and it
    has a uid (what its bind is matched by)."""
    return pod.gpu_request > 0 and pod_class.hint_problem is None and bool(pod.uid)


def proposal(
    verb: Verb,
    request: wire.ExtenderRequest,
    pod_class: PodClass,
    judgement: Judgement,
    now: datetime,
) -> tuple[BoundPod, list[str]] | None:
    """The pod as it would count in flight, and the nodes to count it on; None when there is
    nothing to propose (no GPUs, a bad hint, no uid, no single or top node)."""
    pod = request.pod
    if not proposes(pod, pod_class):
        return None
    if verb == "filter":
        only = judgement.only_passed()
        nodes = [] if only is None else [only]
    else:
        # A capped pod holds a slot on every node tied at the top: the next pod of its group
        # may come before its bind is seen, and must not take the same last slot.
        capped = spread_capped(pod_class)
        nodes = judgement.top_scored(MAX_CAPPED_PROPOSED_NODES if capped else MAX_PROPOSED_NODES)
    if not nodes:
        return None
    hints = pod_class.hints
    load = hints.expected_gpu_load
    placed = BoundPod(
        namespace=pod.namespace,
        name=pod.name,
        uid=pod.uid,
        node=nodes[0],
        gpus=pod.gpu_request,
        bound_at=now,
        gpu_load_bp=None if load is None else round(load * BASIS_POINTS),
        memory_mib=hints.min_gpu_memory_mib,
        provisional=True,
        group=pod.spread_group,
        # What the pod was judged to add: it adds the same while in flight.
        workload=pod.workload,
        expected_memory_mib=hints.expected_gpu_memory_mib,
        learned=None if pod_class.own is None else pod_class.own.learned,
    )
    return placed, nodes
