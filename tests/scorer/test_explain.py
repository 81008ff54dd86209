"""Explanations: complete, JSON-able, byte-for-byte deterministic; plus the real captures."""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exporter_scheduler.explain import explain, render_text
from exporter_scheduler.policy import Policy
from exporter_scheduler.scoring import NodeInput, PodInput, clear_decode_cache, evaluate
from gpu_contract.schema import FIELD_MANAGER, Health, parse_timestamp
from tests.fixture_paths import SCHEDULER_FIXTURES
from tests.scorer.scoring_builders import A100, NOW, PREFIX, V100, node, pod, run

FIXTURES = SCHEDULER_FIXTURES


def _dump(evaluation_pod: PodInput, nodes: list[NodeInput], policy: Policy | None = None) -> str:
    policy = policy or Policy()
    evaluation = evaluate(evaluation_pod, nodes, NOW, policy)
    return json.dumps(explain(evaluation, evaluation_pod, NOW, policy), sort_keys=True,
                      allow_nan=False)  # fmt: skip


def _mixed_nodes() -> list[NodeInput]:
    return [
        node("a1", model=A100, utilization=0.42, fragmentation=0.25, write_age_s=5),
        node("a2", model=A100, utilization=0.97),
        node("v1", model=V100, utilization=0.10, age_s=999),
        node("hot", temperature_c=92),
        node("sick", health=Health.UNAVAILABLE),
        NodeInput("blank", {}),
    ]


def test_explanation_is_byte_identical_for_the_same_input() -> None:
    the_pod = pod(preference="A100,V100", fallback="0.80", min_memory_mib="20000")
    clear_decode_cache()
    first = _dump(the_pod, _mixed_nodes())
    second = _dump(the_pod, _mixed_nodes())
    assert first == second


def test_explanation_holds_values_and_ages_the_reasons_leave_out() -> None:
    nodes = [node(f"n{i}", utilization=0.91 + i / 100, age_s=10 + i) for i in range(5)]
    the_pod = pod()
    evaluation = run(nodes, the_pod)
    assert set(evaluation.failed().values()) == {"gpu utilization above 0.90"}
    explanation = explain(evaluation, the_pod, NOW, Policy())
    by_name = {n["name"]: n for n in explanation["nodes"]}
    assert by_name["n3"]["inputs"]["utilization"] == 0.94
    assert by_name["n3"]["age_s"] == 13.0
    rule = next(r for r in by_name["n3"]["rules"] if r["rule"] == "utilization")
    assert rule == {
        "rule": "utilization",
        "outcome": "fail",
        "value": 0.94,
        "limit": "0.90",
        "reason": "gpu utilization above 0.90",
    }
    assert explanation["summary"]["reasons"] == {"gpu utilization above 0.90": 5}


def test_explanation_of_a_passing_node_shows_the_score_arithmetic() -> None:
    the_pod = pod()
    evaluation = run([node(utilization=0.42, fragmentation=0.25, temperature_c=61)], the_pod)
    explanation = explain(evaluation, the_pod, NOW, Policy())
    assert explanation["nodes"][0]["score_breakdown"] == {
        "utilization_headroom": 0.58,
        "fragmentation_headroom": 0.75,
        "temperature_headroom": 0.6,
        "temperature_headroom_span_c": 40,
        "percent": 60.85,
        "score": 6,
    }
    text = render_text(explanation)
    assert "100 x (0.7 x 0.58 + 0.15 x 0.75 + 0.15 x 0.6) / 1 = 60.85% -> 6/10" in text


def test_explanation_names_the_clock_evidence() -> None:
    the_pod = pod()
    evaluation = run([node("liar", age_s=2, write_age_s=600)], the_pod)
    explained = explain(evaluation, the_pod, NOW, Policy())["nodes"][0]
    assert explained["data_status"] == "clock-skew"
    assert explained["server_age_s"] == 600.0
    assert explained["updated_at_minus_write_time_s"] == 598.0


def test_explanation_of_an_invalid_hint() -> None:
    the_pod = pod(min_memory_mib="40Gi")
    evaluation = run([node()], the_pod)
    explanation = explain(evaluation, the_pod, NOW, Policy())
    assert explanation["hint_error"] == {
        "annotation": PREFIX + "min-gpu-memory-mib",
        "value": "40Gi",
        "problem": "not a whole number of MiB (digits only, no unit)",
        "reason": f"invalid pod annotation {PREFIX}min-gpu-memory-mib",
    }
    assert explanation["pod"]["hint_annotations"] == {PREFIX + "min-gpu-memory-mib": "40Gi"}
    assert "pod hint error" in render_text(explanation)


def test_render_text_lists_every_node_and_the_summary() -> None:
    the_pod = pod(preference="A100,V100", fallback="0.80")
    evaluation = run(_mixed_nodes(), the_pod)
    text = render_text(explain(evaluation, the_pod, NOW, Policy()))
    for name in ("a1", "a2", "v1", "hot", "sick", "blank"):
        assert f"\n{name}: " in text
    assert "model chain A100,V100 at 0.80: kept A100 (at-or-below-threshold)" in text
    assert "summary: 1/6 passed" in text
    assert "gpu health unavailable [unresolvable]" in text
    assert "gpu temperature at or above 85C [preemption may help]" in text


# ---------------------------------------------------------------- real captures
def _from_capture(body: Mapping[str, Any]) -> tuple[PodInput, list[NodeInput]]:
    """A plain-JSON reading of a captured request (the wire layer has its own tests)."""
    meta = body["Pod"]["metadata"]
    pod_input = PodInput(meta["namespace"], meta["name"], meta.get("annotations") or {}, 1)
    nodes = []
    for item in body["Nodes"]["items"]:
        metadata = item["metadata"]
        written = None
        for entry in metadata.get("managedFields") or []:
            if entry.get("manager") == FIELD_MANAGER and entry.get("time"):
                written = parse_timestamp(entry["time"])
        nodes.append(NodeInput(metadata["name"], metadata.get("annotations") or {}, written))
    return pod_input, nodes


CAPTURES = sorted((FIXTURES / "nodecache-false").glob("*.request.json"))


@pytest.mark.skipif(not CAPTURES, reason="kube-scheduler captures not present")
@pytest.mark.parametrize("path", CAPTURES, ids=lambda p: p.name)
def test_every_captured_request_gets_a_complete_verdict(path: Path) -> None:
    pod_input, nodes = _from_capture(json.loads(path.read_bytes()))
    meta = json.loads(path.with_name(path.name.replace(".request.", ".meta.")).read_bytes())
    now = datetime.fromtimestamp(meta["received_unix"], UTC)
    for policy in (Policy(), Policy(missing_data="strict")):
        evaluation = evaluate(pod_input, nodes, now, policy)
        assert [name for name, _ in evaluation.scores()] == [n.name for n in nodes]
        decided = set(evaluation.passed_names()) | set(evaluation.failed())
        assert decided | set(evaluation.unresolvable()) == {n.name for n in nodes}
        json.dumps(explain(evaluation, pod_input, now, policy), allow_nan=False)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.builds(
            NodeInput,
            name=st.text(max_size=6),
            annotations=st.dictionaries(
                st.one_of(st.text(max_size=12).map(lambda s: PREFIX + s), st.text(max_size=8)),
                st.text(max_size=12),
                max_size=6,
            ),
        ),
        max_size=5,
    ),
    st.dictionaries(st.text(max_size=30).map(lambda s: PREFIX + s), st.text(max_size=10)),
)
def test_explain_is_json_and_renders_for_any_input(
    nodes: list[NodeInput], annotations: dict[str, str]
) -> None:
    the_pod = PodInput("ns", "p", annotations)
    evaluation = evaluate(the_pod, nodes, NOW, Policy())
    explanation = explain(evaluation, the_pod, NOW, Policy())
    json.dumps(explanation, allow_nan=False)
    assert len(explanation["nodes"]) == len(nodes)
    assert isinstance(render_text(explanation), str)
