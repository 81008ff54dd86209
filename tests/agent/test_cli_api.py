"""`gpu-agent once` writing through the API, and a real `gpu-agent run` that gets SIGTERM."""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from agent import cli
from gpu_contract.schema import DEFAULT_KEYS, Field
from kube_standins.apiserver import ApiServerStandIn, Fault, write_kubeconfig
from kube_standins.nodes import gpu_node

NODE = "gpu-node-1"


@pytest.fixture
def server(api_server: ApiServerStandIn) -> ApiServerStandIn:
    api_server.put_node(gpu_node(NODE))
    return api_server


def test_once_writes_and_prints_what_it_sent(
    server: ApiServerStandIn, kubeconfig: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["once", "--source", "simulated", "--output", "json", "--node-name", NODE]
    assert cli.main([*args, "--kubeconfig", str(kubeconfig)]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["written"] is True
    node = server.node(NODE)
    assert node is not None
    written = node["metadata"]["annotations"]
    for key, value in document["annotations"].items():
        assert written[key] == value
    patches = [r for r in server.requests if r.method == "PATCH"]
    assert len(patches) == 1


def test_once_reports_a_failed_write_with_exit_1(
    server: ApiServerStandIn, kubeconfig: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    server.inject(Fault(status=403, method="PATCH", times=1))
    args = ["once", "--source", "simulated", "--node-name", NODE, "--kubeconfig", str(kubeconfig)]
    assert cli.main(args) == 1
    out = capsys.readouterr().out
    assert "# write failed: API server forbade patching node 'gpu-node-1' (403 Forbidden)" in out


def test_run_process_writes_then_exits_0_on_sigterm(
    server: ApiServerStandIn, kubeconfig: Path
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPU_AGENT_")}
    env["NODE_NAME"] = NODE
    with socket.socket() as probe:  # a free loopback port for the metrics server
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "agent",
            "run",
            "--source=simulated",
            f"--kubeconfig={kubeconfig}",
            f"--metrics-port={port}",
            "--metrics-address=127.0.0.1",
            "--sample-interval-s=0.2",
            "--min-write-interval-s=0.5",
            "--heartbeat-s=1",
            "--seed=1",
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: list[str] = []
    started = threading.Event()

    def pump() -> None:
        assert process.stderr is not None
        for line in process.stderr:
            lines.append(line)
            if "gpu-agent started" in line:
                started.set()

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    try:
        assert started.wait(timeout=30), "".join(lines)
        # Wait (bounded) for the first write to reach the server: the jitter is under 0.5 s.
        deadline = time.monotonic() + 20
        while not [r for r in server.requests if r.method == "PATCH"]:
            assert time.monotonic() < deadline, "".join(lines)
            time.sleep(0.05)
        base = f"http://127.0.0.1:{port}"
        with urllib.request.urlopen(base + "/readyz", timeout=5) as response:
            assert response.status == 200
        with urllib.request.urlopen(base + "/healthz", timeout=5) as response:
            assert response.status == 200
        first_write = 'gpu_agent_writes_total{reason="first-write"} 1.0'
        metrics = ""
        while first_write not in metrics:  # the counter follows the server's answer closely
            assert time.monotonic() < deadline, metrics
            with urllib.request.urlopen(base + "/metrics", timeout=5) as response:
                metrics = response.read().decode()
        assert "gpu_agent_samples_total" in metrics
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=20) == 0, "".join(lines)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    reader.join(timeout=5)
    output = "".join(lines)
    assert "received SIGTERM; finishing the current tick" in output
    assert output.rstrip().endswith("gpu-agent stopped")
    node = server.node(NODE)
    assert node is not None
    assert node["metadata"]["annotations"][DEFAULT_KEYS[Field.SCHEMA_VERSION]] == "1"


def test_metrics_port_in_use_exits_2_with_one_line(
    server: ApiServerStandIn, kubeconfig: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        args = ["run", "--source=simulated", f"--node-name={NODE}", f"--kubeconfig={kubeconfig}"]
        code = cli.main([*args, f"--metrics-port={port}", "--metrics-address=127.0.0.1"])
    assert code == 2
    err = capsys.readouterr().err
    assert f"gpu-agent: cannot serve metrics on 127.0.0.1:{port}" in err


def test_sigterm_while_starting_exits_0_without_a_tick(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """SIGTERM while the start-up read of the Node hangs: a clean stop and exit 0, not death by
    the signal (which would also take this test process down)."""
    with socket.socket() as hung:  # accepts connections, never answers
        hung.bind(("127.0.0.1", 0))
        hung.listen()
        port = hung.getsockname()[1]
        kubeconfig = write_kubeconfig(
            tmp_path / "kubeconfig", url=f"http://127.0.0.1:{port}", token="t"
        )
        accepted: list[socket.socket] = []

        def terminate_once_the_read_is_in_flight() -> None:
            connection, _ = hung.accept()
            accepted.append(connection)
            os.kill(os.getpid(), signal.SIGTERM)

        previous = signal.getsignal(signal.SIGTERM)
        killer = threading.Thread(target=terminate_once_the_read_is_in_flight, daemon=True)
        killer.start()
        args = ["run", "--source=simulated", f"--node-name={NODE}", f"--kubeconfig={kubeconfig}"]
        with caplog.at_level(logging.INFO, logger="agent"):
            code = cli.main([*args, "--metrics-port=0", "--api-timeout=0.5"])
        killer.join(timeout=10)
        for connection in accepted:
            connection.close()
    assert code == 0
    assert len(accepted) == 1  # only the start-up read: no tick, so no write was tried
    assert signal.getsignal(signal.SIGTERM) is previous
    assert "received SIGTERM" in caplog.text
    assert "could not read node" in caplog.text
    assert "gpu-agent stopped" in caplog.text
