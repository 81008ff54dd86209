"""Node slots: a small int per node name, so that a filter reads its names' tally indexes by
position in one list rather than by name in a dict.

A names-only filter of a class without a chain needs only each node's tally index (which of
the class's few outcomes its verdict is). Looked up by name, each of a request's names costs a
dict probe and a string comparison, two scattered cache lines, and a filter after an idle pause
misses the cache on nearly every one. kube-scheduler sends the same few windows of names over
and over (its rotation over the cluster, while its own filters pass every node), so a window
that comes back has its slots looked up once, kept with its bytes as a gather
(`operator.itemgetter` over the slots), and applied to each class's row of tally indexes
(`VerdictTable.tally_row`) in C: one pointer array read in order.

Slots are reused: a name's slot is freed only after every table dropped its entry (which clears
the slot in each row), and freeing one bumps `epoch`, so that a gather made before is not used
for a slot that may now hold another node. Writers hold the node store's lock; readers check the
epoch around their gather (`tally_ids`).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from itertools import repeat
from operator import itemgetter
from typing import Final

# Slot 0 is never given to a node: a name without a slot gathers it, and finds None there.
_NO_SLOT: Final = 0

Gather = Callable[[list[int | None]], Sequence[int | None]]


class NodeSlots:
    """Name -> slot for the node store's nodes, and the gathers of the node lists seen."""

    __slots__ = ("_free", "_gathers", "_next", "epoch", "max_lists", "of")

    def __init__(self, *, max_lists: int) -> None:
        self.of: dict[str, int] = {}
        self.epoch = 0
        self.max_lists = max_lists
        self._free: list[int] = []
        self._next = _NO_SLOT + 1
        self._gathers: dict[bytes, tuple[int, Gather | None]] = {}

    def add(self, name: str) -> None:
        """Give `name` a slot if it has none (under the owner's write lock, before any table
        stores its entry)."""
        if name in self.of:
            return
        if self._free:
            self.of[name] = self._free.pop()
        else:
            self.of[name] = self._next
            self._next += 1

    def remove(self, name: str) -> None:
        """Free `name`'s slot (under the write lock, after every table dropped its entry)."""
        slot = self.of.pop(name, None)
        if slot is not None:
            self.epoch += 1  # before the slot can be given again: gathers made before are stale
            self._free.append(slot)

    def tally_ids(
        self,
        row: list[int | None],
        by_name: Mapping[Hashable, int],
        names: Sequence[str],
        list_key: bytes,
    ) -> list[int | None] | None:
        """Each name's tally index (None where it has no entry), or None when the slots
        changed while they were read. `row` holds the indexes by slot, `by_name` by name;
        `list_key` names the list (its bytes; b"": not kept).

        A list seen for the first time is looked up by name: many are seen once (a window
        moves on when kube-scheduler's own filters reject nodes), and making a gather costs
        more than that lookup, cold, by a third lookup per name (its slot's int). Its gather
        is made the second time it comes, and read from the third."""
        epoch = self.epoch
        kept = self._gathers.get(list_key) if list_key else None
        if kept is None or kept[0] != epoch:
            if list_key:
                if len(self._gathers) >= self.max_lists:
                    self._gathers = {}
                self._gathers[list_key] = (epoch, None)
            return list(map(by_name.get, names))
        gather = kept[1]
        if gather is None:
            gather = _gather(list(map(self.of.get, names, repeat(_NO_SLOT))))
            self._gathers[list_key] = (epoch, gather)
        try:
            ids = gather(row)
        except IndexError:  # a slot past the row's end: no entry stored there yet
            return None
        return list(ids) if self.epoch == epoch else None


def _gather(slots: list[int]) -> Gather:
    """`row -> row[slots[0]], row[slots[1]], ...` as a sequence, in C for two slots or more."""
    if len(slots) > 1:  # itemgetter of one index returns the item itself, not a tuple
        return itemgetter(*slots)
    return lambda row: [row[slot] for slot in slots]
