"""Faults on the real control plane: kube-apiserver restarted, the scorer killed and restarted.

These stop parts of the control plane, so they run on one of their own instead of the suite's.
"""

from __future__ import annotations

import re
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpu_contract.schema import DEFAULT_KEYS, Field
from loopback_cluster.control_plane import (
    ControlPlane,
    ExtenderConfig,
    KubeApi,
    SchedulerConfig,
    free_port,
)
from loopback_cluster.workload import (
    agent_process,
    gpu_pod,
    gpu_state,
    pod_events,
    pod_node,
    publish,
    scorer_process,
    wait_for,
)
from tests.e2e.support import Scope, started_control_plane

OUTAGE_S = 4.0
# After an outage kube-scheduler's informers retry with client-go's reflector back-off: 0.8 s
# doubling to a cap of 30 s, each delay stretched by up to as much again (jitter 1.0;
# tools/cache/reflector.go). An outage of 4 s and a restart that takes some seconds on a busy
# machine can leave a delay of 12.8-25.6 s before its Node watch is back; settling waits past
# the cap.
SCHEDULER_RECONNECT_S = 75.0


@pytest.fixture(scope="module")
def own_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    with started_control_plane(tmp_path_factory, "fault-plane") as plane:
        yield plane


@pytest.fixture
def fault_scope(own_plane: ControlPlane) -> Iterator[Scope]:
    with own_plane.admin() as api:
        scope = Scope(api, f"f{free_port()}", own_plane)
        try:
            yield scope
        finally:
            scope.cleanup()


def metric(text: str, name: str) -> float:
    """Sum of a metric's samples (all label sets) in a Prometheus text exposition."""
    pattern = re.compile(rf"^{re.escape(name)}(?:\{{[^}}]*\}})? (\S+)$", re.MULTILINE)
    return sum(float(value) for value in pattern.findall(text))


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        return str(response.read().decode())


def test_the_planes_pids_name_its_running_processes(own_plane: ControlPlane) -> None:
    """What `real_scheduler` reads each process's CPU by: etcd and kube-apiserver, running."""
    pids = own_plane.pids()
    assert set(pids) == {"etcd", "kube-apiserver"}
    for name, pid in pids.items():
        assert Path(f"/proc/{pid}/exe").resolve().name == name


def test_apiserver_restart_agent_writes_again_and_node_cache_follows(
    own_plane: ControlPlane, fault_scope: Scope, tmp_path: Path
) -> None:
    scope = fault_scope
    agent_node = scope.node("agent")
    # Cordoned: its simulated GPUs can be as idle as any, and the pod below must choose
    # between the two nodes whose data flips.
    scope.api.merge_patch(f"/api/v1/nodes/{agent_node}", {"spec": {"unschedulable": True}})
    cool, hot = scope.node("cool"), scope.node("hot")
    publish(scope.api, cool, gpu_state(utilization=0.10))
    publish(scope.api, hot, gpu_state(utilization=0.97))

    metrics_port = free_port()
    agent = agent_process(
        tmp_path,
        node_name=agent_node,
        kubeconfig=own_plane.admin_kubeconfig,
        metrics_port=metrics_port,
        extra_args=[
            "--sample-interval-s=0.25",
            "--min-write-interval-s=0.5",
            "--heartbeat-s=1",
            "--backoff-base-s=0.25",
            "--backoff-max-s=1",
            "--api-timeout=2",
        ],
    ).start()
    scorer = scorer_process(tmp_path, kubeconfig=own_plane.admin_kubeconfig).start().wait_ready()
    scheduler = own_plane.start_scheduler(
        SchedulerConfig("gpu-restart", ExtenderConfig(scorer.url, node_cache_capable=True)),
        name="kube-scheduler-restart",
    )
    try:
        updated_key = DEFAULT_KEYS[Field.UPDATED_AT]

        def agent_updated_at(api: KubeApi) -> str | None:
            value = api.get(f"/api/v1/nodes/{agent_node}")["metadata"]["annotations"].get(
                updated_key
            )
            return str(value) if value is not None else None

        wait_for("the agent's first write", lambda: agent_updated_at(scope.api), timeout_s=20)

        own_plane.stop_apiserver()
        scope.api.close()
        time.sleep(OUTAGE_S)
        assert agent.alive(), agent.log()
        assert scorer.alive(), scorer.log()
        failed_writes = metric(scrape(metrics_port), "gpu_agent_api_errors_total")
        assert failed_writes >= 1
        own_plane.start_apiserver()

        # The agent backs off (at most 1 s here) and writes again on the restarted server.
        before = agent_updated_at(scope.api)
        wait_for(
            "a write after the restart",
            lambda: (agent_updated_at(scope.api) or "") > (before or ""),
            timeout_s=20,
        )

        # The node cache reconnects (relisting if the server no longer holds its
        # resourceVersion), and follows data written after the restart: the GPU
        # state flips, and a pod created now must go to the node that is cool now.
        publish(scope.api, cool, gpu_state(utilization=0.98))
        publish(scope.api, hot, gpu_state(utilization=0.05))
        wait_for(
            "the scorer's node cache to reconnect",
            lambda: metric(scorer.metrics(), "gpu_scorer_node_cache_watch_restarts_total") >= 1,
            timeout_s=30,
        )
        scope.settle(timeout_s=SCHEDULER_RECONNECT_S)
        pod = scope.pod(gpu_pod(scope.name("after-restart"), scheduler_name="gpu-restart"))
        assert wait_for("the pod to bind", lambda: pod_node(scope.api, pod), timeout_s=30) == hot
    finally:
        scheduler.stop()
        own_plane.schedulers.pop("kube-scheduler-restart", None)
        scorer.kill()
        agent.kill()


def test_scorer_killed_with_a_pod_pending_then_restarted_binds_where_the_data_says(
    own_plane: ControlPlane, fault_scope: Scope, tmp_path: Path
) -> None:
    scope = fault_scope
    cool, hot = scope.node("cool"), scope.node("hot")
    publish(scope.api, cool, gpu_state(utilization=0.15))
    publish(scope.api, hot, gpu_state(utilization=0.95))

    port = free_port()
    scorer = scorer_process(tmp_path, kubeconfig=own_plane.admin_kubeconfig, port=port)
    scorer.start().wait_ready()
    # ignorable: false, so without the scorer the scheduler must wait, not place blind.
    extender = ExtenderConfig(scorer.url, node_cache_capable=True, ignorable=False)
    scheduler = own_plane.start_scheduler(
        SchedulerConfig("gpu-strict", extender), name="kube-scheduler-strict"
    )
    restarted = scorer
    try:
        scorer.kill()
        pod = scope.pod(gpu_pod(scope.name("pending"), scheduler_name="gpu-strict"))

        def extender_error() -> str | None:
            for reason, message in pod_events(scope.api, pod):
                if reason == "FailedScheduling" and "connection refused" in message:
                    return message
            return None

        wait_for("the extender error event", extender_error, timeout_s=30)
        assert pod_node(scope.api, pod) is None

        restarted = scorer_process(
            tmp_path, kubeconfig=own_plane.admin_kubeconfig, port=port, name="gpu-scorer-2"
        )
        restarted.start().wait_ready()
        # The scheduler retries with its pod back-off (at most 10 s by default).
        assert wait_for("the pod to bind", lambda: pod_node(scope.api, pod), timeout_s=30) == cool
    finally:
        scheduler.stop()
        own_plane.schedulers.pop("kube-scheduler-strict", None)
        restarted.kill()
        scorer.kill()
