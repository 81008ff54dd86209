"""The Pod watch: bound GPU pods by node, the scorer's own proposals, and accounting on or off.

The watch lines here are written by hand in the shape a kube-apiserver v1.36 sends (the Pod of
`tests/fixtures/kube-scheduler-v1.36`, the events of `tests/fixtures/kube-apiserver-v1.36`'s
Node watches: one JSON object per line, `type` and `object`, a BOOKMARK's skeleton object
without a name, an ERROR's `Status`); they are not captured from a server. The cache is fed
them through its loop's own entry point (`_apply`), its LIST through `_replace`, and the loop
itself runs against an API object that stands in for the client's `CoreV1Api`.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterator, Sequence
from datetime import timedelta
from typing import Any

import msgspec
import pytest

from exporter_scheduler.core.inflight import PROVISIONAL_MAX_S, BoundPod
from exporter_scheduler.core.policy import Policy
from exporter_scheduler.edges.listwatch import CacheTuning, WatchExpiredError
from exporter_scheduler.edges.podcache import FIELD_SELECTOR, PodCache
from exporter_scheduler.serving.app import ScorerApp
from exporter_scheduler.serving.metrics import ScorerMetrics
from exporter_scheduler.serving.nodestore import NodeStore
from tests.fixture_paths import APISERVER_FIXTURES
from tests.scorer.scoring_builders import NOW, PREFIX, node

WAIT_S = 10.0
FAST = CacheTuning(watch_timeout_s=30, backoff_initial_s=0.01, backoff_max_s=0.05)
CREATED = "2026-11-30T13:59:40Z"
SCHEDULED = "2026-11-30T13:59:41Z"


# ----------------------------------------------------------------------------- watch lines


def pod_object(
    name: str,
    *,
    node_name: str | None = "gpu-node-1",
    gpus: int = 1,
    init_gpus: int = 0,
    phase: str = "Pending",
    scheduled: str | None = SCHEDULED,
    started: str | None = None,
    running: Sequence[str | None] = (),
    annotations: dict[str, str] | None = None,
    labels: dict[str, str] | None = None,
    resource_version: str = "300",
) -> dict[str, Any]:
    """A Pod as the v1.36 API server serializes it (hand-written): `running` gives, per
    container, its `state.running.startedAt` (None: waiting)."""
    requests: dict[str, str] = {"cpu": "100m", "memory": "64Mi"}
    if gpus:
        requests["nvidia.com/gpu"] = str(gpus)
    containers = [
        {
            "name": f"main-{i}" if i else "main",
            "image": "nvcr.io/nvidia/cuda:12.6.0-base-ubuntu22.04",
            "resources": {"limits": dict(requests), "requests": dict(requests)},
            "terminationMessagePath": "/dev/termination-log",
            "terminationMessagePolicy": "File",
            "imagePullPolicy": "IfNotPresent",
        }
        for i in range(max(1, len(running)))
    ]
    spec: dict[str, Any] = {
        "containers": containers,
        "restartPolicy": "Always",
        "terminationGracePeriodSeconds": 30,
        "dnsPolicy": "ClusterFirst",
        "serviceAccountName": "default",
        "serviceAccount": "default",
        "securityContext": {},
        "schedulerName": "gpu-scheduler",
        "priority": 0,
        "enableServiceLinks": True,
        "preemptionPolicy": "PreemptLowerPriority",
    }
    if init_gpus:
        spec["initContainers"] = [
            {"name": "warmup", "resources": {"requests": {"nvidia.com/gpu": str(init_gpus)}}}
        ]
    if node_name is not None:
        spec["nodeName"] = node_name
    conditions: list[dict[str, Any]] = []
    if scheduled is not None:
        conditions.append(
            {
                "type": "PodScheduled",
                "observedGeneration": 1,
                "status": "True",
                "lastProbeTime": None,
                "lastTransitionTime": scheduled,
            }
        )
    status: dict[str, Any] = {"phase": phase, "conditions": conditions, "qosClass": "Burstable"}
    if started is not None:
        status["hostIP"] = "10.0.0.11"
        status["startTime"] = started
    if running:
        status["containerStatuses"] = [
            {
                "name": container["name"],
                "state": {"running": {"startedAt": at}}
                if at is not None
                else {"waiting": {"reason": "ContainerCreating"}},
                "lastState": {},
                "ready": at is not None,
                "restartCount": 0,
                "image": container["image"],
                "imageID": "",
                "started": at is not None,
            }
            for container, at in zip(containers, running, strict=True)
        ]
    return {
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": {
            "name": name,
            "namespace": "default",
            "uid": f"uid-{name}",
            "resourceVersion": resource_version,
            "generation": 1,
            "creationTimestamp": CREATED,
            "labels": {"app": "gpu-test", **(labels or {})},
            "annotations": {
                "kubectl.kubernetes.io/last-applied-configuration": "{}",
                **(annotations or {}),
            },
        },
        "spec": spec,
        "status": status,
    }


def event(kind: str, obj: dict[str, Any]) -> bytes:
    return json.dumps({"type": kind, "object": obj}, separators=(",", ":")).encode()


def bookmark(resource_version: str) -> bytes:
    """A watch BOOKMARK: a skeleton Pod with no name, only its resourceVersion."""
    skeleton = {
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": {"resourceVersion": resource_version},
    }
    return event("BOOKMARK", skeleton | {"spec": {"containers": None}, "status": {}})


EXPIRED = event(
    "ERROR",
    {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": "too old resource version: 1 (237)",
        "reason": "Expired",
        "code": 410,
    },
)


def pod_list(*pods: dict[str, Any], resource_version: str = "290") -> bytes:
    document = {
        "kind": "PodList",
        "apiVersion": "v1",
        "metadata": {"resourceVersion": resource_version},
        "items": [{k: v for k, v in p.items() if k not in ("kind", "apiVersion")} for p in pods],
    }
    return json.dumps(document).encode()


def listed(cache: PodCache, *pods: dict[str, Any]) -> None:
    """The loop's LIST of one page: decoded, kept, then handed over."""
    cache._replace(cache._keep(list(cache._page.decode(pod_list(*pods)).items or ())))


def names(pods: Sequence[BoundPod]) -> list[str]:
    return [p.name + (" (proposed)" if p.provisional else "") for p in pods]


def gauge(metrics: ScorerMetrics, name: str, labels: str = "") -> float:
    for line in metrics.render()[0].decode().splitlines():
        if line.startswith(f"{name}{labels} "):
            return float(line.split()[-1])
    raise AssertionError(f"{name}{labels} not exported")


@pytest.fixture
def store() -> NodeStore:
    nodes = NodeStore(clock=lambda: NOW)
    nodes.replace([node("gpu-node-1"), node("gpu-node-2"), node("gpu-node-3")])
    return nodes


@pytest.fixture
def cache(store: NodeStore) -> PodCache:
    """A pod cache after its first (empty) LIST, feeding `store`."""
    pods = PodCache(metrics=ScorerMetrics())
    pods.add_sink(store)
    listed(pods)
    return pods


# ----------------------------------------------------------------------------- what is kept

DECODED = [
    pytest.param(
        pod_object("p", gpus=0), None, id="no-gpu-resource-dropped",
    ),
    pytest.param(
        pod_object("p", node_name=None), None, id="not-bound-dropped",
    ),
    pytest.param(
        pod_object("p", gpus=2),
        {"node": "gpu-node-1", "gpus": 2, "bound_at": SCHEDULED, "admitted_at": None,
         "running_since": None},
        id="bound-not-admitted",
    ),
    pytest.param(
        pod_object("p", gpus=1, init_gpus=3), {"gpus": 3},
        id="largest-init-container-counts-as-the-scheduler-counts-it",
    ),
    pytest.param(
        pod_object("p", scheduled=None), {"bound_at": CREATED},
        id="created-with-node-name-bound-at-creation",
    ),
    pytest.param(
        pod_object(
            "p", started="2026-11-30T13:59:45Z",
            running=["2026-11-30T13:59:50Z", "2026-11-30T13:59:52Z"],
        ),
        {"admitted_at": "2026-11-30T13:59:45Z", "running_since": "2026-11-30T13:59:52Z"},
        id="running-since-the-last-container-started",
    ),
    pytest.param(
        pod_object("p", started="2026-11-30T13:59:45Z", running=["2026-11-30T13:59:50Z", None]),
        {"admitted_at": "2026-11-30T13:59:45Z", "running_since": None},
        id="a-container-still-waiting-not-running",
    ),
    pytest.param(
        pod_object(
            "p",
            annotations={
                PREFIX + "expected-gpu-load": "0.25", PREFIX + "min-gpu-memory-mib": "20000"
            },
        ),
        {"gpu_load_bp": 2500, "memory_mib": 20_000}, id="hints-kept",
    ),
    pytest.param(
        pod_object("p", annotations={PREFIX + "expected-gpu-load": "lots"}),
        {"gpu_load_bp": None}, id="bad-load-hint-on-a-bound-pod-the-policy-default",
    ),
]  # fmt: skip


@pytest.mark.parametrize(("obj", "expected"), DECODED)
def test_what_the_watch_keeps_of_a_pod(
    obj: dict[str, Any], expected: dict[str, Any] | None
) -> None:
    cache = PodCache(metrics=ScorerMetrics())
    listed(cache)
    cache._apply(event("ADDED", obj))
    kept = [p for pods in cache.by_node().values() for p in pods]
    if expected is None:
        assert kept == []
        return
    (pod,) = kept
    fields = msgspec.structs.asdict(pod)
    shown = {
        k: v.isoformat().replace("+00:00", "Z") if hasattr(v, "isoformat") else v
        for k, v in fields.items()
    }
    assert {k: shown[k] for k in expected} == expected
    assert (pod.ref, pod.uid, pod.provisional) == ("default/p", "uid-p", False)


# ----------------------------------------------------------------------------- events


def test_events_keep_each_nodes_pods_in_the_sink(cache: PodCache, store: NodeStore) -> None:
    steps: list[tuple[bytes, bool, dict[str, list[str]]]] = [
        (event("ADDED", pod_object("a")), True, {"gpu-node-1": ["a"]}),
        (event("ADDED", pod_object("cpu-only", gpus=0)), False, {"gpu-node-1": ["a"]}),
        (event("ADDED", pod_object("b", node_name="gpu-node-2")), True,
         {"gpu-node-1": ["a"], "gpu-node-2": ["b"]}),
        # The kubelet's status update: admitted. A verdict reads startTime.
        (event("MODIFIED", pod_object("a", started="2026-11-30T13:59:45Z")), True,
         {"gpu-node-1": ["a"], "gpu-node-2": ["b"]}),
        # A new resourceVersion, a label: nothing a verdict reads.
        (event("MODIFIED", pod_object("a", started="2026-11-30T13:59:45Z", resource_version="301",
                                      labels={"team": "ml"})), False,
         {"gpu-node-1": ["a"], "gpu-node-2": ["b"]}),
        (bookmark("305"), False, {"gpu-node-1": ["a"], "gpu-node-2": ["b"]}),
        # The same uid seen on another node (its record is the truth): it moves.
        (event("MODIFIED", pod_object("b", node_name="gpu-node-3")), True,
         {"gpu-node-1": ["a"], "gpu-node-3": ["b"]}),
        # Finished (the field selector sends it as DELETED) or deleted: gone at once.
        (event("DELETED", pod_object("a", phase="Succeeded")), True, {"gpu-node-3": ["b"]}),
        (event("DELETED", pod_object("never-seen")), False, {"gpu-node-3": ["b"]}),
    ]  # fmt: skip
    for line, changes, expected in steps:
        before = cache.by_node()
        cache._apply(line)
        assert (cache.by_node() != before) is changes
        assert {n: names(p) for n, p in cache.by_node().items()} == expected
        # The node store holds the same pods, and judges its nodes with them.
        for name in ("gpu-node-1", "gpu-node-2", "gpu-node-3"):
            assert names(store.pods_of(name)) == expected.get(name, [])
            assert store.lookup([name])[0].pods == cache.pods_of(name)
    assert cache._resource_version == "300"  # the last event's (the bookmark's was 305)
    assert len(cache) == 1
    assert gauge(cache.metrics, "gpu_scorer_pod_cache_pods") == 1


def test_a_modified_event_that_changes_nothing_read_returns_false(cache: PodCache) -> None:
    obj = pod_object("a", started="2026-11-30T13:59:45Z", running=["2026-11-30T13:59:50Z"])
    decoded = cache._event.decode(event("MODIFIED", obj)).object
    assert cache._on_event("ADDED", decoded) is True
    obj["metadata"]["resourceVersion"] = "350"
    obj["status"]["containerStatuses"][0]["ready"] = False  # a failing readiness probe
    obj["metadata"]["labels"]["rollout"] = "2"
    assert cache._on_event("MODIFIED", cache._event.decode(event("MODIFIED", obj)).object) is False


def test_a_bookmark_advances_the_version_and_an_error_410_means_relist(cache: PodCache) -> None:
    cache._apply(event("ADDED", pod_object("a")))
    cache._apply(bookmark("420"))
    assert cache._resource_version == "420"
    assert names(cache.pods_of("gpu-node-1")) == ["a"]
    with pytest.raises(WatchExpiredError, match="too old resource version"):
        cache._apply(EXPIRED)


@pytest.mark.parametrize(
    "capture",
    [
        pytest.param("62-watch-rv1-too-old.ndjson", id="too-old"),
        pytest.param("67b-watch-rv-from-before-apiserver-restart.ndjson", id="after-restart"),
    ],
)
def test_a_real_error_410_line_means_relist(capture: str, cache: PodCache) -> None:
    """The server's own bytes (a Node watch's, the same Status for every kind): its
    `"status": "Failure"` must not make the event undecodable."""
    (line,) = (APISERVER_FIXTURES / capture).read_bytes().splitlines()
    with pytest.raises(WatchExpiredError, match="too old resource version"):
        cache._apply(line)


def test_a_relist_replaces_every_node_and_drops_the_proposals(
    cache: PodCache, store: NodeStore
) -> None:
    cache._apply(event("ADDED", pod_object("a")))
    cache.propose(_proposal("p"), ["gpu-node-2"], NOW)
    listed(cache, pod_object("b", node_name="gpu-node-3"), pod_object("cpu", gpus=0))
    assert {n: names(p) for n, p in cache.by_node().items()} == {"gpu-node-3": ["b"]}
    assert [names(store.pods_of(n)) for n in ("gpu-node-1", "gpu-node-2", "gpu-node-3")] == [
        [],
        [],
        ["b"],
    ]
    assert cache.proposals() == 0


# ----------------------------------------------------------------------------- proposals


def _proposal(name: str, *, gpus: int = 1) -> BoundPod:
    return BoundPod("default", name, f"uid-{name}", "", gpus, NOW, provisional=True)


def test_a_proposal_counts_on_each_proposed_node_until_the_pod_shows_up_bound(
    cache: PodCache, store: NodeStore
) -> None:
    cache.propose(_proposal("p"), ["gpu-node-1", "gpu-node-2"], NOW)
    assert cache.proposals() == 2
    for name in ("gpu-node-1", "gpu-node-2"):
        (proposed,) = store.pods_of(name)
        assert (proposed.name, proposed.node, proposed.provisional) == ("p", name, True)
        assert proposed.bound_at == NOW  # counted for PROVISIONAL_MAX_S from the proposal
    # Bound on a node it was not proposed on: the watch's record replaces every proposal.
    cache._apply(event("ADDED", pod_object("p", node_name="gpu-node-3")))
    assert cache.proposals() == 0
    assert [names(store.pods_of(n)) for n in ("gpu-node-1", "gpu-node-2", "gpu-node-3")] == [
        [],
        [],
        ["p"],
    ]


def test_a_proposal_confirmed_on_its_node_becomes_the_watchs_record(
    cache: PodCache, store: NodeStore
) -> None:
    cache._apply(event("ADDED", pod_object("other")))
    cache.propose(_proposal("p", gpus=2), ["gpu-node-1"], NOW)
    assert names(store.pods_of("gpu-node-1")) == ["other", "p (proposed)"]
    cache._apply(event("ADDED", pod_object("p", gpus=2)))
    assert names(store.pods_of("gpu-node-1")) == ["other", "p"]
    assert store.pods_of("gpu-node-1")[1].bound_at != NOW  # the server's PodScheduled time
    cache.propose(_proposal("p", gpus=2), ["gpu-node-2"], NOW)  # bound: nothing to propose
    assert cache.proposals() == 0
    assert names(store.pods_of("gpu-node-2")) == []


def test_forget_drops_a_pods_proposals(cache: PodCache, store: NodeStore) -> None:
    cache.propose(_proposal("p"), ["gpu-node-1", "gpu-node-2"], NOW)
    cache.propose(_proposal("q"), ["gpu-node-2"], NOW)
    cache.forget("uid-p")
    cache.forget("uid-unknown")
    assert [names(store.pods_of(n)) for n in ("gpu-node-1", "gpu-node-2")] == [[], ["q (proposed)"]]
    # Proposed again (the pod's next attempt): only the new nodes hold it.
    cache.propose(_proposal("q"), ["gpu-node-3"], NOW)
    assert [names(store.pods_of(n)) for n in ("gpu-node-2", "gpu-node-3")] == [[], ["q (proposed)"]]


def test_proposals_expire_after_the_provisional_bound(cache: PodCache, store: NodeStore) -> None:
    cache.propose(_proposal("old"), ["gpu-node-1"], NOW)
    cache.propose(_proposal("new"), ["gpu-node-2"], NOW + timedelta(seconds=PROVISIONAL_MAX_S - 1))
    assert cache.proposals() == 2
    later = NOW + timedelta(seconds=PROVISIONAL_MAX_S)
    cache.propose(_proposal("last"), ["gpu-node-3"], later)
    assert cache.proposals() == 2  # `old` went at 10 s; `new` is 1 s from its end
    assert [names(store.pods_of(n)) for n in ("gpu-node-1", "gpu-node-2", "gpu-node-3")] == [
        [],
        ["new (proposed)"],
        ["last (proposed)"],
    ]


def test_proposals_are_ignored_while_accounting_is_off(store: NodeStore) -> None:
    cache = PodCache(metrics=ScorerMetrics())
    cache.add_sink(store)
    cache.propose(_proposal("p"), ["gpu-node-1"], NOW)  # before the first LIST
    assert (cache.proposals(), store.pods_of("gpu-node-1")) == (0, ())
    listed(cache)
    cache._on_failure(_ApiError(403))
    cache.propose(_proposal("p"), ["gpu-node-1"], NOW)  # after the watch failed
    assert (cache.proposals(), store.pods_of("gpu-node-1")) == (0, ())


# ----------------------------------------------------------------------------- failures


class _ApiError(Exception):
    """Shaped like the client's `ApiException`: an HTTP status on the exception."""

    def __init__(self, status: int) -> None:
        super().__init__(f"({status}) Reason: Forbidden")
        self.status = status


@pytest.mark.parametrize(
    ("exc", "why"),
    [
        pytest.param(
            _ApiError(403),
            "the API server forbids listing pods (403): grant the scorer's service account "
            "list and watch on pods",
            id="403-names-the-missing-rbac",
        ),
        pytest.param(
            _ApiError(401), "the API server rejected the scorer's credentials (401)", id="401"
        ),
        pytest.param(
            ConnectionRefusedError("connection refused"),
            "the pod list/watch failed: ConnectionRefusedError: connection refused",
            id="connection",
        ),
    ],
)
def test_a_failure_clears_every_nodes_pods_and_turns_accounting_off(
    exc: Exception, why: str, cache: PodCache, store: NodeStore, caplog: pytest.LogCaptureFixture
) -> None:
    cache._apply(event("ADDED", pod_object("a")))
    cache._apply(event("ADDED", pod_object("b", node_name="gpu-node-2")))
    cache.propose(_proposal("p"), ["gpu-node-3"], NOW)
    assert gauge(cache.metrics, "gpu_scorer_inflight_accounting") == 1
    with caplog.at_level(logging.INFO, logger="exporter_scheduler.podcache"):
        cache._on_failure(exc)
        cache._on_failure(exc)  # still down: said once
    assert [store.pods_of(n) for n in ("gpu-node-1", "gpu-node-2", "gpu-node-3")] == [()] * 3
    assert (len(cache), cache.proposals(), cache.active) == (0, 0, False)
    assert gauge(cache.metrics, "gpu_scorer_inflight_accounting") == 0
    assert gauge(cache.metrics, "gpu_scorer_pod_cache_pods") == 0
    (record,) = caplog.records
    assert record.levelno == logging.WARNING
    assert record.getMessage().startswith("in-flight accounting off")
    assert record.__dict__["fields"] == {"why": why}
    assert cache._resource_version is None  # the next attempt lists afresh


class _ListResponse:
    def __init__(self, data: bytes) -> None:
        self.data = data

    def release_conn(self) -> None:
        pass


class _WatchResponse:
    """A watch held open by the server until the client closes it."""

    def __init__(self, lines: Sequence[bytes]) -> None:
        self.lines = lines
        self.closed = threading.Event()

    def stream(self, amt: Any = None, decode_content: bool = False) -> Iterator[bytes]:
        for line in self.lines:
            yield line + b"\n"
        self.closed.wait(WAIT_S)

    def shutdown(self) -> None:
        self.closed.set()

    def close(self) -> None:
        self.closed.set()

    def release_conn(self) -> None:
        pass


class _Api:
    """What the loop calls of `CoreV1Api`. Each LIST takes the next of `lists` (an exception
    is raised), the second one only once the test sets `answer_list`; each watch delivers the
    next of `watches` and stays open (past the last, an empty one)."""

    def __init__(self, lists: Sequence[bytes | Exception], watches: Sequence[Sequence[bytes]]):
        self.lists = list(lists)
        self.watches = list(watches)
        self.calls: list[dict[str, Any]] = []
        self.answer_list = threading.Event()
        self.listed = 0

    def list_pod_for_all_namespaces(self, **kwargs: Any) -> Any:
        self.calls.append(kwargs)
        if kwargs.get("watch"):
            return _WatchResponse(self.watches.pop(0) if self.watches else ())
        self.listed += 1
        if self.listed == 2:
            assert self.answer_list.wait(WAIT_S)
        answer = self.lists.pop(0) if len(self.lists) > 1 else self.lists[0]
        if isinstance(answer, Exception):
            raise answer
        return _ListResponse(answer)


def test_a_paged_list_keeps_each_pages_gpu_pods_before_it_reads_the_next() -> None:
    # A large cluster's LIST held decoded until its last page was the scorer's peak memory.
    pages = [
        json.loads(pod_list(pod_object("a"), pod_object("loader", gpus=0))),
        json.loads(pod_list(pod_object("b", node_name="gpu-node-2"), resource_version="500")),
    ]
    pages[0]["metadata"]["continue"] = "page-2"
    seen: list[tuple[str, object]] = []

    class _Paged:
        def list_pod_for_all_namespaces(self, **kwargs: Any) -> Any:
            seen.append(("list", kwargs.get("_continue")))
            return _ListResponse(json.dumps(pages.pop(0)).encode())

    cache = PodCache(api=_Paged(), metrics=ScorerMetrics())
    keep = cache._keep

    def recording(items: list[Any]) -> list[Any]:
        kept = keep(items)
        seen.append(("keep", [pod.name for pod in kept]))
        return kept

    cache._keep = recording  # type: ignore[method-assign]
    cache._relist()
    assert seen == [("list", None), ("keep", ["a"]), ("list", "page-2"), ("keep", ["b"])]
    assert names(cache.pods_of("gpu-node-1")) == ["a"]
    assert names(cache.pods_of("gpu-node-2")) == ["b"]
    assert len(cache) == 2
    assert cache._resource_version == "500"


def test_the_loop_turns_accounting_on_with_the_first_list_that_succeeds(
    store: NodeStore, caplog: pytest.LogCaptureFixture
) -> None:
    api = _Api(
        [_ApiError(403), pod_list(pod_object("a"))],
        [[event("ADDED", pod_object("b", node_name="gpu-node-2", resource_version="301"))]],
    )
    metrics = ScorerMetrics()
    off = "in-flight accounting off: verdicts read the nodes' annotations alone"
    caplog.set_level(logging.INFO, logger="exporter_scheduler.podcache")
    with PodCache(api=api, metrics=metrics, tuning=FAST) as cache:
        cache.add_sink(store)
        assert cache.wait_until(
            lambda _: any(r.getMessage() == off for r in caplog.records), WAIT_S
        )
        assert gauge(metrics, "gpu_scorer_inflight_accounting") == 0
        assert gauge(metrics, "gpu_scorer_pod_cache_ready") == 0
        assert not cache.active
        api.answer_list.set()
        assert cache.wait_until(lambda c: c.active and bool(c.pods_of("gpu-node-2")), WAIT_S)
        assert gauge(metrics, "gpu_scorer_inflight_accounting") == 1
        assert gauge(metrics, "gpu_scorer_pod_cache_ready") == 1
        assert gauge(metrics, "gpu_scorer_pod_cache_relists_total") == 1
        assert gauge(metrics, "gpu_scorer_pod_cache_watch_restarts_total", '{cause="error"}') == 1
        assert names(store.pods_of("gpu-node-1")) == ["a"]
        assert names(store.pods_of("gpu-node-2")) == ["b"]
    # Every call narrows to bound, unfinished pods on the server; the watch resumes at the
    # list's version.
    assert {call["field_selector"] for call in api.calls} == {FIELD_SELECTOR}
    watch = next(call for call in api.calls if call.get("watch"))
    assert watch["resource_version"] == "290"
    assert watch["allow_watch_bookmarks"] is True
    messages = [r.getMessage() for r in caplog.records]
    assert messages.index(off) < messages.index("in-flight accounting on")
    on = next(r for r in caplog.records if r.getMessage() == "in-flight accounting on")
    assert on.__dict__["fields"] == {"why": "pod watch synced"}


# ----------------------------------------------------------------------------- the app


def _body(
    name: str, *, gpus: int = 1, hints: dict[str, str] | None = None, nodes: Sequence[str]
) -> bytes:
    pod = {
        "metadata": {
            "name": name,
            "namespace": "default",
            "uid": f"uid-{name}",
            "annotations": {PREFIX + k: v for k, v in (hints or {}).items()},
        },
        "spec": {
            "containers": [
                {"name": "main", "resources": {"requests": {"nvidia.com/gpu": str(gpus)}}}
            ]
        },
    }
    return json.dumps({"Pod": pod, "Nodes": None, "NodeNames": list(nodes)}).encode()


NODES = ("cool", "warm", "busy")


@pytest.fixture
def app_and_cache() -> tuple[ScorerApp, PodCache]:
    """A names-only scorer whose decisions are recorded in its pod cache, as `serve` wires it."""
    nodes = NodeStore(clock=lambda: NOW)
    nodes.replace(
        [
            node("cool", utilization=0.10),
            node("warm", utilization=0.40),
            node("busy", utilization=0.70),
            *(node(f"same-{i}", utilization=0.30) for i in range(4)),
        ]
    )
    pods = PodCache(metrics=ScorerMetrics())
    pods.add_sink(nodes)
    listed(pods)
    app = ScorerApp(policy=Policy(), clock=lambda: NOW, node_store=nodes, placements=pods)
    return app, pods


def _proposed(cache: PodCache) -> dict[str, list[str]]:
    return {n: names(p) for n, p in cache.by_node().items()}


def _inflight_on(app: ScorerApp, body: bytes) -> dict[str, list[tuple[str, bool]]]:
    explained = json.loads(app.handle("explain", body).body)
    return {
        n["name"]: [(p["pod"], p["provisional"]) for p in n["inflight"]["pods"]]
        for n in explained["nodes"]
        if n["inflight"] is not None
    }


def test_a_prioritize_proposes_the_pod_on_its_top_node_and_the_next_pod_sees_it(
    app_and_cache: tuple[ScorerApp, PodCache],
) -> None:
    app, cache = app_and_cache
    assert json.loads(app.handle("filter", _body("p", nodes=NODES)).body)["NodeNames"] == [*NODES]
    assert _proposed(cache) == {}  # three passed: the scheduler scores them
    scores = json.loads(app.handle("prioritize", _body("p", nodes=NODES)).body)
    assert max(scores, key=lambda s: s["Score"])["Host"] == "cool"
    assert _proposed(cache) == {"cool": ["p (proposed)"]}
    # The next pod's filter, before p's bind is in the watch: p holds its GPU on `cool`.
    q = _body("q", gpus=4, nodes=NODES)
    app.handle("filter", q)
    assert _inflight_on(app, q) == {"cool": [("default/p", True)]}
    q_scores = {s["Host"]: s["Score"] for s in json.loads(app.handle("prioritize", q).body)}
    cool_without_p = {s["Host"]: s["Score"] for s in scores}["cool"]
    assert q_scores["cool"] < cool_without_p
    # p filtered again: its bind did not happen, its proposal is forgotten (q's is kept).
    app.handle("filter", _body("p", nodes=NODES))
    assert _proposed(cache) == {"cool": ["q (proposed)"]}


def test_a_filter_that_passes_one_node_proposes_the_pod_there(
    app_and_cache: tuple[ScorerApp, PodCache],
) -> None:
    app, cache = app_and_cache
    tight = {"max-utilization": "0.20"}
    reply = json.loads(app.handle("filter", _body("p", hints=tight, nodes=NODES)).body)
    assert reply["NodeNames"] == ["cool"]
    assert _proposed(cache) == {"cool": ["p (proposed)"]}


@pytest.mark.parametrize(
    ("body", "proposed"),
    [
        pytest.param(
            _body("p", hints={"max-utilization": "high"}, nodes=NODES), {}, id="hint-error"
        ),
        pytest.param(
            _body("p", hints={"expected-gpu-load": "2"}, nodes=NODES), {}, id="load-hint-error"
        ),
        pytest.param(_body("p", gpus=0, nodes=NODES), {}, id="no-gpus"),
        pytest.param(
            _body("p", nodes=[f"same-{i}" for i in range(4)]), {}, id="four-share-the-top-score"
        ),
        pytest.param(
            _body("p", nodes=[f"same-{i}" for i in range(3)]),
            {f"same-{i}": ["p (proposed)"] for i in range(3)},
            id="three-share-the-top-score",
        ),
        pytest.param(
            _body("p", hints={"max-utilization": "0.05"}, nodes=NODES), {}, id="nothing-passed"
        ),
    ],
)
def test_which_prioritize_proposes_nothing(
    body: bytes, proposed: dict[str, list[str]], app_and_cache: tuple[ScorerApp, PodCache]
) -> None:
    app, cache = app_and_cache
    app.handle("filter", body)
    app.handle("prioritize", body)
    assert _proposed(cache) == proposed


def test_the_loop_relists_after_an_error_410_in_the_watch(store: NodeStore) -> None:
    """A watch from a version the server no longer holds: the LIST after it replaces the pods
    (a pod deleted meanwhile is gone, one bound meanwhile is there)."""
    api = _Api(
        [pod_list(pod_object("gone")), pod_list(pod_object("new"), resource_version="500")],
        [[EXPIRED]],
    )
    api.answer_list.set()
    metrics = ScorerMetrics()
    with PodCache(api=api, metrics=metrics, tuning=FAST) as cache:
        cache.add_sink(store)
        assert cache.wait_until(lambda c: names(c.pods_of("gpu-node-1")) == ["new"], WAIT_S)
        assert names(store.pods_of("gpu-node-1")) == ["new"]
        assert cache.active
        assert gauge(metrics, "gpu_scorer_pod_cache_relists_total") == 2
        restarts = "gpu_scorer_pod_cache_watch_restarts_total"
        assert gauge(metrics, restarts, '{cause="expired"}') == 1
    assert [c.get("resource_version") for c in api.calls if c.get("watch")][:2] == ["290", "500"]


class _ClosingApi(_Api):
    """A server (or a proxy in front of it) that ends every watch as soon as it opens."""

    def list_pod_for_all_namespaces(self, **kwargs: Any) -> Any:
        if kwargs.get("watch"):
            self.calls.append(kwargs)
            response = _WatchResponse(())
            response.closed.set()
            return response
        return super().list_pod_for_all_namespaces(**kwargs)


def test_watches_that_end_at_once_are_reopened_with_back_off_not_in_a_spin() -> None:
    api = _ClosingApi([pod_list(pod_object("a"))], [])
    # Back-off 0.2 s doubling to 0.4 s: in 1 s a spinning loop would open thousands.
    tuning = CacheTuning(watch_timeout_s=30, backoff_initial_s=0.2, backoff_max_s=0.4)

    def watches() -> int:
        return sum(1 for c in api.calls if c.get("watch"))

    with PodCache(api=api, metrics=ScorerMetrics(), tuning=tuning) as cache:
        assert cache.wait_until(lambda c: c.active, WAIT_S)
        started = time.monotonic()
        first = watches()
        deadline = started + WAIT_S
        while watches() < first + 2 and time.monotonic() < deadline:
            time.sleep(0.01)  # polling for the loop's next two watches, not timing a decision
        elapsed_s = time.monotonic() - started
        assert watches() >= first + 2
        # The second back-off alone waits at least half of its 0.4 s; a spin would take ~0.
        assert elapsed_s >= 0.15
        assert cache.pods_of("gpu-node-1")  # the pods listed are kept: nothing failed
