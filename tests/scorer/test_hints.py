"""Pod hints: parsing, model matching, and an invalid hint rejecting the pod everywhere."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from exporter_scheduler.core.hints import (
    NO_HINTS,
    HintError,
    PodHints,
    match_patterns,
    model_rank,
    parse_hints,
)
from exporter_scheduler.core.records import PodInput
from gpu_contract.schema import Keys
from tests.scorer.scoring_builders import PREFIX, node, pod, run

PREF = PREFIX + "gpu-model-preference"
FALLBACK = PREFIX + "gpu-fallback-utilization"
MAX_UTIL = PREFIX + "max-utilization"
MIN_MEM = PREFIX + "min-gpu-memory-mib"
LOAD = PREFIX + "expected-gpu-load"
SPREAD_MAX = PREFIX + "spread-max-per-domain"
SPREAD_KEY = PREFIX + "spread-topology-key"

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
    pytest.param({LOAD: "0.25"}, PodHints(expected_gpu_load=0.25), id="expected-load"),
    pytest.param({LOAD: " 1 "}, PodHints(expected_gpu_load=1.0), id="expected-load-full"),
    pytest.param({LOAD: "0"}, PodHints(expected_gpu_load=0.0), id="expected-load-none"),
    pytest.param(
        {MIN_MEM: "20000", LOAD: "0.5"},
        PodHints(min_gpu_memory_mib=20000, expected_gpu_load=0.5),
        id="expected-load-beside-memory",
    ),
    pytest.param({SPREAD_MAX: "2"}, PodHints(spread_max_per_domain=2), id="spread-cap"),
    pytest.param({SPREAD_MAX: " 1 "}, PodHints(spread_max_per_domain=1), id="spread-cap-spaces"),
    pytest.param(
        {SPREAD_MAX: "100000"}, PodHints(spread_max_per_domain=100_000), id="spread-cap-largest"
    ),
    pytest.param(
        {SPREAD_KEY: "topology.kubernetes.io/zone"},
        PodHints(spread_topology_key="topology.kubernetes.io/zone"),
        id="spread-key-prefixed",
    ),
    pytest.param(
        {SPREAD_KEY: " rack_1 "}, PodHints(spread_topology_key="rack_1"), id="spread-key-bare"
    ),
    pytest.param(
        {SPREAD_MAX: "1", SPREAD_KEY: "example.com/rack"},
        PodHints(spread_max_per_domain=1, spread_topology_key="example.com/rack"),
        id="spread-cap-and-key",
    ),
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
    pytest.param({LOAD: "half"}, LOAD, "not a number", id="expected-load-word"),
    pytest.param({LOAD: "50%"}, LOAD, "not a number", id="expected-load-percent"),
    pytest.param({LOAD: ""}, LOAD, "not a number", id="expected-load-empty"),
    pytest.param({LOAD: "nan"}, LOAD, "not a finite number", id="expected-load-nan"),
    pytest.param({LOAD: "1.5"}, LOAD, "between 0 and 1", id="expected-load-above-one"),
    pytest.param({LOAD: "-0.1"}, LOAD, "between 0 and 1", id="expected-load-negative"),
    pytest.param({LOAD: "1" * 40}, LOAD, "not a number", id="expected-load-huge-text"),
    pytest.param(
        {MIN_MEM: "x", LOAD: "x"}, MIN_MEM, "digits only", id="memory-named-before-expected-load"
    ),
    pytest.param({SPREAD_MAX: "0"}, SPREAD_MAX, "between 1 and 100000", id="spread-cap-zero"),
    pytest.param(
        {SPREAD_MAX: "100001"}, SPREAD_MAX, "between 1 and 100000", id="spread-cap-above-bound"
    ),
    pytest.param({SPREAD_MAX: "-1"}, SPREAD_MAX, "whole number", id="spread-cap-negative"),
    pytest.param({SPREAD_MAX: "1.5"}, SPREAD_MAX, "whole number", id="spread-cap-fraction"),
    pytest.param({SPREAD_MAX: "two"}, SPREAD_MAX, "whole number", id="spread-cap-word"),
    pytest.param({SPREAD_MAX: ""}, SPREAD_MAX, "whole number", id="spread-cap-empty"),
    pytest.param({SPREAD_MAX: "٣"}, SPREAD_MAX, "whole number", id="spread-cap-non-ascii"),
    pytest.param({SPREAD_MAX: "9" * 5000}, SPREAD_MAX, "whole number", id="spread-cap-huge"),
    pytest.param({SPREAD_KEY: ""}, SPREAD_KEY, "not a label key", id="spread-key-empty"),
    pytest.param({SPREAD_KEY: "rack name"}, SPREAD_KEY, "not a label key", id="spread-key-space"),
    pytest.param({SPREAD_KEY: "a/b/c"}, SPREAD_KEY, "not a label key", id="spread-key-two-slashes"),
    pytest.param({SPREAD_KEY: "/zone"}, SPREAD_KEY, "not a label key", id="spread-key-no-prefix"),
    pytest.param(
        {SPREAD_KEY: "Example.com/zone"},
        SPREAD_KEY,
        "not a label key",
        id="spread-key-upper-prefix",
    ),
    pytest.param({SPREAD_KEY: "x" * 64}, SPREAD_KEY, "not a label key", id="spread-key-too-long"),
    pytest.param(
        {SPREAD_MAX: "0", SPREAD_KEY: ""}, SPREAD_MAX, "between", id="spread-cap-named-before-key"
    ),
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
        pytest.param(pod(expected_gpu_load="lots"), id="expected-gpu-load"),
        pytest.param(pod(extra={SPREAD_MAX: "0"}), id="spread-cap"),
        pytest.param(pod(extra={SPREAD_KEY: "a b"}), id="spread-key"),
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
    st.sampled_from([PREF, FALLBACK, MAX_UTIL, MIN_MEM, LOAD, SPREAD_MAX, SPREAD_KEY]),
    st.text(max_size=80),
)
def test_every_hint_value_parses_or_names_its_annotation(key: str, value: str) -> None:
    parsed = parse_hints({key: value})
    if isinstance(parsed, HintError):
        assert parsed.annotation == key
        # The reason is uniform: the (pod-specific) value is in the explanation, not here.
        assert parsed.reason == f"invalid pod annotation {key}"
        assert parsed.value == value
