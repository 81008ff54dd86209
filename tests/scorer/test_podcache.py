"""The Pod watch: bound and nominated GPU pods by node, the scorer's own proposals, and
accounting on or off.

The cache runs as the scorer runs it: its own two list + watch loops (the bound pods, the
nominated ones), the real `kubernetes` client, real HTTP to the API server stand-in
(`kube_standins.apiserver`), which serves Pods as a kube-apiserver v1.36 does (the field
selectors applied to lists and to watch events, BOOKMARKs, the `ERROR` 410 event, faults on
demand, told apart by field selector). Pods are written into the stand-in; the tests wait, with a
deadline, for the cache to show what they expect. Where a change must leave the cache as it was,
sentinel pods written after it are the barrier: each watch delivers in order, so once both
watches' sentinels are seen, every earlier change has been applied. The two watches are not
ordered with each other; where a test needs one order, the stand-in holds the other watch.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import platform
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import msgspec
import pytest

from exporter_scheduler.core.inflight import PROVISIONAL_MAX_S, BoundPod
from exporter_scheduler.core.policy import Policy
from exporter_scheduler.edges import listwatch, podcache, podobjects
from exporter_scheduler.edges.listwatch import CacheTuning
from exporter_scheduler.edges.pagereader import PageReader
from exporter_scheduler.edges.podcache import (
    FIELD_SELECTOR,
    NOMINATED_FIELD_SELECTOR,
    PodCache,
    PodsByNode,
)
from exporter_scheduler.serving import app as app_module
from exporter_scheduler.serving.app import ScorerApp
from exporter_scheduler.serving.metrics import ScorerMetrics
from exporter_scheduler.serving.nodestore import NodeStore
from kube_standins.apiserver import ApiServerStandIn, Fault, RecordedRequest
from tests.scorer.scoring_builders import NOW, PREFIX, node

WAIT_S = 10.0
FAST = CacheTuning(watch_timeout_s=30, backoff_initial_s=0.01, backoff_max_s=0.05)
CREATED = "2026-11-30T13:59:40Z"
SCHEDULED = "2026-11-30T13:59:41Z"
PODS_PATH = "/api/v1/pods"
SENTINEL_NODE = "sentinel-node"


# ----------------------------------------------------------------------------- pods


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
    nominated: str | None = None,
) -> dict[str, Any]:
    """A Pod as the v1.36 API server serializes it (hand-written): `running` gives, per
    container, its `state.running.startedAt` (None: waiting); `nominated`, its
    `status.nominatedNodeName`."""
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
    if nominated is not None:
        status["nominatedNodeName"] = nominated
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


def waiting(name: str, node: str, **fields: Any) -> dict[str, Any]:
    """A pod kube-scheduler nominated to `node` and has not bound (waiting at Permit or in
    PreBind): no `spec.nodeName`, no `PodScheduled: True`."""
    return pod_object(name, node_name=None, scheduled=None, nominated=node, **fields)


def names(pods: Sequence[BoundPod]) -> list[str]:
    return [
        p.name + (" (proposed)" if p.provisional else " (nominated)" if p.nominated else "")
        for p in pods
    ]


def gauge(metrics: ScorerMetrics, name: str, labels: str = "") -> float:
    for line in metrics.render()[0].decode().splitlines():
        if line.startswith(f"{name}{labels} "):
            return float(line.split()[-1])
    raise AssertionError(f"{name}{labels} not exported")


def by_node(cache: PodCache) -> dict[str, list[str]]:
    return {n: names(p) for n, p in cache.by_node().items()}


def caught_up(standin: ApiServerStandIn, cache: PodCache) -> None:
    """Return once every change written to `standin` so far has reached `cache` through both
    of its watches (a bound sentinel for one, a nominated one for the other; accounting on)."""
    standin.put_pod(pod_object("sentinel", node_name=SENTINEL_NODE))
    standin.put_pod(waiting("sentinel-nominated", SENTINEL_NODE))
    both = ["sentinel", "sentinel-nominated (nominated)"]
    assert cache.wait_until(lambda c: names(c.pods_of(SENTINEL_NODE)) == both, WAIT_S)
    standin.delete_pod("default", "sentinel")
    standin.delete_pod("default", "sentinel-nominated")
    assert cache.wait_until(lambda c: not c.pods_of(SENTINEL_NODE), WAIT_S)


def listed(cache: PodCache) -> bool:
    """Both watches have listed: accounting is on, and the nominations are the server's."""
    return cache.active and gauge(cache.metrics, "gpu_scorer_nominated_pod_cache_ready") == 1


def bound_watch(r: RecordedRequest) -> bool:
    """A request of the bound pods' list + watch."""
    return r.path == PODS_PATH and r.param("fieldSelector") == FIELD_SELECTOR


def nomination_watch(r: RecordedRequest) -> bool:
    """A request of the nominated pods' list + watch."""
    return r.path == PODS_PATH and r.param("fieldSelector") == NOMINATED_FIELD_SELECTOR


def recorded(
    standin: ApiServerStandIn, count: int, match: Callable[[RecordedRequest], bool]
) -> list[RecordedRequest]:
    """The requests `match` accepts, once there are at least `count` (a watch is recorded
    when it opens, which the cache does not signal)."""
    deadline = time.monotonic() + WAIT_S
    while len(found := [r for r in standin.requests if match(r)]) < count:
        if time.monotonic() > deadline:
            raise AssertionError(f"{len(found)} matching requests, not {count}: {found}")
        time.sleep(0.01)
    return found


class Published:
    """A sink that records what every sink is told, in order: the states a wait may miss."""

    def __init__(self) -> None:
        self.told: list[tuple[str, list[str]]] = []

    def set_pods(self, name: str, pods: tuple[BoundPod, ...]) -> bool:
        self.told.append((name, names(pods)))
        return True

    def replace_pods(self, pods: PodsByNode) -> None:
        self.told.append(("(all)", sorted(f"{n}: {', '.join(names(p))}" for n, p in pods.items())))

    def since(self, start: int) -> list[tuple[str, list[str]]]:
        """What was told after the first `start` records, less the sentinels' node."""
        return [t for t in self.told[start:] if t[0] != SENTINEL_NODE]


def wait_pods(cache: PodCache, expected: dict[str, list[str]]) -> None:
    """Until the cache holds exactly `expected` (node -> pod names); fail with what it holds."""
    if not cache.wait_until(lambda c: by_node(c) == expected, WAIT_S):
        raise AssertionError(f"the cache holds {by_node(cache)}, not {expected}")


@pytest.fixture
def standin() -> Iterator[ApiServerStandIn]:
    with ApiServerStandIn(bookmark_interval_s=0.05) as server:
        yield server


@pytest.fixture
def kubeconfig(standin: ApiServerStandIn, tmp_path: Path) -> str:
    return str(standin.write_kubeconfig(tmp_path / "kubeconfig"))


@pytest.fixture
def store() -> NodeStore:
    nodes = NodeStore(clock=lambda: NOW)
    nodes.replace([node("gpu-node-1"), node("gpu-node-2"), node("gpu-node-3")])
    return nodes


@pytest.fixture
def cache(kubeconfig: str, store: NodeStore) -> Iterator[PodCache]:
    """A running pod cache after the first (empty) LIST of each of its watches, feeding `store`."""
    with PodCache(kubeconfig=kubeconfig, metrics=ScorerMetrics(), tuning=FAST) as pods:
        pods.add_sink(store)
        assert pods.wait_until(listed, WAIT_S)
        yield pods


# ----------------------------------------------------------------------------- what is kept

DECODED = [
    pytest.param(
        pod_object("p", gpus=0), None, id="no-gpu-resource-dropped",
    ),
    pytest.param(
        pod_object("p", node_name=None), None, id="not-bound-left-out-by-the-field-selector",
    ),
    pytest.param(
        pod_object("p", phase="Succeeded"), None, id="finished-left-out-by-the-field-selector",
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
    pytest.param(
        pod_object("p", nominated="gpu-node-2"), {"node": "gpu-node-1", "nominated": False},
        id="bound-and-still-nominated-elsewhere-bound-wins",
    ),
]  # fmt: skip


@pytest.mark.parametrize(("obj", "expected"), DECODED)
def test_what_the_watch_keeps_of_a_pod(
    obj: dict[str, Any],
    expected: dict[str, Any] | None,
    standin: ApiServerStandIn,
    cache: PodCache,
) -> None:
    standin.put_pod(obj)
    caught_up(standin, cache)
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


def test_the_initial_list_pages_and_keeps_only_bound_unfinished_gpu_pods(
    standin: ApiServerStandIn, kubeconfig: str, store: NodeStore
) -> None:
    for i in range(5):
        standin.put_pod(pod_object(f"bound-{i}", node_name=f"gpu-node-{i % 3 + 1}"))
    standin.put_pod(pod_object("pending", node_name=None))
    standin.put_pod(pod_object("done", phase="Failed"))
    standin.put_pod(pod_object("cpu", gpus=0))
    paged = CacheTuning(watch_timeout_s=30, list_page_size=2, backoff_initial_s=0.01)
    with PodCache(kubeconfig=kubeconfig, metrics=ScorerMetrics(), tuning=paged) as cache:
        cache.add_sink(store)
        assert cache.wait_until(listed, WAIT_S)
        assert by_node(cache) == {
            "gpu-node-1": ["bound-0", "bound-3"],
            "gpu-node-2": ["bound-1", "bound-4"],
            "gpu-node-3": ["bound-2"],
        }
        assert names(store.pods_of("gpu-node-1")) == ["bound-0", "bound-3"]
    lists = [r for r in standin.requests if bound_watch(r) and r.param("watch") is None]
    # Five bound GPU pods and the CPU-only one pass the selector: three pages of two.
    assert [r.param("continue") is not None for r in lists] == [False, True, True]
    # Every call narrows on the server: to bound, unfinished pods, or (the other watch) to
    # unbound nominated ones, of which there are none here (one page).
    assert {r.param("fieldSelector") for r in standin.requests if r.path == PODS_PATH} == {
        FIELD_SELECTOR,
        NOMINATED_FIELD_SELECTOR,
    }
    nominated_lists = [r for r in standin.requests if nomination_watch(r) and not r.param("watch")]
    assert [r.param("continue") for r in nominated_lists] == [None]


def test_the_heap_is_trimmed_after_each_list(
    standin: ApiServerStandIn, kubeconfig: str, store: NodeStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """glibc keeps the heap a LIST's pages used unless asked to hand it back: each completed
    LIST asks (`malloc_trim(0)`), once it has kept what it keeps."""
    assert (listwatch._malloc_trim() is not None) == (platform.libc_ver()[0] == "glibc")
    trims: list[int] = []

    def trim(pad: int) -> int:
        trims.append(pad)
        return 1

    monkeypatch.setattr(listwatch, "_TRIM", trim)
    standin.put_pod(pod_object("a"))
    with PodCache(kubeconfig=kubeconfig, metrics=ScorerMetrics(), tuning=FAST) as cache:
        cache.add_sink(store)
        assert cache.wait_until(listed, WAIT_S)
        relists = gauge(cache.metrics, "gpu_scorer_pod_cache_relists_total")
        relists += gauge(cache.metrics, "gpu_scorer_nominated_pod_cache_relists_total")
        assert trims == [0] * int(relists)
        assert relists == 2  # one LIST each of the two watches


def test_the_bound_pods_list_is_read_by_the_page_reader(
    standin: ApiServerStandIn, kubeconfig: str, store: NodeStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The LIST of every bound pod, the largest there is, is read by `PageReader` (a connection
    of its own, read in batches); the nominated pods' LIST, a few pods, and the watches by the
    client."""
    read: list[tuple[str, dict[str, Any]]] = []
    get = PageReader.get

    def recorded(self: PageReader, path: str, query: Any) -> bytes | bytearray:
        read.append((path, dict(query)))
        return get(self, path, query)

    monkeypatch.setattr(PageReader, "get", recorded)
    for i in range(3):
        standin.put_pod(pod_object(f"bound-{i}"))
    paged = CacheTuning(watch_timeout_s=30, list_page_size=2, backoff_initial_s=0.01)
    with PodCache(kubeconfig=kubeconfig, metrics=ScorerMetrics(), tuning=paged) as cache:
        cache.add_sink(store)
        assert cache.wait_until(listed, WAIT_S)
        assert by_node(cache) == {"gpu-node-1": ["bound-0", "bound-1", "bound-2"]}
    assert [path for path, _ in read] == [PODS_PATH, PODS_PATH]
    assert [q["fieldSelector"] for _, q in read] == [FIELD_SELECTOR, FIELD_SELECTOR]
    assert ["continue" in q for _, q in read] == [False, True]
    assert {q["limit"] for _, q in read} == {2}


def test_a_list_reads_the_spec_only_of_pods_that_name_the_resource_as_a_key(
    kubeconfig: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Most pods of a large cluster ask for no GPU: a raw Pod of a LIST page without the
    resource name as a key (requests and limits are keyed by it) is dropped unread, though it
    tolerates the GPU taint and selects GPU nodes; one with a key that ends the same way (a
    label) is read for its spec, and dropped for it. The name with its `/` escaped, as JSON
    allows, still counts."""
    cpu = pod_object("cpu", gpus=0)
    cpu["spec"]["tolerations"] = [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    ]
    cpu["spec"]["nodeSelector"] = {"nvidia.com/gpu.present": "true"}
    pods = [
        pod_object("gpu"),
        cpu,
        pod_object("cpu-labelled", gpus=0, labels={"example.com/gpu": "yes"}),
        pod_object("init-gpus", gpus=0, init_gpus=2),
    ]
    items = [json.dumps(p, separators=(",", ":")).encode() for p in pods]
    escaped = json.dumps(pod_object("gpu-escaped"), separators=(",", ":")).encode()
    items.append(escaped.replace(b'"nvidia.com/gpu"', b'"nvidia.com\\/gpu"'))
    page = b'{"metadata":{},"items":[' + b",".join(items) + b"]}"
    read: list[bytes] = []
    placement = podobjects.PLACEMENT

    class Counted:
        def decode(self, raw: msgspec.Raw) -> Any:
            read.append(bytes(raw))
            return placement.decode(raw)

    monkeypatch.setattr(podcache, "PLACEMENT", Counted())
    cache = PodCache(kubeconfig=kubeconfig, metrics=ScorerMetrics())
    kept = cache._keep(podobjects.PAGE.decode(page).items or [])
    assert sorted((p.name, p.gpus) for p in kept) == [
        ("gpu", 1),
        ("gpu-escaped", 1),
        ("init-gpus", 2),
    ]
    assert len(read) == 4  # all but "cpu"
    assert not any(b'"name":"cpu"' in raw for raw in read)


# ----------------------------------------------------------------------------- events


def test_events_keep_each_nodes_pods_in_the_sink(
    standin: ApiServerStandIn, cache: PodCache, store: NodeStore
) -> None:
    started = "2026-11-30T13:59:45Z"
    steps: list[tuple[str, dict[str, Any] | str, bool, dict[str, list[str]]]] = [
        ("put", pod_object("a"), True, {"gpu-node-1": ["a"]}),
        ("put", pod_object("cpu-only", gpus=0), False, {"gpu-node-1": ["a"]}),
        ("put", pod_object("b", node_name="gpu-node-2"), True,
         {"gpu-node-1": ["a"], "gpu-node-2": ["b"]}),
        # The kubelet's status update: admitted. A verdict reads startTime.
        ("put", pod_object("a", started=started), True,
         {"gpu-node-1": ["a"], "gpu-node-2": ["b"]}),
        # A label: nothing a verdict reads.
        ("put", pod_object("a", started=started, labels={"team": "ml"}), False,
         {"gpu-node-1": ["a"], "gpu-node-2": ["b"]}),
        # The same uid seen on another node (its record is the truth): it moves.
        ("put", pod_object("b", node_name="gpu-node-3"), True,
         {"gpu-node-1": ["a"], "gpu-node-3": ["b"]}),
        # Finished: it leaves the field selector, and the server sends it as DELETED.
        ("put", pod_object("a", phase="Succeeded"), True, {"gpu-node-3": ["b"]}),
        # Deleted, never kept (no GPU): nothing changes.
        ("delete", "cpu-only", False, {"gpu-node-3": ["b"]}),
        ("delete", "b", True, {}),
    ]  # fmt: skip
    for action, target, changes, expected in steps:
        before = {n: p for n, p in cache.by_node().items() if n != SENTINEL_NODE}
        if action == "put":
            assert isinstance(target, dict)
            standin.put_pod(target)
        else:
            standin.delete_pod("default", str(target))
        caught_up(standin, cache)
        assert (cache.by_node() != before) is changes, (action, target)
        assert by_node(cache) == expected
        # The node store holds the same pods, and judges its nodes with them.
        for name in ("gpu-node-1", "gpu-node-2", "gpu-node-3"):
            assert names(store.pods_of(name)) == expected.get(name, [])
            assert store.lookup([name])[0].pods == cache.pods_of(name)
    assert len(cache) == 0
    assert gauge(cache.metrics, "gpu_scorer_pod_cache_pods") == 0


def test_a_change_that_no_verdict_reads_is_not_applied(
    standin: ApiServerStandIn, cache: PodCache
) -> None:
    obj = pod_object("a", started="2026-11-30T13:59:45Z", running=["2026-11-30T13:59:50Z"])
    standin.put_pod(obj)
    caught_up(standin, cache)
    kept = cache.pods_of("gpu-node-1")
    applied = "gpu_scorer_pod_cache_event_seconds_count"
    before = gauge(cache.metrics, applied)
    obj["status"]["containerStatuses"][0]["ready"] = False  # a failing readiness probe
    obj["metadata"]["labels"]["rollout"] = "2"
    standin.put_pod(obj)
    caught_up(standin, cache)
    # Only the sentinel's two events were applied; the pod's record is the same object.
    assert gauge(cache.metrics, applied) == before + 2
    assert cache.pods_of("gpu-node-1") is kept


def test_an_error_410_relists_replacing_every_node_and_dropping_the_proposals(
    standin: ApiServerStandIn, cache: PodCache, store: NodeStore
) -> None:
    """A watch from a version the server no longer holds (an API server restart): the LIST
    after it replaces the pods, and the scorer's proposals, which no watch can confirm now."""
    standin.put_pod(pod_object("a"))
    wait_pods(cache, {"gpu-node-1": ["a"]})
    cache.propose(_proposal("p"), ["gpu-node-2"], NOW)
    standin.expire_watches()
    standin.put_pod(pod_object("b", node_name="gpu-node-3"))
    standin.delete_pod("default", "a")
    relists = "gpu_scorer_pod_cache_relists_total"
    assert cache.wait_until(lambda c: gauge(c.metrics, relists) == 2, WAIT_S)
    wait_pods(cache, {"gpu-node-3": ["b"]})
    assert cache.proposals() == 0
    assert [names(store.pods_of(n)) for n in ("gpu-node-1", "gpu-node-2", "gpu-node-3")] == [
        [],
        [],
        ["b"],
    ]
    restarts = "gpu_scorer_pod_cache_watch_restarts_total"
    assert gauge(cache.metrics, restarts, '{cause="expired"}') == 1
    assert cache.active
    # The nomination watch expired with it and relisted too.
    nominated_relists = "gpu_scorer_nominated_pod_cache_relists_total"
    assert cache.wait_until(lambda c: gauge(c.metrics, nominated_relists) == 2, WAIT_S)
    # Each watch resumes at the version of the list before it, with bookmarks.
    watches = recorded(standin, 2, lambda r: bound_watch(r) and bool(r.param("watch")))
    assert {r.param("allowWatchBookmarks") for r in watches} == {"True"}  # the client's spelling
    assert len({r.param("resourceVersion") for r in watches}) == 2


# ----------------------------------------------------------------------------- proposals


def _proposal(name: str, *, gpus: int = 1) -> BoundPod:
    return BoundPod("default", name, f"uid-{name}", "", gpus, NOW, provisional=True)


def test_a_proposal_counts_on_each_proposed_node_until_the_pod_shows_up_bound(
    standin: ApiServerStandIn, cache: PodCache, store: NodeStore
) -> None:
    cache.propose(_proposal("p"), ["gpu-node-1", "gpu-node-2"], NOW)
    assert cache.proposals() == 2
    for name in ("gpu-node-1", "gpu-node-2"):
        (proposed,) = store.pods_of(name)
        assert (proposed.name, proposed.node, proposed.provisional) == ("p", name, True)
        assert proposed.bound_at == NOW  # counted for PROVISIONAL_MAX_S from the proposal
    # Bound on a node it was not proposed on: the watch's record replaces every proposal.
    standin.put_pod(pod_object("p", node_name="gpu-node-3"))
    wait_pods(cache, {"gpu-node-3": ["p"]})
    assert cache.proposals() == 0
    assert [names(store.pods_of(n)) for n in ("gpu-node-1", "gpu-node-2", "gpu-node-3")] == [
        [],
        [],
        ["p"],
    ]


def test_a_proposal_confirmed_on_its_node_becomes_the_watchs_record(
    standin: ApiServerStandIn, cache: PodCache, store: NodeStore
) -> None:
    standin.put_pod(pod_object("other"))
    wait_pods(cache, {"gpu-node-1": ["other"]})
    cache.propose(_proposal("p", gpus=2), ["gpu-node-1"], NOW)
    assert names(store.pods_of("gpu-node-1")) == ["other", "p (proposed)"]
    standin.put_pod(pod_object("p", gpus=2))
    wait_pods(cache, {"gpu-node-1": ["other", "p"]})
    assert names(store.pods_of("gpu-node-1")) == ["other", "p"]
    assert store.pods_of("gpu-node-1")[1].bound_at != NOW  # the server's PodScheduled time
    cache.propose(_proposal("p", gpus=2), ["gpu-node-2"], NOW)  # bound: nothing to propose
    assert cache.proposals() == 0
    assert names(store.pods_of("gpu-node-2")) == []


def test_a_bind_where_the_pod_was_proposed_publishes_each_node_once(
    standin: ApiServerStandIn, cache: PodCache
) -> None:
    """Each publish judges its node again for every pod class, holding the GIL that requests
    wait for: the proposals leave in the publish that brings the pod's record, and no request
    sees the node with neither."""
    sink = Published()
    cache.add_sink(sink)
    cache.propose(_proposal("p"), ["gpu-node-1", "gpu-node-2"], NOW)
    start = len(sink.told)
    standin.put_pod(pod_object("p", node_name="gpu-node-1"))
    wait_pods(cache, {"gpu-node-1": ["p"]})
    assert sorted(sink.since(start)) == [("gpu-node-1", ["p"]), ("gpu-node-2", [])]


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


def test_proposals_are_ignored_while_accounting_is_off(
    standin: ApiServerStandIn, kubeconfig: str, store: NodeStore
) -> None:
    cache = PodCache(kubeconfig=kubeconfig, metrics=ScorerMetrics(), tuning=FAST)
    cache.add_sink(store)
    cache.propose(_proposal("p"), ["gpu-node-1"], NOW)  # before the first LIST
    assert (cache.proposals(), store.pods_of("gpu-node-1")) == (0, ())
    standin.inject(Fault(403, method="GET", path_contains=PODS_PATH, times=1_000))
    restarts = "gpu_scorer_pod_cache_watch_restarts_total"
    with cache:
        assert cache.wait_until(
            lambda c: gauge(c.metrics, restarts, '{cause="error"}') >= 1, WAIT_S
        )
        cache.propose(_proposal("p"), ["gpu-node-1"], NOW)  # the list is forbidden
        assert (cache.proposals(), store.pods_of("gpu-node-1")) == (0, ())


# ----------------------------------------------------------------------------- nominations

NOMINATED_DECODED = [
    pytest.param(
        waiting("p", "gpu-node-2", gpus=4),
        {"node": "gpu-node-2", "gpus": 4, "bound_at": None, "nominated": True},
        id="waiting-unbound-counts-on-the-nominated-node-with-no-time-bound",
    ),
    pytest.param(
        waiting("p", "gpu-node-2", annotations={PREFIX + "expected-gpu-load": "0.5"}),
        {"gpu_load_bp": 5000, "nominated": True}, id="hints-kept",
    ),
    pytest.param(waiting("p", "gpu-node-2", gpus=0), None, id="no-gpu-resource-dropped"),
    pytest.param(
        pod_object("p", node_name=None, scheduled=None), None,
        id="not-nominated-left-out-by-the-field-selector",
    ),
    pytest.param(
        waiting("p", ""), None, id="nomination-cleared-left-out-by-the-field-selector"
    ),
    pytest.param(
        waiting("p", "gpu-node-2", phase="Failed"), None,
        id="finished-left-out-by-the-field-selector",
    ),
    pytest.param(
        # The bound watch's, not this one's (`bound-and-still-nominated-elsewhere-bound-wins`).
        pod_object("p", nominated="gpu-node-2"), None, id="bound-left-out-by-the-field-selector",
    ),
]  # fmt: skip


@pytest.mark.parametrize(("obj", "expected"), NOMINATED_DECODED)
def test_what_the_nomination_watch_keeps_of_a_pod(
    obj: dict[str, Any],
    expected: dict[str, Any] | None,
    standin: ApiServerStandIn,
    cache: PodCache,
) -> None:
    standin.put_pod(obj)
    caught_up(standin, cache)
    kept = [p for pods in cache.by_node().values() for p in pods if p.nominated]
    if expected is None:
        assert (kept, cache.nominations()) == ([], 0)
        return
    (pod,) = kept
    fields = msgspec.structs.asdict(pod)
    assert {k: fields[k] for k in expected} == expected
    assert (pod.ref, pod.provisional, cache.nominations()) == ("default/p", False, 1)


Write = dict[str, Any] | str  # a pod put, or the name of one deleted

# Each step: which watch delivers the writes first ("bound" or "nominated", the other held until
# it has; None: either), each node's pods once that one has (None: no order), and once both have.
NOMINATION_STEPS: list[
    tuple[str | None, list[Write], dict[str, list[str]] | None, dict[str, list[str]]]
] = [
    (None, [waiting("a", "gpu-node-1")], None, {"gpu-node-1": ["a (nominated)"]}),
    (None, [pod_object("x")], None, {"gpu-node-1": ["a (nominated)", "x"]}),
    # Nominated elsewhere (preemption picked another node): it moves.
    (None, [waiting("a", "gpu-node-3")], None,
     {"gpu-node-1": ["x"], "gpu-node-3": ["a (nominated)"]}),
    # Bound where nominated, and the bound watch says so first: the bound record replaces it;
    # then the nomination watch drops it (it left that selection by being bound): no change.
    ("bound", [pod_object("a", node_name="gpu-node-3")],
     {"gpu-node-1": ["x"], "gpu-node-3": ["a"]}, {"gpu-node-1": ["x"], "gpu-node-3": ["a"]}),
    (None, [waiting("b", "gpu-node-2")], None,
     {"gpu-node-1": ["x"], "gpu-node-2": ["b (nominated)"], "gpu-node-3": ["a"]}),
    # A late nomination line (nominated elsewhere just before the bind) for a pod already seen
    # bound changes nothing.
    ("bound", [waiting("b", "gpu-node-1"), pod_object("b", node_name="gpu-node-2")],
     {"gpu-node-1": ["x"], "gpu-node-2": ["b"], "gpu-node-3": ["a"]},
     {"gpu-node-1": ["x"], "gpu-node-2": ["b"], "gpu-node-3": ["a"]}),
    (None, [waiting("c", "gpu-node-2")], None,
     {"gpu-node-1": ["x"], "gpu-node-2": ["b", "c (nominated)"], "gpu-node-3": ["a"]}),
    # The other order: the nomination watch drops it first, the bound one shows it after.
    ("nominated", [pod_object("c", node_name="gpu-node-2")],
     {"gpu-node-1": ["x"], "gpu-node-2": ["b"], "gpu-node-3": ["a"]},
     {"gpu-node-1": ["x"], "gpu-node-2": ["b", "c"], "gpu-node-3": ["a"]}),
    # Nomination cleared (the gang timed out at Permit) or the pod deleted: gone at once.
    (None, [waiting("d", "gpu-node-1")], None,
     {"gpu-node-1": ["d (nominated)", "x"], "gpu-node-2": ["b", "c"], "gpu-node-3": ["a"]}),
    (None, [waiting("d", "")], None,
     {"gpu-node-1": ["x"], "gpu-node-2": ["b", "c"], "gpu-node-3": ["a"]}),
    (None, [waiting("e", "gpu-node-1")], None,
     {"gpu-node-1": ["e (nominated)", "x"], "gpu-node-2": ["b", "c"], "gpu-node-3": ["a"]}),
    (None, ["e"], None, {"gpu-node-1": ["x"], "gpu-node-2": ["b", "c"], "gpu-node-3": ["a"]}),
    # A bound pod deleted does not take a nomination of another pod with it.
    (None, [waiting("f", "gpu-node-1")], None,
     {"gpu-node-1": ["f (nominated)", "x"], "gpu-node-2": ["b", "c"], "gpu-node-3": ["a"]}),
    (None, ["x"], None,
     {"gpu-node-1": ["f (nominated)"], "gpu-node-2": ["b", "c"], "gpu-node-3": ["a"]}),
]  # fmt: skip


def test_nominated_pods_count_until_bound_cleared_or_gone(
    standin: ApiServerStandIn, cache: PodCache, store: NodeStore
) -> None:
    published = Published()
    cache.add_sink(published)
    for first, writes, between, after in NOMINATION_STEPS:
        step = (first, [w if isinstance(w, str) else w["metadata"]["name"] for w in writes])
        held = {"bound": NOMINATED_FIELD_SELECTOR, "nominated": FIELD_SELECTOR}.get(first or "")
        with contextlib.ExitStack() as stack:
            if held is not None:
                stack.enter_context(standin.hold_watches(held))
            for write in writes:
                if isinstance(write, str):
                    standin.delete_pod("default", write)
                else:
                    standin.put_pod(write)
            if between is not None:
                wait_pods(cache, between)
            told = len(published.told)
        caught_up(standin, cache)
        assert by_node(cache) == after, step
        if between == after:  # the held watch's lines are not applied
            assert published.since(told) == [], step
        for name in ("gpu-node-1", "gpu-node-2", "gpu-node-3"):
            assert store.pods_of(name) == cache.pods_of(name), step
    assert (len(cache), cache.nominations()) == (3, 1)


def test_a_nomination_replaces_the_scorers_proposals_and_stops_new_ones(
    standin: ApiServerStandIn, cache: PodCache, store: NodeStore
) -> None:
    cache.propose(_proposal("p", gpus=4), ["gpu-node-1", "gpu-node-2"], NOW)
    standin.put_pod(waiting("p", "gpu-node-2", gpus=4))
    wait_pods(cache, {"gpu-node-2": ["p (nominated)"]})
    assert cache.proposals() == 0
    assert [names(store.pods_of(n)) for n in ("gpu-node-1", "gpu-node-2")] == [
        [],
        ["p (nominated)"],
    ]
    # The scheduler asks the extender about it again (a preemptor's next attempt): the
    # nomination stays the record, and no proposal is added on top of it.
    cache.propose(_proposal("p", gpus=4), ["gpu-node-1"], NOW)
    assert (cache.proposals(), names(store.pods_of("gpu-node-1"))) == (0, [])


def test_a_nomination_list_replaces_the_nominations_and_keeps_the_bound_pods(
    standin: ApiServerStandIn, cache: PodCache, store: NodeStore
) -> None:
    standin.put_pod(pod_object("x"))
    standin.put_pod(waiting("gone", "gpu-node-1"))
    wait_pods(cache, {"gpu-node-1": ["gone (nominated)", "x"]})
    cache.propose(_proposal("p"), ["gpu-node-3"], NOW)
    relists = "gpu_scorer_nominated_pod_cache_relists_total"
    # The nomination watch falls behind (held), gets the 410 event and relists: its LIST, not
    # its lines, brings these changes.
    with standin.hold_watches(NOMINATED_FIELD_SELECTOR):
        standin.delete_pod("default", "gone")
        standin.put_pod(waiting("p", "gpu-node-2"))
        standin.put_pod(waiting("cpu", "gpu-node-2", gpus=0))
        standin.expire_watches(field_selector=NOMINATED_FIELD_SELECTOR)
        assert cache.wait_until(lambda c: gauge(c.metrics, relists) == 2, WAIT_S)
    wait_pods(cache, {"gpu-node-1": ["x"], "gpu-node-2": ["p (nominated)"]})
    assert [names(store.pods_of(n)) for n in ("gpu-node-1", "gpu-node-2", "gpu-node-3")] == [
        ["x"],
        ["p (nominated)"],
        [],
    ]
    assert (cache.nominations(), cache.proposals()) == (1, 0)
    # The bound pods' watch did not relist: the nominations' LIST alone replaced the proposal.
    assert gauge(cache.metrics, "gpu_scorer_pod_cache_relists_total") == 1


def test_nominations_wait_while_accounting_is_off_and_count_from_the_next_list(
    standin: ApiServerStandIn, kubeconfig: str, store: NodeStore
) -> None:
    standin.put_pod(waiting("early", "gpu-node-1"))
    standin.put_pod(waiting("later", "gpu-node-2"))
    standin.inject(Fault(403, method="GET", field_selector=FIELD_SELECTOR, times=1_000))
    failed = "gpu_scorer_pod_cache_watch_restarts_total"
    both = {"gpu-node-1": ["early (nominated)"], "gpu-node-2": ["later"]}
    with PodCache(kubeconfig=kubeconfig, metrics=ScorerMetrics(), tuning=FAST) as cache:
        cache.add_sink(store)
        # The bound pods' LIST is forbidden, the nominations' is not: held, not counted.
        assert cache.wait_until(
            lambda c: c.nominations() == 2 and gauge(c.metrics, failed, '{cause="error"}') >= 1,
            WAIT_S,
        )
        assert (cache.active, cache.by_node()) == (False, {})
        assert [store.pods_of(n) for n in ("gpu-node-1", "gpu-node-2")] == [(), ()]
        # `later` is bound before the bound pods' first good LIST, and the nomination watch has
        # not said so yet: that LIST's record replaces the nomination.
        with standin.hold_watches(NOMINATED_FIELD_SELECTOR):
            standin.put_pod(pod_object("later", node_name="gpu-node-2"))
            standin.clear_faults()
            wait_pods(cache, both)
            assert cache.nominations() == 1
        assert names(store.pods_of("gpu-node-1")) == ["early (nominated)"]
        # The bound pods' watch fails: nothing counts, and the nominations come back with the
        # LIST after it.
        standin.inject(Fault(500, method="GET", field_selector=FIELD_SELECTOR, times=1_000))
        standin.expire_watches(field_selector=FIELD_SELECTOR)
        assert cache.wait_until(lambda c: not c.active, WAIT_S)
        assert [store.pods_of(n) for n in ("gpu-node-1", "gpu-node-2")] == [(), ()]
        assert cache.nominations() == 1
        standin.clear_faults()
        wait_pods(cache, both)
        assert names(store.pods_of("gpu-node-1")) == ["early (nominated)"]


def test_a_failing_nomination_watch_drops_the_nominations_and_keeps_accounting_on(
    standin: ApiServerStandIn, kubeconfig: str, store: NodeStore, caplog: pytest.LogCaptureFixture
) -> None:
    standin.put_pod(pod_object("x"))
    standin.put_pod(waiting("p", "gpu-node-1"))
    # Watches of 1 s: the nomination watch reopens from the version it had, and that fails.
    tuning = CacheTuning(watch_timeout_s=1, backoff_initial_s=0.01, backoff_max_s=0.05)
    caplog.set_level(logging.INFO, logger="exporter_scheduler.podcache")
    published = Published()
    with PodCache(kubeconfig=kubeconfig, metrics=ScorerMetrics(), tuning=tuning) as cache:
        cache.add_sink(store)
        cache.add_sink(published)
        assert cache.wait_until(listed, WAIT_S)
        wait_pods(cache, {"gpu-node-1": ["p (nominated)", "x"]})
        told = len(published.told)
        # Its next watch is forbidden, then its next two lists: down three times in a row.
        watch = "watch=True"
        standin.inject(
            Fault(403, method="GET", path_contains=watch, field_selector=NOMINATED_FIELD_SELECTOR)
        )
        standin.inject(Fault(403, method="GET", field_selector=NOMINATED_FIELD_SELECTOR, times=2))
        relists = "gpu_scorer_nominated_pod_cache_relists_total"
        assert cache.wait_until(lambda c: gauge(c.metrics, relists) == 2, WAIT_S)
        wait_pods(cache, {"gpu-node-1": ["p (nominated)", "x"]})  # back: counted again
        restarts = "gpu_scorer_nominated_pod_cache_watch_restarts_total"
        assert gauge(cache.metrics, restarts, '{cause="error"}') == 3
        assert (cache.active, gauge(cache.metrics, "gpu_scorer_inflight_accounting")) == (True, 1)
    # Dropped at the first failure, the bound pod kept throughout, back with the next LIST.
    assert published.since(told) == [("gpu-node-1", ["x"]), ("gpu-node-1", ["p (nominated)", "x"])]
    # After the failed watch it lists afresh: lines missed while down are not replayed.
    calls = [(r.status, r.param("watch")) for r in standin.requests if nomination_watch(r)]
    failed = calls.index((403, "True"))
    assert calls[failed : failed + 4] == [(403, "True"), (403, None), (403, None), (200, None)]
    said = [r for r in caplog.records if r.name == "exporter_scheduler.podcache"]
    assert [r.getMessage() for r in said] == [
        "in-flight accounting on",  # at start, and never off
        "nominated pods not counted: verdicts count the bound pods alone",  # down three times
    ]
    record = said[1]
    assert record.levelno == logging.WARNING
    assert record.__dict__["fields"]["why"].startswith("the API server forbids listing pods")


def test_the_loop_watches_the_nominated_pods_with_their_own_selector(
    standin: ApiServerStandIn, kubeconfig: str, store: NodeStore
) -> None:
    standin.put_pod(pod_object("a"))
    standin.put_pod(waiting("gang-0", "gpu-node-2", gpus=2))
    listed_at = standin.resource_version
    with PodCache(kubeconfig=kubeconfig, metrics=ScorerMetrics(), tuning=FAST) as cache:
        cache.add_sink(store)
        assert cache.wait_until(lambda c: c.active and c.nominations() == 1, WAIT_S)
        standin.put_pod(waiting("gang-1", "gpu-node-3", gpus=2))
        assert cache.wait_until(lambda c: c.nominations() == 2, WAIT_S)
        assert [names(store.pods_of(n)) for n in ("gpu-node-1", "gpu-node-2", "gpu-node-3")] == [
            ["a"],
            ["gang-0 (nominated)"],
            ["gang-1 (nominated)"],
        ]
    calls = [r for r in standin.requests if nomination_watch(r)]
    # One LIST, then a watch from the version it returned.
    assert [(r.param("watch"), r.param("resourceVersion")) for r in calls[:2]] == [
        (None, None),
        ("True", str(listed_at)),
    ]


GPU_POD = f"{PREFIX}gpu-pod"


def test_with_a_label_selector_both_watches_hold_only_the_labelled_pods(
    standin: ApiServerStandIn, kubeconfig: str, store: NodeStore
) -> None:
    labelled = {GPU_POD: "true"}
    standin.put_pod(pod_object("a", labels=labelled))
    standin.put_pod(pod_object("unlabelled"))  # created before the admission policy
    standin.put_pod(waiting("gang-0", "gpu-node-2", labels=labelled))
    standin.put_pod(waiting("gang-unlabelled", "gpu-node-2"))
    selector = f"{GPU_POD}=true"
    with PodCache(
        kubeconfig=kubeconfig, metrics=ScorerMetrics(), tuning=FAST, label_selector=selector
    ) as cache:
        cache.add_sink(store)
        assert cache.wait_until(lambda c: c.active and c.nominations() == 1, WAIT_S)
        wait_pods(cache, {"gpu-node-1": ["a"], "gpu-node-2": ["gang-0 (nominated)"]})
        # Labelled later (`gpu-scorer label-gpu-pods`): the watch shows it as it joins the
        # selection; a pod whose label is taken away leaves it as a DELETED.
        standin.put_pod(pod_object("unlabelled", labels=labelled))
        standin.put_pod(pod_object("a"))
        wait_pods(cache, {"gpu-node-1": ["unlabelled"], "gpu-node-2": ["gang-0 (nominated)"]})
    for request in recorded(standin, 4, lambda r: r.path == PODS_PATH):
        assert request.param("labelSelector") == selector, request


# ----------------------------------------------------------------------------- failures


@pytest.mark.parametrize(
    ("status", "why"),
    [
        pytest.param(
            403,
            "the API server forbids listing pods (403): grant the scorer's service account "
            "list and watch on pods",
            id="403-names-the-missing-rbac",
        ),
        pytest.param(401, "the API server rejected the scorer's credentials (401)", id="401"),
        pytest.param(503, "the pod list/watch failed: the API server answered 503: ", id="503"),
    ],
)
def test_a_failure_clears_every_nodes_pods_until_a_list_succeeds_again(
    status: int,
    why: str,
    *,
    standin: ApiServerStandIn,
    cache: PodCache,
    store: NodeStore,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The watch expires and the relist fails, over and over: accounting goes off (said
    once), and comes back with everything the server holds once a list succeeds."""
    standin.put_pod(pod_object("a"))
    standin.put_pod(pod_object("b", node_name="gpu-node-2"))
    wait_pods(cache, {"gpu-node-1": ["a"], "gpu-node-2": ["b"]})
    cache.propose(_proposal("p"), ["gpu-node-3"], NOW)
    assert gauge(cache.metrics, "gpu_scorer_inflight_accounting") == 1
    restarts = "gpu_scorer_pod_cache_watch_restarts_total"
    caplog.set_level(logging.INFO, logger="exporter_scheduler.podcache")
    standin.inject(Fault(status, method="GET", field_selector=FIELD_SELECTOR, times=3))
    standin.expire_watches()
    assert cache.wait_until(lambda c: gauge(c.metrics, restarts, '{cause="error"}') >= 2, WAIT_S)
    assert cache.wait_until(lambda c: c.active, WAIT_S)  # the fourth list succeeds
    wait_pods(cache, {"gpu-node-1": ["a"], "gpu-node-2": ["b"]})
    off = [r for r in caplog.records if r.getMessage().startswith("in-flight accounting off")]
    (record,) = off  # down three times: said once
    assert record.levelno == logging.WARNING
    assert record.__dict__["fields"]["why"].startswith(why)
    on = [r for r in caplog.records if r.getMessage() == "in-flight accounting on"]
    assert [r.__dict__["fields"] for r in on] == [{"why": "pod watch synced"}]
    assert caplog.records.index(record) < caplog.records.index(on[0])
    # While off, every node's pods and the proposals were dropped: p is not back.
    assert cache.proposals() == 0
    assert gauge(cache.metrics, restarts, '{cause="error"}') == 3
    assert gauge(cache.metrics, "gpu_scorer_pod_cache_relists_total") == 2


def test_the_loop_turns_accounting_on_with_the_first_list_that_succeeds(
    standin: ApiServerStandIn, kubeconfig: str, store: NodeStore, caplog: pytest.LogCaptureFixture
) -> None:
    standin.put_pod(pod_object("a"))
    standin.inject(Fault(403, method="GET", field_selector=FIELD_SELECTOR))
    metrics = ScorerMetrics()
    caplog.set_level(logging.INFO, logger="exporter_scheduler.podcache")
    with PodCache(kubeconfig=kubeconfig, metrics=metrics, tuning=FAST) as cache:
        cache.add_sink(store)
        assert cache.wait_until(lambda c: c.active, WAIT_S)
        standin.put_pod(pod_object("b", node_name="gpu-node-2"))
        wait_pods(cache, {"gpu-node-1": ["a"], "gpu-node-2": ["b"]})
        assert gauge(metrics, "gpu_scorer_inflight_accounting") == 1
        assert gauge(metrics, "gpu_scorer_pod_cache_ready") == 1
        assert gauge(metrics, "gpu_scorer_pod_cache_relists_total") == 1
        assert gauge(metrics, "gpu_scorer_pod_cache_watch_restarts_total", '{cause="error"}') == 1
        assert names(store.pods_of("gpu-node-2")) == ["b"]
    messages = [r.getMessage() for r in caplog.records]
    off = "in-flight accounting off: verdicts read the nodes' annotations alone"
    assert messages.index(off) < messages.index("in-flight accounting on")
    calls = [r for r in standin.requests if bound_watch(r)]
    assert [(r.status, r.param("watch")) for r in calls[:3]] == [
        (403, None),
        (200, None),
        (200, "True"),
    ]


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
def app_and_cache(kubeconfig: str) -> Iterator[tuple[ScorerApp, PodCache]]:
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
    with PodCache(kubeconfig=kubeconfig, metrics=ScorerMetrics(), tuning=FAST) as pods:
        pods.add_sink(nodes)
        assert pods.wait_until(lambda c: c.active, WAIT_S)
        yield ScorerApp(policy=Policy(), clock=lambda: NOW, node_store=nodes, placements=pods), pods


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


def test_the_proposal_is_recorded_after_the_reply_and_before_any_next_request(
    app_and_cache: tuple[ScorerApp, PodCache],
) -> None:
    """kube-scheduler waits for the reply alone: the proposal is a step right after it, which
    the connection that sent the reply runs before reading its next request. A request that
    comes on another connection first runs it itself, so it sees the proposal all the same."""
    app, cache = app_and_cache
    body = _body("p", nodes=NODES)
    app.handle("filter", body)
    reply = app.answer("prioritize", body)  # answered, not yet written
    assert _proposed(cache) == {}
    # Another connection's filter, before the first connection has run the step.
    q = _body("q", nodes=NODES)
    app.answer("filter", q).finish()
    assert _proposed(cache) == {"cool": ["p (proposed)"]}
    assert _inflight_on(app, q) == {"cool": [("default/p", True)]}
    reply.finish()  # the first connection's turn: the step ran once, and is not run again
    assert cache.proposals() == 1


def test_a_written_reply_is_not_kept_by_the_app(
    app_and_cache: tuple[ScorerApp, PodCache],
) -> None:
    """A reply with a step after it is found by later requests until it is finished: once its
    connection is done with it, nothing keeps it, nor the request body its parts may slice
    (the HTTP edge reuses that buffer for the next request)."""
    app, _ = app_and_cache
    reply = app.answer("prioritize", _body("p", nodes=NODES))
    assert reply.first is not None  # its proposal, for right after the reply
    reply.finish()
    gone = weakref.ref(reply)
    del reply
    assert gone() is None


def test_replies_never_finished_are_let_go_past_a_bound(
    app_and_cache: tuple[ScorerApp, PodCache], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A caller that never finishes its replies (a bug) costs the oldest ones their place,
    not memory; each reply's proposal is still made before the next request is answered."""
    app, cache = app_and_cache
    monkeypatch.setattr(app_module, "_MAX_HELD", 2)
    replies = [app.answer("prioritize", _body(f"p{i}", nodes=NODES)) for i in range(4)]
    assert len(app._held) == 2
    assert [reply.first is None for reply in replies] == [True, True, True, False]

    def proposed_pods() -> set[str]:
        return {pod for pods in _proposed(cache).values() for pod in pods}

    assert proposed_pods() == {f"p{i} (proposed)" for i in range(3)}
    for reply in replies:
        reply.finish()
    assert proposed_pods() == {f"p{i} (proposed)" for i in range(4)}
    assert app._held == {}


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


def test_watches_that_end_at_once_are_reopened_with_back_off_not_in_a_spin(
    standin: ApiServerStandIn, kubeconfig: str
) -> None:
    standin.put_pod(pod_object("a"))
    standin.inject(
        Fault(
            method="GET",
            path_contains="watch=True",
            field_selector=FIELD_SELECTOR,
            end_stream=True,
            times=3,
        )
    )
    # Back-off 0.2 s doubling to 0.4 s: in 1 s a spinning loop would open thousands.
    tuning = CacheTuning(watch_timeout_s=30, backoff_initial_s=0.2, backoff_max_s=0.4)

    with PodCache(kubeconfig=kubeconfig, metrics=ScorerMetrics(), tuning=tuning) as cache:
        assert cache.wait_until(lambda c: c.active, WAIT_S)
        watches = recorded(standin, 4, lambda r: bound_watch(r) and bool(r.param("watch")))
        opened = [r.recorded_s for r in watches]
        gaps_s = [later - earlier for earlier, later in itertools.pairwise(opened)]
        # Each back-off waits at least half of its 0.2 s, 0.4 s, 0.4 s; a spin would take ~0.
        assert all(gap >= 0.1 for gap in gaps_s[:3]), gaps_s
        assert names(cache.pods_of("gpu-node-1")) == ["a"]  # nothing failed: the pods are kept
