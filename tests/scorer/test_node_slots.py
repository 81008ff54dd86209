"""Node slots and the lists kept by their bytes: a filter gathers its names' tally indexes by
slot, and a window sent again is keyed by the bytes object first seen.

Slots are reused, so a gather made before a slot changed hands must not be read: these cases
free and give slots while a list's gather is kept (and while one is being read), and compare
the replies with a fresh `evaluate` (`reference`).
"""

from __future__ import annotations

import itertools
import json

import pytest

from exporter_scheduler.core.policy import Policy
from exporter_scheduler.serving import wire
from exporter_scheduler.serving.app import ScorerApp
from exporter_scheduler.serving.nodeslots import NodeSlots
from exporter_scheduler.serving.nodestore import NodeStore
from tests.scorer.test_nodestore import (
    NAMES,
    Clock,
    _class,
    gpu_node,
    hinted,
    names_body,
    reference,
)


def _names_json(names: tuple[str, ...]) -> bytes:
    return json.dumps(list(names), separators=(",", ":")).encode()


@pytest.mark.parametrize("order", ["swapped", "same"])
def test_a_list_sent_again_after_its_nodes_changed_slots_reads_each_nodes_own_verdict(
    order: str,
) -> None:
    clock = Clock()
    store = NodeStore(clock=clock)
    store.replace(gpu_node(n, utilization=0.3) for n in NAMES)
    app = ScorerApp(policy=Policy(), clock=clock, node_store=store)
    names = ("n4", "n1", "n2", "n5")
    body = names_body(hinted(), names)
    app.handle("filter", body)  # judged on the request path: its gather is kept
    app.handle("filter", body)
    slots = dict(store._slots.of)
    store.delete("n1")
    store.delete("n2")
    # Re-added, each the other's old slot ("swapped") or its own again ("same"), and now
    # with verdicts of their own: a gather read with the old slots would swap them.
    again = [("n1", 0.3), ("n2", 0.97)]
    for name, utilization in again if order == "swapped" else reversed(again):
        store.put(gpu_node(name, utilization=utilization))
    moved = store._slots.of["n1"] != slots["n1"]
    assert moved == (order == "swapped")
    want, _ = reference("filter", body, store.lookup(names), clock.now, app.policy)
    assert app.handle("filter", body).body == want
    assert json.loads(want)["NodeNames"] == ["n4", "n1", "n5"]


def _slots(*names: str) -> NodeSlots:
    slots = NodeSlots(max_lists=4)
    for name in names:
        slots.add(name)
    return slots


def test_a_list_is_read_by_name_the_first_time_and_by_its_slots_after() -> None:
    slots = _slots("a", "b")
    row: list[int | None] = [None, 7, 8]
    key = _names_json(("b", "a"))
    # `by_name` empty: what comes from it reads as no entry, what comes from the row does not.
    assert slots.tally_ids(row, {}, ("b", "a"), key) == [None, None]
    assert slots.tally_ids(row, {}, ("b", "a"), key) == [8, 7]  # the gather, made now
    slots.of.clear()  # not read again: the list's gather is kept with its bytes
    assert slots.tally_ids([None, 5, 6], {}, ("b", "a"), key) == [6, 5]
    assert slots.tally_ids(row, {"a": 7}, ("b", "a"), b"") == [None, 7]  # a list not kept


def test_a_gather_made_before_a_slot_changed_hands_is_made_again() -> None:
    slots = _slots("a", "b", "c")
    row: list[int | None] = [None, 10, 11, 12]
    by_name = {"a": 10, "b": 11, "c": 12}
    key = _names_json(("c", "a"))
    for _ in range(3):
        assert slots.tally_ids(row, by_name, ("c", "a"), key) == [12, 10]
    slots.remove("a")
    slots.add("d")  # a's slot, given to d
    row[slots.of["d"]] = 13
    del by_name["a"]
    by_name["d"] = 13
    for _ in range(3):  # by name, then by the slots as they are now
        assert slots.tally_ids(row, by_name, ("c", "a"), key) == [12, None]
    assert slots.tally_ids(row, by_name, ("d",), b"") == [13]


def test_a_slot_freed_while_a_list_is_gathered_gives_no_answer() -> None:
    slots = _slots("a", "b")
    key = _names_json(("a", "b"))
    for _ in range(2):
        assert slots.tally_ids([None, 1, 2], {"a": 1, "b": 2}, ("a", "b"), key) == [1, 2]

    class Row(list[int | None]):
        def __getitem__(self, index: object) -> int | None:  # type: ignore[override]
            if slots.of.get("b") is not None:
                slots.remove("b")  # another thread's delete, between two reads
            return super().__getitem__(index)  # type: ignore[index]

    assert slots.tally_ids(Row([None, 1, 2]), {"a": 1, "b": 2}, ("a", "b"), key) is None


def test_a_row_that_ends_before_a_slot_reads_as_no_entry() -> None:
    slots = _slots("a", "b")
    key = _names_json(("a", "b"))
    assert slots.tally_ids([None, 7], {"a": 7}, ("a", "b"), key) == [7, None]
    assert slots.tally_ids([None, 7], {"a": 7}, ("a", "b"), key) is None
    key = _names_json(("b", "a", "unknown"))
    assert slots.tally_ids([None, 7, 8], {}, ("b", "a", "unknown"), key) == [None] * 3  # by name
    # By slot: an unknown name has none, and reads slot 0, where no node is.
    assert slots.tally_ids([None, 7, 8], {}, ("b", "a", "unknown"), key) == [8, 7, None]


def test_a_list_sent_again_is_keyed_by_the_bytes_first_seen() -> None:
    """Equal bytes in a new object (each request's own): the store answers with the object it
    keeps, so that the view and gather lookups after it match by identity."""
    store = NodeStore(clock=Clock())
    store.replace(gpu_node(n) for n in NAMES)
    decoded: list[bytes] = []

    def decode(raw: bytes) -> tuple[str, ...]:
        decoded.append(raw)
        return wire.decode_node_names(raw)

    first = _names_json(NAMES[:3])
    again = bytes(bytearray(first))
    assert again is not first
    assert store.list_names(first, decode) == (first, NAMES[:3])
    key, names = store.list_names(again, decode)
    assert key is first
    assert names == NAMES[:3]
    assert decoded == [first]


def test_the_lists_prepared_for_prioritizes_do_not_push_the_windows_out() -> None:
    clock = Clock()
    store = NodeStore(clock=clock)
    store.replace(gpu_node(n, utilization=0.3) for n in NAMES)
    pod_class = _class(hinted(), Policy())
    windows = [_names_json(NAMES[i:] + NAMES[:i]) for i in range(len(NAMES))]
    for window in windows:
        store.list_names(window, wire.decode_node_names)
    # A prioritize's list per pod, each new (every node passes: the list is the filter's).
    for names in itertools.islice(itertools.permutations(NAMES), 300):
        store.judge_ahead(pod_class, store.judge(pod_class, names, clock.now), clock.now)

    def refuse(raw: bytes) -> tuple[str, ...]:
        raise AssertionError(f"decoded again: {raw!r}")

    for window in windows:
        assert store.list_names(bytes(bytearray(window)), refuse)[0] is window
