"""Settings: defaults, precedence (flags > env > policy file > defaults), one clear error each."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

import pytest

from exporter_scheduler.config.settings import (
    POLICY_FIELDS,
    ScorerSettings,
    SettingsError,
    load_settings,
    read_policy_file,
)
from exporter_scheduler.core.policy import (
    GPU_RESOURCE_NAME,
    MISSING_DATA,
    POLICY_SETTINGS,
    STALE_AFTER_S,
    TEMPERATURE_LIMIT_C,
    UTILIZATION_LIMIT,
    Policy,
    Setting,
)


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("GPU_SCORER_"):
            monkeypatch.delenv(name)


def test_defaults_make_the_default_policy() -> None:
    settings = load_settings()
    assert settings.policy() == Policy()
    assert (settings.port, settings.path_prefix, settings.node_cache) == (8888, "/", False)
    assert settings.keep_alive_s > 90
    assert settings.max_body_bytes >= 5000 * 6 * 1024
    assert settings.tls() is None


def test_every_policy_field_is_a_setting() -> None:
    # `profile` names a tenant profile's policy: set by the profile, not by a setting.
    policy_fields = {f.name for f in dataclasses.fields(Policy)} - {"keys", "profile"}
    assert policy_fields | {"annotation_prefix"} == set(POLICY_FIELDS)
    assert set(POLICY_FIELDS) <= set(ScorerSettings.model_fields)


def test_policy_fields_come_from_the_settings_table_in_order() -> None:
    policy_fields = [f.name for f in dataclasses.fields(Policy)]
    assert policy_fields == ["keys", *(s.name for s in POLICY_SETTINGS), "profile"]
    assert ("annotation_prefix", *(s.name for s in POLICY_SETTINGS)) == POLICY_FIELDS


@pytest.mark.parametrize("setting", POLICY_SETTINGS, ids=lambda s: s.name)
def test_each_setting_derives_its_default_bounds_and_help(setting: Setting[Any]) -> None:
    field = ScorerSettings.model_fields[setting.name]
    assert field.default == setting.default == getattr(Policy(), setting.name)
    assert field.description == setting.help
    assert setting.why, "every default carries its reason"
    bounds = {
        name: getattr(m, name)
        for m in field.metadata
        for name in ("ge", "gt", "le")
        if getattr(m, name, None) is not None
    }
    low = "gt" if setting.exclusive_minimum else "ge"
    expected = {
        name: value
        for name, value in ((low, setting.minimum), ("le", setting.maximum))
        if value is not None
    }
    assert bounds == expected


@pytest.mark.parametrize(
    ("setting", "value"),
    [
        pytest.param(UTILIZATION_LIMIT, 1.5, id="fraction above 1"),
        pytest.param(TEMPERATURE_LIMIT_C, 0, id="temperature below its minimum"),
        pytest.param(TEMPERATURE_LIMIT_C, 80.5, id="temperature not whole"),
        pytest.param(STALE_AFTER_S, 0.0, id="stale at its exclusive minimum"),
        pytest.param(MISSING_DATA, "lax", id="missing data not a choice"),
        pytest.param(GPU_RESOURCE_NAME, " ", id="resource name empty"),
    ],
)
def test_policy_and_settings_refuse_the_same_bounds(setting: Setting[Any], value: Any) -> None:
    with pytest.raises(ValueError, match=setting.name):
        Policy(**{setting.name: value})
    with pytest.raises(SettingsError, match=setting.name):
        load_settings({setting.name: value})


def test_precedence_flags_env_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    policy_file = tmp_path / "policy.yaml"
    policy_file.write_text(
        "utilization-limit: 0.70\nstale_after_s: 300\ntemperature-limit-c: 80\n"
        "missing-data: strict\n"
    )
    monkeypatch.setenv("GPU_SCORER_POLICY_FILE", str(policy_file))
    monkeypatch.setenv("GPU_SCORER_UTILIZATION_LIMIT", "0.75")
    monkeypatch.setenv("GPU_SCORER_STALE_AFTER_S", "240")
    monkeypatch.setenv("GPU_SCORER_NODE_CACHE", "true")
    settings = load_settings({"utilization_limit": 0.8, "port": 9000})
    assert settings.utilization_limit == 0.8  # flag over env over file
    assert settings.stale_after_s == 240  # env over file
    assert settings.temperature_limit_c == 80  # file over default
    assert settings.missing_data == "strict"
    assert settings.node_cache is True
    assert settings.port == 9000


def test_json_policy_file(tmp_path: Path) -> None:
    policy_file = tmp_path / "policy.json"
    policy_file.write_text('{"weight_utilization": 1, "weight_fragmentation": 0}')
    settings = load_settings({"policy_file": str(policy_file)})
    assert (settings.weight_utilization, settings.weight_fragmentation) == (1.0, 0.0)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        pytest.param("port: 80\n", "unknown setting 'port'", id="serving-setting"),
        pytest.param("utilisation-limit: 0.5\n", "unknown setting", id="typo"),
        pytest.param("- a\n- b\n", "must be a mapping", id="list"),
        pytest.param("a: [\n", "not valid YAML/JSON", id="broken"),
    ],
)
def test_bad_policy_file(tmp_path: Path, text: str, message: str) -> None:
    policy_file = tmp_path / "policy.yaml"
    policy_file.write_text(text)
    with pytest.raises(SettingsError, match=message):
        load_settings({"policy_file": str(policy_file)})


def test_missing_policy_file(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match="cannot read"):
        read_policy_file(tmp_path / "absent.yaml")


def test_empty_policy_file_is_no_settings(tmp_path: Path) -> None:
    policy_file = tmp_path / "policy.yaml"
    policy_file.write_text("")
    assert load_settings({"policy_file": str(policy_file)}).policy() == Policy()


@pytest.mark.parametrize(
    ("flags", "fragments"),
    [
        pytest.param(
            {"utilization_limit": 1.5},
            ["utilization_limit", "--utilization-limit", "GPU_SCORER_UTILIZATION_LIMIT", "1"],
            id="utilization-above-1",
        ),
        pytest.param({"utilization_limit": float("nan")}, ["utilization_limit", "nan"], id="nan"),
        pytest.param({"stale_after_s": float("inf")}, ["stale_after_s", "finite"], id="inf"),
        pytest.param({"temperature_limit_c": 0}, ["temperature_limit_c", "1"], id="temp-low"),
        pytest.param({"stale_after_s": 0}, ["stale_after_s", "greater than 0"], id="stale-zero"),
        pytest.param({"port": 70000}, ["--port", "65535"], id="port"),
        pytest.param({"max_body_bytes": 10}, ["max_body_bytes", "1024"], id="body-limit"),
        pytest.param({"missing_data": "maybe"}, ["missing_data", "lenient"], id="missing-data"),
        pytest.param({"log_level": "loud"}, ["log_level"], id="log-level"),
        pytest.param({"annotation_prefix": "Not A Domain"}, ["DNS subdomain"], id="prefix"),
        pytest.param(
            {"weight_utilization": 0, "weight_fragmentation": 0, "weight_temperature": 0},
            ["weight"],
            id="weights-all-zero",
        ),
        pytest.param(
            {"tls_cert_file": "/etc/hostname"},
            ["together", "--tls-cert-file", "GPU_SCORER_TLS_KEY_FILE"],
            id="cert-without-key",
        ),
        pytest.param(
            {"tls_client_ca_file": "/etc/hostname"},
            ["needs", "--tls-client-ca-file", "--tls-key-file"],
            id="ca-without-cert",
        ),
        pytest.param(
            {"tls_cert_file": "/nope.pem", "tls_key_file": "/nope.key"},
            ["file not found", "--tls-cert-file", "/nope.pem"],
            id="cert-missing",
        ),
        pytest.param(
            {"keep_alive_s": 90}, ["--keep-alive-s", "greater than or equal to 91"], id="keep-alive"
        ),
        pytest.param({"kubeconfig": "/nope"}, ["kubeconfig not found"], id="kubeconfig"),
        pytest.param(
            {"pod_label_selector": "gpu pod=true"},
            ["--pod-label-selector", "cannot parse 'gpu pod=true'"],
            id="selector-not-parsed",
        ),
        pytest.param(
            {"pod_label_selector": "a=b,"}, ["--pod-label-selector", "comma"], id="selector-comma"
        ),
        pytest.param(
            {"pod_label_selector": "k in ()"}, ["cannot be empty"], id="selector-empty-set"
        ),
        pytest.param({"pod_label_selector": " "}, ["empty"], id="selector-blank"),
        pytest.param({"surprise": 1}, ["surprise"], id="unknown"),
    ],
)
def test_invalid_settings_one_clear_message(flags: dict[str, Any], fragments: list[str]) -> None:
    with pytest.raises(SettingsError) as caught:
        load_settings(flags)
    message = str(caught.value)
    assert "\n" not in message
    for fragment in fragments:
        assert fragment in message


def test_invalid_env_value_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPU_SCORER_UTILIZATION_LIMIT", "high")
    with pytest.raises(SettingsError, match="GPU_SCORER_UTILIZATION_LIMIT"):
        load_settings()


def test_custom_prefix_reaches_the_policy() -> None:
    policy = load_settings({"annotation_prefix": "gpu.example.org"}).policy()
    assert policy.keys.prefix == "gpu.example.org/"


@pytest.mark.parametrize(
    "selector",
    [
        "gpu-scheduler.example.com/gpu-pod=true",
        "gpu-scheduler.example.com/gpu-pod==true,team!=batch",
        "tier in (gpu, gpu-large), !legacy",
        "app notin (a),x.y/z",
    ],
)
def test_label_selectors_the_api_server_takes_are_taken(selector: str) -> None:
    assert load_settings({"pod_label_selector": selector}).pod_label_selector == selector
