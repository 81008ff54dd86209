"""Shared test fixtures: the local Kubernetes API server stand-in and a real client for it."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from kube_standins.apiserver import ApiServerStandIn, ManualClock

# The time of the first capture in the kube-apiserver fixtures.
FIXTURE_T0 = datetime(2026, 11, 30, 14, 19, 24, tzinfo=UTC)


@pytest.fixture
def api_server() -> Iterator[ApiServerStandIn]:
    """A started stand-in on a free loopback port (real clock, token `test-token`, 1 s
    bookmarks); stopped, with its watches closed, after the test."""
    server = ApiServerStandIn(bookmark_interval_s=1.0)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def api_clock() -> ManualClock:
    """A server clock that moves only when told, starting at the fixtures' first capture."""
    return ManualClock(FIXTURE_T0)


@pytest.fixture
def frozen_api_server(api_clock: ManualClock) -> Iterator[ApiServerStandIn]:
    """Like `api_server`, but its clock is `api_clock` (managedFields times under test control)."""
    server = ApiServerStandIn(clock=api_clock, bookmark_interval_s=1.0)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def kubeconfig(api_server: ApiServerStandIn, tmp_path: Path) -> Path:
    """A kubeconfig file pointing the real kubernetes client at `api_server`."""
    return api_server.write_kubeconfig(tmp_path / "kubeconfig")


@pytest.fixture
def core_v1(kubeconfig: Path) -> Iterator[Any]:
    """A real `kubernetes.client.CoreV1Api` talking HTTP to `api_server`."""
    from kubernetes import client, config  # noqa: PLC0415  (only tests that ask pay the import)

    configuration = client.Configuration()
    config.load_kube_config(config_file=str(kubeconfig), client_configuration=configuration)
    api_client = client.ApiClient(configuration)
    try:
        yield client.CoreV1Api(api_client)
    finally:
        api_client.close()
