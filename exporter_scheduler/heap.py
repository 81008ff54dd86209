"""Pacing of CPython's cyclic garbage collector for a process that holds large caches.

A full pass of the collector walks every object it tracks in its oldest generation, with every
thread stopped. At 5,000 nodes the scorer's caches are about 140,000 such objects, and a full
pass took 92-178 ms (docs/performance.md). One comes whenever the objects promoted since the
last have reached a quarter of those it kept, which node churn and new pod classes bring about
every few tens of seconds; every request that arrives meanwhile waits for it.

So every `freeze_every_s` the pacer moves every tracked object into the permanent generation
(`gc.freeze()`, a constant-time splice of the collector's lists), and a full pass then walks
only what was promoted since. Reference counting frees a frozen object as it frees any other:
what a freeze hides from the collector is cyclic garbage made of frozen objects. The caches
make none (tests/scorer/test_heap.py checks the node store and the request path); the client
libraries may, now and then. So every `reclaim_every_s` the pacer unfreezes everything and runs
one full pass, which frees such cycles, then freezes again: one walk of the whole heap an hour
in place of one every few tens of seconds.
"""

from __future__ import annotations

import gc
import logging
import threading
import time
from typing import Final, Self

log = logging.getLogger("exporter_scheduler.heap")

# Each freeze splices lists and costs nothing to speak of; a full pass between two walks at
# most what this long promoted (at 5,000 nodes and a fleet's write rate, a few thousand objects).
FREEZE_EVERY_S: Final = 1.0
# The one full walk of the heap, which frees cyclic garbage among frozen objects.
RECLAIM_EVERY_S: Final = 3600.0


class CollectorPacing:
    """Freezes the collector's generations every `freeze_every_s` and reclaims every
    `reclaim_every_s`, on a thread of its own; `stop()` unfreezes, leaving the collector as it
    found it."""

    def __init__(
        self, freeze_every_s: float = FREEZE_EVERY_S, reclaim_every_s: float = RECLAIM_EVERY_S
    ) -> None:
        if freeze_every_s <= 0 or reclaim_every_s <= 0:
            raise ValueError("the pacing intervals must be positive")
        self.freeze_every_s = freeze_every_s
        self.reclaim_every_s = reclaim_every_s
        self.freezes = 0
        self.reclaims = 0
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gc-pacing", daemon=True)

    def start(self) -> Self:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        if self._thread.is_alive():
            self._thread.join()
        gc.unfreeze()

    def freeze(self) -> None:
        """Every object the collector tracks now leaves its generations."""
        gc.freeze()
        self.freezes += 1

    def reclaim(self) -> int:
        """One full pass over the whole heap, frozen objects included; then freeze again.
        Returns the unreachable objects the pass found."""
        started = time.perf_counter()
        gc.unfreeze()
        found = gc.collect()
        self.freeze()
        self.reclaims += 1
        log.info(
            "heap reclaimed",
            extra={
                "fields": {
                    "unreachable_objects": found,
                    "tracked_objects": gc.get_freeze_count(),
                    "pass_ms": round((time.perf_counter() - started) * 1e3, 1),
                }
            },
        )
        return found

    def _run(self) -> None:
        next_reclaim = time.monotonic() + self.reclaim_every_s
        self.freeze()  # what start-up made (the modules, the settings) at once
        while not self._stopping.wait(self.freeze_every_s):
            if time.monotonic() >= next_reclaim:
                self.reclaim()
                next_reclaim = time.monotonic() + self.reclaim_every_s
            else:
                self.freeze()
