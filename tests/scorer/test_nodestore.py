"""Verdicts kept ahead of the request: every reply is the bytes a fresh `evaluate` gives.

The reference is `evaluate` over the same node data at the same `now`, encoded the plain way
(`wire.encode_filter_reply`, `wire.encode_prioritize_reply`), counted the plain way
(`ScorerMetrics.tally_verdicts`). The property drives random sequences of node writes, deletes,
relists, expiry refreshes, clock moves both ways and requests of both modes (names only through
the node store, full Nodes through the app's content tables, with the body laid out as Go writes
it or otherwise) and compares every reply; the named cases pin the boundaries a table could get
wrong, and a threaded case checks that a request never sees a torn node.
"""

from __future__ import annotations

import json
import logging
import random
import threading
from collections import Counter
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exporter_scheduler.core.decoding import predecode
from exporter_scheduler.core.inflight import BoundPod
from exporter_scheduler.core.judge import evaluate
from exporter_scheduler.core.podclass import PodClass
from exporter_scheduler.core.policy import Policy
from exporter_scheduler.core.records import NodeInput, PodInput
from exporter_scheduler.serving import wire
from exporter_scheduler.serving.app import ScorerApp
from exporter_scheduler.serving.metrics import ScorerMetrics, Verb
from exporter_scheduler.serving.nodestore import NodeStore
from exporter_scheduler.serving.verdicts import Prepared, TallyKey
from gpu_contract.schema import DEFAULT_KEYS, FIELD_MANAGER, GpuState, Health, format_timestamp
from tests.scorer._http_helpers import pod
from tests.scorer.scoring_builders import A100, NOW, PREFIX, T4, V100, bound_pod
from tests.scorer.scoring_builders import node as scoring_node

NAMES = ("n0", "n1", "n2", "n3", "n4", "n5")


class Clock:
    def __init__(self, now: datetime = NOW) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


def gpu_node(name: str, **kwargs: Any) -> NodeInput:
    """A node through the real contract, decoded ahead as the node cache does."""
    plain = scoring_node(name, **kwargs)
    predecoded = (PREFIX, predecode(plain.annotations, DEFAULT_KEYS))
    return NodeInput(name, plain.annotations, plain.agent_write_time, predecoded)


def hinted(hints: dict[str, str] | None = None, *, gpus: int = 1) -> dict[str, Any]:
    return pod({PREFIX + k: v for k, v in (hints or {}).items()}, gpus=gpus)


PODS = (
    hinted(),
    hinted(gpus=4),
    hinted({"gpu-model-preference": f"{A100},{V100}"}),
    hinted({"gpu-model-preference": f"{V100},*", "gpu-fallback-utilization": "0.40"}, gpus=2),
    hinted({"min-gpu-memory-mib": "60000", "max-utilization": "0.70"}, gpus=2),
    hinted({"max-utilization": "lots"}),  # invalid: every node rejected for it
    hinted(gpus=0),  # no GPU request: the per-GPU keys are not read
)


def node_json(node: NodeInput, *, typed: bool) -> dict[str, Any]:
    """`node` as a Node object in a full-node request (with TypeMeta when `typed`)."""
    managed: list[dict[str, Any]] = [{"manager": "kubelet", "time": "2026-11-30T13:00:00Z"}]
    if node.agent_write_time is not None:
        managed.append({"manager": FIELD_MANAGER, "time": format_timestamp(node.agent_write_time)})
    document: dict[str, Any] = {"kind": "Node", "apiVersion": "v1"} if typed else {}
    document["metadata"] = {
        "name": node.name,
        "labels": {"kubernetes.io/hostname": node.name},
        "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{}"}
        | dict(node.annotations),
        "managedFields": managed,
    }
    document["spec"] = {"providerID": f"x://{node.name}"}
    document["status"] = {"allocatable": {"nvidia.com/gpu": "8"}, "images": [{"names": ["a"]}]}
    return document


def names_body(pod_doc: dict[str, Any], names: Sequence[str]) -> bytes:
    return json.dumps(
        {"Pod": pod_doc, "Nodes": None, "NodeNames": list(names)}, separators=(",", ":")
    ).encode()


def nodes_body(pod_doc: dict[str, Any], nodes: Sequence[NodeInput], layout: str) -> bytes:
    """Go's compact layout (`go`, `go-typed`) or Python's spaced one (`spaced`), which the
    decoder must read the general way."""
    items = [node_json(n, typed=layout == "go-typed") for n in nodes]
    document = {"Pod": pod_doc, "Nodes": {"metadata": {}, "items": items}, "NodeNames": None}
    if layout == "spaced":
        return json.dumps(document).encode()
    return json.dumps(document, separators=(",", ":")).encode()


def reference(
    verb: Verb, body: bytes, nodes: Sequence[NodeInput], now: datetime, policy: Policy
) -> tuple[bytes, Counter[TallyKey]]:
    """(reply bytes, verdict counts) of a fresh evaluation of `nodes`, encoded the plain way.

    A full-node filter reply is built here from the request's items as `json` wrote them, not
    with the decoder's view of the body, so that the echo is checked too."""
    document = json.loads(body)
    the_pod = wire.decode_args(body, gpu_resource_name=policy.gpu_resource_name).pod
    evaluation = evaluate(the_pod, nodes, now, policy)
    counts = Counter(
        (v.passed, v.unresolvable, v.reason, v.data_status) for v in evaluation.verdicts
    )
    if verb == "prioritize":
        return wire.encode_prioritize_reply(evaluation.scores()), counts

    def encoded(value: object) -> bytes:
        return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()

    tail = (
        b',"FailedNodes":' + encoded(evaluation.failed())
        + b',"FailedAndUnresolvableNodes":' + encoded(evaluation.unresolvable())
        + b',"Error":""}'
    )  # fmt: skip
    passed = set(evaluation.passed_names())
    if document["Nodes"] is None:
        names = [n for n in document["NodeNames"] if n in passed]
        return b'{"Nodes":null,"NodeNames":' + encoded(names) + tail, counts
    compact = b'"NodeNames":null}' in body  # how the body was written, so the items too
    separators = (",", ":") if compact else (", ", ": ")
    items = [
        json.dumps(item, separators=separators).encode()
        for item in document["Nodes"]["items"]
        if item["metadata"]["name"] in passed
    ]
    return b'{"Nodes":{"items":[' + b",".join(items) + b']},"NodeNames":null' + tail, counts


def counters(metrics: ScorerMetrics) -> Counter[str]:
    text = metrics.render()[0].decode()
    found: Counter[str] = Counter()
    for line in text.splitlines():
        if line.startswith(("gpu_scorer_filter_verdicts_total", "gpu_scorer_node_data_total")):
            name, value = line.rsplit(" ", 1)
            found[name] = int(float(value))
    return found


# ----------------------------------------------------------------------------- the property

node_data = st.fixed_dictionaries(
    {
        # Around the stale (180 s) and skew (-30 s) boundaries, and well inside.
        "age_s": st.one_of(
            st.floats(-60, 400), st.floats(0, 180), st.sampled_from([-30.5, 5.0, 179.5])
        ),
        "write_age_s": st.one_of(st.none(), st.floats(-40, 400), st.just(179.5)),
        "health": st.sampled_from([Health.OK, Health.OK, Health.UNAVAILABLE]),
        "utilization": st.one_of(st.none(), st.sampled_from([0.0, 0.3, 0.5, 0.75, 0.95])),
        "temperature_c": st.one_of(st.none(), st.integers(30, 95)),
        "model": st.sampled_from([A100, V100, T4, None]),
        "largest_free_mib": st.one_of(st.none(), st.sampled_from([20_000, 80_000])),
        # Per-GPU tables, mostly short, for the k-GPU rule (None: no per-GPU keys).
        "per_gpu": st.one_of(
            st.none(),
            st.lists(
                st.builds(
                    GpuState,
                    utilization=st.sampled_from([None, 0.0, 0.5, 0.72, 0.95]),
                    memory_free_mib=st.sampled_from([None, 10_000, 60_000, 80_000]),
                    temperature_c=st.sampled_from([None, 50, 90]),
                    allocated=st.sampled_from([None, False, True]),
                ),
                min_size=1,
                max_size=5,
            ),
        ),
    }
)

# GPU pods bound to a node (the pod watch's `set_pods` / `replace_pods`), around the
# boundaries of data sampled 5 s to 180 s ago: admitted or running before or after the sample,
# the 60 s load delay, the 600 s time bound and a proposal's 10 s.
pod_age = st.one_of(st.none(), st.sampled_from([0.0, 4.0, 9.5, 30.0, 70.0, 595.0, 600.0]))
node_pods = st.lists(
    st.builds(
        bound_pod,
        name=st.sampled_from(["a", "b", "c"]),
        gpus=st.integers(0, 4),
        bound_age_s=pod_age,
        admitted_age_s=pod_age,
        running_age_s=pod_age,
        gpu_load=st.sampled_from([None, 0.5]),
        memory_mib=st.sampled_from([None, 30_000]),
        provisional=st.booleans(),
    ),
    max_size=3,
    unique_by=lambda p: p.name,
).map(tuple)

# Mostly the plain pod, so that requests meet the entries earlier requests and writes made.
pod_index = st.one_of(st.just(0), st.integers(0, len(PODS) - 1))
names_request = st.tuples(
    st.just("names"),
    st.sampled_from(["filter", "prioritize"]),
    pod_index,
    # A few standing node lists (the scheduler repeats its list), random ones, duplicates.
    st.one_of(
        st.sampled_from([NAMES, NAMES[::-1], ("n0", "n2", "ghost")]),
        st.lists(st.sampled_from([*NAMES, "ghost"]), max_size=8).map(tuple),
    ),
)
step = st.one_of(
    names_request,
    names_request,  # requests twice as likely: most sequences reuse what an earlier one kept
    st.tuples(
        st.just("nodes"),
        st.sampled_from(["filter", "prioritize"]),
        pod_index,
        st.lists(st.sampled_from(NAMES), max_size=6, unique=True).map(tuple),
        st.sampled_from(["go", "go-typed", "spaced"]),
    ),
    # The prioritize kube-scheduler sends after a filter: the nodes that passed, in order
    # (the one the filter's reply prepared, unless something changed in between).
    st.tuples(st.just("follow")),
    st.tuples(st.just("write"), st.sampled_from(NAMES), node_data),
    st.tuples(st.just("delete"), st.sampled_from(NAMES)),
    st.tuples(st.just("relist")),
    st.tuples(st.just("refresh")),
    # Bound pods set for one node or all at once, before or after its data arrives.
    st.tuples(st.just("pods"), st.sampled_from([*NAMES, "ghost"]), node_pods),
    st.tuples(
        st.just("replace_pods"), st.dictionaries(st.sampled_from(NAMES), node_pods, max_size=3)
    ),
    # Forward and backward, small steps (inside windows) and large ones (across them).
    st.tuples(
        st.just("clock"),
        st.one_of(
            # Steps that cross the boundaries of the data above (stale at 180 s, skew 30 s).
            st.sampled_from([0.6, 1.0, 2.0, 31.0, 60.0, 181.0, -1.0, -31.0]),
            st.floats(-200, 200),
            st.floats(-2, 2),
        ),
    ),
)


@settings(max_examples=1000, deadline=None)
@given(
    initial=st.lists(node_data, min_size=len(NAMES), max_size=len(NAMES)),
    steps=st.lists(step, min_size=1, max_size=30),
    strict=st.booleans(),
    max_classes=st.sampled_from([1, 3, 16]),
)
def test_replies_match_a_fresh_evaluation(
    initial: list[dict[str, Any]], steps: list[tuple[Any, ...]], strict: bool, max_classes: int
) -> None:
    clock = Clock()
    policy = Policy(missing_data="strict" if strict else "lenient")
    store = NodeStore(clock=clock, max_classes=max_classes)
    store.replace(gpu_node(name, **data) for name, data in zip(NAMES, initial, strict=True))
    app = ScorerApp(policy=policy, clock=clock, node_store=store)
    expected_counts: Counter[str] = Counter()
    reference_metrics = ScorerMetrics()
    bound: dict[str, tuple[Any, ...]] = {}  # the pods set, by node (kept apart from the store)
    passed: tuple[int, list[str]] | None = None  # the last names filter's pod and passed nodes
    for action, *args in steps:
        if action == "follow":
            if passed is not None:
                body = names_body(PODS[passed[0]], passed[1])
                want, _ = reference("prioritize", body, store.lookup(passed[1]), clock.now, policy)
                assert app.handle("prioritize", body).body == want
        elif action in ("names", "nodes"):
            verb, pod_index, names, *layout = args
            if action == "names":
                body = names_body(PODS[pod_index], names)
                nodes = store.lookup(names)
                # The store's nodes carry the pods last set for them, whatever the order.
                known = set(store.names())
                assert [n.pods for n in nodes] == [
                    bound.get(n.name, ()) if n.name in known else () for n in nodes
                ]
            else:
                cached = store.lookup([n for n in names if n in store.names()])
                body = nodes_body(PODS[pod_index], cached, layout[0])
                # The Nodes as the request carries them (managedFields times have whole
                # seconds, so they may differ from the cached ones).
                nodes = wire.decode_args(body, gpu_resource_name=GPU).nodes
            want, counts = reference(verb, body, nodes, clock.now, policy)
            got = app.handle(verb, body)
            assert got.status == 200
            assert got.body == want
            if action == "names" and verb == "filter":
                passed = (pod_index, json.loads(got.body)["NodeNames"])
            if verb == "filter":
                reference_metrics.add_tally(reference_metrics.tally_counts(counts))
        elif action == "write":
            name, data = args
            store.put(gpu_node(name, **data))
        elif action == "delete":
            store.delete(args[0])
        elif action == "relist":
            # Every entry rebuilt (new objects, the same data), as after a LIST.
            store.replace(
                NodeInput(n.name, dict(n.annotations), n.agent_write_time, n.predecoded)
                for n in store.lookup(store.names())
            )
        elif action == "refresh":
            store.refresh_expired()
        elif action == "pods":
            name, pods = args
            bound[name] = tuple(msgspec.structs.replace(p, node=name) for p in pods)
            store.set_pods(name, bound[name])
        elif action == "replace_pods":
            bound = {
                name: tuple(msgspec.structs.replace(p, node=name) for p in pods)
                for name, pods in args[0].items()
            }
            store.replace_pods(bound)
        else:
            clock.now += timedelta(seconds=args[0])
    expected_counts = counters(reference_metrics)
    assert counters(app.metrics) == expected_counts


clock_step = st.sampled_from([0.6, 2.0, 31.0, 60.0, 181.0, -2.0, -31.0])
change = st.one_of(
    st.tuples(st.just("write"), st.sampled_from(NAMES), node_data),
    st.tuples(st.just("refresh")),
    st.tuples(st.just("clock"), clock_step),
    st.tuples(st.just("clock"), clock_step),
)


@settings(max_examples=300, deadline=None)
@given(
    initial=st.lists(node_data, min_size=len(NAMES), max_size=len(NAMES)),
    steps=st.lists(st.tuples(change, pod_index), min_size=1, max_size=10),
    first_pod=pod_index,
)
def test_kept_scores_never_outlive_their_data_or_window(
    initial: list[dict[str, Any]], steps: list[tuple[Any, int]], first_pod: int
) -> None:
    """The same node list asked after every change (a write, a clock step, the expiry timer):
    the case the kept entries exist for, and one where prioritize shows every change (filter
    passes stale data under the lenient policy, so only its counters would)."""
    clock = Clock()
    policy = Policy()
    store = NodeStore(clock=clock)
    store.replace(gpu_node(name, **data) for name, data in zip(NAMES, initial, strict=True))
    app = ScorerApp(policy=policy, clock=clock, node_store=store)

    def check(pod_number: int) -> None:
        body = names_body(PODS[pod_number], NAMES)
        want, _ = reference("prioritize", body, store.lookup(NAMES), clock.now, policy)
        assert app.handle("prioritize", body).body == want

    check(first_pod)
    for (action, *args), pod_number in steps:
        if action == "write":
            store.put(gpu_node(args[0], **args[1]))
        elif action == "refresh":
            store.refresh_expired()
        else:
            clock.now += timedelta(seconds=args[0])
        check(pod_number)


# ----------------------------------------------------------------------------- named cases


def _app(
    store: NodeStore,
    clock: Clock,
    policy: Policy | None = None,
    placements: RecordedPlacements | None = None,
) -> ScorerApp:
    return ScorerApp(
        policy=policy or Policy(), clock=clock, node_store=store, placements=placements
    )


class RecordedPlacements:
    """The nodes each proposal named (what `PodCache.propose` would count the pod on)."""

    def __init__(self) -> None:
        self.proposed: list[list[str]] = []

    def propose(self, pod: BoundPod, nodes: Sequence[str], now: datetime) -> None:
        self.proposed.append(list(nodes))

    def forget(self, uid: str) -> None:
        pass


def _class(pod_doc: dict[str, Any], policy: Policy) -> PodClass:
    request = wire.decode_args(names_body(pod_doc, []), gpu_resource_name=GPU)
    return PodClass.of(request.pod, policy)


GPU = "nvidia.com/gpu"


@pytest.mark.parametrize(
    "timing",
    [
        pytest.param({"age_s": 179.0}, id="updated-at"),
        pytest.param({"age_s": 160.0, "write_age_s": 179.0}, id="server-write-time"),
    ],
)
@pytest.mark.parametrize("refreshed", [False, True], ids=["request-judges", "timer-refreshed"])
def test_stale_boundary_crossing(timing: dict[str, Any], refreshed: bool) -> None:
    clock = Clock()
    store = NodeStore(clock=clock)
    store.replace([gpu_node("n0", **timing)])
    policy = Policy()
    c = _class(hinted(), policy)
    assert json.loads(store.judge(c, ["n0"], clock.now).prioritize_reply())[0]["Score"] > 0
    clock.now += timedelta(seconds=0.5)  # inside the window: the entry holds
    assert store.judge(c, ["n0"], clock.now).judged == 0
    clock.now += timedelta(seconds=1)  # past 180 s: the kept score must not be used
    if refreshed:
        assert store.refresh_expired() == 1
    judgement = store.judge(c, ["n0"], clock.now)
    assert judgement.prioritize_reply() == b'[{"Host":"n0","Score":0}]'
    assert judgement.judged == (0 if refreshed else 1)


def test_skew_window_end_and_clock_stepping_back() -> None:
    clock = Clock()
    store = NodeStore(clock=clock)
    store.replace([gpu_node("n0", age_s=-32.0)])  # 2 s beyond the 30 s skew tolerance
    app = _app(store, clock)
    body = names_body(hinted(), ["n0"])
    skewed = app.handle("prioritize", body).body
    clock.now += timedelta(seconds=3)  # the node's clock is within tolerance now
    fresh = app.handle("prioritize", body).body
    assert skewed != fresh
    clock.now -= timedelta(seconds=3)  # back before the fresh result was judged
    assert app.handle("prioritize", body).body == skewed


def test_chain_rank_switches_when_another_node_changes() -> None:
    """The V100 node's own data never changes; its verdict does, through the chain."""
    clock = Clock()
    store = NodeStore(clock=clock)
    store.replace([gpu_node("a100", model=A100, utilization=0.3), gpu_node("v100", model=V100)])
    app = _app(store, clock)
    preference = hinted({"gpu-model-preference": f"{A100},{V100}"})
    for names in (["a100", "v100"], ["v100", "a100"]):
        body = names_body(preference, names)
        assert json.loads(app.handle("filter", body).body)["NodeNames"] == ["a100"]
        store.put(gpu_node("a100", model=A100, health=Health.UNAVAILABLE))
        assert json.loads(app.handle("filter", body).body)["NodeNames"] == ["v100"]
        store.put(gpu_node("a100", model=A100, utilization=0.3))
        assert json.loads(app.handle("filter", body).body)["NodeNames"] == ["a100"]


def test_a_filter_prepares_the_prioritize_that_follows_it() -> None:
    """Once kube-scheduler has sent a prioritize, each names-only filter makes, after its own
    reply, the reply of the prioritize that follows it (the nodes that passed, in order, under
    the bytes kube-scheduler will send for them). That prioritize gets those bytes, or fresh
    ones where a node was written in between; one passing node, or none, prepares nothing.
    The nodes the prioritize proposes (the top score) are made with its reply."""
    clock = Clock()
    store = NodeStore(clock=clock)
    utilization = {"n0": 0.1, "n1": 0.2, "n2": 0.95, "n3": 0.3, "n4": 0.4, "n5": 0.5}
    store.replace([gpu_node(n, utilization=utilization[n]) for n in NAMES])
    placements = RecordedPlacements()
    app = _app(store, clock, placements=placements)
    the_pod = hinted()
    the_pod["metadata"]["uid"] = "uid-1"  # a pod without one is not proposed
    pod_class = _class(the_pod, app.policy)

    def filtered(names: Sequence[str]) -> list[str]:
        response = app.handle("filter", names_body(the_pod, names))
        return list(json.loads(response.body)["NodeNames"])

    def made(names: Sequence[str]) -> Prepared | None:
        key = msgspec.json.encode(list(names))
        return store.judge(pod_class, names, clock.now, list_key=key).replies

    def prepared(names: Sequence[str]) -> bytes | None:
        replies = made(names)
        return None if replies is None else replies.bodies.get("prioritize")

    def prioritized(names: Sequence[str]) -> bytes:
        body = names_body(the_pod, names)
        want, _ = reference("prioritize", body, store.lookup(names), clock.now, app.policy)
        got = app.handle("prioritize", body).body
        assert got == want
        return got

    # Before any prioritize the scheduler may not send them: nothing is prepared.
    passed = filtered(NAMES[:4])
    assert passed == ["n0", "n1", "n3"]
    assert prepared(passed) is None
    prioritized(passed)
    # Now each filter prepares its prioritize, which gets exactly those bytes.
    passed = filtered(["n3", "n4", "n5", "n0"])
    kept = made(passed)
    assert kept is not None
    # With it, the nodes it proposes: as a judgement of its own finds them.
    assert kept.top == store.judge(pod_class, passed, clock.now).top_scored(3) == ["n0"]
    ahead = kept.bodies["prioritize"]
    assert prioritized(passed) is ahead
    assert placements.proposed[-1] == ["n0"]
    # A node written between the filter and its prioritize: its score is fresh.
    passed = filtered(["n1", "n5", "n0"])
    ahead = prepared(passed)
    store.put(gpu_node("n5", utilization=0.7))
    assert prioritized(passed) != ahead
    # One node passing is bound without scoring, none is not placed: nothing prepared.
    for names, left in ((["n2", "n3"], ["n3"]), (["n2"], [])):
        assert filtered(names) == left
        assert prepared(left) is None
    # A pod the prioritize cannot propose (no uid: its bind could not be matched) gets its
    # prioritize prepared, and no top.
    the_pod["metadata"]["uid"] = ""
    passed = filtered(["n4", "n0", "n1"])
    kept = made(passed)
    assert kept is not None
    assert "prioritize" in kept.bodies
    assert kept.top is None


def test_a_prepared_prioritize_follows_what_was_written_after_its_filter_read() -> None:
    """The prioritize a filter prepares is made from the filter's own tally indexes (each
    carries the node's score), current to the filter's read. A node written after that read
    is patched in when the prioritize comes, even if the preparation ran after the write; a
    write that changes no tally index leaves the prepared bytes standing. (Every node passes
    here, so the prepared list is the filter's own view; a list of its own is the next test.)"""
    clock = Clock()
    store = NodeStore(clock=clock)
    # Enough nodes that a list of them is patched for one change (`listviews`).
    every = [f"m{i:02d}" for i in range(16)]
    store.replace([gpu_node(n, utilization=0.05 * (i + 1)) for i, n in enumerate(every)])
    placements = RecordedPlacements()
    app = _app(store, clock, placements=placements)
    the_pod = hinted()
    the_pod["metadata"]["uid"] = "uid-1"
    pod_class = _class(the_pod, app.policy)
    app.handle("filter", names_body(the_pod, every))  # every entry judged for the class
    app.handle("prioritize", names_body(the_pod, every[:2]))  # kube-scheduler prioritizes

    def prioritized(names: list[str]) -> bytes:
        body = names_body(the_pod, names)
        want, _ = reference("prioritize", body, store.lookup(names), clock.now, app.policy)
        got = app.handle("prioritize", body).body
        assert got == want
        scores = {host["Host"]: host["Score"] for host in json.loads(got)}
        top = [name for name in names if scores[name] == max(scores.values())]
        assert placements.proposed[-1] == top  # what the reply puts on top
        return got

    names = every[8:0:-1]
    response = app.answer("filter", names_body(the_pod, names))  # read, replied, not prepared
    assert json.loads(response.body)["NodeNames"] == names
    store.put(gpu_node("m01", utilization=0.6))  # the top node, no longer the top
    response.finish()  # the preparation, from the filter's read
    prioritized(names)
    assert "m01" not in placements.proposed[-1]
    # A node written with a new utilization and the same verdict and score: the prepared
    # bytes stand.
    names = every[:12]
    app.handle("filter", names_body(the_pod, names))
    key = msgspec.json.encode(names)
    prepared = store._table(pod_class).views[key].replies.bodies["prioritize"]
    store.put(gpu_node("m05", utilization=0.32))  # 0.30 before; a score of 7 either way
    assert prioritized(names) is prepared


def test_a_prioritize_prepared_from_the_filters_indexes_follows_a_write_since(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A filter that rejected some nodes prepares its prioritize for a list of its own from its
    tally indexes, with no name judged or looked up again; a node written between the filter's
    read and the preparation is patched in at the prioritize."""
    clock = Clock()
    store = NodeStore(clock=clock)
    every = [f"m{i:02d}" for i in range(16)]
    hot = {"m03", "m07"}
    store.replace(
        [gpu_node(n, utilization=0.95 if n in hot else 0.05 * (i + 1)) for i, n in enumerate(every)]
    )
    placements = RecordedPlacements()
    app = _app(store, clock, placements=placements)
    the_pod = hinted()
    the_pod["metadata"]["uid"] = "uid-1"
    app.handle("filter", names_body(the_pod, every))  # every entry judged for the class
    app.handle("prioritize", names_body(the_pod, every[:2]))  # kube-scheduler prioritizes
    names = every[12:0:-1]
    response = app.answer("filter", names_body(the_pod, names))
    passed = json.loads(response.body)["NodeNames"]
    assert passed == [n for n in names if n not in hot]
    store.put(gpu_node("m01", utilization=0.6))  # the top node, no longer the top
    judged: list[object] = []
    judge = store.judge
    with monkeypatch.context() as patch:
        patch.setattr(store, "judge", lambda *a, **k: judged.append(a) or judge(*a, **k))
        response.finish()  # the preparation
    assert judged == []  # made from the filter's indexes
    body = names_body(the_pod, passed)
    want, _ = reference("prioritize", body, store.lookup(passed), clock.now, app.policy)
    assert app.handle("prioritize", body).body == want
    scores = {host["Host"]: host["Score"] for host in json.loads(want)}
    assert placements.proposed[-1] == [n for n in passed if scores[n] == max(scores.values())]
    assert "m01" not in placements.proposed[-1]


def test_a_filter_whose_class_was_dropped_before_its_preparation() -> None:
    """The filter's tally indexes belong to its class's table as it was: a class dropped from
    the store (at most `max_classes`) between the filter and its preparation gets a new table,
    and the preparation judges the names in it instead of reading the old indexes there."""
    clock = Clock()
    store = NodeStore(clock=clock, max_classes=1)
    every = [f"m{i:02d}" for i in range(16)]
    store.replace(
        [
            gpu_node(n, utilization=0.95 if n == "m03" else 0.05 * (i + 1))
            for i, n in enumerate(every)
        ]
    )
    app = _app(store, clock)
    first, other = hinted(), hinted({"max-utilization": "0.50"})
    app.handle("filter", names_body(first, every))
    app.handle("prioritize", names_body(first, every[:2]))  # kube-scheduler prioritizes
    response = app.answer("filter", names_body(first, every[10::-1]))
    # Another connection's requests (straight to the store: through the app, each would run
    # the held preparation first): the first class's table dropped, and made again.
    store.judge(_class(other, app.policy), every[::-1], clock.now)
    store.judge(_class(first, app.policy), every[5:], clock.now, tallies_only=True)
    response.finish()  # the preparation of the first filter's prioritize
    passed = json.loads(response.body)["NodeNames"]
    body = names_body(first, passed)
    want, _ = reference("prioritize", body, store.lookup(passed), clock.now, app.policy)
    assert app.handle("prioritize", body).body == want


def test_a_prioritize_decodes_no_pod_its_filter_decoded(monkeypatch: pytest.MonkeyPatch) -> None:
    """The prioritize after a filter carries the same Pod bytes: its pod is the filter's,
    decoded once. A prioritize of another pod is decoded and judged as that pod."""
    clock = Clock()
    store = NodeStore(clock=clock)
    store.replace([gpu_node(n, utilization=0.3) for n in NAMES])
    app = _app(store, clock)
    decodes: list[bytes] = []
    decode_pod = wire._decode_pod

    def counted(raw: msgspec.Raw) -> Any:
        decodes.append(bytes(raw))
        return decode_pod(raw)

    def handled(verb: Verb, pod_doc: dict[str, Any]) -> tuple[bytes, int]:
        """The reply (checked against a fresh evaluation) and the pods the app decoded."""
        body = names_body(pod_doc, NAMES[:3])
        want, _ = reference(verb, body, store.lookup(NAMES[:3]), clock.now, app.policy)
        with monkeypatch.context() as patch:
            patch.setattr(wire, "_decode_pod", counted)
            got = app.handle(verb, body).body
        assert got == want
        return got, len(decodes)

    assert handled("filter", hinted())[1] == 1
    assert handled("prioritize", hinted())[1] == 1
    # Another pod's prioritize (kube-scheduler sends none such, but a body is a body).
    other, count = handled("prioritize", hinted({"max-utilization": "lots"}))
    assert count == 2
    assert other != handled("prioritize", hinted())[0]


def test_a_step_after_the_reply_that_fails_leaves_the_others_to_run(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A bug in the prioritize a filter prepares is logged; the filter's counters and its
    verdict tally still count it, and the reply was made before either."""
    clock = Clock()
    store = NodeStore(clock=clock)
    store.replace([gpu_node(n) for n in NAMES])
    app = _app(store, clock)
    app.handle("prioritize", names_body(hinted(), NAMES))

    def broken(*_: object, **__: object) -> None:
        raise RuntimeError("prepared prioritize")

    monkeypatch.setattr(store, "judge_ahead", broken)
    before = counters(app.metrics)
    with caplog.at_level(logging.ERROR, logger="exporter_scheduler.server"):
        response = app.handle("filter", names_body(hinted(), NAMES))
    assert json.loads(response.body)["NodeNames"] == list(NAMES)
    assert [r.getMessage() for r in caplog.records] == ["work after a reply failed"]
    after = counters(app.metrics)
    assert sum(after.values()) > sum(before.values())  # the filter's tally still counted
    requests = app.metrics.render()[0].decode()
    assert 'gpu_scorer_requests_total{profile="default",verb="filter"} 1.0' in requests


def test_a_watch_event_is_judged_for_every_active_class_before_any_request() -> None:
    clock = Clock()
    store = NodeStore(clock=clock)
    store.replace([gpu_node(n) for n in NAMES])
    policy = Policy()
    classes = [_class(p, policy) for p in PODS]
    for c in classes:
        assert store.judge(c, NAMES, clock.now).judged == len(NAMES)  # a new class
    store.put(gpu_node("n3", utilization=0.95))
    assert store.put(gpu_node("n3", utilization=0.95)) is False  # the same data again
    for c in classes:
        judgement = store.judge(c, NAMES, clock.now)
        assert judgement.judged == 0
        evaluation = evaluate(PodInput("d", "p", {}), store.lookup(NAMES), clock.now, policy)
        if c.hint_problem is None and not c.chain_active and c.min_memory_mib is None:
            assert judgement.passed_mask() == [v.passed for v in evaluation.verdicts]


@pytest.mark.parametrize(
    ("first", "second"),
    [
        pytest.param(hinted(), hinted({"max-utilization": "0.70"}), id="hints"),
        pytest.param(hinted(gpus=1), hinted(gpus=2), id="gpu-request"),
    ],
)
def test_pod_classes_are_kept_apart(first: dict[str, Any], second: dict[str, Any]) -> None:
    clock = Clock()
    store = NodeStore(clock=clock)
    store.replace([gpu_node("n0", utilization=0.75)])
    policy = Policy()
    a, b = _class(first, policy), _class(second, policy)
    assert a.key != b.key
    store.judge(a, ["n0"], clock.now)
    assert store.judge(b, ["n0"], clock.now).judged == 1
    assert store.classes() == 2


def test_another_policy_object_is_another_class() -> None:
    clock = Clock()
    store = NodeStore(clock=clock)
    store.replace([gpu_node("n0", utilization=0.75)])
    loose = store.judge(_class(hinted(), Policy()), ["n0"], clock.now)
    tight = store.judge(_class(hinted(), Policy(utilization_limit=0.5)), ["n0"], clock.now)
    assert (loose.passed_mask(), tight.passed_mask()) == ([True], [False])


@pytest.mark.parametrize("how", ["delete", "relist"])
def test_a_node_list_asked_again_after_a_node_went_away(how: str) -> None:
    """The list's kept verdicts are patched with the changes since; a node gone is one."""
    clock = Clock()
    store = NodeStore(clock=clock)
    store.replace([gpu_node(n, utilization=0.95) for n in NAMES])
    app = _app(store, clock)
    body = names_body(hinted(), NAMES)
    assert json.loads(app.handle("filter", body).body)["NodeNames"] == []
    store.put(gpu_node("n1", utilization=0.1))  # patched into the list's verdicts
    assert json.loads(app.handle("filter", body).body)["NodeNames"] == ["n1"]
    if how == "delete":
        store.delete("n2")
    else:
        store.replace(store.lookup([n for n in NAMES if n != "n2"]))
    reply = json.loads(app.handle("filter", body).body)
    assert "n2" in reply["NodeNames"]  # unknown now: missing data, passed under lenient
    assert reply["FailedNodes"].keys() == {"n0", "n3", "n4", "n5"}


@pytest.mark.parametrize("named_twice", [False, True])
def test_a_long_list_asked_again_after_many_changes(named_twice: bool) -> None:
    """Past a few changes a list's kept verdicts are patched through an index of its names; a
    list that names a node twice (no scheduler sends one) is looked up name by name instead.
    Either way the replies are a fresh evaluation's."""
    clock = Clock()
    policy = Policy()
    names = [f"n{i:03d}" for i in range(160)]
    store = NodeStore(clock=clock)
    store.replace([gpu_node(n, utilization=0.5) for n in names])
    app = _app(store, clock, policy)
    asked = [*names, names[7]] if named_twice else names
    body = names_body(hinted(), asked)
    for round_index in range(3):
        # More changes than a scan finds (8), fewer than the patch's limit (1/8 of the list).
        for index in range(12):
            hot = 0.95 if (index + round_index) % 2 else 0.2
            store.put(gpu_node(names[7 + 9 * index], utilization=hot))
        for verb in ("filter", "prioritize"):
            want, _ = reference(verb, body, store.lookup(asked), clock.now, policy)
            assert app.handle(verb, body).body == want


def test_a_relist_keeps_the_verdicts_of_unchanged_nodes() -> None:
    clock = Clock()
    store = NodeStore(clock=clock)
    store.replace([gpu_node(n) for n in NAMES])
    c = _class(hinted(), Policy())
    store.judge(c, NAMES, clock.now)
    store.replace([gpu_node(n, utilization=0.95 if n == "n1" else 0.5) for n in NAMES[1:]])
    assert store.judge(c, NAMES[1:], clock.now).judged == 0
    assert "n0" not in store.names()
    assert store.entries() == len(NAMES) - 1


def test_pod_classes_are_bounded() -> None:
    clock = Clock()
    store = NodeStore(clock=clock, max_classes=2)
    store.replace([gpu_node("n0")])
    policy = Policy()
    for hint in ("0.5", "0.6", "0.7"):
        store.judge(_class(hinted({"max-utilization": hint}), policy), ["n0"], clock.now)
    assert store.classes() == 2


def test_the_store_logs_a_rejection_where_it_is_judged_and_requests_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    store = NodeStore(clock=clock)
    store.replace([gpu_node("hot", utilization=0.95), gpu_node("cool", utilization=0.1)])
    app = _app(store, clock)
    body = names_body(hinted(), ["hot", "cool"])
    with caplog.at_level(logging.INFO, logger="exporter_scheduler"):
        app.handle("filter", body)  # a new class: judged here, logged by the store
        store.put(gpu_node("hot", utilization=0.96, age_s=9))  # still rejected, same reason
        app.handle("filter", body)
    messages = [(r.name, r.getMessage()) for r in caplog.records]
    assert messages == [
        ("exporter_scheduler.nodestore", "node rejected"),
        ("exporter_scheduler.server", "nodes rejected"),
        ("exporter_scheduler.server", "nodes rejected"),
    ]
    assert caplog.records[0].__dict__["fields"]["utilization"] == 0.95
    assert caplog.records[1].__dict__["fields"]["reasons"] == {"gpu utilization above 0.90": 1}


def test_full_node_requests_judge_only_nodes_not_seen_for_their_class() -> None:
    clock = Clock()
    app = ScorerApp(policy=Policy(), clock=clock)
    nodes = [gpu_node(n) for n in NAMES]
    body = nodes_body(hinted(), nodes, "go")
    first = app.handle("filter", body).body
    metrics_before = counters(app.metrics)
    assert app.handle("filter", body).body == first
    assert sum(counters(app.metrics).values()) == 2 * sum(metrics_before.values())
    changed = nodes_body(hinted(), [*nodes[:-1], gpu_node("n5", utilization=0.95)], "go")
    reply = json.loads(app.handle("filter", changed).body)
    assert reply["FailedNodes"] == {"n5": "gpu utilization above 0.90"}


def test_a_request_never_sees_a_torn_node() -> None:
    """A writer thread flips nodes between two states while requests read: every node's verdict
    is the one of either state, and every reply is well formed."""
    clock = Clock()
    store = NodeStore(clock=clock)
    names = [f"n{i}" for i in range(50)]
    states = {
        True: {n: gpu_node(n, utilization=0.95, age_s=5) for n in names},
        False: {n: gpu_node(n, utilization=0.10, age_s=6) for n in names},
    }
    store.replace(states[False].values())
    app = _app(store, clock)
    body = names_body(hinted(), names)
    stop = threading.Event()

    def write() -> None:
        rng = random.Random(1)
        while not stop.is_set():
            name = rng.choice(names)
            store.put(states[rng.random() < 0.5][name])

    writer = threading.Thread(target=write)
    writer.start()
    try:
        for _ in range(200):
            reply = json.loads(app.handle("filter", body).body)
            assert sorted(reply["NodeNames"] + list(reply["FailedNodes"])) == sorted(names)
            assert set(reply["FailedNodes"].values()) <= {"gpu utilization above 0.90"}
            scores = {e["Score"] for e in json.loads(app.handle("prioritize", body).body)}
            assert scores <= {0, 9}  # hot: 0 after the filter's rule; cool: 9
    finally:
        stop.set()
        writer.join()
