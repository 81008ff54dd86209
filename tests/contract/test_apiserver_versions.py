"""The kube-apiserver v1.37.2 captures answer as the v1.36 ones do, where the agent looks.

Each v1.37 exchange replays the v1.36 request of the same name (`loopback_cluster.capture`);
their bodies differ in places (a 422 lists its cause once, a malformed patch is reported as
"invalid JSON patch": the folder's README), so what must hold is what the agent reads: the
status code and the error class `agent.kube.classify` makes of the answer.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client.rest import ApiException

from agent.kube import classify
from tests.fixture_paths import APISERVER_FIXTURES, APISERVER_FIXTURES_V137

RECORDED_AGAIN = sorted(p.name for p in APISERVER_FIXTURES_V137.glob("*.json"))


def _response(folder: Path, name: str) -> dict[str, Any]:
    response: dict[str, Any] = json.loads((folder / name).read_text())["response"]
    return response


def _exception(response: dict[str, Any]) -> ApiException:
    error = ApiException(status=response["status"], reason=response["reason"])
    error.body = response["body"]
    error.headers = dict(response["headers"])
    return error


def test_most_exchanges_were_recorded_again() -> None:
    # The watches, compaction, restart and service-account cases need set-ups of their own.
    assert len(RECORDED_AGAIN) >= 29


@pytest.mark.parametrize("name", RECORDED_AGAIN)
def test_the_agent_reads_the_same_answer_from_both_minors(name: str) -> None:
    old, new = _response(APISERVER_FIXTURES, name), _response(APISERVER_FIXTURES_V137, name)
    assert (new["status"], new["reason"]) == (old["status"], old["reason"])
    if new["status"] >= 400:
        was = classify(_exception(old), node_name="gpu-node-1")
        now = classify(_exception(new), node_name="gpu-node-1")
        assert type(now) is type(was)
