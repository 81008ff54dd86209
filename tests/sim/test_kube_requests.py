"""The model of what kube-scheduler sends an extender (benchmarks.kube_requests)."""

from __future__ import annotations

import json

import pytest

from benchmarks.kube_requests import (
    PodStream,
    Rotation,
    filter_body,
    informer_order,
    nodes_to_find,
    passing_names,
    snapshot_order,
    zone_key,
)
from benchmarks.window_check import compare


@pytest.mark.parametrize(
    ("total", "percentage", "expected"),
    [
        pytest.param(40, 0, 40, id="under 100 nodes: all of them"),
        pytest.param(100, 0, 100, id="100 nodes: 50 % would be under the floor of 100"),
        pytest.param(300, 0, 144, id="300 nodes: 48 %"),
        pytest.param(500, 0, 230, id="500 nodes: 46 %"),
        pytest.param(5000, 0, 500, id="5,000 nodes: 10 %"),
        pytest.param(10000, 0, 500, id="10,000 nodes: the 5 % floor"),
        pytest.param(1000, 0, 420, id="1,000 nodes: 42 %"),
        pytest.param(5000, 30, 1500, id="configured percentage"),
        pytest.param(5000, 1, 100, id="configured, under the floor of 100 nodes"),
    ],
)
def test_nodes_to_find(total: int, percentage: int, expected: int) -> None:
    assert nodes_to_find(total, percentage) == expected


def test_each_window_starts_where_the_last_ended_and_wraps() -> None:
    names = [f"n{i:03d}" for i in range(300)]
    rotation = Rotation(names)
    first, second, third = rotation.window(), rotation.window(), rotation.window()
    assert first == names[:144]
    assert second == names[144:288]
    assert third == names[288:] + names[:132]
    assert rotation.start == 132


def test_nodes_failing_the_plugins_are_examined_but_not_sent() -> None:
    names = [f"n{i:03d}" for i in range(200)]
    rotation = Rotation(names)
    failing = {f"n{i:03d}" for i in range(0, 50, 2)}
    window = rotation.window(lambda name: name not in failing)
    assert len(window) == 100
    assert not failing & set(window)
    assert window[-1] == "n124"
    # 100 passed and 25 failed on the way: the next pod starts after all 125.
    assert rotation.start == 125


def test_the_snapshot_lists_zones_in_turn() -> None:
    added = [("a1", "za"), ("a2", "za"), ("b1", "zb"), ("a3", "za"), ("c1", "zc")]
    assert snapshot_order(added) == ["a1", "b1", "c1", "a2", "a3"]


def test_zone_key_reads_region_and_zone_labels() -> None:
    node = {
        "metadata": {
            "labels": {
                "topology.kubernetes.io/region": "r",
                "topology.kubernetes.io/zone": "z",
            }
        }
    }
    assert zone_key(node) == "r:\x00:z"
    assert zone_key({"metadata": {}}) == ""


def test_every_pod_is_a_fresh_object_and_the_mix_has_several_classes() -> None:
    stream = PodStream(seed=1)
    pods = [stream.next() for _ in range(400)]
    assert len({p["metadata"]["uid"] for p in pods}) == 400
    assert len({p["metadata"]["name"] for p in pods}) == 400
    classes = {
        (
            p["metadata"]["namespace"],
            p["spec"]["containers"][0]["resources"]["requests"]["nvidia.com/gpu"],
            tuple(sorted(p["metadata"]["annotations"].items())),
        )
        for p in pods
    }
    assert len(classes) >= 8


def test_bodies_are_the_wire_format_and_prioritize_takes_the_filter_reply() -> None:
    pod = PodStream(seed=2).next()
    body = json.loads(filter_body(pod, ["a", "b"]))
    assert body == {"Pod": pod, "Nodes": None, "NodeNames": ["a", "b"]}
    nodes = {n: {"metadata": {"name": n}} for n in ("a", "b")}
    full = json.loads(filter_body(pod, ["b"], nodes))
    assert full["Nodes"]["items"] == [{"metadata": {"name": "b"}}]
    assert full["NodeNames"] is None
    assert passing_names(b'{"NodeNames":["b","a"],"FailedNodes":{}}') == ["b", "a"]
    assert passing_names(b'{"Nodes":{"items":[{"metadata":{"name":"a"}}]}}') == ["a"]


def test_the_window_check_finds_the_model_in_requests_the_model_made() -> None:
    zones = {f"n{i:03d}": "abc"[i % 3] for i in range(300)}
    order = snapshot_order((n, zones[n]) for n in informer_order(list(zones), seed=3))
    rotation = Rotation(order)
    recorded = []
    for _ in range(12):
        window = rotation.window()
        recorded += [{"verb": "filter", "names": window}, {"verb": "prioritize", "names": window}]
    result = compare(zones, recorded)
    assert result["window_sizes"] == {"median": 144, "min": 144, "max": 144}
    assert result["window_overlaps_exact"] == "30 of 30"
    assert result["windows_with_zones_in_turn"].split(" of ")[0] != "0"
    assert result["prioritize_names_what_filter_passed"] == 12
    # A rotation that does not move on is caught.
    stuck = [{"verb": "filter", "names": order[:144]} for _ in range(4)]
    assert compare(zones, stuck)["window_overlaps_exact"] == "0 of 6"
