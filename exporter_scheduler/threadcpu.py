"""The scorer's CPU time by thread, exported as `gpu_scorer_thread_cpu_seconds_total{thread}`.

`process_cpu_seconds_total` says how much of a core the scorer takes; this says which of its
threads takes it: the request threads (kube-scheduler's calls, and what runs right after each
reply), each watch, the verdict-expiry timer, the log writer. When the scorer's CPU climbs, an
operator can tell a busy Pod watch from slow requests, and the real-scheduler benchmark divides
each thread's share by the pods placed.

A thread's label is its name without the `gpu-scorer-` prefix (`request`, `metrics` for the
scrapes on a separate metrics port, `node-watch`, `pod-watch`, ...); threads the scorer did not
start count as `other`. The times are read at
scrape time from each live thread's CPU clock (`time.pthread_getcpuclockid`), so nothing is
counted on the request path. A request thread ends with its connection (kube-scheduler
reconnects now and then), and its clock goes with it, so it adds its total to its label as it
ends (`retire_current_thread`). A label's value never falls: a thread that ended without that
(only at shutdown) leaves the label at its last value. Where threads have no CPU clock (not
POSIX), the metric is absent.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Iterator
from typing import Final

from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

METRIC: Final = "gpu_scorer_thread_cpu_seconds"
_HELP: Final = (
    "CPU time of the scorer's threads, by thread: request (kube-scheduler's calls and the work "
    "right after each reply), metrics (scrapes on a separate metrics port), node-watch, "
    "pod-watch, verdict-expiry, log-writer, ...; other: threads the scorer did not start."
)
_PREFIX: Final = "gpu-scorer-"
# The names of the scorer's own threads that carry no prefix.
_OWN: Final = frozenset({"log-writer", "gc-pacing"})

_lock = threading.Lock()
# CPU seconds of the threads that have ended, by label; and those threads, so that a scrape
# between a thread's retiring and its end does not count it twice.
_retired_s: dict[str, float] = {}
_retired: weakref.WeakSet[threading.Thread] = weakref.WeakSet()


def thread_label(name: str) -> str:
    """The metric's label for a thread named `name`."""
    if name.startswith(_PREFIX):
        return name[len(_PREFIX) :]
    if name in _OWN:
        return name
    if name == "MainThread":
        return "main"
    return "other"


def retire_current_thread() -> None:
    """Add the calling thread's CPU time to its label, as its last step (a request thread as
    its connection closes)."""
    thread = threading.current_thread()
    spent_s = time.thread_time()
    label = thread_label(thread.name)
    with _lock:
        if thread in _retired:
            return
        _retired.add(thread)
        _retired_s[label] = _retired_s.get(label, 0.0) + spent_s


def cpu_by_label() -> dict[str, float]:
    """Every label's CPU seconds so far: the live threads' clocks and what ended threads left."""
    with _lock:
        totals = dict(_retired_s)
        retired = set(_retired)
    for thread in threading.enumerate():
        ident = thread.ident
        if ident is None or thread in retired:
            continue
        try:
            spent_s = time.clock_gettime(time.pthread_getcpuclockid(ident))
        except (OSError, ValueError):  # ended since the enumeration
            continue
        label = thread_label(thread.name)
        totals[label] = totals.get(label, 0.0) + spent_s
    return totals


class ThreadCpuCollector(Collector):
    """`gpu_scorer_thread_cpu_seconds_total{thread}`, read when scraped; never falling per label."""

    def __init__(self) -> None:
        self._reported: dict[str, float] = {}
        self._reported_lock = threading.Lock()

    def describe(self) -> Iterator[CounterMetricFamily]:
        yield CounterMetricFamily(METRIC, _HELP, labels=["thread"])

    def collect(self) -> Iterator[CounterMetricFamily]:
        if not hasattr(time, "pthread_getcpuclockid"):
            return
        family = CounterMetricFamily(METRIC, _HELP, labels=["thread"])
        totals = cpu_by_label()
        with self._reported_lock:
            reported = self._reported
            for label, spent_s in totals.items():
                reported[label] = max(spent_s, reported.get(label, 0.0))
            values = sorted(reported.items())
        for label, spent_s in values:
            family.add_metric([label], spent_s)
        yield family
