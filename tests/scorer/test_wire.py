"""The extender wire format: typed decoding, key casing, quantities, byte-exact replies."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import msgspec
import pytest

from exporter_scheduler.serving import wire
from gpu_contract.schema import DEFAULT_KEYS
from tests.scorer._http_helpers import FIXTURES, args_body, gpu_annotations, node, pod

GPU = "nvidia.com/gpu"


def test_real_request_decodes_with_raw_nodes_kept_verbatim() -> None:
    body = (FIXTURES / "nodecache-false" / "0001-filter.request.json").read_bytes()
    request = wire.decode_args(body, gpu_resource_name=GPU)
    assert request.form == "nodes"
    assert (request.pod.namespace, request.pod.name, request.pod.gpu_request) == (
        "default",
        "gpu-pod-1",
        1,
    )
    assert [n.name for n in request.nodes] == ["node-cool", "node-t4", "node-warm", "node-hot"]
    assert request.nodes[3].annotations["gpu-scheduler.example.com/utilization"] == "0.95"
    # The captured nodes were written by kubectl, not the agent's field manager.
    assert all(n.agent_write_time is None for n in request.nodes)
    items = json.loads(body)["Nodes"]["items"]
    for raw, item in zip(request.raw_nodes, request.nodes, strict=True):
        assert bytes(raw) in body
        assert json.loads(bytes(raw)) == next(
            i for i in items if i["metadata"]["name"] == item.name
        )


def test_names_request_decodes() -> None:
    body = (FIXTURES / "nodecache-true" / "0001-filter.request.json").read_bytes()
    request = wire.decode_args(body, gpu_resource_name=GPU)
    assert request.form == "names"
    assert request.node_names == ("node-cool", "node-hot", "node-t4", "node-warm")
    assert request.nodes == ()


@pytest.mark.parametrize(
    ("keys", "form"),
    [
        pytest.param(("Pod", "Nodes", "NodeNames"), "nodes", id="as-the-scheduler-sends"),
        pytest.param(("pod", "nodes", "nodeNames"), "nodes", id="lower-camel"),
        pytest.param(("POD", "NODES", "NODENAMES"), "nodes", id="upper"),
        pytest.param(("Pod", "nodes", "NodeNames"), "nodes", id="mixed"),
    ],
)
def test_request_keys_in_any_casing(keys: tuple[str, str, str], form: str) -> None:
    pod_key, nodes_key, names_key = keys
    body = json.dumps(
        {
            pod_key: pod(),
            nodes_key: {"items": [node("a", gpu_annotations())]},
            names_key: None,
        }
    ).encode()
    request = wire.decode_args(body, gpu_resource_name=GPU)
    assert request.form == form
    assert [n.name for n in request.nodes] == ["a"]
    assert request.pod.gpu_request == 1


def test_names_in_lower_case_are_read() -> None:
    body = json.dumps({"pod": pod(), "nodes": None, "nodenames": ["x", "y"]}).encode()
    request = wire.decode_args(body, gpu_resource_name=GPU)
    assert request.form == "names"
    assert request.node_names == ("x", "y")


def test_exact_key_wins_over_other_casing() -> None:
    body = json.dumps(
        {"pod": pod(name="lower"), "Pod": pod(name="exact"), "nodenames": ["x"]}
    ).encode()
    assert wire.decode_args(body, gpu_resource_name=GPU).pod.name == "exact"


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        pytest.param("1", 1, id="string"),
        pytest.param(2, 2, id="int"),
        pytest.param("4.0", 4, id="whole-float-string"),
        pytest.param(" 3 ", 3, id="spaces"),
        pytest.param("0", 0, id="zero"),
        pytest.param("1e1", 10, id="exponent"),
        pytest.param("0008", 8, id="leading-zeros"),
        pytest.param("2147483648", 2**31, id="largest"),
        pytest.param("\u0663", 3, id="non-ascii-digit"),
    ],
)
def test_gpu_quantity(value: str | int, expected: int) -> None:
    assert wire.parse_gpu_quantity(value, resource=GPU) == expected


@pytest.mark.parametrize(
    "value",
    [
        pytest.param("1.5", id="fraction"),
        pytest.param("two", id="word"),
        pytest.param("1k", id="suffix"),
        pytest.param(-1, id="negative"),
        pytest.param(True, id="bool"),
        pytest.param("nan", id="nan"),
        pytest.param("inf", id="inf"),
        pytest.param(1e12, id="huge"),
        pytest.param("2147483649", id="huge-digits"),
        pytest.param("\u00b2", id="superscript-digit"),
        pytest.param("", id="empty"),
    ],
)
def test_bad_gpu_quantity_is_a_wire_error(value: Any) -> None:
    with pytest.raises(wire.WireError) as caught:
        wire.parse_gpu_quantity(value, resource=GPU)
    assert caught.value.cause == "bad_quantity"


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        pytest.param({"containers": [{"name": "a"}]}, 0, id="no-resources"),
        pytest.param({"containers": [{"resources": {"limits": {GPU: "2"}}}]}, 2, id="limits-only"),
        pytest.param(
            {
                "containers": [
                    {"resources": {"requests": {GPU: "1"}}},
                    {"resources": {"requests": {GPU: "2"}}},
                ]
            },
            3,
            id="containers-sum",
        ),
        pytest.param(
            {
                "containers": [{"resources": {"requests": {GPU: "1"}}}],
                "initContainers": [{"resources": {"requests": {GPU: "4"}}}],
            },
            4,
            id="init-container-larger",
        ),
        pytest.param(
            {"containers": [{"resources": {"requests": {"cpu": "1"}}}]}, 0, id="other-resource"
        ),
    ],
)
def test_pod_gpu_request(spec: dict[str, Any], expected: int) -> None:
    body = json.dumps({"Pod": {"metadata": {"name": "p"}, "spec": spec}, "NodeNames": []})
    assert wire.decode_args(body.encode(), gpu_resource_name=GPU).pod.gpu_request == expected


def test_agent_write_time_is_the_newest_entry_of_the_agent() -> None:
    doc = node("a", agent_time=datetime(2026, 11, 30, 13, 59, 0, tzinfo=UTC))
    doc["metadata"]["managedFields"] += [
        {"manager": "gpu-scheduler-agent", "operation": "Apply", "time": "2026-11-30T13:59:30Z"},
        {"manager": "gpu-scheduler-agent", "time": "not a time"},
        {"manager": "someone-else", "time": "2026-11-30T14:30:00Z"},
    ]
    parsed = wire.node_input_from_json(json.dumps(doc).encode())
    assert parsed.agent_write_time == datetime(2026, 11, 30, 13, 59, 30, tzinfo=UTC)


def test_nodes_items_null_is_an_empty_list() -> None:
    # Go encodes a nil slice as null.
    body = json.dumps({"Pod": pod(), "Nodes": {"metadata": {}, "items": None}}).encode()
    request = wire.decode_args(body, gpu_resource_name=GPU)
    assert (request.form, request.nodes) == ("nodes", ())


def test_neither_list_is_form_none_and_answered_empty_in_both_forms() -> None:
    body = json.dumps({"Pod": pod(), "Nodes": None, "NodeNames": None}).encode()
    request = wire.decode_args(body, gpu_resource_name=GPU)
    assert request.form == "none"
    reply = json.loads(wire.encode_filter_reply(request, passed=(), failed={}, unresolvable={}))
    assert reply["Nodes"] == {"items": []}
    assert reply["NodeNames"] == []


def test_filter_reply_echoes_passing_nodes_byte_for_byte() -> None:
    docs = [node(n, gpu_annotations()) for n in ("a", "b", "c")]
    body = args_body(pod(), docs)
    request = wire.decode_args(body, gpu_resource_name=GPU)
    reply = wire.encode_filter_reply(
        request,
        passed=["c", "a"],
        failed={"b": "gpu utilization above 0.90"},
        unresolvable={},
    )
    parsed = json.loads(reply)
    # Request order, not the order of `passed`.
    assert [i["metadata"]["name"] for i in parsed["Nodes"]["items"]] == ["a", "c"]
    assert bytes(request.raw_nodes[0]) + b"," + bytes(request.raw_nodes[2]) in reply
    assert parsed["NodeNames"] is None
    assert parsed["FailedNodes"] == {"b": "gpu utilization above 0.90"}
    assert parsed["Error"] == ""


def test_filter_reply_names_form_and_sorted_maps() -> None:
    body = json.dumps({"Pod": pod(), "NodeNames": ["z", "y", "x", "w"]}).encode()
    request = wire.decode_args(body, gpu_resource_name=GPU)
    reply = wire.encode_filter_reply(
        request, passed={"x", "z"}, failed={"y": "r1", "w": "r2"}, unresolvable={}
    )
    assert reply == (
        b'{"Nodes":null,"NodeNames":["z","x"],"FailedNodes":{"w":"r2","y":"r1"},'
        b'"FailedAndUnresolvableNodes":{},"Error":""}'
    )


def test_prioritize_reply() -> None:
    assert wire.encode_prioritize_reply([("b", 7), ("a", 0)]) == (
        b'[{"Host":"b","Score":7},{"Host":"a","Score":0}]'
    )
    assert wire.encode_prioritize_reply([]) == b"[]"


def test_filter_error_reply_without_a_request() -> None:
    reply = json.loads(wire.encode_filter_error(None, "boom"))
    assert reply == {
        "Nodes": None,
        "NodeNames": None,
        "FailedNodes": {},
        "FailedAndUnresolvableNodes": {},
        "Error": "boom",
    }


def test_decode_paths_name_the_bad_node() -> None:
    doc = node("a")
    doc["metadata"]["annotations"] = {"gpu-scheduler.example.com/utilization": 1}
    body = json.dumps({"Pod": pod(), "Nodes": {"items": [node("ok"), doc]}}).encode()
    with pytest.raises(wire.WireError) as caught:
        wire.decode_args(body, gpu_resource_name=GPU)
    assert caught.value.cause == "wrong_type"
    assert "$.Nodes.items[1]" in str(caught.value)


@pytest.mark.parametrize("typed", [False, True], ids=["as-the-scheduler-sends", "with-typemeta"])
def test_nodes_written_as_go_does_are_found_in_the_body(typed: bool) -> None:
    """Go's compact layout: each Node's bytes are a slice of the body (no second parse)."""
    docs = [node(n, gpu_annotations()) for n in ("a", "b", "c")]
    if typed:
        docs = [{"kind": "Node", "apiVersion": "v1", **d} for d in docs]
    document = {"Pod": pod(), "Nodes": {"metadata": {}, "items": docs}, "NodeNames": None}
    body = json.dumps(document, separators=(",", ":")).encode()
    request = wire.decode_args(body, gpu_resource_name=GPU)
    assert all(isinstance(raw, memoryview) for raw in request.raw_nodes)
    assert [json.loads(bytes(raw)) for raw in request.raw_nodes] == docs
    reply = wire.encode_filter_reply(request, passed=["a", "c"], failed={"b": "x"}, unresolvable={})
    assert reply.startswith(
        b'{"Nodes":{"items":['
        + bytes(request.raw_nodes[0])
        + b","
        + bytes(request.raw_nodes[2])
        + b"]}"
    )


@pytest.mark.parametrize(
    "tamper",
    [
        pytest.param(lambda b: b.replace(b'"NodeNames":null}', b'"NodeNames":null }'), id="end"),
        pytest.param(lambda b: b.replace(b'},{"metadata"', b'}, {"metadata"'), id="spacing"),
        pytest.param(
            lambda b: b.replace(b'{"metadata":{"name":"b"', b'{"metadata":{"uid":"u","name":"b"'),
            id="name-not-first",
        ),
    ],
)
def test_other_layouts_are_read_the_general_way(tamper: Any) -> None:
    docs = [node(n, gpu_annotations()) for n in ("a", "b", "c")]
    document = {"Pod": pod(), "Nodes": {"metadata": {}, "items": docs}, "NodeNames": None}
    body = tamper(json.dumps(document, separators=(",", ":")).encode())
    request = wire.decode_args(body, gpu_resource_name=GPU)
    assert all(isinstance(raw, msgspec.Raw) for raw in request.raw_nodes)
    assert [json.loads(bytes(raw))["metadata"]["name"] for raw in request.raw_nodes] == [
        "a",
        "b",
        "c",
    ]


def test_raw_items_are_views_of_the_body_not_reencodings() -> None:
    # Unusual but valid JSON spacing survives the echo unchanged.
    item = b'{ "metadata" : { "name" : "a" } , "extra" : [1, 2.50, "x"] }'
    body = b'{"Pod": {"metadata": {"name": "p"}}, "Nodes": {"items": [' + item + b"]}}"
    request = wire.decode_args(body, gpu_resource_name=GPU)
    assert isinstance(request.raw_nodes[0], msgspec.Raw)
    reply = wire.encode_filter_reply(request, passed=["a"], failed={}, unresolvable={})
    assert reply.startswith(b'{"Nodes":{"items":[' + item + b"]}")


def _captured(name: str) -> bytes:
    return (FIXTURES / "nodecache-true" / name).read_bytes()


def test_a_prioritize_with_its_filters_pod_takes_the_decoded_pod() -> None:
    """kube-scheduler's prioritize carries its filter's Pod byte for byte (the v1.36 capture
    pair); that request is read without decoding the Pod again, and reads as a whole decode
    does. Any other body is left to the whole decode."""
    recent = wire.RecentPod()
    prioritize = _captured("0002-prioritize.request.json")
    assert recent.names_request(prioritize, DEFAULT_KEYS) is None  # no filter yet
    filtered = wire.decode_args(
        _captured("0001-filter.request.json"), gpu_resource_name=GPU, decode_names=False
    )
    recent.remember(filtered)
    request = recent.names_request(prioritize, DEFAULT_KEYS)
    assert request is not None
    assert request.pod is filtered.pod
    assert request == wire.decode_args(prioritize, gpu_resource_name=GPU, decode_names=False)
    assert json.loads(request.node_names_json) == json.loads(prioritize)["NodeNames"]

    document = json.loads(prioritize)
    changed_pod = json.loads(prioritize)
    changed_pod["Pod"]["metadata"]["resourceVersion"] += "1"
    full_nodes = {**document, "Nodes": {"items": []}, "NodeNames": None}
    others = [
        json.dumps(changed_pod, separators=(",", ":")).encode(),
        json.dumps(full_nodes, separators=(",", ":")).encode(),
        json.dumps({**document, "NodeNames": None}, separators=(",", ":")).encode(),
        json.dumps({"pod": document["Pod"], "Nodes": None, "NodeNames": []}).encode(),
        prioritize[:-2],  # malformed: the whole decode says why
    ]
    for body in others:
        assert recent.names_request(body, DEFAULT_KEYS) is None


def test_a_pod_of_the_wrong_type_is_named_by_its_path() -> None:
    body = b'{"Pod":{"spec":{"containers":{}}},"Nodes":null,"NodeNames":[]}'
    with pytest.raises(wire.WireError, match=r"\$\.Pod\.spec\.containers") as raised:
        wire.decode_args(body, gpu_resource_name=GPU)
    assert raised.value.cause == "wrong_type"
