"""The names-only node cache: the real kubernetes client over HTTP to the API server stand-in.

Waits here block on the cache's own change notifications (`wait_until`); the one thing the
cache does not signal (a watch being opened) is polled for with a deadline.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from exporter_scheduler.edges.nodecache import CacheTuning, NodeCache, WatchExpiredError
from exporter_scheduler.serving.metrics import ScorerMetrics
from gpu_contract.media import METADATA_LIST, METADATA_WATCH
from kube_standins.apiserver import ApiServerStandIn, Fault
from kube_standins.nodes import gpu_node, with_agent_write
from tests.fixture_paths import APISERVER_FIXTURES
from tests.scorer._http_helpers import gpu_annotations, node

UTIL = "gpu-scheduler.example.com/utilization"
AGENT_TIME = datetime(2026, 11, 30, 13, 59, 50, tzinfo=UTC)
FAST = CacheTuning(watch_timeout_s=30, backoff_initial_s=0.01, backoff_max_s=0.05)
WAIT_S = 10.0


def _poll(condition: Callable[[], bool], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def standin() -> Iterator[ApiServerStandIn]:
    server = ApiServerStandIn(port=_free_port(), bookmark_interval_s=0.05)
    for name, utilization in (("a", 0.10), ("b", 0.50), ("c", 0.95)):
        # Realistic Nodes (~6 KB: the kubelet's labels, images, conditions) after an agent write.
        base = gpu_node(name, annotations={"other.example.com/x": "y"})
        server.put_node(
            with_agent_write(base, gpu_annotations(utilization=utilization), AGENT_TIME)
        )
    with server:
        yield server


@pytest.fixture
def cache(standin: ApiServerStandIn, tmp_path: Path) -> Iterator[NodeCache]:
    kubeconfig = standin.write_kubeconfig(tmp_path / "kubeconfig")
    with NodeCache(kubeconfig=str(kubeconfig), metrics=ScorerMetrics(), tuning=FAST) as running:
        assert running.wait_until(lambda c: c.ready(), WAIT_S)
        yield running


def _utilization(cache: NodeCache, name: str) -> str | None:
    return cache.lookup([name])[0].annotations.get(UTIL)


def _metric(cache: NodeCache, name: str, labels: str = "") -> float:
    for line in cache.metrics.render()[0].decode().splitlines():
        if line.startswith(f"{name}{labels} "):
            return float(line.split()[-1])
    return 0.0


def test_initial_list(cache: NodeCache) -> None:
    assert cache.names() == ["a", "b", "c"]
    a, unknown = cache.lookup(["a", "nope"])
    assert a.annotations[UTIL] == "0.10"
    # Only the agent's keys are kept.
    assert "other.example.com/x" not in a.annotations
    assert a.agent_write_time == AGENT_TIME
    assert (unknown.name, dict(unknown.annotations), unknown.agent_write_time) == ("nope", {}, None)
    assert _metric(cache, "gpu_scorer_node_cache_nodes") == 3
    assert _metric(cache, "gpu_scorer_node_cache_relists_total") == 1
    assert _metric(cache, "gpu_scorer_node_cache_ready") == 1


@pytest.mark.parametrize("paged", [True, False], ids=["page-reader", "client"])
def test_the_list_and_the_watch_ask_for_each_nodes_metadata_alone(
    standin: ApiServerStandIn, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, paged: bool
) -> None:
    """The LIST (read by the page reader, or through the client where it cannot be, behind a
    proxy) asks for `PartialObjectMetadataList` and the WATCH for `PartialObjectMetadata`,
    both with whole Nodes as the fallback: the stand-in sends those, and they are read too."""
    if not paged:
        monkeypatch.setattr(NodeCache, "_open_reader", lambda _self: None)
    kubeconfig = standin.write_kubeconfig(tmp_path / "kubeconfig")
    with NodeCache(kubeconfig=str(kubeconfig), metrics=ScorerMetrics(), tuning=FAST) as cache:
        assert cache.wait_until(lambda c: c.ready(), WAIT_S)
        standin.put_node(node("a", gpu_annotations(utilization=0.77), agent_time=AGENT_TIME))
        assert cache.wait_until(lambda c: _utilization(c, "a") == "0.77", WAIT_S)
    asked = {
        (r.param("watch") is not None, r.headers.get("Accept"))
        for r in standin.requests
        if r.path == "/api/v1/nodes"
    }
    assert asked == {(False, METADATA_LIST), (True, METADATA_WATCH)}


def test_modified_added_and_deleted(cache: NodeCache, standin: ApiServerStandIn) -> None:
    standin.put_node(node("a", gpu_annotations(utilization=0.77), agent_time=AGENT_TIME))
    assert cache.wait_until(lambda c: _utilization(c, "a") == "0.77", WAIT_S)
    standin.put_node(node("d", gpu_annotations(utilization=0.20)))
    assert cache.wait_until(lambda c: "d" in c.names(), WAIT_S)
    standin.delete_node("b")
    assert cache.wait_until(lambda c: "b" not in c.names(), WAIT_S)
    assert cache.names() == ["a", "c", "d"]
    assert _metric(cache, "gpu_scorer_node_cache_relists_total") == 1


def test_bookmarks_keep_the_map_and_advance_the_version(
    cache: NodeCache, standin: ApiServerStandIn
) -> None:
    # The stand-in sends a BOOKMARK (a skeleton Node without a name) every 50 ms.
    target = str(standin.resource_version)
    names = cache.names()
    assert cache.wait_until(lambda c: c._resource_version == target, WAIT_S)
    assert cache.names() == names
    assert "" not in cache.names()


def test_real_watch_capture_applied_event_by_event() -> None:
    """The v1.36 capture: MODIFIED x2, ADDED, DELETED, then two BOOKMARKs."""
    cache = NodeCache(metrics=ScorerMetrics())
    lines = (APISERVER_FIXTURES / "51-watch-nodes-timeout20.ndjson").read_bytes().splitlines()
    for line in lines:
        cache._apply(line)
    assert cache.names() == ["gpu-node-1"]
    (node_1,) = cache.lookup(["gpu-node-1"])
    assert node_1.annotations[UTIL]
    assert node_1.agent_write_time is not None
    assert cache._resource_version == "251"  # from the last BOOKMARK


@pytest.mark.parametrize(
    "capture",
    [
        pytest.param("62-watch-rv1-too-old.ndjson", id="too-old"),
        pytest.param("67b-watch-rv-from-before-apiserver-restart.ndjson", id="after-restart"),
    ],
)
def test_real_410_event_means_relist(capture: str) -> None:
    cache = NodeCache(metrics=ScorerMetrics())
    (line,) = (APISERVER_FIXTURES / capture).read_bytes().splitlines()
    with pytest.raises(WatchExpiredError, match="too old resource version"):
        cache._apply(line)


def test_error_410_inside_a_200_stream_relists(cache: NodeCache, standin: ApiServerStandIn) -> None:
    standin.expire_watches()
    assert cache.wait_until(
        lambda c: _metric(c, "gpu_scorer_node_cache_relists_total") == 2, WAIT_S
    )
    assert _metric(cache, "gpu_scorer_node_cache_watch_restarts_total", '{cause="expired"}') >= 1
    standin.put_node(node("c", gpu_annotations(utilization=0.05)))
    assert cache.wait_until(lambda c: _utilization(c, "c") == "0.05", WAIT_S)


def test_api_server_restart_reconnects_with_backoff(
    cache: NodeCache, standin: ApiServerStandIn
) -> None:
    standin.stop()
    assert cache.wait_until(
        lambda c: _metric(c, "gpu_scorer_node_cache_watch_restarts_total", '{cause="error"}') >= 3,
        WAIT_S,
    )
    # Requests are still answered from the map while the API server is away.
    assert cache.ready()
    assert _utilization(cache, "a") == "0.10"
    # While it was down a node changed and the restarted server no longer holds old versions.
    standin.put_node(node("a", gpu_annotations(utilization=0.66)))
    standin.delete_node("b")
    standin.expire_watches()
    standin.start()
    assert cache.wait_until(lambda c: _utilization(c, "a") == "0.66", WAIT_S)
    assert cache.names() == ["a", "c"]
    assert _metric(cache, "gpu_scorer_node_cache_relists_total") == 2


def test_not_ready_until_the_first_list(standin: ApiServerStandIn, tmp_path: Path) -> None:
    standin.inject(Fault(503, method="GET", path_contains="/api/v1/nodes", times=3))
    kubeconfig = standin.write_kubeconfig(tmp_path / "kubeconfig")
    with NodeCache(kubeconfig=str(kubeconfig), metrics=ScorerMetrics(), tuning=FAST) as cache:
        assert cache.wait_until(
            lambda c: (
                _metric(c, "gpu_scorer_node_cache_watch_restarts_total", '{cause="error"}') >= 1
            ),
            WAIT_S,
        )
        # The failing list left the cache unready (unless all three faults already passed).
        assert cache.ready() or cache.names() == []
        assert cache.wait_until(lambda c: c.ready(), WAIT_S)
        assert cache.names() == ["a", "b", "c"]


def test_stop_is_prompt_with_a_watch_open(standin: ApiServerStandIn, tmp_path: Path) -> None:
    kubeconfig = standin.write_kubeconfig(tmp_path / "kubeconfig")
    cache = NodeCache(kubeconfig=str(kubeconfig), tuning=CacheTuning(watch_timeout_s=600)).start()
    assert cache.wait_until(lambda c: c.ready(), WAIT_S)
    # Opening a watch changes nothing the cache signals, so this one wait polls.
    assert _poll(lambda: standin.watch_count == 1, WAIT_S)
    cache.stop(timeout_s=5)
    assert len(cache._threads) == 2  # the list + watch loop and the expiry timer
    assert not any(thread.is_alive() for thread in cache._threads)


def test_an_event_that_wakes_an_idle_watch_waits_out_the_batch_with_those_that_follow(
    tmp_path: Path,
) -> None:
    """`event_batch_s`: the first event after the stream was idle is applied once the batch
    is over, and the events written meanwhile right after it, in order (read from the socket's
    buffer, back to back)."""
    batch_s = 0.5
    with ApiServerStandIn(port=_free_port()) as server:  # bookmarks once a minute: idle
        server.put_node(gpu_node("a"))
        kubeconfig = server.write_kubeconfig(tmp_path / "kubeconfig")
        tuning = CacheTuning(watch_timeout_s=30, event_batch_s=batch_s)
        cache = NodeCache(kubeconfig=str(kubeconfig), metrics=ScorerMetrics(), tuning=tuning)
        applied: list[tuple[str, float]] = []
        apply_event = cache._on_event

        def recording(kind: str, obj: Any) -> bool:
            applied.append((obj.metadata.name, time.monotonic()))
            return apply_event(kind, obj)

        cache._on_event = recording  # type: ignore[method-assign]
        with cache:
            assert cache.wait_until(lambda c: c.ready(), WAIT_S)
            assert _poll(lambda: server.watch_count == 1, WAIT_S)
            # The watch's read waits on the server from here on: far longer than a read the
            # socket's buffer answers, whatever the machine's load.
            time.sleep(0.1)
            written = time.monotonic()
            for name, utilization in (("a", 0.20), ("b", 0.30), ("c", 0.40)):
                base = gpu_node(name)
                annotations = gpu_annotations(utilization=utilization)
                server.put_node(with_agent_write(base, annotations, AGENT_TIME))
            assert cache.wait_until(lambda c: "c" in c.names(), WAIT_S)
            assert cache.wait_until(lambda c: _utilization(c, "c") == "0.40", WAIT_S)
    assert [name for name, _ in applied] == ["a", "b", "c"]
    first, _, last = (at for _, at in applied)
    assert first - written >= batch_s
    assert last - first < batch_s


def test_missing_credentials_fail_at_start(tmp_path: Path) -> None:
    with pytest.raises(Exception, match=r"(?i)kube|config|service"):
        NodeCache(kubeconfig=str(tmp_path / "absent")).start()
