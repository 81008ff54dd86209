"""`require_agent_writer`: GPU annotations count only when managedFields show the agent wrote them.

The Nodes are built as the API server records writes (`kube_standins.nodes.with_agent_write` and the
same managedFields bookkeeping for another field manager, checked against a real v1.36 server
by the contract tests), then read through the scorer's own decoders: the full-node request
path (`wire.node_input_from_json`) and the names-only node cache's watch-event decoder.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from exporter_scheduler.core.judge import evaluate, written_by_agent
from exporter_scheduler.core.policy import Policy
from exporter_scheduler.core.records import NodeInput, PodInput
from exporter_scheduler.edges.nodecache import NodeCache
from exporter_scheduler.serving.wire import node_input_from_json
from gpu_contract.schema import DEFAULT_KEYS, Field, Health, NodeGpuState, encode
from kube_standins import objects as ko
from kube_standins.nodes import gpu_node, with_agent_write

NOW = datetime(2026, 11, 30, 14, 0, 0, tzinfo=UTC)
AGENT_AT = NOW - timedelta(seconds=20)
UTILIZATION = DEFAULT_KEYS[Field.UTILIZATION]
POD = PodInput("default", "trainer", {}, gpu_request=1)


def agent_annotations(utilization: float = 0.40) -> dict[str, str | None]:
    state = NodeGpuState(
        health=Health.OK,
        updated_at=AGENT_AT - timedelta(seconds=1),
        utilization=utilization,
        memory_fragmentation=0.1,
        memory_free_mib=160_000,
        memory_largest_free_mib=80_000,
        temperature_c=50,
        gpu_model="NVIDIA-A100-SXM4-80GB",
        gpu_count=8,
    )
    return dict(encode(state, DEFAULT_KEYS))


def foreign_write(
    node: dict[str, Any],
    manager: str,
    at: datetime,
    *,
    annotations: dict[str, str | None] | None = None,
    labels: dict[str, str] | None = None,
) -> dict[str, Any]:
    """`node` after another field manager's merge patch at server time `at`."""
    patch: dict[str, Any] = {"metadata": {}}
    if annotations:
        patch["metadata"]["annotations"] = annotations
    if labels:
        patch["metadata"]["labels"] = labels
    new = ko.canonical_node(ko.merge_patch(ko.canonical_node(node), patch))
    new["metadata"]["managedFields"] = ko.updated_managed_fields(
        node, new, ko.Manager(manager, "Update", ""), at
    )
    return ko.canonical_node(new)


def by_agent() -> dict[str, Any]:
    return with_agent_write(gpu_node("gpu-1"), agent_annotations(), AGENT_AT)


@dataclass(frozen=True)
class Case:
    node: dict[str, Any]
    trusted: bool


CASES = {
    "only the agent wrote": Case(by_agent(), True),
    "kubectl-annotate changed utilization after the agent": Case(
        foreign_write(by_agent(), "kubectl-annotate", NOW - timedelta(seconds=5),
                      annotations={UTILIZATION: "0.00"}),
        False,
    ),
    "kubectl-annotate changed it in the agent's second": Case(
        foreign_write(by_agent(), "kubectl-annotate", AGENT_AT, annotations={UTILIZATION: "0.00"}),
        False,
    ),
    "the agent wrote again after kubectl-annotate": Case(
        with_agent_write(
            foreign_write(
                by_agent(), "kubectl-annotate", AGENT_AT + timedelta(seconds=1),
                annotations={UTILIZATION: "0.00"},
            ),
            agent_annotations(0.55),
            AGENT_AT + timedelta(seconds=10),
        ),
        True,
    ),
    "a foreign key outside the prefix, after the agent": Case(
        foreign_write(by_agent(), "kubectl-annotate", NOW - timedelta(seconds=5),
                      annotations={"example.com/team": "vision"}),
        True,
    ),
    "a label under the same domain, after the agent": Case(
        foreign_write(by_agent(), "node-labeller", NOW - timedelta(seconds=5),
                      labels={"gpu-scheduler.example.com/pool": "training"}),
        True,
    ),
    "GPU data written only by kubectl-annotate": Case(
        foreign_write(gpu_node("gpu-1"), "kubectl-annotate", AGENT_AT,
                      annotations=agent_annotations()),
        False,
    ),
}  # fmt: skip


def names_only_input(node: dict[str, Any]) -> NodeInput:
    """What the node cache keeps from a watch event carrying `node`."""
    cache = NodeCache(keys=DEFAULT_KEYS)
    cache._apply(json.dumps({"type": "ADDED", "object": node}).encode())
    (found,) = cache.lookup([node["metadata"]["name"]])
    return found


@pytest.mark.parametrize("decode", ["full-node request", "names-only cache"])
@pytest.mark.parametrize("case_id", list(CASES))
def test_trust_follows_managed_fields(case_id: str, decode: str) -> None:
    case = CASES[case_id]
    if decode == "full-node request":
        node = node_input_from_json(json.dumps(case.node).encode())
    else:
        node = names_only_input(case.node)
    assert written_by_agent(node) is case.trusted

    lenient = Policy(require_agent_writer=True)
    (verdict,) = evaluate(POD, [node], NOW, lenient).verdicts
    if case.trusted:
        assert verdict.data_status == "fresh"
    else:
        # Unknown data under the lenient policy: passes, scores lowest, says why.
        assert (verdict.data_status, verdict.passed, verdict.score) == ("untrusted", True, 0)
        assert verdict.reason == "gpu data not written by the agent"
        (strict_verdict,) = evaluate(
            POD, [node], NOW, replace(lenient, missing_data="strict")
        ).verdicts
        assert not strict_verdict.passed
        assert strict_verdict.unresolvable
        assert strict_verdict.reason == "gpu data not written by the agent"


def test_off_by_default_the_data_is_judged_as_written() -> None:
    case = CASES["kubectl-annotate changed utilization after the agent"]
    node = node_input_from_json(json.dumps(case.node).encode())
    (verdict,) = evaluate(POD, [node], NOW, Policy()).verdicts
    assert verdict.data_status == "fresh"
    assert verdict.inputs.state is not None
    assert verdict.inputs.state.utilization == 0.0


def test_the_explanation_names_the_other_writer() -> None:
    from exporter_scheduler.serving.explain import explain, render_text  # noqa: PLC0415

    case = CASES["kubectl-annotate changed utilization after the agent"]
    node = node_input_from_json(json.dumps(case.node).encode())
    policy = Policy(require_agent_writer=True)
    evaluation = evaluate(POD, [node], NOW, policy)
    document = explain(evaluation, POD, NOW, policy)
    (entry,) = document["nodes"]
    assert entry["data_status"] == "untrusted"
    assert entry["foreign_writer"] == {
        "manager": "kubectl-annotate",
        "time": "2026-11-30T13:59:55Z",
    }
    text = render_text(document)
    assert "also set by field manager 'kubectl-annotate' at 2026-11-30T13:59:55Z" in text
    assert "only the agent's writes trusted" in text
