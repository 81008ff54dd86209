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

from exporter_scheduler.core.decoding import decode_values
from exporter_scheduler.core.judge import evaluate
from exporter_scheduler.core.policy import Policy
from exporter_scheduler.core.records import NodeInput, PodInput
from exporter_scheduler.core.score import score as memoised_score
from exporter_scheduler.serving.explain import explain, render_text
from gpu_contract.schema import FIELD_MANAGER, Field, Health, parse_timestamp
from tests.fixture_paths import SCHEDULER_FIXTURES
from tests.scorer.scoring_builders import (
    A100,
    NOW,
    PREFIX,
    V100,
    Gpu,
    gpu_node,
    node,
    pod,
    run,
    runs,
)

FIXTURES = SCHEDULER_FIXTURES


def _dump(evaluation_pod: PodInput, nodes: list[NodeInput], policy: Policy | None = None) -> str:
    policy = policy or Policy(own_load=False)
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
    decode_values.cache_clear()
    memoised_score.cache_clear()
    first = _dump(the_pod, _mixed_nodes())
    second = _dump(the_pod, _mixed_nodes())
    assert first == second


def test_explanation_holds_values_and_ages_the_reasons_leave_out() -> None:
    nodes = [node(f"n{i}", utilization=0.91 + i / 100, age_s=10 + i) for i in range(5)]
    the_pod = pod()
    evaluation = run(nodes, the_pod)
    assert set(evaluation.failed().values()) == {"gpu utilization above 0.90"}
    explanation = explain(evaluation, the_pod, NOW, Policy(own_load=False))
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
    explanation = explain(evaluation, the_pod, NOW, Policy(own_load=False))
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
    explained = explain(evaluation, the_pod, NOW, Policy(own_load=False))["nodes"][0]
    assert explained["data_status"] == "clock-skew"
    assert explained["server_age_s"] == 600.0
    assert explained["updated_at_minus_write_time_s"] == 598.0


def test_explanation_of_an_invalid_hint() -> None:
    the_pod = pod(min_memory_mib="40Gi")
    evaluation = run([node()], the_pod)
    explanation = explain(evaluation, the_pod, NOW, Policy(own_load=False))
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
    text = render_text(explain(evaluation, the_pod, NOW, Policy(own_load=False)))
    for name in ("a1", "a2", "v1", "hot", "sick", "blank"):
        assert f"\n{name}: " in text
    assert "model chain A100,V100 at 0.80: kept A100 (at-or-below-threshold)" in text
    assert "summary: 1/6 passed" in text
    assert "gpu health unavailable [unresolvable]" in text
    assert "gpu temperature at or above 85C [preemption may help]" in text


def test_explanation_shows_the_per_gpu_table_and_the_counted_gpus() -> None:
    table = [
        Gpu(0.97, 1_024, 64, allocated=True),
        Gpu(0.00, 81_251, 38, allocated=False),
        Gpu(0.95, 80_000, 50, allocated=False),
        Gpu(0.02, 30_000, 40, allocated=False),
        Gpu(0.10, 60_000, 86, allocated=False),
        Gpu(0.01, 60_000, 41, offered=False),
        Gpu(lost=True),
        Gpu(0.05, 70_000, 42, allocated=False),
    ]
    the_pod = pod(gpus=2, min_memory_mib="40000")
    # Without the node-level temperature (written by hand), the hot GPU is judged per GPU.
    # Any 2 of the 5 GPUs in the device plugin's pool may be handed out; 1 pair in 10 fits.
    the_node = gpu_node("g", table, overrides={Field.TEMPERATURE: None})
    evaluation = run([the_node], the_pod)
    explained = explain(evaluation, the_pod, NOW, Policy(own_load=False))["nodes"][0]
    gpus = explained["gpus"]
    assert (gpus["needed"], gpus["candidates"], gpus["counted"]) == (2, 2, [1, 7])
    assert gpus["allocation_checked"] is True
    assert (gpus["pool"], gpus["fit_probability"], gpus["inflight"]) == (5, 0.1, 0)
    assert [(row["status"], row["why_not"], row["counted"]) for row in gpus["table"]] == [
        ("allocated", "allocated to pods", False),
        ("candidate", None, True),
        ("utilization", "utilization above 0.90", False),
        ("memory", "less than 40000MiB free", False),
        ("temperature", "temperature at or above 85C", False),
        ("not-offered", "not offered by the kubelet", False),
        ("unmeasured", "not measured", False),
        ("candidate", None, True),
    ]
    assert gpus["table"][0] == {
        "index": 0,
        "utilization": 0.97,
        "memory_free_mib": 1024,
        "temperature_c": 64,
        "allocated": True,
        "device": None,
        "status": "allocated",
        "why_not": "allocated to pods",
        "counted": False,
    }
    rules = {r["rule"]: r for r in explained["rules"]}
    assert rules["gpus"] == {
        "rule": "gpus",
        "outcome": "fail",
        "value": 2,
        "limit": "2 gpus",
        "reason": "gpu fit probability below 0.75",
    }
    assert rules["utilization"]["outcome"] == "per-gpu"
    text = render_text(explain(evaluation, the_pod, NOW, Policy(own_load=False)))
    assert (
        "gpus: 2 needed, 2 candidates, counted 1, 7, pool 5, fit probability 0.10 "
        "(allocations checked)"
    ) in text
    assert "      1  0.00     81251    38C      0  candidate, counted" in text
    assert "      6     -         -      -      -  not measured" in text
    assert "gpus fail (2 vs 2 gpus)" in text


def test_explanation_of_a_gpu_shortfall_and_of_a_pod_without_gpus() -> None:
    the_node = gpu_node("g", runs((3, Gpu(0.0)), (5, Gpu(0.97))))
    four = pod(gpus=4)
    evaluation = run([the_node], four)
    explained = explain(evaluation, four, NOW, Policy(own_load=False))
    assert explained["summary"]["reasons"] == {"fewer than 4 gpus at or below utilization 0.90": 1}
    assert explained["nodes"][0]["gpus"]["counted"] == []
    none = pod(gpus=0)
    unjudged = explain(run([the_node], none), none, NOW, Policy(own_load=False))["nodes"][0]["gpus"]
    assert (unjudged["needed"], unjudged["table"][0]["status"]) == (None, None)
    assert "gpus: per-gpu data, not judged per gpu" in render_text(
        explain(run([the_node], none), none, NOW, Policy(own_load=False))
    )
    assert (
        explain(run([node()], four), four, NOW, Policy(own_load=False))["nodes"][0]["gpus"] is None
    )


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
    for policy in (Policy(own_load=False), Policy(own_load=False, missing_data="strict")):
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
            annotations=st.one_of(
                st.dictionaries(
                    st.one_of(st.text(max_size=12).map(lambda s: PREFIX + s), st.text(max_size=8)),
                    st.text(max_size=12),
                    max_size=6,
                ),
                # Per-GPU tables with unmeasured values, and a bad list or two.
                st.builds(
                    lambda u, extra: {**gpu_node("x", [Gpu(v) for v in u]).annotations, **extra},
                    st.lists(st.sampled_from([None, 0.0, 0.5, 0.99]), min_size=1, max_size=4),
                    st.dictionaries(
                        st.sampled_from([PREFIX + "per-gpu-allocated", PREFIX + "gpu-count"]),
                        st.sampled_from(["1,0", "x", "-,1,0,1", "3"]),
                    ),
                ),
            ),
        ),
        max_size=5,
    ),
    st.dictionaries(st.text(max_size=30).map(lambda s: PREFIX + s), st.text(max_size=10)),
    st.integers(0, 5),
)
def test_explain_is_json_and_renders_for_any_input(
    nodes: list[NodeInput], annotations: dict[str, str], gpus: int
) -> None:
    the_pod = PodInput("ns", "p", annotations, gpus)
    evaluation = evaluate(the_pod, nodes, NOW, Policy(own_load=False))
    explanation = explain(evaluation, the_pod, NOW, Policy(own_load=False))
    json.dumps(explanation, allow_nan=False)
    assert len(explanation["nodes"]) == len(nodes)
    assert isinstance(render_text(explanation), str)
