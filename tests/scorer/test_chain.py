"""The GPU-model preference chain with its fallback threshold, case by case."""

from __future__ import annotations

import pytest

from exporter_scheduler.core.records import NodeInput
from tests.scorer.scoring_builders import A100, T4, V100, node, pod, run

A100_FIRST = "gpu model not preferred (A100 available)"
V100_KEPT = "gpu model not preferred (V100 available)"
UNLISTED = "gpu model not in preference list"

CASES = [
    pytest.param(
        [node("a1", model=A100, utilization=0.50), node("v1", model=V100, utilization=0.10)],
        "A100,V100", "0.80", "A100", "at-or-below-threshold", {"v1": A100_FIRST},
        id="preferred-model-below-threshold-kept",
    ),
    pytest.param(
        [
            node("a1", model=A100, utilization=0.85),
            node("a2", model=A100, utilization=0.88),
            node("v1", model=V100, utilization=0.30),
        ],
        "A100,V100", "0.80", "V100", "at-or-below-threshold", {"a1": V100_KEPT, "a2": V100_KEPT},
        id="every-a100-above-threshold-falls-back",
    ),
    pytest.param(
        [node("a1", model=A100, utilization=0.80), node("v1", model=V100, utilization=0.1)],
        "A100,V100", "0.80", "A100", "at-or-below-threshold", {"v1": A100_FIRST},
        id="at-threshold-counts-as-below",
    ),
    pytest.param(
        [node("a1", model=A100, utilization=0.85), node("v1", model=V100, utilization=0.86)],
        "A100,V100", "0.80", "A100", "all-above-threshold", {"v1": A100_FIRST},
        id="all-above-threshold-keeps-most-preferred-that-passes",
    ),
    pytest.param(
        [node("a1", model=A100, utilization=0.95), node("v1", model=V100, utilization=0.86)],
        "A100,V100", "0.80", "V100", "all-above-threshold",
        {"a1": "gpu utilization above 0.90"},
        id="preferred-model-over-the-limit-is-not-a-candidate",
    ),
    pytest.param(
        [node("a1", model=A100, utilization=0.60), node("v1", model=V100, utilization=0.1)],
        "A100,V100", None, "A100", "at-or-below-threshold", {"v1": A100_FIRST},
        id="no-threshold-means-any-passing-node",
    ),
    pytest.param(
        [node("a1", model=A100, utilization=0.50), node("t1", model=T4, utilization=0.0)],
        "A100,V100", "0.80", "A100", "at-or-below-threshold", {"t1": UNLISTED},
        id="unlisted-model-rejected",
    ),
    pytest.param(
        [node("t1", model=T4, utilization=0.0)],
        "A100,V100", "0.80", None, "no-candidate", {"t1": UNLISTED},
        id="only-unlisted-models",
    ),
    pytest.param(
        [node("a1", model=A100, utilization=0.85), node("t1", model=T4, utilization=0.2)],
        "A100,*", "0.80", "*", "at-or-below-threshold",
        {"a1": "gpu model not preferred (any model available)"},
        id="wildcard-takes-anything-else-last",
    ),
    pytest.param(
        [node("a1", model=A100, utilization=0.50), node("t1", model=T4, utilization=0.2)],
        "A100,*", "0.80", "A100", "at-or-below-threshold", {"t1": A100_FIRST},
        id="wildcard-not-needed",
    ),
    pytest.param(
        [node("x", model="mixed", utilization=0.1), node("v1", model=V100, utilization=0.5)],
        "A100,V100", None, "V100", "at-or-below-threshold", {"x": UNLISTED},
        id="mixed-model-node-is-unlisted",
    ),
    pytest.param(
        [node("a1", model=A100, age_s=999), node("v1", model=V100, utilization=0.85)],
        "A100,V100", "0.80", "A100", "all-above-threshold", {"v1": A100_FIRST},
        id="stale-node-keeps-its-model-rank-but-is-never-below-threshold",
    ),
    pytest.param(
        [node("a1", model=A100, age_s=999), node("v1", model=V100, utilization=0.2)],
        "A100,V100", "0.80", "V100", "at-or-below-threshold", {"a1": V100_KEPT},
        id="stale-preferred-node-loses-to-fresh-node-below-threshold",
    ),
    pytest.param(
        [NodeInput("gone", {}), node("a1", model=A100)],
        "A100", None, "A100", "at-or-below-threshold", {"gone": UNLISTED},
        id="node-without-data-has-no-model",
    ),
    pytest.param(
        [NodeInput("gone", {}), node("a1", model=A100, utilization=0.85)],
        "A100,*", "0.80", "A100", "all-above-threshold", {"gone": A100_FIRST},
        id="wildcard-covers-node-without-data",
    ),
]  # fmt: skip


@pytest.mark.parametrize(("nodes", "preference", "fallback", "chosen", "basis", "rejected"), CASES)
def test_chain(
    nodes: list[NodeInput],
    preference: str,
    fallback: str | None,
    chosen: str | None,
    basis: str,
    *,
    rejected: dict[str, str],
) -> None:
    evaluation = run(nodes, pod(preference=preference, fallback=fallback))
    assert evaluation.chain is not None
    assert (evaluation.chain.chosen, evaluation.chain.basis) == (chosen, basis)
    rejections = {**evaluation.failed(), **evaluation.unresolvable()}
    assert rejections == rejected
    assert evaluation.passed_names() == [n.name for n in nodes if n.name not in rejected]


def test_chain_rejections_are_unresolvable_and_score_zero() -> None:
    nodes = [node("a1", model=A100), node("v1", model=V100), node("t1", model=T4)]
    evaluation = run(nodes, pod(preference="A100,V100"))
    assert evaluation.unresolvable() == {"v1": A100_FIRST, "t1": UNLISTED}
    assert dict(evaluation.scores())["v1"] == 0
    model_rule = next(r for r in evaluation.verdicts[1].rules if r.rule == "model")
    assert (model_rule.rule, model_rule.outcome) == ("model", "fail")


def test_threshold_never_exceeds_the_utilization_limit() -> None:
    evaluation = run(
        [node("a1", model=A100, utilization=0.75), node("v1", model=V100, utilization=0.1)],
        pod(preference="A100,V100", fallback="0.95", max_utilization="0.70"),
    )
    assert evaluation.chain is not None
    assert evaluation.chain.threshold == 0.70
    assert evaluation.failed() == {"a1": "gpu utilization above 0.70"}
    assert evaluation.passed_names() == ["v1"]


def test_prioritize_on_the_filtered_nodes_keeps_the_same_choice() -> None:
    """The scheduler sends prioritize only what passed filter: the chain must not flip."""
    nodes = [
        node("a1", model=A100, utilization=0.85),
        node("v1", model=V100, utilization=0.30),
        node("v2", model=V100, utilization=0.60),
        node("t1", model=T4, utilization=0.0),
    ]
    the_pod = pod(preference="A100,V100", fallback="0.80")
    first = run(nodes, the_pod)
    passed = [n for n in nodes if n.name in first.passed_names()]
    second = run(passed, the_pod)
    assert second.passed_names() == first.passed_names() == ["v1", "v2"]
    assert second.scores() == [(n, s) for n, s in first.scores() if n in {"v1", "v2"}]


def test_chain_reason_is_uniform_across_nodes() -> None:
    nodes = [node(f"v{i}", model=V100, utilization=i / 10) for i in range(5)]
    evaluation = run([node("a1", model=A100), *nodes], pod(preference="A100,V100"))
    assert set(evaluation.unresolvable().values()) == {A100_FIRST}
