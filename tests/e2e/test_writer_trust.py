"""The scorer's `--require-agent-writer` on the real control plane: faked GPU data is not believed.

Another principal with `patch nodes` writes `utilization: 0.00` onto a hot Node (here without
the chart's GPU-data admission policy, which would refuse the write: this is the scorer's own
line of defence). A scorer that requires the agent's writes reads the managedFields the API
server recorded, treats that Node's data as unknown (lowest score), and the pod goes to the
cool Node whose data the agent wrote; a scorer without the option believes the fake.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from loopback_cluster.control_plane import ControlPlane, ExtenderConfig, SchedulerConfig
from loopback_cluster.workload import (
    gpu_pod,
    gpu_state,
    pod_node,
    publish,
    scorer_process,
    wait_for,
)
from tests.e2e.support import Scope


@pytest.fixture(params=[True, False], ids=["require-agent-writer", "trust-any-writer"])
def scheduler_name(
    request: pytest.FixtureRequest, control_plane: ControlPlane, tmp_path: Path
) -> Iterator[tuple[str, bool]]:
    required: bool = request.param
    extra = ["--require-agent-writer" if required else "--no-require-agent-writer"]
    scorer = scorer_process(
        tmp_path, kubeconfig=control_plane.admin_kubeconfig, extra_args=extra
    ).start()
    scorer.wait_ready()
    name = f"gpu-trust-{'on' if required else 'off'}"
    control_plane.start_scheduler(
        SchedulerConfig(name, ExtenderConfig(scorer.url, node_cache_capable=True)),
        name=f"kube-scheduler-{name}",
    )
    try:
        yield name, required
    finally:
        control_plane.stop_scheduler(f"kube-scheduler-{name}")
        scorer.kill()


def test_faked_gpu_data_steers_no_pod(scheduler_name: tuple[str, bool], scope: Scope) -> None:
    name, required = scheduler_name
    api = scope.api
    cool, hot = scope.node("cool"), scope.node("hot")
    publish(api, cool, gpu_state(utilization=0.35))
    publish(api, hot, gpu_state(utilization=0.97))
    # The same merge patch a script would send, under its own field manager.
    publish(api, hot, gpu_state(utilization=0.00), field_manager="kubectl-annotate")
    scope.settle()
    pod = scope.pod(gpu_pod(scope.name("trainer"), scheduler_name=name))
    placed = wait_for("the pod to bind", lambda: pod_node(api, pod), timeout_s=30)
    assert placed == (cool if required else hot)
