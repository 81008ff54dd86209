"""Shared by the operations tests: the Prometheus binaries, and what the project exports.

promtool and prometheus come from Debian's `prometheus` package (`python3 dev.py tools` unpacks it
into .tools/bin). Where they are missing the tests skip locally and fail in CI (`CI=true`), like
the helm tests.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import CollectorRegistry

from agent.metrics import AgentMetrics
from exporter_scheduler.core.policy import Policy
from exporter_scheduler.core.records import NodeInput
from exporter_scheduler.serving.metrics import ScorerMetrics
from exporter_scheduler.serving.nodedata import NodeDataCollector

ROOT = Path(__file__).resolve().parents[2]
RULES_FILE = ROOT / "prometheus" / "gpu-live-scheduler.rules.yaml"
UNIT_TESTS = sorted((ROOT / "prometheus" / "tests").glob("*.test.yaml"))
DASHBOARD = ROOT / "charts" / "gpu-live-scheduler" / "files" / "grafana-dashboard.json"
OPERATIONS_DOC = ROOT / "docs" / "operations.md"


def tool_binary(name: str) -> Path | None:
    local = ROOT / ".tools" / "bin" / name
    if local.is_file() and os.access(local, os.X_OK):
        return local
    found = shutil.which(name)
    return Path(found) if found else None


def require_tool(name: str) -> Path:
    """The binary; skip without it locally, fail without it in CI."""
    binary = tool_binary(name)
    if binary is not None:
        return binary
    message = f"{name} not found in .tools/bin or PATH (python3 dev.py tools installs it)"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(message + "; CI must run the Prometheus checks")
    pytest.skip(message)


def promtool(*args: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(require_tool("promtool")), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=cwd,
    )


class _NoNodes:
    def names(self) -> list[str]:
        return []

    def lookup(self, names: Iterable[str]) -> list[NodeInput]:
        return []


def exported_metric_names() -> set[str]:
    """Every sample name a scrape of the agent or the scorer can carry, from their registries."""
    agent = AgentMetrics().registry
    scorer = ScorerMetrics().registry
    # Registered in names-only mode only (exporter_scheduler.cli).
    scorer.register(NodeDataCollector(_NoNodes(), Policy()))
    names: set[str] = set()
    for registry in (agent, scorer):
        for family in _families(registry):
            names |= _sample_names(family.name, family.type)
    return names


def _families(registry: CollectorRegistry) -> Iterable[Metric]:
    # `collect()` yields every family, also labelled ones that have no sample yet.
    return list(registry.collect())


def _sample_names(name: str, kind: str) -> set[str]:
    suffixes = {
        "counter": ("_total", "_created"),
        "gauge": ("",),
        "histogram": ("_bucket", "_count", "_sum", "_created"),
        "summary": ("", "_count", "_sum", "_created"),
        "info": ("_info",),
    }[kind]
    return {name + suffix for suffix in suffixes}


# What Grafana puts in for its built-in variables; any duration parses the same way.
_GRAFANA_VARIABLES = {"$__rate_interval": "5m", "$__interval": "1m", "$__range": "1h"}


def dashboard() -> dict[str, Any]:
    loaded = json.loads(DASHBOARD.read_text())
    assert isinstance(loaded, dict)
    return loaded


def dashboard_panels() -> Iterator[dict[str, Any]]:
    """Every panel, rows' nested panels included."""

    def walk(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        for panel in panels:
            yield panel
            yield from walk(panel.get("panels", []))

    return walk(dashboard()["panels"])


def dashboard_queries() -> dict[str, str]:
    """`<panel title> / <refId>` -> its PromQL, with Grafana's variables filled in."""
    queries = {}
    for panel in dashboard_panels():
        for target in panel.get("targets", []):
            expr = target["expr"]
            for variable, value in _GRAFANA_VARIABLES.items():
                expr = expr.replace(variable, value)
            assert "$" not in expr, f"an unknown Grafana variable in {expr}"
            queries[f"{panel['title']} / {target['refId']}"] = expr
    return queries
