"""The e2e suite's control plane: real etcd, kube-apiserver and kube-scheduler v1.37 on loopback.

One control plane serves the whole run (start-up takes seconds); tests keep out of each other's
way by labelling their Nodes and selecting them from their pods (`Scope`), so a test's pods
only ever see its own Nodes. `LOOPBACK_KUBERNETES=v1.36` runs the suite on the older minor of
the version matrix (docs/control-plane.md). Without the binaries the suite skips with one line
locally and fails in CI (`CI=true`): `.ci/run` builds them first.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import pytest

from loopback_cluster.control_plane import ControlPlane, KubeApi
from tests.e2e.support import Scope, require_control_plane, started_control_plane

_HERE = Path(__file__).resolve().parent
_counter = itertools.count(1)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # Every test here is e2e: `-m "not e2e"` leaves the suite out in one word.
    for item in items:
        if _HERE in item.path.parents:
            item.add_marker(pytest.mark.e2e)


@pytest.fixture
def control_plane_built() -> None:
    """For tests that start a control plane of their own (the demo does)."""
    require_control_plane()


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    with started_control_plane(tmp_path_factory, "control-plane") as plane:
        yield plane


@pytest.fixture
def admin(control_plane: ControlPlane) -> Iterator[KubeApi]:
    with control_plane.admin() as api:
        yield api


@pytest.fixture
def log_dir(tmp_path: Path) -> Path:
    path = tmp_path / "logs"
    path.mkdir()
    return path


@pytest.fixture
def scope(
    admin: KubeApi, control_plane: ControlPlane, request: pytest.FixtureRequest
) -> Iterator[Scope]:
    # Short, DNS-safe and unique in the run: Node and pod names are built from it.
    label = f"t{next(_counter)}"
    test_scope = Scope(admin, label, control_plane)
    try:
        yield test_scope
    finally:
        test_scope.cleanup()
