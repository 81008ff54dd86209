"""The kube-scheduler extender wire format: decode what the scorer needs, encode exact replies.

kube-scheduler posts `ExtenderArgs` (Go type `k8s.io/kube-scheduler/extender/v1`, no JSON tags, so
the keys are `Pod`, `Nodes` and `NodeNames`) and reads `ExtenderFilterResult` or a
`HostPriorityList` back. A request with full Node objects is ~7 KB per node, so it is read in one
typed pass that builds only what a verdict reads (each Node's name, its annotations under the
prefix, its `managedFields` entries' manager and time: `serving.nodeobjects`) and skips the rest
in C. A full-node filter reply echoes the passing Nodes byte for byte (`serving.echo` finds them in
the body).

Replies are deterministic bytes: maps are written with sorted keys and nodes in request order, so
the same request at the same `now` gives the same reply.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Mapping, Sequence
from itertools import compress, starmap
from operator import attrgetter
from typing import Any, Final, Literal

import msgspec
from msgspec import UNSET, UnsetType

from exporter_scheduler.core.hints import SPREAD_GROUP_LABEL
from exporter_scheduler.core.records import NodeInput, PodInput
from exporter_scheduler.core.workload import Owner, workload_of
from exporter_scheduler.serving.echo import (
    Buffer,
    NodeEcho,
    SpanEcho,
    raw_echo,
)
from exporter_scheduler.serving.nodeobjects import NodeTypes, node_types, record_input
from gpu_contract.schema import DEFAULT_KEYS, Keys

# --------------------------------------------------------------------------- request structs
# Field names are the Kubernetes JSON names; everything not named here is skipped by msgspec.


class _Resources(msgspec.Struct):
    requests: dict[str, str | int | float] | None = None
    limits: dict[str, str | int | float] | None = None


class _Container(msgspec.Struct):
    resources: _Resources | None = None


class _PodResourceClaim(msgspec.Struct):
    name: str = ""
    resourceClaimName: str | None = None  # noqa: N815 (Kubernetes JSON name)
    resourceClaimTemplateName: str | None = None  # noqa: N815


class _PodResourceClaimStatus(msgspec.Struct):
    name: str = ""
    resourceClaimName: str | None = None  # noqa: N815


class _PodSpec(msgspec.Struct):
    containers: list[_Container] | None = None
    initContainers: list[_Container] | None = None  # noqa: N815 (Kubernetes JSON name)
    # DRA: the pod's claims, by name or through a template (`_claims_of`).
    resourceClaims: list[_PodResourceClaim] | None = None  # noqa: N815


class _PodStatus(msgspec.Struct):
    resourceClaimStatuses: list[_PodResourceClaimStatus] | None = None  # noqa: N815


class _OwnerReference(msgspec.Struct):
    kind: str = ""
    name: str = ""
    controller: bool | None = None


class _ObjectMeta(msgspec.Struct):
    name: str | None = None
    namespace: str | None = None
    uid: str | None = None
    annotations: dict[str, str] | None = None
    labels: dict[str, str] | None = None
    # Read for the pod's workload (core/workload.py), whose running pods teach its load.
    ownerReferences: list[_OwnerReference] | None = None  # noqa: N815


class _Pod(msgspec.Struct):
    metadata: _ObjectMeta | None = None
    spec: _PodSpec | None = None
    status: _PodStatus | None = None


_POD_DECODER: Final = msgspec.json.Decoder(_Pod)
_NAMES_DECODER: Final = msgspec.json.Decoder(tuple[str, ...] | None)
_TOP_LEVEL_DECODER: Final = msgspec.json.Decoder(dict[str, msgspec.Raw])


@functools.cache
def _args_decoder(prefix: str) -> msgspec.json.Decoder[Any]:
    """`ExtenderArgs` typed for one annotation prefix (its Nodes as `nodeobjects` reads them).
    The Pod is kept raw and decoded on its own: its bytes identify it (`RecentPod`)."""
    args = msgspec.defstruct(
        "ExtenderArgs",
        [
            ("Pod", msgspec.Raw | UnsetType, UNSET),
            ("Nodes", node_types(prefix).node_list_struct | UnsetType | None, UNSET),
            # Kept raw too: its bytes name the node list (`ExtenderRequest.node_names_json`).
            ("NodeNames", msgspec.Raw | UnsetType, UNSET),
        ],
    )
    return msgspec.json.Decoder(args)


# --------------------------------------------------------------------------- decoded request

WireErrorCause = Literal["malformed_json", "wrong_type", "missing_pod", "bad_node", "bad_quantity"]


class WireError(ValueError):
    """The request body is not a usable `ExtenderArgs`; `cause` is a closed set for metrics."""

    def __init__(self, cause: WireErrorCause, message: str) -> None:
        super().__init__(message)
        self.cause: WireErrorCause = cause


RequestForm = Literal["nodes", "names", "none"]


class ExtenderRequest(msgspec.Struct, frozen=True, gc=False):
    """A decoded `ExtenderArgs` (a struct, made in C: one or two for every request).

    `form` says which list the scheduler sent: `nodes` (full Node objects, `nodeCacheCapable:
    false`), `names` (`nodeCacheCapable: true`), or `none` (neither list, answered with an empty
    reply in both forms). `node_names` are the nodes' names in request order in both forms. For
    `nodes`, `records` hold what each Node's verdict reads (`NODE_CONTENT` of a record is its
    hashable content) and `echo` the Nodes' bytes, when they were asked for.
    """

    pod: PodInput
    form: RequestForm
    node_names: tuple[str, ...] = ()
    # Names form: the `NodeNames` value byte for byte (the same bytes, the same list).
    node_names_json: bytes = b""
    records: Sequence[Any] = ()
    echo: NodeEcho | None = None
    keys: Keys = DEFAULT_KEYS
    # Names form: the `Pod` value byte for byte (the same bytes, the same `pod`).
    pod_json: bytes = b""

    @property
    def node_count(self) -> int:
        return len(self.node_names)

    @property
    def nodes(self) -> tuple[NodeInput, ...]:
        """The full-node form's Nodes as scorer inputs (built on each call)."""
        gpu_fields = node_types(self.keys.prefix).gpu_fields
        return tuple(record_input(r, gpu_fields) for r in self.records)

    @property
    def raw_nodes(self) -> tuple[Buffer, ...]:
        """Each Node's bytes as sent (full-node form, when asked for)."""
        return () if self.echo is None else self.echo.items()

    def with_names(self, names_json: bytes, names: tuple[str, ...]) -> ExtenderRequest:
        """This names-form request with its `NodeNames` bytes as the reader keeps them (equal
        bytes) and its names read."""
        return msgspec.structs.replace(self, node_names=names, node_names_json=names_json)


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
    # What the API server writes (ASCII digits), read without the float round trip: every
    # request's pod and every pod of the Pod watch's LIST comes this way.
    if type(value) is str and value.isascii() and value.isdigit() and int(value) <= 2**31:
        return int(value)
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


# What the pod watch decodes of a Pod's spec too (the same resource arithmetic).
PodSpec = _PodSpec


def pod_gpu_request(spec: _PodSpec | None, resource: str) -> int:
    """Effective request, as the scheduler computes it: max(sum of containers, largest init)."""
    if spec is None:
        return 0
    # Loops rather than generators: this runs for every request's pod.
    total = 0
    for container in spec.containers or ():
        total += _container_gpus(container, resource)
    largest_init = 0
    for container in spec.initContainers or ():
        largest_init = max(largest_init, _container_gpus(container, resource))
    return max(total, largest_init)


def _claims_of(pod: _Pod) -> tuple[tuple[str, ...], tuple[tuple[str, str], ...]]:
    """The ResourceClaims the pod uses, by name in its namespace: `resourceClaimName` as given;
    a template's claim as the resourceclaim controller named it in the pod's status (left out
    while it has not, or when it made none: kube-scheduler waits for it before filtering).
    Then (claim name, template name) of each claim made from a template."""
    spec = pod.spec
    if spec is None or not spec.resourceClaims:
        return (), ()
    made: dict[str, str] = {}
    status = pod.status
    for entry in (status.resourceClaimStatuses or ()) if status is not None else ():
        if entry.resourceClaimName:
            made[entry.name] = entry.resourceClaimName
    names: list[str] = []
    templates: list[tuple[str, str]] = []
    for claim in spec.resourceClaims:
        name = claim.resourceClaimName or made.get(claim.name)
        if name and name not in names:
            names.append(name)
            if not claim.resourceClaimName and claim.resourceClaimTemplateName:
                templates.append((name, claim.resourceClaimTemplateName))
    return tuple(names), tuple(templates)


def _pod_input(pod: _Pod, resource: str, keys: Keys = DEFAULT_KEYS) -> PodInput:
    meta = pod.metadata or _ObjectMeta()
    labels = meta.labels
    claim_names, claim_templates = _claims_of(pod)
    return PodInput(
        namespace=meta.namespace or "",
        name=meta.name or "",
        annotations=meta.annotations or {},
        gpu_request=pod_gpu_request(pod.spec, resource),
        uid=meta.uid or "",
        spread_group=None if labels is None else labels.get(keys.prefix + SPREAD_GROUP_LABEL),
        workload=workload_of(
            meta.namespace or "",
            labels,
            [
                Owner(owner.kind, owner.name, bool(owner.controller))
                for owner in meta.ownerReferences or ()
            ],
            meta.annotations,
            keys.prefix,
        ),
        claim_names=claim_names,
        claim_templates=claim_templates,
    )


def node_input_from_json(data: bytes | msgspec.Raw, *, keys: Keys = DEFAULT_KEYS) -> NodeInput:
    """Decode one Node object into the scorer's input (its annotations under the prefix)."""
    types = node_types(keys.prefix)
    return record_input(_node_record(types, data, "$"), types.gpu_fields)


def _node_record(types: NodeTypes, data: Buffer, where: str) -> Any:
    try:
        record = types.node.decode(data)
    except msgspec.DecodeError as exc:
        cause: WireErrorCause = (
            "wrong_type" if isinstance(exc, msgspec.ValidationError) else "malformed_json"
        )
        raise WireError(cause, _msg(exc, where)) from None
    _check_named([record], where)
    return record


def _check_named(records: Sequence[Any], where: str | None = None) -> tuple[str, ...]:
    """The records' names; `WireError` naming the first Node without `metadata.name`."""
    try:
        names = tuple(map(attrgetter("metadata.name"), records))
    except AttributeError:  # a Node without metadata
        names = tuple(None if r.metadata is None else r.metadata.name for r in records)
    if all(names):
        return names
    first = next(i for i, name in enumerate(names) if not name)
    at = where if where is not None else f"$.Nodes.items[{first}]"
    raise WireError("bad_node", f"{at} has no metadata.name")


def _case_folded_args(body: Buffer, types: NodeTypes) -> tuple[Any, Any, Any, Buffer | None]:
    """Slow path: `ExtenderArgs` keys in any casing (`pod`, `nodeNames`), as Go accepts them.
    Returns (pod, node list, names, the Nodes value's bytes)."""
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
    pod: Any = UNSET
    nodes: Any = UNSET
    names: Any = UNSET
    nodes_raw = folded.get("nodes")
    if nodes_raw is not None and bytes(nodes_raw) == b"null":
        nodes, nodes_raw = None, None
    try:
        if "pod" in folded:
            pod_raw = folded["pod"]
            pod = None if bytes(pod_raw) == b"null" else _POD_DECODER.decode(pod_raw)
        if nodes_raw is not None:
            nodes = types.node_list.decode(nodes_raw)
        if "nodenames" in folded:
            names = _names(folded["nodenames"], "$")
    except msgspec.DecodeError as exc:
        # Paths are relative to the piece decoded; the general decode below names them fully.
        raise WireError("wrong_type", _msg(exc)) from None
    return pod, nodes, names, nodes_raw


def _names(raw: Buffer, where: str) -> tuple[str, ...] | None:
    try:
        return _NAMES_DECODER.decode(raw)
    except msgspec.DecodeError as exc:
        raise WireError("wrong_type", _msg(exc, where)) from None


def decode_node_names(raw: bytes) -> tuple[str, ...]:
    """A `NodeNames` value (`decode_args(..., decode_names=False)`); `WireError` if it is not a
    list of strings."""
    return _names(raw, "$.NodeNames") or ()


def decode_args(
    body: Buffer,
    *,
    gpu_resource_name: str,
    keys: Keys = DEFAULT_KEYS,
    echo: bool = True,
    decode_names: bool = True,
) -> ExtenderRequest:
    """Decode an `ExtenderArgs` body; raise `WireError` (a 400 answer) when it is unusable.

    `echo=False` skips locating each Node's bytes (only a filter reply echoes them).
    `decode_names=False` leaves a names-only request's `node_names` empty and its list only
    delimited (`node_names_json`), for a caller that has seen the same bytes before
    (`decode_node_names` reads them).
    """
    types = node_types(keys.prefix)
    try:
        args = _args_decoder(keys.prefix).decode(body)
    except msgspec.ValidationError as exc:
        raise WireError("wrong_type", _msg(exc)) from None
    except msgspec.DecodeError as exc:
        raise WireError("malformed_json", f"malformed JSON: {exc}") from None
    pod_raw, nodes, names_raw = args.Pod, args.Nodes, args.NodeNames  # made by defstruct
    pod: Any = pod_raw
    pod_json = b""
    if pod_raw is not UNSET:
        pod_json = bytes(pod_raw)
        pod = None if pod_json == b"null" else _decode_pod(pod_raw)
    names: Any = UNSET
    names_json = b""
    if names_raw is not UNSET:
        names_json = bytes(names_raw)
        if not decode_names and names_json.startswith(b"["):
            names = ()  # a list, read when needed (`decode_node_names`)
        else:
            names = _names(names_raw, "$.NodeNames")
    nodes_raw: Buffer | None = None
    folded = UNSET in (pod, nodes, names)
    # The scheduler always sends all three keys, spelled exactly; anything else takes the
    # slower case-insensitive path.
    if folded:
        pod, nodes, names, nodes_raw = _case_folded_args(body, types)
    if pod is UNSET or pod is None:
        raise WireError("missing_pod", "request has no Pod")
    pod_input = _pod_input(pod, gpu_resource_name, keys)
    if nodes is not UNSET and nodes is not None:
        records = nodes.items or []
        node_names = _check_named(records)
        node_echo: NodeEcho | None = None
        if echo and records:
            if not folded:
                node_echo = SpanEcho.find(body, records)
            if node_echo is None:
                node_echo = raw_echo(body if nodes_raw is None else nodes_raw, nodes_raw is None)
        return ExtenderRequest(
            pod_input, "nodes", node_names, records=records, echo=node_echo, keys=keys
        )
    if names is not UNSET and names is not None:
        return ExtenderRequest(
            pod_input, "names", names, names_json, keys=keys, pod_json=b"" if folded else pod_json
        )
    return ExtenderRequest(pod_input, "none", keys=keys)


def _decode_pod(raw: msgspec.Raw) -> _Pod:
    try:
        pod: _Pod = _POD_DECODER.decode(raw)
    except msgspec.ValidationError as exc:
        raise WireError("wrong_type", _msg(exc, "$.Pod")) from None
    except msgspec.DecodeError as exc:  # pragma: no cover - the body as a whole decoded
        raise WireError("malformed_json", f"malformed JSON: {exc}") from None
    return pod


class _RawArgs(msgspec.Struct):
    Pod: msgspec.Raw | UnsetType = UNSET
    Nodes: msgspec.Raw | UnsetType = UNSET
    NodeNames: msgspec.Raw | UnsetType = UNSET


_RAW_ARGS_DECODER: Final = msgspec.json.Decoder(_RawArgs)


class RecentPod:
    """The pod of the last names-only filter, with the bytes it was decoded from.

    kube-scheduler's prioritize that follows a filter sends the same Pod byte for byte (one
    object, encoded again; seen in the v1.36 captures), so a prioritize whose Pod has those
    bytes takes the decoded pod rather than decoding it again: the same bytes decode to the
    same pod. Its body is only delimited, in one pass in C.
    """

    __slots__ = ("_last",)

    def __init__(self) -> None:
        self._last: tuple[bytes, PodInput] | None = None  # replaced whole: no lock needed

    def remember(self, request: ExtenderRequest) -> None:
        if request.form == "names" and request.pod_json:
            self._last = (request.pod_json, request.pod)

    def names_request(self, body: Buffer, keys: Keys) -> ExtenderRequest | None:
        """`body` as `decode_args(..., decode_names=False)` reads it, when it is a names-only
        request with the remembered pod's bytes; None for anything else (decode it whole)."""
        last = self._last
        if last is None:
            return None
        try:
            args = _RAW_ARGS_DECODER.decode(body)
        except msgspec.DecodeError:
            return None  # the whole decode says what is wrong with it
        pod, nodes, names = args.Pod, args.Nodes, args.NodeNames
        if pod is UNSET or nodes is UNSET or names is UNSET or bytes(nodes) != b"null":
            return None
        pod_json, names_json = bytes(pod), bytes(names)
        if pod_json != last[0] or not names_json.startswith(b"["):
            return None
        return ExtenderRequest(last[1], "names", (), names_json, keys=keys, pod_json=pod_json)


# --------------------------------------------------------------------------- replies


class HostPriority(msgspec.Struct, gc=False):
    # Fields in sorted order, so the plain encoder writes them as `order="sorted"` would.
    Host: str
    Score: int


_ENCODER: Final = msgspec.json.Encoder(order="sorted")
# For structs whose fields are declared sorted: the same bytes, without sorting per object.
_STRUCT_ENCODER: Final = msgspec.json.Encoder()


def filter_reply_parts(
    request: ExtenderRequest,
    passed: Sequence[bool],
    *,
    failed: Mapping[str, str],
    unresolvable: Mapping[str, str],
    error: str = "",
) -> list[Buffer]:
    """`ExtenderFilterResult` in the form the scheduler reads for this request, as buffers.

    `passed` says per node, in request order, whether it passed. Full-node requests get the
    passing Node objects back byte for byte in `Nodes.items` (in that mode the scheduler reads
    nothing else: a names-only reply counts every node as rejected), as slices of the request
    body, not copied; name requests get `NodeNames`. A `none` request gets both, empty.
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
    if request.form == "nodes":
        echoed = [] if request.echo is None else request.echo.parts(passed)
        return [b'{"Nodes":{"items":[', *echoed, b']},"NodeNames":null' + tail]
    if request.form == "names":
        names = list(compress(request.node_names, passed))
        return [b'{"Nodes":null,"NodeNames":' + _ENCODER.encode(names) + tail]
    return [b'{"Nodes":{"items":[]},"NodeNames":[]' + tail]


def encode_filter_reply(
    request: ExtenderRequest,
    *,
    passed: Iterable[str],
    failed: Mapping[str, str],
    unresolvable: Mapping[str, str],
    error: str = "",
) -> bytes:
    """`filter_reply_parts` joined, with the passing nodes given by name."""
    passed_set = passed if isinstance(passed, set | frozenset) else set(passed)
    mask = [name in passed_set for name in request.node_names]
    parts = filter_reply_parts(request, mask, failed=failed, unresolvable=unresolvable, error=error)
    return b"".join(parts)


def encode_names_filter_reply(
    passed: list[str], *, failed: Mapping[str, str], unresolvable: Mapping[str, str]
) -> bytes:
    """A names-only filter reply from the passing names already in request order."""
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
    nothing = [False] * request.node_count
    return b"".join(filter_reply_parts(request, nothing, failed={}, unresolvable={}, error=error))


def encode_prioritize_reply(scores: Iterable[tuple[str, int]]) -> bytes:
    """`HostPriorityList`: one entry per node given, in request order."""
    return _STRUCT_ENCODER.encode(list(starmap(HostPriority, scores)))


def encode_host_priority(host: str, score: int) -> bytes:
    """One `HostPriorityList` entry: `encode_prioritize_reply` is `[` these joined by `,` `]`."""
    return _STRUCT_ENCODER.encode(HostPriority(host, score))


def encode_json(value: object) -> bytes:
    """Deterministic JSON (sorted keys) for the scorer's own bodies: errors, explanations."""
    return _ENCODER.encode(value)
