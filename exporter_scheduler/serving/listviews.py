"""A node list's verdicts for one pod class as a request left them (the node store's views).

kube-scheduler sends the same few node lists pod after pod in a small cluster, and a prioritize
sends the names its filter passed: a request that names a list seen before for the same class
reads only the names stored since (`ListView.patched`), not every name again.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Final

from exporter_scheduler.serving.verdicts import Entry, Prepared, VerdictTable

# A view patched with at most this many changed names finds them by scanning its list rather
# than by building the list's index (`ListView.positions`).
_FEW_CHANGES: Final = 8
# A view is patched while its class has logged at most 1/this of its list's length in changes
# since: each change costs a step in Python, where looking every name up again costs one dict
# lookup in C per name (`NodeStore.judge`), and only the changes of its own nodes are saved.
_PATCH_SHARE: Final = 8
# The index of a list that names a node twice (no scheduler sends one): such a view is not
# patched, and a request that sends it again looks every name up.
_NAMED_TWICE: Final[dict[Hashable, int]] = {}


class ListView:
    """One node list's entries for one pod class as a request left them, with the position in
    the class's change log they are current to. Immutable: a request that patches it stores a
    new one (several request threads may hold the same view)."""

    __slots__ = ("_positions", "counts", "entries", "names", "replies", "seen", "tally_ids")

    def __init__(
        self,
        names: Sequence[str],
        entries: list[Entry] | None,
        tally_ids: list[int],
        counts: dict[int, int],
        *,
        seen: int,
        positions: dict[Hashable, int] | None = None,
        replies: Prepared | None = None,
    ) -> None:
        self.names = names
        self.entries = entries  # None: a filter's, made from the tally indexes alone
        self.tally_ids = tally_ids
        self.counts = counts
        self.seen = seen
        # What was made from these entries for replies (`Judgement.replies`): the same
        # entries give the same bytes, so a view whose entries did not change keeps them.
        self.replies = Prepared() if replies is None else replies
        # Built when the view is first patched: most lists kube-scheduler sends are never sent
        # again (it samples a moving window of a large cluster), and building the index of a
        # list costs more than looking its names up.
        self._positions = positions

    @property
    def positions(self) -> dict[Hashable, int] | None:
        """Name -> its index in the list; None for a list that names a node twice."""
        positions: dict[Hashable, int] | None = self._positions
        if positions is None:
            # In C, one insertion per name. (Interning the names first, so that a changed name
            # is found by identity, cost more than the string comparisons of the few names
            # looked up.)
            names = self.names
            positions = dict(zip(names, range(len(names)), strict=True))
            if len(positions) < len(names):
                positions = _NAMED_TWICE
            self._positions = positions  # racy, and any thread builds the same index
        return None if positions is _NAMED_TWICE else positions

    def with_entries(self, entries: list[Entry]) -> ListView:
        """This view with its entries (a filter's view, made from its tally indexes alone)."""
        return ListView(
            self.names,
            entries,
            self.tally_ids,
            self.counts,
            seen=self.seen,
            positions=self._positions,
            replies=self.replies,
        )

    def patched(self, table: VerdictTable[ListView], log_end: int) -> ListView | None:
        """This view with the entries stored since `seen` (up to `log_end`, read before), or
        None when that is no cheaper than looking every name up (or a node went away)."""
        changes = table.changes
        assert changes is not None
        base = table.changes_base
        if self.seen < base or log_end - self.seen > len(self.names) // _PATCH_SHARE:
            return None
        # The latest entry of each name changed (None: dropped), in C.
        changed = dict(changes[self.seen - base : log_end - base])
        # Each changed name of this list: its latest entry, and where the list names it.
        found: list[tuple[Entry | None, Sequence[int]]]
        if self._positions is None and len(changed) <= _FEW_CHANGES:
            # A few names changed: found by scanning the list in C, without indexing it.
            found = [
                (entry, indexes)
                for name, entry in changed.items()
                if (indexes := _indexes(self.names, name))
            ]
        else:
            positions = self.positions
            if positions is None:
                return None
            found = [
                (entry, (at,))
                for name, entry in changed.items()
                if (at := positions.get(name)) is not None
            ]
        if not found:  # nothing of this list changed
            return ListView(
                self.names,
                self.entries,
                self.tally_ids,
                self.counts,
                seen=log_end,
                positions=self._positions,
                replies=self.replies,
            )
        entries = None if self.entries is None else self.entries[:]
        tally_ids = self.tally_ids[:]
        counts = dict(self.counts)
        moved = False
        for entry, where in found:
            if entry is None:  # dropped: its name is judged as unknown on the full path
                return None
            for index in where:
                old = tally_ids[index]
                if old != entry.tally:
                    moved = True
                    counts[old] -= 1
                    counts[entry.tally] = counts.get(entry.tally, 0) + 1
                    tally_ids[index] = entry.tally
                if entries is not None:
                    entries[index] = entry
        # Without entries, the replies derive from the names and their tally indexes alone
        # (each index carries the node's score): the same indexes give the same bytes.
        replies = self.replies if entries is None and not moved else None
        return ListView(
            self.names,
            entries,
            tally_ids,
            counts,
            seen=log_end,
            positions=self._positions,
            replies=replies,
        )


def _indexes(names: Sequence[str], name: Hashable) -> list[int]:
    """Every index of `name` in `names` (a scan in C per match)."""
    found: list[int] = []
    start = 0
    while True:
        try:
            start = names.index(name, start)
        except ValueError:
            return found
        found.append(start)
        start += 1
