"""Object semantics behind the API server stand-in, and the realistic Node builders."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpu_contract.schema import FIELD_MANAGER
from kube_standins import objects as ko
from kube_standins.apiserver import ApiServerStandIn
from kube_standins.nodes import gpu_node, with_agent_write
from tests.contract.apiserver_wire import request

T0 = datetime(2026, 11, 30, 14, 19, 24, tzinfo=UTC)

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**53), 2**53)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4)
    ),
    max_leaves=20,
)


@given(json_values)
@settings(deadline=None)  # a shared CI box can stall any single example
def test_decode_json_accepts_every_json_document(value: Any) -> None:
    assert ko.decode_json(json.dumps(value).encode()) == value


@given(json_values.filter(lambda v: isinstance(v, dict | list) and v), st.data())
@settings(deadline=None)
def test_decode_json_rejects_every_truncation_with_a_go_message(value: Any, data: Any) -> None:
    text = json.dumps(value)
    cut = data.draw(st.integers(0, len(text) - 1))
    with pytest.raises(ValueError, match=r"^(unexpected end of JSON input|invalid character)"):
        ko.decode_json(text[:cut].encode())


@pytest.mark.parametrize(
    ("text", "message"),
    [
        pytest.param(
            '{"a": "1",}',
            "invalid character '}' looking for beginning of object key string",
            id="trailing-comma",
        ),
        pytest.param('[{"op":"add",', "unexpected end of JSON input", id="truncated"),
        pytest.param(
            "{'a': 1}",
            "invalid character '\\'' looking for beginning of object key string",
            id="single-quote",
        ),
        pytest.param('{"a" 1}', "invalid character '1' after object key", id="missing-colon"),
        pytest.param("NaN", "invalid character 'N' looking for beginning of value", id="nan"),
        pytest.param("{} x", "invalid character 'x' after top-level value", id="trailing-garbage"),
        pytest.param("", "unexpected end of JSON input", id="empty"),
    ],
)
def test_decode_json_speaks_go(text: str, message: str) -> None:
    with pytest.raises(ValueError, match="^" + re.escape(message) + "$"):
        ko.decode_json(text.encode())


annotation_maps = st.dictionaries(
    st.sampled_from(["a.example.com/x", "a.example.com/y", "b.example.com/z", "plain"]),
    st.text(max_size=4),
    max_size=4,
)
patches = st.dictionaries(
    st.sampled_from(["a.example.com/x", "a.example.com/y", "b.example.com/z", "plain"]),
    st.none() | st.text(max_size=4),
    max_size=4,
)


@given(annotation_maps, patches)
@settings(deadline=None)
def test_merge_patch_of_annotations_sets_and_deletes(
    live: dict[str, str], patch: dict[str, Any]
) -> None:
    result = ko.merge_patch(
        {"metadata": {"annotations": live}}, {"metadata": {"annotations": patch}}
    )
    want = {k: v for k, v in {**live, **patch}.items() if v is not None}
    assert result["metadata"]["annotations"] == want


@given(annotation_maps, patches, patches)
@settings(max_examples=50, deadline=None)
def test_agent_owns_exactly_the_keys_it_changed_and_did_not_delete(
    live: dict[str, str], first: dict[str, Any], second: dict[str, Any]
) -> None:
    node = gpu_node("gpu-node-1", annotations=live)
    after = with_agent_write(with_agent_write(node, first, T0), second, T0)
    # Model: a write owns what it changed; a null removes the key from every owner.
    state, owned = dict(node["metadata"]["annotations"]), set()
    for patch in (first, second):
        for key, value in patch.items():
            if value is None:
                state.pop(key, None)
                owned.discard(key)
            elif state.get(key) != value:
                state[key] = value
                owned.add(key)
    assert after["metadata"]["annotations"] == state
    entry = [e for e in after["metadata"].get("managedFields", []) if e["manager"] == FIELD_MANAGER]
    fields = entry[0]["fieldsV1"]["f:metadata"]["f:annotations"] if entry else {}
    assert {f.removeprefix("f:") for f in fields} == owned


@pytest.mark.parametrize(
    ("key", "valid"),
    [
        pytest.param("gpu-scheduler.example.com/utilization", True, id="prefixed"),
        pytest.param("plain-name", True, id="no-prefix"),
        pytest.param("bad key with spaces", False, id="spaces"),
        pytest.param("a/b/c", False, id="two-slashes"),
        pytest.param("/name", False, id="empty-prefix"),
        pytest.param("Upper.Example.com/x", True, id="prefix-case-folded-by-caller"),
        pytest.param("example.com/" + "n" * 64, False, id="name-too-long"),
    ],
)
def test_annotation_keys_follow_qualified_name_rules(key: str, valid: bool) -> None:
    errors = ko.validate_node_meta({"metadata": {"annotations": {key: "v"}}})
    assert (not errors) is valid


def test_gpu_node_looks_like_a_real_gpu_node() -> None:
    node = gpu_node("gpu-a-017", gpu_count=4, product="NVIDIA-H100-80GB-HBM3")
    size_b = len(json.dumps(node, separators=(",", ":")))
    assert 5_000 <= size_b <= 8_000
    labels = node["metadata"]["labels"]
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
    assert labels["nvidia.com/gpu.count"] == "4"
    assert labels["topology.kubernetes.io/zone"].startswith("us-east-1")
    assert node["status"]["capacity"]["nvidia.com/gpu"] == "4"
    assert node["status"]["allocatable"]["nvidia.com/gpu"] == "4"
    assert {c["type"] for c in node["status"]["conditions"]} >= {"Ready", "MemoryPressure"}
    assert node["status"]["images"]
    assert node == gpu_node("gpu-a-017", gpu_count=4, product="NVIDIA-H100-80GB-HBM3")
    assert node["metadata"]["uid"] != gpu_node("gpu-a-018")["metadata"]["uid"]


def test_with_agent_write_matches_what_the_server_does(frozen_api_server: ApiServerStandIn) -> None:
    srv = frozen_api_server
    annotations = {
        "gpu-scheduler.example.com/utilization": "0.42",
        "gpu-scheduler.example.com/updated-at": "2026-11-30T14:19:20Z",
    }
    srv.put_node(gpu_node("gpu-node-1"))
    body = json.dumps({"metadata": {"annotations": annotations}})
    request(
        srv.url,
        "PATCH",
        "/api/v1/nodes/gpu-node-1?fieldManager=gpu-scheduler-agent",
        body=body,
        content_type="application/merge-patch+json",
    )
    served = srv.node("gpu-node-1")
    built = with_agent_write(gpu_node("gpu-node-1"), annotations, T0)
    served["metadata"].pop("resourceVersion")
    assert served == built
    assert with_agent_write(built, annotations, datetime(2027, 1, 1, tzinfo=UTC)) == built
