"""The kube-scheduler extender wire format: decode what the scorer needs, encode exact replies.

kube-scheduler posts `ExtenderArgs` (Go type `k8s.io/kube-scheduler/extender/v1`, no JSON tags, so
the keys are `Pod`, `Nodes` and `NodeNames`) and reads `ExtenderFilterResult` or a
`HostPriorityList` back. A request with full Node objects is ~6 KB per node, so this module decodes
only the few fields a verdict needs, into typed msgspec structs (unknown fields are skipped without
building Python objects), and keeps each Node as the raw bytes it arrived in: the filter reply
echoes the passing Nodes byte for byte instead of re-encoding them.

Replies are deterministic bytes: maps are written with sorted keys and nodes in request order, so
the same request at the same `now` gives the same reply.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from itertools import starmap
from typing import Final, Literal, Protocol

import msgspec

from exporter_scheduler.scoring import NodeInput, PodInput
from gpu_contract.schema import FIELD_MANAGER, parse_timestamp

# --------------------------------------------------------------------------- request structs
# Field names are the Kubernetes JSON names; everything not named here is skipped by msgspec.


class _Resources(msgspec.Struct):
    requests: dict[str, str | int | float] | None = None
    limits: dict[str, str | int | float] | None = None


class _Container(msgspec.Struct):
    resources: _Resources | None = None


class _PodSpec(msgspec.Struct):
    containers: list[_Container] | None = None
    initContainers: list[_Container] | None = None  # noqa: N815 (Kubernetes JSON name)


class _ObjectMeta(msgspec.Struct):
    name: str | None = None
    namespace: str | None = None
    annotations: dict[str, str] | None = None


class _Pod(msgspec.Struct):
    metadata: _ObjectMeta | None = None
    spec: _PodSpec | None = None


class _ManagedFieldsEntry(msgspec.Struct):
    manager: str | None = None
    time: str | None = None


class _NodeMeta(msgspec.Struct):
    name: str | None = None
    annotations: dict[str, str] | None = None
    managedFields: list[_ManagedFieldsEntry] | None = None  # noqa: N815 (Kubernetes JSON name)


class _Node(msgspec.Struct):
    metadata: _NodeMeta | None = None


class _NodeList(msgspec.Struct):
    # Each item stays raw: it is decoded once more into `_Node` (skipping all but the metadata
    # we read) and echoed verbatim in the filter reply.
    items: list[msgspec.Raw] | None = None


class _Args(msgspec.Struct):
    """`ExtenderArgs` with the exact capitalised keys the scheduler sends (the fast path)."""

    Pod: _Pod | msgspec.UnsetType | None = msgspec.UNSET
    Nodes: _NodeList | msgspec.UnsetType | None = msgspec.UNSET
    # Kept raw (only delimited, not decoded): a names-only reply served from the reply cache is
    # found by these bytes and never needs the names as Python strings. `null` stays b"null".
    NodeNames: msgspec.Raw | msgspec.UnsetType = msgspec.UNSET


_ARGS_DECODER: Final = msgspec.json.Decoder(_Args)
_NODE_DECODER: Final = msgspec.json.Decoder(_Node)
_POD_DECODER: Final = msgspec.json.Decoder(_Pod)
_NODE_LIST_DECODER: Final = msgspec.json.Decoder(_NodeList)
_NAMES_DECODER: Final = msgspec.json.Decoder(list[str])
_TOP_LEVEL_DECODER: Final = msgspec.json.Decoder(dict[str, msgspec.Raw])

# --------------------------------------------------------------------------- decoded request

WireErrorCause = Literal["malformed_json", "wrong_type", "missing_pod", "bad_node", "bad_quantity"]


class WireError(ValueError):
    """The request body is not a usable `ExtenderArgs`; `cause` is a closed set for metrics."""

    def __init__(self, cause: WireErrorCause, message: str) -> None:
        super().__init__(message)
        self.cause: WireErrorCause = cause


RequestForm = Literal["nodes", "names", "none"]


@dataclass(frozen=True, slots=True)
class ExtenderRequest:
    """A decoded `ExtenderArgs`.

    `form` says which list the scheduler sent: `nodes` (full Node objects, `nodeCacheCapable:
    false`; `nodes` and `raw_nodes` are parallel), `names` (`nodeCacheCapable: true`; only
    `node_names`), or `none` (neither list, answered with an empty reply in both forms).
    `node_names_json` is the `NodeNames` value exactly as sent (names form only): the reply
    cache's key. With `decode_args(..., decode_names=False)` the names are left undecoded
    (`node_names` empty) until `with_node_names` is called.
    """

    pod: PodInput
    form: RequestForm
    nodes: tuple[NodeInput, ...] = ()
    raw_nodes: tuple[msgspec.Raw, ...] = ()
    node_names: tuple[str, ...] = ()
    node_names_json: bytes = b""


def _msg(exc: msgspec.DecodeError, where: str = "") -> str:
    text = str(exc)
    if where:
        # Nested decodes report paths relative to the piece decoded; anchor them in the body.
        text = text.replace("`$", f"`{where}")
    return text


def parse_gpu_quantity(value: str | int | float, *, resource: str) -> int:
    """A whole-number extended-resource quantity (`"1"`, `2`, `"4.0"`); anything else is refused.

    The API server only admits integer quantities for extended resources, so a fraction or a
    suffix here means the body did not come from a real scheduler.
    """
    if isinstance(value, bool):
        raise WireError("bad_quantity", f"{resource} quantity must be a whole number")
    if isinstance(value, int):
        number: float = value
    elif isinstance(value, float):
        number = value
    else:
        try:
            number = float(value.strip())
        except ValueError:
            raise WireError(
                "bad_quantity", f"{resource} quantity {value[:32]!r} is not a whole number"
            ) from None
    if not math.isfinite(number) or number < 0 or number != int(number) or number > 2**31:
        raise WireError("bad_quantity", f"{resource} quantity {value!r} is not a whole number")
    return int(number)


def _container_gpus(container: _Container, resource: str) -> int:
    resources = container.resources
    if resources is None:
        return 0
    # For extended resources requests must equal limits; a limit alone implies the request.
    for source in (resources.requests, resources.limits):
        if source is not None and resource in source:
            return parse_gpu_quantity(source[resource], resource=resource)
    return 0


def pod_gpu_request(spec: _PodSpec | None, resource: str) -> int:
    """Effective request, as the scheduler computes it: max(sum of containers, largest init)."""
    if spec is None:
        return 0
    total = sum(_container_gpus(c, resource) for c in spec.containers or ())
    largest_init = max((_container_gpus(c, resource) for c in spec.initContainers or ()), default=0)
    return max(total, largest_init)


def _pod_input(pod: _Pod, resource: str) -> PodInput:
    meta = pod.metadata or _ObjectMeta()
    return PodInput(
        namespace=meta.namespace or "",
        name=meta.name or "",
        annotations=meta.annotations or {},
        gpu_request=pod_gpu_request(pod.spec, resource),
    )


class ManagedFieldsLike(Protocol):
    """A `metadata.managedFields` entry: who changed the object, and the server's time of it."""

    @property
    def manager(self) -> str | None: ...

    @property
    def time(self) -> str | None: ...


def agent_write_time(entries: Sequence[ManagedFieldsLike] | None) -> datetime | None:
    """The API server's time of the agent's last change: the newest entry of its field manager.

    There can be more than one entry for the manager (an `Update` and an `Apply`, or a status
    subresource); the newest is the last time the server accepted a change from the agent.
    """
    newest: datetime | None = None
    for entry in entries or ():
        if entry.manager != FIELD_MANAGER or entry.time is None:
            continue
        moment = parse_timestamp(entry.time)
        if moment is not None and (newest is None or moment > newest):
            newest = moment
    return newest


def node_input_from_json(data: bytes | msgspec.Raw, *, where: str = "$") -> NodeInput:
    """Decode one Node object (from a request or a watch event) into the scorer's input."""
    try:
        node = _NODE_DECODER.decode(data)
    except msgspec.DecodeError as exc:
        cause: WireErrorCause = (
            "wrong_type" if isinstance(exc, msgspec.ValidationError) else "malformed_json"
        )
        raise WireError(cause, _msg(exc, where)) from None
    meta = node.metadata
    if meta is None or not meta.name:
        raise WireError("bad_node", f"{where} has no metadata.name")
    return NodeInput(
        name=meta.name,
        annotations=meta.annotations or {},
        agent_write_time=agent_write_time(meta.managedFields),
    )


def _case_folded_args(body: bytes) -> _Args:
    """Slow path: `ExtenderArgs` keys in any casing (`pod`, `nodeNames`), as Go accepts them."""
    try:
        top = _TOP_LEVEL_DECODER.decode(body)
    except msgspec.ValidationError as exc:
        raise WireError("wrong_type", f"request body must be a JSON object: {exc}") from None
    except msgspec.DecodeError as exc:
        raise WireError("malformed_json", f"malformed JSON: {exc}") from None
    folded: dict[str, msgspec.Raw] = {}
    for key, raw in top.items():
        # An exact spelling wins over another casing of the same key, like Go's decoder.
        lower = key.lower()
        if lower not in folded or key in ("Pod", "Nodes", "NodeNames"):
            folded[lower] = raw
    args = _Args()
    try:
        if "pod" in folded:
            pod_raw = folded["pod"]
            args.Pod = None if bytes(pod_raw) == b"null" else _POD_DECODER.decode(pod_raw)
        if "nodes" in folded:
            nodes_raw = folded["nodes"]
            args.Nodes = (
                None if bytes(nodes_raw) == b"null" else _NODE_LIST_DECODER.decode(nodes_raw)
            )
        if "nodenames" in folded:
            args.NodeNames = folded["nodenames"]
    except msgspec.DecodeError as exc:
        raise WireError("wrong_type", _msg(exc)) from None
    return args


def decode_node_names(raw: bytes | msgspec.Raw) -> tuple[str, ...]:
    """The `NodeNames` list; `WireError` (a 400 answer) when it is not a list of strings."""
    try:
        return tuple(_NAMES_DECODER.decode(raw))
    except msgspec.DecodeError as exc:
        raise WireError("wrong_type", _msg(exc, "$.NodeNames")) from None


def with_node_names(request: ExtenderRequest) -> ExtenderRequest:
    """`request` with its names decoded (see `decode_args(..., decode_names=False)`)."""
    if request.form != "names" or request.node_names:
        return request
    names = decode_node_names(request.node_names_json)
    return ExtenderRequest(
        pod=request.pod, form="names", node_names=names, node_names_json=request.node_names_json
    )


def decode_args(
    body: bytes, *, gpu_resource_name: str, decode_names: bool = True
) -> ExtenderRequest:
    """Decode an `ExtenderArgs` body; raise `WireError` (a 400 answer) when it is unusable.

    `decode_names=False` leaves a names-only request's `NodeNames` undecoded and unchecked
    (`with_node_names` decodes it, raising `WireError` then): a reply found in the reply cache
    by those bytes never needs them.
    """
    try:
        args = _ARGS_DECODER.decode(body)
    except msgspec.ValidationError as exc:
        raise WireError("wrong_type", _msg(exc)) from None
    except msgspec.DecodeError as exc:
        raise WireError("malformed_json", f"malformed JSON: {exc}") from None
    # The scheduler always sends all three keys, spelled exactly; anything else takes the
    # slower case-insensitive path.
    if msgspec.UNSET in (args.Pod, args.Nodes, args.NodeNames):
        args = _case_folded_args(body)
    if args.Pod is msgspec.UNSET or args.Pod is None:
        raise WireError("missing_pod", "request has no Pod")
    pod = _pod_input(args.Pod, gpu_resource_name)

    names_json = b"" if args.NodeNames is msgspec.UNSET else bytes(args.NodeNames)
    if names_json == b"null":
        names_json = b""
    if isinstance(args.Nodes, _NodeList):
        if names_json:
            decode_node_names(names_json)  # still a 400 when it is not a list of strings
        raws = tuple(args.Nodes.items or ())
        nodes = tuple(
            node_input_from_json(raw, where=f"$.Nodes.items[{i}]") for i, raw in enumerate(raws)
        )
        return ExtenderRequest(pod=pod, form="nodes", nodes=nodes, raw_nodes=raws)
    if names_json:
        request = ExtenderRequest(pod=pod, form="names", node_names_json=names_json)
        return with_node_names(request) if decode_names else request
    return ExtenderRequest(pod=pod, form="none")


# --------------------------------------------------------------------------- replies


class HostPriority(msgspec.Struct, gc=False):
    # Fields in sorted order, so the plain encoder writes them as `order="sorted"` would.
    Host: str
    Score: int


_ENCODER: Final = msgspec.json.Encoder(order="sorted")
# For structs whose fields are declared sorted: the same bytes, without sorting per object.
_STRUCT_ENCODER: Final = msgspec.json.Encoder()


def encode_filter_reply(
    request: ExtenderRequest,
    *,
    passed: Iterable[str],
    failed: Mapping[str, str],
    unresolvable: Mapping[str, str],
    error: str = "",
) -> bytes:
    """`ExtenderFilterResult` in the form the scheduler reads for this request.

    Full-node requests get the passing Node objects back verbatim in `Nodes.items` (in that mode
    the scheduler reads nothing else: a names-only reply counts every node as rejected); name
    requests get `NodeNames`. A `none` request gets both, empty.
    """
    tail = b"".join(
        (
            b',"FailedNodes":',
            _ENCODER.encode(failed),
            b',"FailedAndUnresolvableNodes":',
            _ENCODER.encode(unresolvable),
            b',"Error":',
            _ENCODER.encode(error),
            b"}",
        )
    )
    passed_set = passed if isinstance(passed, set | frozenset) else set(passed)
    if request.form == "nodes":
        # One join over views of the request body: the reply's Node bytes are copied once.
        parts: list[bytes | msgspec.Raw] = [b'{"Nodes":{"items":[']
        for node, raw in zip(request.nodes, request.raw_nodes, strict=True):
            if node.name in passed_set:
                parts.append(raw)
                parts.append(b",")
        if len(parts) > 1:
            parts.pop()  # the last comma
        parts.append(b']},"NodeNames":null')
        parts.append(tail)
        return b"".join(parts)
    if request.form == "names":
        names = [name for name in request.node_names if name in passed_set]
        return b'{"Nodes":null,"NodeNames":' + _ENCODER.encode(names) + tail
    return b'{"Nodes":{"items":[]},"NodeNames":[]' + tail


def encode_names_filter_reply(
    passed: list[str], *, failed: Mapping[str, str], unresolvable: Mapping[str, str]
) -> bytes:
    """A names-only `encode_filter_reply` from the passing names already in request order."""
    return b"".join(
        (
            b'{"Nodes":null,"NodeNames":',
            _ENCODER.encode(passed),
            b',"FailedNodes":',
            _ENCODER.encode(failed),
            b',"FailedAndUnresolvableNodes":',
            _ENCODER.encode(unresolvable),
            b',"Error":""}',
        )
    )


def encode_filter_error(request: ExtenderRequest | None, error: str) -> bytes:
    """A filter reply that passes nothing and carries `Error` (the scheduler shows the text)."""
    if request is None:
        return b'{"Nodes":null,"NodeNames":null,"FailedNodes":{},' + (
            b'"FailedAndUnresolvableNodes":{},"Error":' + _ENCODER.encode(error) + b"}"
        )
    return encode_filter_reply(request, passed=(), failed={}, unresolvable={}, error=error)


def encode_prioritize_reply(scores: Iterable[tuple[str, int]]) -> bytes:
    """`HostPriorityList`: one entry per node given, in request order."""
    return _STRUCT_ENCODER.encode(list(starmap(HostPriority, scores)))


def encode_host_priority(host: str, score: int) -> bytes:
    """One `HostPriorityList` entry: `encode_prioritize_reply` is `[` these joined by `,` `]`."""
    return _STRUCT_ENCODER.encode(HostPriority(host, score))


def encode_json(value: object) -> bytes:
    """Deterministic JSON (sorted keys) for the scorer's own bodies: errors, explanations."""
    return _ENCODER.encode(value)
