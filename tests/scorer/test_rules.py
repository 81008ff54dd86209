"""Filter rules, data statuses and the two-clock freshness checks, one named case each."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from exporter_scheduler.core.policy import Policy
from exporter_scheduler.core.records import NodeInput, NodeVerdict
from gpu_contract.schema import Field, Health
from tests.scorer.scoring_builders import NOW, STRICT, node, one, pod, run

LENIENT = Policy()


def _check(
    verdict: NodeVerdict, *, passed: bool, reason: str | None, unresolvable: bool = False
) -> None:
    assert (verdict.passed, verdict.reason) == (passed, reason)
    assert verdict.unresolvable is (unresolvable and not passed)
    if not passed:
        assert verdict.score == 0


RULE_CASES = [
    pytest.param(node(utilization=0.50), None, True, None, False, id="utilization-below-limit"),
    pytest.param(node(utilization=0.90), None, True, None, False, id="utilization-at-limit-passes"),
    pytest.param(
        node(utilization=0.91), None, False, "gpu utilization above 0.90", False,
        id="utilization-above-limit",
    ),
    pytest.param(
        node(utilization=1.0), None, False, "gpu utilization above 0.90", False,
        id="utilization-full",
    ),
    pytest.param(
        node(utilization=0.75), pod(max_utilization="0.70"), False,
        "gpu utilization above 0.70", False, id="pod-limit-tightens",
    ),
    pytest.param(
        node(utilization=0.70), pod(max_utilization="0.70"), True, None, False,
        id="pod-limit-at-value-passes",
    ),
    pytest.param(
        node(utilization=0.93), pod(max_utilization="0.95"), False,
        "gpu utilization above 0.90", False, id="pod-limit-cannot-loosen",
    ),
    pytest.param(node(temperature_c=84), None, True, None, False, id="temperature-below-limit"),
    pytest.param(
        node(temperature_c=85), None, False, "gpu temperature at or above 85C", False,
        id="temperature-at-limit-fails",
    ),
    pytest.param(
        node(temperature_c=97), None, False, "gpu temperature at or above 85C", False,
        id="temperature-above-limit",
    ),
    pytest.param(node(temperature_c=None), None, True, None, False, id="temperature-unknown"),
    pytest.param(node(health=Health.DEGRADED), None, True, None, False, id="health-degraded"),
    pytest.param(
        node(health=Health.UNAVAILABLE), None, False, "gpu health unavailable", True,
        id="health-unavailable",
    ),
    pytest.param(
        node(health=Health.UNAVAILABLE, utilization=None, temperature_c=None), None, False,
        "gpu health unavailable", True, id="health-unavailable-without-values",
    ),
    pytest.param(
        node(overrides={Field.HEALTH: None}), None, True, None, False,
        id="health-missing-reads-degraded",
    ),
    pytest.param(
        node(largest_free_mib=39_999), pod(min_memory_mib="40000"), False,
        "gpu memory below 40000MiB free on one gpu", False, id="memory-below-hint",
    ),
    pytest.param(
        node(largest_free_mib=40_000), pod(min_memory_mib="40000"), True, None, False,
        id="memory-equal-hint-passes",
    ),
    pytest.param(
        node(largest_free_mib=0), None, True, None, False, id="memory-not-checked-without-hint"
    ),
    pytest.param(
        node(largest_free_mib=None), pod(min_memory_mib="40000"), True, None, False,
        id="memory-unknown-lenient",
    ),
    pytest.param(
        node(utilization=0.95, temperature_c=90, health=Health.UNAVAILABLE), None, False,
        "gpu health unavailable", True, id="first-failing-rule-health-wins",
    ),
    pytest.param(
        node(utilization=0.95, temperature_c=90), None, False, "gpu utilization above 0.90",
        False, id="utilization-before-temperature",
    ),
    pytest.param(
        node(temperature_c=90, largest_free_mib=1), pod(min_memory_mib="2"), False,
        "gpu temperature at or above 85C", False, id="temperature-before-memory",
    ),
]  # fmt: skip


@pytest.mark.parametrize(("the_node", "the_pod", "passed", "reason", "unresolvable"), RULE_CASES)
def test_rule(
    the_node: NodeInput, the_pod: Any, passed: bool, reason: str | None, unresolvable: bool
) -> None:
    verdict = one(the_node, the_pod)
    _check(verdict, passed=passed, reason=reason, unresolvable=unresolvable)
    # Timely data: the rules ran (utilization may still be absent, as on an unavailable node).
    assert verdict.data_status in ("fresh", "missing")
    assert verdict.rules.health.outcome != "not-checked"


STRICT_RULE_CASES = [
    pytest.param(node(temperature_c=None), None, "gpu temperature unknown", id="temperature"),
    pytest.param(
        node(largest_free_mib=None), pod(min_memory_mib="1"), "gpu memory unknown", id="memory"
    ),
]


@pytest.mark.parametrize(("the_node", "the_pod", "reason"), STRICT_RULE_CASES)
def test_strict_rejects_unknown_rule_input(the_node: NodeInput, the_pod: Any, reason: str) -> None:
    _check(one(the_node, the_pod, STRICT), passed=False, reason=reason, unresolvable=True)


def test_custom_limits_appear_in_reasons() -> None:
    policy = Policy(utilization_limit=0.875, temperature_limit_c=80, stale_after_s=90)
    assert one(node(utilization=0.88), policy=policy).reason == "gpu utilization above 0.875"
    assert one(node(temperature_c=80), policy=policy).reason == "gpu temperature at or above 80C"
    assert one(node(age_s=91), policy=policy).reason == "gpu data stale (older than 90s)"


# ------------------------------------------------------------------------ data status
STALE = "gpu data stale (older than 180s)"
STATUS_CASES = [
    pytest.param(NodeInput("n", {}), "missing", "gpu data missing", id="no-annotations"),
    pytest.param(
        # The original design's format, written before the version key: read as version 1.
        node(overrides={Field.SCHEMA_VERSION: None}), "fresh", None,
        id="schema-version-absent-reads-as-1",
    ),
    pytest.param(
        node(overrides={Field.SCHEMA_VERSION: None, Field.UPDATED_AT: None}), "missing",
        "gpu data missing", id="schema-version-and-updated-at-absent",
    ),
    pytest.param(
        node(overrides={Field.SCHEMA_VERSION: "2"}), "missing", "gpu data missing",
        id="schema-version-unknown",
    ),
    pytest.param(
        node(overrides={Field.UPDATED_AT: None}), "missing", "gpu data missing",
        id="updated-at-absent",
    ),
    pytest.param(
        node(overrides={Field.UPDATED_AT: "yesterday"}), "invalid", "gpu data invalid",
        id="updated-at-unparsable",
    ),
    pytest.param(
        node(overrides={Field.UPDATED_AT: "0001-01-01T00:00:00+01:00"}), "invalid",
        "gpu data invalid", id="updated-at-out-of-range",
    ),
    pytest.param(
        node(overrides={Field.SCHEMA_VERSION: None, Field.UPDATED_AT: "yesterday"}), "invalid",
        "gpu data invalid", id="version-less-record-with-unparsable-updated-at",
    ),
    pytest.param(
        node(overrides={Field.UTILIZATION: None}), "missing", "gpu data missing",
        id="utilization-absent",
    ),
    pytest.param(
        node(overrides={Field.UTILIZATION: "nan"}), "invalid", "gpu data invalid",
        id="utilization-nan",
    ),
    pytest.param(
        node(overrides={Field.UTILIZATION: "inf"}), "invalid", "gpu data invalid",
        id="utilization-inf",
    ),
    pytest.param(
        node(overrides={Field.UTILIZATION: "-0.1"}), "invalid", "gpu data invalid",
        id="utilization-negative",
    ),
    pytest.param(
        node(overrides={Field.UTILIZATION: "1.5"}), "invalid", "gpu data invalid",
        id="utilization-above-one",
    ),
    pytest.param(
        node(overrides={Field.UTILIZATION: "45%"}), "invalid", "gpu data invalid",
        id="utilization-unparsable",
    ),
    pytest.param(node(age_s=180), "fresh", None, id="age-at-stale-bound-is-fresh"),
    pytest.param(node(age_s=181), "stale", STALE, id="older-than-stale-bound"),
    pytest.param(node(age_s=-30), "fresh", None, id="future-within-skew-tolerance"),
    pytest.param(
        node(age_s=-31), "clock-skew", "gpu data clock skew", id="future-beyond-skew-tolerance"
    ),
    pytest.param(
        node(age_s=10, write_age_s=8), "fresh", None, id="written-after-sampling"
    ),
    pytest.param(
        node(age_s=5, write_age_s=35), "fresh", None, id="updated-at-ahead-within-lag-tolerance"
    ),
    pytest.param(
        node(age_s=5, write_age_s=36), "clock-skew", "gpu data clock skew",
        id="updated-at-ahead-of-server-write",
    ),
    pytest.param(
        node(age_s=5, write_age_s=600), "clock-skew", "gpu data clock skew",
        id="fresh-looking-data-server-saw-long-ago",
    ),
    pytest.param(
        node(age_s=170, write_age_s=181), "stale", STALE, id="server-write-older-than-stale"
    ),
    pytest.param(
        node(age_s=400, write_age_s=20), "stale", STALE, id="node-clock-behind-reads-stale"
    ),
]  # fmt: skip


@pytest.mark.parametrize(("the_node", "status", "reason"), STATUS_CASES)
def test_data_status_lenient(the_node: NodeInput, status: str, reason: str | None) -> None:
    verdict = one(the_node)
    assert verdict.data_status == status
    _check(verdict, passed=True, reason=reason)
    if status != "fresh":
        assert verdict.score == 0
        assert verdict.breakdown is None


@pytest.mark.parametrize(("the_node", "status", "reason"), STATUS_CASES)
def test_data_status_strict(the_node: NodeInput, status: str, reason: str | None) -> None:
    verdict = one(the_node, policy=STRICT)
    assert verdict.data_status == status
    if status == "fresh":
        _check(verdict, passed=True, reason=None)
    else:
        _check(verdict, passed=False, reason=reason, unresolvable=True)


@pytest.mark.parametrize(
    ("lead_s", "status"), [(30.0, "fresh"), (31.0, "clock-skew")], ids=["at", "past"]
)
def test_lag_tolerance_boundary_is_the_same_at_every_clock(lead_s: float, status: str) -> None:
    """updated-at leading the server's write by exactly the tolerance is accepted, a second more
    is clock skew, whatever `now` is: the lead is two stored times apart and must not move with
    the clock (two float ages subtracted drift across the boundary at some clocks)."""
    the_node = node(age_s=-lead_s, write_age_s=0.0)
    for step_us in range(0, 150_000_000, 1_234_567):
        now = NOW + timedelta(microseconds=step_us)
        assert one(the_node, now=now).data_status == status, f"{step_us} us after the write"


def test_a_value_the_contract_parser_trips_on_is_bad_data_not_a_crash() -> None:
    """A count too long for int() must not escape as an exception from the request path."""
    verdict = one(node(overrides={Field.MEMORY_FREE_MIB: "9" * 5000}), policy=STRICT)
    # Dropping the field alone (fresh) or the whole record (invalid) are both defined answers.
    assert verdict.data_status in ("fresh", "invalid")
    assert verdict.passed is (verdict.data_status == "fresh")


def test_stale_data_is_not_judged_by_its_values() -> None:
    """A stale reading of 0.99 is unknown, not overloaded: lenient passes it with score 0."""
    verdict = one(node(utilization=0.99, age_s=1000))
    assert verdict.passed
    assert [r.outcome for r in verdict.rules][:3] == ["not-checked"] * 3


def test_clock_skew_check_uses_the_managed_fields_time() -> None:
    """The same annotations are fresh without the server's time and skewed with an old one."""
    without = node(age_s=5)
    with_old_write = NodeInput(without.name, without.annotations, NOW.replace(hour=13))
    assert one(without).data_status == "fresh"
    assert one(with_old_write).data_status == "clock-skew"


def test_naive_times_are_read_as_utc() -> None:
    the_node = node(age_s=10)
    naive = NodeInput(the_node.name, the_node.annotations, NOW.replace(tzinfo=None))
    verdict = run([naive], now=NOW.replace(tzinfo=None)).verdicts[0]
    assert verdict.data_status == "fresh"
    assert verdict.age_s == 10.0
    assert verdict.server_age_s == 0.0


def test_ages_are_recorded_not_in_reason() -> None:
    verdict = one(node(age_s=400, write_age_s=390))
    assert (verdict.age_s, verdict.server_age_s) == (400.0, 390.0)
    assert verdict.reason == STALE


# ------------------------------------------------------------------- preemption mapping
def test_failed_and_unresolvable_split() -> None:
    nodes = [
        node("hot", utilization=0.95),
        node("warm", temperature_c=90),
        node("small", largest_free_mib=10),
        node("broken", health=Health.UNAVAILABLE),
        node("old", age_s=999),
        node("fine"),
    ]
    evaluation = run(nodes, pod(min_memory_mib="100"), STRICT)
    assert evaluation.failed() == {
        "hot": "gpu utilization above 0.90",
        "warm": "gpu temperature at or above 85C",
        "small": "gpu memory below 100MiB free on one gpu",
    }
    assert evaluation.unresolvable() == {
        "broken": "gpu health unavailable",
        "old": STALE,
    }
    assert evaluation.passed_names() == ["fine"]


# ------------------------------------------------------------------------------ policy
POLICY_ERRORS = [
    pytest.param({"utilization_limit": 1.5}, "utilization_limit", id="limit-above-one"),
    pytest.param({"utilization_limit": float("nan")}, "utilization_limit", id="limit-nan"),
    pytest.param({"temperature_limit_c": 0}, "temperature_limit_c", id="temperature-zero"),
    pytest.param({"temperature_limit_c": 85.5}, "temperature_limit_c", id="temperature-float"),
    pytest.param({"stale_after_s": 0}, "stale_after_s", id="stale-zero"),
    pytest.param({"stale_after_s": float("inf")}, "stale_after_s", id="stale-inf"),
    pytest.param({"clock_skew_tolerance_s": -1}, "clock_skew_tolerance_s", id="skew-negative"),
    pytest.param(
        {"managed_fields_lag_tolerance_s": -1}, "managed_fields_lag_tolerance_s",
        id="lag-negative",
    ),
    pytest.param({"missing_data": "maybe"}, "missing_data", id="missing-data-unknown"),
    pytest.param({"weight_utilization": -0.1}, "weight_utilization", id="weight-negative"),
    pytest.param(
        {"weight_utilization": 0, "weight_fragmentation": 0, "weight_temperature": 0},
        "must be at least", id="weights-all-zero",
    ),
    pytest.param({"gpu_resource_name": " "}, "gpu_resource_name", id="resource-empty"),
]  # fmt: skip


@pytest.mark.parametrize(("kwargs", "message"), POLICY_ERRORS)
def test_policy_rejects_bad_settings(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Policy(**kwargs)


def test_policy_defaults() -> None:
    policy = Policy()
    assert (policy.utilization_limit, policy.temperature_limit_c, policy.stale_after_s) == (
        0.90,
        85,
        180.0,
    )
    assert policy.missing_data == "lenient"
