"""Names-only mode's node data: every Node's inputs and, per active pod class, each node's verdict
with its encoded reply fragment, kept current off the request path.

Writers (the node cache's watch thread for each event, its expiry timer when a verdict's time
window ends) judge the changed node for every active pod class. A request then only looks its
names up, resolves the model chain (the one cross-node step, `judge.resolve_chain`) and joins
the pre-encoded fragments. Replies are the bytes `evaluate` gives for the same node data at the
same `now`, because an entry is a pure function of (node, class, time window) and a request uses
an entry only while its window covers `now` (judging any other node itself).

Threads. Every write (`put`, `delete`, `replace`, `refresh_expired`, a request storing what it
had to judge) holds `_lock`, and keeps the invariant: a class's entry for a name was judged from
the `NodeInput` the store holds for that name now. Requests read without the lock. Under the
GIL a single dict store or get is atomic, and entries are immutable, so a request sees each
node's entry whole, either before or after a concurrent write: the same as reading the node
cache a moment earlier or later, which is what a request may see anyway. An entry is used only
if its window covers the request's own `now`: the table's bounds over all its entries say so in
one comparison (writers narrow them before storing an entry, and bump an epoch before widening
them, which the request checks; `VerdictTable.store`), else each entry read is checked; so an
entry a writer judged at another clock than the request's is still used only where it is right.
A free-threaded Python (no GIL) would need a lock around the request's reads.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import UTC, datetime
from functools import partial
from itertools import compress, repeat
from operator import eq, is_, itemgetter, not_
from types import MappingProxyType
from typing import Final

import msgspec

from exporter_scheduler.core.dra import ExcludedKey
from exporter_scheduler.core.inflight import NO_PODS, BoundPod, SharedCounts
from exporter_scheduler.core.podclass import PodClass, PodClassKey
from exporter_scheduler.core.records import NodeInput, NodeVerdict, as_utc, with_pods
from exporter_scheduler.serving.inputs import LearnedLoads
from exporter_scheduler.serving.listviews import ListView
from exporter_scheduler.serving.logfields import describe_pod_class, rejection_fields
from exporter_scheduler.serving.nodeslots import NodeSlots
from exporter_scheduler.serving.verdicts import (
    TALLY,
    Entry,
    Judgement,
    VerdictTable,
    all_hold,
    count_ids,
)

log = logging.getLogger("exporter_scheduler.nodestore")

# Pod classes kept (an LRU, learned from requests): a few in practice (pods differ in hints and
# GPU count), each ~200 bytes per node.
DEFAULT_MAX_CLASSES: Final = 16
# Node lists remembered per pod class, and their names and slots (kube-scheduler's window of a
# large cluster comes back every few pods: at 5,000 nodes its 500-name window every 10th pod;
# at 500 nodes, its 230-name window every 50th). At 5,000 nodes and nine classes they held 3.3
# MiB more than 8 and 64 did (docs/performance.md).
_VIEWS_PER_CLASS: Final = 32
_LISTS_KEPT: Final = 128
# The lists `judge_ahead` prepared, each asked about by the one prioritize that follows.
_AHEAD_KEPT: Final = 8
_NO_ANNOTATIONS: Final[Mapping[str, str]] = MappingProxyType({})
# A name without a DRA entry (`NodeStore.judge_dra`): matches no node, its entry never read.
_NOT_KEPT: Final = (None, None, None)
_DRA_STAMP: Final = itemgetter(0, 1)
_DRA_ENTRY: Final = itemgetter(2)

Clock = Callable[[], datetime]
# A node list as the store keeps it: its `NodeNames` bytes (the object lists are keyed by) and
# its names.
KnownList = tuple[bytes, tuple[str, ...]]


def utc_now() -> datetime:
    return datetime.now(UTC)


class NodeStore:
    """Name -> `NodeInput` for every Node, plus per active pod class each node's `Entry`.

    See the module docstring for who writes and why readers need no lock.
    """

    def __init__(
        self,
        *,
        clock: Clock = utc_now,
        max_classes: int = DEFAULT_MAX_CLASSES,
        learned: LearnedLoads | None = None,
    ) -> None:
        if max_classes < 1:
            raise ValueError("a node store keeps at least one pod class")
        self.clock = clock
        # Each bound pod is stamped with its workload's learned load when its node's pods are
        # set (`WorkloadLoads.stamp`): what an in-flight pod adds, short of its hints.
        self.learned = learned
        self.max_classes = max_classes
        self._nodes: dict[str, NodeInput] = {}
        # The GPU pods bound to each node (the pod watch's `set_pods`), merged into the node's
        # `NodeInput` whenever either changes, so that entries are judged with them.
        self._pods: dict[str, tuple[BoundPod, ...]] = {}
        self._tables: dict[PodClassKey, VerdictTable[ListView]] = {}
        self._lock = threading.Lock()
        self._synced = False
        self._uses = 0
        # By a list's bytes: those bytes as first seen, and its names. Later requests use that
        # bytes object as the list's key (`list_names`), so that each further lookup by it
        # (views, gathers) matches by identity, where equal bytes compare all 4 KB of a
        # 230-name list, cold, at every lookup. Windows and the lists `judge_ahead` prepares
        # are kept apart: each of those is asked about once, and would push the windows out.
        self._lists: dict[bytes, KnownList] = {}
        self._ahead: dict[bytes, KnownList] = {}
        self._slots = NodeSlots(max_lists=_LISTS_KEPT)

    # ------------------------------------------------------------------ reads (any thread)
    def ready(self) -> bool:
        """True once a full list of the nodes has been given (`replace`)."""
        return self._synced

    def __len__(self) -> int:
        return len(self._nodes)

    def names(self) -> list[str]:
        return sorted(self._nodes)

    def classes(self) -> int:
        return len(self._tables)

    def entries(self) -> int:
        """Entries over all pod classes (memory, tests)."""
        return sum(len(t.entries) for t in list(self._tables.values()))

    def lookup(self, names: Sequence[str]) -> list[NodeInput]:
        """One `NodeInput` per name, in order; an unknown name gets one with no annotations."""
        nodes = self._nodes
        found = list(map(nodes.get, names))  # in C: one snapshot for the whole list
        if any(map(is_, found, repeat(None))):
            return [
                node or NodeInput(name, _NO_ANNOTATIONS, None)
                for node, name in zip(found, names, strict=True)
            ]
        return found  # type: ignore[return-value]  # no None left

    def list_names(self, list_key: bytes, decode: Callable[[bytes], tuple[str, ...]]) -> KnownList:
        """The node list `list_key` (a request's `NodeNames` bytes): the same bytes as the
        store keys the list by, and its names, `decode`d once per list, then remembered (the
        scheduler repeats its few lists)."""
        known = self._lists.get(list_key) or self._ahead.get(list_key)
        if known is None:
            # Not interned: most lists are new (kube-scheduler's window moves pod after pod),
            # and interning a name costs more than the lookups it would speed up.
            known = (list_key, tuple(decode(list_key)))
            self._remember_list(known)
        return known

    def judge(
        self,
        pod_class: PodClass,
        names: Sequence[str],
        now: datetime,
        *,
        list_key: bytes = b"",
        tallies_only: bool = False,
    ) -> Judgement:
        """The verdicts of `names` for `pod_class` at `now`, as `evaluate` gives them.

        `list_key` names the node list (the request's `NodeNames` bytes: the same key must mean
        the same names in the same order). A list asked about before for this class is not
        looked up name by name again: its last entries are patched with the names stored since.
        `tallies_only`: the caller reads the verdicts' tally indexes alone (a filter's reply
        and a prioritize's both derive from them, the scores included), so a class without a
        chain reads no entry while its bounds say that every entry holds.
        """
        now = as_utc(now)
        now_ts = now.timestamp()
        table = self._table(pod_class)
        self._uses += 1  # a racy counter is fine: it only orders the LRU
        table.last_used = self._uses
        epoch = table.epoch  # read before anything of the table (see VerdictTable.store)
        seen = table.log_end()
        view = table.views.get(list_key) if list_key else None
        if view is not None:
            patched = view.patched(table, seen)
            if patched is not None and table.holds(now_ts, epoch):
                if patched.entries is None and not tallies_only:
                    # A filter's list, asked for its entries (the prioritize of a filter that
                    # passed every node): read once, and kept with the view.
                    patched = patched.with_entries(self._entries_of(table, view.names, now))
                table.views[list_key] = patched
                return table.judgement(
                    view.names,
                    patched.entries,
                    0,
                    tally_ids=patched.tally_ids,
                    counts=patched.counts,
                    replies=patched.replies,
                    fetch=None
                    if patched.entries is not None
                    else partial(self._entries_of, table, view.names, now),
                    seen=patched.seen,
                )
        if tallies_only and not pod_class.chain_active and table.holds(now_ts, epoch):
            # The list's tally indexes gathered by their slots (`nodeslots`): the entries,
            # each in a cache line of its own, cost several times as much (a filter after an
            # idle pause misses the cache on nearly every one). Only while the table's bounds
            # say that every entry holds: else each entry's window is read below.
            # A prioritize's list (the nodes a filter passed) comes once: no gather is kept
            # for it, where it would push kube-scheduler's windows out.
            gathered = b"" if list_key in self._ahead else list_key
            ids = self._slots.tally_ids(table.tally_row, table.tallies, names, gathered)
            id_counts = count_ids(ids) if ids is not None else None  # type: ignore[arg-type]  # None counted like an index
            if id_counts is not None and None not in id_counts and table.holds(now_ts, epoch):
                return self._viewed(table, names, None, 0, ids, id_counts, list_key, seen, now)  # type: ignore[arg-type]  # no None here
        entries: list[Entry | None] = list(map(table.entries.get, names))
        judged = 0
        try:
            # A name without an entry (None) has no tally: the one pass that reads the tallies
            # also says whether every name has an entry.
            tally_ids: list[int] = list(map(TALLY, entries))
            current = table.holds(now_ts, epoch) or all_hold(entries, now_ts)  # type: ignore[arg-type]  # no None here
        except AttributeError:
            current = False
        if not current:
            judged = self._complete(table, names, entries, now, now_ts)
            tally_ids = list(map(TALLY, entries))
        ready: list[Entry] = entries  # type: ignore[assignment]  # no None left
        counts = count_ids(tally_ids)
        return self._viewed(table, names, ready, judged, tally_ids, counts, list_key, seen, now)

    def _viewed(  # noqa: PLR0917 (judge's locals)
        self,
        table: VerdictTable[ListView],
        names: Sequence[str],
        entries: list[Entry] | None,
        judged: int,
        tally_ids: list[int],
        counts: dict[int, int],
        list_key: bytes,
        seen: int,
        now: datetime,
    ) -> Judgement:
        """The judgement of `names`, kept as the view of `list_key` (if any) for the next
        request that sends the same list."""
        fetch = None if entries is not None else partial(self._entries_of, table, names, now)
        if not list_key:
            return table.judgement(
                names, entries, judged, tally_ids=tally_ids, counts=counts, fetch=fetch, seen=seen
            )
        if len(table.views) >= _VIEWS_PER_CLASS:
            table.views.clear()
        view = ListView(names, entries, tally_ids, counts, seen=seen)
        table.views[list_key] = view
        return table.judgement(
            names,
            entries,
            judged,
            tally_ids=tally_ids,
            counts=counts,
            replies=view.replies,
            fetch=fetch,
            seen=seen,
        )

    def _entries_of(
        self, table: VerdictTable[ListView], names: Sequence[str], now: datetime
    ) -> list[Entry]:
        """`names`' entries for `table`'s class at `now` (a judgement made from tally indexes,
        when a reply needs its entries): those stored, the others judged as a request does."""
        now_ts = now.timestamp()
        epoch = table.epoch
        entries: list[Entry | None] = list(map(table.entries.get, names))
        # None checked in C, by identity (no entry compared); the bounds before every window.
        if not any(map(is_, entries, repeat(None))) and (
            table.holds(now_ts, epoch) or all_hold(entries, now_ts)  # type: ignore[arg-type]
        ):
            return entries  # type: ignore[return-value]  # no None here
        self._complete(table, names, entries, now, now_ts)
        return entries  # type: ignore[return-value]  # no None left

    def _remember_list(self, known: KnownList, *, ahead: bool = False) -> None:
        lists, most = (self._ahead, _AHEAD_KEPT) if ahead else (self._lists, _LISTS_KEPT)
        if len(lists) >= most:
            lists.clear()
        lists[known[0]] = known

    def judge_ahead(
        self, pod_class: PodClass, filtered: Judgement, now: datetime, *, proposes: bool = False
    ) -> None:
        """After a filter's reply: the prioritize kube-scheduler sends next for the pod names
        the nodes that passed, in the reply's order (its `HTTPExtender.Filter` keeps that
        order), so its reply is made now, under the key its request will carry, while
        kube-scheduler runs its own score plugins. The prioritize finds it, or the view patched
        with what changed since, as for any list asked about before. The caller asks only when
        more than one node passed (a single feasible node is bound without scoring), and holds
        the filter's counters for that prioritize. `proposes`: that prioritize proposes the
        pod's node (`serving.proposals`), so the nodes at the top score are found now too.

        The view is made from the filter's own tally indexes, which carry each node's score,
        as of the filter's position in the change log: no name is looked up again."""
        mask = filtered.passed_mask()
        passed = tuple(compress(filtered.names, mask))
        key = msgspec.json.encode(passed)
        self._remember_list((key, passed), ahead=True)  # its request needs no decoding either
        seen, table = filtered.seen, self._tables.get(pod_class.key)
        # A list prepared before is patched, as its prioritize would patch it. The filter's
        # indexes are current to `seen` in the table it read, unless that table was dropped
        # since or it stored entries itself (logged after `seen`, to be patched in again);
        # the chain reads the entries.
        if (
            seen is None
            or filtered.table is not table
            or table is None
            or filtered.judged
            or pod_class.chain_active
            or key in table.views
        ):
            ahead = self.judge(pod_class, passed, now, list_key=key, tallies_only=True)
        else:
            ids = list(compress(filtered.tally_indexes(), mask))
            ahead = self._viewed(table, passed, None, 0, ids, count_ids(ids), key, seen, now)
        prepared = ahead.replies
        if prepared is None:
            return
        if "prioritize" not in prepared.bodies:
            prepared.bodies["prioritize"] = ahead.prioritize_reply()
        if proposes and prepared.top is None:
            ahead.prepare_top()

    def judge_dra(
        self,
        pod_class: PodClass,
        names: Sequence[str],
        excluded: Sequence[ExcludedKey],
        now: datetime,
    ) -> Judgement:
        """A DRA pod's verdicts of `names` at `now`, as `evaluate` gives them for the nodes
        with `excluded` (per name, `serving.dra.exclusions`) as their `dra_excluded`.

        An entry is a pure function of (class, node input, excluded GPUs, time window), so the
        class's table keeps each name's last one with the node input and the exclusions it was
        judged from, and a request uses it while both are what they are now (the same objects,
        or equal) and its window covers `now`: the filter and the prioritize of one pod, and the
        next pods of its class, judge only the nodes whose data, claims or taints changed."""
        now = as_utc(now)
        now_ts = now.timestamp()
        table = self._table(pod_class)
        self._uses += 1
        table.last_used = self._uses
        memo = table.dra_entries
        # In C, one pass each: the kept (node, excluded, entry), and whether each matches.
        wanted = list(zip(map(self._nodes.get, names), excluded, strict=True))
        kept = list(map(memo.get, names, repeat(_NOT_KEPT)))
        entries: list[Entry] = list(map(_DRA_ENTRY, kept))
        hits = list(map(eq, map(_DRA_STAMP, kept), wanted))
        if all(hits):
            if all_hold(entries, now_ts):
                return table.judgement(names, entries, 0)
            todo: Iterable[int] = range(len(names))
        elif all_hold(list(compress(entries, hits)), now_ts):
            todo = compress(range(len(names)), map(not_, hits))  # the misses alone, in C
        else:
            todo = range(len(names))
        if len(memo) > 2 * len(self._nodes) + 1000:
            memo.clear()  # names of nodes gone: started afresh
        judged = 0
        for index in todo:
            entry = entries[index]
            if hits[index] and entry.from_ts <= now_ts < entry.until_ts:
                continue
            judged += 1
            name = names[index]
            node, gone = wanted[index]
            known = node or NodeInput(name, _NO_ANNOTATIONS, None)
            entry = table.judge(
                msgspec.structs.replace(known, dra_excluded=dict(gone)), now, now_ts
            )[0]
            if node is not None:  # an unknown name is judged, never kept
                memo[name] = (node, gone, entry)
            entries[index] = entry
        return table.judgement(names, entries, judged)

    def exclusions_changed(self, name: str, excluded: ExcludedKey) -> None:
        """The DRA watch changed node `name`'s exclusions for a pod holding none of its GPUs
        and tolerating no taint (`core.dra.base_exclusions`): each class that has a DRA entry
        for it gets one judged with them now, off the request path, as a node event would."""
        with self._lock:
            node = self._nodes.get(name)
            if node is None:
                return
            now = as_utc(self.clock())
            now_ts = now.timestamp()
            judged = msgspec.structs.replace(node, dra_excluded=dict(excluded))
            for table in self._tables.values():
                kept = table.dra_entries.get(name)
                if kept is not None and kept[1] != excluded:
                    table.dra_entries[name] = (node, excluded, table.judge(judged, now, now_ts)[0])

    def _table(self, pod_class: PodClass) -> VerdictTable[ListView]:
        table = self._tables.get(pod_class.key)
        if table is not None:
            return table
        with self._lock:
            table = self._tables.get(pod_class.key)
            if table is None:
                table = VerdictTable[ListView](pod_class, log_changes=True, slots=self._slots.of)
                while len(self._tables) >= self.max_classes:
                    oldest = min(self._tables, key=lambda k: self._tables[k].last_used)
                    del self._tables[oldest]
                self._tables[pod_class.key] = table
            return table

    def _complete(
        self,
        table: VerdictTable[ListView],
        names: Sequence[str],
        entries: list[Entry | None],
        now: datetime,
        now_ts: float,
    ) -> int:
        """Judge, on the request path, the names without an entry covering `now` (a new pod
        class, a node not requested for it before, a window that ended before the timer came, a
        clock that stepped back), and keep what holds for the store's current nodes.

        Under the lock, like every write: the nodes read here are the store's current ones, and
        the table's tally keys are appended by one thread at a time."""
        judged = 0
        with self._lock:
            nodes = self._nodes
            for index, entry in enumerate(entries):
                if entry is not None and entry.holds_at(now_ts):
                    continue
                name = names[index]
                node = nodes.get(name)
                new, verdict = table.judge(
                    node or NodeInput(name, _NO_ANNOTATIONS, None), now, now_ts
                )
                entries[index] = new
                judged += 1
                if node is not None:  # an unknown name is judged, never kept
                    self._store(table, name, new, verdict)
        return judged

    # ------------------------------------------------------------------ writes
    def put(self, node: NodeInput) -> bool:
        """A node added or changed (a watch event); False when nothing the scorer reads changed."""
        with self._lock:
            node = self._with_pods(node)
            old = self._nodes.get(node.name)
            if old is not None and _same_data(old, node):
                if old.labels != node.labels:  # read by spread caps only, per request
                    self._nodes[node.name] = msgspec.structs.replace(old, labels=node.labels)
                return False
            self._nodes[node.name] = node
            self._slots.add(node.name)
            self._judge_everywhere(node)
            return True

    def delete(self, name: str) -> bool:
        with self._lock:
            if self._nodes.pop(name, None) is None:
                return False
            for table in self._tables.values():
                table.drop(name)
            self._slots.remove(name)
            return True

    def replace(self, nodes: Iterable[NodeInput]) -> None:
        """Every node at once (a LIST): unchanged nodes keep their entries."""
        with self._lock:
            old = self._nodes
            fresh: dict[str, NodeInput] = {}
            changed: list[NodeInput] = []
            for node in map(self._with_pods, nodes):
                kept = old.get(node.name)
                if kept is not None and _same_data(kept, node):
                    if kept.labels != node.labels:
                        kept = msgspec.structs.replace(kept, labels=node.labels)
                    fresh[node.name] = kept
                else:
                    fresh[node.name] = node
                    changed.append(node)
            gone = [name for name in old if name not in fresh]
            self._nodes = fresh
            for table in self._tables.values():
                for name in gone:
                    table.drop(name)
            for name in gone:
                self._slots.remove(name)
            for node in changed:
                self._slots.add(node.name)
                self._judge_everywhere(node)
            self._synced = True

    def set_pods(self, name: str, pods: tuple[BoundPod, ...]) -> bool:
        """The GPU pods bound to node `name` now (the pod watch); False when unchanged."""
        with self._lock:
            return self._set_pods(name, pods)

    def replace_pods(self, pods: Mapping[str, tuple[BoundPod, ...]]) -> None:
        """Every node's bound GPU pods at once (the pod watch's LIST, or none when it failed)."""
        with self._lock:
            for name in [n for n in self._pods if n not in pods]:
                self._set_pods(name, NO_PODS)
            for name, node_pods in pods.items():
                self._set_pods(name, node_pods)

    def pods_of(self, name: str) -> tuple[BoundPod, ...]:
        return self._pods.get(name, NO_PODS)

    def labels_of(self, name: str) -> Mapping[str, str] | None:
        node = self._nodes.get(name)
        return None if node is None else node.labels

    def _set_pods(self, name: str, pods: tuple[BoundPod, ...]) -> bool:
        if pods and self.learned is not None:
            pods = self.learned.stamp(pods, as_utc(self.clock()))
        if self._pods.get(name, NO_PODS) == pods:
            return False
        if pods:
            self._pods[name] = pods
        else:
            self._pods.pop(name, None)
        node = self._nodes.get(name)
        if node is not None:
            node = with_pods(node, pods)
            self._nodes[name] = node
            self._judge_everywhere(node)
        return True

    def _with_pods(self, node: NodeInput) -> NodeInput:
        pods = self._pods.get(node.name, NO_PODS)
        return node if node.pods == pods else with_pods(node, pods)

    def next_expiry_ts(self) -> float | None:
        """When the earliest window of an active class may end (POSIX seconds), for the timer."""
        earliest = min((t.min_until_ts for t in list(self._tables.values())), default=math.inf)
        return None if earliest == math.inf else earliest

    def refresh_expired(self) -> int:
        """Judge again every entry whose window has ended, in each class whose earliest window
        has; the number of entries judged again."""
        with self._lock:
            now = as_utc(self.clock())
            now_ts = now.timestamp()
            refreshed = 0
            for table in self._tables.values():
                if table.min_until_ts > now_ts:
                    continue
                for name, entry in list(table.entries.items()):
                    node = self._nodes.get(name)  # type: ignore[call-overload]
                    if node is not None and entry.until_ts <= now_ts:
                        new, verdict = table.judge(node, now, now_ts)
                        self._store(table, name, new, verdict)  # type: ignore[arg-type]
                        refreshed += 1
                table.rebuild_window()
            return refreshed

    def _judge_everywhere(self, node: NodeInput) -> None:
        """Under the lock: `node` judged for every active class, its pods counted once."""
        now = as_utc(self.clock())
        now_ts = now.timestamp()
        shared = SharedCounts(node.pods, now) if node.pods and len(self._tables) > 1 else None
        for table in self._tables.values():
            entry, verdict = table.judge(node, now, now_ts, shared)
            self._store(table, node.name, entry, verdict)

    def _store(
        self, table: VerdictTable[ListView], name: str, entry: Entry, verdict: NodeVerdict
    ) -> None:
        old = table.entries.get(name)
        table.store(name, entry)
        changed = old is None or not old.rejected or old.reason != entry.reason
        if entry.rejected and changed and log.isEnabledFor(logging.INFO):
            _log_rejection(table.pod_class, verdict)


def _same_data(a: NodeInput, b: NodeInput) -> bool:
    """Nothing a verdict reads differs (kubelet status updates change neither)."""
    return (
        a.agent_write_time == b.agent_write_time
        and a.annotations == b.annotations
        and a.foreign_writer == b.foreign_writer
        and a.pods == b.pods
    )


def _log_rejection(pod_class: PodClass, verdict: NodeVerdict) -> None:
    """A node's verdict for a pod class turned to a rejection (or another one): its values once,
    where they were read; requests then log one summary line each."""
    fields = {"pod_class": describe_pod_class(pod_class), **rejection_fields(verdict)}
    log.info("node rejected", extra={"fields": fields})
