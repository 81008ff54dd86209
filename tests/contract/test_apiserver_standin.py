"""The API server stand-in answers as the captured kube-apiserver v1.36.2 does.

Replays the captured requests over raw HTTP and compares status, headers, framing and bodies
(uids and resourceVersions normalised: the capture's etcd had other writers), then drives the
stand-in with the real `kubernetes` client, faults, auth and LIST.
"""

from __future__ import annotations

import http.client
import json
import re
import socket
import time
from datetime import timedelta
from email.utils import parsedate_to_datetime
from typing import Any

import pytest
import urllib3
from kubernetes.client.rest import ApiException

from kube_standins.apiserver import ApiServerStandIn, Fault, ManualClock
from kube_standins.nodes import gpu_node
from tests.contract.apiserver_wire import RawResponse, fixture, request

AGENT = "/api/v1/nodes/gpu-node-1?fieldManager=gpu-scheduler-agent"
MERGE = "application/merge-patch+json"
PF_HEADERS = ("X-Kubernetes-Pf-Flowschema-Uid", "X-Kubernetes-Pf-Prioritylevel-Uid")


def normalise(text: str) -> str:
    """Blank uids and resourceVersions, also inside the JSON a 422 message embeds."""
    return re.sub(
        r'(\\*)"(uid|resourceVersion)\1":\1"[^"\\]*\1"',
        lambda m: f'{m[1]}"{m[2]}{m[1]}":{m[1]}"X{m[1]}"',
        text,
    )


def replay(srv: ApiServerStandIn, clock: ManualClock, name: str, **kw: Any) -> RawResponse:
    """Send a captured request at the capture's server time."""
    fx = fixture(name)
    clock.set(parsedate_to_datetime(dict(fx["response"]["headers"])["Date"]))
    req = fx["request"]
    token: str | None = "test-token"
    if "Authorization" in req["headers"]:
        token = "not-a-valid-token"
    elif name.startswith("40-"):
        token = None
    return request(
        srv.url,
        req["method"],
        req["path"],
        body=kw.get("body", req.get("body")),
        content_type=req["headers"].get("Content-Type"),
        token=token,
    )


def framing(names: list[str]) -> list[str]:
    return [n for n in names if n not in ("Audit-Id", "Date")]


# Captures in the order they were taken (25/26 came after the LIST/WATCH steps).
SEQUENCE = [
    "01-create-node.json",
    "02-patch-node-status.json",
    "10-merge-patch-annotations.json",
    "11-merge-patch-change-and-remove.json",
    "12-merge-patch-noop.json",
    "20-strategic-merge-patch.json",
    "21-json-patch.json",
    "22-json-patch-remove-missing.json",
    "23-json-patch-unescaped-slash.json",
    "24-json-patch-test-fails.json",
    "30-err-404-node-not-found.json",
    "31-err-422-invalid-annotation-key.json",
    "33-err-415-unsupported-content-type.json",
    "34-err-400-malformed-json-merge-patch.json",
    "35-err-400-malformed-json-patch.json",
    "36-err-annotation-value-not-string.json",
    "37-err-json-patch-as-merge-body.json",
    "38-err-apply-patch-no-fieldmanager.json",
    "40-err-403-anonymous-no-credentials.json",
    "41-err-401-invalid-bearer-token.json",
    "44-err-409-stale-resourceversion.json",
    "45-merge-patch-current-resourceversion.json",
    "25-apply-patch-conflict.json",
]


def test_replayed_captures_get_the_captured_answers(
    frozen_api_server: ApiServerStandIn, api_clock: ManualClock
) -> None:
    srv = frozen_api_server
    mismatches: list[str] = []
    for name in SEQUENCE:
        body = None
        if name.startswith(("44-", "45-")):
            current = int(srv.node("gpu-node-1")["metadata"]["resourceVersion"])
            rv = current - 1 if name.startswith("44-") else current
            raw = json.loads(fixture(name)["request"]["body"])
            raw["metadata"]["resourceVersion"] = str(rv)
            body = json.dumps(raw, separators=(",", ":"))
        got = replay(srv, api_clock, name, **({"body": body} if body else {}))
        want = fixture(name)["response"]
        want_names = [k for k, _ in want["headers"]]
        if got.status != want["status"] or got.reason != want["reason"]:
            mismatches.append(f"{name}: status {got.status} {got.reason}")
        if framing(got.header_names) != framing(want_names):
            mismatches.append(f"{name}: headers {got.header_names} != {want_names}")
        if normalise(got.body.decode()) != normalise(want["body"]):
            mismatches.append(
                f"{name}: body\n  got  {got.body[:600]!r}\n  want {want['body'][:600]}"
            )
    assert not mismatches, "\n".join(mismatches)


def test_forced_apply_takes_fields_and_keeps_the_old_entry_time(
    frozen_api_server: ApiServerStandIn, api_clock: ManualClock
) -> None:
    srv = frozen_api_server
    for name in SEQUENCE[:7]:
        replay(srv, api_clock, name)
    conflict = replay(srv, api_clock, "25-apply-patch-conflict.json")
    assert conflict.status == 409
    forced = replay(srv, api_clock, "26-apply-patch-force.json")
    assert forced.status == 200
    entries = {e["manager"]: e for e in forced.json()["metadata"]["managedFields"]}
    want = {
        e["manager"]: e
        for e in fixture("26-apply-patch-force.json")["response"]["body_json"]["metadata"][
            "managedFields"
        ]
    }
    assert entries["gpu-scheduler-apply"] == want["gpu-scheduler-apply"]
    assert entries["gpu-scheduler-agent"]["fieldsV1"] == want["gpu-scheduler-agent"]["fieldsV1"]
    assert entries["gpu-scheduler-agent"]["time"] == "2026-11-30T14:19:31Z"  # its last own write
    assert forced.json()["metadata"]["managedFields"][0]["operation"] == "Apply"


def test_annotations_over_256_kib_get_the_captured_422(frozen_api_server: ApiServerStandIn) -> None:
    srv = frozen_api_server
    srv.put_node(gpu_node("gpu-node-1"))
    blob = {"metadata": {"annotations": {"gpu-scheduler.example.com/blob": "x" * 262144}}}
    got = request(srv.url, "PATCH", AGENT, body=json.dumps(blob), content_type=MERGE)
    assert got.status == 422
    assert got.body.decode() == fixture("32-err-422-annotations-too-large.json")["response"]["body"]


@pytest.mark.parametrize(
    ("path", "chunked"),
    [
        pytest.param("/api/v1/nodes/missing", False, id="small-status-has-content-length"),
        pytest.param("/api/v1/nodes/gpu-node-1", True, id="full-node-goes-chunked-in-one-chunk"),
        pytest.param("/api/v1/nodes", True, id="node-list-goes-chunked"),
    ],
)
def test_bodies_over_2_kib_are_chunked_like_go(
    api_server: ApiServerStandIn, path: str, chunked: bool
) -> None:
    api_server.put_node(gpu_node("gpu-node-1"))
    got = request(api_server.url, "GET", path)
    assert (got.chunk_sizes is not None) is chunked
    if chunked:
        assert got.chunk_sizes == [len(got.body)]
        assert got.header("Content-Length") is None
    else:
        assert got.header("Content-Length") == str(len(got.body))
    for name in ("Audit-Id", "Cache-Control", "Content-Type", "Date", *PF_HEADERS):
        assert got.header(name), name
    assert got.header("Cache-Control") == "no-cache, private"


def test_noop_patch_moves_neither_resource_version_nor_managed_time(
    frozen_api_server: ApiServerStandIn, api_clock: ManualClock
) -> None:
    srv = frozen_api_server
    srv.put_node(gpu_node("gpu-node-1"))
    body = json.dumps(
        {"metadata": {"annotations": {"gpu-scheduler.example.com/utilization": "0.5"}}}
    )
    first = request(srv.url, "PATCH", AGENT, body=body, content_type=MERGE).json()
    api_clock.advance(7)
    again = request(srv.url, "PATCH", AGENT, body=body, content_type=MERGE).json()
    assert again == first
    assert srv.resource_version == int(first["metadata"]["resourceVersion"])
    assert srv.node_writes("gpu-node-1") == 1
    api_clock.advance(3)
    changed = body.replace("0.5", "0.6")
    third = request(srv.url, "PATCH", AGENT, body=changed, content_type=MERGE).json()
    agent = [e for e in third["metadata"]["managedFields"] if e["manager"] == "gpu-scheduler-agent"]
    assert agent[0]["time"] == "2026-11-30T14:19:34Z"
    assert (
        int(third["metadata"]["resourceVersion"]) == int(first["metadata"]["resourceVersion"]) + 1
    )
    assert srv.node_writes("gpu-node-1") == 2


def test_null_removes_the_key_from_the_object_and_from_the_managers_fields(
    frozen_api_server: ApiServerStandIn,
) -> None:
    srv = frozen_api_server
    srv.put_node(gpu_node("gpu-node-1"))
    keys = {"gpu-scheduler.example.com/a": "1", "gpu-scheduler.example.com/b": "2"}
    request(
        srv.url,
        "PATCH",
        AGENT,
        body=json.dumps({"metadata": {"annotations": keys}}),
        content_type=MERGE,
    )
    removal = {"metadata": {"annotations": {"gpu-scheduler.example.com/b": None}}}
    node = request(srv.url, "PATCH", AGENT, body=json.dumps(removal), content_type=MERGE).json()
    assert "gpu-scheduler.example.com/b" not in node["metadata"]["annotations"]
    agent = next(
        e for e in node["metadata"]["managedFields"] if e["manager"] == "gpu-scheduler-agent"
    )
    assert agent["fieldsV1"] == {
        "f:metadata": {"f:annotations": {"f:gpu-scheduler.example.com/a": {}}}
    }


# ---------------------------------------------------------------------------------------------
# The real kubernetes client over HTTP


def test_real_client_sends_a_dict_as_strategic_merge_unless_told(
    api_server: ApiServerStandIn, core_v1: Any
) -> None:
    # kubernetes 36.x picks the first PATCH content type, json-patch, and its REST layer turns
    # that into strategic-merge-patch for a non-list body; `_content_type=` forces merge patch.
    api_server.put_node(gpu_node("gpu-node-1"))
    body = {"metadata": {"annotations": {"gpu-scheduler.example.com/utilization": "0.3"}}}
    core_v1.patch_node("gpu-node-1", body, field_manager="gpu-scheduler-agent")
    core_v1.patch_node("gpu-node-1", body, field_manager="gpu-scheduler-agent", _content_type=MERGE)
    sent = [r.headers["content-type"] for r in api_server.requests if r.method == "PATCH"]
    assert sent == ["application/strategic-merge-patch+json", MERGE]
    assert api_server.requests[-1].param("fieldManager") == "gpu-scheduler-agent"
    assert api_server.requests[-1].headers["Authorization"] == "Bearer test-token"


def test_real_client_merge_patch_round_trip(
    frozen_api_server: ApiServerStandIn, api_clock: ManualClock, tmp_path: Any
) -> None:
    from kubernetes import client, config  # noqa: PLC0415

    srv = frozen_api_server
    srv.put_node(gpu_node("gpu-node-1"))
    configuration = client.Configuration()
    config.load_kube_config(
        config_file=str(srv.write_kubeconfig(tmp_path / "kc")), client_configuration=configuration
    )
    with client.ApiClient(configuration) as api_client:
        v1 = client.CoreV1Api(api_client)
        body = {"metadata": {"annotations": {"gpu-scheduler.example.com/utilization": "0.3"}}}
        node = v1.patch_node(
            "gpu-node-1", body, field_manager="gpu-scheduler-agent", _content_type=MERGE
        )
    assert node.metadata.annotations["gpu-scheduler.example.com/utilization"] == "0.3"
    agent = [m for m in node.metadata.managed_fields if m.manager == "gpu-scheduler-agent"]
    assert agent[0].time == api_clock()
    assert (
        srv.node("gpu-node-1")["metadata"]["annotations"]["gpu-scheduler.example.com/utilization"]
        == "0.3"
    )


@pytest.mark.parametrize(
    ("name", "body", "status", "reason"),
    [
        pytest.param(
            "missing",
            {"metadata": {"annotations": {"a/b": "1"}}},
            404,
            "NotFound",
            id="404-no-node",
        ),
        pytest.param(
            "gpu-node-1",
            {"metadata": {"resourceVersion": "1", "annotations": {"a/b": "1"}}},
            409,
            "Conflict",
            id="409-stale-rv",
        ),
        pytest.param(
            "gpu-node-1",
            {"metadata": {"annotations": {"bad key": "1"}}},
            422,
            "Invalid",
            id="422-bad-key",
        ),
        pytest.param(
            "gpu-node-1",
            {"metadata": {"annotations": {"a/b": 1}}},
            422,
            "Invalid",
            id="422-number-value",
        ),
    ],
)
def test_real_client_sees_api_errors(
    api_server: ApiServerStandIn,
    core_v1: Any,
    *,
    name: str,
    body: dict[str, Any],
    status: int,
    reason: str,
) -> None:
    api_server.put_node(gpu_node("gpu-node-1"))
    with pytest.raises(ApiException) as err:
        core_v1.patch_node(name, body, field_manager="gpu-scheduler-agent", _content_type=MERGE)
    assert err.value.status == status
    assert json.loads(err.value.body)["reason"] == reason
    assert api_server.node_writes("gpu-node-1") == 0


# ---------------------------------------------------------------------------------------------
# Faults


@pytest.mark.parametrize(
    ("status", "reason", "content_type"),
    [
        pytest.param(401, "Unauthorized", "application/json", id="401"),
        pytest.param(403, "Forbidden", "application/json", id="403"),
        pytest.param(404, "NotFound", "application/json", id="404"),
        pytest.param(409, "Conflict", "application/json", id="409"),
        pytest.param(422, "Invalid", "application/json", id="422"),
        pytest.param(429, None, "text/plain; charset=utf-8", id="429-apf-plain-text"),
        pytest.param(500, "InternalError", "application/json", id="500"),
        pytest.param(503, "ServiceUnavailable", "application/json", id="503"),
        pytest.param(504, "Timeout", "application/json", id="504"),
    ],
)
def test_status_faults_answer_like_the_real_server(
    api_server: ApiServerStandIn, status: int, reason: str | None, content_type: str
) -> None:
    api_server.put_node(gpu_node("gpu-node-1"))
    api_server.inject(Fault(status, retry_after_s=3 if status == 429 else None))
    got = request(api_server.url, "PATCH", AGENT, body="{}", content_type=MERGE)
    assert got.status == status
    assert got.header("Content-Type") == content_type
    if reason is not None:
        assert got.json()["reason"] == reason
        assert got.json()["code"] == status
    else:
        assert got.body == b"Too many requests, please try again later.\n"
        assert got.header("Retry-After") == "3"
    assert (got.header(PF_HEADERS[0]) is None) is (status == 401)
    assert (got.header("X-Content-Type-Options") == "nosniff") is (status in (403, 429))
    assert api_server.requests[-1].status == status
    again = request(api_server.url, "PATCH", AGENT, body="{}", content_type=MERGE)
    assert again.status == 200, "a fault is consumed"


def test_faults_match_method_and_path_and_count_down(api_server: ApiServerStandIn) -> None:
    api_server.put_node(gpu_node("gpu-node-1"))
    api_server.put_node(gpu_node("gpu-node-2"))
    api_server.inject(Fault(503, times=2, path_contains="gpu-node-2"))
    api_server.inject(Fault(500, method=None))
    node2 = "/api/v1/nodes/gpu-node-2?fieldManager=x"
    statuses = [
        request(api_server.url, "GET", "/api/v1/nodes/gpu-node-2").status,  # any method: the 500
        request(api_server.url, "PATCH", AGENT, body="{}", content_type=MERGE).status,
        request(api_server.url, "PATCH", node2, body="{}", content_type=MERGE).status,
        request(api_server.url, "PATCH", node2, body="{}", content_type=MERGE).status,
        request(api_server.url, "PATCH", node2, body="{}", content_type=MERGE).status,
    ]
    assert statuses == [500, 200, 503, 503, 200]


def test_real_client_reads_retry_after_from_a_429(
    api_server: ApiServerStandIn, core_v1: Any
) -> None:
    api_server.put_node(gpu_node("gpu-node-1"))
    api_server.inject(Fault(429, retry_after_s=7))
    with pytest.raises(ApiException) as err:
        core_v1.patch_node("gpu-node-1", {}, field_manager="a", _content_type=MERGE)
    assert err.value.status == 429
    assert err.value.headers["Retry-After"] == "7"


def test_reset_fault_drops_the_connection_and_the_server_lives_on(
    api_server: ApiServerStandIn, core_v1: Any
) -> None:
    api_server.put_node(gpu_node("gpu-node-1"))
    api_server.inject(Fault(reset=True))
    with pytest.raises(urllib3.exceptions.HTTPError):
        core_v1.patch_node("gpu-node-1", {}, field_manager="a", _content_type=MERGE)
    assert api_server.requests[-1].status == 0
    assert core_v1.read_node("gpu-node-1").metadata.name == "gpu-node-1"


def test_delay_fault_trips_the_client_timeout(api_server: ApiServerStandIn, core_v1: Any) -> None:
    api_server.put_node(gpu_node("gpu-node-1"))
    api_server.inject(Fault(delay_s=1.0))
    started = time.monotonic()
    with pytest.raises(urllib3.exceptions.HTTPError):
        core_v1.patch_node(
            "gpu-node-1", {}, field_manager="a", _content_type=MERGE, _request_timeout=0.2
        )
    assert time.monotonic() - started < 1.0


# ---------------------------------------------------------------------------------------------
# Auth


@pytest.mark.parametrize(
    ("token", "path", "status", "captured"),
    [
        pytest.param(
            "nope", AGENT, 401, "41-err-401-invalid-bearer-token.json", id="bad-token-401"
        ),
        pytest.param(
            None, AGENT, 403, "40-err-403-anonymous-no-credentials.json", id="anonymous-403"
        ),
        pytest.param(None, "/version", 200, None, id="anonymous-may-read-version"),
    ],
)
def test_auth_answers(
    api_server: ApiServerStandIn, token: str | None, path: str, status: int, captured: str | None
) -> None:
    api_server.put_node(gpu_node("gpu-node-1"))
    got = request(
        api_server.url,
        "PATCH" if path == AGENT else "GET",
        path,
        body="{}" if path == AGENT else None,
        content_type=MERGE,
        token=token,
    )
    assert got.status == status
    if captured is not None:
        want = fixture(captured)["response"]
        assert got.body.decode() == want["body"]
        assert framing(got.header_names) == framing([k for k, _ in want["headers"]])
    else:
        assert got.json()["gitVersion"] == "v1.36.2"
    assert api_server.node_writes("gpu-node-1") == 0


# ---------------------------------------------------------------------------------------------
# LIST


def test_list_pages_with_a_continue_token_shaped_like_the_real_one(
    api_server: ApiServerStandIn,
) -> None:
    for name in ("gpu-node-3", "gpu-node-1", "gpu-node-2"):
        api_server.put_node(gpu_node(name))
    first = request(api_server.url, "GET", "/api/v1/nodes?limit=2").json()
    assert [i["metadata"]["name"] for i in first["items"]] == ["gpu-node-1", "gpu-node-2"]
    assert "kind" not in first["items"][0]
    assert first["metadata"]["remainingItemCount"] == 1
    token = first["metadata"]["continue"]
    want_shape = fixture("61-list-nodes-limit1.json")["response"]["body_json"]["metadata"]
    assert sorted(first["metadata"]) == sorted(want_shape)
    decoded = json.loads(__import__("base64").urlsafe_b64decode(token + "=" * (-len(token) % 4)))
    assert decoded == {
        "v": "meta.k8s.io/v1",
        "rv": api_server.resource_version,
        "start": "/gpu-node-2\x00",
    }
    api_server.delete_node("gpu-node-3")  # the continuation still sees the list's snapshot
    rest = request(api_server.url, "GET", f"/api/v1/nodes?limit=2&continue={token}").json()
    assert [i["metadata"]["name"] for i in rest["items"]] == ["gpu-node-3"]
    assert rest["metadata"] == {"resourceVersion": first["metadata"]["resourceVersion"]}


def test_exact_list_serves_old_snapshots_until_they_expire(api_server: ApiServerStandIn) -> None:
    api_server.put_node(gpu_node("gpu-node-1", annotations={"x.example.com/v": "old"}))
    old_rv = api_server.resource_version
    api_server.put_node(gpu_node("gpu-node-1", annotations={"x.example.com/v": "new"}))
    path = f"/api/v1/nodes?resourceVersion={old_rv}&resourceVersionMatch=Exact"
    old = request(api_server.url, "GET", path).json()
    assert old["metadata"]["resourceVersion"] == str(old_rv)
    assert old["items"][0]["metadata"]["annotations"]["x.example.com/v"] == "old"
    api_server.expire_watches()
    gone = request(api_server.url, "GET", path)
    assert gone.status == 410
    assert gone.body.decode() == fixture("69-list-exact-rv1.json")["response"]["body"]


@pytest.mark.parametrize(
    ("query", "names"),
    [
        pytest.param("fieldSelector=metadata.name%3Dgpu-b", ["gpu-b"], id="field-name"),
        pytest.param("fieldSelector=metadata.name!%3Dgpu-b", ["gpu-a", "gpu-c"], id="field-not"),
        pytest.param("labelSelector=pool%3Dtrain", ["gpu-a", "gpu-c"], id="label-equals"),
        pytest.param("labelSelector=pool+in+(serve)", ["gpu-b"], id="label-in"),
        pytest.param("labelSelector=!pool", [], id="label-absent"),
    ],
)
def test_list_selectors(api_server: ApiServerStandIn, query: str, names: list[str]) -> None:
    for name, pool in (("gpu-a", "train"), ("gpu-b", "serve"), ("gpu-c", "train")):
        api_server.put_node(gpu_node(name, labels={"pool": pool}))
    got = request(api_server.url, "GET", f"/api/v1/nodes?{query}").json()
    assert [i["metadata"]["name"] for i in got["items"]] == names


# ---------------------------------------------------------------------------------------------
# Store surface and robustness


def test_put_node_assigns_identity_and_returns_copies(api_server: ApiServerStandIn) -> None:
    stored = api_server.put_node({"metadata": {"name": "bare"}})
    meta = stored["metadata"]
    assert meta["uid"]
    assert meta["creationTimestamp"]
    assert meta["resourceVersion"] == str(api_server.resource_version)
    copy_ = api_server.node("bare")
    copy_["metadata"]["name"] = "changed"
    assert api_server.node("bare")["metadata"]["name"] == "bare"
    assert [n["metadata"]["name"] for n in api_server.nodes()] == ["bare"]
    api_server.delete_node("bare")
    with pytest.raises(KeyError):
        api_server.node("bare")
    with pytest.raises(KeyError):
        api_server.delete_node("bare")


def test_create_and_delete_over_http(api_server: ApiServerStandIn) -> None:
    body = json.dumps({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "gpu-node-2"}})
    created = request(
        api_server.url, "POST", "/api/v1/nodes", body=body, content_type="application/json"
    )
    assert created.status == 201
    again = request(
        api_server.url, "POST", "/api/v1/nodes", body=body, content_type="application/json"
    )
    assert (again.status, again.json()["reason"]) == (409, "AlreadyExists")
    deleted = request(api_server.url, "DELETE", "/api/v1/nodes/gpu-node-2")
    want = fixture("54-delete-node.json")["response"]["body_json"]
    assert deleted.json()["details"]["uid"] == created.json()["metadata"]["uid"]
    assert sorted(deleted.json()) == sorted(want)
    assert deleted.json()["status"] == "Success"


@pytest.mark.parametrize(
    "payload",
    [
        pytest.param(b"GARBAGE\r\n\r\n", id="bad-request-line"),
        pytest.param(
            b"PATCH /api/v1/nodes/x HTTP/1.1\r\nContent-Length: 100\r\n\r\n{", id="short-body"
        ),
        pytest.param(b"GET /api/v1/nodes?limit=zz HTTP/1.1\r\nHost: x\r\n\r\n", id="bad-limit"),
        pytest.param(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03", id="tls-hello"),
    ],
)
def test_broken_clients_do_not_hurt_the_server(
    api_server: ApiServerStandIn, payload: bytes
) -> None:
    host, port = api_server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=2) as sock:
        sock.sendall(payload)
        sock.shutdown(socket.SHUT_WR)
        answer = drain(sock)  # the server answers or hangs up; either way it lives on
    assert answer == b"" or answer.startswith(b"HTTP/1.")
    assert request(api_server.url, "GET", "/version").status == 200


def drain(sock: socket.socket) -> bytes:
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except ConnectionResetError:
        pass
    return data


def test_version_is_the_captured_server(api_server: ApiServerStandIn) -> None:
    conn = http.client.HTTPConnection(api_server.url.removeprefix("http://"), timeout=2)
    conn.request("GET", "/version", headers={"Authorization": "Bearer test-token"})
    response = conn.getresponse()
    body = json.loads(response.read())
    conn.close()
    assert (body["gitVersion"], body["emulationMinor"], body["minCompatibilityMinor"]) == (
        "v1.36.2",
        "36",
        "35",
    )


def test_put_node_replacing_identical_content_is_a_noop(api_server: ApiServerStandIn) -> None:
    api_server.put_node(gpu_node("gpu-node-1"))
    rv = api_server.resource_version
    api_server.put_node(gpu_node("gpu-node-1"))
    assert api_server.resource_version == rv


def test_clock_drives_managed_fields_time(
    frozen_api_server: ApiServerStandIn, api_clock: ManualClock
) -> None:
    frozen_api_server.put_node(gpu_node("gpu-node-1"))
    api_clock.advance(timedelta(hours=1).total_seconds() + 0.9)  # sub-second part is dropped
    body = json.dumps({"metadata": {"annotations": {"gpu-scheduler.example.com/x": "1"}}})
    node = request(frozen_api_server.url, "PATCH", AGENT, body=body, content_type=MERGE).json()
    agent = next(
        e for e in node["metadata"]["managedFields"] if e["manager"] == "gpu-scheduler-agent"
    )
    assert agent["time"] == "2026-11-30T15:19:24Z"
