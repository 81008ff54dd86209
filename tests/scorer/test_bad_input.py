"""Every kind of bad input gets a defined answer: 400/404/405/413 with a JSON body, never a 500."""

from __future__ import annotations

import http.client
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from exporter_scheduler.core import judge
from exporter_scheduler.core.policy import Policy
from exporter_scheduler.serving import verdicts
from exporter_scheduler.serving.metrics import ERROR_VERBS
from tests.scorer._http_helpers import (
    args_body,
    call,
    check_filter_reply,
    check_prioritize_reply,
    connect,
    gpu_annotations,
    make_app,
    node,
    pod,
    serving,
    store_of,
)

PREFIX = "gpu-scheduler.example.com/"


def _nodes_body(items: Any) -> bytes:
    return json.dumps({"Pod": pod(), "Nodes": {"items": items}, "NodeNames": None}).encode()


@pytest.mark.parametrize(
    ("body", "cause"),
    [
        pytest.param(b"{", "malformed_json", id="truncated"),
        pytest.param(b"", "malformed_json", id="empty-body"),
        pytest.param(b"not json", "malformed_json", id="not-json"),
        pytest.param(b'{"Pod": {}, "NodeNames": []} trailing', "malformed_json", id="trailing"),
        pytest.param(b"[]", "wrong_type", id="top-level-array"),
        pytest.param(b'"Pod"', "wrong_type", id="top-level-string"),
        pytest.param(b'{"Pod": 1, "NodeNames": []}', "wrong_type", id="pod-not-object"),
        pytest.param(b'{"Pod": {}, "NodeNames": "a"}', "wrong_type", id="names-not-list"),
        pytest.param(b'{"Pod": {}, "NodeNames": [1]}', "wrong_type", id="name-not-string"),
        pytest.param(b'{"Pod": {}, "Nodes": {"items": {}}}', "wrong_type", id="items-not-list"),
        pytest.param(
            b'{"Pod": {"metadata": {"annotations": {"a": 1}}}, "NodeNames": []}',
            "wrong_type",
            id="pod-annotation-not-string",
        ),
        pytest.param(b'{"Nodes": null, "NodeNames": ["a"]}', "missing_pod", id="no-pod"),
        pytest.param(
            b'{"Pod": null, "Nodes": null, "NodeNames": []}', "missing_pod", id="pod-null"
        ),
        pytest.param(b"{}", "missing_pod", id="empty-object"),
        pytest.param(b'{"pod": null, "nodeNames": []}', "missing_pod", id="pod-null-any-case"),
        pytest.param(_nodes_body([{"metadata": {}}]), "bad_node", id="node-without-name"),
        pytest.param(_nodes_body([{}]), "bad_node", id="node-without-metadata"),
        pytest.param(_nodes_body([1]), "wrong_type", id="node-not-object"),
        pytest.param(
            _nodes_body(
                [{"metadata": {"name": "a", "annotations": {PREFIX + "utilization": 0.4}}}]
            ),
            "wrong_type",
            id="node-annotation-not-string",
        ),
        pytest.param(args_body(pod(gpus="1.5"), []), "bad_quantity", id="fractional-gpus"),
    ],
)
@pytest.mark.parametrize("verb", ["filter", "prioritize", "explain"])
def test_bad_request_is_400_with_error_body(body: bytes, cause: str, verb: Any) -> None:
    app = make_app()
    response = app.handle(verb, body)
    assert response.status == 400
    reply = json.loads(response.body)
    assert reply["Error"]
    if verb == "filter":
        assert reply["Nodes"] is None
        assert reply["NodeNames"] is None
    metrics = app.metrics.render()[0].decode()
    assert f'gpu_scorer_rejected_requests_total{{cause="{cause}"}} 1.0' in metrics


def test_names_request_without_node_cache_is_400() -> None:
    response = make_app().handle("filter", args_body(pod(), names=["a"]))
    assert response.status == 400
    assert "--node-cache" in json.loads(response.body)["Error"]


@pytest.mark.parametrize(
    ("body", "form"),
    [
        pytest.param(args_body(pod(), []), "nodes", id="empty-items"),
        pytest.param(_nodes_body(None), "nodes", id="null-items"),
        pytest.param(args_body(pod(), names=[]), "names", id="empty-names"),
    ],
)
def test_empty_node_list_gets_a_valid_empty_reply(body: bytes, form: str) -> None:
    app = make_app(node_store=store_of([]))
    filtered = app.handle("filter", body)
    assert filtered.status == 200
    assert check_filter_reply(json.loads(filtered.body), given=[], form=form) == []
    prioritized = app.handle("prioritize", body)
    assert (prioritized.status, prioritized.body) == (200, b"[]")


@pytest.mark.parametrize(
    ("annotations", "data_status"),
    [
        pytest.param({PREFIX + "utilization": "NaN"}, "invalid", id="nan"),
        pytest.param({PREFIX + "utilization": "inf"}, "invalid", id="inf"),
        pytest.param({PREFIX + "utilization": "-0.2"}, "invalid", id="negative"),
        pytest.param({PREFIX + "utilization": "1.5"}, "invalid", id="above-one"),
        pytest.param({PREFIX + "utilization": "busy"}, "invalid", id="unparsable"),
        pytest.param({PREFIX + "schema-version": "2"}, "missing", id="unknown-schema-version"),
        pytest.param({PREFIX + "updated-at": "yesterday"}, "invalid", id="bad-timestamp"),
    ],
)
@pytest.mark.parametrize("missing_data", ["lenient", "strict"])
def test_bad_annotation_values_follow_the_missing_data_policy(
    annotations: dict[str, str], data_status: str, missing_data: Any
) -> None:
    values = {**gpu_annotations(), **annotations}
    app = make_app(policy=Policy(missing_data=missing_data))
    response = app.handle(
        "filter", args_body(pod(), [node("bad", values), node("ok", gpu_annotations())])
    )
    assert response.status == 200
    reply = json.loads(response.body)
    passed = check_filter_reply(reply, given=["bad", "ok"], form="nodes")
    if missing_data == "lenient":
        assert "bad" in passed
    else:
        assert "bad" in reply["FailedAndUnresolvableNodes"]
    metrics = app.metrics.render()[0].decode()
    assert f'gpu_scorer_node_data_total{{status="{data_status}"}} 1.0' in metrics


@pytest.mark.parametrize("verb", ["filter", "prioritize", "explain"])
def test_an_internal_error_is_never_a_500(verb: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    def explode(*args: object) -> None:
        raise RuntimeError("bug")

    # Every verdict, in both modes and in explanations, comes from `judge_node`.
    monkeypatch.setattr(judge, "judge_node", explode)
    monkeypatch.setattr(verdicts, "judge_node", explode)
    app = make_app()
    response = app.handle(verb, args_body(pod(), [node("a"), node("b")]))
    assert response.status == 200
    reply = json.loads(response.body)
    if verb == "filter":
        assert reply["Error"] == "gpu scorer internal error: RuntimeError"
        assert reply["Nodes"] == {"items": []}
    elif verb == "prioritize":
        assert reply == [{"Host": "a", "Score": 0}, {"Host": "b", "Score": 0}]
    else:
        assert reply["Error"]
    assert f'gpu_scorer_internal_errors_total{{verb="{verb}"}} 1.0' in (
        app.metrics.render()[0].decode()
    )


def test_http_errors_and_the_server_keeps_serving() -> None:
    good = args_body(pod(), [node("a", gpu_annotations())])
    with serving(make_app(max_body_bytes=4096)) as server:
        conn = connect(server)
        status, _, data = call(conn, "POST", "/filter", b'{"Pod": ')
        assert (status, bool(json.loads(data)["Error"])) == (400, True)
        status, _, data = call(conn, "GET", "/nope")
        assert (status, bool(json.loads(data)["Error"])) == (404, True)
        status, headers, _ = call(conn, "GET", "/filter")
        assert (status, headers["allow"]) == (405, "POST")
        status, headers, _ = call(conn, "POST", "/healthz")
        assert (status, headers["allow"]) == (405, "GET, HEAD")
        # Still serving on the same connection.
        assert call(conn, "POST", "/filter", good)[0] == 200
        # Over the limit, announced by Content-Length.
        status, _, data = call(conn, "POST", "/filter", b" " * 5000)
        assert status == 413
        assert "4096" in json.loads(data)["Error"]
        conn.close()

        # Over the limit with no Content-Length (chunked): cut off while reading.
        chunked = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
        chunked.putrequest("POST", "/filter")
        chunked.putheader("Transfer-Encoding", "chunked")
        chunked.endheaders()
        for _ in range(3):
            chunked.send(b"800\r\n" + b" " * 0x800 + b"\r\n")
        chunked.send(b"0\r\n\r\n")
        assert chunked.getresponse().status == 413
        chunked.close()

        conn = connect(server)
        assert call(conn, "POST", "/filter", good)[0] == 200
        conn.close()


# ----------------------------------------------------------------------------- fuzz

_json_leaf = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8)
_json = st.recursive(
    _json_leaf,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=12,
)
_key = st.sampled_from(["Pod", "pod", "Nodes", "nodes", "NodeNames", "nodeNames", "items", "x"])
_annotation_values = st.sampled_from(
    ["0.5", "NaN", "-1", "1e9", "", "0.90", "2026-11-30T13:59:55Z", "1", "ok", "unavailable"]
) | st.text(max_size=10)
_fields = st.sampled_from(
    ["utilization", "temperature", "updated-at", "schema-version", "health", "gpu-model",
     "memory-largest-free-mib", "min-gpu-memory-mib", "gpu-model-preference", "max-utilization"]
)  # fmt: skip
_annotations = st.dictionaries(_fields.map(lambda f: PREFIX + f), _annotation_values, max_size=6)


@st.composite
def _plausible_bodies(draw: st.DrawFn) -> bytes:
    """Mostly well-formed ExtenderArgs with hostile pieces: types, annotations, keys."""
    names = draw(st.lists(st.text(min_size=1, max_size=5), max_size=4, unique=True))
    nodes = [
        {"metadata": {"name": n, "annotations": draw(_annotations)}, "status": draw(_json)}
        for n in names
    ]
    document: dict[str, Any] = {
        "Pod": {
            "metadata": {"name": "p", "annotations": draw(_annotations)},
            "spec": {"containers": [{"resources": {"requests": {"nvidia.com/gpu": draw(_json)}}}]},
        },
        "Nodes": {"items": nodes},
    }
    for _ in range(draw(st.integers(0, 2))):
        document[draw(_key)] = draw(_json)
    return json.dumps(document).encode()


_bodies = (
    st.binary(max_size=64)
    | _json.map(lambda v: json.dumps(v).encode())
    | st.dictionaries(_key, _json, max_size=4).map(lambda v: json.dumps(v).encode())
    | _plausible_bodies()
)


_INTERNAL_ERRORS = "gpu_scorer_internal_errors_total"


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=_bodies, verb=st.sampled_from(["filter", "prioritize", "explain"]))
def test_fuzzed_requests_always_get_a_defined_valid_reply(body: bytes, verb: Any) -> None:
    app = make_app()
    response = app.handle(verb, body)  # no exception may escape
    assert response.status in (200, 400)
    reply = json.loads(response.body)
    registry = app.metrics.registry
    errors = [registry.get_sample_value(_INTERNAL_ERRORS, {"verb": v}) for v in ERROR_VERBS]
    assert errors == [0.0] * len(ERROR_VERBS)
    if response.status == 400:
        assert reply["Error"]
        return
    request = json.loads(body)
    # The exact key wins over another casing, as in the decoder.
    nodes = request.get(
        "Nodes", next((v for k, v in request.items() if k.lower() == "nodes"), None)
    )
    items = (nodes.get("items") if isinstance(nodes, dict) else None) or []
    given_names = [item["metadata"]["name"] for item in items]
    if verb == "filter":
        check_filter_reply(reply, given=given_names, form="nodes" if items else reply_form(reply))
    elif verb == "prioritize":
        check_prioritize_reply(reply, given=given_names)


def reply_form(reply: dict[str, Any]) -> str:
    if reply["Nodes"] is None:
        return "names"
    return "nodes" if reply["NodeNames"] is None else "none"
