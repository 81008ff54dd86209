"""What the chart renders agrees with what the binaries accept and serve.

- The agent: the DaemonSet's arguments parse with `agent.cli.build_parser()`; every environment
  variable is one `AgentSettings` reads (or one the NVIDIA runtime reads); the same settings as
  flags parse too; and the settings validate (bounds and ordering) to the values the chart meant.
- The scorer: its arguments parse with `exporter_scheduler.cli.build_parser()`, its environment
  names are settings, the settings validate, and the real ASGI app, served over loopback with
  those settings, answers the verbs at exactly the URL path the rendered KubeSchedulerConfiguration
  makes kube-scheduler call, in the request form its `nodeCacheCapable` makes it send (real
  requests captured from kube-scheduler v1.36).
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from agent.cli import build_parser as agent_parser
from agent.settings import AgentSettings, env_names
from agent.settings import load_settings as load_agent_settings
from exporter_scheduler.cli import build_parser as scorer_parser
from exporter_scheduler.config.settings import (
    FILE_ONLY,
    POLICY_FIELDS,
    ScorerSettings,
    env_name,
    settings_fields,
)
from exporter_scheduler.config.settings import load_settings as load_scorer_settings
from exporter_scheduler.core.records import NodeInput
from exporter_scheduler.edges.server import HttpServer
from exporter_scheduler.serving import wire
from exporter_scheduler.serving.app import ScorerApp
from exporter_scheduler.serving.nodestore import NodeStore
from tests.deploy.chart_support import (
    CHART,
    FIXTURES,
    FULLNAME,
    VARIANTS,
    Manifest,
    Rendered,
    containers,
    env_of,
    render,
)
from tests.deploy.values_schema import OWN_VALUES, REGENERATE, SCHEMA_FILE, generated_text

pytestmark = pytest.mark.helm

SCHEDULER_CAPTURES = FIXTURES / "kube-scheduler-v1.36"
# Read by the NVIDIA container runtime, not by the agent.
RUNTIME_ENV = {"NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES"}

AGENT_VARIANTS = [v for v in VARIANTS if VARIANTS[v].values.get("agent", {}).get("enabled", True)]
SCORER_VARIANTS = [v for v in VARIANTS if v != "agent-only"]


def _agent_container(rendered: Rendered) -> Manifest:
    return containers(rendered.get("DaemonSet", f"{FULLNAME}-agent"))["agent"]


def _scorer_container(rendered: Rendered) -> Manifest:
    deployment = rendered.maybe("Deployment", f"{FULLNAME}-scorer")
    if deployment is None:  # sidecar mode
        deployment = rendered.get("Deployment", f"{FULLNAME}-scheduler")
    return containers(deployment)["scorer"]


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """No GPU_AGENT_*/GPU_SCORER_*/NODE_NAME from the test runner's own environment."""
    for name in list(os.environ):
        if name.startswith(("GPU_AGENT_", "GPU_SCORER_")) or name == "NODE_NAME":
            monkeypatch.delenv(name)
    return monkeypatch


# ---------------------------------------------------------------------- the agent


@pytest.mark.parametrize("variant", AGENT_VARIANTS)
def test_agent_command_line_is_one_gpu_agent_accepts(variant: str) -> None:
    container = _agent_container(render(variant))
    assert container["command"] == ["gpu-agent"]
    parsed = agent_parser().parse_args(container["args"])
    assert parsed.command == "run"


@pytest.mark.parametrize("variant", AGENT_VARIANTS)
def test_agent_environment_names_are_settings(variant: str) -> None:
    rendered = render(variant)
    env = env_of(_agent_container(rendered), rendered)
    # Each setting's preferred name: never a deprecated spelling of a renamed one.
    accepted = {env_names(field)[0] for field in AgentSettings.model_fields} | {"NODE_NAME"}
    unknown = set(env) - accepted - RUNTIME_ENV
    assert unknown == set()
    assert "NODE_NAME" in env  # from the downward API


@pytest.mark.parametrize("variant", AGENT_VARIANTS)
def test_agent_settings_from_the_chart_validate(
    variant: str, clean_env: pytest.MonkeyPatch
) -> None:
    rendered = render(variant)
    env = env_of(_agent_container(rendered), rendered)
    for name, value in env.items():
        clean_env.setenv(name, "gpu-node-1" if name == "NODE_NAME" else value)
    settings = load_agent_settings()
    values = VARIANTS[variant].values.get("agent", {})
    assert settings.node_name == "gpu-node-1"
    assert settings.heartbeat_s == values.get("heartbeatSeconds", 60)
    assert settings.sample_interval_s == 5
    assert settings.min_write_interval_s == 10
    assert settings.metrics_port == int(env["GPU_AGENT_METRICS_PORT"])
    prefix = VARIANTS[variant].values.get("annotationPrefix", "gpu-scheduler.example.com")
    assert settings.annotation_prefix == prefix + "/"
    assert settings.source == values.get("source", "nvml")


@pytest.mark.parametrize("variant", AGENT_VARIANTS)
def test_agent_settings_also_parse_as_flags(variant: str) -> None:
    # Every GPU_AGENT_* the chart sets must have a flag of the same name and type.
    rendered = render(variant)
    env = env_of(_agent_container(rendered), rendered)
    argv = ["run"]
    for name, value in env.items():
        if name.startswith("GPU_AGENT_"):
            argv += ["--" + name.removeprefix("GPU_AGENT_").lower().replace("_", "-"), value]
    parsed = agent_parser().parse_args(argv)
    assert float(parsed.sample_interval_s) == 5
    assert parsed.source in ("nvml", "simulated")


def test_agent_ports_and_probes_match_its_server() -> None:
    rendered = render("defaults")
    container = _agent_container(rendered)
    env = env_of(container, rendered)
    (port,) = container["ports"]
    assert port["containerPort"] == int(env["GPU_AGENT_METRICS_PORT"])
    assert container["livenessProbe"]["httpGet"]["port"] == port["name"]
    assert container["readinessProbe"]["httpGet"]["port"] == port["name"]


# ---------------------------------------------------------------------- the scorer


@pytest.mark.parametrize("variant", SCORER_VARIANTS)
def test_scorer_command_line_is_one_gpu_scorer_accepts(variant: str) -> None:
    container = _scorer_container(render(variant))
    assert container["command"] == ["gpu-scorer"]
    assert scorer_parser().parse_args(container["args"]).command == "serve"


@pytest.mark.parametrize("variant", SCORER_VARIANTS)
def test_scorer_environment_names_are_settings(variant: str) -> None:
    rendered = render(variant)
    env = env_of(_scorer_container(rendered), rendered)
    accepted = {env_name(field) for field in settings_fields()}
    assert set(env) - accepted == set()


def _scorer_settings(
    variant: str, monkeypatch: pytest.MonkeyPatch, scratch: Path
) -> tuple[ScorerSettings, Rendered]:
    """The settings the scorer container starts with; mounted files live under `scratch`."""
    rendered = render(variant)
    env = env_of(_scorer_container(rendered), rendered)
    for name, value in env.items():
        if not name.endswith("_FILE"):
            monkeypatch.setenv(name, value)
            continue
        local = scratch / Path(value).name
        if name == "GPU_SCORER_POLICY_FILE":
            policy_map = rendered.get("ConfigMap", f"{FULLNAME}-scorer-policy")
            local.write_text(policy_map["data"][Path(value).name])
        else:
            local.write_text("mounted from a Secret\n")
        monkeypatch.setenv(name, str(local))
    return load_scorer_settings(), rendered


@pytest.mark.parametrize("variant", SCORER_VARIANTS)
def test_scorer_settings_from_the_chart_validate(
    variant: str, clean_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    settings, rendered = _scorer_settings(variant, clean_env, tmp_path)
    values = VARIANTS[variant].values
    if values.get("scheduler", {}).get("enabled", True):
        extender = rendered.scheduler_config()["extenders"][0]
        # The scheduler sends names only when the scorer has its own cache, and vice versa.
        assert extender["nodeCacheCapable"] is settings.node_cache
        if settings.dra:
            # Every pod is sent (claim-only pods request no managed resource).
            assert "managedResources" not in extender
        else:
            managed = {r["name"] for r in extender["managedResources"]}
            assert settings.gpu_resource_name in managed
    assert (
        settings.annotation_prefix
        == values.get("annotationPrefix", "gpu-scheduler.example.com") + "/"
    )
    heartbeat = values.get("agent", {}).get("heartbeatSeconds", 60)
    expected_stale = values.get("scorer", {}).get("staleAfterSeconds") or 3 * heartbeat
    assert settings.stale_after_s == expected_stale
    assert settings.stale_after_s > heartbeat
    tls = values.get("scorer", {}).get("tls", {})
    assert (settings.tls() is not None) is bool(tls.get("enabled"))
    # Every policy value reaches the scorer through its policy file, as given.
    for name, value in values.get("scorer", {}).get("policy", {}).items():
        assert getattr(settings, name) == value, name
    assert settings.pod_watch is values.get("scorer", {}).get("podWatch", True)


def _captured_nodes(nodes: Sequence[NodeInput]) -> NodeStore:
    """Names-only mode's node store, holding the Nodes of a real capture (no API server)."""
    store = NodeStore()
    store.replace(nodes)
    return store


def _capture(mode: str, name: str) -> bytes:
    return (SCHEDULER_CAPTURES / mode / f"{name}.request.json").read_bytes()


def _post(url: str, body: bytes) -> tuple[int, object]:
    request = urllib.request.Request(
        url, data=body, method="POST", headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode(errors="replace")


def _get(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return int(response.status)
    except urllib.error.HTTPError as error:
        return error.code


SERVED_VARIANTS = ["defaults", "full-node", "sidecar", "sidecar-full-node", "path-prefix-policy"]


@pytest.mark.parametrize("variant", SERVED_VARIANTS)
def test_scheduler_reaches_the_scorer_at_the_rendered_url(
    variant: str, clean_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    settings, rendered = _scorer_settings(variant, clean_env, tmp_path)
    extender = rendered.scheduler_config()["extenders"][0]
    mode = "nodecache-true" if extender["nodeCacheCapable"] else "nodecache-false"
    full_nodes = wire.decode_args(
        _capture("nodecache-false", "0001-filter"), gpu_resource_name=settings.gpu_resource_name
    ).nodes
    app = ScorerApp(
        policy=settings.policy(),
        node_store=_captured_nodes(full_nodes) if settings.node_cache else None,
        path_prefix=settings.path_prefix,
        max_body_bytes=settings.max_body_bytes,
    )
    # kube-scheduler calls <urlPrefix>/<verb> (k8s.io/kubernetes pkg/scheduler/extender.go).
    prefix_path = urlsplit(extender["urlPrefix"]).path
    assert urlsplit(extender["urlPrefix"]).port == settings.port
    with HttpServer(app, host="127.0.0.1", port=0) as server:
        base = server.url
        status, reply = _post(
            f"{base}{prefix_path}/{extender['filterVerb']}", _capture(mode, "0001-filter")
        )
        assert status == 200, reply
        assert isinstance(reply, dict)
        # Every node sent gets a verdict, in the form this mode's scheduler reads.
        failed = {
            **(reply.get("FailedNodes") or {}),
            **(reply.get("FailedAndUnresolvableNodes") or {}),
        }
        if settings.node_cache:
            assert reply.get("Nodes") is None
            passed = list(reply["NodeNames"] or [])
        else:
            passed = [n["metadata"]["name"] for n in reply["Nodes"]["items"]]
        assert sorted(passed + list(failed)) == sorted(n.name for n in full_nodes)
        status, scores = _post(
            f"{base}{prefix_path}/{extender['prioritizeVerb']}",
            _capture(mode, "0002-prioritize"),
        )
        assert status == 200, scores
        assert isinstance(scores, list)
        assert {"Host", "Score"} <= set(scores[0])
        for probe in ("/healthz", "/readyz", "/metrics"):
            assert _get(base + probe) == 200, probe
        if prefix_path:
            # The path really matters: the bare verb is not served under a prefix.
            status, _ = _post(f"{base}/{extender['filterVerb']}", _capture(mode, "0001-filter"))
            assert status == 404


@pytest.mark.parametrize("variant", SCORER_VARIANTS)
def test_scorer_ports_and_probes_match_its_settings(variant: str) -> None:
    rendered = render(variant)
    container = _scorer_container(rendered)
    env = env_of(container, rendered)
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {
        "http": int(env["GPU_SCORER_PORT"]),
        "metrics": int(env["GPU_SCORER_METRICS_PORT"]),
    }
    service = rendered.get("Service", f"{FULLNAME}-scorer")
    assert {p["name"]: p["port"] for p in service["spec"]["ports"]} == ports
    # Probes on the plain metrics port: reachable by the kubelet even with mutual TLS.
    for probe_name, path in (("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")):
        probe = container[probe_name]["httpGet"]
        assert (probe["port"], probe["path"]) == ("metrics", path)
        assert probe.get("scheme", "HTTP") == "HTTP"


def test_values_schema_policy_is_generated_from_the_settings_table() -> None:
    """Type, bounds, choices and help of every policy key come from `POLICY_SETTINGS`."""
    assert SCHEMA_FILE.read_text() == generated_text(), (
        f"{SCHEMA_FILE.relative_to(CHART.parent.parent)} differs from the policy table: "
        f"run `{REGENERATE}`"
    )


def test_every_policy_setting_has_a_chart_value() -> None:
    # scorer.policy becomes --policy-file; the prefix, the staleness and the writer check come
    # from values of their own; the tenant profiles are the policy file's alone.
    schema = json.loads(SCHEMA_FILE.read_text())
    scorer = schema["properties"]["scorer"]["properties"]
    policy = scorer["policy"]["properties"]
    for name in POLICY_FIELDS:
        if name == "annotation_prefix":
            assert "annotationPrefix" in schema["properties"]
        elif name in OWN_VALUES:
            assert OWN_VALUES[name] in scorer, name
        else:
            assert name in policy, name
    assert set(policy) - set(POLICY_FIELDS) == FILE_ONLY
