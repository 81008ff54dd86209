"""Verdicts packed for replies: a node's verdict for one pod class, kept with its time window and
its tally index, and a request's verdicts assembled from them.

Both modes keep a `VerdictTable` per pod class: the names-only node store by node name (kept
current by the watch thread), full-node requests by the node's content (what a verdict reads of
it), filled on the request path. A request then makes a `Judgement` of its entries: the model
chain (the one cross-node step) and the reply pieces, without a Python step per node where C
can do it (`map`, `compress`, `min` over attribute getters).
"""

from __future__ import annotations

import math
import threading
from collections import Counter
from collections.abc import Callable, Hashable, Mapping, Sequence
from datetime import datetime
from itertools import compress, repeat
from operator import and_, attrgetter, eq, ne
from typing import Any, Final, Generic, TypeVar

import msgspec

from exporter_scheduler.core.dra import ExcludedKey
from exporter_scheduler.core.inflight import SharedCounts
from exporter_scheduler.core.judge import judge_node, resolve_chain
from exporter_scheduler.core.overrides import Overrides
from exporter_scheduler.core.podclass import PodClass
from exporter_scheduler.core.records import ChainOutcome, NodeInput, NodeVerdict
from exporter_scheduler.core.validity import validity_window
from exporter_scheduler.serving.wire import encode_prioritize_reply

# Sorts after every real rank, so that `min` over entries (in C) finds the best rank.
NO_RANK: Final = 1 << 30
# A table's change log is halved when it holds this many times its entries.
_LOG_MAX_FACTOR: Final = 8

# What the owner of a table keeps per node list it was asked about (the node store's views).
ViewT = TypeVar("ViewT")
# (passed, unresolvable, reason, data_status): what the verdict counters read.
TallyKey = tuple[bool, bool, str | None, str]
# A tally index stands for a tally key and a score (0 to `MAX_SCORE`): a handful of each per
# class, so the few indexes of a request say everything its replies need, the prioritize's
# scores included, without reading a node's entry (`Judgement.scores`).
_TallyScore = tuple[bool, bool, str | None, str, int]


class Entry(msgspec.Struct, frozen=True, gc=False):
    """One node's verdict for one pod class, before the chain, as a reply needs it.

    Not tracked by the cyclic GC (it holds no cycles): there are thousands, and tracked objects
    would set off collections over the whole heap.
    """

    node: NodeInput  # the input it was judged from
    from_ts: float  # the verdict holds for POSIX times in [from_ts, until_ts)
    until_ts: float
    passed: bool
    rejected: bool
    unresolvable: bool
    reason: str | None
    passed_rank: int  # its model rank if it passed (chain active), else NO_RANK
    below_rank: int  # its model rank if at or below the chain's threshold, else NO_RANK
    # Index of its tally key and score in the table's `tally_keys` and `tally_scores` (the
    # score before the chain; ints count fastest).
    tally: int

    def holds_at(self, now_ts: float) -> bool:
        return self.from_ts <= now_ts < self.until_ts


FROM: Final = attrgetter("from_ts")
UNTIL: Final = attrgetter("until_ts")
_PASSED: Final = attrgetter("passed")
_PASSED_RANK: Final = attrgetter("passed_rank")
_BELOW_RANK: Final = attrgetter("below_rank")
TALLY: Final = attrgetter("tally")


# More distinct tally indexes than this in one request are counted in one pass (`count_ids`).
_FEW_IDS: Final = 16


def count_ids(ids: list[int]) -> dict[int, int]:
    """How many times each tally index occurs, in order of first occurrence. A request holds
    a handful of distinct ones, so one scan in C per index (`list.count`) is cheaper than a
    `Counter`, whose construction runs in Python."""
    distinct = dict.fromkeys(ids)
    if len(distinct) > _FEW_IDS:
        return dict(Counter(ids))
    return {i: ids.count(i) for i in distinct}


def all_hold(entries: Sequence[Entry], now_ts: float) -> bool:
    """Every entry's window covers `now_ts` (two passes in C)."""
    if not entries:
        return True
    latest_from: float = max(map(FROM, entries))
    earliest_until: float = min(map(UNTIL, entries))
    return latest_from <= now_ts < earliest_until


class VerdictTable(Generic[ViewT]):
    """One pod class's entries, by a key the owner chooses (a node name, or a node's content),
    and the owner's views of node lists (`ViewT`: what it keeps per list; see `views`)."""

    __slots__ = (
        "_tally_lock",
        "changes",
        "changes_base",
        "dra_entries",
        "entries",
        "epoch",
        "last_used",
        "max_from_ts",
        "min_until_ts",
        "pod_class",
        "slots",
        "tallies",
        "tally_ids",
        "tally_keys",
        "tally_row",
        "tally_scores",
        "views",
    )

    def __init__(
        self,
        pod_class: PodClass,
        *,
        log_changes: bool = False,
        slots: Mapping[Any, int] | None = None,  # keyed as `entries` are
    ) -> None:
        self.pod_class = pod_class
        # With `log_changes`, (key, entry) for each entry stored and (key, None) for each one
        # dropped, in order (`changes_base` is the position of its first item in the whole
        # log): a request that asks about the same names as an earlier one (`views`, owned by
        # the caller) only looks at what changed since.
        self.changes: list[tuple[Hashable, Entry | None]] | None = [] if log_changes else None
        self.changes_base = 0
        self.views: dict[bytes, ViewT] = {}
        self.entries: dict[Hashable, Entry] = {}
        # Each stored entry's tally index at its key's slot (`slots`, the owner's key -> a small
        # int that it reuses only after every table dropped the key; None: no entry there):
        # what a names-only filter reads per name. One list of shared small ints, gathered by
        # a list's slots in C (`NodeStore.judge`), where an entry is a cache line of its own to
        # fetch, and a dict lookup by name one more for the name itself.
        self.slots = slots
        self.tally_row: list[int | None] = []
        # The same indexes by key: what a list seen for the first time reads (`nodeslots`).
        self.tallies: dict[Hashable, int] = {}
        # DRA pods' entries (`NodeStore.judge_dra`), by node name: the last one judged, with
        # the node input and the GPUs excluded it was judged from (one tuple: a reader sees
        # the three together). Filled by requests; node, claim and taint events change what a
        # request compares them with.
        self.dra_entries: dict[str, tuple[NodeInput, ExcludedKey, Entry]] = {}
        # Bounds over every entry stored since the last `rebuild_window`: every entry in the
        # table holds for POSIX times in [max_from_ts, min_until_ts), so a request checks two
        # numbers instead of reading every entry's window (entries are scattered in memory,
        # and reading them all costs more than the rest of the request). `store` only ever
        # narrows the bounds; `rebuild_window` widens them and bumps `epoch` first, so that a
        # request that read entries across a rebuild sees the epoch change.
        self.max_from_ts = -math.inf
        self.min_until_ts = math.inf
        self.epoch = 0
        self.tally_ids: dict[_TallyScore, int] = {}
        # Append-only, by tally index (a key repeats, once per score): an entry's index is in
        # both before the entry is stored, in `tally_scores` first, so readers index them
        # without a lock.
        self.tally_keys: list[TallyKey] = []
        self.tally_scores: list[int] = []
        self.last_used = 0
        self._tally_lock = threading.Lock()

    def judge(
        self, node: NodeInput, now: datetime, now_ts: float, shared: SharedCounts | None = None
    ) -> tuple[Entry, NodeVerdict]:
        """`node`'s entry at `now` (`now_ts` its POSIX time), and the full verdict behind it;
        `shared` keeps the node's in-flight counts for the other classes it is judged for."""
        c = self.pod_class
        verdict = judge_node(node, now, c, shared)
        from_ts, until_ts = validity_window(verdict, now_ts, c)
        rank = NO_RANK if verdict.model_rank is None else verdict.model_rank
        entry = Entry(
            node,
            from_ts,
            until_ts,
            verdict.passed,
            not verdict.passed,
            verdict.unresolvable,
            verdict.reason,
            rank if verdict.passed else NO_RANK,
            rank if verdict.at_or_below_threshold else NO_RANK,
            self._tally_id(verdict),
        )
        return entry, verdict

    def store(self, key: Hashable, entry: Entry) -> None:
        """Keep `entry` (the caller holds the owner's write lock): bounds first, then the entry
        and its tally index, so that whoever reads either finds the bounds covering it."""
        self.max_from_ts = max(self.max_from_ts, entry.from_ts)
        self.min_until_ts = min(self.min_until_ts, entry.until_ts)
        self.entries[key] = entry
        self._set_tally(key, entry.tally)
        self._log(key, entry)

    def drop(self, key: Hashable) -> None:
        """Forget `key`'s entry (the caller holds the owner's write lock)."""
        self._set_tally(key, None)  # first: a reader that found the index finds the entry
        if self.entries.pop(key, None) is not None:
            self._log(key, None)

    def _set_tally(self, key: Hashable, tally: int | None) -> None:
        if tally is None:
            self.tallies.pop(key, None)
        else:
            self.tallies[key] = tally
        slot = None if self.slots is None else self.slots.get(key)
        if slot is None:  # no slot: its tally is never gathered (an owner's choice)
            return
        row = self.tally_row
        if slot >= len(row):
            if tally is None:
                return
            row.extend(repeat(None, slot + 1 - len(row)))
        row[slot] = tally

    def _log(self, key: Hashable, entry: Entry | None) -> None:
        changes = self.changes
        if changes is not None:
            changes.append((key, entry))  # after the dict: the log never runs ahead of it
            if len(changes) > _LOG_MAX_FACTOR * max(len(self.entries), 1000):
                self.epoch += 1  # a reader slicing the log across the trim sees it
                half = len(changes) // 2
                del changes[:half]
                self.changes_base += half

    def holds(self, now_ts: float, epoch: int) -> bool:
        """Every entry of the table holds at `now_ts`, by its bounds (two numbers, not every
        entry), and no rebuild has widened them since `epoch` was read."""
        return self.max_from_ts <= now_ts < self.min_until_ts and self.epoch == epoch

    def log_end(self) -> int:
        """The position after the last logged change."""
        assert self.changes is not None
        return self.changes_base + len(self.changes)

    def rebuild_window(self) -> None:
        """The bounds over the entries as they are (the caller holds the write lock)."""
        self.epoch += 1
        entries = list(self.entries.values())
        self.min_until_ts = min(map(UNTIL, entries), default=math.inf)
        self.max_from_ts = max(map(FROM, entries), default=-math.inf)

    def _tally_id(self, verdict: NodeVerdict) -> int:
        v = verdict
        tally = (v.passed, v.unresolvable, v.reason, v.data_status, v.score)
        found = self.tally_ids.get(tally)
        if found is None:
            with self._tally_lock:  # tables are judged from more than one thread
                found = self.tally_ids.get(tally)
                if found is None:
                    self.tally_scores.append(v.score)
                    self.tally_keys.append(tally[:4])
                    found = self.tally_ids[tally] = len(self.tally_keys) - 1
        return found

    def judgement(
        self,
        names: Sequence[str],
        entries: list[Entry] | None,
        judged: int,
        *,
        tally_ids: list[int] | None = None,
        counts: Mapping[int, int] | None = None,
        replies: Prepared | None = None,
        fetch: Callable[[], list[Entry]] | None = None,
        seen: int | None = None,
    ) -> Judgement:
        """A request's verdicts from its entries (in request order), or from their tally
        indexes alone with `fetch` to read the entries when a reply needs more: the chain
        resolved, the overrides (a bad hint, the chain) read. `seen`: the position in the
        change log that the entries or indexes are current to, if the table keeps one."""
        c = self.pod_class
        chain = None
        if c.chain_active:
            if entries is None:
                assert fetch is not None
                entries = fetch()
            below = min(map(_BELOW_RANK, entries), default=NO_RANK)
            passed = NO_RANK
            if below == NO_RANK:
                passed = min(map(_PASSED_RANK, entries), default=NO_RANK)
            chain = resolve_chain(
                c, None if below == NO_RANK else below, None if passed == NO_RANK else passed
            )
        overrides = Overrides(hint=c.hint_problem, chain=chain)
        return Judgement(
            names,
            entries,
            overrides,
            self.tally_keys,
            self.tally_scores,
            judged,
            tally_ids=tally_ids,
            counts=counts,
            replies=replies,
            fetch=fetch,
            seen=seen,
            table=self,
        )


class Prepared:
    """What was made from one list's entries for its replies, shared by the judgements made
    from the very same entries (a node list's view and the requests that read it): the reply
    bytes by verb, and the nodes at the top score. The prioritize kube-scheduler sends after a
    filter finds both made by `NodeStore.judge_ahead`, which reads the entries right after
    its reply, while they are still in the cache; read again at the prioritize, 450 entries
    scattered in memory cost a tenth of the request threads' CPU (docs/performance.md)."""

    __slots__ = ("bodies", "top")

    def __init__(self) -> None:
        self.bodies: dict[str, bytes] = {}
        # The nodes at the highest score above 0 after the overrides, in request order, all
        # of them however many share it (`Judgement.prepare_top`; `top_scored` cuts by its
        # `most`).
        self.top: list[str] | None = None


class Judgement:
    """One request's verdicts: the entries in request order, and what overrules them.

    A filter reads each node's tally index alone (what the counters, the passing mask and the
    rejection maps all derive from, through the few distinct tally keys), because entries are
    scattered in memory and every pass over them costs more than the work it does: without a
    chain, its entries are read only if a reply needs them (`entries`). What
    overrules the node rules (a bad hint, the chain, a spread cap) is one `Overrides`, read once
    per request into the nodes it rejects (`overruled`): every reply piece derives from that.
    """

    __slots__ = (
        "_counts",
        "_entries",
        "_fetch",
        "_ids",
        "_mask",
        "_overruled",
        "_scores",
        "judged",
        "names",
        "overrides",
        "replies",
        "seen",
        "table",
        "tally_keys",
        "tally_scores",
    )

    def __init__(  # noqa: PLR0917 (a table's parts, as `VerdictTable.judgement` holds them)
        self,
        names: Sequence[str],
        entries: list[Entry] | None,
        overrides: Overrides,
        tally_keys: list[TallyKey],
        tally_scores: list[int],
        judged: int,
        *,
        tally_ids: list[int] | None = None,
        counts: Mapping[int, int] | None = None,
        replies: Prepared | None = None,
        fetch: Callable[[], list[Entry]] | None = None,
        seen: int | None = None,
        table: VerdictTable[Any] | None = None,
    ) -> None:
        if entries is None and (tally_ids is None or fetch is None):
            raise ValueError("a judgement without entries needs their tally indexes and fetch")
        self.names = names
        # What was made from these very entries for replies, shared with whoever made it
        # (None: nothing to share); the caller fills it in.
        self.replies = replies
        self._entries = entries
        self._fetch = fetch  # reads the entries, when made from tally indexes alone
        self.overrides = overrides
        # Copies taken after the entries were read: they hold every index they carry (the
        # scores after the keys: the table appends them the other way round).
        self.tally_keys = tally_keys[:]
        self.tally_scores = tally_scores[:]
        self.judged = judged  # entries this request had to judge itself
        self._ids = tally_ids  # the entries' tally indexes, when the caller has them
        self._counts = counts  # and their counts
        # The table they were read from, and the position in its change log they are current
        # to (None: not kept): a list made from them is patched from there, in that table
        # alone (`NodeStore.judge_ahead`; a class's table can be dropped and made again).
        self.table = table
        self.seen = seen
        self._overruled: list[tuple[int, str]] | None = None
        # Made once (the filter's reply and the prioritize it prepares read the same mask;
        # the prioritize's reply and its proposal the same scores), until `block`.
        self._mask: list[bool] | None = None
        self._scores: list[int] | None = None

    @property
    def entries(self) -> list[Entry]:
        """The entries in request order. Made from tally indexes alone, they are read on first
        use (a prioritize's scores): later than the indexes, so a node stored in between shows
        its newer entry, as if its event had come a moment before this request."""
        entries = self._entries
        if entries is None:
            assert self._fetch is not None
            entries = self._entries = self._fetch()
        return entries

    @property
    def chain(self) -> ChainOutcome | None:
        return self.overrides.chain

    def block(self, blocked: Mapping[str, str]) -> None:
        """Add a spread cap's rejections (name -> reason) to the overrides. The replies made
        earlier from the same entries no longer apply."""
        if blocked:
            self.overrides = self.overrides._replace(blocked=blocked)
            self._overruled = self._mask = self._scores = None
            self.replies = None

    def tally_indexes(self) -> list[int]:
        """Per node, in request order: its entry's tally index (before the overrides)."""
        return self._tally_ids()

    def _tally_ids(self) -> list[int]:
        if self._ids is None:
            self._ids = list(map(TALLY, self.entries))
        return self._ids

    def overruled(self) -> list[tuple[int, str]]:
        """(index, reason) of the nodes the overrides reject, in request order."""
        found = self._overruled
        if found is None:
            overrides = self.overrides
            found = []
            chain = overrides.chain
            rejection = None if chain is None else chain.not_preferred
            if overrides.hint is not None:  # every node, whatever the rules said
                found = list(zip(range(len(self.names)), repeat(overrides.hint.reason)))
            elif rejection is not None and chain is not None and not overrides.blocked:
                # The chain alone: the passing nodes of the ranks it did not keep, found in C
                # (a per-node call of `Overrides.reason` cost a tenth of a names-only filter).
                entries = self.entries
                rejected = map(
                    and_,
                    map(_PASSED, entries),
                    map(ne, map(_PASSED_RANK, entries), repeat(chain.chosen_rank)),
                )
                found = list(
                    zip(compress(range(len(entries)), rejected), repeat(rejection.reason or ""))
                )
            elif overrides.active:
                why = overrides.reason
                passed_by_id = [key[0] for key in self.tally_keys]
                passed = map(passed_by_id.__getitem__, self._tally_ids())
                # A rank matters to the chain alone: without one, no entry is read.
                ranks = repeat(NO_RANK) if chain is None else map(_PASSED_RANK, self.entries)
                for i, (name, ok, rank) in enumerate(zip(self.names, passed, ranks, strict=False)):
                    reason = why(name, passed=ok, rank=rank)
                    if reason is not None:
                        found.append((i, reason))
            self._overruled = found
        return found

    def passed_mask(self) -> list[bool]:
        """Per node, in request order: does it pass, after the overrides. Not a copy."""
        mask = self._mask
        if mask is None:
            passed_by_id = [key[0] for key in self.tally_keys]
            mask = list(map(passed_by_id.__getitem__, self._tally_ids()))
            for i, _ in self.overruled():
                mask[i] = False
            self._mask = mask
        return mask

    def rejections(self) -> tuple[dict[str, str], dict[str, str]]:
        """`FailedNodes` and `FailedAndUnresolvableNodes`: the rules' rejections, then the
        overrides' (unresolvable), each in request order."""
        keys, ids = self.tally_keys, self._tally_ids()
        rejected = [not key[0] for key in keys]
        overruled = self.overruled()
        if overruled:
            rejected_here = list(map(rejected.__getitem__, ids))
            for i, _ in overruled:
                rejected_here[i] = False  # its reason is the override's
        else:
            rejected_here = list(map(rejected.__getitem__, ids))
        failed: dict[str, str] = {}
        unresolvable: dict[str, str] = {}
        for name, i in compress(zip(self.names, ids, strict=False), rejected_here):
            _, cannot_cure, reason, _ = keys[i]
            (unresolvable if cannot_cure else failed)[name] = reason or ""
        names = self.names
        for i, reason in overruled:
            unresolvable[names[i]] = reason
        return failed, unresolvable

    def scores(self) -> list[int]:
        """Per node, in request order: its score after the overrides (0 where they reject
        it), from the tally indexes alone. Not a copy."""
        scores = self._scores
        if scores is None:
            scores = list(map(self.tally_scores.__getitem__, self._tally_ids()))  # in C
            for i, _ in self.overruled():
                scores[i] = 0
            self._scores = scores
        return scores

    def prioritize_reply(self) -> bytes:
        """The bytes `wire.encode_prioritize_reply(evaluation.scores())` gives."""
        return encode_prioritize_reply(zip(self.names, self.scores(), strict=True))

    def only_passed(self) -> str | None:
        """The one node that passed, after the overrides, if exactly one did: kube-scheduler
        then binds the pod there without scoring."""
        if not self.overrides.active and self.passing() != 1:
            # Counted from the few distinct tally keys first: the common answer (many pass)
            # costs no pass over the entries.
            return None
        passed = list(compress(self.names, self.passed_mask()))
        return passed[0] if len(passed) == 1 else None

    def top_scored(self, most: int) -> list[str]:
        """The nodes with the highest score above 0 after the overrides, if at most `most`
        share it (more: the scheduler's own scores decide among them, so none is expected)."""
        top = self.prepare_top()
        return top[:] if len(top) <= most else []

    def prepare_top(self) -> list[str]:
        """Every node at the highest score above 0 after the overrides, however many share it:
        found once and kept with the prepared replies (`Prepared.top`), if any. Not a copy."""
        prepared = self.replies
        top = None if prepared is None else prepared.top
        if top is None:
            scores = self.scores()
            best = max(scores, default=0)
            top = [] if best <= 0 else list(compress(self.names, map(eq, scores, repeat(best))))
            if prepared is not None:
                prepared.top = top  # racy: any thread makes the same list of the same entries
        return top

    def passing(self) -> int:
        """How many nodes pass, after the overrides."""
        if self.overrides.active:
            return sum(self.passed_mask())
        # Without overrides, from the few distinct tally keys: no pass over the entries.
        keys = self.tally_keys
        by_id = self._counts if self._counts is not None else count_ids(self._tally_ids())
        return sum(n for i, n in by_id.items() if keys[i][0])

    def tally(self) -> dict[TallyKey, int]:
        """Node counts per `(passed, unresolvable, reason, data_status)`, after the overrides."""
        keys = self.tally_keys
        by_id = self._counts if self._counts is not None else count_ids(self._tally_ids())
        counts: dict[TallyKey, int] = {}
        for i, n in by_id.items():
            if n:  # a key repeats once per score
                counts[keys[i]] = counts.get(keys[i], 0) + n
        overruled = self.overruled()
        if overruled:
            ids = self._tally_ids()
            for i, reason in overruled:
                key = keys[ids[i]]
                counts[key] -= 1
                moved = (False, True, reason, key[3])
                counts[moved] = counts.get(moved, 0) + 1
            counts = {k: n for k, n in counts.items() if n}
        return counts
