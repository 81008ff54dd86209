"""Settings: defaults, environment names, flag precedence, and one clear line per bad bound."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.cli import build_parser, main
from agent.settings import (
    RENAMED,
    WRITE_POLICY_SETTINGS,
    AgentSettings,
    SettingsError,
    env_names,
    flag_name,
    load_settings,
)


def test_defaults_match_the_contract() -> None:
    settings = load_settings()
    policy = settings.write_policy()
    assert (settings.sample_interval_s, settings.min_write_interval_s, settings.heartbeat_s) == (
        5.0,
        10.0,
        60.0,
    )
    # DESIGN.md's utilization and memory deadbands; temperature and the direction-aware rule
    # depart from it (docs/agent.md, "Departures from the design's defaults").
    assert (policy.utilization_deadband, policy.temperature_deadband_c) == (0.05, 5.0)
    assert policy.memory_deadband_fraction == 0.05
    assert policy.improving_deadband_factor == 3.0
    assert (
        policy.per_gpu_utilization_deadband,
        policy.per_gpu_temperature_deadband_c,
        policy.per_gpu_memory_deadband_fraction,
    ) == (0.15, 5.0, 0.05)
    assert settings.pod_resources is True
    assert settings.pod_resources_socket == "/var/lib/kubelet/pod-resources/kubelet.sock"
    assert settings.annotation_prefix == "gpu-scheduler.example.com/"
    assert settings.kubeconfig is None
    assert settings.source == "nvml"
    assert settings.metrics_port == 9400


@pytest.mark.parametrize(
    ("env", "field", "expected"),
    [
        pytest.param({"NODE_NAME": "gpu-1"}, "node_name", "gpu-1", id="node-name-from-NODE_NAME"),
        pytest.param(
            {"NODE_NAME": "a", "GPU_AGENT_NODE_NAME": "b"}, "node_name", "b", id="prefixed-wins"
        ),
        pytest.param({"GPU_AGENT_SAMPLE_INTERVAL_S": "2"}, "sample_interval_s", 2.0, id="interval"),
        pytest.param(
            {"GPU_AGENT_SAMPLE_INTERVAL": "2"}, "sample_interval_s", 2.0, id="deprecated-name"
        ),
        pytest.param({"GPU_AGENT_SOURCE": "simulated"}, "source", "simulated", id="source"),
        pytest.param(
            {"GPU_AGENT_ANNOTATION_PREFIX": "gpu.corp.example"},
            "annotation_prefix",
            "gpu.corp.example/",
            id="prefix-normalized",
        ),
        pytest.param({"GPU_AGENT_METRICS_PORT": "0"}, "metrics_port", 0, id="metrics-off"),
        pytest.param({"GPU_AGENT_LOG_LEVEL": "debug"}, "log_level", "DEBUG", id="log-level"),
    ],
)
def test_environment(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], field: str, expected: object
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert getattr(load_settings(), field) == expected


def test_flags_override_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPU_AGENT_HEARTBEAT_S", "90")
    monkeypatch.setenv("NODE_NAME", "from-env")
    settings = load_settings(heartbeat_s=120.0, node_name="from-flag")
    assert settings.heartbeat_s == 120.0
    assert settings.node_name == "from-flag"


@pytest.mark.parametrize(
    ("overrides", "fragment"),
    [
        pytest.param(
            {"heartbeat_s": 5.0},
            "heartbeat-s (5) must be >= min-write-interval-s (10)",
            id="heartbeat",
        ),
        pytest.param(
            {"process_attribution": True, "pod_resources": False},
            "process-attribution needs pod-resources",
            id="process-attribution-without-pod-resources",
        ),
        pytest.param(
            {"pod_utilization_deadband": 1.5}, "pod-utilization-deadband", id="pod-deadband"
        ),
        pytest.param(
            {"sample_interval_s": 20.0},
            "min-write-interval-s (10) must be >= sample-interval-s (20)",
            id="sample-above-min-write",
        ),
        pytest.param(
            {"sample_interval_s": 0.0},
            "--sample-interval-s / GPU_AGENT_SAMPLE_INTERVAL_S: Input should be greater than 0",
            id="zero-interval",
        ),
        pytest.param(
            {"metrics_port": 70000},
            "--metrics-port / GPU_AGENT_METRICS_PORT: Input should be less than or equal to 65535",
            id="port",
        ),
        pytest.param(
            {"annotation_prefix": "Not A Domain"},
            "--annotation-prefix / GPU_AGENT_ANNOTATION_PREFIX: annotation prefix",
            id="prefix",
        ),
        pytest.param({"source": "cuda"}, "--source / GPU_AGENT_SOURCE", id="source"),
        pytest.param(
            {"utilization_deadband": 2.0}, "--utilization-deadband", id="deadband-above-one"
        ),
        pytest.param(
            {"backoff_base_s": 50.0, "backoff_max_s": 20.0},
            "backoff-max-s (20) must be >= backoff-base-s (50)",
            id="backoff",
        ),
    ],
)
def test_bounds_give_one_clear_line(overrides: dict[str, object], fragment: str) -> None:
    with pytest.raises(SettingsError) as caught:
        load_settings(**overrides)
    message = str(caught.value)
    assert fragment in message
    assert "\n" not in message


def test_bad_environment_value_exits_2_with_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("GPU_AGENT_SAMPLE_INTERVAL_S", "soon")
    assert main(["run"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("gpu-agent: invalid settings: --sample-interval-s")
    assert len(err.splitlines()) == 1


def test_every_setting_is_a_flag_of_both_commands() -> None:
    parser = build_parser()
    for command in ("once", "run"):
        args = parser.parse_args([command])
        assert args.command == command
    # The interface names fixed for docs and the chart.
    required = {
        "--node-name",
        "--source",
        "--sample-interval-s",
        "--min-write-interval-s",
        "--heartbeat-s",
        "--annotation-prefix",
        "--kubeconfig",
        "--metrics-port",
        "--simulated-gpus",
        "--simulated-model",
        "--seed",
    }
    flags = {flag_name(name) for name in AgentSettings.model_fields}
    assert required <= flags
    for command in ("once", "run"):
        for name in AgentSettings.model_fields:
            parsed = parser.parse_args([command, flag_name(name), _example(name)])
            assert hasattr(parsed, name)


@pytest.mark.parametrize("name", sorted(RENAMED))
def test_a_renamed_setting_keeps_its_old_flag_and_variable(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    old = RENAMED[name]
    parsed = build_parser().parse_args(["run", flag_name(old), "7"])
    assert getattr(parsed, name) == 7.0
    assert flag_name(old) not in build_parser().format_help()  # accepted, not advertised
    old_env, new_env = env_names(name)[1], env_names(name)[0]
    assert old_env == "GPU_AGENT_" + old.upper()
    # Just above the default: within every setting's bounds and ordering.
    default = AgentSettings.model_fields[name].default
    monkeypatch.setenv(old_env, str(default * 1.01))
    assert getattr(AgentSettings(), name) == default * 1.01
    monkeypatch.setenv(new_env, str(default * 1.02))
    assert getattr(AgentSettings(), name) == default * 1.02  # the new spelling wins


def test_every_write_rule_number_is_a_setting_of_its_name() -> None:
    settings = load_settings(heartbeat_s=90.0, temperature_deadband_c=2.0)
    policy = settings.write_policy()
    assert (policy.heartbeat_s, policy.temperature_deadband_c) == (90.0, 2.0)
    for name in WRITE_POLICY_SETTINGS:
        assert getattr(policy, name) == getattr(settings, name), name


def _example(name: str) -> str:
    return {
        "source": "simulated",
        "log_level": "INFO",
        "log_format": "json",
        "annotation_prefix": "a.example",
        "node_name": "n",
        "kubeconfig": "/k",
        "simulated_model": "NVIDIA H100",
        "metrics_address": "127.0.0.1",
    }.get(name, "1")


def test_operator_doc_lists_every_flag_and_variable() -> None:
    doc = (Path(__file__).parents[2] / "docs" / "agent.md").read_text()
    for name in AgentSettings.model_fields:
        assert f"`{flag_name(name)}`" in doc, name
        for env in env_names(name):
            assert f"`{env}`" in doc, env
