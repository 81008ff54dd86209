"""Reading a node's annotations for a verdict, memoised on what decoding reads.

The same nodes come back in every request and the agent rewrites them at most every few
seconds, so decoding is worth memoising. With a `schema-version` present, `decode` reads only
the values of the contract's keys, so it is a pure function of (prefix, those values) and the
memo is a plain `functools.lru_cache` on that function: it changes speed, never results, and
needs no owner and no clearing. Without a version `decode` looks at every key of the prefix
(the original design's format), and the memo is bypassed.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import lru_cache
from typing import Final

from exporter_scheduler.core.records import DataStatus
from gpu_contract.schema import DecodedAnnotations, Field, Keys, decode

UNREADABLE: Final = "annotation value unreadable"
# Bounded: one entry per distinct set of values, which the agent changes at most every few
# seconds per node; this holds a 5,000-node cluster a few times over.
_DECODE_MEMO_MAX: Final = 32_768
_VERSION_INDEX: Final = tuple(Field).index(Field.SCHEMA_VERSION)


def predecode(annotations: Mapping[str, str], keys: Keys) -> DecodedAnnotations:
    """What `judge_node` reads from a node's annotations; never raises (bad data is a result).

    For a `NodeInput.predecoded` computed off the request path.
    """
    try:
        return decode(annotations, keys)
    except Exception:  # a value the contract's parser trips on is bad data, not a crash
        return DecodedAnnotations(None, (UNREADABLE,))


@lru_cache(maxsize=_DECODE_MEMO_MAX)
def decode_values(prefix: str, values: tuple[str | None, ...]) -> DecodedAnnotations:
    """`predecode` of the annotations whose contract keys (in `Field` order) hold `values`,
    for a record that has a `schema-version` (see the module docstring)."""
    keys = Keys.for_prefix(prefix)
    annotations = {
        keys[f]: value for f, value in zip(Field, values, strict=True) if value is not None
    }
    return predecode(annotations, keys)


class Decoder:
    """`predecode` for one prefix, through the memo where the record allows it."""

    __slots__ = ("key_tuple", "keys", "prefix")

    def __init__(self, keys: Keys) -> None:
        self.keys = keys
        self.prefix = keys.prefix
        self.key_tuple = tuple(keys[f] for f in Field)

    def __call__(self, annotations: Mapping[str, str]) -> DecodedAnnotations:
        values = tuple(map(annotations.get, self.key_tuple))
        if values[_VERSION_INDEX] is None:
            return predecode(annotations, self.keys)
        try:
            return decode_values(self.prefix, values)
        except TypeError:  # an unhashable value: not what the contract writes
            return predecode(annotations, self.keys)


def unreadable_status(decoded: DecodedAnnotations) -> DataStatus:
    """The data status of a record with no state: invalid when a value could not be read."""
    # The record-level problem is the last one (a version-less record notes that first).
    problems = decoded.problems
    if problems and problems[-1] in ("updated-at unparsable", UNREADABLE):
        return "invalid"
    return "missing"
