"""The chart's agent RBAC and admission policy, rendered by helm, enforced by a real kube-apiserver.

The agent authenticates with a pod-bound service-account token, as in a cluster: the API server
puts the node its pod runs on into the token (`authentication.kubernetes.io/node-name`), and
the ValidatingAdmissionPolicy holds the agent to that Node and to the annotation prefix.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gpu_contract.schema import DEFAULT_KEYS, DEFAULT_PREFIX, Field
from loopback_cluster.control_plane import ControlPlane, KubeApi
from loopback_cluster.workload import agent_process, wait_for
from tests.e2e.support import AgentIdentity, Scope, installed_agent


@pytest.fixture
def agent_identity(scope: Scope) -> Iterator[AgentIdentity]:
    # Only the agent's own policy: the GPU-data policy would refuse the other tests' writes
    # on this shared control plane (it has a test module and a control plane of its own).
    with installed_agent(scope, policies=("agent-own-node-annotations",)) as identity:
        yield identity


def annotate(agent: KubeApi, node: str, annotations: dict[str, str | None]) -> tuple[int, str]:
    status, body = agent.raw(
        "PATCH",
        f"/api/v1/nodes/{node}?fieldManager=gpu-scheduler-agent",
        {"metadata": {"annotations": annotations}},
        content_type="application/merge-patch+json",
    )
    return status, body.decode(errors="replace")


PREFIX_KEY = DEFAULT_KEYS[Field.UTILIZATION]


def test_agent_token_writes_only_its_own_node_and_prefix(
    agent_identity: AgentIdentity, control_plane: ControlPlane, scope: Scope
) -> None:
    identity = agent_identity
    with control_plane.as_token(identity.token) as agent:
        # The binding takes effect when the API server's policy informer has it (about a
        # second): until then the other Node is writable, so wait for the first refusal.

        def refusal() -> tuple[int, str] | None:
            answer = annotate(agent, identity.other_node, {PREFIX_KEY: "0.10"})
            return answer if answer[0] == 403 else None

        refused = wait_for(
            "the admission policy to take effect", refusal, timeout_s=15, interval_s=0.2
        )
        assert "may change only the Node its pod runs on" in refused[1]

        status, body = annotate(agent, identity.own_node, {PREFIX_KEY: "0.42"})
        assert status == 200, body
        status, body = annotate(agent, identity.own_node, {PREFIX_KEY: None})
        assert status == 200, body

        status, body = annotate(agent, identity.own_node, {"example.com/owner": "mallory"})
        assert status == 403, body
        assert f"may add or change only annotations under {DEFAULT_PREFIX}" in body

        # A foreign key set by someone else may not be removed by the agent either.
        scope.api.merge_patch(
            f"/api/v1/nodes/{identity.own_node}",
            {"metadata": {"annotations": {"example.com/owner": "team-a"}}},
        )
        status, body = annotate(agent, identity.own_node, {"example.com/owner": None})
        assert status == 403, body
        assert "may remove only annotations under" in body

        status, body = agent.raw(
            "PATCH",
            f"/api/v1/nodes/{identity.own_node}",
            {"metadata": {"labels": {"nvidia.com/gpu.present": "false"}}},
            content_type="application/merge-patch+json",
        )
        assert status == 403, body
        assert "may not change Node labels" in body.decode()

        # RBAC: get and patch Nodes, nothing more.
        status, _ = agent.raw("GET", f"/api/v1/nodes/{identity.own_node}")
        assert status == 200
        status, _ = agent.raw("GET", "/api/v1/nodes")
        assert status == 403
        status, _ = agent.raw("DELETE", f"/api/v1/nodes/{identity.other_node}")
        assert status == 403


def test_real_agent_writes_through_the_policy_with_its_token(
    agent_identity: AgentIdentity, control_plane: ControlPlane, scope: Scope, tmp_path: Path
) -> None:
    identity = agent_identity
    kubeconfig = control_plane.token_kubeconfig(tmp_path / "agent.kubeconfig", identity.token)
    with control_plane.as_token(identity.token) as agent:
        wait_for(
            "the admission policy to take effect",
            lambda: annotate(agent, identity.other_node, {PREFIX_KEY: "0.10"})[0] == 403,
            timeout_s=15,
            interval_s=0.2,
        )
    for node, expected_exit in ((identity.own_node, 0), (identity.other_node, 1)):
        once = agent_process(tmp_path, node_name=node, kubeconfig=kubeconfig)
        once.argv = [a for a in once.argv if not a.startswith("--metrics-")]
        once.argv[once.argv.index("run")] = "once"
        once.start()
        assert once.popen is not None
        assert once.popen.wait(timeout=60) == expected_exit, once.log()
    annotations = scope.api.get(f"/api/v1/nodes/{identity.own_node}")["metadata"]["annotations"]
    assert annotations[DEFAULT_KEYS[Field.SCHEMA_VERSION]] == "1"
    other = scope.api.get(f"/api/v1/nodes/{identity.other_node}")["metadata"]["annotations"]
    assert DEFAULT_KEYS[Field.SCHEMA_VERSION] not in other
