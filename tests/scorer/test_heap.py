"""The collector's pacing: what a freeze hides from the collector, what a reclaim frees, the
pacer's own loop, and the claim its design rests on (the caches make no cyclic garbage).

The pacer works on this process's real collector; each test unfreezes on the way out, so the
rest of the suite runs with the collector as it was.
"""

from __future__ import annotations

import gc
import logging
import threading
import time
import weakref
from collections.abc import Iterator

import pytest

from exporter_scheduler.core.policy import Policy
from exporter_scheduler.heap import CollectorPacing
from exporter_scheduler.serving.app import ScorerApp
from exporter_scheduler.serving.nodestore import NodeStore
from tests.scorer.test_nodestore import Clock, gpu_node, hinted, names_body

WAIT_S = 10.0


class Linked:
    """An object that can be part of a reference cycle and be watched by a weak reference."""

    def __init__(self) -> None:
        self.other: Linked | None = None


def cycle() -> weakref.ref[Linked]:
    """A two-object reference cycle, dropped: only the collector can free it."""
    a, b = Linked(), Linked()
    a.other, b.other = b, a
    return weakref.ref(a)


@pytest.fixture
def pacing() -> Iterator[CollectorPacing]:
    pacer = CollectorPacing(freeze_every_s=3600, reclaim_every_s=3600)
    try:
        yield pacer
    finally:
        pacer.stop()  # never started: only unfreezes
        assert gc.get_freeze_count() == 0


def test_a_frozen_cycle_outlives_full_passes_until_a_reclaim_frees_it(
    pacing: CollectorPacing,
) -> None:
    gc.collect()
    a, b = Linked(), Linked()
    a.other, b.other = b, a
    alive = weakref.ref(a)
    pacing.freeze()
    assert gc.get_freeze_count() > 0
    del a, b
    gc.collect()  # a full pass walks no frozen object
    assert alive() is not None
    found = pacing.reclaim()
    assert alive() is None
    assert found >= 2
    # Frozen again after the pass: the heap stays out of the next automatic ones.
    assert gc.get_freeze_count() > 0
    assert (pacing.freezes, pacing.reclaims) == (2, 1)


def test_garbage_made_after_a_freeze_is_collected_as_usual(pacing: CollectorPacing) -> None:
    pacing.freeze()
    alive = cycle()
    gc.collect()
    assert alive() is None


def test_reference_counting_frees_frozen_objects(pacing: CollectorPacing) -> None:
    freed = threading.Event()
    held = Linked()
    weakref.finalize(held, freed.set)
    pacing.freeze()
    del held
    assert freed.is_set()


def test_a_reclaim_logs_what_it_found_and_how_long_it_took(
    pacing: CollectorPacing, caplog: pytest.LogCaptureFixture
) -> None:
    alive = cycle()
    pacing.freeze()
    with caplog.at_level(logging.INFO, logger="exporter_scheduler.heap"):
        pacing.reclaim()
    assert alive() is None
    (record,) = [r for r in caplog.records if r.name == "exporter_scheduler.heap"]
    assert record.getMessage() == "heap reclaimed"
    fields = record.fields  # type: ignore[attr-defined]
    assert fields["unreachable_objects"] >= 2
    assert fields["tracked_objects"] > 0  # the heap, frozen again after the pass
    assert fields["pass_ms"] >= 0


def test_the_loop_freezes_at_once_then_on_schedule_and_reclaims_when_due() -> None:
    pacer = CollectorPacing(freeze_every_s=0.01, reclaim_every_s=0.2).start()
    try:
        deadline = time.monotonic() + WAIT_S
        while pacer.reclaims < 1 or pacer.freezes < 5:
            assert time.monotonic() < deadline, (pacer.freezes, pacer.reclaims)
            time.sleep(0.01)
        assert gc.get_freeze_count() > 0
    finally:
        pacer.stop()
    # Stopped: the thread is gone and the collector walks every generation again.
    assert gc.get_freeze_count() == 0
    assert not any(t.name == "gc-pacing" for t in threading.enumerate())


@pytest.mark.parametrize(("freeze_s", "reclaim_s"), [(0, 1), (1, 0), (-1, 1)])
def test_intervals_must_be_positive(freeze_s: float, reclaim_s: float) -> None:
    with pytest.raises(ValueError, match="positive"):
        CollectorPacing(freeze_every_s=freeze_s, reclaim_every_s=reclaim_s)


def ours(garbage: list[object]) -> list[str]:
    """The objects of `garbage` that the product made: instances of its classes and its
    functions (other threads of the test process may leave garbage of their own meanwhile)."""
    product = ("exporter_scheduler", "gpu_contract")
    found = []
    for obj in garbage:
        module = getattr(obj, "__module__", None) if callable(obj) else type(obj).__module__
        if isinstance(module, str) and module.startswith(product):
            found.append(getattr(obj, "__qualname__", type(obj).__qualname__))
    return found


def test_the_node_store_and_the_request_path_make_no_cyclic_garbage() -> None:
    """What freezing rests on: a frozen object is freed by reference counting unless it ends
    in a cycle. Nodes written over and over and requests served leave nothing for the
    collector."""
    clock = Clock()
    store = NodeStore(clock=clock)
    names = [f"n{i}" for i in range(200)]
    store.replace(gpu_node(n, utilization=0.3) for n in names)
    app = ScorerApp(policy=Policy(), clock=clock, node_store=store)

    def serve(round_: int) -> None:
        for k in range(20):
            window = tuple(names[(k * 37 + j + round_) % 200] for j in range(90))
            for verb in ("filter", "prioritize"):
                assert app.handle(verb, names_body(hinted(), window)).status == 200

    serve(0)
    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)  # what a pass finds is kept in gc.garbage, not freed
    try:
        for round_ in range(1, 4):
            for i, name in enumerate(names):
                store.put(gpu_node(name, utilization=0.05 + 0.004 * ((i + round_) % 200)))
            serve(round_)
        gc.collect()
        made = ours(gc.garbage)
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
    assert made == []


def test_the_check_for_cyclic_garbage_sees_a_cycle_of_product_objects() -> None:
    store = NodeStore(clock=Clock())
    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        held = NodeStore(clock=Clock())
        held.peer = [store, held]  # type: ignore[attr-defined]
        del held
        gc.collect()
        made = ours(gc.garbage)
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
    assert "NodeStore" in made
