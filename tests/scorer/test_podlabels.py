"""`gpu-scorer label-gpu-pods`: which pods it labels, how it asks, and each way the API server
can refuse it.

The API here is a fake of the two `CoreV1Api` calls the command makes, which applies the
selectors the command sends (so a command that stopped sending them would label finished or
already-labelled pods and fail these tests) and answers with refusals on demand. The same
command against a real kube-apiserver, with the chart's admission policy, is in
tests/e2e/test_gpu_pod_label.py.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException  # type: ignore[import-untyped]
from urllib3.exceptions import ProtocolError

from exporter_scheduler import cli
from exporter_scheduler.edges import podlabels
from exporter_scheduler.edges.podlabels import (
    MERGE_PATCH,
    UNFINISHED,
    LabelError,
    label_gpu_pods,
)
from gpu_contract.schema import Keys

KEYS = Keys.for_prefix("gpu-scheduler.example.com")
KEY = "gpu-scheduler.example.com/gpu-pod"
RESOURCE = "nvidia.com/gpu"


def pod(
    name: str,
    *,
    limits: dict[str, str] | None = None,
    requests: dict[str, str] | None = None,
    init_limits: dict[str, str] | None = None,
    phase: str = "Running",
    labels: dict[str, str] | None = None,
) -> dict[str, Any]:
    def container(cname: str, lim: dict[str, str] | None, req: dict[str, str] | None) -> Any:
        resources: dict[str, Any] = {}
        if lim is not None:
            resources["limits"] = lim
        if req is not None:
            resources["requests"] = req
        return {"name": cname, "image": "busybox", "resources": resources}

    spec: dict[str, Any] = {"containers": [container("main", limits, requests)]}
    if init_limits is not None:
        spec["initContainers"] = [container("init", init_limits, None)]
    return {
        "metadata": {
            "name": name,
            "namespace": "team-a",
            "uid": f"uid-{name}",
            "labels": labels or {},
        },
        "spec": spec,
        "status": {"phase": phase},
    }


class _Response:
    def __init__(self, body: dict[str, Any]) -> None:
        self._body = json.dumps(body).encode()
        self.read = False
        # Whether the body had been read when the connection was released (None: not released).
        self.released_read: bool | None = None

    @property
    def data(self) -> bytes:
        self.read = True
        return self._body

    def release_conn(self) -> None:
        self.released_read = self.read


def refusal(status: int, message: str = "refused") -> ApiException:
    exc = ApiException(status=status, reason="Refused")
    exc.body = json.dumps({"kind": "Status", "message": message, "code": status})
    return exc


@dataclass
class FakeApi:
    """`list_pod_for_all_namespaces` and `patch_namespaced_pod` over `pods`, with the field
    and label selectors the command sends applied as the API server would apply them."""

    pods: list[dict[str, Any]]
    # Raised, in order, by the next calls of each kind (then the calls succeed).
    list_faults: list[Exception] = field(default_factory=list)
    patch_faults: dict[str, list[Exception]] = field(default_factory=dict)
    lists: list[dict[str, Any]] = field(default_factory=list)
    patches: list[tuple[str, str, dict[str, Any], str]] = field(default_factory=list)
    responses: list[_Response] = field(default_factory=list)
    _snapshot: list[dict[str, Any]] = field(default_factory=list)

    def list_pod_for_all_namespaces(self, **kwargs: Any) -> _Response:
        self.lists.append(kwargs)
        if self.list_faults:
            raise self.list_faults.pop(0)
        assert kwargs["field_selector"] == UNFINISHED
        assert kwargs["label_selector"] == f"{KEY}!=true"
        if not kwargs.get("_continue"):  # pages continue from the first page's snapshot
            self._snapshot = [
                json.loads(json.dumps(p))
                for p in self.pods
                if p["status"]["phase"] not in ("Succeeded", "Failed")
                and p["metadata"]["labels"].get(KEY) != "true"
            ]
        selected = self._snapshot
        start = int(kwargs.get("_continue") or 0)
        end = start + kwargs["limit"]
        more = end < len(selected)
        return self._answer(
            {
                "kind": "PodList",
                "metadata": {"resourceVersion": "7", **({"continue": str(end)} if more else {})},
                "items": selected[start:end],
            }
        )

    def patch_namespaced_pod(
        self, name: str, namespace: str, body: dict[str, Any], **kwargs: Any
    ) -> _Response:
        faults = self.patch_faults.get(name) or []
        if faults:
            raise faults.pop(0)
        self.patches.append((namespace, name, body, kwargs["_content_type"]))
        for p in self.pods:
            if p["metadata"]["name"] == name:
                p["metadata"]["labels"].update(body["metadata"]["labels"])
                return self._answer(p)
        raise refusal(404)

    def _answer(self, body: dict[str, Any]) -> _Response:
        response = _Response(body)
        self.responses.append(response)
        return response


def no_sleep(_: float) -> None:
    pass


@pytest.fixture
def fleet() -> list[dict[str, Any]]:
    return [
        pod("by-limits", limits={RESOURCE: "2"}),
        pod("by-requests", requests={RESOURCE: "1"}, limits={RESOURCE: "1"}),
        pod("by-init", limits={"cpu": "1"}, init_limits={RESOURCE: "1"}),
        pod("pending", limits={RESOURCE: "1"}, phase="Pending"),
        pod("cpu", limits={"cpu": "1"}),
        pod("zero", limits={RESOURCE: "0"}),
        pod("no-resources"),
        pod("finished", limits={RESOURCE: "1"}, phase="Succeeded"),
        pod("already", limits={RESOURCE: "1"}, labels={KEY: "true"}),
        pod("other-value", limits={RESOURCE: "1"}, labels={KEY: "no"}),
    ]


def labelled(api: FakeApi) -> list[str]:
    return [name for _, name, _, _ in api.patches]


def test_labels_every_unfinished_gpu_pod_that_lacks_the_label(fleet: list[dict[str, Any]]) -> None:
    api = FakeApi(fleet)
    summary = label_gpu_pods(api, keys=KEYS, resource=RESOURCE, page_size=3, sleep=no_sleep)
    assert labelled(api) == ["by-limits", "by-requests", "by-init", "pending", "other-value"]
    assert (summary.listed, summary.gpu_pods, summary.labelled) == (8, 5, 5)
    assert (summary.gone, summary.failed, summary.error) == (0, 0, None)
    assert [call.get("_continue") for call in api.lists] == [None, "3", "6"]
    namespace, name, body, content_type = api.patches[0]
    assert (namespace, name, content_type) == ("team-a", "by-limits", MERGE_PATCH)
    # The uid is a precondition: a pod made since under the same name is refused, not labelled.
    assert body == {"metadata": {"labels": {KEY: "true"}, "uid": "uid-by-limits"}}
    # A second run finds nothing left to label.
    again = FakeApi(api.pods)
    assert label_gpu_pods(again, keys=KEYS, resource=RESOURCE, sleep=no_sleep).gpu_pods == 0
    assert again.patches == []


def test_every_answer_is_read_before_its_connection_goes_back(
    fleet: list[dict[str, Any]],
) -> None:
    # An unread body left on a pooled connection costs the next call a new connection or a
    # failed request: each patch's answer, unused, is read all the same.
    api = FakeApi(fleet)
    label_gpu_pods(api, keys=KEYS, resource=RESOURCE, page_size=3, sleep=no_sleep)
    assert len(api.responses) == len(api.lists) + len(api.patches)
    assert [r.released_read for r in api.responses] == [True] * len(api.responses)


def test_a_dry_run_counts_and_labels_nothing(fleet: list[dict[str, Any]]) -> None:
    api = FakeApi(fleet)
    summary = label_gpu_pods(api, keys=KEYS, resource=RESOURCE, dry_run=True, sleep=no_sleep)
    assert (summary.gpu_pods, summary.labelled, summary.dry_run) == (5, 0, True)
    assert api.patches == []


def test_the_resource_and_prefix_are_the_scorers() -> None:
    api = FakeApi([pod("amd", limits={"amd.com/gpu": "1"}), pod("nv", limits={RESOURCE: "1"})])
    label_gpu_pods(api, keys=KEYS, resource="amd.com/gpu", sleep=no_sleep)
    assert labelled(api) == ["amd"]


def test_throttling_and_dropped_connections_are_retried_with_back_off() -> None:
    api = FakeApi(
        [pod("a", limits={RESOURCE: "1"})],
        list_faults=[refusal(429), ProtocolError("connection reset")],
        patch_faults={"a": [refusal(503), refusal(500)]},
    )
    waits: list[float] = []
    summary = label_gpu_pods(api, keys=KEYS, resource=RESOURCE, sleep=waits.append)
    assert (summary.labelled, summary.failed) == (1, 0)
    assert waits == [1.0, 2.0, 1.0, 2.0]


def test_a_pod_gone_or_replaced_since_the_list_is_counted_as_gone() -> None:
    api = FakeApi(
        [pod(n, limits={RESOURCE: "1"}) for n in ("deleted", "replaced", "kept")],
        patch_faults={"deleted": [refusal(404)], "replaced": [refusal(409, "uid mismatch")]},
    )
    summary = label_gpu_pods(api, keys=KEYS, resource=RESOURCE, sleep=no_sleep)
    assert (summary.labelled, summary.gone, summary.failed) == (1, 2, 0)


def test_a_refused_patch_is_named_and_the_others_still_labelled() -> None:
    api = FakeApi(
        [pod(n, limits={RESOURCE: "1"}) for n in ("a", "b")],
        patch_faults={"a": [refusal(403, 'pods "a" is forbidden')]},
    )
    summary = label_gpu_pods(api, keys=KEYS, resource=RESOURCE, sleep=no_sleep)
    assert (summary.labelled, summary.failed) == (1, 1)
    assert summary.error == 'patch pod team-a/a: 403 pods "a" is forbidden'


@pytest.mark.parametrize(
    ("faults", "why"),
    [
        pytest.param([refusal(403, "forbidden")], "list pods: 403 forbidden", id="403-at-once"),
        pytest.param([refusal(503)] * 5, "list pods: 503 refused", id="503-five-times"),
    ],
)
def test_a_list_that_cannot_be_had_raises_naming_why(faults: list[Exception], why: str) -> None:
    api = FakeApi([pod("a", limits={RESOURCE: "1"})], list_faults=list(faults))
    with pytest.raises(LabelError, match=f"^{why}$"):
        label_gpu_pods(api, keys=KEYS, resource=RESOURCE, sleep=no_sleep)
    assert api.patches == []


@pytest.fixture
def cli_api(monkeypatch: pytest.MonkeyPatch) -> FakeApi:
    api = FakeApi([pod("a", limits={RESOURCE: "1"}), pod("b", limits={RESOURCE: "1"})])
    monkeypatch.setattr("exporter_scheduler.edges.listwatch.make_api", lambda _: api)
    monkeypatch.setattr(podlabels.time, "sleep", no_sleep)
    return api


def test_the_command_prints_one_summary_line_and_exits_by_outcome(
    cli_api: FakeApi, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["label-gpu-pods", "--annotation-prefix", "gpu-scheduler.example.com"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert (summary["labelled"], summary["failed"]) == (2, 0)

    cli_api.pods = [pod("c", limits={RESOURCE: "1"})]
    cli_api.patch_faults = {"c": [refusal(403)]}
    assert cli.main(["label-gpu-pods"]) == 1
    assert json.loads(capsys.readouterr().out)["failed"] == 1

    cli_api.list_faults = [refusal(401, "Unauthorized")]
    assert cli.main(["label-gpu-pods"]) == 1
    assert "list pods: 401 Unauthorized" in capsys.readouterr().err
