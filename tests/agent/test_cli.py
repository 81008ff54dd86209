"""`gpu-agent once` and the start-up failures of both commands (in process, no API server)."""

from __future__ import annotations

import importlib.util
import json
import logging
import shutil
from typing import Any

import pytest

from agent import cli
from agent.settings import AgentSettings
from gpu_contract.schema import DEFAULT_KEYS, SCHEMA_VERSION, Field, decode
from kube_standins.apiserver import write_kubeconfig
from tests.agent.fake_nvml import DRIVER_NOT_LOADED, FakeNvml, a100


def run_once(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = cli.main(["once", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_once_dry_run_json_is_a_complete_version_1_set(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_once(
        capsys,
        "--dry-run",
        "--source",
        "simulated",
        "--output",
        "json",
        "--seed",
        "3",
        "--pod-resources-socket",
        "/nonexistent/kubelet.sock",
    )
    assert code == 0
    document: dict[str, Any] = json.loads(out)
    annotations = document["annotations"]
    # A healthy simulated node measures every field; health-detail is present only when not ok,
    # allocations and the pods holding GPUs only where a kubelet answers (none here: its
    # socket is missing), and the GPUs' DRA device names only with the agent's DRA side.
    absent = (
        Field.HEALTH_DETAIL,
        Field.PER_GPU_ALLOCATED,
        Field.PER_GPU_DRA_DEVICE,
        Field.POD_GPU_USAGE,
    )
    expected = {DEFAULT_KEYS[f] for f in Field if f not in absent}
    assert set(annotations) == expected
    assert len(annotations[DEFAULT_KEYS[Field.PER_GPU_UTILIZATION]].split(",")) == 8
    assert annotations[DEFAULT_KEYS[Field.SCHEMA_VERSION]] == SCHEMA_VERSION
    assert annotations[DEFAULT_KEYS[Field.GPU_COUNT]] == "8"
    assert annotations[DEFAULT_KEYS[Field.GPU_MODEL]] == "NVIDIA-A100-SXM4-80GB"
    assert document["health"] == "ok"
    decoded = decode(annotations)
    assert decoded.state is not None
    assert decoded.problems == ()
    patch = document["patch"]["metadata"]["annotations"]
    assert {k: v for k, v in patch.items() if v is not None} == annotations
    assert patch[DEFAULT_KEYS[Field.HEALTH_DETAIL]] is None
    assert document["dry_run"] is True
    assert document["written"] is False


def test_once_dry_run_with_custom_prefix_and_model(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_once(
        capsys,
        "--dry-run",
        "--source=simulated",
        "--output=json",
        "--annotation-prefix=gpu.corp.example",
        "--simulated-gpus=2",
        "--simulated-model=NVIDIA H100 80GB HBM3",
    )
    assert code == 0
    document = json.loads(out)
    annotations = document["annotations"]
    assert annotations["gpu.corp.example/gpu-model"] == "NVIDIA-H100-80GB-HBM3"
    assert annotations["gpu.corp.example/gpu-count"] == "2"
    # Every key, in the annotations and in the patch (nulls included), is under the given prefix.
    assert all(key.startswith("gpu.corp.example/") for key in annotations)
    patch = document["patch"]["metadata"]["annotations"]
    assert all(key.startswith("gpu.corp.example/") for key in patch)
    assert patch["gpu.corp.example/health-detail"] is None


def test_once_text_output(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_once(capsys, "--dry-run", "--source", "simulated")
    assert code == 0
    assert "gpu-scheduler.example.com/schema-version=1\n" in out
    assert "# merge patch (application/merge-patch+json):" in out
    assert out.rstrip().endswith("# dry run: nothing written")


@pytest.mark.parametrize("command", ["once", "run"])
def test_missing_node_name_exits_2(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main([command, "--source", "simulated"]) == 2
    err = capsys.readouterr().err
    assert "no node name: set --node-name, GPU_AGENT_NODE_NAME or NODE_NAME" in err


def test_no_api_configuration_exits_2(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    assert cli.main(["run", "--source", "simulated", "--node-name", "n"]) == 2
    err = capsys.readouterr().err
    assert "cannot load the in-cluster config" in err
    assert "--kubeconfig" in err


@pytest.mark.parametrize(
    ("command", "fault", "message"),
    [
        pytest.param(
            "once", "library", "NVML library (libnvidia-ml.so.1) not found", id="once-no-library"
        ),
        pytest.param(
            "run", "library", "NVML library (libnvidia-ml.so.1) not found", id="run-no-library"
        ),
        pytest.param("run", "driver", "NVIDIA driver not loaded", id="run-driver-not-loaded"),
    ],
)
def test_nvml_unavailable_exits_2_with_one_line(
    *,
    command: str,
    fault: str,
    message: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Any,
) -> None:
    # The real pynvml over a fake library: nvmlInit fails as on a node without the driver.
    fake = FakeNvml([a100(0)]).install(monkeypatch)
    if fault == "library":
        fake.make_library_missing()
    else:
        fake.init_error = DRIVER_NOT_LOADED
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", url="http://127.0.0.1:9", token="t")
    args = [command, "--source", "nvml", "--node-name", "n", "--kubeconfig", str(kubeconfig)]
    assert cli.main([*args, "--metrics-port", "0"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith(f"gpu-agent: {message}")
    assert "--source simulated" in lines[0]


def test_simulated_source_needs_no_nvml(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    FakeNvml([]).install(monkeypatch).make_library_missing()
    code, out, _ = run_once(capsys, "--dry-run", "--source", "simulated", "--output", "json")
    assert code == 0
    assert json.loads(out)["health"] == "ok"


@pytest.mark.skipif(
    importlib.util.find_spec("agent.nvml") is None or shutil.which("nvidia-smi") is not None,
    reason="needs agent.nvml on a machine without an NVIDIA driver",
)
def test_real_nvml_missing_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_once(capsys, "--dry-run", "--source", "nvml")
    assert code == 2
    assert len(err.strip().splitlines()) == 1
    assert err.startswith("gpu-agent: ")


def test_json_log_lines_are_one_object_each() -> None:
    formatter = cli._JsonFormatter()
    record = logging.LogRecord(
        "agent.daemon", logging.WARNING, __file__, 1, "write failed: %s", ("403",), None
    )
    entry = json.loads(formatter.format(record))
    assert entry["level"] == "warning"
    assert entry["logger"] == "agent.daemon"
    assert entry["message"] == "write failed: 403"
    assert entry["time"].endswith("+00:00")


def test_logging_setup_replaces_only_its_own_handler() -> None:
    root = logging.getLogger()
    before = [h for h in root.handlers if h.get_name() != "gpu-agent"]
    settings = AgentSettings(log_format="json", log_level="WARNING")
    cli.configure_logging(settings)
    cli.configure_logging(settings)
    ours = [h for h in root.handlers if h.get_name() == "gpu-agent"]
    try:
        assert len(ours) == 1
        assert all(h in root.handlers for h in before)
    finally:
        for handler in ours:
            root.removeHandler(handler)
