"""Defined answers where the scorer cannot judge: node cache not synced yet, a bug in the handler.

Neither is ever a 500 or a dropped connection; the scheduler gets a reply it handles (a filter
`Error` retries the pod with back-off; prioritize scores only rank, so neutral scores are safe).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from exporter_scheduler.core.records import NodeInput
from exporter_scheduler.serving.app import NOT_READY_ERROR, ScorerApp
from tests.scorer._http_helpers import (
    args_body,
    call,
    check_prioritize_reply,
    connect,
    gpu_annotations,
    make_app,
    pod,
    serving,
    store_of,
)


def _hot(*names: str) -> list[NodeInput]:
    return [NodeInput(n, gpu_annotations(utilization=0.95), None) for n in names]


def _metric(app: ScorerApp, line_start: str) -> float:
    for line in app.metrics.render()[0].decode().splitlines():
        if line.startswith(line_start + " "):
            return float(line.split()[-1])
    return 0.0


def test_names_only_before_the_first_list_is_an_error_not_a_blind_verdict() -> None:
    store = store_of(None)  # before its first LIST
    app = make_app(node_store=store)
    body = args_body(pod(), names=["a", "b"])

    filtered = app.handle("filter", body)
    assert filtered.status == 200
    reply = json.loads(filtered.body)
    assert reply["Error"] == NOT_READY_ERROR
    assert reply["Nodes"] is None
    assert reply["NodeNames"] == []
    assert reply["FailedNodes"] == reply["FailedAndUnresolvableNodes"] == {}
    scores = app.handle("prioritize", body)
    assert check_prioritize_reply(json.loads(scores.body), given=["a", "b"]) == {"a": 0, "b": 0}
    assert _metric(app, 'gpu_scorer_unready_requests_total{verb="filter"}') == 1
    # Nothing from before the list is reused after it.
    store.replace(_hot("a", "b"))
    after = json.loads(app.handle("filter", body).body)
    assert after["Error"] == ""
    assert after["FailedNodes"] == {
        "a": "gpu utilization above 0.90",
        "b": "gpu utilization above 0.90",
    }


def test_full_node_requests_do_not_wait_for_the_node_cache() -> None:
    app = make_app(node_store=store_of(None))
    body = args_body(pod(), nodes=[])
    assert json.loads(app.handle("filter", body).body)["Error"] == ""


def test_malformed_names_before_the_first_list_are_still_400() -> None:
    response = make_app(node_store=store_of(None)).handle(
        "filter", b'{"Pod": {}, "Nodes": null, "NodeNames": [1]}'
    )
    assert response.status == 400


class Broken(ScorerApp):
    def answer(self, verb: Any, body: bytes, *, query: bytes = b"") -> Any:
        raise RuntimeError("bug")

    def handle_get(self, method: str, path: str) -> Any:
        raise RuntimeError("bug")


@pytest.mark.parametrize(
    ("method", "path", "status", "expected"),
    [
        pytest.param("POST", "/filter", 200, "filter-error", id="filter"),
        pytest.param("POST", "/prioritize", 200, [], id="prioritize"),
        pytest.param("POST", "/explain", 200, "error", id="explain"),
        pytest.param("GET", "/metrics", 503, "error", id="get"),
    ],
)
def test_a_bug_in_the_handler_is_a_defined_answer(
    method: str, path: str, status: int, expected: Any
) -> None:
    app = Broken(policy=make_app().policy)
    with serving(app) as server:
        conn = connect(server)
        body = args_body(pod(), names=["a"]) if method == "POST" else None
        got_status, _, data = call(conn, method, path, body)
        # The server keeps serving on the same connection.
        assert call(conn, method, path, body)[0] == got_status
        conn.close()
    assert got_status == status
    reply = json.loads(data)
    if expected == "filter-error":
        assert reply["Error"] == "gpu scorer internal error: RuntimeError"
        assert reply["Nodes"] is None
        assert reply["NodeNames"] is None
    elif expected == "error":
        assert reply == {"Error": "gpu scorer internal error: RuntimeError"}
    else:
        assert reply == expected
    verb = path.strip("/") if method == "POST" else "other"
    assert _metric(app, f'gpu_scorer_internal_errors_total{{verb="{verb}"}}') == 2
