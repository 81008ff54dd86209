"""The real `gpu-agent run` (simulated GPUs) writing onto a Node of the real kube-apiserver."""

from __future__ import annotations

import itertools
import os
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from agent.podresources_wire import ContainerDevices, DeviceGroup
from agent.simulated import SimulatedSource
from gpu_contract.schema import DEFAULT_KEYS, DEFAULT_PREFIX, FIELD_MANAGER, Field
from kube_standins.kubelet import PodResourcesStandIn
from loopback_cluster.control_plane import GPU_RESOURCE, ControlPlane
from loopback_cluster.workload import agent_process, wait_for
from tests.e2e.support import Scope

SAMPLE_S = 0.25
MIN_WRITE_S = 1.0
HEARTBEAT_S = 2.5
WATCH_S = 9.0
FIRST_WRITE_S = 30.0
# What polling the Node every 50 ms and a loaded 2-core machine can blur a write time by.
TIMING_SLACK_S = 0.3


def rate_args(*, seed: int) -> list[str]:
    """The agent's rate limits of this module, and its simulated trace's seed."""
    return [
        f"--sample-interval-s={SAMPLE_S}",
        f"--min-write-interval-s={MIN_WRITE_S}",
        f"--heartbeat-s={HEARTBEAT_S}",
        f"--seed={seed}",
    ]


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
        extra_args=rate_args(seed=3),
    ).start()
    try:
        # Every agent write changes `updated-at` (writes are a second or more apart), so each
        # one is a new resourceVersion carrying a new value of it.
        write_times: list[float] = []
        last_updated_at: str | None = None
        # The window opens at the first write, not at the start: on a loaded machine the
        # interpreter's start-up alone can take seconds, and it is not what is measured here.
        started = time.monotonic()
        node: dict[str, Any] = {}
        while time.monotonic() - (write_times[0] if write_times else started) < WATCH_S:
            if not write_times and time.monotonic() - started > FIRST_WRITE_S:
                raise AssertionError(f"no write within {FIRST_WRITE_S:g} s:\n{agent.log()}")
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


def test_agent_publishes_per_gpu_keys_with_the_kubelets_allocations(
    control_plane: ControlPlane, scope: Scope, log_dir: Path
) -> None:
    # The real agent (simulated GPUs) reads allocations from a real gRPC server on a unix
    # socket, answering pod-resources v1 as a kubelet does.
    gpus, seed = 4, 5
    source = SimulatedSource(gpus=gpus, seed=seed)
    uuids = [g.uuid for g in source.read(datetime.now(UTC)).gpus]
    source.close()
    socket_path = Path("/tmp") / f"gls-e2e-kubelet-{os.getpid()}.sock"
    node_name = scope.node("per-gpu", gpus=gpus)
    api = scope.api
    allocated_key = DEFAULT_KEYS[Field.PER_GPU_ALLOCATED]

    def annotations_once(expected_allocated: str) -> dict[str, str] | None:
        annotations = api.get(f"/api/v1/nodes/{node_name}")["metadata"]["annotations"]
        found: dict[str, str] = annotations
        return found if found.get(allocated_key) == expected_allocated else None

    with PodResourcesStandIn(socket_path) as kubelet:
        kubelet.serve(
            allocatable=[DeviceGroup(GPU_RESOURCE, tuple(uuids))],
            containers=[
                ContainerDevices("ml", "train-0", "main", (DeviceGroup(GPU_RESOURCE, (uuids[0],)),))
            ],
        )
        agent = agent_process(
            log_dir,
            node_name=node_name,
            kubeconfig=control_plane.admin_kubeconfig,
            extra_args=[
                *rate_args(seed=seed),
                f"--simulated-gpus={gpus}",
                f"--pod-resources-socket={socket_path}",
            ],
        ).start()
        try:
            annotations = wait_for(
                "the first write with allocations",
                lambda: annotations_once("1,0,0,0"),
                timeout_s=20,
                interval_s=0.1,
            )
            # A second pod takes GPU 3: the change reaches the Node within a write interval.
            kubelet.serve(
                allocatable=[DeviceGroup(GPU_RESOURCE, tuple(uuids))],
                containers=[
                    ContainerDevices(
                        "ml", "train-0", "main", (DeviceGroup(GPU_RESOURCE, (uuids[0],)),)
                    ),
                    ContainerDevices(
                        "ml", "serve-1", "main", (DeviceGroup(GPU_RESOURCE, (uuids[3],)),)
                    ),
                ],
            )
            wait_for(
                "the new allocation on the Node",
                lambda: annotations_once("1,0,0,1"),
                timeout_s=10,
                interval_s=0.1,
            )
            assert agent.alive(), agent.log()
            assert agent.terminate() == 0, agent.log()
        finally:
            agent.kill()
            socket_path.unlink(missing_ok=True)

    per_gpu = {
        field: annotations[DEFAULT_KEYS[field]].split(",")
        for field in (
            Field.PER_GPU_UTILIZATION,
            Field.PER_GPU_MEMORY_FREE_MIB,
            Field.PER_GPU_TEMPERATURE,
        )
    }
    assert all(len(values) == gpus for values in per_gpu.values()), per_gpu
    utilizations = [float(v) for v in per_gpu[Field.PER_GPU_UTILIZATION]]
    assert all(0.0 <= u <= 1.0 for u in utilizations)
    # The node-level keys summarize the same readings.
    assert float(annotations[DEFAULT_KEYS[Field.UTILIZATION_MAX]]) == max(utilizations)
    assert int(annotations[DEFAULT_KEYS[Field.TEMPERATURE]]) == max(
        int(v) for v in per_gpu[Field.PER_GPU_TEMPERATURE]
    )
    (entry,) = agent_entries(api.get(f"/api/v1/nodes/{node_name}"))
    owned = entry["fieldsV1"]["f:metadata"]["f:annotations"]
    assert f"f:{allocated_key}" in owned
