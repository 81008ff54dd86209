"""Per-node verdict reuse for names-only requests: only the nodes that changed are judged again.

In names-only mode every node write bumps the node cache's generation, so at fleet scale (5000
agents writing ~140 times a second in all) almost every request misses the whole-reply cache
(`replycache`), although only a few nodes changed since the last request. A node's verdict for a
pod, before the model preference chain, is a pure function of:

- that node's data: its `NodeInput` (annotations, decoded once by the node cache, and the agent
  write time). The node cache replaces an entry with a new object whenever either changes, so
  the memo keeps the object it judged and reuses a result only for that same object (`is`);
- the pod's scoring inputs: its annotations under the prefix (the hints; nothing else of the pod
  is read, and the GPU request is shown in explanations only), the memo's key;
- the policy: a memo slot remembers the policy object it was filled with and is started afresh
  for another one;
- now: each result carries the window `[computed_at, valid_until)` in which time alone cannot
  change it (the node's own `Evaluation.valid_until`, with its millisecond margin); a result is
  reused only inside its window, so crossing the stale boundary, leaving the clock-skew window
  or a clock that steps back all judge the node again.

The chain (`gpu-model-preference`) is the one cross-node step: which rank is kept depends on the
other nodes. The memo keeps each node's chain inputs (its rank, and whether it counts as
available below the fallback threshold) and `NamesJudgement` resolves the chain over all nodes on
every request, as `evaluate` does, so a rank switch caused by another node's change is seen.

A pod with an invalid hint is not memoised (every node is rejected for the hint; the caller
evaluates it the ordinary way). Ages (`age_s`, `server_age_s`) move with `now` and are not part
of a reply, so a judgement carries full `NodeVerdict`s only for the nodes judged in this request
(for their log lines); explanations always use `evaluate`.

Bounded: an LRU of `pod_keys` slots (one per distinct set of hints), each a dict name -> result
that is emptied when it outgrows `max_nodes`, which also drops the results of deleted nodes.
"""

from __future__ import annotations

import math
import threading
from collections import Counter, OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from itertools import compress
from operator import attrgetter, is_not
from typing import Final

import msgspec

from exporter_scheduler.hints import ANY_MODEL, HintError, PodHints, parse_hints
from exporter_scheduler.policy import Policy
from exporter_scheduler.scoring import (
    _VALIDITY_MARGIN,
    NodeInput,
    NodeVerdict,
    PodInput,
    _as_utc,
    _Compiled,
    _Decoder,
    _judge,
    time_left_s,
)
from exporter_scheduler.wire import encode_host_priority

DEFAULT_MEMO_POD_KEYS: Final = 8
DEFAULT_MEMO_MAX_NODES: Final = 50_000
# Node lists remembered per pod key (the scheduler sends few distinct lists).
_VIEWS_PER_SLOT: Final = 4

# (passed, unresolvable, reason, data_status): what the verdict counters read, before the chain.
TallyKey = tuple[bool, bool, str | None, str]
PodKey = tuple[tuple[str, str], ...]


class _Entry(msgspec.Struct, frozen=True, gc=False):
    """One node's memoised result.

    Not tracked by the cyclic GC (it holds no cycles): thousands are made by a first request,
    and tracked objects would set off collections over the whole heap inside the request.
    """

    node: NodeInput  # the object judged: reused only for the same object
    from_ts: float  # computed_at, POSIX seconds (exact for microsecond datetimes)
    until_ts: float  # the node's own valid_until, POSIX seconds; inf when time cannot matter
    passed: bool  # before the chain
    rank: int | None  # model rank (chain active only)
    available: int | None  # the rank if at or below the chain's fallback threshold
    tally: int  # the index of its TallyKey in the slot's table (ints count fastest)
    name: str
    priority: bytes  # its encoded `HostPriority` entry, score before the chain


_TALLY: Final = attrgetter("tally")
_PRIORITY: Final = attrgetter("priority")
_encode_priority: Final = encode_host_priority
# Scoring's validity margin: a window ends this far short of its boundary.
_MARGIN_S: Final = _VALIDITY_MARGIN.total_seconds()


class _Slot:
    __slots__ = (
        "compiled",
        "entries",
        "policy",
        "preference",
        "tally_ids",
        "tally_keys",
        "views",
    )

    def __init__(self, policy: Policy, hints: PodHints) -> None:
        self.policy = policy
        self.compiled = _Compiled(policy, hints)
        self.preference = hints.model_preference
        self.entries: dict[str, _Entry] = {}
        self.tally_ids: dict[TallyKey, int] = {}
        self.tally_keys: list[TallyKey] = []
        self.views: OrderedDict[bytes, _View] = OrderedDict()

    def remember(self, key: bytes, view: _View) -> None:
        self.views[key] = view
        self.views.move_to_end(key)
        while len(self.views) > _VIEWS_PER_SLOT:
            self.views.popitem(last=False)

    def tally_id(self, key: TallyKey) -> int:
        found = self.tally_ids.get(key)
        if found is None:
            found = self.tally_ids[key] = len(self.tally_keys)
            self.tally_keys.append(key)
        return found


@dataclass(frozen=True, slots=True)
class NamesJudgement:
    """One names-only request's verdicts, in node order, before the reply is assembled."""

    entries: list[_Entry]
    # The nodes judged in this request (not reused), with their full verdicts.
    computed: list[NodeVerdict]
    chosen_rank: int | None  # None: no chain, or no node passed
    # The reason given to passing nodes of the ranks the chain did not keep.
    not_preferred: str
    now: datetime
    valid_until: datetime | None  # as `Evaluation.valid_until`
    tally_keys: list[TallyKey]  # what the entries' tally indexes stand for

    def filter_parts(
        self,
    ) -> tuple[list[str], dict[str, str], dict[str, str], dict[TallyKey, int]]:
        """Passed names (in order), `FailedNodes`, `FailedAndUnresolvableNodes`, and the node
        counts per `(passed, unresolvable, reason, data_status)` for the verdict counters."""
        entries = self.entries
        failed: dict[str, str] = {}
        unresolvable: dict[str, str] = {}
        chosen = self.chosen_rank
        keys = self.tally_keys
        counts = {keys[i]: n for i, n in Counter(map(_TALLY, entries)).items()}
        if chosen is None:
            passed = [e.name for e in entries if e.passed]
        else:
            passed = [e.name for e in entries if e.passed and e.rank == chosen]
            reason = self.not_preferred
            for e in entries:
                if e.passed and e.rank != chosen:
                    unresolvable[e.name] = reason
                    key = keys[e.tally]
                    counts[key] -= 1
                    moved = (False, True, reason, key[3])
                    counts[moved] = counts.get(moved, 0) + 1
            counts = {k: n for k, n in counts.items() if n}
        for e in entries:
            if not e.passed:
                key = keys[e.tally]
                (unresolvable if key[1] else failed)[e.name] = key[2] or ""
        return passed, failed, unresolvable, counts

    def prioritize_reply(self) -> bytes:
        """The `HostPriorityList` bytes `encode_prioritize_reply(evaluation.scores())` gives."""
        chosen = self.chosen_rank
        if chosen is None:  # no chain, or nothing passed (every score is 0 already)
            return b"[" + b",".join(map(_PRIORITY, self.entries)) + b"]"
        zero = _encode_priority
        return (
            b"["
            + b",".join([e.priority if e.rank == chosen else zero(e.name, 0) for e in self.entries])
            + b"]"
        )

    def rejected_by_chain(self, verdict: NodeVerdict) -> bool:
        """A node that passed the rules but is of a rank the chain did not keep."""
        chosen = self.chosen_rank
        return verdict.passed and chosen is not None and verdict.model_rank != chosen

    def final_verdict(self, verdict: NodeVerdict) -> tuple[str | None, bool]:
        """(reason, unresolvable) of a node judged in this request, after the chain."""
        if self.rejected_by_chain(verdict):
            return self.not_preferred, True
        return verdict.reason, verdict.unresolvable


class VerdictMemo:
    """Per (pod hints, policy) memo of per-node results; see the module docstring.

    Safe to share between threads: the slot LRU is locked, and each node's entry is replaced
    whole (a dict store) and checked whole before use.
    """

    def __init__(
        self, pod_keys: int = DEFAULT_MEMO_POD_KEYS, max_nodes: int = DEFAULT_MEMO_MAX_NODES
    ) -> None:
        if pod_keys < 1:
            raise ValueError("a verdict memo holds at least one pod key")
        self.pod_keys = pod_keys
        self.max_nodes = max_nodes
        self._slots: OrderedDict[PodKey, _Slot] = OrderedDict()
        self._lock = threading.Lock()

    def clear(self) -> None:
        with self._lock:
            self._slots.clear()

    def __len__(self) -> int:
        """Memoised node results over all pod keys."""
        with self._lock:
            return sum(len(slot.entries) for slot in self._slots.values())

    def _slot(self, key: PodKey, pod: PodInput, policy: Policy) -> _Slot | None:
        with self._lock:
            slot = self._slots.get(key)
            if slot is not None and slot.policy is policy:
                self._slots.move_to_end(key)
                return slot
        hints = parse_hints(pod.annotations, policy.keys)
        if isinstance(hints, HintError):
            return None
        slot = _Slot(policy, hints)
        with self._lock:
            self._slots[key] = slot
            self._slots.move_to_end(key)
            while len(self._slots) > self.pod_keys:
                self._slots.popitem(last=False)
        return slot

    @staticmethod
    def _result(  # noqa: PLR0917 (the request loop's locals, passed positionally)
        slot: _Slot,
        node: NodeInput,
        decoder: _Decoder,
        now: datetime,
        now_ts: float,
        computed: list[NodeVerdict],
    ) -> _Entry:
        """The node's memoised result if it is for this node object and covers `now`, else a
        new one."""
        entry = slot.entries.get(node.name)
        if entry is not None and entry.node is node and entry.from_ts <= now_ts < entry.until_ts:
            return entry
        c = slot.compiled
        verdict, available = _judge(node, decoder, now, c)
        entry = _entry(node, verdict, available=available, now_ts=now_ts, slot=slot)
        slot.entries[node.name] = entry
        computed.append(verdict)
        return entry

    def judge(
        self,
        pod: PodInput,
        nodes: Sequence[NodeInput],
        now: datetime,
        policy: Policy,
        *,
        view_key: bytes = b"",
    ) -> NamesJudgement | None:
        """The verdicts `evaluate(pod, nodes, now, policy)` gives, reusing unchanged nodes'.

        `view_key` names the node list (the request's `NodeNames` bytes): the same key must
        mean the same names in the same order. With one, a repeat of a recent list only looks
        at the nodes whose cache entries changed. `None` when the pod's hints are invalid: the
        caller evaluates that pod in full.
        """
        now = _as_utc(now)
        now_ts = now.timestamp()
        prefix = policy.keys.prefix
        key = tuple(sorted((k, v) for k, v in pod.annotations.items() if k.startswith(prefix)))
        slot = self._slot(key, pod, policy)
        if slot is None:
            return None
        c = slot.compiled
        memo = slot.entries
        if len(memo) > self.max_nodes:
            memo.clear()  # also the way results of deleted nodes go
        view = slot.views.get(view_key) if view_key else None
        computed: list[NodeVerdict] = []
        decoder = _Decoder(policy.keys)  # per request: its memo is bounded when made
        if (
            view is not None
            and len(view.nodes) == len(nodes)
            and view.from_ts <= now_ts < view.until_ts
        ):
            # The same node list as a recent request, and every result it used is still inside
            # its time window: only the nodes whose cache entry was replaced are looked at. The
            # comparison runs in C (`map(is_not, ...)`); no Python step per unchanged node.
            entries = view.entries.copy()
            until_ts = view.until_ts
            changed = compress(range(len(nodes)), map(is_not, view.nodes, nodes))
            for index in changed:
                entry = self._result(slot, nodes[index], decoder, now, now_ts, computed)
                entries[index] = entry
                if entry.until_ts < until_ts:  # noqa: PLR1730
                    until_ts = entry.until_ts
        else:
            get = memo.get
            judge_node = _judge
            left_of = time_left_s
            encode_priority = _encode_priority
            stale_s = c.stale_after_s
            skew_s = c.skew_tolerance_s
            tally_ids = slot.tally_ids
            add_computed = computed.append
            inf = math.inf
            entries = []
            add = entries.append
            until_ts = math.inf
            for node in nodes:
                found = get(node.name)
                if (
                    found is None
                    or found.node is not node
                    or not found.from_ts <= now_ts < found.until_ts
                ):
                    # `_result` inlined: a first request makes thousands of these.
                    verdict, available = judge_node(node, decoder, now, c)
                    left_s = left_of(verdict.age_s, verdict.server_age_s, stale_s, skew_s)
                    tally = (
                        verdict.passed,
                        verdict.unresolvable,
                        verdict.reason,
                        verdict.data_status,
                    )
                    tally_id = tally_ids.get(tally)
                    if tally_id is None:
                        tally_id = slot.tally_id(tally)
                    name = node.name
                    entry = _Entry(
                        node,
                        now_ts,
                        inf if left_s == inf else now_ts + left_s - _MARGIN_S,
                        verdict.passed,
                        verdict.model_rank,
                        available,
                        tally_id,
                        name,
                        encode_priority(name, verdict.score),
                    )
                    memo[name] = entry
                    add_computed(verdict)
                else:
                    entry = found
                if entry.until_ts < until_ts:  # noqa: PLR1730 (a call per node costs more)
                    until_ts = entry.until_ts
                add(entry)
        if view_key:
            # Every entry now covers `now_ts`: each was computed at or before it.
            slot.remember(view_key, _View(list(nodes), entries, now_ts, until_ts))

        chosen: int | None = None
        not_preferred = ""
        if c.chain_active:
            # As `scoring._resolve_chain`: the most preferred rank available below the
            # threshold, else the most preferred rank that passed at all.
            available_ranks = [e.available for e in entries if e.available is not None]
            if available_ranks:
                chosen = min(available_ranks)
            else:
                candidates = [e.rank for e in entries if e.passed and e.rank is not None]
                chosen = min(candidates) if candidates else None
            if chosen is not None:
                preference_entry = slot.preference[chosen]
                label = "any model" if preference_entry == ANY_MODEL else preference_entry
                not_preferred = f"gpu model not preferred ({label} available)"
        valid_until = None if until_ts == math.inf else datetime.fromtimestamp(until_ts, UTC)
        return NamesJudgement(
            entries, computed, chosen, not_preferred, now, valid_until, slot.tally_keys
        )


@dataclass(frozen=True, slots=True)
class _View:
    """The results of one node list (by its `NodeNames` bytes) as last judged."""

    nodes: list[NodeInput]
    entries: list[_Entry]
    # Every entry's window covers [from_ts, until_ts) (until_ts may be earlier than the
    # entries' own ends: a replaced entry's end is not taken back; that only shortens reuse).
    from_ts: float
    until_ts: float


def _entry(
    node: NodeInput,
    verdict: NodeVerdict,
    *,
    available: int | None,
    now_ts: float,
    slot: _Slot,
) -> _Entry:
    """A node's new result (see the inlined copy in `VerdictMemo.judge`)."""
    c = slot.compiled
    left_s = time_left_s(verdict.age_s, verdict.server_age_s, c.stale_after_s, c.skew_tolerance_s)
    return _Entry(
        node,
        now_ts,
        math.inf if left_s == math.inf else now_ts + left_s - _MARGIN_S,
        verdict.passed,
        verdict.model_rank,
        available,
        slot.tally_id((verdict.passed, verdict.unresolvable, verdict.reason, verdict.data_status)),
        node.name,
        _encode_priority(node.name, verdict.score),
    )
