"""Shared pieces of the scorer's edge tests: a server on loopback, HTTP calls, Node builders."""

from __future__ import annotations

import http.client
import json
import shutil
import ssl
import subprocess
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from exporter_scheduler.config.serving import TlsFiles
from exporter_scheduler.core.policy import Policy
from exporter_scheduler.core.records import NodeInput
from exporter_scheduler.edges.server import HttpApp, HttpServer
from exporter_scheduler.serving.app import ScorerApp
from exporter_scheduler.serving.nodestore import NodeStore
from gpu_contract.schema import FIELD_MANAGER, Health, NodeGpuState, encode, format_timestamp
from tests.fixture_paths import SCHEDULER_FIXTURES

FIXTURES = SCHEDULER_FIXTURES

NOW = datetime(2026, 11, 30, 14, 0, 0, tzinfo=UTC)


def fixed_clock(now: datetime = NOW) -> Any:
    return lambda: now


def make_app(
    *,
    policy: Policy | None = None,
    now: datetime = NOW,
    node_store: NodeStore | None = None,
    path_prefix: str = "/",
    max_body_bytes: int = 64 * 1024 * 1024,
) -> ScorerApp:
    return ScorerApp(
        policy=policy or Policy(),
        clock=fixed_clock(now),
        node_store=node_store,
        path_prefix=path_prefix,
        max_body_bytes=max_body_bytes,
    )


def store_of(nodes: Iterable[NodeInput] | None, *, now: datetime = NOW) -> NodeStore:
    """A names-only node store holding `nodes` (None: before its first LIST, not ready)."""
    store = NodeStore(clock=fixed_clock(now))
    if nodes is not None:
        store.replace(nodes)
    return store


@contextmanager
def serving(app: HttpApp, *, tls: TlsFiles | None = None) -> Iterator[HttpServer]:
    with HttpServer(app, host="127.0.0.1", port=0, tls=tls) as server:
        yield server


def connect(
    server: HttpServer, *, context: ssl.SSLContext | None = None
) -> http.client.HTTPConnection:
    if server.scheme == "https":
        return http.client.HTTPSConnection("127.0.0.1", server.port, timeout=10, context=context)
    return http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)


def call(
    conn: http.client.HTTPConnection,
    method: str,
    path: str,
    body: bytes | None = None,
    headers: Mapping[str, str] | None = None,
) -> tuple[int, dict[str, str], bytes]:
    sent = {"Content-Type": "application/json", **(headers or {})}
    conn.request(method, path, body=body, headers=sent)
    response = conn.getresponse()
    data = response.read()
    return response.status, {k.lower(): v for k, v in response.getheaders()}, data


def gpu_annotations(
    *,
    utilization: float = 0.10,
    updated_at: datetime = NOW - timedelta(seconds=5),
    temperature_c: int | None = 50,
    largest_free_mib: int | None = 40_000,
    model: str | None = "NVIDIA-A100-SXM4-80GB",
    health: Health = Health.OK,
) -> dict[str, str]:
    """The annotations the agent writes, through the shared contract."""
    return encode(
        NodeGpuState(
            health=health,
            updated_at=updated_at,
            utilization=utilization,
            utilization_max=utilization,
            memory_fragmentation=0.0,
            memory_free_mib=largest_free_mib,
            memory_largest_free_mib=largest_free_mib,
            temperature_c=temperature_c,
            gpu_model=model,
            gpu_count=8,
        )
    )


def node(
    name: str,
    annotations: Mapping[str, str] | None = None,
    *,
    agent_time: datetime | None = None,
) -> dict[str, Any]:
    """A small Node object with the fields the scorer reads, plus some it must skip."""
    managed: list[dict[str, Any]] = [
        {"manager": "kubelet", "operation": "Update", "time": "2026-11-30T13:00:00Z"}
    ]
    if agent_time is not None:
        managed.append(
            {
                "manager": FIELD_MANAGER,
                "operation": "Update",
                "apiVersion": "v1",
                "time": format_timestamp(agent_time),
                "fieldsType": "FieldsV1",
                "fieldsV1": {"f:metadata": {"f:annotations": {}}},
            }
        )
    return {
        "metadata": {
            "name": name,
            "labels": {"kubernetes.io/hostname": name},
            "annotations": dict(annotations or {}),
            "managedFields": managed,
        },
        "spec": {},
        "status": {"allocatable": {"nvidia.com/gpu": "8"}, "conditions": []},
    }


def pod(
    annotations: Mapping[str, str] | None = None, *, gpus: int | str = 1, name: str = "p"
) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "default", "annotations": dict(annotations or {})},
        "spec": {
            "containers": [
                {"name": "main", "resources": {"requests": {"nvidia.com/gpu": str(gpus)}}}
            ]
        },
    }


def args_body(
    pod_doc: Mapping[str, Any],
    nodes: Sequence[Mapping[str, Any]] | None = None,
    names: Sequence[str] | None = None,
) -> bytes:
    return json.dumps(
        {
            "Pod": pod_doc,
            "Nodes": None if nodes is None else {"metadata": {}, "items": list(nodes)},
            "NodeNames": None if names is None else list(names),
        }
    ).encode()


def check_filter_reply(reply: Any, *, given: Sequence[str], form: str) -> list[str]:
    """Assert `reply` is a well-formed ExtenderFilterResult; return the passing names."""
    assert set(reply) == {
        "Nodes",
        "NodeNames",
        "FailedNodes",
        "FailedAndUnresolvableNodes",
        "Error",
    }
    assert isinstance(reply["FailedNodes"], dict)
    assert isinstance(reply["FailedAndUnresolvableNodes"], dict)
    assert reply["Error"] == ""
    if form == "none":  # neither list in the request: both, empty
        assert reply["Nodes"] == {"items": []}
        assert reply["NodeNames"] == []
        passed: list[str] = []
    elif form == "nodes":
        assert reply["NodeNames"] is None
        passed = [item["metadata"]["name"] for item in reply["Nodes"]["items"]]
    else:
        assert reply["Nodes"] is None
        passed = list(reply["NodeNames"])
    rejected = [*reply["FailedNodes"], *reply["FailedAndUnresolvableNodes"]]
    # Every node given is accounted for exactly once, and nothing else is named.
    assert sorted(passed + rejected) == sorted(given)
    assert all(isinstance(reason, str) and reason for reason in reply["FailedNodes"].values())
    return passed


def check_prioritize_reply(reply: Any, *, given: Sequence[str]) -> dict[str, int]:
    assert isinstance(reply, list)
    assert [entry["Host"] for entry in reply] == list(given)
    scores = {entry["Host"]: entry["Score"] for entry in reply}
    assert all(isinstance(s, int) and 0 <= s <= 10 for s in scores.values())
    return scores


needs_openssl = pytest.mark.skipif(shutil.which("openssl") is None, reason="no openssl CLI")


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)


def make_pki(tmp: Path) -> dict[str, Path]:
    """A CA, a server certificate for 127.0.0.1 and a client certificate, all EC P-256."""
    files = {n: tmp / f"{n}.pem" for n in ("ca", "ca-key", "srv", "srv-key", "cli", "cli-key")}
    _openssl(
        "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
        "-keyout", str(files["ca-key"]), "-out", str(files["ca"]), "-days", "2",
        "-subj", "/CN=test-ca",
    )  # fmt: skip
    ext = tmp / "srv.ext"
    ext.write_text("subjectAltName=IP:127.0.0.1\n")
    for who, subject, extfile in (("srv", "/CN=127.0.0.1", ext), ("cli", "/CN=scheduler", None)):
        csr = tmp / f"{who}.csr"
        _openssl(
            "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
            "-keyout", str(files[f"{who}-key"]), "-out", str(csr), "-subj", subject,
        )  # fmt: skip
        sign = ["x509", "-req", "-in", str(csr), "-CA", str(files["ca"])]
        sign += ["-CAkey", str(files["ca-key"]), "-CAcreateserial", "-days", "2"]
        sign += ["-out", str(files[who])]
        if extfile is not None:
            sign += ["-extfile", str(extfile)]
        _openssl(*sign)
    return files
