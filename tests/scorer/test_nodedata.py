"""Scrape-time node data gauges: counts by data status as a filter would judge now, and the oldest.

Named cases over `summarize` (pure), the collector on a registry as a scrape renders it, and
one run against the real node cache over HTTP to the API server stand-in.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from exporter_scheduler.core.policy import Policy
from exporter_scheduler.core.records import NodeInput
from exporter_scheduler.edges.nodecache import CacheTuning, NodeCache
from exporter_scheduler.serving.metrics import ScorerMetrics
from exporter_scheduler.serving.nodedata import OLDEST_AGE, NodeDataCollector, summarize
from gpu_contract.schema import DEFAULT_KEYS, Field
from kube_standins.apiserver import ApiServerStandIn
from kube_standins.nodes import gpu_node, with_agent_write
from tests.scorer.scoring_builders import NOW, node

ZERO = {"fresh": 0, "stale": 0, "missing": 0, "invalid": 0, "clock-skew": 0, "untrusted": 0}
CPU_NODE = NodeInput("cpu-1", {})
UPDATED_AT = DEFAULT_KEYS[Field.UPDATED_AT]


@pytest.mark.parametrize(
    ("nodes", "counts", "oldest_s"),
    [
        pytest.param([], {}, None, id="no-nodes"),
        pytest.param([CPU_NODE], {"missing": 1}, None, id="cpu-node-has-no-age"),
        pytest.param([node("a", age_s=10), node("b", age_s=40)], {"fresh": 2}, 40.0, id="fresh"),
        pytest.param(
            [node("a", age_s=10), node("b", age_s=181), CPU_NODE],
            {"fresh": 1, "stale": 1, "missing": 1},
            181.0,
            id="stale-by-updated-at",
        ),
        pytest.param(
            # By the node's clock 170 s, by the API server's record of the write 190 s.
            [node("a", age_s=170, write_age_s=190)],
            {"stale": 1},
            190.0,
            id="stale-by-the-servers-write-time",
        ),
        pytest.param(
            # updated-at in the future, and one far ahead of the server's write time.
            [node("a", age_s=-120), node("b", age_s=10, write_age_s=200), node("c", age_s=5)],
            {"clock-skew": 2, "fresh": 1},
            200.0,
            id="clock-skew",
        ),
        pytest.param(
            [node("a", overrides={Field.UPDATED_AT: "yesterday"})], {"invalid": 1}, None, id="bad"
        ),
    ],
)
def test_summary(nodes: list[NodeInput], counts: dict[str, int], oldest_s: float | None) -> None:
    summary = summarize(nodes, NOW, Policy())
    assert dict(summary.nodes_by_status) == {**ZERO, **counts}
    assert summary.oldest_age_s == oldest_s


def test_staleness_is_the_policys() -> None:
    nodes = [node("a", age_s=30), node("b", age_s=90)]
    assert summarize(nodes, NOW, Policy()).nodes_by_status["stale"] == 0
    assert summarize(nodes, NOW, Policy(stale_after_s=60)).nodes_by_status["stale"] == 1


class _Nodes:
    def __init__(self, nodes: Sequence[NodeInput]) -> None:
        self.nodes = {n.name: n for n in nodes}
        self.lookups = 0

    def names(self) -> list[str]:
        return sorted(self.nodes)

    def lookup(self, names: Sequence[str]) -> list[NodeInput]:
        self.lookups += 1
        return [self.nodes[n] for n in names]


def _scrape(metrics: ScorerMetrics) -> list[str]:
    return metrics.render()[0].decode().splitlines()


def test_each_scrape_judges_the_nodes_at_that_moment() -> None:
    source = _Nodes([node("a", age_s=100), CPU_NODE])
    clock = [NOW]
    metrics = ScorerMetrics()
    metrics.registry.register(NodeDataCollector(source, Policy(), clock=lambda: clock[0]))
    assert source.lookups == 0  # registering reads nothing
    lines = _scrape(metrics)
    assert 'gpu_scorer_node_cache_data_nodes{status="fresh"} 1.0' in lines
    assert 'gpu_scorer_node_cache_data_nodes{status="stale"} 0.0' in lines
    assert 'gpu_scorer_node_cache_data_nodes{status="missing"} 1.0' in lines
    assert "gpu_scorer_node_cache_oldest_data_age_seconds 100.0" in lines
    clock[0] = NOW + timedelta(seconds=90)  # no write since: the data turns stale
    lines = _scrape(metrics)
    assert 'gpu_scorer_node_cache_data_nodes{status="stale"} 1.0' in lines
    assert "gpu_scorer_node_cache_oldest_data_age_seconds 190.0" in lines
    assert source.lookups == 2


def test_no_data_no_age_sample() -> None:
    metrics = ScorerMetrics()
    metrics.registry.register(NodeDataCollector(_Nodes([CPU_NODE]), Policy()))
    lines = _scrape(metrics)
    assert "# TYPE gpu_scorer_node_cache_oldest_data_age_seconds gauge" in lines
    assert not [ln for ln in lines if ln.startswith(OLDEST_AGE)]


def test_reads_the_real_node_cache(tmp_path: Path) -> None:
    now = datetime.now(UTC).replace(microsecond=0)
    fresh = node("gpu-a", age_s=5)
    stale = node("gpu-b", age_s=600)
    with ApiServerStandIn(bookmark_interval_s=0.05) as server:
        for written in (fresh, stale):
            updated = dict(written.annotations)
            # The builders' times are relative to NOW; move them to the real clock.
            at = now - (NOW - datetime.fromisoformat(updated[UPDATED_AT]))
            updated[UPDATED_AT] = at.strftime("%Y-%m-%dT%H:%M:%SZ")
            server.put_node(with_agent_write(gpu_node(written.name), updated, at))
        server.put_node(gpu_node("cpu-c"))
        kubeconfig = server.write_kubeconfig(tmp_path / "kubeconfig")
        metrics = ScorerMetrics()
        tuning = CacheTuning(watch_timeout_s=30, backoff_initial_s=0.01, backoff_max_s=0.05)
        with NodeCache(kubeconfig=str(kubeconfig), metrics=metrics, tuning=tuning) as cache:
            assert cache.wait_until(lambda c: len(c) == 3, 10.0)
            metrics.registry.register(NodeDataCollector(cache, Policy()))
            lines = _scrape(metrics)
    for status, count in (("fresh", 1), ("stale", 1), ("missing", 1)):
        assert f'gpu_scorer_node_cache_data_nodes{{status="{status}"}} {count}.0' in lines
    (age,) = [ln for ln in lines if ln.startswith(OLDEST_AGE)]
    assert 600 <= float(age.split()[-1]) < 660
