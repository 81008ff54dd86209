"""Only the agent writes GPU data: the chart's GPU-data policy on a real kube-apiserver.

A principal with `patch nodes` that is not the agent (a node-labelling controller, say) can no
longer add, change or remove an annotation under the prefix, and can still change labels and
other annotations; the agent still writes its own Node; a listed break-glass group can write.
The policy holds every writer but those, cluster admins included, so these tests run on a
control plane of their own rather than the suite's (whose tests write GPU data as admin).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from gpu_contract.schema import DEFAULT_KEYS, DEFAULT_PREFIX, Field
from kube_standins.nodes import gpu_node
from loopback_cluster.control_plane import ControlPlane, KubeApi, free_port
from loopback_cluster.workload import apply, gpu_state, publish, wait_for
from tests.deploy.chart_support import FULLNAME
from tests.e2e.support import AgentIdentity, Scope, installed_agent, started_control_plane

BREAK_GLASS_GROUP = "gpu-oncall"
POLICY = f"{FULLNAME}-gpu-data-writers"
UTILIZATION = DEFAULT_KEYS[Field.UTILIZATION]
MERGE = "application/merge-patch+json"


@pytest.fixture(scope="module")
def own_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    with started_control_plane(tmp_path_factory, "policy-plane") as plane:
        yield plane


@dataclass
class Writers:
    agent: KubeApi
    labeller: KubeApi  # has get + patch on Nodes, like a node-labelling controller
    oncall: KubeApi  # the same RBAC, in the break-glass group
    admin: KubeApi  # system:masters
    identity: AgentIdentity


@pytest.fixture(scope="module")
def writers(own_plane: ControlPlane) -> Iterator[Writers]:
    with own_plane.admin() as admin:
        scope = Scope(admin, f"g{free_port()}", own_plane)
        values = {"gpuDataPolicy": {"breakGlass": {"groups": [BREAK_GLASS_GROUP]}}}
        # GPU data on both Nodes before the policy exists, as the agent would have left it.
        with installed_agent(
            scope,
            policies=("agent-own-node-annotations", "gpu-data-writers"),
            values=values,
        ) as identity:
            role = {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRole",
                "metadata": {"name": "node-labeller"},
                "rules": [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "patch"]}],
            }
            apply(admin, role)
            for subject_kind, subject in (("User", "node-labeller"), ("Group", BREAK_GLASS_GROUP)):
                apply(
                    admin,
                    {
                        "apiVersion": "rbac.authorization.k8s.io/v1",
                        "kind": "ClusterRoleBinding",
                        "metadata": {"name": f"node-labeller-{subject.lower()}"},
                        "roleRef": {
                            "apiGroup": "rbac.authorization.k8s.io",
                            "kind": "ClusterRole",
                            "name": "node-labeller",
                        },
                        "subjects": [
                            {
                                "apiGroup": "rbac.authorization.k8s.io",
                                "kind": subject_kind,
                                "name": subject,
                            }
                        ],
                    },
                )
            with (
                own_plane.as_token(identity.token) as agent,
                own_plane.as_user("node-labeller") as labeller,
                own_plane.as_user("alice", groups=[BREAK_GLASS_GROUP]) as oncall,
            ):
                # Both policies take effect when the API server's informer has them. Each probe
                # writes a new value: a patch that changes nothing is (rightly) admitted.
                probes = itertools.count()

                def refused() -> bool:
                    value = f"0.{next(probes) % 100:02d}"
                    return patch(labeller, identity.other_node, {UTILIZATION: value})[0] == 403

                wait_for("the GPU-data policy", refused, timeout_s=15, interval_s=0.2)
                yield Writers(agent, labeller, oncall, admin, identity)
        scope.cleanup()


def patch(
    api: KubeApi, node: str, annotations: dict[str, str | None], *, manager: str = "e2e"
) -> tuple[int, str]:
    status, body = api.raw(
        "PATCH",
        f"/api/v1/nodes/{node}?fieldManager={manager}",
        {"metadata": {"annotations": annotations}},
        content_type=MERGE,
    )
    return status, body.decode(errors="replace")


@pytest.fixture
def node_with_data(writers: Writers) -> str:
    """The agent's own Node, with fresh GPU data the agent wrote."""
    node = writers.identity.own_node
    status, body = patch(writers.agent, node, {UTILIZATION: "0.50"}, manager="gpu-scheduler-agent")
    assert status == 200, body
    return node


DENIED = f"{POLICY}: only the GPU agent"


@pytest.mark.parametrize(
    ("case", "annotations"),
    [
        ("change a GPU value", {UTILIZATION: "0.00"}),
        ("add a GPU key", {DEFAULT_PREFIX + "temperature": "20"}),
        ("add an unknown key under the prefix", {DEFAULT_PREFIX + "note": "hi"}),
        ("remove a GPU key", {UTILIZATION: None}),
    ],
)
def test_a_node_writer_that_is_not_the_agent_cannot_touch_gpu_data(
    writers: Writers, node_with_data: str, case: str, annotations: dict[str, str | None]
) -> None:
    for who, api in (("labeller", writers.labeller), ("cluster admin", writers.admin)):
        status, body = patch(api, node_with_data, annotations)
        assert status == 403, (case, who, body)
        assert DENIED in body, body
        assert f"may add, change or remove annotations under {DEFAULT_PREFIX}" in body
    stored = writers.admin.get(f"/api/v1/nodes/{node_with_data}")["metadata"]["annotations"]
    assert stored[UTILIZATION] == "0.50"


def test_labels_other_annotations_and_status_stay_open(
    writers: Writers, node_with_data: str
) -> None:
    status, body = patch(writers.labeller, node_with_data, {"example.com/team": "vision"})
    assert status == 200, body
    status, body = writers.labeller.raw(
        "PATCH",
        f"/api/v1/nodes/{node_with_data}",
        {"metadata": {"labels": {"example.com/pool": "training"}}},
        content_type=MERGE,
    )
    assert status == 200, body
    # The kubelet's status updates pass: no GPU annotation changes.
    status, body = writers.admin.raw(
        "PATCH",
        f"/api/v1/nodes/{node_with_data}/status",
        {"status": {"allocatable": {"nvidia.com/gpu": "7"}}},
        content_type=MERGE,
    )
    assert status == 200, body


def test_the_agent_still_writes_its_own_node(writers: Writers) -> None:
    node = writers.identity.own_node
    state = gpu_state(utilization=0.33)
    stored = publish(writers.agent, node, state)
    assert stored["metadata"]["annotations"][UTILIZATION] == "0.33"


def test_the_break_glass_group_may_clear_gpu_data(writers: Writers, node_with_data: str) -> None:
    status, body = patch(writers.oncall, node_with_data, {UTILIZATION: None})
    assert status == 200, body
    stored = writers.admin.get(f"/api/v1/nodes/{node_with_data}")["metadata"]["annotations"]
    assert UTILIZATION not in stored


def test_a_node_cannot_be_created_with_gpu_data(writers: Writers) -> None:
    node = gpu_node(f"{writers.identity.own_node}-new", annotations={UTILIZATION: "0.00"})
    for key in ("uid", "creationTimestamp", "managedFields"):
        node["metadata"].pop(key, None)
    status, body = writers.admin.raw("POST", "/api/v1/nodes", node)
    assert status == 403, body
    assert DENIED in body.decode()
