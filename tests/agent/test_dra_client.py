"""`DraClient` over real HTTP: the real kubernetes client against the API stand-in.

The stand-in serves no `resource.k8s.io`, which is what a cluster without DRA answers (404 on
every version's discovery); its faults give the real server's answer for each status on demand,
which a real API server cannot be made to give (tests/e2e/test_dra.py covers the happy path on
a real one).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes.client.exceptions import ApiException  # type: ignore[import-untyped]

from agent.dra import DraDevice, TaintKind, rule_body
from agent.dra_api import DraApi, DraApiMissing, DraClient
from agent.kube import (
    ApiError,
    ConflictError,
    ForbiddenError,
    ServerError,
    Timeouts,
    TooManyRequestsError,
    TransportError,
    api_client_for,
)
from kube_standins.apiserver import ApiServerStandIn, Fault

API = DraApi("v1", "v1")
BODY = rule_body(
    DraDevice("gpu.nvidia.com", "gpu-node-1", "gpu-0", "GPU-a"),
    TaintKind.UTILIZATION,
    prefix="gpu-scheduler.example.com/",
    api_version="v1",
)


@pytest.fixture
def client(kubeconfig: Path) -> Iterator[DraClient]:
    api_client = api_client_for(str(kubeconfig))
    try:
        yield DraClient(api_client, node_name="gpu-node-1", timeouts=Timeouts(read_s=2.0))
    finally:
        api_client.close()


def test_a_cluster_without_dra_is_api_missing(client: DraClient) -> None:
    with pytest.raises(
        DraApiMissing, match=r"no resource\.k8s\.io \(no Dynamic Resource Allocation\)"
    ):
        client.discover()


def test_discovery_refused_is_forbidden(api_server: ApiServerStandIn, client: DraClient) -> None:
    api_server.inject(Fault(status=403, method="GET", path_contains="resource.k8s.io"))
    with pytest.raises(ForbiddenError, match="DRA"):
        client.discover()


def test_deleting_a_rule_that_is_gone_succeeds(client: DraClient) -> None:
    client.delete_rule(API, "gpu-scheduler.gpu-node-1.gpu-0")


FAULTS = [
    pytest.param(Fault(status=403, method="PATCH"), ForbiddenError, None, id="403"),
    pytest.param(Fault(status=409, method="PATCH"), ConflictError, None, id="409"),
    pytest.param(
        Fault(status=429, method="PATCH", retry_after_s=7), TooManyRequestsError, 7.0, id="429"
    ),
    pytest.param(Fault(status=503, method="PATCH"), ServerError, None, id="503"),
    pytest.param(Fault(method="PATCH", reset=True), TransportError, None, id="reset"),
]


@pytest.mark.parametrize(("fault", "kind", "retry_after_s"), FAULTS)
def test_apply_faults_are_classified(
    api_server: ApiServerStandIn,
    client: DraClient,
    fault: Fault,
    kind: type[ApiError],
    retry_after_s: float | None,
) -> None:
    api_server.inject(fault)
    with pytest.raises(kind) as raised:
        client.apply_rule(API, BODY)
    assert raised.value.retry_after_s == retry_after_s
    (request,) = api_server.requests
    assert (
        request.path == "/apis/resource.k8s.io/v1/devicetaintrules/gpu-scheduler.gpu-node-1.gpu-0"
    )
    assert request.param("fieldManager") == "gpu-scheduler-agent"
    assert request.param("force") == "true"
    assert request.headers["Content-Type"] == "application/apply-patch+yaml"
    assert request.json() == BODY


class _Discovery:
    """An `ApiClient` stand-in that answers discovery documents only (by path)."""

    def __init__(self, documents: dict[str, object]) -> None:
        self.documents = documents
        self.paths: list[str] = []

    def call_api(self, path: str, method: str, **_: object) -> object:
        self.paths.append(path)
        if path not in self.documents:
            raise ApiException(status=404, reason="Not Found")
        body = json.dumps(self.documents[path]).encode()
        return type("Response", (), {"data": body})()


def _group(*versions: str) -> dict[str, object]:
    return {"kind": "APIGroup", "versions": [{"version": v} for v in versions]}


def _resources(*names: str) -> dict[str, object]:
    return {"kind": "APIResourceList", "resources": [{"name": n} for n in names]}


DISCOVERY_CASES = [
    pytest.param(
        {
            "/apis/resource.k8s.io": _group("v1"),
            "/apis/resource.k8s.io/v1": _resources("resourceslices", "devicetaintrules"),
        },
        DraApi("v1", "v1"),
        ["/apis/resource.k8s.io", "/apis/resource.k8s.io/v1"],
        id="1.37",
    ),
    pytest.param(
        {
            "/apis/resource.k8s.io": _group("v1", "v1beta2"),
            "/apis/resource.k8s.io/v1": _resources("resourceslices", "resourceclaims"),
            "/apis/resource.k8s.io/v1beta2": _resources("resourceslices", "devicetaintrules"),
        },
        DraApi("v1", "v1beta2"),
        None,
        id="1.36-with-gates",
    ),
    pytest.param(
        {
            "/apis/resource.k8s.io": _group("v1"),
            "/apis/resource.k8s.io/v1": _resources("resourceslices", "resourceclaims"),
        },
        "DeviceTaintRules",
        None,
        id="1.36-without-gates",
    ),
    pytest.param({}, "no Dynamic Resource Allocation", ["/apis/resource.k8s.io"], id="no-dra"),
    pytest.param(
        {"/apis/resource.k8s.io": "not a document"}, "ResourceSlices", None, id="malformed"
    ),
]


@pytest.mark.parametrize(("documents", "expected", "paths"), DISCOVERY_CASES)
def test_discovery_finds_the_newest_served_versions(
    documents: dict[str, object], expected: DraApi | str, paths: list[str] | None
) -> None:
    fake = _Discovery(documents)
    client = DraClient(fake, node_name="gpu-node-1")
    if isinstance(expected, DraApi):
        assert client.discover() == expected
    else:
        with pytest.raises(DraApiMissing, match=expected):
            client.discover()
    if paths is not None:
        assert fake.paths == paths
