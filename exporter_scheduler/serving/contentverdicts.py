"""Full-node requests' verdicts, kept by each Node's content (`ContentVerdicts`).

kube-scheduler sends the same Node objects request after request; a verdict reads only part of
each, so a table per pod class keyed by that part judges a Node again only when it changed or
its verdict's window ended.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable, Sequence
from datetime import datetime
from itertools import repeat
from operator import is_
from typing import Final

import msgspec

from exporter_scheduler.core.inflight import BoundPod
from exporter_scheduler.core.podclass import PodClass
from exporter_scheduler.core.records import NodeInput, NodeVerdict
from exporter_scheduler.serving.nodeobjects import NODE_CONTENT
from exporter_scheduler.serving.verdicts import Entry, Judgement, VerdictTable, all_hold

# Entries a full-node table holds before it starts afresh: every rewrite of a Node is a new
# content key, and old ones are dropped this way.
MAX_CONTENT_ENTRIES: Final = 50_000
DEFAULT_CONTENT_CLASSES: Final = 16


class ContentVerdicts:
    """Full-node requests: a `VerdictTable` per pod class, keyed by each Node's content.

    The same Nodes come back in request after request, and a verdict is a pure function of
    what it reads of a Node (name, GPU annotations, managedFields entries: `wire.NODE_CONTENT`,
    hashed in C), the pod class and the time window; so a request judges only the Nodes whose
    content it has not seen for this class, or whose window has ended. Safe from several
    request threads: entries are immutable and stored with single dict operations.
    """

    def __init__(self, max_classes: int = DEFAULT_CONTENT_CLASSES) -> None:
        self.max_classes = max_classes
        self._tables: dict[Hashable, VerdictTable[None]] = {}
        self._lock = threading.Lock()
        self._uses = 0

    def judge(
        self,
        pod_class: PodClass,
        records: Sequence[object],
        names: Sequence[str],
        now: datetime,
        to_input: Callable[[object], NodeInput],
        *,
        pods_of: Callable[[str], tuple[BoundPod, ...]] | None = None,
    ) -> tuple[Judgement, list[NodeVerdict]]:
        """The request's verdicts, and the full verdicts of the Nodes it judged itself.

        `pods_of` gives each node's bound GPU pods (the pod watch): they are part of what a
        verdict reads, so of the key too (the same tuple object while they do not change)."""
        table = self._table(pod_class)
        now_ts = now.timestamp()
        memo = table.entries
        keys: list[Hashable] = list(map(NODE_CONTENT, records))
        if pods_of is not None:
            keys = [(key, pods_of(name)) for key, name in zip(keys, names, strict=True)]
        entries: list[Entry | None] = list(map(memo.get, keys))
        judged: list[NodeVerdict] = []
        if any(map(is_, entries, repeat(None))) or not all_hold(entries, now_ts):  # type: ignore[arg-type]
            if len(memo) > MAX_CONTENT_ENTRIES:
                memo.clear()
            for index, entry in enumerate(entries):
                if entry is not None and entry.holds_at(now_ts):
                    continue
                node = to_input(records[index])
                if pods_of is not None:
                    node = msgspec.structs.replace(node, pods=pods_of(node.name))
                new, verdict = table.judge(node, now, now_ts)
                memo[keys[index]] = entries[index] = new
                judged.append(verdict)
        return table.judgement(names, entries, len(judged)), judged  # type: ignore[arg-type]

    def _table(self, pod_class: PodClass) -> VerdictTable[None]:
        self._uses += 1  # racy, and only orders the LRU
        table = self._tables.get(pod_class.key)
        if table is None:
            with self._lock:
                table = self._tables.get(pod_class.key)
                if table is None:
                    while len(self._tables) >= self.max_classes:
                        oldest = min(self._tables, key=lambda k: self._tables[k].last_used)
                        del self._tables[oldest]
                    table = self._tables[pod_class.key] = VerdictTable(pod_class)
        table.last_used = self._uses
        return table
