"""A Node object as a verdict reads it: typed views that keep only what a verdict reads.

A full Node is ~7 KB; a verdict reads its name, its annotations under the prefix, its labels
(for a spread cap) and its `managedFields` entries' managers and times. The types here are built
per annotation prefix and decode just that, in C, skipping the rest; a decoded record is
hashable (`NODE_CONTENT`), so verdicts can be kept by a Node's content. Both the request decoder
(`serving.wire`) and the Node watch (`edges.nodecache`) read Nodes through them.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from datetime import datetime
from operator import attrgetter
from typing import Any, Final, Protocol

import msgspec
from msgspec import UNSET, UnsetType

from exporter_scheduler.core.records import ForeignWriter, NodeInput
from gpu_contract.schema import FIELD_MANAGER, Field, Keys, parse_timestamp


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


class NodeTypes:
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
        self.gpu_annotations = gpu
        self.node_list_struct: Any = node_list
        self.node: msgspec.json.Decoder[Any] = msgspec.json.Decoder(node)
        self.node_list: msgspec.json.Decoder[Any] = msgspec.json.Decoder(node_list)


@functools.cache
def node_types(prefix: str) -> NodeTypes:
    return NodeTypes(Keys.for_prefix(prefix))


def gpu_keys(keys: Keys) -> tuple[str, ...]:
    """The annotation keys a record holds, in the order of its fields (`record_input`)."""
    return node_types(keys.prefix).gpu_fields


def gpu_annotations_type(keys: Keys) -> Any:
    """The struct a Node's annotations under the prefix decode to (the rest are skipped)."""
    return node_types(keys.prefix).gpu_annotations


def annotations_of(gpu: Any, gpu_fields: Sequence[str]) -> dict[str, str]:
    """A decoded annotations struct as the mapping the contract reads."""
    if gpu is None:
        return {}
    values = msgspec.structs.astuple(gpu)
    return {k: v for k, v in zip(gpu_fields, values, strict=True) if v is not UNSET}


# A Node's verdict inputs, hashable: (name, GPU annotations, managedFields entries).
NODE_CONTENT: Final = attrgetter("metadata.name", "metadata.annotations", "metadata.managedFields")


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
