"""Golden inputs: every request a real kube-scheduler (v1.36, v1.37) sent gets a valid reply.

The captured Nodes carry only `utilization` and `updated-at` (written by kubectl in the original
design's format); each request is replayed as captured and again with the agent's full set of
annotations put in, and the verdicts are checked against the utilization each node carries.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from exporter_scheduler.core.judge import evaluate
from exporter_scheduler.core.policy import Policy
from exporter_scheduler.edges.nodecache import CacheTuning, NodeCache
from exporter_scheduler.edges.podcache import PodCache
from exporter_scheduler.serving import wire
from exporter_scheduler.serving.app import ScorerApp
from exporter_scheduler.serving.metrics import ScorerMetrics, Verb
from kube_standins.apiserver import ApiServerStandIn
from tests.fixture_paths import SCHEDULER_CAPTURES
from tests.scorer._http_helpers import (
    FIXTURES,
    NOW,
    call,
    check_filter_reply,
    check_prioritize_reply,
    connect,
    fixed_clock,
    gpu_annotations,
    make_app,
    serving,
)

UTIL = "gpu-scheduler.example.com/utilization"


def _captures(mode: str, roots: tuple[Path, ...] = SCHEDULER_CAPTURES) -> list[Any]:
    return [
        pytest.param(
            path, id=f"{root.name.rsplit('-', 1)[-1]}-{path.name[: -len('.request.json')]}"
        )
        for root in roots
        for path in sorted((root / mode).glob("*.request.json"))
    ]


def _verb(request_path: Path) -> str:
    meta = json.loads(
        request_path.with_name(request_path.name.replace("request", "meta")).read_text()
    )
    return str(meta["path"]).rsplit("/", 1)[-1]


def _with_agent_annotations(body: bytes) -> bytes:
    """The same request with each node's utilization written the way the agent writes it."""
    document = json.loads(body)
    for item in document["Nodes"]["items"]:
        annotations = item["metadata"]["annotations"]
        annotations.update(gpu_annotations(utilization=float(annotations[UTIL])))
    return json.dumps(document).encode()


def _replay(server: Any, path: Path, body: bytes, *, form: str) -> tuple[str, Any]:
    verb = _verb(path)
    request = json.loads(body)
    given = (
        [i["metadata"]["name"] for i in request["Nodes"]["items"]]
        if form == "nodes"
        else request["NodeNames"]
    )
    conn = connect(server)
    status, headers, data = call(conn, "POST", f"/{verb}", body)
    again = call(conn, "POST", f"/{verb}", body)[2]
    conn.close()
    assert status == 200
    assert headers["content-type"] == "application/json"
    assert data == again  # deterministic bytes
    reply = json.loads(data)
    if verb == "filter":
        passed = check_filter_reply(reply, given=given, form=form)
        if form == "nodes":
            # The passing Node objects come back exactly as they were sent.
            sent = {i["metadata"]["name"]: i for i in request["Nodes"]["items"]}
            for item in reply["Nodes"]["items"]:
                assert item == sent[item["metadata"]["name"]]
        return verb, {"passed": passed, "reply": reply}
    return verb, {"scores": check_prioritize_reply(reply, given=given)}


@pytest.fixture(scope="module")
def full_node_server() -> Iterator[Any]:
    # The captures are judged by the original design's rule, the load now (`_expected_failures`):
    # own load off, which must also replay byte for byte. The pod's own load has its cases in
    # test_own_load.py.
    with serving(make_app(policy=Policy(own_load=False))) as server:
        yield server


def _expected_failures(body: bytes) -> dict[str, str]:
    """Nodes whose utilization annotation is above the default limit, with the uniform reason."""
    items = json.loads(body)["Nodes"]["items"]
    return {
        item["metadata"]["name"]: "gpu utilization above 0.90"
        for item in items
        if float(item["metadata"]["annotations"][UTIL]) > 0.90
    }


@pytest.mark.parametrize("path", _captures("nodecache-false"))
def test_full_node_captures(path: Path, full_node_server: Any) -> None:
    # As captured (utilization and updated-at only: the original design's format), and with
    # the agent's full set of annotations.
    for body in (path.read_bytes(), _with_agent_annotations(path.read_bytes())):
        verb, result = _replay(full_node_server, path, body, form="nodes")
        if verb == "filter":
            assert result["reply"]["FailedNodes"] == _expected_failures(body)
            assert result["reply"]["FailedAndUnresolvableNodes"] == {}
        else:
            # Other inputs equal, a less busy node never scores lower.
            items = json.loads(body)["Nodes"]["items"]
            by_load = sorted(items, key=lambda i: float(i["metadata"]["annotations"][UTIL]))
            ranked = [result["scores"][i["metadata"]["name"]] for i in by_load]
            assert ranked == sorted(ranked, reverse=True)


@pytest.fixture(scope="module")
def names_only_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A scorer in names-only mode whose cache lists the captured Nodes from the stand-in."""
    seed = json.loads((FIXTURES / "nodecache-false" / "0001-filter.request.json").read_bytes())
    with ApiServerStandIn() as standin:
        for item in seed["Nodes"]["items"]:
            annotations = item["metadata"]["annotations"]
            annotations.update(gpu_annotations(utilization=float(annotations[UTIL])))
            item["metadata"].pop("resourceVersion", None)
            standin.put_node(item)
        kubeconfig = standin.write_kubeconfig(tmp_path_factory.mktemp("kube") / "config")
        metrics = ScorerMetrics()
        tuning = CacheTuning(backoff_initial_s=0.01, backoff_max_s=0.05)
        with NodeCache(kubeconfig=str(kubeconfig), metrics=metrics, tuning=tuning) as cache:
            assert cache.wait_until(lambda c: c.ready(), 10)
            with serving(make_app(node_store=cache.store)) as server:
                yield server


@pytest.mark.parametrize("path", _captures("nodecache-true"))
def test_names_only_captures(path: Path, names_only_server: Any) -> None:
    verb, result = _replay(names_only_server, path, path.read_bytes(), form="names")
    if verb == "filter":
        reply = result["reply"]
        assert reply["FailedNodes"] == (
            {"node-hot": "gpu utilization above 0.90"}
            if "node-hot" in json.loads(path.read_bytes())["NodeNames"]
            else {}
        )
        assert reply["FailedAndUnresolvableNodes"] == {}


@pytest.mark.parametrize("agent_annotations", [False, True], ids=["as-captured", "agent-keys"])
def test_captured_sequence_with_the_scorers_own_proposals(agent_annotations: bool) -> None:
    """The full-node captures in the order the scheduler sent them, to a scorer that records
    its decisions as in-flight pods (a pod watch with nothing bound yet): each reply is what a
    fresh evaluation of the request's Nodes, with the pods proposed so far, gives."""
    policy = Policy()
    pods = PodCache(metrics=ScorerMetrics())
    pods._replace([])  # the first LIST: accounting on, no pod bound
    app = ScorerApp(policy=policy, clock=fixed_clock(), pods_of=pods.pods_of, placements=pods)
    counted = 0
    for param in _captures("nodecache-false", (FIXTURES,)):
        (path,) = param.values
        body = path.read_bytes()
        if agent_annotations:
            body = _with_agent_annotations(body)
        verb: Verb = "filter" if _verb(path) == "filter" else "prioritize"
        request = wire.decode_args(body, gpu_resource_name=policy.gpu_resource_name)
        if verb == "filter":
            pods.forget(request.pod.uid)  # what the filter itself does first
        nodes = [msgspec.structs.replace(n, pods=pods.pods_of(n.name)) for n in request.nodes]
        expected = evaluate(request.pod, nodes, NOW, policy)
        counted += sum(1 for v in expected.verdicts if v.inflight is not None)
        reply = app.handle(verb, body).body
        if verb == "prioritize":
            assert reply == wire.encode_prioritize_reply(expected.scores())
        else:
            document = json.loads(reply)
            passed = [item["metadata"]["name"] for item in document["Nodes"]["items"]]
            assert passed == expected.passed_names()
            assert document["FailedNodes"] == expected.failed()
            assert document["FailedAndUnresolvableNodes"] == expected.unresolvable()
    assert counted > 0  # later pods met the earlier pods' proposals
