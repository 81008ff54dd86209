"""A names-only request reads each node's tally index alone, and its entries only when asked.

The node store keeps, per pod class, each node's tally index by name and at the node's
slot (`VerdictTable.tallies`, `tally_row`, `nodeslots`). An index stands for a tally key and a
score, so the filter and the prioritize of a class without a chain read those alone, and a
`Judgement` made from them reads the entries on first use (the chain, the explanation).
Replies stay the bytes a fresh `evaluate` gives (`reference`), whatever was read.
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import msgspec
import pytest

from exporter_scheduler.core.overrides import Overrides
from exporter_scheduler.core.policy import Policy
from exporter_scheduler.serving.app import ScorerApp
from exporter_scheduler.serving.nodestore import NodeStore
from exporter_scheduler.serving.verdicts import Entry, Judgement, VerdictTable
from tests.scorer.scoring_builders import A100, V100
from tests.scorer.test_nodestore import (
    NAMES,
    Clock,
    _class,
    gpu_node,
    hinted,
    names_body,
    reference,
)


class CountedEntries(dict[Any, Entry]):
    """A table's entries that count the reads a request makes of them."""

    reads = 0

    def get(self, key: Any, default: Any = None) -> Any:
        CountedEntries.reads += 1
        return super().get(key, default)

    def __getitem__(self, key: Any) -> Entry:
        CountedEntries.reads += 1
        return super().__getitem__(key)


def _store(clock: Clock) -> NodeStore:
    store = NodeStore(clock=clock)
    store.replace(
        [gpu_node(n, utilization=0.95 if n in ("n1", "n4") else 0.3, model=A100) for n in NAMES]
    )
    return store


def _counted(table: VerdictTable[Any]) -> None:
    table.entries = CountedEntries(table.entries)
    CountedEntries.reads = 0


def _in_step(table: VerdictTable[Any]) -> bool:
    """Each entry's tally index at its name's slot, and None at every other slot."""
    assert table.slots is not None
    by_slot = {table.slots[key]: entry.tally for key, entry in table.entries.items()}
    row = table.tally_row
    return (
        all(row[slot] == by_slot.get(slot) for slot in range(len(row)))
        and all(slot < len(row) for slot in by_slot)
        and table.tallies == {key: entry.tally for key, entry in table.entries.items()}
    )


def test_a_filter_and_a_prioritize_read_no_entry() -> None:
    clock = Clock()
    store = _store(clock)
    app = ScorerApp(policy=Policy(), clock=clock, node_store=store)
    first = names_body(hinted(), NAMES)
    app.handle("filter", first)  # the class's entries are judged here, on the request path
    table = store._table(_class(hinted(), app.policy))
    assert _in_step(table)
    _counted(table)
    for names in (NAMES[::-1], NAMES[1:4], ("n5", "n0", "n4")):
        body = names_body(hinted(), names)
        want, _ = reference("filter", body, store.lookup(names), clock.now, app.policy)
        assert app.handle("filter", body).body == want
    assert CountedEntries.reads == 0
    body = names_body(hinted(), ("n2", "n3"))
    want, _ = reference("prioritize", body, store.lookup(("n2", "n3")), clock.now, app.policy)
    assert app.handle("prioritize", body).body == want
    assert CountedEntries.reads == 0


def test_tally_indexes_follow_every_write() -> None:
    clock = Clock()
    store = _store(clock)
    pod_class = _class(hinted(), Policy())
    store.judge(pod_class, NAMES, clock.now)
    table = store._table(pod_class)
    store.put(gpu_node("n0", utilization=0.97))
    store.delete("n2")
    store.replace([*store.lookup(["n0", "n1", "n3", "n4", "n5"]), gpu_node("n6")])
    clock.now += timedelta(seconds=200)  # every window ends
    assert store.refresh_expired() > 0
    assert _in_step(table)
    assert "n2" not in table.slots  # type: ignore[operator]  # the store's slots, not None


def test_a_class_with_a_chain_reads_its_entries() -> None:
    """The chain ranks the nodes across the list: its classes read every entry."""
    clock = Clock()
    store = NodeStore(clock=clock)
    store.replace([gpu_node("a", model=A100, utilization=0.3), gpu_node("v", model=V100)])
    app = ScorerApp(policy=Policy(), clock=clock, node_store=store)
    preference = hinted({"gpu-model-preference": f"{A100},{V100}"})
    body = names_body(preference, ["v", "a"])
    app.handle("filter", body)
    _counted(store._table(_class(preference, app.policy)))
    assert json.loads(app.handle("filter", body).body)["NodeNames"] == ["a"]
    assert CountedEntries.reads > 0


@pytest.mark.parametrize("then", ["kept", "written", "deleted"])
def test_entries_read_after_the_indexes_are_those_stored_since(then: str) -> None:
    """A judgement's entries read after a write show it, as if the write had come a moment
    before the request; its replies are those of its own read of the tally indexes."""
    clock = Clock()
    store = _store(clock)
    policy = Policy()
    pod_class = _class(hinted(), policy)
    store.judge(pod_class, NAMES, clock.now)
    names = ("n3", "n4", "n0")
    judgement = store.judge(pod_class, names, clock.now, tallies_only=True)
    read = store.lookup(names)
    if then == "written":
        store.put(gpu_node("n3", utilization=0.99))
    elif then == "deleted":
        store.delete("n3")  # unknown now: judged without data (lenient: passes)
    assert judgement.passed_mask() == [True, False, True]
    body = names_body(hinted(), names)
    want, _ = reference("prioritize", body, read, clock.now, policy)
    assert judgement.prioritize_reply() == want
    assert [e.node.name for e in judgement.entries] == list(names)
    assert judgement.entries[0].node == store.lookup(names)[0]  # the write, or unknown


def test_a_spread_cap_over_tally_indexes_counts_as_over_entries() -> None:
    clock = Clock()
    store = _store(clock)
    pod_class = _class(hinted(), Policy())
    store.judge(pod_class, NAMES, clock.now)
    blocked = {"n0": "spread group at its cap", "n1": "spread group at its cap"}
    seen = []
    for tallies_only in (True, False):
        judgement = store.judge(pod_class, NAMES, clock.now, tallies_only=tallies_only)
        judgement.block(blocked)
        rejections = judgement.rejections()
        seen.append((judgement.passed_mask(), rejections, judgement.tally(), judgement.passing()))
    assert seen[0] == seen[1]
    mask, (failed, unresolvable), _, passing = seen[0]
    assert mask == [False, False, True, True, False, True]
    assert (sorted(failed), sorted(unresolvable), passing) == (["n1", "n4"], ["n0"], 3)


def test_a_judgement_needs_its_entries_or_a_way_to_read_them() -> None:
    with pytest.raises(ValueError, match="tally indexes and fetch"):
        Judgement(["n0"], None, Overrides(), [], [], 0, tally_ids=[0])


def test_the_prioritize_of_a_list_passed_whole_reads_no_entry() -> None:
    """A filter that passed every node prepares its prioritize under its own list's key, from
    its own tally indexes: neither reads an entry, nor does the proposal's top score."""
    clock = Clock()
    store = _store(clock)
    app = ScorerApp(policy=Policy(), clock=clock, node_store=store)
    app.handle("filter", names_body(hinted(), NAMES))  # every entry judged
    app.handle("prioritize", names_body(hinted(), ["n0", "n2"]))  # filters prepare from now on
    _counted(store._table(_class(hinted(), app.policy)))
    names = ("n5", "n3", "n2", "n0")
    body = names_body(hinted(), names)
    assert json.loads(app.handle("filter", body).body)["NodeNames"] == list(names)
    assert CountedEntries.reads == 0  # nor the preparation, after the filter's reply
    want, _ = reference("prioritize", body, store.lookup(names), clock.now, app.policy)
    assert app.handle("prioritize", body).body == want
    # What a prioritize reads beyond the reply (where it expects the pod).
    key = msgspec.json.encode(names)
    pod_class = _class(hinted(), app.policy)
    judged = store.judge(pod_class, names, clock.now, list_key=key, tallies_only=True)
    assert judged.top_scored(3) == []
    assert CountedEntries.reads == 0


def test_a_prioritize_list_keeps_no_gather_of_its_slots() -> None:
    """The slots of a window kube-scheduler sends again are kept with its bytes; a list that
    a filter prepared for its prioritize comes once, and keeps none (it would push the windows
    out of the few kept)."""
    clock = Clock()
    store = _store(clock)
    pod_class = _class(hinted(), Policy())
    store.judge(pod_class, NAMES, clock.now)  # every entry judged
    window, passed = NAMES[:4], NAMES[2:]
    window_key, passed_key = msgspec.json.encode(window), msgspec.json.encode(passed)
    store._remember_list((passed_key, passed), ahead=True)
    for names, key in ((window, window_key), (passed, passed_key)):
        store.judge(pod_class, names, clock.now, list_key=key, tallies_only=True)
    gathers = store._slots._gathers
    assert window_key in gathers
    assert passed_key not in gathers
