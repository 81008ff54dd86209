"""Pod hints: parsing, model matching, and an invalid hint rejecting the pod everywhere."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from exporter_scheduler.hints import (
    NO_HINTS,
    HintError,
    PodHints,
    match_patterns,
    model_rank,
    parse_hints,
)
from exporter_scheduler.scoring import PodInput
from gpu_contract.schema import Keys
from tests.scorer.scoring_builders import PREFIX, node, pod, run

PREF = PREFIX + "gpu-model-preference"
FALLBACK = PREFIX + "gpu-fallback-utilization"
MAX_UTIL = PREFIX + "max-utilization"
MIN_MEM = PREFIX + "min-gpu-memory-mib"

VALID = [
    pytest.param({}, NO_HINTS, id="none"),
    pytest.param({"other.io/x": "y"}, NO_HINTS, id="unrelated-annotations"),
    pytest.param({PREF: "A100,V100"}, PodHints(("A100", "V100")), id="chain"),
    pytest.param({PREF: " A100 , V100 "}, PodHints(("A100", "V100")), id="chain-spaces"),
    pytest.param({PREF: "A100 80GB"}, PodHints(("A100-80GB",)), id="entry-space-to-dash"),
    pytest.param({PREF: "A100,*"}, PodHints(("A100", "*")), id="wildcard-last"),
    pytest.param({PREF: "A100,V100,A100"}, PodHints(("A100", "V100")), id="duplicate-kept-once"),
    pytest.param({FALLBACK: "0.80"}, PodHints(fallback_utilization=0.8), id="fallback"),
    pytest.param({MAX_UTIL: "0.7"}, PodHints(max_utilization=0.7), id="max-utilization"),
    pytest.param({MAX_UTIL: "0"}, PodHints(max_utilization=0.0), id="max-utilization-zero"),
    pytest.param({MAX_UTIL: "1"}, PodHints(max_utilization=1.0), id="max-utilization-one"),
    pytest.param({MIN_MEM: "40000"}, PodHints(min_gpu_memory_mib=40000), id="min-memory"),
    pytest.param({MIN_MEM: " 0 "}, PodHints(min_gpu_memory_mib=0), id="min-memory-zero"),
]


@pytest.mark.parametrize(("annotations", "expected"), VALID)
def test_valid_hints(annotations: dict[str, str], expected: PodHints) -> None:
    assert parse_hints(annotations) == expected


INVALID = [
    pytest.param({PREF: ""}, PREF, "empty preference list", id="chain-empty"),
    pytest.param({PREF: " "}, PREF, "empty preference list", id="chain-blank"),
    pytest.param({PREF: "A100,,V100"}, PREF, "empty entry", id="chain-empty-entry"),
    pytest.param({PREF: "A100,"}, PREF, "empty entry", id="chain-trailing-comma"),
    pytest.param({PREF: "*,A100"}, PREF, "last entry", id="wildcard-not-last"),
    pytest.param({PREF: ",".join(f"m{i}" for i in range(17))}, PREF, "more than 16", id="long"),
    pytest.param({PREF: "x" * 65}, PREF, "longer than 64", id="entry-too-long"),
    pytest.param({FALLBACK: "high"}, FALLBACK, "not a number", id="fallback-word"),
    pytest.param({FALLBACK: "80%"}, FALLBACK, "not a number", id="fallback-percent"),
    pytest.param({FALLBACK: "nan"}, FALLBACK, "not a finite number", id="fallback-nan"),
    pytest.param({FALLBACK: "1.2"}, FALLBACK, "between 0 and 1", id="fallback-above-one"),
    pytest.param({MAX_UTIL: "-0.1"}, MAX_UTIL, "between 0 and 1", id="max-negative"),
    pytest.param({MAX_UTIL: "inf"}, MAX_UTIL, "not a finite number", id="max-inf"),
    pytest.param({MAX_UTIL: "1" * 40}, MAX_UTIL, "not a number", id="max-huge-text"),
    pytest.param({MIN_MEM: "40Gi"}, MIN_MEM, "digits only", id="memory-unit"),
    pytest.param({MIN_MEM: "-1"}, MIN_MEM, "digits only", id="memory-negative"),
    pytest.param({MIN_MEM: "4.5"}, MIN_MEM, "digits only", id="memory-fraction"),
    pytest.param({MIN_MEM: "٤٠"}, MIN_MEM, "digits only", id="memory-non-ascii-digits"),
    pytest.param({MIN_MEM: "9" * 5000}, MIN_MEM, "digits only", id="memory-huge"),
    pytest.param({MIN_MEM: "99999999"}, MIN_MEM, "above", id="memory-above-cap"),
    pytest.param(
        {PREF: "", MIN_MEM: "x"}, PREF, "empty", id="first-bad-hint-in-fixed-order-is-named"
    ),
]


@pytest.mark.parametrize(("annotations", "annotation", "problem"), INVALID)
def test_invalid_hints(annotations: dict[str, str], annotation: str, problem: str) -> None:
    parsed = parse_hints(annotations)
    assert isinstance(parsed, HintError)
    assert parsed.annotation == annotation
    assert problem in parsed.problem
    assert parsed.reason == f"invalid pod annotation {annotation}"


def test_hints_follow_the_configured_prefix() -> None:
    keys = Keys.for_prefix("gpu.acme.io")
    assert parse_hints({"gpu.acme.io/max-utilization": "0.5"}, keys) == PodHints(
        max_utilization=0.5
    )
    assert parse_hints({MAX_UTIL: "0.5"}, keys) == NO_HINTS


MATCHES = [
    pytest.param("NVIDIA-A100-SXM4-80GB", "A100", True, id="token-in-product-name"),
    pytest.param("NVIDIA-A100-SXM4-80GB", "a100", True, id="case-insensitive"),
    pytest.param("NVIDIA-A100-80GB-PCIe", "A100-80GB", True, id="consecutive-tokens"),
    pytest.param("NVIDIA-A100-SXM4-80GB", "A100-80GB", False, id="tokens-not-consecutive"),
    pytest.param("NVIDIA-A10", "A100", False, id="no-partial-token"),
    pytest.param("NVIDIA-A100-SXM4-80GB", "A10", False, id="no-prefix-of-token"),
    pytest.param("NVIDIA-A100-SXM4-80GB", "NVIDIA-A100-SXM4-80GB", True, id="full-name"),
    pytest.param("Tesla-T4", "T4", True, id="short-token"),
    pytest.param("mixed", "A100", False, id="mixed-node-matches-no-model"),
    pytest.param(None, "A100", False, id="unknown-model"),
]


@pytest.mark.parametrize(("model", "entry", "matches"), MATCHES)
def test_model_matching(model: str | None, entry: str, matches: bool) -> None:
    patterns, any_rank = match_patterns((entry,))
    assert (model_rank(model, patterns, any_rank) == 0) is matches


def test_wildcard_matches_everything_at_its_rank() -> None:
    patterns, any_rank = match_patterns(("A100", "V100", "*"))
    assert model_rank("Tesla-V100-SXM2-16GB", patterns, any_rank) == 1
    assert model_rank("Tesla-T4", patterns, any_rank) == 2
    assert model_rank(None, patterns, any_rank) == 2


@pytest.mark.parametrize(
    "the_pod",
    [
        pytest.param(pod(min_memory_mib="40Gi"), id="memory"),
        pytest.param(pod(preference=""), id="preference"),
        pytest.param(pod(max_utilization="high"), id="max-utilization"),
        pytest.param(pod(fallback="2"), id="fallback"),
    ],
)
def test_invalid_hint_rejects_every_node_as_unresolvable(the_pod: PodInput) -> None:
    evaluation = run([node("a"), node("b", age_s=999), node("c", utilization=0.99)], the_pod)
    assert evaluation.hint_error is not None
    assert evaluation.hint_error.startswith("invalid pod annotation " + PREFIX)
    assert evaluation.passed_names() == []
    assert evaluation.failed() == {}
    assert set(evaluation.unresolvable().values()) == {evaluation.hint_error}
    assert evaluation.scores() == [("a", 0), ("b", 0), ("c", 0)]


def test_fallback_without_a_chain_has_no_effect() -> None:
    evaluation = run([node("a", utilization=0.85)], pod(fallback="0.10"))
    assert evaluation.passed_names() == ["a"]
    assert evaluation.chain is None


@given(st.dictionaries(st.text(max_size=60), st.text(max_size=80), max_size=6))
def test_parse_hints_never_raises(annotations: dict[str, str]) -> None:
    assert isinstance(parse_hints(annotations), PodHints | HintError)


@given(
    st.sampled_from([PREF, FALLBACK, MAX_UTIL, MIN_MEM]),
    st.text(max_size=80),
)
def test_every_hint_value_parses_or_names_its_annotation(key: str, value: str) -> None:
    parsed = parse_hints({key: value})
    if isinstance(parsed, HintError):
        assert parsed.annotation == key
        # The reason is uniform: the (pod-specific) value is in the explanation, not here.
        assert parsed.reason == f"invalid pod annotation {key}"
        assert parsed.value == value
