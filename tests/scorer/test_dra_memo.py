"""DRA pods' verdicts kept by the node store: the same replies as judging every node afresh.

The reference is the uncached path: each node with its excluded GPUs from `core.dra.excluded_gpus`
(`serving.dra.dra_nodes`), then `evaluate`. The property draws nodes, other pods' claims and
their allocations, device taints, and a pod whose claims may tolerate some taints or hold an
allocation already; then applies claim, taint and node events one by one, and after each
compares the store's memoised verdicts with the reference (a stale memo entry would differ).
"""

from __future__ import annotations

import json
from itertools import compress
from typing import Any

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from exporter_scheduler.core.dra import (
    NO_EXCLUSIONS,
    ClaimInfo,
    DeviceTaint,
    DraPod,
    Toleration,
    base_exclusions,
)
from exporter_scheduler.core.judge import evaluate
from exporter_scheduler.core.podclass import PodClass
from exporter_scheduler.core.policy import Policy
from exporter_scheduler.edges.dradata import DraData
from exporter_scheduler.serving import wire
from exporter_scheduler.serving.app import ScorerApp
from exporter_scheduler.serving.dra import dra_nodes, exclusions
from exporter_scheduler.serving.nodestore import NodeStore
from tests.scorer._http_helpers import fixed_clock
from tests.scorer.scoring_builders import NOW, Gpu, gpu_node, pod

DRIVER = "gpu.nvidia.com"
POLICY = Policy(own_load=False)
NAMES = ("node-0", "node-1", "node-2", "node-3")
GPUS = 4
UTILIZATIONS = (0.05, 0.5, 0.97)
TOLERATIONS = (
    Toleration("a", "Exists"),
    Toleration(None, "Exists"),
    Toleration("b", "Equal", "x", "NoSchedule"),
)

devices = st.tuples(st.sampled_from(NAMES), st.integers(0, GPUS - 1).map(lambda i: f"gpu-{i}"))
tolerations = st.lists(st.sampled_from(TOLERATIONS), max_size=2).map(tuple)
# A rule's target: one device, every device of a pool (None), or a device in every pool.
targets = st.one_of(
    devices,
    st.tuples(st.sampled_from(NAMES), st.none()),
    st.tuples(st.none(), st.integers(0, GPUS - 1).map(lambda i: f"gpu-{i}")),
)
taints = st.tuples(
    targets,
    st.sampled_from(["a", "b"]),
    st.sampled_from(["NoSchedule", "NoExecute", "PreferNoSchedule"]),
    st.sampled_from([None, "x"]),
)
tables = st.lists(st.sampled_from(UTILIZATIONS), min_size=GPUS, max_size=GPUS)


@st.composite
def claims(draw: st.DrawFn, ref: str) -> ClaimInfo:
    allocated = draw(st.lists(devices, max_size=2, unique=True))
    return ClaimInfo(ref, draw(st.integers(1, 2)), tuple(allocated), draw(tolerations))


# One event: ("claim", index, claim or None to delete), ("rule", name, taint or None), or
# ("node", index, (its new utilizations, whether its device names are renumbered)).
events = st.one_of(
    st.tuples(st.just("claim"), st.integers(0, 5), st.none() | claims("ns/e")),
    st.tuples(st.just("rule"), st.integers(0, 3), st.none() | taints),
    st.tuples(st.just("node"), st.integers(0, len(NAMES) - 1), st.tuples(tables, st.booleans())),
)


def node_of(name: str, utilizations: list[float], *, renamed: bool = False) -> Any:
    """The node; `renamed`: its agent publishes device names numbered against the GPUs' order
    (`gpu-<n>` is GPU gpus-1-n), as where minor numbers and NVML indexes differ."""
    names = [f"gpu-{GPUS - 1 - i}" for i in range(GPUS)] if renamed else None
    return gpu_node(name, [Gpu(utilization=u) for u in utilizations], dra_devices=names)


def rule(taint: tuple[tuple[str | None, str | None], str, str, str | None], name: str) -> Any:
    (pool, device), key, effect, value = taint
    return (pool, device, DeviceTaint(key, effect, value, name))


def assert_same_as_uncached(
    store: NodeStore, data: DraData, dra: DraPod, names: tuple[str, ...]
) -> int:
    """The store's verdicts equal the uncached path's; returns how many nodes it judged."""
    pod_input = msgspec.structs.replace(pod(gpus=dra.gpus), dra=dra)
    pod_class = PodClass.of(pod_input, POLICY)
    judgement = store.judge_dra(pod_class, names, exclusions(names, data, dra), NOW)
    reference = evaluate(pod_input, dra_nodes(store.lookup(names), data, dra), NOW, POLICY)
    passed = [v.name for v in reference.verdicts if v.passed]
    assert list(compress(judgement.names, judgement.passed_mask())) == passed
    assert judgement.rejections() == (reference.failed(), reference.unresolvable())
    assert judgement.prioritize_reply() == wire.encode_prioritize_reply(reference.scores())
    return judgement.judged


@settings(max_examples=150, deadline=None)
@given(
    utilizations=st.lists(tables, min_size=len(NAMES), max_size=len(NAMES)),
    others=st.lists(st.integers(0, 5).flatmap(lambda i: claims(f"ns/o{i}")), max_size=6),
    rules=st.lists(taints, max_size=4),
    own=st.lists(st.integers(0, 1).flatmap(lambda i: claims(f"ns/p{i}")), max_size=2),
    extended=st.integers(0, 2),
    changes=st.lists(events, max_size=6),
    listened=st.booleans(),
)
def test_memoised_verdicts_are_the_uncached_ones_through_claim_taint_and_node_events(
    *,
    utilizations: list[list[float]],
    others: list[ClaimInfo],
    rules: list[tuple[tuple[str | None, str | None], str, str, str | None]],
    own: list[ClaimInfo],
    extended: int,
    changes: list[tuple[str, int, Any]],
    listened: bool,
) -> None:
    own = list({claim.ref: claim for claim in own}.values())
    if not own and not extended:
        extended = 1
    store = NodeStore(clock=fixed_clock(NOW))
    store.replace(node_of(name, u) for name, u in zip(NAMES, utilizations, strict=True))
    data = DraData(driver=DRIVER, device_classes=[DRIVER])
    if listened:  # as served: the watch's events judge the store's entries again
        data.on_exclusions = store.exclusions_changed
    data.replace_claims([*others, *own])
    data.replace_rules({f"r{i}": rule(taint, f"r{i}") for i, taint in enumerate(rules)})
    dra = DraPod(tuple(own), (), extended)
    names = (*NAMES, "unknown")
    assert assert_same_as_uncached(store, data, dra, names) == len(names)
    assert assert_same_as_uncached(store, data, dra, names) == 1  # the unknown name alone
    for kind, index, value in changes:
        if kind == "claim":
            ref = f"ns/e{index}"
            if value is None:
                data.delete_claim(ref)
            else:
                data.put_claim(msgspec.structs.replace(value, ref=ref))
        elif kind == "rule":
            name = f"e{index}"
            data.put_rule(name, None if value is None else rule(value, name))
        else:
            table, renamed = value
            store.put(node_of(NAMES[index], table, renamed=renamed))
        assert_same_as_uncached(store, data, dra, names)


def test_base_exclusions_follow_claim_and_taint_events() -> None:
    data = DraData(driver=DRIVER, device_classes=[DRIVER])
    taint = ("node-0", "gpu-2", DeviceTaint("a", "NoSchedule", rule="r"))
    data.replace_claims([ClaimInfo("ns/a", 1, (("node-0", "gpu-0"),))])
    assert data.base_exclusions == {"node-0": frozenset({("gpu-0", "allocated")})}
    data.put_rule("r", taint)
    assert data.base_exclusions["node-0"] == {("gpu-0", "allocated"), ("gpu-2", "tainted")}
    assert data.delete_claim("ns/a")
    assert data.base_exclusions["node-0"] == {("gpu-2", "tainted")}
    data.put_rule("r", None)
    assert data.base_exclusions == {"node-0": NO_EXCLUSIONS}
    assert base_exclusions(data.devices("node-0")) == NO_EXCLUSIONS


def test_a_claim_event_judges_again_only_the_node_it_changed() -> None:
    store = NodeStore(clock=fixed_clock(NOW))
    store.replace(node_of(name, [0.05] * GPUS) for name in NAMES)
    data = DraData(driver=DRIVER, device_classes=[DRIVER])
    data.replace_claims([ClaimInfo("ns/p", 1)])
    dra = DraPod((ClaimInfo("ns/p", 1),))
    assert assert_same_as_uncached(store, data, dra, NAMES) == len(NAMES)
    assert assert_same_as_uncached(store, data, dra, NAMES) == 0  # filter, then prioritize
    data.put_claim(ClaimInfo("ns/o", 1, (("node-1", "gpu-0"),)))
    assert assert_same_as_uncached(store, data, dra, NAMES) == 1
    data.put_rule("r", ("node-2", "gpu-1", DeviceTaint("a", "NoExecute")))
    assert assert_same_as_uncached(store, data, dra, NAMES) == 1
    # A pod tolerating the taint sees node-2 as before it: judged again (one entry per node).
    tolerant = DraPod((ClaimInfo("ns/p", 1, (), (Toleration("a", "Exists"),)),))
    assert assert_same_as_uncached(store, data, tolerant, NAMES) == 1
    assert assert_same_as_uncached(store, data, tolerant, NAMES) == 0
    # A taint it does not tolerate: its exclusions change on node-2 alone.
    data.put_rule("r2", ("node-2", "gpu-3", DeviceTaint("b", "NoSchedule")))
    assert assert_same_as_uncached(store, data, tolerant, NAMES) == 1
    # A node event: that node alone.
    store.put(node_of("node-3", [0.97] * GPUS))
    assert assert_same_as_uncached(store, data, tolerant, NAMES) == 1


def test_with_the_listener_claim_events_are_judged_off_the_request_path() -> None:
    store = NodeStore(clock=fixed_clock(NOW))
    store.replace(node_of(name, [0.05] * GPUS) for name in NAMES)
    data = DraData(driver=DRIVER, device_classes=[DRIVER])
    data.on_exclusions = store.exclusions_changed
    data.replace_claims([ClaimInfo("ns/p", 1)])
    dra = DraPod((ClaimInfo("ns/p", 1),))
    assert assert_same_as_uncached(store, data, dra, NAMES) == len(NAMES)
    data.put_claim(ClaimInfo("ns/o", 1, (("node-1", "gpu-0"),)))
    data.put_rule("r", ("node-2", "gpu-1", DeviceTaint("a", "NoExecute")))
    assert assert_same_as_uncached(store, data, dra, NAMES) == 0
    assert data.delete_claim("ns/o")
    assert assert_same_as_uncached(store, data, dra, NAMES) == 0


def test_app_names_only_claim_pod_uses_the_store() -> None:
    store = NodeStore(clock=fixed_clock(NOW))
    store.replace([node_of("node-a", [0.05, 0.97, 0.97, 0.97]), node_of("node-b", [0.05] * 4)])
    data = DraData(driver=DRIVER, device_classes=[DRIVER])
    data.replace_claims(
        [ClaimInfo("default/p-gpu", 1), ClaimInfo("ns/x", 1, (("node-a", "gpu-0"),))]
    )
    app = ScorerApp(policy=POLICY, clock=fixed_clock(NOW), node_store=store, dra=data)
    doc = {
        "metadata": {"name": "p", "namespace": "default", "uid": "u1"},
        "spec": {
            "containers": [{"name": "main"}],
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}],
        },
        "status": {"resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": "p-gpu"}]},
    }
    body = json.dumps({"Pod": doc, "Nodes": None, "NodeNames": ["node-a", "node-b"]}).encode()
    reply = json.loads(app.handle("filter", body).body)
    assert reply["NodeNames"] == ["node-b"]
    assert reply["FailedNodes"] == {"node-a": "no gpu at or below utilization 0.90"}
    scores = {s["Host"]: s["Score"] for s in json.loads(app.handle("prioritize", body).body)}
    assert scores["node-a"] == 0
    assert scores["node-b"] > 0
    judged = app.metrics.request_path_judgements_by_verb
    assert judged["filter"]._value.get() == 2
    assert judged["prioritize"]._value.get() == 0  # the filter's entries
