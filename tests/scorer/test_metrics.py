"""Metric names follow Prometheus conventions and match the table in docs/scorer.md."""

from __future__ import annotations

import re
from pathlib import Path

from exporter_scheduler.core.policy import Policy
from exporter_scheduler.core.records import NodeInput
from exporter_scheduler.serving.metrics import ScorerMetrics
from exporter_scheduler.serving.nodedata import NodeDataCollector

DOC = Path(__file__).resolve().parents[2] / "docs" / "scorer.md"


class _NoNodes:
    def names(self) -> list[str]:
        return []

    def lookup(self, names: object) -> list[NodeInput]:
        return []


def _exposed() -> dict[str, str]:
    """Exposed family name -> type, as a scraper sees them (names-only mode: all of them)."""
    metrics = ScorerMetrics()
    metrics.registry.register(NodeDataCollector(_NoNodes(), Policy()))
    families = {}
    for family in metrics.registry.collect():
        name = family.name + ("_total" if family.type == "counter" else "")
        families[name] = family.type
    return families


def test_names_follow_prometheus_conventions() -> None:
    for name, kind in _exposed().items():
        assert name.startswith("gpu_scorer_"), name
        assert re.fullmatch(r"[a-z][a-z0-9_]*", name), name
        if kind == "counter":
            assert name.endswith("_total"), name
        else:
            assert not name.endswith("_total"), name
        if "duration" in name or "latency" in name:
            assert name.endswith("_seconds"), name


def test_every_metric_is_documented_and_nothing_else() -> None:
    documented = set(re.findall(r"^\| `(gpu_scorer_[a-z0-9_]+)` \|", DOC.read_text(), re.M))
    assert documented == set(_exposed())
