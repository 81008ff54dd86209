"""The kube-scheduler stand-in against the real scorer over real HTTP.

The driver must speak to the extender exactly as kube-scheduler v1.36 does (the captures in
shared/fixtures/kube-scheduler-v1.36 are the reference): capitalised keys, a NodeList of full Node
objects or names only, no node without a free GPU, no prioritize call with one node left.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from exporter_scheduler.core.policy import Policy
from exporter_scheduler.edges.nodecache import NodeCache
from exporter_scheduler.edges.server import HttpServer
from exporter_scheduler.serving.app import ScorerApp
from gpu_contract.schema import Health, NodeGpuState, encode
from kube_standins.apiserver import ApiServerStandIn
from kube_standins.nodes import gpu_node
from kube_standins.scheduler_driver import (
    INSUFFICIENT_GPU,
    LOWER_SCORE,
    DriverConfig,
    ExtenderClient,
    PodFactory,
    PodSpec,
    SchedulerDriver,
    failed_scheduling_message,
    percentile,
)
from tests.fixture_paths import SCHEDULER_FIXTURES

NOW = datetime(2026, 11, 30, 15, 0, 0, tzinfo=UTC)
PREFIX = "gpu-scheduler.example.com/"


def _capture(name: str, mode: str = "nodecache-false") -> dict[str, Any]:
    """A request body a real kube-scheduler v1.36 sent (see the captures' README)."""
    loaded: dict[str, Any] = json.loads((SCHEDULER_FIXTURES / mode / name).read_text())
    return loaded


def make_node(
    name: str,
    *,
    utilization: float,
    gpus: int = 8,
    product: str = "NVIDIA-A100-SXM4-80GB",
    largest_free_mib: int = 80000,
    age_s: float = 2.0,
) -> dict[str, Any]:
    """A realistic GPU Node carrying the agent's annotations, sampled `age_s` before NOW."""
    node: dict[str, Any] = gpu_node(name, gpu_count=gpus, product=product)
    state = NodeGpuState(
        health=Health.OK,
        updated_at=NOW - timedelta(seconds=age_s),
        utilization=utilization,
        utilization_max=min(1.0, utilization + 0.05),
        memory_fragmentation=0.1,
        memory_free_mib=largest_free_mib * 2,
        memory_largest_free_mib=largest_free_mib,
        temperature_c=50,
        gpu_model=product,
        gpu_count=gpus,
    )
    node["metadata"].setdefault("annotations", {}).update(encode(state))
    return node


class RecordingClient(ExtenderClient):
    """The real HTTP client, keeping every request body it sent (what reached the wire)."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.sent: list[tuple[str, dict[str, Any]]] = []

    def post(self, verb: str, body: dict[str, Any]) -> Any:
        self.sent.append((verb, json.loads(json.dumps(body))))
        return super().post(verb, body)

    def verbs(self) -> list[str]:
        return [verb for verb, _ in self.sent]


class RecordingLoad:
    def __init__(self) -> None:
        self.events: list[tuple[str, str, str]] = []

    def pod_started(self, node: str, pod: PodSpec) -> None:
        self.events.append(("start", node, pod.name))

    def pod_ended(self, node: str, pod: PodSpec) -> None:
        self.events.append(("end", node, pod.name))


@pytest.fixture(scope="module")
def scorer_url() -> Iterator[str]:
    app = ScorerApp(policy=Policy(), clock=lambda: NOW)
    server = HttpServer(app, host="127.0.0.1", port=0).start()
    try:
        yield server.url
    finally:
        server.stop()


def pod(name: str = "p-1", *, gpus: int = 1, run_s: float = 10.0, **hints: str) -> PodSpec:
    annotations = {PREFIX + key.replace("_", "-"): value for key, value in hints.items()}
    return PodSpec(
        name=name,
        uid=str(uuid.uuid5(uuid.NAMESPACE_DNS, name)),
        gpus=gpus,
        run_s=run_s,
        utilization=0.8,
        annotations=annotations,
    )


def driver_for(
    url: str, nodes: list[dict[str, Any]], *, seed: int = 0, load: RecordingLoad | None = None
) -> tuple[SchedulerDriver, RecordingClient]:
    client = RecordingClient(url)
    driver = SchedulerDriver(
        extender=client,
        list_nodes=lambda: nodes,
        config=DriverConfig(mode="full", weight=5, seed=seed),
        load=load,
        wall_clock=lambda: NOW,
    )
    return driver, client


# ----------------------------------------------------------------------------------------------
# The request on the wire


def test_filter_request_has_the_shape_of_the_captured_one(scorer_url: str) -> None:
    nodes = [make_node("node-a", utilization=0.1), make_node("node-b", utilization=0.5)]
    driver, client = driver_for(scorer_url, nodes)
    try:
        driver.schedule(pod(), now_s=0.0)
    finally:
        client.close()
    verb, sent = client.sent[0]
    assert verb == "filter"
    # What the v1.36 capture 0001-filter.request.json shows, key order included.
    assert list(sent) == ["Pod", "Nodes", "NodeNames"]
    assert sent["NodeNames"] is None
    assert list(sent["Nodes"]) == ["metadata", "items"]
    assert sent["Nodes"]["metadata"] == {}
    assert _names(sent) == ["node-a", "node-b"]
    # Full Node objects, exactly as listed (managedFields included), not summaries.
    assert sent["Nodes"]["items"] == nodes
    sent_pod = sent["Pod"]
    assert set(sent_pod) == {"metadata", "spec", "status"}
    assert sent_pod["spec"]["containers"][0]["resources"]["requests"]["nvidia.com/gpu"] == "1"
    assert sent_pod["spec"]["schedulerName"] == "gpu-scheduler"
    assert sent_pod["status"]["phase"] == "Pending"
    captured = _capture("0001-filter.request.json")
    assert list(captured) == list(sent)
    assert list(captured["Nodes"]) == list(sent["Nodes"])
    assert set(captured["Pod"]) == set(sent_pod)
    captured_spec = captured["Pod"]["spec"]
    assert captured_spec["schedulerName"] == sent_pod["spec"]["schedulerName"]
    assert (
        captured_spec["containers"][0]["resources"]["requests"]["nvidia.com/gpu"]
        == sent_pod["spec"]["containers"][0]["resources"]["requests"]["nvidia.com/gpu"]
    )


def test_names_only_requests_match_the_captured_shape(tmp_path: Path) -> None:
    nodes = [
        make_node("node-cool", utilization=0.10),
        make_node("node-hot", utilization=0.97),
        make_node("node-warm", utilization=0.60),
    ]
    api = ApiServerStandIn(token="test-token")
    for node in nodes:
        api.put_node(node)
    api.start()
    cache = NodeCache(kubeconfig=str(api.write_kubeconfig(tmp_path / "kubeconfig")))
    server = HttpServer(
        ScorerApp(policy=Policy(), clock=lambda: NOW, node_store=cache.store),
        host="127.0.0.1",
        port=0,
    )
    client: RecordingClient | None = None
    try:
        cache.start()
        assert cache.wait_until(lambda c: c.ready(), timeout_s=10.0)
        server.start()
        client = RecordingClient(server.url)
        driver = SchedulerDriver(
            extender=client,
            list_nodes=api.nodes,
            config=DriverConfig(mode="names", weight=5, seed=0),
            wall_clock=lambda: NOW,
        )
        attempt = driver.schedule(pod(), now_s=0.0)
    finally:
        if client is not None:
            client.close()
        server.stop()
        cache.stop()
        api.stop()
    assert client.verbs() == ["filter", "prioritize"]
    (_, filter_body), (_, prioritize_body) = client.sent
    # What the v1.36 capture nodecache-true/0001-filter.request.json shows.
    assert list(filter_body) == ["Pod", "Nodes", "NodeNames"]
    assert filter_body["Nodes"] is None
    assert filter_body["NodeNames"] == ["node-cool", "node-hot", "node-warm"]
    assert prioritize_body["Nodes"] is None
    assert prioritize_body["NodeNames"] == ["node-cool", "node-warm"]
    assert attempt.node == "node-cool"
    assert "0.90" in attempt.rejected["node-hot"]
    captured = _capture("0001-filter.request.json", mode="nodecache-true")
    assert list(captured) == list(filter_body)
    assert captured["Nodes"] is None
    assert isinstance(captured["NodeNames"], list)


def test_prioritize_gets_only_the_nodes_that_passed(scorer_url: str) -> None:
    nodes = [
        make_node("node-cool", utilization=0.10),
        make_node("node-hot", utilization=0.97),
        make_node("node-warm", utilization=0.60),
    ]
    driver, client = driver_for(scorer_url, nodes)
    try:
        attempt = driver.schedule(pod(), now_s=0.0)
    finally:
        client.close()
    assert client.verbs() == ["filter", "prioritize"]
    prioritize_body = client.sent[1][1]
    assert _names(prioritize_body) == ["node-cool", "node-warm"]
    assert attempt.node == "node-cool"
    assert attempt.prioritized
    assert attempt.scores["node-cool"] > attempt.scores["node-warm"]
    assert "0.90" in attempt.rejected["node-hot"]
    assert attempt.rejected["node-warm"] == LOWER_SCORE


def test_a_node_without_a_free_gpu_is_never_sent(scorer_url: str) -> None:
    # node-b clearly busier: with the pod's own load (the default, 0.50 per GPU) nodes at 0.1
    # and 0.2 both score 5, and the tie would not say where the 8-GPU pod goes.
    nodes = [make_node("node-a", utilization=0.1), make_node("node-b", utilization=0.35)]
    driver, client = driver_for(scorer_url, nodes)
    try:
        first = driver.schedule(pod("big", gpus=8), now_s=0.0)
        client.sent.clear()
        second = driver.schedule(pod("small", gpus=1), now_s=1.0)
    finally:
        client.close()
    assert first.node == "node-a"
    full = first.node
    for _, body in client.sent:
        assert full not in _names(body)
    assert second.rejected[full] == INSUFFICIENT_GPU
    assert second.node == "node-b"


def test_prioritize_is_skipped_when_one_node_is_left(scorer_url: str) -> None:
    nodes = [make_node("node-hot", utilization=0.97), make_node("node-ok", utilization=0.3)]
    driver, client = driver_for(scorer_url, nodes)
    try:
        attempt = driver.schedule(pod(), now_s=0.0)
    finally:
        client.close()
    assert client.verbs() == ["filter"]
    assert attempt.node == "node-ok"
    assert not attempt.prioritized
    assert attempt.why == "only node left after the filter"


def test_no_extender_call_when_no_node_has_room(scorer_url: str) -> None:
    nodes = [make_node("node-small", utilization=0.1, gpus=4)]
    driver, client = driver_for(scorer_url, nodes)
    try:
        attempt = driver.schedule(pod(gpus=8), now_s=0.0)
    finally:
        client.close()
    assert client.sent == []
    assert attempt.node is None
    assert attempt.why == f"0/1 nodes are available: 1 {INSUFFICIENT_GPU}."


def test_every_node_rejected_leaves_the_pod_pending_with_the_event_text(scorer_url: str) -> None:
    nodes = [
        make_node("node-full", utilization=0.1, gpus=1),
        make_node("node-hot", utilization=0.95),
    ]
    driver, client = driver_for(scorer_url, nodes)
    try:
        driver.schedule(pod("holder", gpus=1, run_s=100.0), now_s=0.0)
        driver.submit(pod("waiting", gpus=1), now_s=1.0)
        attempts = driver.step(now_s=1.0)
    finally:
        client.close()
    (attempt,) = attempts
    assert attempt.node is None
    assert attempt.why.startswith("0/2 nodes are available: ")
    assert f"1 {INSUFFICIENT_GPU}" in attempt.why
    assert driver.pending_pods() == 1


def test_model_preference_falls_back_when_the_preferred_model_is_busy(scorer_url: str) -> None:
    nodes = [
        make_node("node-a100", utilization=0.85, product="NVIDIA-A100-SXM4-80GB"),
        make_node("node-v100", utilization=0.40, product="Tesla-V100-SXM2-32GB"),
        make_node("node-t4", utilization=0.05, product="Tesla-T4"),
    ]
    driver, client = driver_for(scorer_url, nodes)
    try:
        busy = driver.schedule(
            pod("prefers", gpu_model_preference="A100,V100", gpu_fallback_utilization="0.80"),
            now_s=0.0,
        )
    finally:
        client.close()
    assert busy.node == "node-v100"
    assert busy.rejected["node-a100"]
    assert busy.rejected["node-t4"]


def test_pods_end_and_release_their_gpus_and_load(scorer_url: str) -> None:
    nodes = [make_node("node-a", utilization=0.1, gpus=2)]
    load = RecordingLoad()
    driver, client = driver_for(scorer_url, nodes, load=load)
    try:
        driver.submit(pod("short", gpus=2, run_s=5.0), now_s=0.0)
        driver.step(now_s=0.0)
        assert driver.allocation.used("node-a") == 2
        driver.step(now_s=5.0)
    finally:
        client.close()
    assert driver.allocation.used("node-a") == 0
    assert load.events == [("start", "node-a", "short"), ("end", "node-a", "short")]
    assert [b.pod.name for b in driver.finished] == ["short"]


def test_ties_are_broken_the_same_way_for_the_same_seed(scorer_url: str) -> None:
    nodes = [make_node(f"node-{i}", utilization=0.2) for i in range(4)]

    def choices(seed: int) -> list[str | None]:
        driver, client = driver_for(scorer_url, nodes, seed=seed)
        try:
            attempts = [driver.schedule(pod(f"p{i}"), now_s=float(i)) for i in range(6)]
        finally:
            client.close()
        assert all("tie of" in a.why for a in attempts)
        return [a.node for a in attempts]

    picked = choices(3)
    assert picked == choices(3)
    assert len(set(picked)) > 1


def test_an_unreachable_extender_leaves_the_pod_pending_with_the_error() -> None:
    nodes = [make_node("node-a", utilization=0.1), make_node("node-b", utilization=0.2)]
    driver, client = driver_for("http://127.0.0.1:9", nodes)
    attempt = driver.schedule(pod(), now_s=0.0)
    assert client.verbs() == ["filter"]
    assert attempt.node is None
    assert attempt.error
    assert attempt.why.startswith("extender filter failed")
    assert driver.allocation.running() == []


# ----------------------------------------------------------------------------------------------
# Pure pieces


@pytest.mark.parametrize(
    ("reasons", "expected"),
    [
        pytest.param(
            ["Insufficient nvidia.com/gpu"],
            "0/3 nodes are available: 1 Insufficient nvidia.com/gpu.",
            id="one-reason",
        ),
        pytest.param(
            ["b", "a", "b"],
            "0/3 nodes are available: 1 a, 2 b.",
            id="counted-and-sorted-as-strings",
        ),
        pytest.param(
            ["gpu utilization above 0.90"] * 12 + ["x"] * 3,
            "0/3 nodes are available: 12 gpu utilization above 0.90, 3 x.",
            id="sorted-as-strings-not-by-count",
        ),
    ],
)
def test_failed_scheduling_message(reasons: list[str], expected: str) -> None:
    assert failed_scheduling_message(3, reasons) == expected


def test_pod_stream_is_fixed_by_its_seed() -> None:
    def stream(seed: int) -> list[PodSpec]:
        factory = PodFactory(seed=seed)
        return [factory.next() for _ in range(20)]

    assert stream(5) == stream(5)
    assert stream(5) != stream(6)


def test_pod_stream_mixes_sizes_and_hints() -> None:
    factory = PodFactory(seed=1)
    pods = [factory.next() for _ in range(300)]
    assert {p.gpus for p in pods} == {1, 2, 4, 8}
    assert any(p.hint("gpu-model-preference") == "A100,V100" for p in pods)
    assert any(p.hint("min-gpu-memory-mib") for p in pods)
    assert len({p.name for p in pods}) == 300


@given(st.lists(st.floats(min_value=0, max_value=1e6), min_size=1, max_size=200))
def test_percentiles_are_samples_and_ordered(samples: list[float]) -> None:
    ordered = sorted(samples)
    p50, p99 = percentile(ordered, 50), percentile(ordered, 99)
    assert p50 in ordered
    assert p99 in ordered
    assert ordered[0] <= p50 <= p99 <= ordered[-1]


def _names(body: Mapping[str, Any]) -> list[str]:
    return [n["metadata"]["name"] for n in body["Nodes"]["items"]]


# ----------------------------------------------------------------------------------------------
# Replies a real scheduler treats specially (the captures show each), from a canned extender


class CannedExtender(ExtenderClient):
    """Answers from a table instead of HTTP, to reach replies the real scorer never gives."""

    def __init__(self, replies: dict[str, Any]) -> None:
        super().__init__("http://127.0.0.1:9")
        self.replies = replies
        self.verbs: list[str] = []

    def post(self, verb: str, body: dict[str, Any]) -> Any:
        self.verbs.append(verb)
        reply = self.replies[verb]
        return reply(body) if callable(reply) else reply


def _echo_items(body: dict[str, Any]) -> dict[str, Any]:
    return {"Nodes": {"items": body["Nodes"]["items"]}, "FailedNodes": {}, "Error": ""}


@pytest.mark.parametrize(
    ("replies", "placed_on", "why_starts", "error"),
    [
        pytest.param(
            {"filter": {"Nodes": None, "FailedNodes": {}, "Error": "scorer broke"}},
            None,
            "extender filter failed: scorer broke",
            True,
            id="error-field-set",
        ),
        pytest.param(
            {"filter": {"NodeNames": ["node-a", "node-b"], "Nodes": None, "Error": ""}},
            None,
            "0/2 nodes are available: 2 rejected by the extender without a reason.",
            False,
            id="names-reply-in-full-node-mode-passes-nothing",
        ),
        pytest.param(
            {"filter": {"Nodes": {"items": [{"metadata": {"name": "node-x"}}]}, "Error": ""}},
            None,
            "extender filter failed: filter returned nodes that were not sent",
            True,
            id="unknown-node-in-reply",
        ),
        pytest.param(
            {"filter": _echo_items, "prioritize": {"Host": "node-a"}},
            None,
            "extender prioritize failed: prioritize reply is not a list",
            True,
            id="prioritize-not-a-list",
        ),
        pytest.param(
            {
                "filter": lambda body: {
                    "nodes": {"items": body["Nodes"]["items"]},
                    "failednodes": {},
                    "error": "",
                },
                "prioritize": [{"host": "node-a", "score": 2}, {"host": "node-b", "score": 9}],
            },
            "node-b",
            "best score 9/10 of 2",
            False,
            id="lower-case-keys-are-read",
        ),
    ],
)
def test_replies_are_read_as_the_scheduler_reads_them(
    replies: dict[str, Any], placed_on: str | None, why_starts: str, error: bool
) -> None:
    nodes = [make_node("node-a", utilization=0.1), make_node("node-b", utilization=0.2)]
    driver = SchedulerDriver(
        extender=CannedExtender(replies), list_nodes=lambda: nodes, wall_clock=lambda: NOW
    )
    attempt = driver.schedule(pod(), now_s=0.0)
    assert attempt.node == placed_on
    assert attempt.why.startswith(why_starts)
    assert (attempt.error is not None) is error
    assert driver.allocation.used("node-a") + driver.allocation.used("node-b") == (
        1 if placed_on else 0
    )


def test_pending_pods_back_off_like_the_scheduler() -> None:
    driver = SchedulerDriver(
        extender=CannedExtender({}), list_nodes=lambda: [], wall_clock=lambda: NOW
    )
    assert [driver.backoff_s(n) for n in range(1, 8)] == [1, 2, 4, 8, 10, 10, 10]
    driver.submit(pod("waits"), now_s=0.0)
    tried_at = [t for t in (0.0, 0.5, 1.0, 2.0, 3.0, 5.0) if driver.step(now_s=t)]
    assert tried_at == [0.0, 1.0, 3.0]
