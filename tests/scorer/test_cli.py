"""`gpu-scorer`: the parser, `explain`, start-up errors, and `serve` as a real process."""

from __future__ import annotations

import http.client
import io
import json
import logging
import os
import queue
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from exporter_scheduler.cli import build_parser, main
from exporter_scheduler.config.settings import flag_name, settings_fields
from exporter_scheduler.logs import (
    BatchedLogWriter,
    DeferredFields,
    FieldsQueueHandler,
    JsonLogFormatter,
)
from tests.scorer._http_helpers import FIXTURES, gpu_annotations

UTIL = "gpu-scheduler.example.com/utilization"
ROOT = Path(__file__).resolve().parents[2]


def _serve_flags() -> set[str]:
    parser = build_parser()
    (commands,) = [a for a in parser._actions if a.dest == "command"]
    serve = commands.choices["serve"]  # type: ignore[index]
    return {option for action in serve._actions for option in action.option_strings}


def test_serve_has_a_flag_for_every_setting() -> None:
    flags = _serve_flags()
    for name in settings_fields():
        assert flag_name(name) in flags
    assert {"--host", "--port", "--path-prefix", "--node-cache", "--no-node-cache"} <= flags
    assert {"--tls-cert-file", "--tls-key-file", "--tls-client-ca-file", "--kubeconfig"} <= flags


def test_flags_parse_to_settings_names() -> None:
    args = build_parser().parse_args(
        ["serve", "--port", "9999", "--node-cache", "--utilization-limit", "0.8"]
    )
    assert (args.port, args.node_cache, args.utilization_limit) == (9999, True, 0.8)
    # Flags not given stay absent, so the environment and the policy file still apply.
    assert not hasattr(args, "host")


@pytest.fixture
def agent_request(tmp_path: Path) -> Path:
    document = json.loads((FIXTURES / "nodecache-false" / "0001-filter.request.json").read_bytes())
    for item in document["Nodes"]["items"]:
        annotations = item["metadata"]["annotations"]
        annotations.update(gpu_annotations(utilization=float(annotations[UTIL])))
    path = tmp_path / "args.json"
    path.write_text(json.dumps(document))
    return path


def test_explain_json(agent_request: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        ["explain", "--request", str(agent_request), "--now", "2026-11-30T14:00:00Z",
         "--output", "json"]
    )  # fmt: skip
    assert code == 0
    document = json.loads(capsys.readouterr().out)
    text = json.dumps(document)
    for name in ("node-cool", "node-t4", "node-warm", "node-hot"):
        assert name in text
    assert "gpu utilization above 0.90" in text


def test_explain_text_is_stable(agent_request: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["explain", "--request", str(agent_request), "--now", "2026-11-30T14:00:00Z"]
    assert main(argv) == 0
    first = capsys.readouterr().out
    assert main([*argv, "--utilization-limit", "0.99"]) == 0
    looser = capsys.readouterr().out
    assert main(argv) == 0
    assert capsys.readouterr().out == first
    assert "gpu utilization above 0.90" in first
    assert "gpu utilization above 0.90" not in looser


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        pytest.param(
            ["--request", str(FIXTURES / "nodecache-true" / "0001-filter.request.json")],
            "full Node objects",
            id="names-only-request",
        ),
        pytest.param(["--request", "/nonexistent.json"], "cannot read", id="no-file"),
        pytest.param(
            [
                "--request",
                str(FIXTURES / "nodecache-false" / "0001-filter.request.json"),
                "--now",
                "yesterday",
            ],
            "RFC 3339",
            id="bad-now",
        ),
        pytest.param(
            [
                "--request",
                str(FIXTURES / "nodecache-false" / "0001-filter.request.json"),
                "--temperature-limit-c",
                "500",
            ],
            "--temperature-limit-c",
            id="bad-policy-flag",
        ),
        pytest.param(["--request", str(FIXTURES / "README.md")], "malformed JSON", id="not-json"),
    ],
)
def test_explain_errors_exit_2_with_one_message(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["explain", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gpu-scorer: ")
    assert message in err


def test_serve_with_a_bad_setting_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--utilization-limit", "1.5"]) == 2
    assert "--utilization-limit" in capsys.readouterr().err


def test_json_log_lines_carry_the_fields() -> None:
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "node rejected", None, None)
    record.fields = {"node": "a", "age_s": 5.0}
    line = JsonLogFormatter().format(record)
    assert json.loads(line) | {"time": None} == {
        "time": None,
        "level": "info",
        "logger": "x",
        "msg": "node rejected",
        "node": "a",
        "age_s": 5.0,
    }


def test_deferred_fields_are_built_once_by_whoever_formats_the_line() -> None:
    built: list[int] = []

    def fields() -> dict[str, object]:
        built.append(1)
        return {"pod": "ml/a", "reasons": {"gpu utilization above 0.90": 2}}

    records: queue.SimpleQueue[logging.LogRecord] = queue.SimpleQueue()
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "nodes rejected", None, None)
    record.fields = DeferredFields(fields)
    FieldsQueueHandler(records).handle(record)
    queued = records.get_nowait()
    assert queued is record  # nothing to flatten: not copied on the caller's thread
    assert built == []  # queued, not built
    document = json.loads(JsonLogFormatter().format(queued))
    assert document["pod"] == "ml/a"
    assert document["reasons"] == {"gpu utilization above 0.90": 2}
    assert dict(queued.fields) == {"pod": "ml/a", "reasons": {"gpu utilization above 0.90": 2}}  # type: ignore[attr-defined]
    assert built == [1]


def test_queued_records_keep_fields_and_traceback() -> None:
    records: queue.SimpleQueue[logging.LogRecord] = queue.SimpleQueue()
    handler = FieldsQueueHandler(records)
    try:
        raise ValueError("boom")
    except ValueError as exc:
        record = logging.LogRecord("x", logging.ERROR, __file__, 1, "failed %s", ("once",), None)
        record.exc_info = (type(exc), exc, exc.__traceback__)
        record.fields = {"verb": "filter"}
        handler.handle(record)
    document = json.loads(JsonLogFormatter().format(records.get_nowait()))
    assert document["msg"] == "failed once"
    assert document["verb"] == "filter"
    assert "ValueError: boom" in document["exception"]


class _CountingStream(io.StringIO):
    def __init__(self) -> None:
        super().__init__()
        self.writes = 0

    def write(self, text: str) -> int:
        self.writes += 1
        return super().write(text)


class _Unformattable(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        if record.msg == "bad":
            raise RuntimeError("cannot format")
        return json.dumps({"msg": record.msg})


def test_log_writer_writes_a_batch_at_once_and_the_rest_on_stop() -> None:
    records: queue.SimpleQueue[logging.LogRecord] = queue.SimpleQueue()
    stream = _CountingStream()
    # An interval far longer than the test: everything is written by `stop`, in one write.
    writer = BatchedLogWriter(records, stream, _Unformattable(), interval_s=3600.0).start()
    for msg in ("one", "bad", "two"):
        records.put(logging.LogRecord("x", logging.INFO, __file__, 1, msg, None, None))
    assert stream.getvalue() == ""
    writer.stop()
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert [line["msg"] for line in lines] == ["one", "unformattable record", "two"]
    assert lines[1]["level"] == "ERROR"
    assert stream.writes == 1


def test_log_writer_wakes_on_its_interval() -> None:
    records: queue.SimpleQueue[logging.LogRecord] = queue.SimpleQueue()
    stream = _CountingStream()
    writer = BatchedLogWriter(records, stream, JsonLogFormatter(), interval_s=0.01).start()
    try:
        records.put(logging.LogRecord("x", logging.INFO, __file__, 1, "queued", None, None))
        deadline = time.monotonic() + 10.0
        while "queued" not in stream.getvalue() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert json.loads(stream.getvalue())["msg"] == "queued"
    finally:
        writer.stop()


def test_log_writer_survives_a_closed_stream() -> None:
    records: queue.SimpleQueue[logging.LogRecord] = queue.SimpleQueue()
    stream = io.StringIO()
    stream.close()
    writer = BatchedLogWriter(records, stream, JsonLogFormatter(), interval_s=3600.0).start()
    records.put(logging.LogRecord("x", logging.INFO, __file__, 1, "lost", None, None))
    writer.stop()  # no exception: the line has nowhere to go
    assert records.empty()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_full_node_mode_never_loads_the_kubernetes_client() -> None:
    check = (
        "import sys, exporter_scheduler.cli, exporter_scheduler.edges.server;"
        "import exporter_scheduler.serving.wire;"
        "print('kubernetes' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", check], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "False"


def _serve_until_healthy_then_stop(
    flags: list[str], env: dict[str, str]
) -> tuple[int | None, list[dict[str, Any]], str]:
    """Run `gpu-scorer serve` with `flags` on a free port until /healthz answers 200, then
    SIGTERM it; its exit status, its JSON log lines and its whole stderr."""
    port = _free_port()
    # faulthandler: a process that does not stop prints every thread's stack on SIGABRT.
    process = subprocess.Popen(
        [sys.executable, "-X", "faulthandler", "-m", "exporter_scheduler", "serve", *flags,
         "--host", "127.0.0.1", "--port", str(port)],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 20
        status = None
        while status is None:
            try:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
                conn.request("GET", "/healthz")
                status = conn.getresponse().status
                conn.close()
            except OSError:
                assert process.poll() is None, process.communicate()
                assert time.monotonic() < deadline, "gpu-scorer serve did not start"
                time.sleep(0.1)  # waiting for the process to bind, not for a decision
        assert status == 200
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            _, err = process.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            process.send_signal(signal.SIGABRT)
            _, err = process.communicate(timeout=20)
            message = f"gpu-scorer serve did not stop on SIGTERM:\n{err[-8000:]}"
            raise AssertionError(message) from None
    lines = [json.loads(line) for line in err.splitlines() if line.startswith("{")]
    return process.returncode, lines, err


def test_serve_process_answers_and_stops_on_sigterm() -> None:
    """The real entry point (`python -m exporter_scheduler serve`) in full-node mode."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPU_SCORER_")}
    returncode, lines, err = _serve_until_healthy_then_stop([], env)
    assert returncode == 0
    assert lines, err
    assert len(lines) == len(err.splitlines())  # every log line is JSON
    assert any(line["msg"] == "serving" for line in lines)
    assert any("shutdown complete" in line["msg"] for line in lines)


def test_learning_node_watch_without_credentials_serves_and_says_so(tmp_path: Path) -> None:
    """Full-node mode's learning Node watch is an extra: without credentials the scorer serves
    on, learning from the requests' Nodes, and one line says why."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("GPU_SCORER_", "KUBERNETES_SERVICE"))
    }
    env["KUBECONFIG"] = str(tmp_path / "absent")
    returncode, lines, _ = _serve_until_healthy_then_stop(["--own-load-node-watch"], env)
    assert returncode == 0
    (learning,) = [
        line for line in lines if line["msg"] == "learning from the requests' Nodes only"
    ]
    assert learning["level"] == "warning"
    assert "credentials" in learning["why"]


def test_node_cache_without_credentials_exits_1_with_the_reason() -> None:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("GPU_SCORER_", "KUBERNETES_SERVICE"))
    }
    done = subprocess.run(
        [sys.executable, "-m", "exporter_scheduler", "serve", "--node-cache",
         "--host", "127.0.0.1", "--port", str(_free_port())],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 1
    (line,) = [json.loads(x) for x in done.stderr.splitlines() if x.startswith("{")]
    assert line["level"] == "error"
    assert "credentials" in line["msg"]
