"""The kube-apiserver v1.37.2 captures answer as the v1.36 ones do, where the agent and the
scorer look.

Each v1.37 exchange repeats the v1.36 request of the same name (`loopback_cluster.capture`
replays those needing no set-up; `loopback_cluster.capture_watch` records the watches, the
compaction, restart and credential cases). Their bodies differ in places (a 422 lists its
cause once, a malformed patch is reported as "invalid JSON patch": the folder's README), so
what must hold is what is read of them: the status code and the error class
`agent.kube.classify` makes of an answer; for a watch, the stream's framing, its change
events, its ERROR event's code (410 Gone: relist), whether bookmarks come, and what the
scorer's Node cache makes of it line by line.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client.rest import ApiException

from agent.kube import classify
from exporter_scheduler.edges.nodecache import NodeCache, WatchExpiredError
from exporter_scheduler.serving.metrics import ScorerMetrics
from tests.fixture_paths import APISERVER_FIXTURES, APISERVER_FIXTURES_V137

CHANGES = ("ADDED", "MODIFIED", "DELETED")
INITIAL_EVENTS_END = "k8s.io/initial-events-end"


def _document(folder: Path, name: str) -> dict[str, Any]:
    document: dict[str, Any] = json.loads((folder / name).read_text())
    return document


# Request/response exchanges (`64` is etcd's answer to the compaction, not an exchange).
EXCHANGES = sorted(
    p.name
    for p in APISERVER_FIXTURES_V137.glob("*.json")
    if "response" in json.loads(p.read_text())
)
WATCHES = sorted(
    p.name.removesuffix(".meta.json") for p in APISERVER_FIXTURES_V137.glob("*.meta.json")
)


def _response(folder: Path, name: str) -> dict[str, Any]:
    response: dict[str, Any] = _document(folder, name)["response"]
    return response


def _exception(response: dict[str, Any]) -> ApiException:
    error = ApiException(status=response["status"], reason=response["reason"])
    error.body = response["body"]
    error.headers = dict(response["headers"])
    return error


def _recorded(folder: Path) -> set[str]:
    return {p.name for p in folder.iterdir() if p.name != "README.md"}


def test_every_exchange_was_recorded_again() -> None:
    assert _recorded(APISERVER_FIXTURES_V137) == _recorded(APISERVER_FIXTURES)
    assert len(EXCHANGES) == 36
    assert len(WATCHES) == 9


@pytest.mark.parametrize("name", EXCHANGES)
def test_the_agent_reads_the_same_answer_from_both_minors(name: str) -> None:
    old, new = _response(APISERVER_FIXTURES, name), _response(APISERVER_FIXTURES_V137, name)
    assert (new["status"], new["reason"]) == (old["status"], old["reason"])
    if new["status"] >= 400:
        was = classify(_exception(old), node_name="gpu-node-1")
        now = classify(_exception(new), node_name="gpu-node-1")
        assert type(now) is type(was)
        assert new["body_json"]["reason"] == old["body_json"]["reason"]
    else:
        assert new["body_json"]["kind"] == old["body_json"]["kind"]
        if new["body_json"]["kind"] == "NodeList":
            names = [[i["metadata"]["name"] for i in r["body_json"]["items"]] for r in (old, new)]
            assert names[1] == names[0]


def test_a_node_delete_answers_a_status_not_the_node() -> None:
    old, new = (_response(f, "54-delete-node.json")["body_json"] for f in _folders())
    assert (new["kind"], new["status"], new["details"]["name"]) == (
        "Status",
        "Success",
        "gpu-node-2",
    )
    assert (old["kind"], old["status"]) == (new["kind"], new["status"])


def _folders() -> tuple[Path, Path]:
    return APISERVER_FIXTURES, APISERVER_FIXTURES_V137


# ----------------------------------------------------------------------------- watches


def _lines(folder: Path, stem: str) -> list[bytes]:
    return (folder / f"{stem}.ndjson").read_bytes().splitlines(keepends=True)


def _meta(folder: Path, stem: str) -> dict[str, Any]:
    return _document(folder, f"{stem}.meta.json")


def _header(meta: dict[str, Any], name: str) -> str | None:
    return next((v for k, v in meta["response_headers"] if k.lower() == name.lower()), None)


def _shape(folder: Path, stem: str) -> dict[str, Any]:
    """What a client reads of a watch, uids, resourceVersions and times set aside."""
    meta = _meta(folder, stem)
    events = [json.loads(line) for line in _lines(folder, stem)]
    changes = [(e["type"], e["object"]["metadata"]["name"]) for e in events if e["type"] in CHANGES]
    bookmarks = [e["object"] for e in events if e["type"] == "BOOKMARK"]
    first = events[0] if events else None
    return {
        "status": meta["response_status_line"],
        "content_type": _header(meta, "Content-Type"),
        "chunked": _header(meta, "Transfer-Encoding"),
        # `63b`'s count depends on which revisions the patches got: only who changed.
        "changes": sorted(set(changes)) if stem.startswith("63b") else changes,
        "errors": [
            (
                e["object"]["kind"],
                e["object"]["code"],
                e["object"]["reason"],
                e["object"]["message"].split(":")[0],
            )
            for e in events
            if e["type"] == "ERROR"
        ],
        # Besides the one that ends the initial events: the periodic ones, and the one
        # shortly before the deadline of a long watch.
        "bookmarks": any(
            INITIAL_EVENTS_END not in (b["metadata"].get("annotations") or {}) for b in bookmarks
        ),
        "named_bookmarks": [
            b["metadata"].get("name") for b in bookmarks if b["metadata"].get("name")
        ],
        "starts_with_initial_events_end": first is not None
        and first["type"] == "BOOKMARK"
        and (first["object"]["metadata"].get("annotations") or {}).get(INITIAL_EVENTS_END)
        == "true",
        # The stream ends at timeoutSeconds, or at once after an ERROR event.
        "closed_at_s": round(meta["socket_reads_t_rel_s_and_bytes"][-1][0]),
    }


@pytest.mark.parametrize("stem", WATCHES)
def test_a_watch_streams_the_same_events_from_both_minors(stem: str) -> None:
    old, new = (_shape(folder, stem) for folder in _folders())
    assert new == old


@pytest.mark.parametrize("stem", WATCHES)
def test_each_event_is_one_chunk_and_one_line(stem: str) -> None:
    for folder in _folders():
        meta = _meta(folder, stem)
        assert meta["wire_chunk_sizes"] == [len(line) for line in _lines(folder, stem)]
        assert meta["body_bytes"] == sum(meta["wire_chunk_sizes"])


def _read_by_the_scorer(folder: Path, stem: str) -> tuple[list[str], bool, int]:
    """The scorer's Node cache fed the capture line by line: the names it then holds,
    whether an event made it relist, how many lines it read."""
    cache = NodeCache(metrics=ScorerMetrics())
    read = 0
    for line in _lines(folder, stem):
        read += 1
        try:
            cache._apply(line)
        except WatchExpiredError:
            return cache.names(), True, read
    return cache.names(), False, read


@pytest.mark.parametrize("stem", WATCHES)
def test_the_scorer_reads_a_watch_of_either_minor_alike(stem: str) -> None:
    old, new = (_read_by_the_scorer(folder, stem) for folder in _folders())
    assert new[:2] == old[:2]
    if new[1]:  # the 410 is the stream's only event
        assert new[2] == old[2] == 1


@pytest.mark.parametrize(
    "stem",
    [
        "62-watch-rv1-too-old",
        "65-watch-rv1-after-compaction",
        "67b-watch-rv-from-before-apiserver-restart",
    ],
)
def test_a_too_old_watch_is_an_error_410_inside_an_http_200(stem: str) -> None:
    for folder in _folders():
        assert _meta(folder, stem)["response_status_line"] == "HTTP/1.1 200 OK"
        (line,) = _lines(folder, stem)
        status = json.loads(line)["object"]
        assert (status["code"], status["reason"]) == (410, "Expired")
        assert re.fullmatch(r"too old resource version: \d+ \(\d+\)", status["message"])


def test_a_watch_from_a_future_revision_skips_the_events_up_to_it() -> None:
    stem = "63b-watch-rv-slightly-in-future"
    for folder in _folders():
        meta = _meta(folder, stem)
        asked = int(re.search(r"resourceVersion=(\d+)", meta["request"]["raw"])[1])  # type: ignore[index]
        delivered = [int(e["resourceVersion"]) for e in meta["events_summary"]]
        made = [int(s["resourceVersion"]) for s in meta["side_requests_during_watch"]]
        assert delivered
        assert delivered == [rv for rv in made if rv > asked]
        assert any(rv <= asked for rv in made)
