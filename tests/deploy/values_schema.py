"""The policy part of the chart's values schema, generated from the scorer's table of settings.

    python3 dev.py schema     # rewrite charts/gpu-live-scheduler/values.schema.json's policy

`core.policy.POLICY_SETTINGS` holds each setting's type, bounds, choices and help once; this
writes them into the schema where the chart takes them: every key of `scorer.policy` and of each
profile under it, and the bounds of the two settings the chart sets from values of their own
(`scorer.staleAfterSeconds`, `scorer.requireAgentWriter`, which keep their own descriptions,
null meaning "derived"). The rest of the schema (the profiles' own keys, every other value) is
written by hand and left as it is. A test fails when the checked-in file differs.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Final

from exporter_scheduler.config.profiles import NOT_PER_PROFILE
from exporter_scheduler.core.policy import (
    POLICY_SETTINGS,
    REQUIRE_AGENT_WRITER,
    STALE_AFTER_S,
    Setting,
)
from tests.deploy.chart_support import CHART, ROOT

SCHEMA_FILE: Final = CHART / "values.schema.json"
REGENERATE: Final = "python3 dev.py schema"
# Policy settings the chart sets from scorer values of their own, not from scorer.policy.
OWN_VALUES: Final[dict[str, str]] = {
    STALE_AFTER_S.name: "staleAfterSeconds",
    REQUIRE_AGENT_WRITER.name: "requireAgentWriter",
}
# A profile's own keys, before the settings it overrides (hand-written in the schema).
PROFILE_OWN_KEYS: Final = ("name", "namespaces", "namespace-selector")

_JSON_TYPES: Final = {bool: "boolean", int: "integer", float: "number", str: "string"}


def _number(value: float) -> float | int:
    """`0` rather than `0.0`: the schema reads as written by hand (JSON Schema equates them)."""
    return int(value) if float(value).is_integer() else value


def setting_bounds(setting: Setting[Any]) -> dict[str, Any]:
    """What JSON Schema can say of a setting's values beside its type: choices and bounds."""
    bounds: dict[str, Any] = {}
    if setting.choices:
        bounds["enum"] = list(setting.choices)
    elif isinstance(setting.default, str):
        bounds["minLength"] = 1
    if setting.minimum is not None:
        key = "exclusiveMinimum" if setting.exclusive_minimum else "minimum"
        bounds[key] = _number(setting.minimum)
    if setting.maximum is not None:
        bounds["maximum"] = _number(setting.maximum)
    return bounds


def setting_schema(setting: Setting[Any]) -> dict[str, Any]:
    """A `scorer.policy` key: the setting's type, help and bounds."""
    return {
        "type": _JSON_TYPES[type(setting.default)],
        "description": setting.help,
        **setting_bounds(setting),
    }


def with_policy_from_table(schema: dict[str, Any]) -> dict[str, Any]:
    """`schema` (the chart's values schema, as loaded) with its policy keys generated."""
    scorer = schema["properties"]["scorer"]["properties"]
    policy = scorer["policy"]
    profiles = policy["properties"]["profiles"]
    in_policy = [s for s in POLICY_SETTINGS if s.name not in OWN_VALUES]
    policy["properties"] = {
        **{s.name: setting_schema(s) for s in in_policy},
        "profiles": profiles,
    }
    profile = profiles["items"]["properties"]
    profiles["items"]["properties"] = {
        **{key: profile[key] for key in PROFILE_OWN_KEYS},
        **{s.name: setting_schema(s) for s in in_policy if s.name not in NOT_PER_PROFILE},
    }
    for setting in POLICY_SETTINGS:
        value = OWN_VALUES.get(setting.name)
        if value is None:
            continue
        description = scorer[value]["description"]
        scorer[value] = {
            "type": [_JSON_TYPES[type(setting.default)], "null"],
            **setting_bounds(setting),
            "description": description,
        }
    return schema


def schema_text(schema: dict[str, Any]) -> str:
    return json.dumps(schema, indent=2) + "\n"


def generated_text() -> str:
    """The schema file as it should be: the checked-in one with its policy keys generated."""
    return schema_text(with_policy_from_table(json.loads(SCHEMA_FILE.read_text())))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help=f"rewrite {SCHEMA_FILE.name}")
    args = parser.parse_args(argv)
    text = generated_text()
    shown = SCHEMA_FILE.relative_to(ROOT)
    if args.write:
        SCHEMA_FILE.write_text(text)
        print(f"wrote {shown}")
        return 0
    if SCHEMA_FILE.read_text() != text:
        print(f"{shown} is out of date: run `{REGENERATE}`")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
