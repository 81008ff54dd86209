"""The real `gpu-agent run` (simulated GPUs) writing onto a Node of the real kube-apiserver."""

from __future__ import annotations

import itertools
import time
from pathlib import Path
from typing import Any

from gpu_contract.schema import DEFAULT_KEYS, DEFAULT_PREFIX, FIELD_MANAGER, Field
from gpu_sim.cluster import ControlPlane
from gpu_sim.cluster_workload import agent_process
from tests.e2e.support import Scope

SAMPLE_S = 0.25
MIN_WRITE_S = 1.0
HEARTBEAT_S = 2.5
WATCH_S = 9.0
# What polling the Node every 50 ms and a loaded 2-core machine can blur a write time by.
TIMING_SLACK_S = 0.3


def agent_entries(node: dict[str, Any]) -> list[dict[str, Any]]:
    return [e for e in node["metadata"]["managedFields"] if e["manager"] == FIELD_MANAGER]


def test_agent_writes_its_own_keys_at_the_configured_rates_and_stops_on_sigterm(
    control_plane: ControlPlane, scope: Scope, log_dir: Path
) -> None:
    api = scope.api
    node_name = scope.node("agent")
    # Another writer's annotation, and a key under the prefix that no schema defines any more.
    api.merge_patch(
        f"/api/v1/nodes/{node_name}",
        {"metadata": {"annotations": {"example.com/owner": "team-a"}}},
        field_manager="kubectl-annotate",
    )
    obsolete = DEFAULT_PREFIX + "obsolete-key"
    api.merge_patch(
        f"/api/v1/nodes/{node_name}",
        {"metadata": {"annotations": {obsolete: "1"}}},
        field_manager="kubectl-annotate",
    )

    agent = agent_process(
        log_dir,
        node_name=node_name,
        kubeconfig=control_plane.admin_kubeconfig,
        extra_args=[
            f"--sample-interval={SAMPLE_S}",
            f"--min-write-interval={MIN_WRITE_S}",
            f"--heartbeat={HEARTBEAT_S}",
            "--seed=3",
        ],
    ).start()
    try:
        # Every agent write changes `updated-at` (writes are a second or more apart), so each
        # one is a new resourceVersion carrying a new value of it.
        write_times: list[float] = []
        last_updated_at: str | None = None
        started = time.monotonic()
        node: dict[str, Any] = {}
        while time.monotonic() - started < WATCH_S:
            node = api.get(f"/api/v1/nodes/{node_name}")
            updated_at = node["metadata"]["annotations"].get(DEFAULT_KEYS[Field.UPDATED_AT])
            if updated_at is not None and updated_at != last_updated_at:
                write_times.append(time.monotonic())
                last_updated_at = updated_at
            time.sleep(0.05)
        assert agent.alive(), agent.log()
        exit_code = agent.terminate()
    finally:
        agent.kill()

    assert exit_code == 0, agent.log()
    assert "gpu-agent stopped" in agent.log()

    annotations = node["metadata"]["annotations"]
    assert annotations[DEFAULT_KEYS[Field.SCHEMA_VERSION]] == "1"
    assert annotations[DEFAULT_KEYS[Field.HEALTH]] == "ok"
    assert annotations["example.com/owner"] == "team-a"
    assert obsolete not in annotations

    (entry,) = agent_entries(node)
    assert entry["operation"] == "Update"
    owned = entry["fieldsV1"]["f:metadata"]["f:annotations"]
    assert f"f:{DEFAULT_KEYS[Field.UTILIZATION]}" in owned
    assert "f:example.com/owner" not in owned
    others = [e for e in node["metadata"]["managedFields"] if e["manager"] == "kubectl-annotate"]
    assert "f:example.com/owner" in others[0]["fieldsV1"]["f:metadata"]["f:annotations"]

    gaps_s = [b - a for a, b in itertools.pairwise(write_times)]
    assert len(write_times) >= WATCH_S / HEARTBEAT_S, write_times
    assert min(gaps_s) >= MIN_WRITE_S - TIMING_SLACK_S, gaps_s
    assert max(gaps_s) <= HEARTBEAT_S + SAMPLE_S + TIMING_SLACK_S, gaps_s
