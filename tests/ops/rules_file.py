"""The plain Prometheus rules file, rendered from the chart so that it cannot drift from it.

    python3 dev.py rules     # rewrite prometheus/gpu-live-scheduler.rules.yaml

The chart's PrometheusRule (files/alerts.yaml with the chart's values applied) is the source;
this writes its `spec` with the chart's defaults, the keys of each rule in reading order.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from typing import Any

import yaml

from tests.deploy.chart_support import ROOT, parse_manifests, template

RULES_FILE = ROOT / "prometheus" / "gpu-live-scheduler.rules.yaml"
_RULE_KEYS = ("alert", "record", "expr", "for", "labels", "annotations")
_ANNOTATION_KEYS = ("summary", "description", "runbook_url")
_HEADER = """\
# Generated from charts/gpu-live-scheduler (files/alerts.yaml with the chart's default values) by
# `python3 dev.py rules`; edit the chart, not this file. The alerts are explained in
# docs/operations.md. Load it with `rule_files:` in prometheus.yml.
"""


def chart_rules(values: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The `spec` of the chart's PrometheusRule, rendered by helm with `values`."""
    merged = dict(values or {})
    merged["prometheusRule"] = {**merged.get("prometheusRule", {}), "enabled": True}
    rules = [m for m in parse_manifests(template(merged)) if m["kind"] == "PrometheusRule"]
    assert len(rules) == 1, f"expected one PrometheusRule, rendered {len(rules)}"
    spec = rules[0]["spec"]
    assert isinstance(spec, dict)
    return spec


class _Dumper(yaml.SafeDumper):
    """Block scalars for multi-line text, so PromQL reads as written."""


def _text(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _text)


def _in_reading_order(rule: Mapping[str, Any]) -> dict[str, Any]:
    ordered = {k: rule[k] for k in _RULE_KEYS if k in rule}
    assert ordered.keys() == rule.keys(), f"unexpected keys in {rule}"
    if "annotations" in rule:
        annotations = rule["annotations"]
        known = [k for k in _ANNOTATION_KEYS if k in annotations]
        ordered["annotations"] = {k: annotations[k] for k in [*known, *sorted(annotations)]}
    return ordered


def plain_rules_text(spec: Mapping[str, Any]) -> str:
    """The rules file for `spec`: every rule's keys in reading order, no line wrapping."""
    groups = [
        {
            "name": group["name"],
            "rules": [_in_reading_order(rule) for rule in group["rules"]],
        }
        for group in spec["groups"]
    ]
    body = yaml.dump(
        {"groups": groups}, Dumper=_Dumper, sort_keys=False, width=10_000, allow_unicode=True
    )
    return _HEADER + body


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help=f"rewrite {RULES_FILE.name}")
    args = parser.parse_args(argv)
    text = plain_rules_text(chart_rules())
    if args.write:
        RULES_FILE.write_text(text)
        print(f"wrote {RULES_FILE.relative_to(ROOT)}")
        return 0
    if RULES_FILE.read_text() != text:
        print(f"{RULES_FILE.relative_to(ROOT)} is out of date: run `python3 dev.py rules`")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
