"""Reply reuse in names-only mode: safe (same bytes as a fresh evaluation) and observable.

The safety argument has two halves, each tested here: `Evaluation.valid_until` (time alone cannot
change a verdict before it), and the key (every other input of a verdict: pod hints and GPU
request, the node cache generation, the exact node list, the policy).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exporter_scheduler.nodecache import NodeCache
from exporter_scheduler.policy import Policy
from exporter_scheduler.replycache import CachedReply, ReplyCache
from exporter_scheduler.scoring import NodeInput, PodInput, evaluate
from exporter_scheduler.server import ScorerApp
from gpu_contract.schema import Keys
from tests.scorer._http_helpers import args_body, gpu_annotations, node, pod
from tests.scorer.scoring_builders import NOW, PREFIX
from tests.scorer.scoring_builders import node as scoring_node

UTIL = PREFIX + "utilization"
MS = timedelta(milliseconds=1)


class Clock:
    def __init__(self, now: datetime = NOW) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


class VersionedSource:
    """A node source with a generation, like `NodeCache`."""

    def __init__(self, nodes: dict[str, NodeInput]) -> None:
        self.nodes = nodes
        self.generation = 0
        self.lookups = 0

    def ready(self) -> bool:
        return True

    def lookup(self, names: Sequence[str]) -> list[NodeInput]:
        self.lookups += 1
        return [self.nodes.get(n) or NodeInput(n, {}, None) for n in names]

    def put(self, node_input: NodeInput) -> None:
        self.nodes[node_input.name] = node_input
        self.generation += 1


def _source() -> VersionedSource:
    return VersionedSource(
        {
            "cool": NodeInput("cool", gpu_annotations(utilization=0.10), None),
            "hot": NodeInput("hot", gpu_annotations(utilization=0.95), None),
            "old": NodeInput("old", gpu_annotations(updated_at=NOW - timedelta(seconds=170)), None),
        }
    )


NAMES = ["cool", "hot", "old", "unknown"]


def _app(source: Any, clock: Clock, **kwargs: Any) -> ScorerApp:
    return ScorerApp(policy=Policy(), clock=clock, node_source=source, **kwargs)


def _metric(app: ScorerApp, line_start: str) -> float:
    for line in app.metrics.render()[0].decode().splitlines():
        if line.startswith(line_start + " "):
            return float(line.split()[-1])
    return 0.0


def _fresh(source: Any, clock: Clock, verb: Any, body: bytes) -> bytes:
    """The reply of an app that has never seen a request: the reference for a reused one."""
    return _app(source, clock, reply_cache_entries=0).handle(verb, body).body


# ----------------------------------------------------------------------------- valid_until


@pytest.mark.parametrize(
    ("nodes", "expected"),
    [
        pytest.param(
            [scoring_node(age_s=5)], NOW + timedelta(seconds=175) - MS, id="fresh-until-stale"
        ),
        pytest.param(
            [scoring_node("a", age_s=5), scoring_node("b", age_s=100)],
            NOW + timedelta(seconds=80) - MS,
            id="earliest-node-wins",
        ),
        pytest.param(
            [scoring_node(age_s=5, write_age_s=60)],
            NOW + timedelta(seconds=120) - MS,
            id="server-write-time-stales-first",
        ),
        pytest.param([scoring_node(age_s=-90)], NOW + timedelta(seconds=60) - MS, id="skew-ends"),
        pytest.param([scoring_node(age_s=999)], None, id="stale-stays-stale"),
        pytest.param([NodeInput("blank", {})], None, id="missing-data-does-not-age"),
        pytest.param([], None, id="no-nodes"),
    ],
)
def test_valid_until(nodes: list[NodeInput], expected: datetime | None) -> None:
    evaluation = evaluate(PodInput("d", "p", {}), nodes, NOW, Policy())
    assert evaluation.valid_until == expected


def _outcomes(nodes: list[NodeInput], now: datetime) -> list[tuple[bool, str | None, int]]:
    evaluation = evaluate(PodInput("d", "p", {}), nodes, now, Policy())
    return [(v.passed, v.reason, v.score) for v in evaluation.verdicts]


@settings(max_examples=60, deadline=None)
@given(
    ages=st.lists(st.floats(min_value=-120, max_value=400), min_size=1, max_size=6),
    write_ages=st.lists(st.one_of(st.none(), st.floats(-60, 400)), min_size=6, max_size=6),
    fraction=st.floats(min_value=0, max_value=1),
)
def test_no_verdict_changes_before_valid_until(
    ages: list[float], write_ages: list[float | None], fraction: float
) -> None:
    nodes = [
        scoring_node(f"n{i}", age_s=age, write_age_s=write_ages[i], utilization=0.5)
        for i, age in enumerate(ages)
    ]
    evaluation = evaluate(PodInput("d", "p", {}), nodes, NOW, Policy())
    later_s = 10_000.0 if evaluation.valid_until is None else 0.0
    if evaluation.valid_until is not None:
        later_s = (evaluation.valid_until - NOW).total_seconds()
        assert later_s >= -0.001
    later = NOW + timedelta(seconds=max(0.0, later_s) * fraction)
    if evaluation.valid_until is not None and later >= evaluation.valid_until:
        later = NOW
    assert _outcomes(nodes, later) == _outcomes(nodes, NOW)


# ----------------------------------------------------------------------------- the server


def test_repeat_request_reuses_the_same_bytes_and_counts_again() -> None:
    source, clock = _source(), Clock()
    app = _app(source, clock)
    body = args_body(pod(), names=NAMES)
    first = app.handle("filter", body)
    second = app.handle("filter", body)
    assert first.status == second.status == 200
    assert source.lookups == 1
    assert second.body == first.body == _fresh(source, clock, "filter", body)
    assert json.loads(second.body)["FailedNodes"] == {"hot": "gpu utilization above 0.90"}
    # Metrics count each request's verdicts, reused or not.
    assert _metric(app, 'gpu_scorer_node_data_total{status="fresh"}') == 6
    assert _metric(app, 'gpu_scorer_node_data_total{status="missing"}') == 2
    failed = (
        'gpu_scorer_filter_verdicts_total{outcome="failed",reason="gpu utilization above 0.90"}'
    )
    assert _metric(app, failed) == 2
    assert _metric(app, 'gpu_scorer_request_nodes_count{verb="filter"}') == 2
    assert _metric(app, 'gpu_scorer_reply_cache_requests_total{result="hit",verb="filter"}') == 1
    assert _metric(app, 'gpu_scorer_reply_cache_requests_total{result="miss",verb="filter"}') == 1


def test_prioritize_is_reused_per_verb() -> None:
    source, clock = _source(), Clock()
    app = _app(source, clock)
    body = args_body(pod(), names=NAMES)
    filtered = app.handle("filter", body).body
    scores = app.handle("prioritize", body).body
    assert scores != filtered
    assert app.handle("prioritize", body).body == scores
    assert source.lookups == 2
    assert scores == _fresh(source, clock, "prioritize", body)


def _changed(source: VersionedSource, clock: Clock, app: ScorerApp) -> None:
    source.put(NodeInput("cool", gpu_annotations(utilization=0.97), None))


def _later(source: VersionedSource, clock: Clock, app: ScorerApp) -> None:
    # "old" was written 170 s before NOW: it turns stale 10 s later.
    clock.now = NOW + timedelta(seconds=11)


def _earlier(source: VersionedSource, clock: Clock, app: ScorerApp) -> None:
    clock.now = NOW - timedelta(seconds=1)


def _new_policy(source: VersionedSource, clock: Clock, app: ScorerApp) -> None:
    app.policy = Policy(utilization_limit=0.5)


@pytest.mark.parametrize(
    ("change", "second_body"),
    [
        pytest.param(_changed, args_body(pod(), names=NAMES), id="node-data-changed"),
        pytest.param(_later, args_body(pod(), names=NAMES), id="past-valid-until"),
        pytest.param(_earlier, args_body(pod(), names=NAMES), id="clock-stepped-back"),
        pytest.param(_new_policy, args_body(pod(), names=NAMES), id="policy-replaced"),
        pytest.param(None, args_body(pod(), names=NAMES[::-1]), id="node-order"),
        pytest.param(None, args_body(pod(), names=NAMES[:2]), id="node-subset"),
        pytest.param(
            None, args_body(pod({PREFIX + "max-utilization": "0.05"}), names=NAMES), id="hint"
        ),
        pytest.param(None, args_body(pod(gpus=2), names=NAMES), id="gpu-request"),
    ],
)
def test_any_changed_input_is_evaluated_afresh(change: Any, second_body: bytes) -> None:
    source, clock = _source(), Clock()
    app = _app(source, clock)
    app.handle("filter", args_body(pod(), names=NAMES))
    if change is not None:
        change(source, clock, app)
    reply = app.handle("filter", second_body)
    assert source.lookups == 2
    fresh = ScorerApp(policy=app.policy, clock=clock, node_source=source, reply_cache_entries=0)
    assert reply.body == fresh.handle("filter", second_body).body


def test_another_pod_with_the_same_inputs_reuses() -> None:
    source, clock = _source(), Clock()
    app = _app(source, clock)
    app.handle("filter", args_body(pod(name="first"), names=NAMES))
    unrelated = {"kubectl.kubernetes.io/last-applied-configuration": "{}"}
    clock.now = NOW + timedelta(seconds=9)  # "old" is still fresh
    app.handle("filter", args_body(pod(unrelated, name="second"), names=NAMES))
    assert source.lookups == 1


def test_without_a_generation_every_request_is_evaluated() -> None:
    source, clock = _source(), Clock()

    class Plain:
        ready = source.ready
        lookup = source.lookup

    app = _app(Plain(), clock)
    body = args_body(pod(), names=NAMES)
    assert app.handle("filter", body).body == app.handle("filter", body).body
    assert source.lookups == 2


def test_explain_and_full_node_requests_are_never_reused() -> None:
    source, clock = _source(), Clock()
    app = _app(source, clock)
    body = args_body(pod(), names=NAMES)
    app.handle("explain", body)
    app.handle("explain", body)
    assert source.lookups == 2
    full = args_body(pod(), nodes=[node("a", gpu_annotations())])
    app.handle("filter", full)
    app.handle("filter", full)
    assert len(app.reply_cache or ()) == 0


def test_malformed_names_are_still_400() -> None:
    app = _app(_source(), Clock())
    response = app.handle("filter", b'{"Pod": {}, "Nodes": null, "NodeNames": [1]}')
    assert response.status == 400
    assert "$.NodeNames[0]" in json.loads(response.body)["Error"]


def test_hit_logs_one_line_naming_where_the_values_are(caplog: pytest.LogCaptureFixture) -> None:
    app = _app(_source(), Clock())
    with caplog.at_level(logging.INFO, logger="exporter_scheduler.server"):
        app.handle("filter", args_body(pod(name="first"), names=NAMES))
        per_node = [r for r in caplog.records if r.getMessage() == "node rejected"]
        assert [r.fields["node"] for r in per_node] == ["hot"]  # type: ignore[attr-defined]
        caplog.clear()
        app.handle("filter", args_body(pod(name="second"), names=NAMES))
    (record,) = caplog.records
    assert record.getMessage() == "nodes rejected (verdicts reused)"
    assert record.fields == {  # type: ignore[attr-defined]
        "pod": "default/second",
        "rejected": 1,
        "unresolvable": 0,
        "verdicts_from": "default/first",
        "verdicts_computed_at": "2026-11-30T14:00:00Z",
    }


def test_cache_is_a_bounded_lru() -> None:
    cache = ReplyCache(2)
    policy = Policy()

    def entry(tag: bytes) -> CachedReply:
        return CachedReply(tag, NOW, None, policy, 0, None, 0, 0, None, "d/p")

    for tag in (b"a", b"b"):
        cache.put(("filter", 0, (), 0, tag), entry(tag))
    assert cache.get(("filter", 0, (), 0, b"a"), NOW, policy) is not None  # a is now newest
    cache.put(("filter", 0, (), 0, b"c"), entry(b"c"))
    assert len(cache) == 2
    assert cache.get(("filter", 0, (), 0, b"b"), NOW, policy) is None
    assert cache.get(("filter", 0, (), 0, b"a"), NOW, policy) is not None
    with pytest.raises(ValueError, match="at least one"):
        ReplyCache(0)


# ----------------------------------------------------------------------------- the node cache


def _event(kind: str, doc: dict[str, Any]) -> bytes:
    return json.dumps({"type": kind, "object": doc}).encode()


def test_node_cache_generation_and_predecoding() -> None:
    cache = NodeCache()
    start = cache.generation
    cache._apply(_event("ADDED", node("a", gpu_annotations(utilization=0.30))))
    assert cache.generation == start + 1
    (a,) = cache.lookup(["a"])
    assert a.predecoded is not None
    prefix, decoded = a.predecoded
    assert prefix == PREFIX
    assert decoded.state is not None
    assert decoded.state.utilization == 0.30

    # A change the scorer does not read (labels, kubelet status) keeps the generation.
    relabelled = node("a", gpu_annotations(utilization=0.30))
    relabelled["metadata"]["labels"]["zone"] = "b"
    relabelled["metadata"]["annotations"]["other.example.com/x"] = "y"
    cache._apply(_event("MODIFIED", relabelled))
    assert cache.generation == start + 1
    assert cache.lookup(["a"])[0] is a

    cache._apply(_event("MODIFIED", node("a", gpu_annotations(utilization=0.40))))
    assert cache.generation == start + 2
    cache._apply(_event("DELETED", node("a")))
    assert cache.generation == start + 3
    cache._apply(_event("DELETED", node("a")))  # already gone
    assert cache.generation == start + 3


def test_predecoded_nodes_give_the_same_verdicts() -> None:
    cache = NodeCache()
    docs = [
        node("ok", gpu_annotations(utilization=0.30)),
        node("hot", gpu_annotations(utilization=0.99)),
        node("bad", {UTIL: "nan", PREFIX + "schema-version": "1"}),
        node("blank"),
    ]
    for doc in docs:
        cache._apply(_event("ADDED", doc))
    names = ["ok", "hot", "bad", "blank", "absent"]
    from_cache = cache.lookup(names)
    plain = [NodeInput(n.name, n.annotations, n.agent_write_time) for n in from_cache]
    assert all(n.predecoded is not None for n in from_cache[:4])
    the_pod = PodInput("d", "p", {})
    assert evaluate(the_pod, from_cache, NOW, Policy()) == evaluate(the_pod, plain, NOW, Policy())
    # A predecode for another prefix is ignored, not trusted.
    other = Policy(keys=Keys.for_prefix("other.example.com/"))
    assert evaluate(the_pod, from_cache, NOW, other) == evaluate(the_pod, plain, NOW, other)


_LISTS = (NAMES, ["skewed", "cool", "old"], ["hot", "new"])
_STEP = st.one_of(
    st.tuples(
        st.just("request"),
        st.sampled_from(["filter", "prioritize"]),
        st.sampled_from([{}, {PREFIX + "max-utilization": "0.05"}, {PREFIX + "x": "y"}]),
        st.sampled_from(_LISTS),
    ),
    # Across the boundaries: "old" turns stale after 10 s, "skewed" stops being skewed after 15 s.
    st.tuples(st.just("advance"), st.sampled_from([0.0, 4.0, 6.0, 11.0, 40.0, -1.0])),
    st.tuples(
        st.just("write"), st.sampled_from(["cool", "hot", "new"]), st.sampled_from([0.1, 0.95])
    ),
)


@settings(max_examples=150, deadline=None)
@given(steps=st.lists(_STEP, min_size=1, max_size=30))
def test_reused_replies_always_equal_fresh_ones(steps: list[tuple[Any, ...]]) -> None:
    """Any sequence of requests, clock moves and node writes: cached == evaluated afresh."""
    source, clock = _source(), Clock()
    source.nodes["skewed"] = NodeInput(
        "skewed", gpu_annotations(updated_at=NOW + timedelta(seconds=45)), None
    )
    app = _app(source, clock)
    for step in steps:
        if step[0] == "advance":
            clock.now += timedelta(seconds=step[1])
        elif step[0] == "write":
            _, name, utilization = step
            annotations = gpu_annotations(utilization=utilization, updated_at=clock.now)
            source.put(NodeInput(name, annotations, None))
        else:
            _, verb, hints, names = step
            body = args_body(pod(hints), names=names)
            assert app.handle(verb, body).body == _fresh(source, clock, verb, body)
