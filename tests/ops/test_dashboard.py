"""The Grafana dashboard: every query parses (promtool) and selects only metrics the project
exports (from the agent's and the scorer's own registries), and the chart delivers it."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.chart_support import FULLNAME, NAMESPACE, render
from tests.ops.ops_support import (
    dashboard,
    dashboard_panels,
    dashboard_queries,
    exported_metric_names,
    promtool,
)
from tests.ops.promql_names import metric_names


def _as_recording_rules(queries: dict[str, str]) -> dict[str, Any]:
    rules = [
        {"record": f"dashboard:query_{i}", "expr": expr} for i, expr in enumerate(queries.values())
    ]
    return {"groups": [{"name": "dashboard", "rules": rules}]}


def _check(tmp_path: Path, queries: dict[str, str]) -> tuple[int, str]:
    path = tmp_path / "dashboard-queries.yaml"
    path.write_text(yaml.safe_dump(_as_recording_rules(queries)))
    done = promtool("check", "rules", path)
    return done.returncode, done.stdout + done.stderr


def test_every_query_parses(tmp_path: Path) -> None:
    queries = dashboard_queries()
    assert len(queries) >= 12
    code, output = _check(tmp_path, queries)
    assert code == 0, output
    assert f"SUCCESS: {len(queries)} rules found" in output


def test_a_broken_query_is_caught(tmp_path: Path) -> None:
    code, output = _check(tmp_path, {"bad": "sum by (le (rate(gpu_agent_writes_total[5m]))"})
    assert code != 0
    assert "parse error" in output


def test_every_query_selects_only_exported_metrics() -> None:
    exported = exported_metric_names()
    unknown = {
        where: sorted(metric_names(expr) - exported)
        for where, expr in dashboard_queries().items()
        if metric_names(expr) - exported
    }
    assert unknown == {}
    # And the check itself sees a name that is not exported.
    assert metric_names("rate(gpu_agent_write_total[5m])") - exported == {"gpu_agent_write_total"}


@pytest.mark.parametrize(
    ("topic", "metric"),
    [
        ("node data age", "gpu_agent_last_write_age_seconds"),
        ("node data age, scorer's view", "gpu_scorer_node_cache_oldest_data_age_seconds"),
        ("nodes by data status", "gpu_scorer_node_cache_data_nodes"),
        ("writes by reason", "gpu_agent_writes_total"),
        ("write errors", "gpu_agent_api_errors_total"),
        ("scorer latency", "gpu_scorer_request_duration_seconds_bucket"),
        ("verdicts by reason", "gpu_scorer_filter_verdicts_total"),
        ("node cache state", "gpu_scorer_node_cache_ready"),
        ("node cache relists", "gpu_scorer_node_cache_relists_total"),
        ("in-flight accounting", "gpu_scorer_inflight_accounting"),
        ("pod watch restarts", "gpu_scorer_pod_cache_watch_restarts_total"),
        ("scorer CPU by thread", "gpu_scorer_thread_cpu_seconds_total"),
        ("GPU health", "gpu_agent_health"),
    ],
)
def test_the_dashboard_shows(topic: str, metric: str) -> None:
    selected = set().union(*(metric_names(e) for e in dashboard_queries().values()))
    assert metric in selected, topic


def test_panels_fit_the_grid_and_use_the_datasource_variable() -> None:
    panels = list(dashboard_panels())
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids))
    for panel in panels:
        grid = panel["gridPos"]
        assert grid["x"] >= 0, panel["title"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]
        if panel["type"] != "row":
            assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
            assert panel["description"], panel["title"]
    (variable,) = dashboard()["templating"]["list"]
    assert (variable["name"], variable["type"], variable["query"]) == (
        "datasource",
        "datasource",
        "prometheus",
    )
    assert re.fullmatch(r"[a-z0-9-]{1,40}", dashboard()["uid"])


@pytest.mark.helm
def test_the_chart_delivers_it_to_grafanas_sidecar_when_asked() -> None:
    assert render("defaults").maybe("ConfigMap", f"{FULLNAME}-dashboard") is None
    config_map = render("grafana-dashboard").get("ConfigMap", f"{FULLNAME}-dashboard")
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert config_map["metadata"]["namespace"] == "monitoring"
    assert config_map["metadata"]["annotations"] == {"grafana_folder": "GPU"}
    (body,) = config_map["data"].values()
    assert json.loads(body) == dashboard()
    assert NAMESPACE != "monitoring"  # the override is what put it there
