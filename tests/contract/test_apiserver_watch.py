"""WATCH on the API server stand-in streams as the captured kube-apiserver v1.36.2 does.

One chunk and one newline-terminated JSON line per event; BOOKMARKs are name-less skeleton
Nodes; a too-old resourceVersion is an ERROR 410 event inside an HTTP 200 that closes at once;
events up to a future resourceVersion are skipped; the stream ends at timeoutSeconds.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import watch as kube_watch
from kubernetes.client.rest import ApiException

from kube_standins.apiserver import ApiServerStandIn
from kube_standins.nodes import gpu_node
from tests.contract.apiserver_wire import fixture_lines, open_watch, request

MERGE = "application/merge-patch+json"


@pytest.fixture
def fast_server() -> Iterator[ApiServerStandIn]:
    """Bookmarks every 0.3 s so that bookmark behaviour shows within a 1 s watch."""
    with ApiServerStandIn(bookmark_interval_s=0.3) as server:
        yield server


def with_rv(line: bytes, rv: int) -> dict[str, Any]:
    """A captured event line with its resourceVersion replaced."""
    event: dict[str, Any] = json.loads(
        re.sub(rb'"resourceVersion":"\d+"', f'"resourceVersion":"{rv}"'.encode(), line)
    )
    return event


def patch(srv: ApiServerStandIn, name: str, utilization: str) -> None:
    body = json.dumps(
        {"metadata": {"annotations": {"gpu-scheduler.example.com/utilization": utilization}}}
    )
    got = request(
        srv.url,
        "PATCH",
        f"/api/v1/nodes/{name}?fieldManager=gpu-scheduler-agent",
        body=body,
        content_type=MERGE,
    )
    assert got.status == 200


def test_watch_from_a_list_rv_streams_changes_then_bookmarks_then_closes(
    fast_server: ApiServerStandIn,
) -> None:
    srv = fast_server
    srv.put_node(gpu_node("gpu-node-1"))
    list_rv = srv.resource_version
    stream = open_watch(
        srv.url,
        f"/api/v1/nodes?watch=1&allowWatchBookmarks=true&resourceVersion={list_rv}&timeoutSeconds=1",
    )
    try:
        assert stream.status == 200
        assert stream.header("Content-Type") == "application/json"
        assert stream.header("Transfer-Encoding") == "chunked"
        assert stream.header("X-Kubernetes-Pf-Flowschema-Uid")
        patch(srv, "gpu-node-1", "0.33")
        patch(srv, "gpu-node-1", "0.34")
        srv.put_node(gpu_node("gpu-node-2"))
        srv.delete_node("gpu-node-2")
        final_rv = srv.resource_version
        events = stream.events_until_close()
    finally:
        stream.close()
    changes = [
        (e["type"], e["object"]["metadata"].get("name")) for e in events if e["type"] != "BOOKMARK"
    ]
    assert changes == [
        ("MODIFIED", "gpu-node-1"),
        ("MODIFIED", "gpu-node-1"),
        ("ADDED", "gpu-node-2"),
        ("DELETED", "gpu-node-2"),
    ]
    rvs = [int(e["object"]["metadata"]["resourceVersion"]) for e in events[:4]]
    assert rvs == sorted(rvs)
    assert rvs[-1] == final_rv  # DELETED carries the deletion's RV
    bookmarks = [e for e in events if e["type"] == "BOOKMARK"]
    assert bookmarks, "0.3 s bookmarks within a 1 s watch"
    captured = fixture_lines("51-watch-nodes-timeout20.ndjson")[-1]
    assert bookmarks[0] == with_rv(captured, final_rv)
    assert stream.closed_after_s is not None
    assert 0.9 <= stream.closed_after_s < 2.0
    assert srv.watch_count == 0


def test_watch_from_a_too_old_rv_is_one_error_event_in_a_200(api_server: ApiServerStandIn) -> None:
    api_server.put_node(gpu_node("gpu-node-1"))
    api_server.expire_watches()
    floor = api_server.resource_version
    stream = open_watch(api_server.url, "/api/v1/nodes?watch=1&resourceVersion=1&timeoutSeconds=5")
    try:
        assert stream.status == 200
        events = stream.events_until_close()
    finally:
        stream.close()
    captured = fixture_lines("62-watch-rv1-too-old.ndjson")[0]
    assert stream.chunks == [captured.replace(b"(237)", f"({floor})".encode())]
    assert events[0]["object"]["code"] == 410
    assert stream.closed_after_s is not None
    assert stream.closed_after_s < 1.0


def test_watch_without_rv_lists_then_marks_the_end_of_initial_events(
    api_server: ApiServerStandIn,
) -> None:
    api_server.put_node(gpu_node("gpu-node-1"))
    rv = api_server.resource_version
    nothing = open_watch(
        api_server.url,
        "/api/v1/nodes?watch=1&allowWatchBookmarks=true&fieldSelector=metadata.name%3Dno-such-node&timeoutSeconds=1",
    )
    everything = open_watch(
        api_server.url,
        "/api/v1/nodes?watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true&timeoutSeconds=1",
    )
    try:
        first = nothing.next_event()
        added, end = everything.next_event(), everything.next_event()
    finally:
        nothing.close()
        everything.close()
    captured = with_rv(fixture_lines("52-watch-bookmarks-only-timeout75.ndjson")[0], rv)
    assert first == captured
    assert added is not None
    assert (added["type"], added["object"]["metadata"]["name"]) == ("ADDED", "gpu-node-1")
    assert end == captured


def test_watch_from_a_future_rv_silently_skips_up_to_it(api_server: ApiServerStandIn) -> None:
    api_server.put_node(gpu_node("gpu-node-1"))
    future = api_server.resource_version + 2
    stream = open_watch(
        api_server.url,
        f"/api/v1/nodes?watch=1&resourceVersion={future}&fieldSelector=metadata.name%3Dgpu-node-1&timeoutSeconds=1",
    )
    try:
        for value in ("0.90", "0.91", "0.92", "0.93"):
            patch(api_server, "gpu-node-1", value)
        events = stream.events_until_close()
    finally:
        stream.close()
    rvs = [int(e["object"]["metadata"]["resourceVersion"]) for e in events]
    assert rvs == [future + 1, future + 2]


def test_expire_watches_ends_open_watches_and_old_rvs(api_server: ApiServerStandIn) -> None:
    api_server.put_node(gpu_node("gpu-node-1"))
    rv = api_server.resource_version
    stream = open_watch(
        api_server.url,
        f"/api/v1/nodes?watch=1&resourceVersion={rv}&allowWatchBookmarks=true&timeoutSeconds=30",
    )
    try:
        deadline = time.monotonic() + 2
        while api_server.watch_count == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        api_server.expire_watches()
        events = stream.events_until_close()
    finally:
        stream.close()
    floor = api_server.resource_version
    assert floor == rv + 1  # a restart moves the revision on
    assert [e["type"] for e in events] == ["ERROR"]
    assert events[0]["object"]["message"] == f"too old resource version: {rv} ({floor})"
    later = open_watch(
        api_server.url, f"/api/v1/nodes?watch=1&resourceVersion={rv}&timeoutSeconds=3"
    )
    try:
        assert later.status == 200
        assert later.events_until_close()[0]["object"]["reason"] == "Expired"
    finally:
        later.close()
    assert api_server.watch_count == 0


def test_field_selector_watch_sees_only_its_node(api_server: ApiServerStandIn) -> None:
    api_server.put_node(gpu_node("gpu-node-1"))
    api_server.put_node(gpu_node("gpu-node-2"))
    rv = api_server.resource_version
    stream = open_watch(
        api_server.url,
        f"/api/v1/nodes?watch=1&resourceVersion={rv}&fieldSelector=metadata.name%3Dgpu-node-2&timeoutSeconds=1",
    )
    try:
        patch(api_server, "gpu-node-1", "0.1")
        patch(api_server, "gpu-node-2", "0.2")
        events = stream.events_until_close()
    finally:
        stream.close()
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [
        ("MODIFIED", "gpu-node-2")
    ]


def test_real_client_watch_gets_events_and_raises_410(
    api_server: ApiServerStandIn, core_v1: Any
) -> None:
    api_server.put_node(gpu_node("gpu-node-1"))
    listed = core_v1.list_node()
    rv = listed.metadata.resource_version
    threading.Timer(0.2, patch, args=(api_server, "gpu-node-1", "0.77")).start()
    seen = []
    w = kube_watch.Watch()
    for event in w.stream(core_v1.list_node, resource_version=rv, timeout_seconds=1):
        seen.append(
            (
                event["type"],
                event["object"].metadata.annotations.get("gpu-scheduler.example.com/utilization"),
            )
        )
        w.stop()
    assert seen == [("MODIFIED", "0.77")]
    api_server.expire_watches()
    with pytest.raises(ApiException) as err:
        for _ in kube_watch.Watch().stream(
            core_v1.list_node, resource_version=rv, timeout_seconds=1
        ):
            pass
    assert err.value.status == 410


def test_stop_closes_open_watches_promptly() -> None:
    server = ApiServerStandIn()
    server.start()
    stream = open_watch(server.url, "/api/v1/nodes?watch=1&timeoutSeconds=60")
    try:
        deadline = time.monotonic() + 2
        while server.watch_count == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert server.watch_count == 1
        started = time.monotonic()
        server.stop()
        assert time.monotonic() - started < 2.0
        with pytest.raises(ConnectionError):  # cut off, not a clean end of stream
            stream.events_until_close()
    finally:
        stream.close()
        server.stop()


def test_a_watch_whose_client_hangs_up_is_closed(api_server: ApiServerStandIn) -> None:
    stream = open_watch(api_server.url, "/api/v1/nodes?watch=1&timeoutSeconds=60")
    deadline = time.monotonic() + 2
    while api_server.watch_count == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert api_server.watch_count == 1
    stream.close()
    deadline = time.monotonic() + 2
    while api_server.watch_count and time.monotonic() < deadline:
        time.sleep(0.01)
    assert api_server.watch_count == 0


@pytest.mark.parametrize(
    "query",
    [
        pytest.param("resourceVersion=abc", id="bad-rv"),
        pytest.param("timeoutSeconds=soon", id="bad-timeout"),
    ],
)
def test_a_bad_watch_request_is_a_400_and_leaves_no_watch(
    api_server: ApiServerStandIn, query: str
) -> None:
    got = request(api_server.url, "GET", f"/api/v1/nodes?watch=1&{query}")
    assert got.status == 400
    assert got.json()["reason"] == "BadRequest"
    assert api_server.requests[-1].status == 400
    assert api_server.watch_count == 0
