"""A real Prometheus scrapes a running agent and scorer and fires an alert when the agent stops.

Debian's `prometheus` server runs on loopback with the chart's alert rules, rendered by helm
from the same source as the PrometheusRule, with thresholds shortened through the chart's
values (a stale-after of 3 s, short `for:`). `gpu-agent run --source simulated` writes to a Node
of the real kube-apiserver; `gpu-scorer serve --node-cache` watches it. While both run, every rule
evaluates without error, no alert fires, and every dashboard query runs; once the agent is
stopped, its own metrics are gone with it, and GpuNodesDataStale, from the scorer's view of the
node cache, goes from inactive through pending to firing.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from loopback_cluster.control_plane import ControlPlane
from tests.e2e.support import Scope
from tests.ops.ops_support import dashboard_queries, require_tool
from tests.ops.rules_file import chart_rules

pytestmark = pytest.mark.e2e

STALE_AFTER_S = 3
ALERT = "GpuNodesDataStale"
# Short enough to see each state within seconds, long enough to see `pending` on its own.
SHORT_FOR = {ALERT: "3s", "GpuAgentNotWriting": "3s", "GpuScorerNodeCacheNotReady": "3s"}
WAIT_S = 30.0


@dataclass(frozen=True)
class KubeApi:
    """The Kubernetes API the binaries talk to, with one GPU Node and no agent data yet."""

    kubeconfig: Path
    node: str


@pytest.fixture
def kube_api(control_plane: ControlPlane, scope: Scope) -> KubeApi:
    """The real kube-apiserver, holding this test's GPU Node (the only Node during the test:
    every other test's Nodes are deleted when it ends)."""
    return KubeApi(control_plane.admin_kubeconfig, scope.node("prometheus"))


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class _Process:
    """A server started for the test; its output goes to a file, shown when a wait fails."""

    def __init__(self, name: str, argv: list[str], log: Path, env: dict[str, str]) -> None:
        self.name = name
        self.log = log
        with log.open("wb") as out:
            self.process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env)

    def output(self) -> str:
        return f"--- {self.name} ---\n" + self.log.read_text(errors="replace")[-4000:]

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                return self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
        return self.process.wait()


@dataclass
class _Stack:
    node: str
    agent: _Process
    scorer: _Process
    prometheus: _Process
    scorer_url: str
    prometheus_url: str

    def logs(self) -> str:
        return "\n".join(p.output() for p in (self.agent, self.scorer, self.prometheus))

    def api(self, path: str, **params: str) -> Any:
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        with urllib.request.urlopen(f"{self.prometheus_url}/api/v1/{path}{query}", timeout=5) as r:
            document = json.load(r)
        assert document["status"] == "success", document
        return document["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        result = self.api("query", query=expr)["result"]
        assert isinstance(result, list)
        return result

    def until(self, what: str, condition: Callable[[], bool]) -> float:
        """Poll `condition` for up to WAIT_S; the seconds it took."""
        started = time.monotonic()
        while True:
            try:
                if condition():
                    return time.monotonic() - started
            except OSError:
                pass  # a server still starting
            if time.monotonic() - started > WAIT_S:
                pytest.fail(f"timed out waiting for {what}\n{self.logs()}")
            time.sleep(0.2)


def _environment(node: str) -> dict[str, str]:
    prefixes = ("GPU_AGENT_", "GPU_SCORER_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(prefixes)}
    env["NODE_NAME"] = node
    return env


def _prometheus_config(
    tmp_path: Path, rules: dict[str, Any], *, agent_port: int, scorer_port: int, node: str
) -> Path:
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rules, sort_keys=False))
    config = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(tmp_path / "rules.yaml")],
        "scrape_configs": [
            {
                "job_name": "gpu-agent",
                # What the chart's ServiceMonitor sets from the pod's node.
                "static_configs": [
                    {"targets": [f"127.0.0.1:{agent_port}"], "labels": {"node": node}}
                ],
            },
            {
                "job_name": "gpu-scorer",
                "static_configs": [{"targets": [f"127.0.0.1:{scorer_port}"]}],
            },
        ],
    }
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


@pytest.fixture
def stack(kube_api: KubeApi, tmp_path: Path) -> Iterator[_Stack]:
    prometheus_bin = require_tool("prometheus")
    rules = chart_rules(
        {"scorer": {"staleAfterSeconds": STALE_AFTER_S}, "prometheusRule": {"for": SHORT_FOR}}
    )
    agent_port, scorer_port, prometheus_port = _free_port(), _free_port(), _free_port()
    env = _environment(kube_api.node)
    kubeconfig = f"--kubeconfig={kube_api.kubeconfig}"
    agent = _Process(
        "gpu-agent",
        [
            *(sys.executable, "-m", "agent", "run", "--source=simulated", kubeconfig),
            *(f"--metrics-port={agent_port}", "--metrics-address=127.0.0.1", "--seed=1"),
            *("--sample-interval-s=0.2", "--min-write-interval-s=0.5", "--heartbeat-s=1"),
        ],
        tmp_path / "agent.log",
        env,
    )
    scorer = _Process(
        "gpu-scorer",
        [
            *(sys.executable, "-m", "exporter_scheduler", "serve", "--node-cache", kubeconfig),
            *("--host=127.0.0.1", f"--port={scorer_port}", f"--stale-after-s={STALE_AFTER_S}"),
        ],
        tmp_path / "scorer.log",
        env,
    )
    config = _prometheus_config(
        tmp_path, rules, agent_port=agent_port, scorer_port=scorer_port, node=kube_api.node
    )
    prometheus = _Process(
        "prometheus",
        [
            *(str(prometheus_bin), f"--config.file={config}"),
            *(f"--storage.tsdb.path={tmp_path / 'tsdb'}", "--log.level=warn"),
            f"--web.listen-address=127.0.0.1:{prometheus_port}",
        ],
        tmp_path / "prometheus.log",
        env,
    )
    running = _Stack(
        kube_api.node,
        agent,
        scorer,
        prometheus,
        f"http://127.0.0.1:{scorer_port}",
        f"http://127.0.0.1:{prometheus_port}",
    )
    try:
        yield running
    finally:
        for process in (prometheus, scorer, agent):
            process.stop()


def _alerts(stack: _Stack) -> dict[str, dict[str, Any]]:
    return {a["labels"]["alertname"]: a for a in stack.api("alerts")["alerts"]}


def _rules(stack: _Stack) -> list[dict[str, Any]]:
    return [rule for group in stack.api("rules")["groups"] for rule in group["rules"]]


def _evaluated_at(rule: dict[str, Any]) -> float:
    # RFC 3339 with nanoseconds; seconds are precise enough here.
    stamp = re.sub(r"\.\d+", "", rule["lastEvaluation"]).replace("Z", "+00:00")
    return datetime.fromisoformat(stamp).timestamp()


def _names_only_filter(stack: _Stack) -> None:
    """One scheduling request, as kube-scheduler sends it in names-only mode."""
    pod = {
        "metadata": {"name": "trainer", "namespace": "default", "uid": "1"},
        "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
    }
    body = json.dumps({"Pod": pod, "Nodes": None, "NodeNames": [stack.node]}).encode()
    request = urllib.request.Request(f"{stack.scorer_url}/filter", data=body, method="POST")
    request.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(request, timeout=5) as response:
        assert json.load(response)["NodeNames"] == [stack.node]


def test_an_alert_fires_when_the_agent_stops(stack: _Stack) -> None:
    fresh = 'gpu_scorer_node_cache_data_nodes{status="fresh"} == 1'
    stack.until("the scorer to see fresh data from the agent", lambda: bool(stack.query(fresh)))
    stack.until(
        "both targets to be scraped",
        lambda: {t["health"] for t in stack.api("targets")["activeTargets"]} == {"up"},
    )
    # Every rule evaluated at least once since the data was fresh.
    since = time.time()
    stack.until("a rule evaluation", lambda: min(_evaluated_at(r) for r in _rules(stack)) > since)
    rules = _rules(stack)
    assert {r["name"] for r in rules} >= {ALERT, "GpuAgentNotWriting", "GpuNodeUnavailable"}
    assert [(r["name"], r["lastError"]) for r in rules if r["health"] != "ok"] == []
    assert _alerts(stack) == {}, "nothing is wrong yet"

    _names_only_filter(stack)
    queries = dashboard_queries()
    for expr in queries.values():
        stack.query(expr)  # raises unless Prometheus accepted and ran it
    shown = {
        "Node data age / A": "the agent's write age",
        "Node data age / B": "the node cache's oldest data",
        "Nodes by data status / A": "the node cache's data status",
        "Writes by reason / A": "the agent's writes",
        "Node cache state / A": "the node cache's readiness",
        "Scorer CPU by thread / A": "the scorer's CPU by thread",
    }
    stack.until(
        "the dashboard's panels to show data", lambda: all(stack.query(queries[w]) for w in shown)
    )

    assert stack.agent.stop() == 0, stack.logs()
    stopped = time.monotonic()
    pending_s = stack.until("the alert to go pending", lambda: ALERT in _alerts(stack))
    assert _alerts(stack)[ALERT]["state"] == "pending"
    firing_s = stack.until(
        "the alert to fire", lambda: _alerts(stack).get(ALERT, {}).get("state") == "firing"
    )
    alert = _alerts(stack)[ALERT]
    assert alert["labels"] == {"alertname": ALERT, "job": "gpu-scorer", "severity": "warning"}
    assert alert["annotations"]["description"].startswith(
        f"100% of the GPU nodes the scorer sees have data older than its stale-after of "
        f"{STALE_AFTER_S}s"
    )
    assert alert["annotations"]["runbook_url"].endswith("operations.md#gpunodesdatastale")
    # The stopped agent's own series went with it: only the scorer's view could fire.
    assert "GpuAgentNotWriting" not in _alerts(stack)
    assert firing_s > 1.5, "pending lasts the shortened `for:` (3 s)"
    print(
        f"after the agent stopped: pending in {pending_s:.1f} s, firing "
        f"{firing_s:.1f} s later ({time.monotonic() - stopped:.1f} s in all)"
    )
