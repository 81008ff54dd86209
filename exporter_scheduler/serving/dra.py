"""DRA pods on the request path: the pod's claims looked up, each node's excluded GPUs attached,
and the verdicts' reply.

A pod asks for GPUs through DRA when one of its ResourceClaims requests a configured device
class, or, where the GPU extended resource is DRA-backed (a DeviceClass with
`extendedResourceName`), when it requests that resource. Its verdicts depend on the claims of
every other pod on each node, which change without any Node event. A node's verdict is a pure
function of (pod class, node data, the GPUs excluded for the pod, now), so in names-only mode
the node store memoises it by exactly that (`NodeStore.judge_dra`), and the request only finds
each node's excluded GPUs (`exclusions`): one dict lookup per node, because the DRA watch keeps
each node's exclusions for a pod that holds none of its GPUs and tolerates no taint
(`core.dra.base_exclusions`), which is every pod's on a node where it holds no allocation and
which has no taint to tolerate. Full-node requests judge their nodes (`core.judge.evaluate`).
No I/O: the verdict is a pure function of (pod, nodes, claims and taints, now, policy).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from itertools import repeat
from typing import Final

import msgspec

from exporter_scheduler.core.dra import (
    ClaimInfo,
    DraPod,
    ExcludedKey,
    excluded_gpus,
    held_pools,
    tolerates_any,
)
from exporter_scheduler.core.records import Evaluation, NodeInput, PodInput
from exporter_scheduler.serving import wire
from exporter_scheduler.serving.inputs import DraSource

_NO_BLOCKS: Final[Mapping[str, str]] = {}


def dra_pod(pod: PodInput, source: DraSource | None, *, extended: bool) -> PodInput:
    """`pod` with its DRA request (`dra`, and its GPU count as `gpu_request`) when it asks for
    GPUs through DRA and the watch has listed the claims; else `pod` unchanged.

    `extended`: the GPU extended resource is DRA-backed, so the pod's request for it is a
    claim the scheduler makes at binding. A claim the watch does not know yet is read from the
    ResourceClaimTemplate it was made from (the pod becomes schedulable as its claim is made,
    so kube-scheduler may ask before the claim's event arrives); one made from no template the
    watch knows counts as no GPU (the pod is judged as before the watch): the lag is one watch
    event.
    """
    if source is None or not source.claims_ready:
        return pod
    claims: list[ClaimInfo] = []
    missing: list[str] = []
    from_templates: list[str] = []
    for name in pod.claim_names:
        claim = source.claim(pod.namespace, name)
        if claim is None:
            claim = _from_template(pod, name, source)
            if claim is not None:
                from_templates.append(name)
        if claim is None:
            missing.append(name)
        elif claim.gpus > 0:
            claims.append(claim)
    extended_gpus = pod.gpu_request if extended else 0
    if not claims and not extended_gpus:
        return pod
    dra = DraPod(tuple(claims), tuple(missing), extended_gpus, tuple(from_templates))
    return msgspec.structs.replace(pod, gpu_request=dra.gpus, dra=dra)


def _from_template(pod: PodInput, name: str, source: DraSource) -> ClaimInfo | None:
    """The pod's claim `name` as the template it was made from asks it (None: made from no
    template the watch knows). Read only for a claim the watch does not know yet."""
    for claim_name, template_name in pod.claim_templates:
        if claim_name == name:
            template = source.template(pod.namespace, template_name)
            if template is None:
                return None
            return msgspec.structs.replace(template, ref=f"{pod.namespace}/{name}")
    return None


def dra_nodes(nodes: Sequence[NodeInput], source: DraSource, dra: DraPod) -> list[NodeInput]:
    """Each node with the GPUs the allocator will not give the pod (its pool is the node's
    name, as NVIDIA's driver names it)."""
    devices = source.devices
    return [
        msgspec.structs.replace(node, dra_excluded=excluded_gpus(devices(node.name), dra))
        for node in nodes
    ]


def exclusions(names: Sequence[str], source: DraSource, dra: DraPod) -> list[ExcludedKey]:
    """Per name, the GPUs the allocator will not give the pod on that node, as the node
    store's memo key: the watch's `base_exclusions`, except on the few nodes where the pod
    holds an allocation already or (its claims tolerating some taint) a device is tainted."""
    found = list(map(source.base_exclusions.get, names, repeat(source.default_exclusions)))
    own = held_pools(dra)
    tainted = source.tainted_pools() if tolerates_any(dra) else ()
    if own or tainted:
        devices = source.devices
        for index, name in enumerate(names):
            if name in own or name in tainted:
                found[index] = frozenset(excluded_gpus(devices(name), dra).items())
    return found


def dra_reply(verb: str, request: wire.ExtenderRequest, evaluation: Evaluation) -> bytes:
    """The filter or prioritize reply for `evaluation`, in the request's form."""
    if verb == "prioritize":
        return wire.encode_prioritize_reply(evaluation.scores())
    passed = [v.passed for v in evaluation.verdicts]
    if request.form == "names":
        names = [v.name for v in evaluation.verdicts if v.passed]
        return wire.encode_names_filter_reply(
            names, failed=evaluation.failed(), unresolvable=evaluation.unresolvable()
        )
    return b"".join(
        wire.filter_reply_parts(
            request, passed, failed=evaluation.failed(), unresolvable=evaluation.unresolvable()
        )
    )
