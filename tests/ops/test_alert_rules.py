"""The alert rules: one source (the chart), checked and unit-tested by the real promtool.

The plain rules file must be what the chart renders with its defaults; promtool must accept both
it and a PrometheusRule rendered with other values; every alert must be shown firing and shown
silent by prometheus/tests, and those tests must fail when an alert never fires or loses its
`for:`. Each alert carries a summary, a description and a runbook_url whose anchor exists in
docs/operations.md.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.chart_support import NAMESPACE, HelmError, render
from tests.ops.ops_support import (
    OPERATIONS_DOC,
    RULES_FILE,
    UNIT_TESTS,
    exported_metric_names,
    promtool,
)
from tests.ops.promql_names import metric_names
from tests.ops.rules_file import chart_rules, plain_rules_text

pytestmark = pytest.mark.helm


def _alerts(spec: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {rule["alert"]: rule for group in spec["groups"] for rule in group["rules"]}


def _plain() -> dict[str, Any]:
    loaded = yaml.safe_load(RULES_FILE.read_text())
    assert isinstance(loaded, dict)
    return loaded


def _write_rules(path: Path, spec: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


# ---------------------------------------------------------------------- one source


def test_plain_rules_file_is_the_chart_rendered_with_its_defaults() -> None:
    rendered = chart_rules()
    assert _plain() == rendered
    # Byte for byte too, so a hand edit of the generated file is caught.
    assert RULES_FILE.read_text() == plain_rules_text(rendered), "run `python3 dev.py rules`"


def test_the_rule_is_off_by_default_and_a_prometheus_rule_when_on() -> None:
    assert not render("defaults").of_kind("PrometheusRule")
    (rule,) = render("prometheus-rule").of_kind("PrometheusRule")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["metadata"]["namespace"] == NAMESPACE
    assert rule["metadata"]["labels"]["release"] == "prom"
    assert _alerts(rule["spec"]).keys() == _alerts(_plain()).keys()


def test_thresholds_follow_the_chart_values() -> None:
    defaults = _alerts(chart_rules())
    assert defaults["GpuAgentNotWriting"]["expr"] == "gpu_agent_last_write_age_seconds > 180"
    assert defaults["GpuScorerLatencyNearTimeout"]["expr"].endswith(") > 1")  # 0.5 x 2s
    # The agent alert follows the scorer's stale-after, itself 3 heartbeats unless set.
    heartbeat = _alerts(chart_rules({"agent": {"heartbeatSeconds": 30}}))
    assert heartbeat["GpuAgentNotWriting"]["expr"].endswith("> 90")
    assert "stale-after of 90s" in heartbeat["GpuNodesDataStale"]["annotations"]["description"]
    tuned = _alerts(
        chart_rules(
            {
                "scorer": {"staleAfterSeconds": 120},
                "scheduler": {"extender": {"httpTimeout": "1m30s"}},
                "prometheusRule": {
                    "staleNodesFraction": 0.25,
                    "relistsPerHour": 10,
                    "latencyFractionOfTimeout": 0.8,
                },
            }
        )
    )
    assert tuned["GpuAgentNotWriting"]["expr"].endswith("> 120")
    assert tuned["GpuScorerLatencyNearTimeout"]["expr"].endswith(") > 72")
    assert (
        "extender 1m30s (alert above 72s)"
        in (tuned["GpuScorerLatencyNearTimeout"]["annotations"]["description"])
    )
    assert tuned["GpuNodesDataStale"]["expr"].count("> 0.25") == 2
    assert tuned["GpuScorerNodeCacheRelisting"]["expr"].endswith("> 10")
    own = _alerts(chart_rules({"prometheusRule": {"agentStaleAfterSeconds": 300}}))
    assert own["GpuAgentNotWriting"]["expr"].endswith("> 300")
    fast = _alerts(chart_rules({"scheduler": {"extender": {"httpTimeout": "500ms"}}}))
    assert fast["GpuScorerLatencyNearTimeout"]["expr"].endswith(") > 0.25")


def test_alerts_can_be_left_out_relabelled_and_held_longer() -> None:
    spec = chart_rules(
        {
            "prometheusRule": {
                "disabled": ["GpuNodeDegraded", "GpuScorerRejectingRequests"],
                "for": {"GpuNodeUnavailable": "30m"},
                "alertLabels": {"team": "gpu-platform", "severity": "page"},
                "runbookBaseUrl": "https://wiki.example.com/gpu",
            }
        }
    )
    alerts = _alerts(spec)
    assert "GpuNodeDegraded" not in alerts
    assert "GpuScorerRejectingRequests" not in alerts
    assert len(alerts) == len(_alerts(_plain())) - 2
    assert alerts["GpuNodeUnavailable"]["for"] == "30m"
    assert alerts["GpuNodeUnavailable"]["labels"] == {"team": "gpu-platform", "severity": "page"}
    url = alerts["GpuAgentNotWriting"]["annotations"]["runbook_url"]
    assert url == "https://wiki.example.com/gpu#gpuagentnotwriting"


@pytest.mark.parametrize(
    ("values", "present"),
    [
        pytest.param({}, True, id="pod-watch-on"),
        pytest.param({"scorer": {"podWatch": False}}, False, id="pod-watch-off"),
        pytest.param(
            {"scorer": {"nodeCache": False, "podWatch": False}}, False, id="full-node-no-watch"
        ),
    ],
)
def test_the_inflight_alert_follows_the_pod_watch(values: dict[str, Any], present: bool) -> None:
    # Without the pod watch the gauge is 0 by choice: an alert on it would always fire.
    alerts = _alerts(chart_rules(values))
    assert ("GpuScorerInflightAccountingOff" in alerts) is present
    assert len(alerts) == len(_alerts(_plain())) - (0 if present else 1)


def test_every_alert_selects_only_exported_metrics() -> None:
    exported = exported_metric_names()
    unknown = {
        name: sorted(metric_names(rule["expr"]) - exported)
        for name, rule in _alerts(_plain()).items()
        if metric_names(rule["expr"]) - exported
    }
    assert unknown == {}
    # The check sees a name the project does not export.
    assert metric_names("gpu_scorer_inflight_accounting_total == 0") - exported


@pytest.mark.parametrize("key", ["disabled", "for"])
def test_an_unknown_alert_name_is_refused(key: str) -> None:
    value: Any = ["GpuNodeDegradd"] if key == "disabled" else {"GpuNodeDegradd": "1m"}
    with pytest.raises(HelmError, match=r"GpuNodeDegradd.* is not an alert of this chart"):
        chart_rules({"prometheusRule": {key: value}})


# ---------------------------------------------------------------------- promtool


def test_promtool_accepts_the_plain_file_and_a_rendered_rule(tmp_path: Path) -> None:
    checked = promtool("check", "rules", RULES_FILE)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"SUCCESS: {len(_alerts(_plain()))} rules found" in checked.stdout
    rendered = chart_rules(
        {"prometheusRule": {"alertLabels": {"team": "gpu"}, "for": {"GpuAgentNotWriting": "3m"}}}
    )
    checked = promtool("check", "rules", _write_rules(tmp_path / "chart.yaml", rendered))
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_promtool_check_fails_on_a_broken_rule(tmp_path: Path) -> None:
    # Without this, a check that accepted anything would pass the test above.
    spec = _plain()
    spec["groups"][0]["rules"][0]["expr"] = "rate(gpu_agent_writes_total[5m]"
    checked = promtool("check", "rules", _write_rules(tmp_path / "broken.yaml", spec))
    assert checked.returncode != 0
    assert "parse error" in checked.stdout + checked.stderr


def test_promtool_unit_tests_pass() -> None:
    tested = promtool("test", "rules", *UNIT_TESTS)
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert tested.stdout.count("SUCCESS") == len(UNIT_TESTS)


def _unit_test_cases() -> list[dict[str, Any]]:
    cases = []
    for path in UNIT_TESTS:
        document = yaml.safe_load(path.read_text())
        assert document["rule_files"] == ["../" + RULES_FILE.name], path
        for test in document["tests"]:
            cases.extend(test.get("alert_rule_test", []))
    return cases


def test_every_alert_is_shown_firing() -> None:
    # Each firing case lists every alert of its name at that time, so the series beside the
    # firing ones are shown silent in the same case (the mutation tests below prove they are).
    firing = {c["alertname"] for c in _unit_test_cases() if c.get("exp_alerts")}
    assert firing == set(_alerts(_plain()))


def _failed_alerts(output: str) -> set[str]:
    return set(re.findall(r"alertname: (\w+), time:", output))


def _mutant_run(tmp_path: Path, mutate: Any) -> set[str]:
    """Run the unit tests against a mutated copy of the rules; the alerts whose tests failed."""
    spec = _plain()
    for group in spec["groups"]:
        for rule in group["rules"]:
            mutate(rule)
    _write_rules(tmp_path / RULES_FILE.name, spec)
    tests = tmp_path / "tests"
    tests.mkdir()
    for path in UNIT_TESTS:
        (tests / path.name).write_text(path.read_text())
    run = promtool("test", "rules", *sorted(tests.iterdir()))
    assert run.returncode != 0
    return _failed_alerts(run.stdout + run.stderr)


def test_unit_tests_fail_for_every_alert_that_never_fires(tmp_path: Path) -> None:
    def never(rule: dict[str, Any]) -> None:
        rule["expr"] = "vector(1) > 2"

    assert _mutant_run(tmp_path, never) == set(_alerts(_plain()))


def test_unit_tests_fail_for_every_alert_that_loses_its_for(tmp_path: Path) -> None:
    def at_once(rule: dict[str, Any]) -> None:
        rule.pop("for", None)

    held = {name for name, rule in _alerts(_plain()).items() if rule.get("for")}
    assert _mutant_run(tmp_path, at_once) == held


def test_unit_tests_fail_for_every_alert_that_fires_too_widely(tmp_path: Path) -> None:
    # The expression's first comparison turned into `>= -Inf`: the alert fires on every series
    # it selects, so the series that should stay silent must make its tests fail.
    def everywhere(rule: dict[str, Any]) -> None:
        rule["expr"] = re.sub(r"(>|==) [0-9.]+", ">= -Inf", rule["expr"])

    assert _mutant_run(tmp_path, everywhere) == set(_alerts(_plain()))


# ---------------------------------------------------------------------- annotations, runbooks


def _anchors(markdown: str) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces as hyphens."""
    headings = re.findall(r"^#+ (.+)$", markdown, re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


def test_every_alert_has_a_summary_a_description_and_a_runbook_section() -> None:
    anchors = _anchors(OPERATIONS_DOC.read_text())
    for name, rule in _alerts(_plain()).items():
        annotations = rule["annotations"]
        assert set(annotations) == {"summary", "description", "runbook_url"}, name
        assert rule["labels"]["severity"] in {"warning", "critical"}, name
        url = annotations["runbook_url"]
        assert url.startswith("https://github.com/example/gpu-live-scheduler/blob/main/docs/")
        page, _, anchor = url.partition("#")
        assert page.endswith("/operations.md"), name
        assert anchor == name.lower()
        assert anchor in anchors, f"docs/operations.md has no section {name}"
        # The value that fired it is in every description (the unit tests show it rendered).
        assert "$value" in annotations["description"] or "$labels" in annotations["description"]


def test_the_operations_page_links_only_to_what_exists() -> None:
    text = OPERATIONS_DOC.read_text()
    links = re.findall(r"\]\(([^)\s]+)\)", text)
    assert len(links) > 20
    broken = []
    for link in links:
        if link.startswith("https://"):
            continue
        target, _, anchor = link.partition("#")
        path = OPERATIONS_DOC.parent / target if target else OPERATIONS_DOC
        missing_anchor = path.exists() and anchor and anchor not in _anchors(path.read_text())
        if not path.exists() or missing_anchor:
            broken.append(link)
    assert broken == []
