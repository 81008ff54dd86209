"""The Namespace watch: the real list + watch loop and the real `kubernetes` client over HTTP to
the API server stand-in, which serves Namespaces as a kube-apiserver v1.36 does.

Tenant profiles chosen by namespace labels read this cache on the request path, so what matters
is that it holds the labels the server holds: after the first list, after each event, after a
410 forces a relist, and across a failing server (the last labels known are kept meanwhile).
Waits block on the cache's own change notifications (`wait_until`) with a deadline.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from exporter_scheduler.edges.listwatch import CacheTuning
from exporter_scheduler.edges.namespacecache import NamespaceCache
from exporter_scheduler.serving.metrics import ScorerMetrics
from kube_standins.apiserver import ApiServerStandIn, Fault

WAIT_S = 10.0
FAST = CacheTuning(watch_timeout_s=30, list_page_size=2, backoff_initial_s=0.01, backoff_max_s=0.05)
NAME_LABEL = "kubernetes.io/metadata.name"
PATH = "/api/v1/namespaces"


def namespace(
    name: str, labels: Mapping[str, str] | None = None, **annotations: str
) -> dict[str, object]:
    meta: dict[str, object] = {"name": name, "labels": dict(labels or {})}
    if annotations:
        meta["annotations"] = dict(annotations)
    return {"metadata": meta}


def counter(cache: NamespaceCache, name: str, labels: str = "") -> float:
    for line in cache.metrics.render()[0].decode().splitlines():
        if line.startswith(f"gpu_scorer_namespace_cache_{name}{labels} "):
            return float(line.split()[-1])
    raise AssertionError(f"gpu_scorer_namespace_cache_{name}{labels} not exported")


@pytest.fixture
def standin() -> Iterator[ApiServerStandIn]:
    with ApiServerStandIn(bookmark_interval_s=0.05) as server:
        for name, labels in (("default", {}), ("lab", {"team": "research"}), ("prod-a", {})):
            server.put_namespace(namespace(name, labels))
        yield server


@pytest.fixture
def cache(standin: ApiServerStandIn, tmp_path: Path) -> Iterator[NamespaceCache]:
    kubeconfig = str(standin.write_kubeconfig(tmp_path / "kubeconfig"))
    with NamespaceCache(kubeconfig=kubeconfig, metrics=ScorerMetrics(), tuning=FAST) as running:
        assert running.wait_until(lambda c: counter(c, "ready") == 1, WAIT_S)
        yield running


def labels_of(cache: NamespaceCache, *names: str) -> dict[str, dict[str, str]]:
    return {name: dict(cache.labels(name)) for name in names}


def test_the_initial_list_pages_and_holds_every_namespaces_labels(
    standin: ApiServerStandIn, cache: NamespaceCache
) -> None:
    assert labels_of(cache, "default", "lab", "prod-a", "unknown") == {
        "default": {NAME_LABEL: "default"},
        "lab": {NAME_LABEL: "lab", "team": "research"},
        "prod-a": {NAME_LABEL: "prod-a"},
        "unknown": {},
    }
    assert cache.generation == 1
    lists = [r for r in standin.requests if r.path == PATH and not r.param("watch")]
    assert [r.param("continue") is not None for r in lists] == [False, True]  # pages of two


@dataclass(frozen=True)
class EventCase:
    name: str
    change: dict[str, object] | str  # a Namespace to put, or the name of one to delete
    changes_generation: bool
    expected: dict[str, dict[str, str]] = field(default_factory=dict)


EVENTS = [
    EventCase(
        "label-added",
        namespace("prod-a", {"team": "research"}),
        True,
        {"prod-a": {NAME_LABEL: "prod-a", "team": "research"}},
    ),
    EventCase(
        "annotation-only",
        namespace("lab", {"team": "research"}, owner="ml"),
        False,
        {"lab": {NAME_LABEL: "lab", "team": "research"}},
    ),
    EventCase(
        "created",
        namespace("new", {"tier": "gold"}),
        True,
        {"new": {NAME_LABEL: "new", "tier": "gold"}},
    ),
    EventCase("deleted", "lab", True, {"lab": {}}),
]


@pytest.mark.parametrize("case", EVENTS, ids=lambda c: c.name)
def test_events_keep_the_labels_current(
    case: EventCase, standin: ApiServerStandIn, cache: NamespaceCache
) -> None:
    before = cache.generation
    if isinstance(case.change, str):
        standin.delete_namespace(case.change)
    else:
        standin.put_namespace(case.change)
    # A namespace put after the change is the barrier: the watch delivers in order.
    standin.put_namespace(namespace("barrier"))
    assert cache.wait_until(lambda c: bool(c.labels("barrier")), WAIT_S)
    assert labels_of(cache, *case.expected) == case.expected
    assert cache.generation == before + 1 + case.changes_generation


def test_an_error_410_relists(standin: ApiServerStandIn, cache: NamespaceCache) -> None:
    standin.expire_watches()
    standin.put_namespace(namespace("prod-a", {"team": "research"}))
    assert cache.wait_until(lambda c: counter(c, "relists_total") == 2, WAIT_S)
    assert cache.wait_until(lambda c: c.labels("prod-a").get("team") == "research", WAIT_S)
    assert counter(cache, "watch_restarts_total", '{cause="expired"}') == 1


def test_a_failing_server_keeps_the_last_labels_and_is_retried_with_back_off(
    standin: ApiServerStandIn, cache: NamespaceCache
) -> None:
    """The watch expires and the next three lists get a 500: the labels known stay (a profile
    keeps matching), and the list is retried with back-off until it succeeds."""
    # Lists only (they page with `limit=`): a watch opened at the same moment must not take
    # one of the three faults, or fewer than three lists fail.
    standin.inject(Fault(500, method="GET", path_contains="limit=", times=3))
    standin.expire_watches()
    assert cache.wait_until(lambda c: counter(c, "relists_total") == 2, WAIT_S)
    assert counter(cache, "watch_restarts_total", '{cause="error"}') == 3
    assert labels_of(cache, "lab") == {"lab": {NAME_LABEL: "lab", "team": "research"}}
    lists = [r for r in standin.requests if r.path == PATH and not r.param("watch")]
    retried = [r for r in lists if r.recorded_s >= lists[-1].recorded_s or r.status == 500]
    assert [r.status for r in retried] == [500, 500, 500, 200]
    gaps_s = [b.recorded_s - a.recorded_s for a, b in itertools.pairwise(retried)]
    # Back-off with jitter: at least half of 0.01 s, 0.02 s, 0.04 s between the tries.
    assert all(gap >= 0.005 for gap in gaps_s), gaps_s
