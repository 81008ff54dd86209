"""Prometheus metrics of the scorer, on a registry of their own per app instance.

A fresh `CollectorRegistry` per `ScorerMetrics` keeps tests (and two apps in one process)
independent. Per-node outcomes are counted in plain Python first and added to the counters once
per distinct label set, because a labelled `inc()` per node would cost more than the scoring
itself at 5000 nodes.
"""

from __future__ import annotations

from collections import Counter as _Tally
from collections.abc import Iterable
from typing import Final, Literal, Protocol

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

Verb = Literal["filter", "prioritize", "explain"]


class VerdictLike(Protocol):
    """The parts of a node verdict the counters read."""

    @property
    def passed(self) -> bool: ...

    @property
    def unresolvable(self) -> bool: ...

    @property
    def reason(self) -> str | None: ...

    @property
    def data_status(self) -> str: ...


# The handler takes tens of microseconds for a few nodes and tens of milliseconds for thousands:
# buckets from 50 us to 250 ms cover both ends with about two buckets per octave of interest.
LATENCY_BUCKETS_S: Final = (
    0.00005,
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
)
NODE_COUNT_BUCKETS: Final = (1, 5, 10, 50, 100, 250, 500, 1000, 2500, 5000, 10000)


class ScorerMetrics:
    """Every metric the scorer exports; `render()` gives the exposition body and its type."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.request_seconds = Histogram(
            "gpu_scorer_request_duration_seconds",
            "Time spent handling an extender request (decode, evaluate, encode), by verb.",
            ["verb"],
            buckets=LATENCY_BUCKETS_S,
            registry=r,
        )
        self.nodes_per_request = Histogram(
            "gpu_scorer_request_nodes",
            "Nodes in an extender request, by verb.",
            ["verb"],
            buckets=NODE_COUNT_BUCKETS,
            registry=r,
        )
        self.verdicts = Counter(
            "gpu_scorer_filter_verdicts",
            "Filter verdicts per node, by outcome (passed, failed, unresolvable) and reason.",
            ["outcome", "reason"],
            registry=r,
        )
        self.node_data = Counter(
            "gpu_scorer_node_data",
            "Nodes evaluated, by the state of their GPU data (fresh, stale, missing, ...).",
            ["status"],
            registry=r,
        )
        self.bad_requests = Counter(
            "gpu_scorer_rejected_requests",
            "Requests answered with an error status, by cause.",
            ["cause"],
            registry=r,
        )
        self.internal_errors = Counter(
            "gpu_scorer_internal_errors",
            "Requests whose evaluation raised; answered with a defined fallback, by verb.",
            ["verb"],
            registry=r,
        )
        self.node_cache_size = Gauge(
            "gpu_scorer_node_cache_nodes",
            "Nodes held by the names-only node cache.",
            registry=r,
        )
        self.node_cache_relists = Counter(
            "gpu_scorer_node_cache_relists",
            "Full LISTs of Nodes made by the node cache (the first one included).",
            registry=r,
        )
        self.node_cache_watch_restarts = Counter(
            "gpu_scorer_node_cache_watch_restarts",
            "Node watches that ended (timeout, 410 Gone, connection error) and were reopened.",
            ["cause"],
            registry=r,
        )
        self.node_cache_ready = Gauge(
            "gpu_scorer_node_cache_ready",
            "1 once the node cache holds its first full LIST.",
            registry=r,
        )

    def observe_verdicts(self, verdicts: Iterable[VerdictLike]) -> None:
        """Count one request's verdicts: one pass over the nodes, one `inc` per label set."""
        tally = _Tally((v.passed, v.unresolvable, v.reason, v.data_status) for v in verdicts)
        by_status: dict[str, int] = {}
        for (passed, unresolvable, reason, status), count in tally.items():
            outcome = "passed" if passed else "unresolvable" if unresolvable else "failed"
            self.verdicts.labels(outcome, reason or "").inc(count)
            by_status[status] = by_status.get(status, 0) + count
        for status, count in by_status.items():
            self.node_data.labels(status).inc(count)

    def render(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
