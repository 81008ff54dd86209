"""Scrape-time gauges of the node cache: how many nodes' GPU data is fresh, stale or missing now.

The request counters (`gpu_scorer_node_data_total`) move only while pods are being scheduled, and
a stopped agent exports nothing at all; these gauges say at every scrape how much of the fleet a
filter would find stale. They judge the cached nodes with `evaluate` itself (a pod without
hints), so a node counts as stale exactly when a filter at that moment would call it stale.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from types import MappingProxyType
from typing import Final, Protocol, get_args

from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from exporter_scheduler.core.judge import evaluate
from exporter_scheduler.core.policy import Policy
from exporter_scheduler.core.records import DataStatus, NodeInput, PodInput

DATA_STATUSES: Final[tuple[DataStatus, ...]] = get_args(DataStatus)
NODES_BY_STATUS: Final = "gpu_scorer_node_cache_data_nodes"
OLDEST_AGE: Final = "gpu_scorer_node_cache_oldest_data_age_seconds"
_NODES_HELP: Final = (
    "Nodes in the node cache by the state of their GPU data at scrape time, as a filter would "
    "judge it now (fresh, stale, missing, invalid, clock-skew, untrusted); missing includes nodes "
    "without an agent."
)
_AGE_HELP: Final = (
    "Age of the oldest GPU data in the node cache at scrape time: the larger of the age by "
    "updated-at and by the API server's record of the agent's write; absent when no node has data."
)
# Freshness does not depend on the pod; a pod without hints keeps every node's full verdict.
_PROBE_POD: Final = PodInput(
    namespace="", name="node-data-metrics", annotations=MappingProxyType({})
)


class CachedNodes(Protocol):
    """What is read of the node cache: its public request-path methods."""

    def names(self) -> list[str]: ...

    def lookup(self, names: Sequence[str]) -> list[NodeInput]: ...


@dataclass(frozen=True, slots=True)
class NodeDataSummary:
    nodes_by_status: Mapping[DataStatus, int]  # every status, zeros included
    oldest_age_s: float | None  # None when no node has an `updated-at`


def summarize(nodes: Sequence[NodeInput], now: datetime, policy: Policy) -> NodeDataSummary:
    """Count `nodes` by the data status `evaluate` gives them at `now`, and find the oldest."""
    counts = dict.fromkeys(DATA_STATUSES, 0)
    oldest_s: float | None = None
    for verdict in evaluate(_PROBE_POD, nodes, now, policy).verdicts:
        counts[verdict.data_status] += 1
        if verdict.age_s is None:
            continue  # no updated-at: nothing to be old
        age_s = verdict.age_s
        if verdict.server_age_s is not None and verdict.server_age_s > age_s:
            age_s = verdict.server_age_s
        if oldest_s is None or age_s > oldest_s:
            oldest_s = age_s
    return NodeDataSummary(MappingProxyType(counts), oldest_s)


def _utc_now() -> datetime:
    return datetime.now(UTC)


class NodeDataCollector(Collector):
    """A Prometheus collector that summarises the node cache each time it is scraped.

    A scrape judges every cached node once, as one names-only request would (about as long as
    an uncached filter request over the whole cluster).
    """

    def __init__(
        self, nodes: CachedNodes, policy: Policy, *, clock: Callable[[], datetime] = _utc_now
    ) -> None:
        self._nodes = nodes
        self._policy = policy
        self._clock = clock

    def describe(self) -> Iterator[Metric]:
        # Registration asks for the names; answering without judging keeps it free.
        yield GaugeMetricFamily(NODES_BY_STATUS, _NODES_HELP, labels=["status"])
        yield GaugeMetricFamily(OLDEST_AGE, _AGE_HELP)

    def collect(self) -> Iterator[Metric]:
        summary = summarize(self._nodes.lookup(self._nodes.names()), self._clock(), self._policy)
        by_status = GaugeMetricFamily(NODES_BY_STATUS, _NODES_HELP, labels=["status"])
        for status, count in summary.nodes_by_status.items():
            by_status.add_metric([status], count)
        yield by_status
        oldest = GaugeMetricFamily(OLDEST_AGE, _AGE_HELP)
        if summary.oldest_age_s is not None:
            oldest.add_metric([], summary.oldest_age_s)
        yield oldest
