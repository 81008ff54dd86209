"""The score formula, its rounding, and the invariants of `evaluate` over arbitrary input."""

from __future__ import annotations

from datetime import timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exporter_scheduler.core.decoding import decode_values
from exporter_scheduler.core.judge import evaluate
from exporter_scheduler.core.policy import Policy
from exporter_scheduler.core.records import NodeInput, ScoreBreakdown
from exporter_scheduler.core.score import score as memoised_score
from gpu_contract.schema import DEFAULT_KEYS, Field, GpuState
from tests.scorer.scoring_builders import NOW, PREFIX, node, one, pod, run

ORIGINAL = Policy(
    own_load=False, weight_utilization=1, weight_fragmentation=0, weight_temperature=0
)


def test_worked_example_from_the_docs() -> None:
    verdict = one(node(utilization=0.42, fragmentation=0.25, temperature_c=61))
    assert verdict.breakdown == ScoreBreakdown(
        utilization_headroom_bp=5800,
        fragmentation_headroom_bp=7500,
        temperature_headroom_bp=6000,
        percent_bp=6085,
        score=6,
    )
    assert verdict.score == 6


ROUNDING = [
    pytest.param(0.55, 5, id="4.5-rounds-half-up-to-5"),
    pytest.param(0.56, 4, id="4.4-rounds-down"),
    pytest.param(0.45, 6, id="5.5-rounds-up-to-6"),
    pytest.param(0.05, 10, id="9.5-rounds-up-to-10"),
    pytest.param(0.0, 10, id="idle"),
    pytest.param(0.90, 1, id="at-limit"),
    pytest.param(0.96, 0, id="0.4-rounds-to-0"),
    pytest.param(0.95, 1, id="0.5-rounds-to-1"),
    pytest.param(0.07, 9, id="9.3-rounds-down"),
]


@pytest.mark.parametrize(("utilization", "score"), ROUNDING)
def test_original_design_score_rounds_half_up(utilization: float, score: int) -> None:
    """With only the utilization weight, the score is (1 - u) x 100 mapped to 0..10."""
    policy = Policy(
        own_load=False,
        weight_utilization=1,
        weight_fragmentation=0,
        weight_temperature=0,
        utilization_limit=1.0,
    )
    verdict = one(node(utilization=utilization), policy=policy)
    assert verdict.breakdown is not None
    assert verdict.breakdown.percent_bp == round((1 - utilization) * 10_000)
    assert verdict.score == score


TERMS = [
    pytest.param({"fragmentation": None}, "fragmentation", 0, id="fragmentation-unknown-is-none"),
    pytest.param({"fragmentation": 1.0}, "fragmentation", 0, id="fully-fragmented"),
    pytest.param({"fragmentation": 0.25}, "fragmentation", 7500, id="fragmentation-quarter"),
    pytest.param({"temperature_c": None}, "temperature", 0, id="temperature-unknown-is-none"),
    pytest.param({"temperature_c": 45}, "temperature", 10000, id="temperature-span-below-limit"),
    pytest.param({"temperature_c": 20}, "temperature", 10000, id="temperature-cool-clamped"),
    pytest.param({"temperature_c": -5}, "temperature", 10000, id="temperature-negative-clamped"),
    pytest.param({"temperature_c": 84}, "temperature", 250, id="temperature-just-below-limit"),
    pytest.param({"temperature_c": 70}, "temperature", 3750, id="temperature-midway"),
    pytest.param({"temperature_c": 71}, "temperature", 3500, id="temperature-integer-steps"),
]


@pytest.mark.parametrize(("overrides", "term", "headroom_bp"), TERMS)
def test_score_terms(overrides: dict[str, object], term: str, headroom_bp: int) -> None:
    defaults: dict[str, object] = {"utilization": 0.5, "fragmentation": 0.0, "temperature_c": 65}
    verdict = one(node(**{**defaults, **overrides}))  # type: ignore[arg-type]
    assert verdict.breakdown is not None
    assert getattr(verdict.breakdown, f"{term}_headroom_bp") == headroom_bp


def test_weights_only_matter_by_ratio() -> None:
    the_node = node(utilization=0.3, fragmentation=0.5, temperature_c=70)
    small_weights = Policy(
        own_load=False, weight_utilization=2, weight_fragmentation=1, weight_temperature=1
    )
    large_weights = Policy(
        own_load=False, weight_utilization=20, weight_fragmentation=10, weight_temperature=10
    )
    small = one(the_node, policy=small_weights)
    large = one(the_node, policy=large_weights)
    assert small.breakdown == large.breakdown


@pytest.mark.parametrize(
    "the_node",
    [
        pytest.param(node(age_s=999), id="stale"),
        pytest.param(NodeInput("n", {}), id="missing"),
        pytest.param(node(age_s=-999), id="clock-skew"),
        pytest.param(node(overrides={Field.UTILIZATION: "nan"}), id="invalid"),
        pytest.param(node(overrides={Field.UTILIZATION: None}), id="utilization-absent"),
    ],
)
def test_unknown_data_scores_lowest(the_node: NodeInput) -> None:
    verdict = one(the_node)
    assert verdict.passed
    assert verdict.score == 0
    assert verdict.breakdown is None


def test_less_loaded_scores_higher() -> None:
    evaluation = run([node("busy", utilization=0.8), node("idle", utilization=0.1)])
    scores = dict(evaluation.scores())
    assert scores["idle"] > scores["busy"]


def test_scores_follow_input_order_with_duplicate_names() -> None:
    evaluation = run([node("b", utilization=0.1), node("a"), node("b", utilization=0.8)])
    assert [name for name, _ in evaluation.scores()] == ["b", "a", "b"]


def test_same_input_same_output_regardless_of_decode_cache() -> None:
    nodes = [node(f"n{i}", utilization=i / 20, temperature_c=40 + i) for i in range(20)]
    decode_values.cache_clear()
    memoised_score.cache_clear()
    cold = run(nodes)
    warm = run(nodes)
    assert cold == warm


def test_decode_cache_does_not_confuse_prefixes() -> None:
    policy = Policy(own_load=False, keys=DEFAULT_KEYS.for_prefix("gpu.acme.io"))
    the_node = node(utilization=0.99)
    renamed = NodeInput(
        "n", {k.replace(PREFIX, "gpu.acme.io/"): v for k, v in the_node.annotations.items()}
    )
    assert not one(the_node).passed
    assert one(renamed).data_status == "missing"
    assert not one(renamed, policy=policy).passed
    assert one(the_node, policy=policy).data_status == "missing"


# --------------------------------------------------------------------- properties
_KEY = st.one_of(st.sampled_from([DEFAULT_KEYS[f] for f in Field]), st.text(max_size=30))
_VALUE = st.one_of(
    st.sampled_from(["0.5", "nan", "-inf", "1e309", "", " 1 ", "ok", "unavailable", "1"]),
    st.sampled_from(["2026-11-30T13:59:50Z", "2026-11-30T15:00:00+01:00", "9" * 5000]),
    # Per-GPU lists, well and badly formed, of agreeing and disagreeing lengths.
    st.sampled_from(["0.10,0.95,-,0.00", "1,0,-,1", "80000,-,1024,0", "50,90,-,60", "-,-", ","]),
    st.lists(st.sampled_from(["0.5", "-", "1", "0", "88", "x", ""]), max_size=9).map(",".join),
    st.text(max_size=40),
)
_ANNOTATIONS = st.dictionaries(_KEY, _VALUE, max_size=14)
_HINTS = st.dictionaries(
    st.sampled_from(
        [
            PREFIX + "gpu-model-preference",
            PREFIX + "gpu-fallback-utilization",
            PREFIX + "max-utilization",
            PREFIX + "min-gpu-memory-mib",
        ]
    ),
    st.one_of(st.sampled_from(["A100,V100", "0.8", "40000", "*", "A100,*"]), st.text(max_size=20)),
)
_NODES = st.lists(
    st.builds(
        NodeInput,
        name=st.text(min_size=1, max_size=8),
        annotations=st.one_of(
            _ANNOTATIONS,
            st.builds(
                lambda u, t, a: node(utilization=u, temperature_c=t, age_s=a).annotations,
                st.floats(0, 1),
                st.integers(-20, 120),
                st.floats(-100, 400),
            ),
            st.builds(
                lambda table, a: node(per_gpu=table, age_s=a).annotations,
                st.lists(
                    st.builds(
                        GpuState,
                        utilization=st.one_of(st.none(), st.floats(0, 1)),
                        memory_free_mib=st.one_of(st.none(), st.integers(0, 90_000)),
                        temperature_c=st.one_of(st.none(), st.integers(-20, 120)),
                        allocated=st.one_of(st.none(), st.booleans()),
                    ),
                    min_size=1,
                    max_size=8,
                ),
                st.floats(-100, 400),
            ),
        ),
        agent_write_time=st.one_of(
            st.none(), st.integers(-3600, 3600).map(lambda s: NOW + timedelta(seconds=s))
        ),
    ),
    max_size=8,
)
_POLICY = st.builds(
    Policy,
    missing_data=st.sampled_from(["lenient", "strict"]),
    utilization_limit=st.floats(0, 1),
)


@settings(max_examples=150, deadline=None)
@given(_NODES, _HINTS, _POLICY, st.integers(0, 9))
def test_evaluate_invariants(
    nodes: list[NodeInput], hints: dict[str, str], policy: Policy, gpus: int
) -> None:
    the_pod = pod(extra=hints, gpus=gpus)
    evaluation = evaluate(the_pod, nodes, NOW, policy)
    # Every node given appears exactly once, in input order.
    assert [v.name for v in evaluation.verdicts] == [n.name for n in nodes]
    assert [name for name, _ in evaluation.scores()] == [n.name for n in nodes]
    for verdict in evaluation.verdicts:
        assert isinstance(verdict.score, int)
        assert 0 <= verdict.score <= 10
        if not verdict.passed:
            # Never both passing and failing; a rejection always says why.
            assert verdict.score == 0
            assert verdict.reason
        else:
            assert not verdict.unresolvable
        if verdict.data_status != "fresh" and policy.missing_data == "strict":
            assert not verdict.passed
    names_failed = set(evaluation.failed()) | set(evaluation.unresolvable())
    names_passed = set(evaluation.passed_names())
    assert not (names_failed & names_passed) or len({n.name for n in nodes}) < len(nodes)
    assert evaluate(the_pod, nodes, NOW, policy) == evaluation


@given(st.floats(0, 1), st.floats(0, 1), st.integers(-50, 200))
def test_score_is_monotone_in_utilization(u1: float, frag: float, temperature_c: int) -> None:
    policy = Policy(own_load=False, utilization_limit=1.0, temperature_limit_c=150)
    low, high = sorted((u1, 1 - u1))
    a = one(node(utilization=low, fragmentation=frag, temperature_c=temperature_c), policy=policy)
    b = one(node(utilization=high, fragmentation=frag, temperature_c=temperature_c), policy=policy)
    assert a.score >= b.score


def test_no_nodes_gives_empty_answers() -> None:
    evaluation = run([], pod(preference="A100"))
    assert evaluation.scores() == []
    assert evaluation.passed_names() == []
    assert evaluation.chain is not None
    assert evaluation.chain.basis == "no-candidate"


@pytest.mark.parametrize(
    "value",
    [
        pytest.param(7, id="int"),
        pytest.param(None, id="none"),
        pytest.param(["0.5"], id="list-unhashable"),
    ],
)
def test_non_string_annotation_values_are_bad_data(value: object) -> None:
    """The wire layer types values as strings; a caller that does not still gets an answer."""
    annotations: dict[str, object] = dict(node().annotations)
    annotations[DEFAULT_KEYS[Field.UTILIZATION]] = value
    hints: dict[str, object] = {PREFIX + "max-utilization": 0.5}
    the_pod = pod(extra=hints)  # type: ignore[arg-type]
    verdict = one(NodeInput("n", annotations), the_pod)  # type: ignore[arg-type]
    assert verdict.data_status in ("invalid", "missing")
    assert verdict.score == 0
    assert verdict.reason == f"invalid pod annotation {PREFIX}max-utilization"
