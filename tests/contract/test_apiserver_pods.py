"""Pods and Namespaces on the API server stand-in answer in the shapes a kube-apiserver v1.36
gives Nodes in the captures (`tests/fixtures/kube-apiserver-v1.36/`): a `<Kind>List` whose
items carry no kind/apiVersion, paging with the real continue token, one chunk per watch event,
a name-less zero-value object in BOOKMARKs, the `ERROR` 410 event inside an HTTP 200; and they
apply the selectors the scorer sends (the pod cache's field selector, to lists and to watch
events: a pod leaving the selection arrives as DELETED).
"""

from __future__ import annotations

import select
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import pytest

from exporter_scheduler.edges.podcache import FIELD_SELECTOR, NOMINATED_FIELD_SELECTOR
from kube_standins.apiserver import ApiServerStandIn, Fault
from tests.contract.apiserver_wire import WatchStream, open_watch, request

SELECTOR = quote(FIELD_SELECTOR)
NOMINATED = quote(NOMINATED_FIELD_SELECTOR)


def pod(name: str, *, node: str | None = "gpu-1", phase: str | None = None, ns: str = "default",
        labels: dict[str, str] | None = None,
        nominated: str | None = None) -> dict[str, Any]:  # fmt: skip
    spec: dict[str, Any] = {"containers": [{"name": "main", "image": "cuda"}]}
    if node is not None:
        spec["nodeName"] = node
    obj: dict[str, Any] = {
        "metadata": {"name": name, "namespace": ns, "labels": labels or {}},
        "spec": spec,
    }
    status: dict[str, Any] = {}
    if phase is not None:
        status["phase"] = phase
    if nominated is not None:
        status["nominatedNodeName"] = nominated
    if status:
        obj["status"] = status
    return obj


def waiting(name: str, node: str, *, phase: str = "Pending") -> dict[str, Any]:
    """A pod kube-scheduler nominated to `node` and has not bound."""
    return pod(name, node=None, phase=phase, nominated=node)


@pytest.fixture
def srv() -> Iterator[ApiServerStandIn]:
    with ApiServerStandIn(bookmark_interval_s=0.2) as server:
        server.put_pod(pod("bound"))
        server.put_pod(pod("pending", node=None))
        server.put_pod(pod("done", phase="Succeeded"))
        server.put_pod(pod("other-ns", ns="lab", labels={"app": "train"}))
        server.put_namespace({"metadata": {"name": "default"}})
        server.put_namespace({"metadata": {"name": "lab", "labels": {"team": "research"}}})
        yield server


def names(body: dict[str, Any]) -> list[str]:
    return [f"{i['metadata'].get('namespace', '')}/{i['metadata']['name']}" for i in body["items"]]


@dataclass(frozen=True)
class ListCase:
    name: str
    path: str
    expected: list[str]


LISTS = [
    ListCase("all-pods-by-namespace-then-name", "/api/v1/pods",
             ["default/bound", "default/done", "default/pending", "lab/other-ns"]),
    ListCase("the-pod-caches-field-selector", f"/api/v1/pods?fieldSelector={SELECTOR}",
             ["default/bound", "lab/other-ns"]),
    ListCase("pods-by-namespace-field", "/api/v1/pods?fieldSelector=metadata.namespace%3Dlab",
             ["lab/other-ns"]),
    ListCase("pods-by-label", "/api/v1/pods?labelSelector=app%20in%20(train)", ["lab/other-ns"]),
    ListCase("namespaces-by-label", "/api/v1/namespaces?labelSelector=team%3Dresearch", ["/lab"]),
    ListCase("namespaces-by-their-name-label",
             "/api/v1/namespaces?labelSelector=kubernetes.io/metadata.name%3Ddefault",
             ["/default"]),
]  # fmt: skip


@pytest.mark.parametrize("case", LISTS, ids=lambda c: c.name)
def test_lists_apply_the_selectors(case: ListCase, srv: ApiServerStandIn) -> None:
    got = request(srv.url, "GET", case.path)
    assert got.status == 200, got.body
    body = got.json()
    assert names(body) == case.expected
    assert body["kind"] in ("PodList", "NamespaceList")
    assert body["metadata"] == {"resourceVersion": str(srv.resource_version)}
    assert all("kind" not in item and "apiVersion" not in item for item in body["items"])


def test_a_namespace_is_stored_as_the_server_stores_it(srv: ApiServerStandIn) -> None:
    got = request(srv.url, "GET", "/api/v1/namespaces/lab").json()
    assert list(got) == ["kind", "apiVersion", "metadata", "spec", "status"]
    assert got["metadata"]["labels"] == {"kubernetes.io/metadata.name": "lab", "team": "research"}
    assert (got["spec"], got["status"]) == ({"finalizers": ["kubernetes"]}, {"phase": "Active"})
    assert list(got["metadata"]) == ["name", "uid", "resourceVersion", "creationTimestamp",
                                     "labels"]  # fmt: skip


def test_paging_pods_follows_the_continue_token(srv: ApiServerStandIn) -> None:
    seen: list[str] = []
    path = "/api/v1/pods?limit=3"
    first = request(srv.url, "GET", path).json()
    seen += names(first)
    assert first["metadata"]["remainingItemCount"] == 1
    token = first["metadata"]["continue"]
    second = request(srv.url, "GET", f"{path}&continue={token}").json()
    seen += names(second)
    assert "continue" not in second["metadata"]
    assert seen == ["default/bound", "default/done", "default/pending", "lab/other-ns"]


@pytest.mark.parametrize(
    "path",
    ["/api/v1/pods?fieldSelector=spec.gpu%3D1", "/api/v1/namespaces?fieldSelector=spec.x%3D1"],
)
def test_an_unsupported_field_label_is_a_400(path: str, srv: ApiServerStandIn) -> None:
    got = request(srv.url, "GET", path)
    assert got.status == 400
    label = path.split("fieldSelector=")[1].split("%3D", maxsplit=1)[0]
    assert got.json() == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": f"field label not supported: {label}",
        "reason": "BadRequest",
        "code": 400,
    }


def test_a_pod_watch_applies_the_field_selector_to_events(srv: ApiServerStandIn) -> None:
    rv = srv.resource_version
    stream = open_watch(
        srv.url,
        f"/api/v1/pods?watch=1&resourceVersion={rv}&fieldSelector={SELECTOR}"
        "&allowWatchBookmarks=true&timeoutSeconds=1",
    )
    try:
        assert stream.status == 200
        srv.put_pod(pod("late", node=None))  # not bound: not in the selection
        srv.put_pod(pod("late"))  # bound now: enters it
        srv.put_pod(pod("late", phase="Failed"))  # finished: leaves it
        srv.put_namespace({"metadata": {"name": "ignored"}})  # another resource
        events = stream.events_until_close()
    finally:
        stream.close()
    typed = [(e["type"], e["object"]["metadata"].get("name")) for e in events]
    changes = [t for t in typed if t[0] != "BOOKMARK"]
    assert changes == [("ADDED", "late"), ("DELETED", "late")]
    bookmark = next(e["object"] for e in events if e["type"] == "BOOKMARK")
    # The zero Pod: PodSpec.containers has no omitempty.
    assert bookmark == {
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": {"resourceVersion": str(srv.resource_version)},
        "spec": {"containers": None},
        "status": {},
    }


def test_a_namespace_watch_without_a_version_starts_with_the_current_ones(
    srv: ApiServerStandIn,
) -> None:
    stream = open_watch(
        srv.url, "/api/v1/namespaces?watch=1&allowWatchBookmarks=true&timeoutSeconds=1"
    )
    try:
        first = [stream.next_event() for _ in range(3)]
    finally:
        stream.close()
    assert [(e or {})["type"] for e in first] == ["ADDED", "ADDED", "BOOKMARK"]
    end = (first[2] or {})["object"]
    assert end["kind"] == "Namespace"
    assert end["metadata"]["annotations"] == {"k8s.io/initial-events-end": "true"}
    assert (end["spec"], end["status"]) == ({}, {})


@pytest.mark.parametrize("resource", ["pods", "namespaces"])
def test_a_watch_from_an_expired_version_gets_the_error_410_event(
    resource: str, srv: ApiServerStandIn
) -> None:
    old = srv.resource_version
    srv.expire_watches()
    stream = open_watch(srv.url, f"/api/v1/{resource}?watch=1&resourceVersion={old}")
    try:
        assert stream.status == 200
        events = stream.events_until_close()
    finally:
        stream.close()
    assert events == [
        {
            "type": "ERROR",
            "object": {
                "kind": "Status",
                "apiVersion": "v1",
                "metadata": {},
                "status": "Failure",
                "message": f"too old resource version: {old} ({srv.resource_version})",
                "reason": "Expired",
                "code": 410,
            },
        }
    ]


def test_get_of_a_missing_pod_is_the_real_404(srv: ApiServerStandIn) -> None:
    got = request(srv.url, "GET", "/api/v1/namespaces/default/pods/nope")
    assert got.status == 404
    assert got.json()["message"] == 'pods "nope" not found'
    assert got.json()["details"] == {"name": "nope", "kind": "pods"}


def changes(stream: WatchStream, count: int) -> list[tuple[str, str]]:
    """The next `count` events that are not BOOKMARKs, as (type, name)."""
    got: list[tuple[str, str]] = []
    while len(got) < count:
        event = stream.next_event()
        assert event is not None, f"the stream ended after {got}"
        if event["type"] != "BOOKMARK":
            got.append((event["type"], event["object"]["metadata"].get("name", "")))
    return got


def test_the_nominated_pods_selector_selects_unbound_nominated_unfinished_pods(
    srv: ApiServerStandIn,
) -> None:
    """`status.nominatedNodeName` is one of the pod field labels kube-apiserver converts and
    selects on (pkg/apis/core/v1/conversion.go, pkg/registry/core/pod ToSelectableFields; in
    every release the scorer supports); unset, it reads as "", as `spec.nodeName` does."""
    srv.put_pod(waiting("gang-0", "gpu-1"))
    srv.put_pod(waiting("gang-failed", "gpu-1", phase="Failed"))
    srv.put_pod(pod("bound-nominated", nominated="gpu-2"))
    listed = request(srv.url, "GET", f"/api/v1/pods?fieldSelector={NOMINATED}")
    assert listed.status == 200, listed.body
    assert names(listed.json()) == ["default/gang-0"]
    rv = srv.resource_version
    stream = open_watch(
        srv.url,
        f"/api/v1/pods?watch=1&resourceVersion={rv}&fieldSelector={NOMINATED}&timeoutSeconds=5",
    )
    try:
        assert stream.status == 200
        srv.put_pod(waiting("late", "gpu-1"))  # nominated: enters the selection
        srv.put_pod(waiting("late", "gpu-2"))  # nominated elsewhere: stays in it
        srv.put_pod(pod("late", node="gpu-2", nominated="gpu-2"))  # bound: leaves it
        srv.put_pod(waiting("gang-0", ""))  # nomination cleared: leaves it
        got = changes(stream, 4)
    finally:
        stream.close()
    assert got == [("ADDED", "late"), ("MODIFIED", "late"), ("DELETED", "late"),
                   ("DELETED", "gang-0")]  # fmt: skip


def test_a_fault_can_fail_one_of_two_watches_by_its_field_selector(srv: ApiServerStandIn) -> None:
    srv.inject(Fault(403, method="GET", field_selector=FIELD_SELECTOR))
    statuses = [
        request(srv.url, "GET", f"/api/v1/pods?fieldSelector={selector}").status
        for selector in (NOMINATED, SELECTOR, SELECTOR)
    ]
    assert statuses == [200, 403, 200]  # the other selector passes; the fault is used once
    srv.inject(Fault(503, method="GET", field_selector=FIELD_SELECTOR, times=5))
    srv.clear_faults()
    assert request(srv.url, "GET", f"/api/v1/pods?fieldSelector={SELECTOR}").status == 200


def _watch(srv: ApiServerStandIn, selector: str) -> WatchStream:
    rv = srv.resource_version
    stream = open_watch(
        srv.url,
        f"/api/v1/pods?watch=1&resourceVersion={rv}&fieldSelector={selector}"
        "&allowWatchBookmarks=true&timeoutSeconds=5",
    )
    assert stream.status == 200
    return stream


def test_held_watches_send_their_events_in_order_when_released(srv: ApiServerStandIn) -> None:
    bound = _watch(srv, SELECTOR)
    try:
        with srv.hold_watches(NOMINATED_FIELD_SELECTOR):
            nominated = _watch(srv, NOMINATED)  # opened inside the block: held too
            srv.put_pod(waiting("p", "gpu-1"))
            srv.put_pod(pod("p", nominated="gpu-1"))  # bound
            assert changes(bound, 1) == [("ADDED", "p")]  # the other watch is not held
            # Nothing on the held one, not even a BOOKMARK (one every 0.2 s when not held).
            readable, _, _ = select.select([nominated.sock], [], [], 0.5)
            assert readable == []
        assert changes(nominated, 2) == [("ADDED", "p"), ("DELETED", "p")]
    finally:
        bound.close()
        nominated.close()


def test_expiring_one_selectors_watches_leaves_the_others_open(srv: ApiServerStandIn) -> None:
    bound, nominated = _watch(srv, SELECTOR), _watch(srv, NOMINATED)
    try:
        srv.expire_watches(field_selector=NOMINATED_FIELD_SELECTOR)
        ended = [e for e in nominated.events_until_close() if e["type"] != "BOOKMARK"]
        assert [(e["type"], e["object"]["code"]) for e in ended] == [("ERROR", 410)]
        srv.put_pod(pod("later"))
        assert changes(bound, 1) == [("ADDED", "later")]
    finally:
        bound.close()
        nominated.close()
