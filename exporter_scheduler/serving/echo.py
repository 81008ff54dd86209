"""A full-node filter reply's echo: where each Node's bytes are in the request body.

kube-scheduler reads the passing Nodes back from a full-node filter reply, so the reply repeats
their bytes as sent. `SpanEcho` finds each Node by its opening as kube-scheduler (Go's
encoding/json) writes it, with no second parse; a body laid out any other way is delimited
generally (`raw_echo`). Either way the reply is a few slices of the request, written in order.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import compress, groupby
from typing import Any, Final, Protocol

import msgspec
from msgspec import UNSET, UnsetType

# What a reply body may be made of: buffers written in order.
Buffer = bytes | bytearray | memoryview | msgspec.Raw
# A Node's name as Go writes it in a JSON string (the same escapes as the reply's).
_NAME_ENCODER: Final = msgspec.json.Encoder(order="sorted")


class _RawNodeList(msgspec.Struct):
    # Each item stays raw (only delimited), for the echo of a body not laid out as Go writes.
    items: list[msgspec.Raw] | None = None


class _RawArgs(msgspec.Struct):
    Pod: msgspec.Raw | UnsetType = UNSET
    Nodes: _RawNodeList | UnsetType | None = UNSET


_RAW_ARGS_DECODER: Final = msgspec.json.Decoder(_RawArgs)
_RAW_NODES_DECODER: Final = msgspec.json.Decoder(_RawNodeList)
_RAW_DECODER: Final = msgspec.json.Decoder(msgspec.Raw)


class NodeEcho(Protocol):
    """Where each Node's bytes are in the request, for the filter reply's echo."""

    def items(self) -> tuple[Buffer, ...]: ...

    def parts(self, passed: Sequence[bool]) -> list[Buffer]:
        """The passing Nodes' bytes, comma-separated, as buffers to write in order."""
        ...


class SpanEcho:
    """Each Node's place in the body, found by its opening as Go's encoding/json writes it:
    `{` [`"kind":..,"apiVersion":..,`] `"metadata":{"name":"<name>"`, one after the other."""

    __slots__ = ("body", "ends", "starts")

    def __init__(self, body: memoryview, starts: list[int], ends: list[int]) -> None:
        self.body = body
        self.starts = starts
        self.ends = ends

    @classmethod
    def find(cls, body: Buffer, records: Sequence[Any]) -> SpanEcho | None:
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
        encode = _NAME_ENCODER.encode
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
        if not body.endswith(ITEMS_END):
            return None
        view = memoryview(body)
        last_end = len(body) - len(ITEMS_END)  # where the items' `]` is
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
        return comma_separated(runs)


# The body's end after the items, as kube-scheduler writes a full-node request.
ITEMS_END: Final = b']},"NodeNames":null}'


def _type_meta_opening(record: Any) -> bytes:
    """`{"kind":K,"apiVersion":A,` as Go writes a Node with its TypeMeta set (either may be
    omitted)."""
    opening = b"{"
    if record.kind is not UNSET:
        opening += b'"kind":' + bytes(record.kind) + b","
    if record.apiVersion is not UNSET:
        opening += b'"apiVersion":' + bytes(record.apiVersion) + b","
    return opening


class RawEcho:
    """Each Node delimited by a second, untyped pass (a body not laid out as Go writes it)."""

    __slots__ = ("raws",)

    def __init__(self, raws: list[msgspec.Raw]) -> None:
        self.raws = raws

    def items(self) -> tuple[Buffer, ...]:
        return tuple(self.raws)

    def parts(self, passed: Sequence[bool]) -> list[Buffer]:
        return comma_separated(list(compress(self.raws, passed)))


def raw_echo(data: Buffer, whole_body: bool) -> RawEcho:
    # The typed decode has accepted the same bytes, so this cannot fail.
    if whole_body:
        nodes = _RAW_ARGS_DECODER.decode(data).Nodes
        raws = [] if not isinstance(nodes, _RawNodeList) else nodes.items or []
    else:
        raws = _RAW_NODES_DECODER.decode(data).items or []
    return RawEcho(raws)


def comma_separated(pieces: list[Buffer]) -> list[Buffer]:
    if len(pieces) < 2:
        return pieces
    out: list[Buffer] = [b","] * (2 * len(pieces) - 1)
    out[::2] = pieces
    return out
