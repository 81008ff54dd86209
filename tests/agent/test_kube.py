"""The real kubernetes client over real HTTP against the local API server stand-in.

Every assertion is on what reached the server (method, path, content type, query, body) or on the
Node the server now holds, never on what the client was asked to do.
"""

from __future__ import annotations

import json
import logging
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from itertools import pairwise
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import parse_qs, urlsplit

import pytest

from agent.daemon import Agent
from agent.kube import (
    MERGE_PATCH,
    ApiError,
    ClientError,
    ConflictError,
    ForbiddenError,
    NodeAnnotator,
    NotFoundError,
    ServerError,
    Timeouts,
    TooManyRequestsError,
    TransportError,
    UnauthorizedError,
    api_client_for,
)
from agent.limiter import WritePolicy
from agent.metrics import AgentMetrics
from agent.sources import open_source
from gpu_contract.schema import DEFAULT_KEYS, FIELD_MANAGER, Field, parse_timestamp
from kube_standins.apiserver import ApiServerStandIn, Fault, write_kubeconfig
from kube_standins.nodes import gpu_node

NODE = "gpu-node-1"
FOREIGN = {"other.example.com/keep": "yes"}
PREFIX = DEFAULT_KEYS.prefix
STALE_KEY = PREFIX + "memory-used-mib"
T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


@pytest.fixture
def server(api_server: ApiServerStandIn) -> ApiServerStandIn:
    """The shared stand-in holding a realistic GPU Node with foreign and stale annotations."""
    api_server.put_node(gpu_node(NODE, annotations={**FOREIGN, STALE_KEY: "1234"}))
    return api_server


@pytest.fixture
def foreign(server: ApiServerStandIn) -> dict[str, str]:
    """Every annotation on the Node outside the agent's prefix, before the agent ran."""
    return {k: v for k, v in annotations_of(server).items() if not k.startswith(PREFIX)}


@pytest.fixture
def annotator(server: ApiServerStandIn, kubeconfig: Path) -> Iterator[NodeAnnotator]:
    writer = NodeAnnotator(
        api_client_for(str(kubeconfig)),
        node_name=NODE,
        timeouts=Timeouts(connect_s=1.0, read_s=0.5),
    )
    yield writer
    writer.close()


def annotations_of(server: ApiServerStandIn) -> dict[str, str]:
    node = server.node(NODE)
    assert node is not None
    return dict(node["metadata"].get("annotations") or {})


def patches(server: ApiServerStandIn) -> list[Any]:
    return [r for r in server.requests if r.method == "PATCH"]


def query_value(query: object, name: str) -> str | None:
    if isinstance(query, str):
        query = parse_qs(query)
    if isinstance(query, dict):
        value = query.get(name)
        if isinstance(value, list):
            return str(value[0]) if value else None
        return None if value is None else str(value)
    return None


def header(headers: object, name: str) -> str | None:
    items = headers.items() if isinstance(headers, dict) else headers
    for key, value in items:  # type: ignore[union-attr]
        if str(key).lower() == name.lower():
            return str(value)
    return None


def body_json(request: Any) -> Any:
    body = request.body
    if isinstance(body, bytes | str):
        return json.loads(body)
    return body


ANNOTATIONS = {
    DEFAULT_KEYS[Field.UTILIZATION]: "0.42",
    DEFAULT_KEYS[Field.HEALTH]: "ok",
    DEFAULT_KEYS[Field.GPU_COUNT]: "8",
    DEFAULT_KEYS[Field.UPDATED_AT]: "2026-11-30T12:00:00Z",
    DEFAULT_KEYS[Field.SCHEMA_VERSION]: "1",
}


def test_patch_is_one_merge_patch_with_field_manager(
    server: ApiServerStandIn, annotator: NodeAnnotator, foreign: dict[str, str]
) -> None:
    annotator.patch(ANNOTATIONS)
    get, patch = server.requests[-2], server.requests[-1]
    assert (get.method, get.path) == ("GET", f"/api/v1/nodes/{NODE}")
    assert (patch.method, patch.path) == ("PATCH", f"/api/v1/nodes/{NODE}")
    assert header(patch.headers, "content-type") == MERGE_PATCH
    assert query_value(patch.query, "fieldManager") == FIELD_MANAGER
    assert header(patch.headers, "authorization") == "Bearer test-token"
    sent = body_json(patch)["metadata"]["annotations"]
    assert set(body_json(patch)) == {"metadata"}
    assert set(body_json(patch)["metadata"]) == {"annotations"}
    # Every schema key is named: values for the measured ones, null for the rest and for the
    # stale key of the prefix the Node carried; foreign keys are never named.
    assert {k: v for k, v in sent.items() if v is not None} == ANNOTATIONS
    assert sent[STALE_KEY] is None
    assert sent[DEFAULT_KEYS[Field.TEMPERATURE]] is None
    assert not set(foreign) & set(sent)
    assert FOREIGN.items() <= foreign.items()
    assert annotations_of(server) == {**foreign, **ANNOTATIONS}
    # The API server stamps the agent's write under its field manager: the scorer's freshness
    # clock. Exactly one Update entry, owning exactly the keys written.
    node = server.node(NODE)
    mine = [m for m in node["metadata"]["managedFields"] if m["manager"] == FIELD_MANAGER]
    assert len(mine) == 1
    assert mine[0]["operation"] == "Update"
    assert parse_timestamp(mine[0]["time"]) is not None
    owned = mine[0]["fieldsV1"]["f:metadata"]["f:annotations"]
    assert set(owned) == {f"f:{key}" for key in ANNOTATIONS}


def test_second_patch_does_not_reread_and_forgets_removed_keys(
    server: ApiServerStandIn, annotator: NodeAnnotator
) -> None:
    annotator.patch(ANNOTATIONS)
    annotator.patch({**ANNOTATIONS, DEFAULT_KEYS[Field.UTILIZATION]: "0.57"})
    methods = [r.method for r in server.requests]
    assert methods.count("GET") == 1
    sent = body_json(patches(server)[-1])["metadata"]["annotations"]
    # The stale key is gone from the Node, so it is no longer named.
    assert STALE_KEY not in sent
    assert annotations_of(server)[DEFAULT_KEYS[Field.UTILIZATION]] == "0.57"


def test_node_not_readable_still_written_and_stale_keys_removed_next_time(
    server: ApiServerStandIn, annotator: NodeAnnotator
) -> None:
    server.inject(Fault(status=403, method="GET", times=1))
    annotator.patch(ANNOTATIONS)
    assert annotations_of(server)[STALE_KEY] == "1234"  # not known before the first answer
    annotator.patch(ANNOTATIONS)
    assert STALE_KEY not in annotations_of(server)
    assert [r.method for r in server.requests] == ["GET", "PATCH", "PATCH"]


FAULTS = [
    pytest.param(Fault(status=401, method="PATCH"), UnauthorizedError, "401", id="401"),
    pytest.param(Fault(status=403, method="PATCH"), ForbiddenError, "403", id="403"),
    pytest.param(Fault(status=404, method="PATCH"), NotFoundError, "404", id="404"),
    pytest.param(Fault(status=409, method="PATCH"), ConflictError, "409", id="409"),
    pytest.param(
        Fault(status=429, retry_after_s=7, method="PATCH"), TooManyRequestsError, "429", id="429"
    ),
    pytest.param(Fault(status=500, method="PATCH"), ServerError, "500", id="500"),
    pytest.param(Fault(status=503, method="PATCH"), ServerError, "503", id="503"),
    pytest.param(
        Fault(status=503, retry_after_s=7, method="PATCH"),
        ServerError,
        "503",
        id="503-retry-after",
    ),
    pytest.param(Fault(status=504, method="PATCH"), ServerError, "504", id="504"),
    pytest.param(Fault(status=422, method="PATCH"), ClientError, "422", id="422"),
    pytest.param(
        Fault(delay_s=1.5, method="PATCH"),
        TransportError,
        "transport",
        id="read-timeout",
    ),
    pytest.param(
        Fault(reset=True, method="PATCH"),
        TransportError,
        "transport",
        id="connection-reset",
    ),
]


@pytest.mark.parametrize(("fault", "error_class", "code"), FAULTS)
def test_each_fault_maps_to_one_error_and_the_next_write_succeeds(
    server: ApiServerStandIn,
    annotator: NodeAnnotator,
    fault: Fault,
    error_class: type[ApiError],
    code: str,
) -> None:
    annotator.refresh()
    server.inject(fault)
    with pytest.raises(error_class) as caught:
        annotator.patch(ANNOTATIONS)
    assert caught.value.code == code
    if fault.retry_after_s is not None:
        assert caught.value.retry_after_s == 7.0
    annotator.patch(ANNOTATIONS)
    assert annotations_of(server)[DEFAULT_KEYS[Field.UTILIZATION]] == "0.42"
    if error_class in (NotFoundError, ConflictError):
        # The Node is re-read before the retry, to learn its prefix keys again.
        assert [r.method for r in server.requests[-2:]] == ["GET", "PATCH"]


@pytest.mark.parametrize(
    ("status", "hint"),
    [
        pytest.param(401, "ServiceAccount token", id="401-says-credentials"),
        pytest.param(403, "'get' and 'patch' on 'nodes'", id="403-says-rbac"),
        pytest.param(404, "--node-name / NODE_NAME", id="404-says-node-name"),
    ],
)
def test_auth_and_missing_node_errors_say_what_to_check(
    server: ApiServerStandIn, kubeconfig: Path, status: int, hint: str, caplog: Any
) -> None:
    server.inject(Fault(status=status, method="PATCH", times=1))
    writer = NodeAnnotator(api_client_for(str(kubeconfig)), node_name=NODE)
    agent = Agent(
        source=open_source("simulated", simulated_gpus=2, start=T0),
        writer=writer,
        metrics=AgentMetrics(),
        start_s=0.0,
    )
    with caplog.at_level(logging.WARNING, logger="agent.daemon"):
        result = agent.tick(now_s=0.0, wall_now=T0)
    writer.close()
    assert result.write_error is not None
    lines = [r.getMessage() for r in caplog.records if r.name == "agent.daemon"]
    assert len(lines) == 1
    assert hint in lines[0]
    assert "next attempt in 10 s" in lines[0]


def test_connection_refused_is_a_transport_error(tmp_path: Path) -> None:
    with socket.socket() as probe:  # a loopback port with nothing listening on it
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    path = write_kubeconfig(tmp_path / "kubeconfig", url=f"http://127.0.0.1:{port}", token="t")
    writer = NodeAnnotator(api_client_for(str(path)), node_name=NODE)
    with pytest.raises(TransportError) as caught:
        writer.patch(ANNOTATIONS)
    writer.close()
    assert caught.value.code == "transport"
    assert str(caught.value).startswith("API server unreachable:")
    assert writer.needs_refresh  # the Node was never read


def test_unauthorized_token_from_the_server_itself(
    server: ApiServerStandIn, tmp_path: Path
) -> None:
    path = tmp_path / "kubeconfig"
    server.write_kubeconfig(path)
    text = path.read_text().replace("test-token", "wrong-token")
    path.write_text(text)
    writer = NodeAnnotator(api_client_for(str(path)), node_name=NODE)
    with pytest.raises(UnauthorizedError):
        writer.patch(ANNOTATIONS)
    writer.close()


# --- the daemon's tick against the stand-in, over simulated time ------------------------------


def drive(
    kubeconfig: Path,
    *,
    minutes: int,
    sample_s: float = 5.0,
    read_timeout_s: float = 0.5,
    gpus: int = 8,
) -> Agent:
    writer = NodeAnnotator(
        api_client_for(str(kubeconfig)),
        node_name=NODE,
        timeouts=Timeouts(connect_s=1.0, read_s=read_timeout_s),
    )
    agent = Agent(
        source=open_source("simulated", simulated_gpus=gpus, seed=11, start=T0),
        writer=writer,
        policy=WritePolicy(),
        metrics=AgentMetrics(),
        sample_interval_s=sample_s,
        start_s=0.0,
        jitter_s=2.5,
    )
    for step in range(int(minutes * 60 / sample_s)):
        now_s = step * sample_s
        agent.tick(now_s=now_s, wall_now=T0 + timedelta(seconds=now_s))
    writer.close()
    return agent


def sampled_times_s(server: ApiServerStandIn) -> list[float]:
    """When each PATCH's values were sampled (its updated-at), in seconds after T0."""
    times = []
    for request in patches(server):
        stamp = body_json(request)["metadata"]["annotations"][DEFAULT_KEYS[Field.UPDATED_AT]]
        moment = parse_timestamp(stamp)
        assert moment is not None
        times.append((moment - T0).total_seconds())
    return times


def test_simulated_half_hour_respects_every_rate_limit(
    server: ApiServerStandIn, kubeconfig: Path, foreign: dict[str, str]
) -> None:
    # Four GPUs: with eight, the simulated trace starts or ends a job somewhere on the node about
    # every 20 s, so every write is a change and no heartbeat ever comes due.
    agent = drive(kubeconfig, minutes=30, gpus=4)
    times = sampled_times_s(server)
    gaps = [b - a for a, b in pairwise(times)]
    assert times[0] == 5.0  # the first tick after the 2.5 s start jitter
    assert min(gaps) >= 10.0  # minimum write interval
    assert max(gaps) <= 65.0  # heartbeat + one sample interval
    assert len(times) < 360 / 2  # deadbands: far fewer writes than ticks
    assert agent.metrics.value("gpu_agent_writes_total", {"reason": "heartbeat-due"}) >= 1
    # The Node holds exactly the last state written, beside the foreign annotations.
    last_sent = body_json(patches(server)[-1])["metadata"]["annotations"]
    assert annotations_of(server) == {
        **foreign,
        **{k: v for k, v in last_sent.items() if v is not None},
    }
    assert all(r.status == 200 for r in server.requests)


@pytest.mark.parametrize(
    ("fault", "code"),
    [
        pytest.param(Fault(status=503, method="PATCH", times=10_000), "503", id="5xx"),
        pytest.param(Fault(status=401, method="PATCH", times=10_000), "401", id="401"),
        pytest.param(Fault(status=403, method="PATCH", times=10_000), "403", id="403"),
        pytest.param(Fault(status=404, method="PATCH", times=10_000), "404", id="404"),
        pytest.param(Fault(status=409, method="PATCH", times=10_000), "409", id="409"),
        pytest.param(
            Fault(status=429, method="PATCH", times=10_000), "429", id="429-without-retry-after"
        ),
        pytest.param(Fault(reset=True, method="PATCH", times=10_000), "transport", id="reset"),
    ],
)
def test_an_hour_of_api_faults_is_no_write_storm(
    server: ApiServerStandIn, kubeconfig: Path, fault: Fault, code: str
) -> None:
    server.inject(fault)
    agent = drive(kubeconfig, minutes=60, gpus=1)
    times = sampled_times_s(server)
    gaps = [b - a for a, b in pairwise(times)]
    assert min(gaps) >= 10.0
    # 10, 20, 40, 80 s, then one attempt per 120 s: about 33 attempts in the hour, not 720.
    assert len(times) <= 36
    assert gaps[-3:] == [120.0] * 3
    assert agent.metrics.value("gpu_agent_api_errors_total", {"code": code}) == len(times)
    assert agent.readyz()[0] is (code not in {"401", "403"})


@pytest.mark.parametrize("status", [pytest.param(429, id="429"), pytest.param(503, id="503")])
def test_retry_after_is_honoured_end_to_end(
    server: ApiServerStandIn, kubeconfig: Path, status: int
) -> None:
    server.inject(Fault(status=status, retry_after_s=45, method="PATCH", times=1))
    drive(kubeconfig, minutes=2)
    times = sampled_times_s(server)
    assert [r.status for r in patches(server)][:2] == [status, 200]
    # Without Retry-After the first backoff would be 10 s.
    assert times[1] - times[0] >= 45.0
    assert times[1] - times[0] <= 45.0 + 5.0


def test_timeouts_bound_the_tick_and_back_off(server: ApiServerStandIn, kubeconfig: Path) -> None:
    server.inject(Fault(delay_s=1.0, method="PATCH", times=2))
    # One GPU: a quiet node, so the only writes are the timed-out ones and their retry.
    agent = drive(kubeconfig, minutes=2, read_timeout_s=0.3, gpus=1)
    # A timed-out request is still served once its delay ends (as a slow real server would), and
    # recorded then: wait, bounded, for the stand-in to finish both.
    deadline = time.monotonic() + 10
    while len(patches(server)) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    times = sorted(sampled_times_s(server))
    assert len(times) == 3
    # Two timed-out attempts (backoff 10 s, then 20 s), then success.
    assert times[1] - times[0] >= 10.0
    assert times[2] - times[1] >= 20.0
    assert agent.metrics.value("gpu_agent_api_errors_total", {"code": "transport"}) == 2
    assert agent.limiter.consecutive_failures == 0


# --- naming this node's pods (per-process attribution) -----------------------------------------


class _PodList(BaseHTTPRequestHandler):
    """Answers GET /api/v1/pods as a v1.36 server does for a metadata-only LIST, or a 403."""

    seen: ClassVar[list[tuple[str, str, str]]] = []
    status: ClassVar[int] = 200

    def do_GET(self) -> None:
        type(self).seen.append(
            (self.path, self.headers.get("Accept", ""), self.headers.get("Authorization", ""))
        )
        if type(self).status != 200:
            body = json.dumps(
                {
                    "kind": "Status",
                    "apiVersion": "v1",
                    "status": "Failure",
                    "reason": "Forbidden",
                    "message": 'pods is forbidden: cannot list resource "pods"',
                    "code": 403,
                }
            ).encode()
        else:
            body = json.dumps(
                {
                    "kind": "PartialObjectMetadataList",
                    "apiVersion": "meta.k8s.io/v1",
                    "metadata": {"resourceVersion": "42"},
                    "items": [
                        {
                            "kind": "PartialObjectMetadata",
                            "apiVersion": "meta.k8s.io/v1",
                            "metadata": {"name": "infer-a", "namespace": "ml", "uid": "u-1"},
                        }
                    ],
                }
            ).encode()
        self.send_response(type(self).status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_args: object) -> None:
        return None


@pytest.mark.parametrize("status", [200, 403])
def test_pods_of_this_node_are_one_metadata_only_list(tmp_path: Path, status: int) -> None:
    _PodList.seen = []
    _PodList.status = status
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _PodList)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        path = write_kubeconfig(
            tmp_path / "kubeconfig", url=f"http://127.0.0.1:{httpd.server_port}", token="t"
        )
        writer = NodeAnnotator(api_client_for(str(path)), node_name=NODE)
        try:
            if status == 200:
                assert writer.pods_by_uid() == {"u-1": "ml/infer-a"}
            else:
                with pytest.raises(ForbiddenError):
                    writer.pods_by_uid()
        finally:
            writer.close()
    finally:
        httpd.shutdown()
        httpd.server_close()
    ((request, accept, authorization),) = _PodList.seen
    assert authorization == "Bearer t"
    query = parse_qs(urlsplit(request).query)
    assert urlsplit(request).path == "/api/v1/pods"
    assert query["fieldSelector"] == [f"spec.nodeName={NODE}"]
    assert query["resourceVersion"] == ["0"]
    assert accept.startswith("application/json;as=PartialObjectMetadataList;v=v1;g=meta.k8s.io")


def test_the_client_is_imported_without_its_generated_modules_and_every_name_resolves() -> None:
    # In a fresh interpreter: the agent's import of the client loads no model module (about
    # 45 MiB of RSS), and a model, an API and the loader's names still resolve on first use.
    probe = (
        "import sys, agent.kube\n"
        "models = [m for m in sys.modules if m.startswith('kubernetes.client.models.')]\n"
        "assert not models, models\n"
        "from kubernetes import client, config\n"
        "from kubernetes.client import V1Pod, CoreV1Api, ApiClient, rest\n"
        "import kubernetes.client.models as m\n"
        "assert m.V1Node.__name__ == 'V1Node' and V1Pod.__module__.endswith('v1_pod')\n"
        "assert CoreV1Api is agent.kube.client.CoreV1Api and callable(config.load_kube_config)\n"
        "assert agent.kube.ApiException.__name__ == 'ApiException'\n"
        "print('ok')\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
        check=False,
    )
    assert result.stdout.strip() == "ok", result.stderr
