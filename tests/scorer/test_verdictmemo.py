"""Per-node verdict reuse (names only): every reply is the bytes a memo-less evaluation gives.

The reference is an app with neither the reply cache nor the verdict memo, asked at the same
`now` about the same node data. The property drives random request sequences through the memo
(and through the memo behind the reply cache) while the node data, the clock and the pods
change; the named cases pin the boundaries a memo could get wrong.
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

from exporter_scheduler.metrics import Verb
from exporter_scheduler.policy import Policy
from exporter_scheduler.scoring import NodeInput, PodInput, predecode
from exporter_scheduler.server import ScorerApp
from exporter_scheduler.verdictmemo import VerdictMemo
from gpu_contract.schema import DEFAULT_KEYS, Health
from tests.scorer._http_helpers import args_body, pod
from tests.scorer.scoring_builders import A100, NOW, PREFIX, T4, V100
from tests.scorer.scoring_builders import node as scoring_node

NAMES = ("n0", "n1", "n2", "n3", "n4", "n5")


class Clock:
    def __init__(self, now: datetime = NOW) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


class Source:
    """A node source like `NodeCache`: a new `NodeInput` object for every change."""

    def __init__(self) -> None:
        self.nodes: dict[str, NodeInput] = {}
        self.generation = 0

    def ready(self) -> bool:
        return True

    def lookup(self, names: Sequence[str]) -> list[NodeInput]:
        return [self.nodes.get(n) or NodeInput(n, {}, None) for n in names]

    def put(self, node_input: NodeInput) -> None:
        self.nodes[node_input.name] = node_input
        self.generation += 1

    def delete(self, name: str) -> None:
        if self.nodes.pop(name, None) is not None:
            self.generation += 1

    def relist(self) -> None:
        """Every entry rebuilt (new objects, same data), as after a LIST."""
        self.nodes = {
            name: NodeInput(n.name, dict(n.annotations), n.agent_write_time, n.predecoded)
            for name, n in self.nodes.items()
        }
        self.generation += 1


def gpu_node(name: str, *, predecoded: bool = True, **kwargs: Any) -> NodeInput:
    """A node through the real contract, decoded ahead as the node cache does (or not)."""
    plain = scoring_node(name, **kwargs)
    pre = (PREFIX, predecode(plain.annotations, DEFAULT_KEYS)) if predecoded else None
    return NodeInput(name, plain.annotations, plain.agent_write_time, pre)


def hinted(hints: dict[str, str] | None = None, name: str = "p") -> dict[str, Any]:
    return pod({PREFIX + k: v for k, v in (hints or {}).items()}, name=name)


PODS = (
    hinted(),
    hinted({"gpu-model-preference": f"{A100},{V100}"}),
    hinted({"gpu-model-preference": f"{V100},*", "gpu-fallback-utilization": "0.40"}),
    hinted({"min-gpu-memory-mib": "60000", "max-utilization": "0.70"}),
    hinted({"max-utilization": "lots"}),  # invalid: not memoised, evaluated in full
)


class Apps:
    """The app under test (memo, optionally behind the reply cache) and the reference."""

    def __init__(
        self,
        source: Source,
        clock: Clock,
        *,
        reply_cache: bool = False,
        policy: Policy | None = None,
        **memo: Any,
    ) -> None:
        self.policy = policy or Policy()
        self.source = source
        self.clock = clock
        self.memo = ScorerApp(
            policy=self.policy,
            clock=clock,
            node_source=source,
            reply_cache_entries=64 if reply_cache else 0,
        )
        if memo:
            assert self.memo.verdict_memo is not None
            self.memo.verdict_memo = VerdictMemo(**memo)
        # Without either cache, every request is a fresh evaluation.
        self.reference = ScorerApp(
            policy=self.policy,
            clock=clock,
            node_source=source,
            reply_cache_entries=0,
            verdict_memo_pod_keys=0,
        )

    def check(self, verb: Verb, body: bytes) -> bytes:
        expected = self.reference.handle(verb, body)
        got = self.memo.handle(verb, body)
        assert got.status == expected.status == 200
        assert got.body == expected.body
        return got.body


def request(pod_doc: dict[str, Any], names: Sequence[str]) -> bytes:
    return args_body(pod_doc, names=list(names))


def counters(app: ScorerApp) -> list[str]:
    """The verdict and node-data counters, as exposed."""
    text = app.metrics.render()[0].decode()
    return sorted(
        line
        for line in text.splitlines()
        if line.startswith(("gpu_scorer_verdicts_total", "gpu_scorer_node_data_total"))
    )


# ----------------------------------------------------------------------------- the property

node_data = st.fixed_dictionaries(
    {
        # Around the stale (180 s) and skew (-30 s) boundaries, and well inside.
        "age_s": st.one_of(st.floats(-60, 400), st.sampled_from([-30.5, 5.0, 179.5])),
        "write_age_s": st.one_of(st.none(), st.floats(-40, 400), st.just(179.5)),
        "health": st.sampled_from([Health.OK, Health.OK, Health.UNAVAILABLE]),
        "utilization": st.one_of(st.none(), st.sampled_from([0.0, 0.3, 0.5, 0.75, 0.95])),
        "temperature_c": st.one_of(st.none(), st.integers(30, 95)),
        "model": st.sampled_from([A100, V100, T4, None]),
        "largest_free_mib": st.one_of(st.none(), st.sampled_from([20_000, 80_000])),
        "predecoded": st.booleans(),
    }
)

step = st.one_of(
    st.tuples(
        st.just("request"),
        st.sampled_from(["filter", "prioritize"]),
        st.integers(0, len(PODS) - 1),
        # A few standing node lists (the scheduler repeats its list) and random ones.
        st.one_of(
            st.sampled_from([NAMES, NAMES[::-1], ("n0", "n2", "ghost")]),
            st.lists(st.sampled_from([*NAMES, "ghost"]), max_size=8).map(tuple),
        ),
    ),
    st.tuples(st.just("write"), st.sampled_from(NAMES), node_data),
    st.tuples(st.just("delete"), st.sampled_from(NAMES)),
    st.tuples(st.just("relist")),
    # Forward and backward, small steps (inside windows) and large ones (across them).
    st.tuples(st.just("clock"), st.one_of(st.floats(-200, 200), st.floats(-2, 2))),
)


@settings(max_examples=300, deadline=None)
@given(
    initial=st.lists(node_data, min_size=len(NAMES), max_size=len(NAMES)),
    steps=st.lists(step, min_size=1, max_size=30),
    reply_cache=st.booleans(),
    strict=st.booleans(),
)
def test_replies_match_a_fresh_evaluation(
    initial: list[dict[str, Any]], steps: list[tuple[Any, ...]], reply_cache: bool, strict: bool
) -> None:
    source = Source()
    for name, data in zip(NAMES, initial, strict=True):
        source.put(gpu_node(name, **data))
    clock = Clock()
    policy = Policy(missing_data="strict" if strict else "lenient")
    apps = Apps(source, clock, reply_cache=reply_cache, policy=policy)
    for action, *args in steps:
        if action == "request":
            verb, pod_index, names = args
            apps.check(verb, request(PODS[pod_index], names))
        elif action == "write":
            name, data = args
            source.put(gpu_node(name, **data))
        elif action == "delete":
            source.delete(args[0])
        elif action == "relist":
            source.relist()
        else:
            clock.now += timedelta(seconds=args[0])
    assert counters(apps.memo) == counters(apps.reference)


# ----------------------------------------------------------------------------- named cases


def _filter(body: bytes) -> dict[str, Any]:
    reply: dict[str, Any] = json.loads(body)
    return reply


@pytest.mark.parametrize(
    "timing",
    [
        pytest.param({"age_s": 179.0}, id="updated-at"),
        pytest.param({"age_s": 160.0, "write_age_s": 179.0}, id="server-write-time"),
    ],
)
def test_stale_boundary_crossing(timing: dict[str, Any]) -> None:
    source = Source()
    source.put(gpu_node("n0", **timing))
    clock = Clock()
    apps = Apps(source, clock)
    body = request(hinted(), ["n0"])
    fresh = json.loads(apps.check("prioritize", body))
    assert fresh[0]["Score"] > 0
    clock.now += timedelta(seconds=0.5)  # inside the window: reused
    assert json.loads(apps.check("prioritize", body)) == fresh
    clock.now += timedelta(seconds=1)  # past 180 s: the memoised score must not be reused
    assert json.loads(apps.check("prioritize", body)) == [{"Host": "n0", "Score": 0}]


def test_skew_window_end_and_clock_stepping_back() -> None:
    source = Source()
    source.put(gpu_node("n0", age_s=-32.0))  # 2 s beyond the 30 s skew tolerance
    clock = Clock()
    apps = Apps(source, clock)
    body = request(hinted(), ["n0"])
    skewed = apps.check("prioritize", body)
    clock.now += timedelta(seconds=3)  # the node's clock is within tolerance now
    fresh = apps.check("prioritize", body)
    assert skewed != fresh
    clock.now -= timedelta(seconds=3)  # back before the fresh result was computed
    assert apps.check("prioritize", body) == skewed


def test_chain_rank_switches_when_another_node_changes() -> None:
    """The V100 node's own data never changes; its verdict does, through the chain."""
    source = Source()
    source.put(gpu_node("a100", model=A100, utilization=0.3))
    source.put(gpu_node("v100", model=V100, utilization=0.3))
    apps = Apps(source, Clock())
    preference = hinted({"gpu-model-preference": f"{A100},{V100}"})
    for names in (["a100", "v100"], ["v100", "a100"]):
        body = request(preference, names)
        assert _filter(apps.check("filter", body))["NodeNames"] == ["a100"]
        source.put(gpu_node("a100", model=A100, health=Health.UNAVAILABLE))
        assert _filter(apps.check("filter", body))["NodeNames"] == ["v100"]
        source.put(gpu_node("a100", model=A100, utilization=0.3))
        assert _filter(apps.check("filter", body))["NodeNames"] == ["a100"]


def test_pods_with_different_hints_do_not_share_results() -> None:
    source = Source()
    source.put(gpu_node("n0", utilization=0.75))
    apps = Apps(source, Clock())
    names = ["n0"]
    plain, tight = hinted(), hinted({"max-utilization": "0.70"})
    for _ in range(2):
        assert _filter(apps.check("filter", request(plain, names)))["NodeNames"] == ["n0"]
        assert _filter(apps.check("filter", request(tight, names)))["NodeNames"] == []


def test_another_policy_object_starts_afresh() -> None:
    source = Source()
    source.put(gpu_node("n0", utilization=0.75))
    memo = VerdictMemo()
    node_list = source.lookup(["n0"])
    the_pod = PodInput("default", "p", {})
    loose = memo.judge(the_pod, node_list, NOW, Policy())
    tight = memo.judge(the_pod, node_list, NOW, Policy(utilization_limit=0.5))
    assert loose is not None
    assert tight is not None
    assert loose.filter_parts()[0] == ["n0"]
    assert tight.filter_parts()[0] == []


def test_same_node_list_judges_only_changed_nodes() -> None:
    source = Source()
    for name in NAMES:
        source.put(gpu_node(name))
    apps = Apps(source, Clock())
    body = request(hinted(), NAMES)
    apps.check("filter", body)
    memo = apps.memo.verdict_memo
    assert memo is not None
    source.put(gpu_node("n3", utilization=0.95))
    judgement = memo.judge(
        PodInput("default", "p", {}),
        source.lookup(NAMES),
        NOW,
        apps.policy,
        view_key=json.dumps(list(NAMES)).encode(),
    )
    assert judgement is not None
    assert [v.name for v in judgement.computed] == ["n3"]


def test_memo_is_bounded() -> None:
    memo = VerdictMemo(pod_keys=2, max_nodes=3)
    source = Source()
    for name in NAMES:
        source.put(gpu_node(name))
    the_pod = PodInput("default", "p", {})
    memo.judge(the_pod, source.lookup(NAMES), NOW, Policy())
    memo.judge(the_pod, source.lookup(NAMES[:1]), NOW, Policy())  # over 3: emptied first
    assert len(memo) == 1
    policy = Policy()
    for hint in ("0.5", "0.6", "0.7"):
        pod_input = PodInput("default", "p", {PREFIX + "max-utilization": hint})
        memo.judge(pod_input, source.lookup(NAMES[:1]), NOW, policy)
    assert len(memo._slots) == 2


def test_computed_rejections_log_per_node_reused_ones_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    source = Source()
    source.put(gpu_node("hot", utilization=0.95))
    source.put(gpu_node("cool", utilization=0.1))
    apps = Apps(source, Clock())
    body = request(hinted(), ["hot", "cool"])
    with caplog.at_level(logging.INFO, logger="exporter_scheduler.server"):
        apps.memo.handle("filter", body)
        source.put(gpu_node("cool", utilization=0.2))  # a miss, but "hot" is reused
        apps.memo.handle("filter", body)
    messages = [r.getMessage() for r in caplog.records]
    assert messages == ["node rejected", "nodes rejected (verdicts memoised)"]
    summary = caplog.records[1].__dict__["fields"]
    assert summary["rejected"] == 1
    assert summary["judged_rejected"] == 0


def test_verdict_counters_match_the_reference() -> None:
    source = Source()
    source.put(gpu_node("a100", model=A100, utilization=0.3))
    source.put(gpu_node("v100", model=V100, utilization=0.3))
    source.put(gpu_node("hot", model=A100, utilization=0.95))
    apps = Apps(source, Clock())
    reference = apps.reference
    body = request(hinted({"gpu-model-preference": f"{A100},{V100}"}), ["a100", "v100", "hot"])
    for _ in range(2):
        apps.memo.handle("filter", body)
        reference.handle("filter", body)
        source.put(gpu_node("a100", model=A100, utilization=0.3))
    assert counters(apps.memo) == counters(reference)
    assert counters(reference)
