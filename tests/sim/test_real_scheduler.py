"""The real-scheduler benchmark's modes and its section, without a control plane."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

from benchmarks import real_scheduler
from loopback_cluster.control_plane import ControlPlane


@pytest.mark.parametrize(
    ("mode", "want"),
    [
        pytest.param(
            "names",
            {"names_only": True, "inflight": True, "kubeconfig": True, "flag": None},
            id="names-counts-in-flight-pods-and-own-load",
        ),
        pytest.param(
            "names-no-inflight",
            {"names_only": True, "inflight": False, "kubeconfig": True, "flag": "--no-pod-watch"},
            id="names-without-pod-watch",
        ),
        pytest.param(
            "names-no-own-load",
            {"names_only": True, "inflight": True, "kubeconfig": True, "flag": "--no-own-load"},
            id="names-without-own-load",
        ),
        pytest.param(
            "full",
            {"names_only": False, "inflight": False, "kubeconfig": False, "flag": None},
            id="full-without-credentials",
        ),
    ],
)
def test_each_scorer_mode_starts_the_scorer_it_names(
    tmp_path: Path, mode: str, want: dict[str, Any]
) -> None:
    plane = cast(ControlPlane, SimpleNamespace(admin_kubeconfig=tmp_path / "admin.kubeconfig"))
    extender = real_scheduler.extenders(plane, tmp_path, [mode])[mode]
    argv = extender.process.argv
    assert extender.names_only is want["names_only"]
    assert ("--node-cache" in argv) is want["names_only"]
    # The Pod watch needs credentials: names only has the admin kubeconfig for both caches.
    assert (f"--kubeconfig={tmp_path / 'admin.kubeconfig'}" in argv) is want["kubeconfig"]
    flags = [arg for arg in argv if arg in ("--no-pod-watch", "--no-own-load")]
    assert flags == ([] if want["flag"] is None else [want["flag"]])
    assert extender.inflight is want["inflight"]
    config = real_scheduler.scheduler_config(mode, {mode: extender})
    assert config.extender is not None
    assert config.extender.node_cache_capable is want["names_only"]


def _document(
    on_pods_per_s: float, off_pods_per_s: float, variant: str = "names-no-inflight"
) -> dict[str, Any]:
    def entry(pods_per_s: float) -> dict[str, Any]:
        return {
            "pods_per_s_median": pods_per_s,
            "pods_per_s": [pods_per_s],
            "ratio_to_none": pods_per_s / 100.0,
            "scorer_ms_median": {"filter": 1.0, "prioritize": 0.5},
        }

    modes = {
        "none": {"pods_per_s_median": 100.0, "pods_per_s": [100.0], "ratio_to_none": 1.0},
        "names": entry(on_pods_per_s),
        variant: entry(off_pods_per_s),
    }
    return {
        "machine": "2 logical CPUs",
        "measured_at": "2026-12-02 10:00 UTC",
        "sizes": [
            {
                "config": {"nodes": 5000, "pods": 400, "rounds": 3},
                "patches_per_s": 110.0,
                "modes": modes,
            }
        ],
    }


@pytest.mark.parametrize(
    ("on", "off", "verdict"),
    [
        pytest.param(80.0, 78.0, "1.03x; met: not lower", id="on-faster"),
        pytest.param(80.0, 80.0, "1.00x; met: not lower", id="equal"),
        pytest.param(70.0, 80.0, "0.88x; NOT met: not lower", id="on-slower"),
    ],
)
def test_the_section_compares_in_flight_accounting_on_and_off(
    on: float, off: float, verdict: str
) -> None:
    section = real_scheduler.markdown_section(
        _document(on, off),
        command="python -m benchmarks.real_scheduler",
        before=None,
        plotted=False,
    )
    row = next(line for line in section.splitlines() if "no in-flight accounting" in line)
    assert f"| {off:.1f} " in row
    assert "`--no-pod-watch`" in section
    assert (
        f"names with in-flight accounting at 5,000 nodes {on:.1f} pods/s against {off:.1f} "
        f"without ({verdict})"
    ) in section


@pytest.mark.parametrize(
    ("null", "verdict"),
    [
        pytest.param(84.0, "0.95x (met: >= 0.95x)", id="at-the-floor"),
        pytest.param(90.0, "0.89x (NOT met: >= 0.95x)", id="below"),
    ],
)
def test_the_section_judges_names_only_against_the_go_null_extender(
    null: float, verdict: str
) -> None:
    document = _document(80.0, 80.0)
    modes = document["sizes"][0]["modes"]  # type: ignore[index]
    modes["null-go-names"] = {
        "pods_per_s_median": null,
        "pods_per_s": [null],
        "ratio_to_none": null / 100.0,
        "scorer_ms_median": {},
    }
    section = real_scheduler.markdown_section(
        document, command="python -m benchmarks.real_scheduler", before=None, plotted=False
    )
    assert f"names against the Go null extender at 5,000 nodes {verdict}" in section
    assert "full against the Go null extender" not in section  # no full-node modes run


@pytest.mark.parametrize(
    ("on", "off", "verdict"),
    [
        pytest.param(80.0, 78.0, "1.03x; met: not lower", id="on-faster"),
        pytest.param(70.0, 80.0, "0.88x; NOT met: not lower", id="on-slower"),
    ],
)
def test_the_section_compares_the_pods_own_load_counted_and_not(
    on: float, off: float, verdict: str
) -> None:
    section = real_scheduler.markdown_section(
        _document(on, off, variant="names-no-own-load"),
        command="python -m benchmarks.real_scheduler",
        before=None,
        plotted=False,
    )
    row = next(line for line in section.splitlines() if "own load not counted" in line)
    assert f"| {off:.1f} " in row
    assert "`names-no-own-load` is the same scorer with `--no-own-load`." in section
    assert (
        f"names with the pod's own load counted at 5,000 nodes {on:.1f} pods/s against "
        f"{off:.1f} without ({verdict})"
    ) in section
    assert "in-flight accounting at" not in section  # that variant did not run


def test_each_pod_of_a_burst_is_a_deployments_replica() -> None:
    pod = real_scheduler.replica_pod("r0-names-0001", scheduler_name="bench-names")
    (owner,) = pod["metadata"]["ownerReferences"]
    assert owner["kind"] == "ReplicaSet"
    assert owner["name"] == f"r0-names-{real_scheduler.TEMPLATE_HASH}"
    assert owner["controller"] is True
    labels = pod["metadata"]["labels"]
    assert labels["pod-template-hash"] == real_scheduler.TEMPLATE_HASH
    assert labels["round"] == "r0-names"  # the bind watch selects a round's pods by it


def test_the_figures_run_every_mode_the_new_ones_included() -> None:
    assert {"names-no-inflight", "names-no-own-load"} <= set(real_scheduler.ALL_MODES)
    assert set(real_scheduler.ALL_MODES) <= set(real_scheduler.MODE_LABELS)
    assert real_scheduler.MODES == ("none", "names", "full")  # the default run is unchanged


def test_the_before_scorer_runs_that_trees_package(tmp_path: Path) -> None:
    plane: Any = SimpleNamespace(admin_kubeconfig=tmp_path / "admin.kubeconfig")
    tree = tmp_path / "tree"
    made = real_scheduler.extenders(
        plane, tmp_path, ("none", "names", real_scheduler.BEFORE_MODE), before=tree
    )
    before = made[real_scheduler.BEFORE_MODE].process
    # `-P`: the working directory (this checkout) stays off the path; the tree is on it.
    assert before.argv[1:4] == ["-P", "-m", "exporter_scheduler"]
    assert before.env["PYTHONPATH"] == str(tree)
    assert "-P" not in made["names"].process.argv
    assert "PYTHONPATH" not in made["names"].process.env
    with pytest.raises(ValueError, match="--before"):
        real_scheduler.extenders(plane, tmp_path, (real_scheduler.BEFORE_MODE,))


def test_each_mode_is_compared_with_the_go_null_extender_round_by_round() -> None:
    """Round by round, the ratios cancel the machine's drift between rounds; the section gives
    their median and range beside the ratio of the medians."""
    pods_per_s = {
        "none": [300.0, 200.0, 100.0],
        "names": [270.0, 190.0, 80.0],
        "null-go-names": [280.0, 200.0, 100.0],
    }
    rounds = [
        real_scheduler.Round(mode, index, value, 1.0)
        for mode, values in pods_per_s.items()
        for index, value in enumerate(values)
    ]
    config = real_scheduler.Config(
        nodes=300, pods=100, rounds=3, modes=("none", "names", "null-go-names")
    )
    patcher = cast(
        real_scheduler.Patcher,
        SimpleNamespace(rate_per_s=1.0, errors=0, cpu_s=0.0, started_s=0.0, stopped_s=1.0),
    )
    summary = real_scheduler.summarize(config, rounds, patcher)
    names = summary["modes"]["names"]
    assert names["over_null_go_by_round"] == [0.964, 0.95, 0.8]
    assert names["over_null_go_by_round_median"] == pytest.approx(0.95)
    assert names["pods_per_s_median"] / summary["modes"]["null-go-names"]["pods_per_s_median"] == (
        pytest.approx(0.95)
    )
    assert "over_null_go_by_round" not in summary["modes"]["null-go-names"]
    assert "over_null_go_by_round" not in summary["modes"]["none"]
    document = {
        "machine": "2 logical CPUs",
        "measured_at": "2026-12-06 10:00 UTC",
        "sizes": [summary | {"config": {"nodes": 300, "pods": 100, "rounds": 3}}],
    }
    section = real_scheduler.markdown_section(
        document, command="python -m benchmarks.real_scheduler", before=None, plotted=False
    )
    assert (
        "names against the Go null extender at 300 nodes 0.95x (met: >= 0.95x; round by round "
        "0.95x, 0.80x-0.96x)"
    ) in section
