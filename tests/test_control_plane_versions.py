"""The loopback control plane's version matrix: which pins a version name chooses, and that the
chart, CI and the pins agree on the oldest minor.

Version choice is read from `tools/k8s` (go.mod for the default, versions/<minor>.mod for the
older ones) by `BuildSpec.for_version`; these tests build small modules of their own under
`tmp_path` for the choice, and read the repository's own files for the agreement.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from loopback_cluster.control_plane import VERSION_ENV, BuildSpec, ClusterError

ROOT = Path(__file__).resolve().parent.parent


def _pins(kubernetes: str, etcd: str) -> str:
    return (
        "module gpu-live-scheduler/tools/k8s\n\ngo 1.26.0\n\nrequire (\n"
        f"\tgo.etcd.io/etcd/server/v3 {etcd}\n\tk8s.io/kubernetes {kubernetes}\n)\n"
        f"\nreplace k8s.io/api => k8s.io/api v0.{kubernetes.split('.', 1)[1]}\n"
    )


@pytest.fixture
def module(tmp_path: Path) -> Path:
    """A module pinning v1.37.2 by default, v1.36.3 and v1.35.9 as older minors."""
    (tmp_path / "versions").mkdir()
    (tmp_path / "go.mod").write_text(_pins("v1.37.2", "v3.7.0"))
    (tmp_path / "go.sum").write_text("sum of 1.37\n")
    for kubernetes, etcd in (("v1.36.3", "v3.6.8"), ("v1.35.9", "v3.6.5")):
        minor = kubernetes.rsplit(".", 1)[0]
        (tmp_path / "versions" / f"{minor}.mod").write_text(_pins(kubernetes, etcd))
        (tmp_path / "versions" / f"{minor}.sum").write_text(f"sum of {minor}\n")
    (tmp_path / "cmd").mkdir()
    (tmp_path / "cmd" / "main.go").write_text("package main\n")
    return tmp_path


CHOICES = [
    pytest.param(None, None, ("v1.37.2", "go.mod"), id="nothing-chosen-the-default"),
    pytest.param(None, "v1.36", ("v1.36.3", "versions/v1.36.mod"), id="environment-minor"),
    pytest.param("1.36", None, ("v1.36.3", "versions/v1.36.mod"), id="minor-without-v"),
    pytest.param("v1.35.9", None, ("v1.35.9", "versions/v1.35.mod"), id="exact-release"),
    pytest.param(" v1.37 ", None, ("v1.37.2", "go.mod"), id="the-default-by-name"),
    pytest.param("v1.36", "v1.37", ("v1.36.3", "versions/v1.36.mod"), id="argument-over-env"),
    pytest.param(None, "", ("v1.37.2", "go.mod"), id="empty-environment-the-default"),
]


@pytest.mark.parametrize(("wanted", "environment", "expected"), CHOICES)
def test_a_version_name_chooses_its_pins(
    wanted: str | None,
    environment: str | None,
    expected: tuple[str, str],
    module: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if environment is None:
        monkeypatch.delenv(VERSION_ENV, raising=False)
    else:
        monkeypatch.setenv(VERSION_ENV, environment)
    spec = BuildSpec.for_version(wanted, module)
    assert (spec.kubernetes_version, spec.modfile) == expected
    assert spec.default is (spec.modfile == "go.mod")


@pytest.mark.parametrize(
    "wanted",
    [
        pytest.param("v1.34", id="a-minor-not-pinned"),
        pytest.param("v1.36.2", id="another-patch-release"),
        pytest.param("latest", id="not-a-version"),
    ],
)
def test_a_version_without_pins_is_an_error_that_lists_the_pinned_ones(
    wanted: str, module: Path
) -> None:
    with pytest.raises(ClusterError, match=r"choose one of v1\.37\.2, v1\.36\.3, v1\.35\.9$"):
        BuildSpec.for_version(wanted, module)


def test_every_lists_the_default_first_then_newest_to_oldest(module: Path) -> None:
    specs = BuildSpec.every(module)
    assert [(s.kubernetes_version, s.etcd_version) for s in specs] == [
        ("v1.37.2", "v3.7.0"),
        ("v1.36.3", "v3.6.8"),
        ("v1.35.9", "v3.6.5"),
    ]
    assert len({s.bin_dir for s in specs}) == 3


def test_the_same_pins_build_into_the_same_cache_folder_from_either_file(module: Path) -> None:
    """Moving a version's pins from go.mod to versions/ keeps its built binaries."""
    before = BuildSpec.read(module)
    (module / "versions" / "v1.37.mod").write_text((module / "go.mod").read_text())
    (module / "versions" / "v1.37.sum").write_text((module / "go.sum").read_text())
    moved = BuildSpec.read(module, "versions/v1.37.mod")
    assert (moved.source_digest, moved.bin_dir) == (before.source_digest, before.bin_dir)
    # A change to the pins or to a Go file is a new build.
    (module / "versions" / "v1.37.sum").write_text("another sum\n")
    assert BuildSpec.read(module, "versions/v1.37.mod").source_digest != before.source_digest
    (module / "cmd" / "main.go").write_text("package main // changed\n")
    assert BuildSpec.read(module).source_digest != before.source_digest


def test_a_pin_file_without_kubernetes_is_an_error(module: Path) -> None:
    (module / "versions" / "v1.36.mod").write_text("module x\n\ngo 1.26.0\n")
    with pytest.raises(ClusterError, match=r"v1\.36\.mod does not require 'k8s.io/kubernetes'"):
        BuildSpec.every(module)


def test_the_chart_and_ci_name_the_oldest_pinned_minor() -> None:
    """The chart claims what CI runs: its kubeVersion's floor is the oldest pinned minor, the
    one `.ci/run` runs the e2e suite on a second time."""
    specs = BuildSpec.every()
    oldest = min(specs, key=lambda s: [int(p) for p in s.kubernetes_version[1:].split(".")])
    chart = yaml.safe_load((ROOT / "charts" / "gpu-live-scheduler" / "Chart.yaml").read_text())
    assert chart["kubeVersion"] == f">={oldest.minor.removeprefix('v')}.0-0"
    ci = (ROOT / ".ci" / "run").read_text()
    assert "python3 dev.py cluster build --all" in ci
    assert re.search(rf"^{VERSION_ENV}={re.escape(oldest.minor)} .* -m e2e$", ci, re.M)
    assert specs[0].default
    assert specs[0] != oldest  # the matrix has two minors
