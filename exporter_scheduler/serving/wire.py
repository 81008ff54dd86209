"""The kube-scheduler extender wire format: decode what the scorer needs, encode exact replies.

kube-scheduler posts `ExtenderArgs` (Go type `k8s.io/kube-scheduler/extender/v1`, no JSON tags, so
the keys are `Pod`, `Nodes` and `NodeNames`) and reads `ExtenderFilterResult` or a
`HostPriorityList` back. A request with full Node objects is ~7 KB per node, so it is read in one
typed pass that builds only what a verdict reads (each Node's name, its annotations under the
prefix, its `managedFields` entries' manager and time) and skips the rest in C. A full-node filter
reply echoes the passing Nodes byte for byte; their places in the body are found by each Node's
opening as kube-scheduler (Go's encoding/json) writes it, so the echo needs no second parse, and a
body laid out any other way is read the general way (every Node delimited, then decoded).

Replies are deterministic bytes: maps are written with sorted keys and nodes in request order, so
the same request at the same `now` gives the same reply.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from itertools import compress, groupby, starmap
from operator import attrgetter
from typing import Any, Final, Literal, Protocol

import msgspec
from msgspec import UNSET, UnsetType

from exporter_scheduler.core.hints import SPREAD_GROUP_LABEL
from exporter_scheduler.core.records import ForeignWriter, NodeInput, PodInput
from exporter_scheduler.core.workload import Owner, workload_of
from gpu_contract.schema import DEFAULT_KEYS, FIELD_MANAGER, Field, Keys, parse_timestamp

# What a reply body may be made of: buffers written in order.
Buffer = bytes | bytearray | memoryview | msgspec.Raw

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


class _Owned(msgspec.Struct, frozen=True, gc=False):
    """A field a manager owns (`{}` in fieldsV1): only its presence is read."""


class _ManagedTypes:
    """`metadata.managedFields` entries typed for one annotation prefix: who changed the Node,
    the server's time of it, and which of the contract's annotation keys that manager owns
    (fieldsV1 `f:metadata.f:annotations.f:<key>`; everything else in fieldsV1 is skipped).
    Frozen, so a Node's entries stay part of its hashable verdict inputs."""

    def __init__(self, keys: Keys) -> None:
        names = {f.name.lower(): f"f:{keys[f]}" for f in Field}
        owned = msgspec.defstruct(
            "OwnedAnnotations",
            [(name, _Owned | UnsetType, UNSET) for name in names],
            rename=names,
            frozen=True,
            gc=False,
        )
        fields_metadata = msgspec.defstruct(
            "FieldsMetadata",
            [("annotations", owned | None, None)],
            rename={"annotations": "f:annotations"},
            frozen=True,
            gc=False,
        )
        fields_v1 = msgspec.defstruct(
            "FieldsV1",
            [("metadata", fields_metadata | None, None)],
            rename={"metadata": "f:metadata"},
            frozen=True,
            gc=False,
        )
        self.entry = msgspec.defstruct(
            "ManagedFieldsEntry",
            [
                ("manager", str | None, None),
                ("time", str | None, None),
                ("fieldsV1", fields_v1 | None, None),
            ],
            frozen=True,
            gc=False,
        )


def managed_fields_entry_type(keys: Keys) -> Any:
    """The struct a `metadata.managedFields` entry decodes to (see `_ManagedTypes`)."""
    return _managed_types(keys.prefix).entry


@functools.cache
def _managed_types(prefix: str) -> _ManagedTypes:
    return _ManagedTypes(Keys.for_prefix(prefix))


class _NodeTypes:
    """The typed view of a Node for one annotation prefix: its annotations under the prefix
    become a frozen (hashable) struct, so a Node's verdict inputs are one hashable tuple."""

    def __init__(self, keys: Keys) -> None:
        fields = [(f.name.lower(), str | UnsetType, UNSET) for f in Field]
        self.gpu_fields = tuple(keys[f] for f in Field)
        gpu = msgspec.defstruct(
            "GpuAnnotations",
            fields,
            rename={f.name.lower(): keys[f] for f in Field},
            frozen=True,
            gc=False,
        )
        meta = msgspec.defstruct(
            "NodeMeta",
            [
                ("name", str | None, None),
                # Only delimited: decoded by `record_labels` when a spread cap needs them.
                ("labels", msgspec.Raw | UnsetType, UNSET),
                ("annotations", gpu | None, None),
                ("managedFields", tuple[managed_fields_entry_type(keys), ...] | None, None),  # type: ignore[misc]
            ],
            gc=False,
        )
        # The other members are only delimited (kept raw), to find the Node in the body.
        node = msgspec.defstruct(
            "Node",
            [
                ("kind", msgspec.Raw | UnsetType, UNSET),
                ("apiVersion", msgspec.Raw | UnsetType, UNSET),
                ("metadata", meta | None, None),
                ("spec", msgspec.Raw | UnsetType, UNSET),
                ("status", msgspec.Raw | UnsetType, UNSET),
            ],
            gc=False,
        )
        node_list = msgspec.defstruct("NodeList", [("items", list[node] | None, None)])  # type: ignore[valid-type]
        args = msgspec.defstruct(
            "ExtenderArgs",
            [
                ("Pod", _Pod | UnsetType | None, UNSET),
                ("Nodes", node_list | UnsetType | None, UNSET),
                # Kept raw too: its bytes name the node list (`ExtenderRequest.node_names_json`).
                ("NodeNames", msgspec.Raw | UnsetType, UNSET),
            ],
        )
        self.gpu_annotations = gpu
        self.args: msgspec.json.Decoder[Any] = msgspec.json.Decoder(args)
        self.node: msgspec.json.Decoder[Any] = msgspec.json.Decoder(node)
        self.node_list: msgspec.json.Decoder[Any] = msgspec.json.Decoder(node_list)


@functools.cache
def _node_types(prefix: str) -> _NodeTypes:
    return _NodeTypes(Keys.for_prefix(prefix))


def gpu_keys(keys: Keys) -> tuple[str, ...]:
    """The annotation keys a record holds, in the order of its fields (`record_input`)."""
    return _node_types(keys.prefix).gpu_fields


def gpu_annotations_type(keys: Keys) -> Any:
    """The struct a Node's annotations under the prefix decode to (the rest are skipped)."""
    return _node_types(keys.prefix).gpu_annotations


def annotations_of(gpu: Any, gpu_fields: Sequence[str]) -> dict[str, str]:
    """A decoded annotations struct as the mapping the contract reads."""
    if gpu is None:
        return {}
    values = msgspec.structs.astuple(gpu)
    return {k: v for k, v in zip(gpu_fields, values, strict=True) if v is not UNSET}


# A Node's verdict inputs, hashable: (name, GPU annotations, managedFields entries).
NODE_CONTENT: Final = attrgetter("metadata.name", "metadata.annotations", "metadata.managedFields")


class _RawNodeList(msgspec.Struct):
    # Each item stays raw (only delimited), for the echo of a body not laid out as Go writes.
    items: list[msgspec.Raw] | None = None


class _RawArgs(msgspec.Struct):
    Pod: msgspec.Raw | UnsetType = UNSET
    Nodes: _RawNodeList | UnsetType | None = UNSET


_RAW_ARGS_DECODER: Final = msgspec.json.Decoder(_RawArgs)
_RAW_NODES_DECODER: Final = msgspec.json.Decoder(_RawNodeList)
_RAW_DECODER: Final = msgspec.json.Decoder(msgspec.Raw)
_POD_DECODER: Final = msgspec.json.Decoder(_Pod)
_NAMES_DECODER: Final = msgspec.json.Decoder(tuple[str, ...] | None)
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

    @property
    def node_count(self) -> int:
        return len(self.node_names)

    @property
    def nodes(self) -> tuple[NodeInput, ...]:
        """The full-node form's Nodes as scorer inputs (built on each call)."""
        gpu_fields = _node_types(self.keys.prefix).gpu_fields
        return tuple(record_input(r, gpu_fields) for r in self.records)

    @property
    def raw_nodes(self) -> tuple[Buffer, ...]:
        """Each Node's bytes as sent (full-node form, when asked for)."""
        return () if self.echo is None else self.echo.items()


def record_input(record: Any, gpu_fields: Sequence[str]) -> NodeInput:
    """A decoded Node record as the scorer's input."""
    meta = record.metadata
    annotations = annotations_of(meta.annotations, gpu_fields)
    entries = meta.managedFields
    return NodeInput(
        meta.name,
        annotations,
        agent_write_time(entries),
        foreign_writer=foreign_writer(entries),
    )


_LABELS: Final = msgspec.json.Decoder(dict[str, str] | None)


def record_labels(record: Any) -> dict[str, str] | None:
    """A decoded Node record's labels (None when unreadable: then the node's domain is
    unknown, which a spread cap treats as a node without the label)."""
    raw = record.metadata.labels
    if raw is UNSET:
        return {}
    try:
        return _LABELS.decode(raw) or {}
    except msgspec.DecodeError:
        return None


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


# What the pod watch decodes of a Pod's spec too (the same resource arithmetic).
PodSpec = _PodSpec


def pod_gpu_request(spec: _PodSpec | None, resource: str) -> int:
    """Effective request, as the scheduler computes it: max(sum of containers, largest init)."""
    if spec is None:
        return 0
    total = sum(_container_gpus(c, resource) for c in spec.containers or ())
    largest_init = max((_container_gpus(c, resource) for c in spec.initContainers or ()), default=0)
    return max(total, largest_init)


def _pod_input(pod: _Pod, resource: str, keys: Keys = DEFAULT_KEYS) -> PodInput:
    meta = pod.metadata or _ObjectMeta()
    labels = meta.labels
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


def foreign_writer(entries: Sequence[Any] | None) -> ForeignWriter | None:
    """The field manager other than the agent that owns one of the contract's annotation keys,
    with the server's time of its last change (the newest such manager); None when none does.

    An owner is the manager that last changed a key's value (an `Update` that sets the same
    value takes nothing over), so this is who may have set GPU data behind the agent's back.
    """
    found: ForeignWriter | None = None
    for entry in entries or ():
        if entry.manager == FIELD_MANAGER:
            continue
        fields = entry.fieldsV1
        metadata = None if fields is None else fields.metadata
        owned = None if metadata is None else metadata.annotations
        if owned is None or all(v is UNSET for v in msgspec.structs.astuple(owned)):
            continue
        moment = None if entry.time is None else parse_timestamp(entry.time)
        if found is None or (moment is not None and (found.time is None or moment > found.time)):
            found = ForeignWriter(entry.manager or "", moment)
    return found


def node_input_from_json(data: bytes | msgspec.Raw, *, keys: Keys = DEFAULT_KEYS) -> NodeInput:
    """Decode one Node object into the scorer's input (its annotations under the prefix)."""
    types = _node_types(keys.prefix)
    return record_input(_node_record(types, data, "$"), types.gpu_fields)


def _node_record(types: _NodeTypes, data: Buffer, where: str) -> Any:
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


def _case_folded_args(body: Buffer, types: _NodeTypes) -> tuple[Any, Any, Any, Buffer | None]:
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
    types = _node_types(keys.prefix)
    try:
        args = types.args.decode(body)
    except msgspec.ValidationError as exc:
        raise WireError("wrong_type", _msg(exc)) from None
    except msgspec.DecodeError as exc:
        raise WireError("malformed_json", f"malformed JSON: {exc}") from None
    pod, nodes, names_raw = args.Pod, args.Nodes, args.NodeNames  # a struct made by defstruct
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
                node_echo = _SpanEcho.find(body, records)
            if node_echo is None:
                node_echo = _raw_echo(body if nodes_raw is None else nodes_raw, nodes_raw is None)
        return ExtenderRequest(
            pod_input, "nodes", node_names, records=records, echo=node_echo, keys=keys
        )
    if names is not UNSET and names is not None:
        return ExtenderRequest(pod_input, "names", names, names_json, keys=keys)
    return ExtenderRequest(pod_input, "none", keys=keys)


# --------------------------------------------------------------------------- the Nodes' bytes


class NodeEcho(Protocol):
    """Where each Node's bytes are in the request, for the filter reply's echo."""

    def items(self) -> tuple[Buffer, ...]: ...

    def parts(self, passed: Sequence[bool]) -> list[Buffer]:
        """The passing Nodes' bytes, comma-separated, as buffers to write in order."""
        ...


class _SpanEcho:
    """Each Node's place in the body, found by its opening as Go's encoding/json writes it:
    `{` [`"kind":..,"apiVersion":..,`] `"metadata":{"name":"<name>"`, one after the other."""

    __slots__ = ("body", "ends", "starts")

    def __init__(self, body: memoryview, starts: list[int], ends: list[int]) -> None:
        self.body = body
        self.starts = starts
        self.ends = ends

    @classmethod
    def find(cls, body: Buffer, records: Sequence[Any]) -> _SpanEcho | None:
        """The places, or None when the body is not laid out as expected (read it generally).

        Checked as it goes: each opening must follow the previous Node's closing `},` (the first
        one the items' `[`), with the name the typed decode read for that Node, and the last
        Node must end exactly where the items do (`]},"NodeNames":null}`), verified by
        delimiting it. A v1.Node has no member named `metadata` below its top level, so in a
        body kube-scheduler wrote, the opening of Node i+1 can only be found where it begins.
        """
        if not isinstance(body, bytes | bytearray):
            return None
        find = body.find
        encode = _ENCODER.encode
        starts: list[int] = []
        at = 0
        for record in records:
            pattern = b'"metadata":{"name":' + encode(record.metadata.name)
            found = find(pattern, at)
            if found < 0:
                return None
            start = found - 1
            if record.kind is not UNSET or record.apiVersion is not UNSET:
                opening = _type_meta_opening(record)
                start = found - len(opening)
                if body[start:found] != opening:
                    return None
            elif body[start] != 0x7B:  # "{"
                return None
            if starts:
                if body[start - 2 : start] != b"},":
                    return None
            elif body[start - 1] != 0x5B:  # "["
                return None
            starts.append(start)
            # The next Node begins after this one's spec and status at least: no need to scan
            # them (about half of a Node's bytes).
            at = found + len(pattern)
            if record.spec is not UNSET:
                at += len(record.spec)
            if record.status is not UNSET:
                at += len(record.status)
        if not body.endswith(_ITEMS_END):
            return None
        view = memoryview(body)
        last_end = len(body) - len(_ITEMS_END)  # where the items' `]` is
        try:
            _RAW_DECODER.decode(view[starts[-1] : last_end])  # exactly one JSON value
        except msgspec.DecodeError:
            return None
        ends = [s - 1 for s in starts[1:]]
        ends.append(last_end)
        return cls(view, starts, ends)

    def items(self) -> tuple[Buffer, ...]:
        body = self.body
        return tuple(body[s:e] for s, e in zip(self.starts, self.ends, strict=True))

    def parts(self, passed: Sequence[bool]) -> list[Buffer]:
        # Consecutive passing Nodes are one slice of the body (their commas included), so the
        # reply is a few slices, not one piece per node.
        body, starts, ends = self.body, self.starts, self.ends
        runs: list[Buffer] = []
        index = 0
        for passing, group in groupby(passed):
            count = sum(1 for _ in group)
            if passing:
                runs.append(body[starts[index] : ends[index + count - 1]])
            index += count
        return _comma_separated(runs)


# The body's end after the items, as kube-scheduler writes a full-node request.
_ITEMS_END: Final = b']},"NodeNames":null}'


def _type_meta_opening(record: Any) -> bytes:
    """`{"kind":K,"apiVersion":A,` as Go writes a Node with its TypeMeta set (either may be
    omitted)."""
    opening = b"{"
    if record.kind is not UNSET:
        opening += b'"kind":' + bytes(record.kind) + b","
    if record.apiVersion is not UNSET:
        opening += b'"apiVersion":' + bytes(record.apiVersion) + b","
    return opening


class _RawEcho:
    """Each Node delimited by a second, untyped pass (a body not laid out as Go writes it)."""

    __slots__ = ("raws",)

    def __init__(self, raws: list[msgspec.Raw]) -> None:
        self.raws = raws

    def items(self) -> tuple[Buffer, ...]:
        return tuple(self.raws)

    def parts(self, passed: Sequence[bool]) -> list[Buffer]:
        return _comma_separated(list(compress(self.raws, passed)))


def _raw_echo(data: Buffer, whole_body: bool) -> _RawEcho:
    # The typed decode has accepted the same bytes, so this cannot fail.
    if whole_body:
        nodes = _RAW_ARGS_DECODER.decode(data).Nodes
        raws = [] if not isinstance(nodes, _RawNodeList) else nodes.items or []
    else:
        raws = _RAW_NODES_DECODER.decode(data).items or []
    return _RawEcho(raws)


def _comma_separated(pieces: list[Buffer]) -> list[Buffer]:
    if len(pieces) < 2:
        return pieces
    out: list[Buffer] = [b","] * (2 * len(pieces) - 1)
    out[::2] = pieces
    return out


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
