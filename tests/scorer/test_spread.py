"""Spread caps: at most N pods of a group per topology domain.

`check_spread` is pure and driven by a table. The request path is driven through a `ScorerApp`
in both modes (names only over a `NodeStore`; full Node objects) with a real `PodCache` fed by
hand-written list pages and watch lines in the shape kube-apiserver v1.36 sends: the group's
pods come from it, and so do the scorer's own proposals within a burst.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest

from exporter_scheduler.core.inflight import BoundPod
from exporter_scheduler.core.policy import Policy
from exporter_scheduler.core.records import NodeInput
from exporter_scheduler.core.spread import HOSTNAME_KEY, SpreadCap, check_spread
from exporter_scheduler.edges.podcache import PodCache
from exporter_scheduler.serving.app import ScorerApp
from exporter_scheduler.serving.nodestore import NodeStore
from tests.scorer._http_helpers import NOW, args_body, fixed_clock, gpu_annotations
from tests.scorer._http_helpers import node as node_object
from tests.scorer._http_helpers import pod as pod_object

PREFIX = "gpu-scheduler.example.com/"
GROUP_LABEL = PREFIX + "spread-group"
MAX_PER_DOMAIN = PREFIX + "spread-max-per-domain"
TOPOLOGY_KEY = PREFIX + "spread-topology-key"
ZONE = "topology.kubernetes.io/zone"
UNCOUNTED = "spread group not counted (pod watch off)"
FULL_BY_HOST = "spread group at most 2 per kubernetes.io/hostname"

# ----------------------------------------------------------------------------- check_spread


def member(name: str, node: str, *, group: str = "train", provisional: bool = False) -> BoundPod:
    return BoundPod(
        namespace="default",
        name=name,
        uid=f"uid-{name}",
        node=node,
        gpus=1,
        bound_at=NOW - timedelta(seconds=5),
        provisional=provisional,
        group=group,
    )


def zoned(zone: str | None, host: str | None = None) -> dict[str, str]:
    labels = {} if zone is None else {ZONE: zone}
    if host is not None:
        labels[HOSTNAME_KEY] = host
    return labels


@dataclass(frozen=True)
class SpreadCase:
    name: str
    cap: int
    key: str
    members: Sequence[BoundPod]
    # Candidate nodes in request order: (name, labels; None when unknown).
    nodes: Sequence[tuple[str, Mapping[str, str] | None]]
    # Labels of the nodes the members run on (None: unknown), besides the candidates'.
    known: Mapping[str, Mapping[str, str] | None]
    blocked: dict[str, str]
    counts: dict[str, int]
    uncounted: int = 0


SPREAD_CASES = [
    SpreadCase(
        "cap-reached-on-one-host",
        2,
        HOSTNAME_KEY,
        [member("a", "n0"), member("b", "n0"), member("c", "n1")],
        [("n0", zoned(None, "n0")), ("n1", zoned(None, "n1")), ("n2", zoned(None, "n2"))],
        {},
        {"n0": FULL_BY_HOST},
        {"n0": 2, "n1": 1},
    ),
    SpreadCase(
        "below-the-cap-nothing-blocked",
        3,
        HOSTNAME_KEY,
        [member("a", "n0"), member("b", "n0")],
        [("n0", zoned(None, "n0")), ("n1", zoned(None, "n1"))],
        {},
        {},
        {"n0": 2},
    ),
    SpreadCase(
        "no-members-yet",
        1,
        HOSTNAME_KEY,
        [],
        [("n0", zoned(None, "n0"))],
        {},
        {},
        {},
    ),
    SpreadCase(
        # The kubelet sets kubernetes.io/hostname from the machine's name, which need not be
        # the Node's name: the label is the domain.
        "hostname-label-not-the-node-name",
        1,
        HOSTNAME_KEY,
        [member("a", "n0")],
        [("n0", zoned(None, "host-0")), ("n0-twin", zoned(None, "host-0"))],
        {},
        {
            "n0": "spread group at most 1 per kubernetes.io/hostname",
            "n0-twin": "spread group at most 1 per kubernetes.io/hostname",
        },
        {"host-0": 1},
    ),
    SpreadCase(
        # Labels unknown (a node never seen): for the hostname key its name is its domain.
        "hostname-default-with-unknown-labels",
        1,
        HOSTNAME_KEY,
        [member("a", "n0")],
        [("n0", None), ("n1", None)],
        {"n0": None},
        {"n0": "spread group at most 1 per kubernetes.io/hostname"},
        {"n0": 1},
    ),
    SpreadCase(
        "zone-cap-blocks-every-node-of-the-zone",
        2,
        ZONE,
        [member("a", "a-0"), member("b", "a-1")],
        [("a-2", zoned("a")), ("b-0", zoned("b")), ("a-0", zoned("a"))],
        {"a-1": zoned("a")},
        {
            "a-2": "spread group at most 2 per topology.kubernetes.io/zone",
            "a-0": "spread group at most 2 per topology.kubernetes.io/zone",
        },
        {"a": 2},
    ),
    SpreadCase(
        "node-without-the-label-fails",
        1,
        ZONE,
        [],
        [("bare", zoned(None, "bare")), ("b-0", zoned("b"))],
        {},
        {"bare": "node has no topology.kubernetes.io/zone label"},
        {},
    ),
    SpreadCase(
        "zone-of-an-unknown-node-fails",
        1,
        ZONE,
        [],
        [("never-seen", None)],
        {},
        {"never-seen": "node has no topology.kubernetes.io/zone label"},
        {},
    ),
    SpreadCase(
        # A member on a node whose zone is unknown cannot be counted in any zone.
        "member-on-an-unknown-node-uncounted",
        1,
        ZONE,
        [member("a", "gone")],
        [("a-0", zoned("a"))],
        {"gone": None},
        {},
        {},
        uncounted=1,
    ),
    SpreadCase(
        "proposals-count-like-bound-pods",
        2,
        HOSTNAME_KEY,
        [member("a", "n0"), member("b", "n0", provisional=True)],
        [("n0", zoned(None, "n0")), ("n1", zoned(None, "n1"))],
        {},
        {"n0": FULL_BY_HOST},
        {"n0": 2},
    ),
    SpreadCase(
        # A proposal on a tie at the top score counts on each node it may take.
        "a-tied-proposal-counts-on-each-node",
        1,
        HOSTNAME_KEY,
        [member("a", "n0", provisional=True), member("a", "n1", provisional=True)],
        [("n0", zoned(None, "n0")), ("n1", zoned(None, "n1")), ("n2", zoned(None, "n2"))],
        {},
        {
            "n0": "spread group at most 1 per kubernetes.io/hostname",
            "n1": "spread group at most 1 per kubernetes.io/hostname",
        },
        {"n0": 1, "n1": 1},
    ),
]


@pytest.mark.parametrize("case", SPREAD_CASES, ids=lambda c: c.name)
def test_check_spread(case: SpreadCase) -> None:
    cap = SpreadCap("default", "train", case.cap, case.key)
    labels = {**case.known, **dict(case.nodes)}
    check = check_spread(cap, case.members, case.nodes, labels.get)
    assert dict(check.blocked) == case.blocked
    assert dict(check.counts) == case.counts
    assert check.uncounted == case.uncounted
    assert [name for name, _ in check.domains] == [name for name, _ in case.nodes]


def test_reasons_are_uniform_per_cap_and_key() -> None:
    cap = SpreadCap("ml", "train", 2, ZONE)
    assert cap.full_reason == "spread group at most 2 per topology.kubernetes.io/zone"
    assert cap.unlabelled_reason == "node has no topology.kubernetes.io/zone label"
    assert SpreadCap("ml", "train", 2).topology_key == HOSTNAME_KEY


# ----------------------------------------------------------------------------- the pod watch


def bound_object(
    name: str, node: str, *, group: str | None = "train", rv: str = "500"
) -> dict[str, Any]:
    """A GPU pod bound by kube-scheduler as the v1.36 API sends it (managedFields left out)."""
    labels = {"app": "trainer"}
    if group is not None:
        labels[GROUP_LABEL] = group
    return {
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": {
            "name": name,
            "namespace": "default",
            "uid": f"uid-{name}",
            "resourceVersion": rv,
            "creationTimestamp": "2026-11-30T13:59:50Z",
            "labels": labels,
            "annotations": {MAX_PER_DOMAIN: "2"},
        },
        "spec": {
            "containers": [
                {
                    "name": "main",
                    "image": "trainer:1",
                    "resources": {
                        "limits": {"nvidia.com/gpu": "1"},
                        "requests": {"nvidia.com/gpu": "1"},
                    },
                }
            ],
            "nodeName": node,
            "schedulerName": "gpu-scheduler",
        },
        "status": {
            "phase": "Pending",
            "conditions": [
                {
                    "type": "PodScheduled",
                    "status": "True",
                    "lastProbeTime": None,
                    "lastTransitionTime": "2026-11-30T13:59:51Z",
                }
            ],
            "qosClass": "BestEffort",
        },
    }


def watch_line(kind: str, obj: Mapping[str, Any]) -> bytes:
    return json.dumps({"type": kind, "object": obj}, separators=(",", ":")).encode()


def synced_cache(*pods: Mapping[str, Any]) -> PodCache:
    """A pod cache after its first LIST (in-flight accounting on) holding `pods`."""
    cache = PodCache()
    page = {"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": "400"}}
    cache._replace(cache._page.decode(json.dumps({**page, "items": list(pods)})).items or [])
    assert cache.active
    return cache


# ----------------------------------------------------------------------------- the request path

# Cool nodes score higher: n0 > n1 > n2; hot fails the utilization limit whatever the cap.
UTILIZATION = {"n0": 0.10, "n1": 0.30, "n2": 0.50, "hot": 0.95}


@dataclass
class Cluster:
    """One app in one mode, over nodes with these utilizations and labels."""

    names_only: bool
    labels: dict[str, dict[str, str]]
    utilization: dict[str, float]
    cache: PodCache | None
    app: ScorerApp

    def body(self, pod_doc: Mapping[str, Any], nodes: Sequence[str] | None = None) -> bytes:
        names = list(self.utilization) if nodes is None else list(nodes)
        if self.names_only:
            return args_body(pod_doc, names=names)
        objects = []
        for name in names:
            obj = node_object(name, gpu_annotations(utilization=self.utilization[name]))
            obj["metadata"]["labels"] = dict(self.labels[name])
            objects.append(obj)
        return args_body(pod_doc, nodes=objects)

    def filter(
        self, pod_doc: Mapping[str, Any], nodes: Sequence[str] | None = None
    ) -> dict[str, Any]:
        reply = json.loads(self.app.handle("filter", self.body(pod_doc, nodes)).body)
        if self.names_only:
            passed = reply["NodeNames"]
        else:
            passed = [item["metadata"]["name"] for item in reply["Nodes"]["items"]]
        return {
            "passed": passed,
            "failed": reply["FailedNodes"],
            "unresolvable": reply["FailedAndUnresolvableNodes"],
        }

    def prioritize(
        self, pod_doc: Mapping[str, Any], nodes: Sequence[str] | None = None
    ) -> dict[str, int]:
        reply = json.loads(self.app.handle("prioritize", self.body(pod_doc, nodes)).body)
        return {entry["Host"]: entry["Score"] for entry in reply}

    def explain(
        self, pod_doc: Mapping[str, Any], nodes: Sequence[str] | None = None
    ) -> dict[str, Any]:
        document: dict[str, Any] = json.loads(
            self.app.handle("explain", self.body(pod_doc, nodes)).body
        )
        return document


def cluster(
    names_only: bool,
    *,
    cache: PodCache | None,
    labels: Mapping[str, Mapping[str, str]] | None = None,
    utilization: Mapping[str, float] | None = None,
    watch_on: bool = True,
) -> Cluster:
    """`watch_on` False: the app has no pod watch at all (no `groups`)."""
    util = dict(utilization or UTILIZATION)
    node_labels = {n: {HOSTNAME_KEY: n, **(labels or {}).get(n, {})} for n in util}
    store = None
    if names_only:
        store = NodeStore(clock=fixed_clock())
        store.replace(
            [
                NodeInput(n, gpu_annotations(utilization=u), labels=node_labels[n])
                for n, u in util.items()
            ]
        )
        if cache is not None:
            cache.add_sink(store)  # as `gpu-scorer serve` wires them
    app = ScorerApp(
        policy=Policy(),
        clock=fixed_clock(),
        node_store=store,
        pods_of=None if names_only or cache is None else cache.pods_of,
        placements=cache,
        groups=cache if watch_on else None,
    )
    return Cluster(names_only, node_labels, util, cache, app)


def group_pod(
    name: str,
    *,
    group: str | None = "train",
    cap: str | None = "2",
    key: str | None = None,
) -> dict[str, Any]:
    """The pod being scheduled: one GPU, in spread group `group` with its cap."""
    annotations = {}
    if cap is not None:
        annotations[MAX_PER_DOMAIN] = cap
    if key is not None:
        annotations[TOPOLOGY_KEY] = key
    doc = pod_object(annotations, name=name)
    doc["metadata"]["uid"] = f"uid-{name}"
    if group is not None:
        doc["metadata"]["labels"] = {GROUP_LABEL: group}
    return doc


MODES = [pytest.param(True, id="names-only"), pytest.param(False, id="full-node")]


def _verdict_counts(app: ScorerApp) -> dict[tuple[str, str], float]:
    counts = {}
    for line in app.metrics.render()[0].decode().splitlines():
        if line.startswith("gpu_scorer_filter_verdicts_total{"):
            sample, value = line.rsplit(" ", 1)
            labels = dict(
                part.split("=", 1) for part in sample[sample.index("{") + 1 : -1].split('",')
            )
            outcome, reason = labels["outcome"].strip('"'), labels["reason"].strip('"')
            if float(value):
                counts[outcome, reason] = float(value)
    return counts


@pytest.mark.parametrize("names_only", MODES)
def test_a_node_holding_the_cap_is_unresolvable_and_scores_zero(names_only: bool) -> None:
    cache = synced_cache(bound_object("a", "n0"), bound_object("b", "n0"), bound_object("c", "n1"))
    stack = cluster(names_only, cache=cache)
    pod = group_pod("next")
    assert stack.filter(pod) == {
        "passed": ["n1", "n2"],
        "failed": {"hot": "gpu utilization above 0.90"},
        "unresolvable": {"n0": FULL_BY_HOST},
    }
    scores = stack.prioritize(pod)
    assert scores["n0"] == scores["hot"] == 0
    assert min(scores["n1"], scores["n2"]) > 0
    # Each filter counts the capped node under the cap's own reason, as unresolvable.
    assert _verdict_counts(stack.app) == {
        ("passed", ""): 2,
        ("failed", "gpu utilization above 0.90"): 1,
        ("unresolvable", FULL_BY_HOST): 1,
    }


@pytest.mark.parametrize("names_only", MODES)
def test_the_same_nodes_answer_again_without_the_cap(names_only: bool) -> None:
    """The cap is a step after the verdicts: a pod of no group, or of another group, is not
    held back by the group's pods (names only: the store's cached reply bytes are not reused
    across the block)."""
    cache = synced_cache(bound_object("a", "n0"), bound_object("b", "n0"))
    stack = cluster(names_only, cache=cache)
    assert stack.filter(group_pod("capped"))["unresolvable"] == {"n0": FULL_BY_HOST}
    uncapped = stack.filter(group_pod("free", group=None, cap=None))
    assert uncapped["passed"] == ["n0", "n1", "n2"]
    other = stack.filter(group_pod("other", group="eval"))
    assert other["passed"] == ["n0", "n1", "n2"]
    assert stack.filter(group_pod("capped-again"))["unresolvable"] == {"n0": FULL_BY_HOST}


@pytest.mark.parametrize("names_only", MODES)
def test_a_zone_cap_reads_the_node_labels(names_only: bool) -> None:
    labels = {"n0": {ZONE: "a"}, "n1": {ZONE: "a"}, "n2": {ZONE: "b"}}  # hot has no zone
    cache = synced_cache(bound_object("a", "n1"))
    stack = cluster(names_only, cache=cache, labels=labels)
    got = stack.filter(group_pod("next", cap="1", key=ZONE))
    full = "spread group at most 1 per topology.kubernetes.io/zone"
    assert got == {
        "passed": ["n2"],
        "failed": {"hot": "gpu utilization above 0.90"},
        "unresolvable": {"n0": full, "n1": full},
    }
    # Only n2 passed: kube-scheduler binds there without scoring, so the scorer counts the
    # pod in zone b at once, and the next pod of the group finds no zone left.
    got = stack.filter(group_pod("after", cap="1", key=ZONE), ["n2", "n0"])
    assert got["unresolvable"] == {"n0": full, "n2": full}
    # A node without the label fails under its own reason.
    unzoned = cluster(names_only, cache=synced_cache(), labels={"n0": {ZONE: "a"}})
    got = unzoned.filter(group_pod("bare", cap="1", key=ZONE), ["n0", "n1"])
    assert got["unresolvable"] == {"n1": "node has no topology.kubernetes.io/zone label"}


@pytest.mark.parametrize("names_only", MODES)
def test_explain_shows_the_cap_and_the_counts(names_only: bool) -> None:
    labels = {"n0": {ZONE: "a"}, "n1": {ZONE: "a"}, "n2": {ZONE: "b"}}
    cache = synced_cache(bound_object("a", "n0"), bound_object("b", "n2"))
    stack = cluster(names_only, cache=cache, labels=labels)
    # Full-node mode remembers the labels of the Nodes it has seen in requests.
    stack.filter(group_pod("warm-up", cap="1", key=ZONE))
    document = stack.explain(group_pod("asked", cap="1", key=ZONE), ["n1", "n2", "hot"])
    full = "spread group at most 1 per topology.kubernetes.io/zone"
    assert document["spread"] == {
        "group": "train",
        "namespace": "default",
        "max_per_domain": 1,
        "topology_key": ZONE,
        "counts": {"a": 1, "b": 1},
        "uncounted_pods": 0,
        "domains": {"n1": "a", "n2": "b", "hot": None},
        "blocked": {
            "hot": "node has no topology.kubernetes.io/zone label",
            "n1": full,
            "n2": full,
        },
    }
    verdicts = {
        n["name"]: (n["verdict"], n["reason"], n["unresolvable"]) for n in document["nodes"]
    }
    assert verdicts == {
        "n1": ("fail", full, True),
        "n2": ("fail", full, True),
        # A node failing a rule of its own keeps that reason.
        "hot": ("fail", "gpu utilization above 0.90", False),
    }
    text = stack.app.handle(
        "explain", stack.body(group_pod("asked", cap="1", key=ZONE)), query=b"output=text"
    ).body.decode()
    assert (
        "spread group default/train: at most 1 per topology.kubernetes.io/zone; "
        "pods per domain: a 1, b 1"
    ) in text


@dataclass(frozen=True)
class AllFailCase:
    name: str
    pod: dict[str, Any]
    watch: str  # "synced", "not-synced", "failed", "none"
    reason: str


ALL_FAIL = [
    AllFailCase(
        "cap-without-the-group-label",
        group_pod("lone", group=None),
        "synced",
        f"invalid pod annotation {MAX_PER_DOMAIN}",
    ),
    AllFailCase(
        "cap-zero", group_pod("zero", cap="0"), "synced", f"invalid pod annotation {MAX_PER_DOMAIN}"
    ),
    AllFailCase(
        "cap-not-a-whole-number",
        group_pod("half", cap="1.5"),
        "synced",
        f"invalid pod annotation {MAX_PER_DOMAIN}",
    ),
    AllFailCase(
        "cap-above-the-bound",
        group_pod("huge", cap="100001"),
        "synced",
        f"invalid pod annotation {MAX_PER_DOMAIN}",
    ),
    AllFailCase(
        "key-not-a-label-key",
        group_pod("rack", key="rack name"),
        "synced",
        f"invalid pod annotation {TOPOLOGY_KEY}",
    ),
    AllFailCase("no-pod-watch", group_pod("blind"), "none", UNCOUNTED),
    AllFailCase("pod-watch-not-synced-yet", group_pod("early"), "not-synced", UNCOUNTED),
    AllFailCase("pod-watch-failing", group_pod("late"), "failed", UNCOUNTED),
]


@pytest.mark.parametrize("names_only", MODES)
@pytest.mark.parametrize("case", ALL_FAIL, ids=lambda c: c.name)
def test_a_cap_that_cannot_be_kept_fails_every_node(case: AllFailCase, names_only: bool) -> None:
    if case.watch == "not-synced":
        cache: PodCache | None = PodCache()
    elif case.watch == "failed":
        cache = synced_cache(bound_object("a", "n0"))
        cache._on_failure(RuntimeError("connection refused"))
    else:
        cache = synced_cache() if case.watch == "synced" else None
    stack = cluster(names_only, cache=cache, watch_on=case.watch != "none")
    cool = ["n0", "n1", "n2"]  # nodes that pass every rule of their own
    got = stack.filter(case.pod, cool)
    assert got == {"passed": [], "failed": {}, "unresolvable": dict.fromkeys(cool, case.reason)}
    assert set(stack.prioritize(case.pod, cool).values()) == {0}


# ----------------------------------------------------------------------------- bursts


@pytest.mark.parametrize("names_only", MODES)
def test_a_burst_sees_the_slots_its_own_proposals_took(names_only: bool) -> None:
    """kube-scheduler binds asynchronously: the next pod of a group is filtered before the
    watch shows where the last one went. Each proposal takes its slot at once."""
    cache = synced_cache()
    stack = cluster(names_only, cache=cache, utilization={"n0": 0.10, "n1": 0.50})
    first, second, third = (group_pod(n, cap="1") for n in ("first", "second", "third"))
    capped = "spread group at most 1 per kubernetes.io/hostname"

    # Two nodes pass: kube-scheduler scores them, and binds the first pod to the top (n0).
    assert stack.filter(first)["passed"] == ["n0", "n1"]
    scores = stack.prioritize(first)
    assert scores["n0"] > scores["n1"] > 0
    # Not bound yet in the watch; the second pod already sees n0 taken.
    assert stack.filter(second) == {
        "passed": ["n1"],
        "failed": {},
        "unresolvable": {"n0": capped},
    }
    # One node passed: kube-scheduler binds there without scoring; the third pod sees both
    # slots taken.
    assert stack.filter(third)["unresolvable"] == {"n0": capped, "n1": capped}

    # The watch shows both bound where proposed: the same count, now from the pods.
    cache._apply(watch_line("MODIFIED", bound_object("first", "n0", rv="501")))
    cache._apply(watch_line("MODIFIED", bound_object("second", "n1", rv="502")))
    assert cache.proposals() == 0
    assert stack.filter(third)["unresolvable"] == {"n0": capped, "n1": capped}

    # A member leaves (deleted, or finished): its slot is free for the next try.
    cache._apply(watch_line("DELETED", bound_object("first", "n0", rv="503")))
    assert stack.filter(third) == {
        "passed": ["n0"],
        "failed": {},
        "unresolvable": {"n1": capped},
    }


@pytest.mark.parametrize("names_only", MODES)
def test_a_proposal_the_scheduler_did_not_follow_moves_with_the_watch(names_only: bool) -> None:
    cache = synced_cache()
    stack = cluster(names_only, cache=cache, utilization={"n0": 0.10, "n1": 0.50})
    first, second = group_pod("first", cap="1"), group_pod("second", cap="1")
    stack.prioritize(first)  # proposes n0, its top score
    capped = "spread group at most 1 per kubernetes.io/hostname"
    assert stack.filter(second)["unresolvable"] == {"n0": capped}
    # The default plugins outweighed the extender: the first pod went to n1.
    cache._apply(watch_line("MODIFIED", bound_object("first", "n1", rv="501")))
    assert stack.filter(second)["unresolvable"] == {"n1": capped}


@pytest.mark.parametrize("names_only", MODES)
def test_a_tie_at_the_top_holds_every_tied_node(names_only: bool) -> None:
    cache = synced_cache()
    stack = cluster(names_only, cache=cache, utilization={"n0": 0.20, "n1": 0.20, "n2": 0.60})
    stack.prioritize(group_pod("first", cap="1"))
    # Either tied node may get the first pod: the next one waits for the watch, not a guess.
    capped = "spread group at most 1 per kubernetes.io/hostname"
    assert stack.filter(group_pod("second", cap="1")) == {
        "passed": ["n2"],
        "failed": {},
        "unresolvable": {"n0": capped, "n1": capped},
    }
    cache._apply(watch_line("MODIFIED", bound_object("first", "n1", rv="501")))
    assert stack.filter(group_pod("second", cap="1"))["unresolvable"] == {"n1": capped}


# ----------------------------------------------------------------------------- labels by mode


def test_full_node_mode_remembers_the_labels_of_nodes_seen_in_requests() -> None:
    """A group pod's node need not be in the request (filtered out by kube-scheduler for its
    own reasons); its zone is known if the scorer saw that Node in an earlier request."""
    labels = {"n0": {ZONE: "a"}, "n1": {ZONE: "a"}, "n2": {ZONE: "b"}}
    full = "spread group at most 1 per topology.kubernetes.io/zone"

    def stack_with_member() -> Cluster:
        return cluster(False, cache=synced_cache(bound_object("a", "n0")), labels=labels)

    never_seen = stack_with_member()
    pod = group_pod("next", cap="1", key=ZONE)
    assert never_seen.filter(pod, ["n1", "n2"])["passed"] == ["n1", "n2"]
    assert never_seen.explain(pod, ["n1", "n2"])["spread"]["uncounted_pods"] == 1

    seen = stack_with_member()
    seen.filter(group_pod("earlier", cap="1", key=ZONE), ["n0"])
    assert seen.filter(pod, ["n1", "n2"]) == {
        "passed": ["n2"],
        "failed": {},
        "unresolvable": {"n1": full},
    }


def test_names_only_mode_reads_the_labels_from_the_node_cache() -> None:
    labels = {"n0": {ZONE: "a"}, "n1": {ZONE: "a"}, "n2": {ZONE: "b"}}
    stack = cluster(True, cache=synced_cache(bound_object("a", "n0")), labels=labels)
    # n0 is in no request, yet the node cache knows its zone.
    got = stack.filter(group_pod("next", cap="1", key=ZONE), ["n1", "n2"])
    assert got["unresolvable"] == {"n1": "spread group at most 1 per topology.kubernetes.io/zone"}


def test_groups_are_namespaced() -> None:
    other = bound_object("a", "n0")
    other["metadata"]["namespace"] = "team-b"
    other["metadata"]["uid"] = "uid-team-b-a"
    stack = cluster(False, cache=synced_cache(other))
    assert stack.filter(group_pod("mine", cap="1"))["passed"] == ["n0", "n1", "n2"]
