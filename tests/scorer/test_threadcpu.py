"""`gpu_scorer_thread_cpu_seconds_total`: each thread's CPU under its label, kept once it ends."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest

from exporter_scheduler.core.records import NodeInput
from exporter_scheduler.edges.server import HttpServer
from exporter_scheduler.serving.metrics import ScorerMetrics
from exporter_scheduler.threadcpu import (
    ThreadCpuCollector,
    cpu_by_label,
    retire_current_thread,
    thread_label,
)
from tests.scorer._http_helpers import (
    args_body,
    call,
    connect,
    gpu_annotations,
    make_app,
    pod,
    store_of,
)

pytestmark = pytest.mark.skipif(
    not hasattr(time, "pthread_getcpuclockid"), reason="no per-thread CPU clocks here"
)


@pytest.mark.parametrize(
    ("name", "label"),
    [
        ("gpu-scorer-request", "request"),
        ("gpu-scorer-node-watch", "node-watch"),
        ("gpu-scorer-nominated_pod-watch", "nominated_pod-watch"),
        ("log-writer", "log-writer"),
        ("gc-pacing", "gc-pacing"),
        ("MainThread", "main"),
        ("Thread-7 (worker)", "other"),
    ],
)
def test_a_thread_is_labelled_by_its_name(name: str, label: str) -> None:
    assert thread_label(name) == label


def _burn(cpu_s: float) -> float:
    """Spin until this thread has used `cpu_s` of CPU; its total."""
    while time.thread_time() < cpu_s:
        sum(range(1000))
    return time.thread_time()


def _in_thread(name: str, body: Callable[[], None]) -> threading.Thread:
    thread = threading.Thread(target=body, name=name, daemon=True)
    thread.start()
    return thread


def _value(collector: ThreadCpuCollector, label: str) -> float:
    (family,) = collector.collect()
    return sum(s.value for s in family.samples if s.labels["thread"] == label)


def test_a_live_threads_cpu_counts_under_its_label() -> None:
    collector = ThreadCpuCollector()
    before_s = _value(collector, "probe-live")
    burnt, release = threading.Event(), threading.Event()
    spent: list[float] = []

    def body() -> None:
        spent.append(_burn(0.05))
        burnt.set()
        release.wait(10)

    thread = _in_thread("gpu-scorer-probe-live", body)
    assert burnt.wait(10)
    try:
        assert before_s == 0.0
        assert _value(collector, "probe-live") >= spent[0]
    finally:
        release.set()
        thread.join(10)


def test_a_retired_thread_stays_counted_once_and_is_not_counted_twice() -> None:
    collector = ThreadCpuCollector()
    retired, release = threading.Event(), threading.Event()
    spent: list[float] = []

    def body() -> None:
        spent.append(_burn(0.05))
        retire_current_thread()
        retire_current_thread()  # a second call adds nothing
        retired.set()
        release.wait(10)

    thread = _in_thread("gpu-scorer-probe-retired", body)
    assert retired.wait(10)
    # Retired and still alive: its clock is skipped, its total counted once.
    while_alive_s = _value(collector, "probe-retired")
    assert spent[0] <= while_alive_s < 2 * spent[0]
    release.set()
    thread.join(10)
    assert not thread.is_alive()
    assert _value(collector, "probe-retired") == while_alive_s
    assert cpu_by_label()["probe-retired"] == while_alive_s


def test_a_label_never_falls_when_a_thread_ends_without_retiring() -> None:
    collector = ThreadCpuCollector()
    burnt, release = threading.Event(), threading.Event()

    def body() -> None:
        _burn(0.03)
        burnt.set()
        release.wait(10)

    thread = _in_thread("gpu-scorer-probe-unretired", body)
    assert burnt.wait(10)
    seen_s = _value(collector, "probe-unretired")
    assert seen_s >= 0.03
    release.set()
    thread.join(10)
    assert "probe-unretired" not in cpu_by_label()  # its clock went with it
    assert _value(collector, "probe-unretired") == seen_s


@pytest.mark.parametrize(
    ("thread_name", "label"),
    [("gpu-scorer-request", "request"), ("gpu-scorer-metrics", "metrics")],
)
def test_a_served_connections_thread_is_counted_after_it_closes(
    thread_name: str, label: str
) -> None:
    app = make_app(node_store=store_of([NodeInput("a", gpu_annotations(), None)]))
    before_s = _value(ThreadCpuCollector(), label)
    with HttpServer(app, host="127.0.0.1", port=0, thread_name=thread_name) as server:
        conn = connect(server)
        for _ in range(20):
            assert call(conn, "POST", "/filter", args_body(pod(), names=["a", "b"]))[0] == 200
        conn.close()
    # `stop` joined the connection's thread: it retired as it ended.
    after_s = cpu_by_label().get(label, 0.0)
    assert after_s > before_s
    text = ScorerMetrics().render()[0].decode()
    line = next(
        x
        for x in text.splitlines()
        if x.startswith(f'gpu_scorer_thread_cpu_seconds_total{{thread="{label}"}}')
    )
    assert float(line.rsplit(" ", 1)[1]) >= after_s
