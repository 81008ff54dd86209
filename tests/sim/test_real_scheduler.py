"""The real-scheduler benchmark's modes and its section, without a control plane."""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import itertools
import json
import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
import yaml

from benchmarks import real_scheduler, wire_capture
from benchmarks.machine import MachineCpu, machine_cpu, machine_cpu_s
from benchmarks.sections import scheduler
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


def test_pinned_extenders_start_on_their_cpus_alone(tmp_path: Path) -> None:
    plane = cast(
        ControlPlane,
        SimpleNamespace(
            admin_kubeconfig=tmp_path / "admin.kubeconfig",
            spec=SimpleNamespace(bin_dir=tmp_path),
        ),
    )
    modes = ["names", "null-go-names", "names-before"]
    made = real_scheduler.extenders(plane, tmp_path, modes, before=tmp_path, cpus=(1, 3))
    for mode in modes:
        argv = made[mode].process.argv
        assert argv[:3] == ["taskset", "--cpu-list", "1,3"], mode
    # The earlier tree's scorer keeps its `-P` right after the interpreter.
    assert made["names-before"].process.argv[3:5] == [sys.executable, "-P"]
    unpinned = real_scheduler.extenders(plane, tmp_path, ["names"])["names"].process.argv
    assert unpinned[0] == sys.executable


@pytest.mark.parametrize(
    ("flag", "error"),
    [
        ("0,1", "a part of this process's CPUs"),
        ("7", "a part of this process's CPUs"),
        ("one", "comma-separated CPU numbers"),
    ],
)
def test_extender_cpus_must_leave_cpus_for_the_rest(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], flag: str, error: str
) -> None:
    monkeypatch.setattr(real_scheduler.os, "sched_getaffinity", lambda pid: {0, 1})
    with pytest.raises(SystemExit):
        real_scheduler.parse_args(["--modes", "none,names", "--extender-cpus", flag])
    assert error in capsys.readouterr().err
    args = real_scheduler.parse_args(["--modes", "none,names", "--extender-cpus", "1"])
    assert args.extender_cpus == (1,)


def test_the_section_says_where_pinned_extenders_ran() -> None:
    document = _paired_document([90.0, 95.0, 100.0], none=[120.0] * 3, null=[100.0] * 3)
    render = real_scheduler.markdown_section
    assert "shares the machine's cores" in render(document, command="c", before=None, plotted=False)
    document["sizes"][0]["config"]["extender_cpus"] = [1]  # type: ignore[index]
    section = " ".join(render(document, command="c", before=None, plotted=False).split())
    assert "The extenders ran on CPU 1 alone (`--extender-cpus`)" in section
    assert "patcher) on the other CPUs." in section


def test_the_section_says_how_its_rounds_were_ordered() -> None:
    document = _paired_document([90.0, 95.0, 100.0], none=[120.0] * 3, null=[100.0] * 3)
    config = document["sizes"][0]["config"]  # type: ignore[index]

    def section() -> str:
        text = real_scheduler.markdown_section(document, command="c", before=None, plotted=False)
        return " ".join(text.split())

    config.pop("round_order", None)  # a run from before the order was recorded
    assert "rounds per mode in rotating order," in section()
    config["round_order"] = real_scheduler.Config(nodes=1).round_order
    assert "rounds per mode in orders balanced for the mode run just before," in section()


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


@pytest.mark.parametrize("quick", [True, False])
def test_the_figures_arguments_are_a_command_the_benchmark_takes(quick: bool) -> None:
    """The figures run every mode but those that need more than the checkout: the earlier
    commit's scorer (`--before`), the image's (a built image, and root)."""
    args = real_scheduler.parse_args(scheduler.arguments(quick=quick))
    unplanned = {real_scheduler.BEFORE_MODE, real_scheduler.IMAGE_MODE}
    assert set(real_scheduler.UNPLANNED_MODES) == unplanned
    assert set(args.modes) == set(real_scheduler.ALL_MODES) - unplanned


def _plane_with_credentials(folder: Path) -> Any:
    """A plane whose admin kubeconfig names its CA, certificate and key by path, as the
    loopback control plane writes it."""
    for name, content in (("ca.crt", b"CA"), ("admin.crt", b"CERT"), ("admin.key", b"KEY")):
        (folder / name).write_bytes(content)
    kubeconfig = folder / "admin.kubeconfig"
    kubeconfig.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [
                    {
                        "name": "plane",
                        "cluster": {
                            "server": "https://127.0.0.1:6443",
                            "certificate-authority": str(folder / "ca.crt"),
                        },
                    }
                ],
                "users": [
                    {
                        "name": "admin",
                        "user": {
                            "client-certificate": str(folder / "admin.crt"),
                            "client-key": str(folder / "admin.key"),
                        },
                    }
                ],
                "contexts": [{"name": "plane", "context": {"cluster": "plane", "user": "admin"}}],
                "current-context": "plane",
            }
        )
    )
    return SimpleNamespace(admin_kubeconfig=kubeconfig)


def test_a_self_contained_kubeconfig_carries_the_files_it_named(tmp_path: Path) -> None:
    plane = _plane_with_credentials(tmp_path)
    folder = real_scheduler.self_contained_kubeconfig(plane.admin_kubeconfig, tmp_path / "out")
    written = folder / real_scheduler.KUBECONFIG_IN_IMAGE.name
    config = yaml.safe_load(written.read_text())
    cluster, user = config["clusters"][0]["cluster"], config["users"][0]["user"]
    assert base64.b64decode(cluster["certificate-authority-data"]) == b"CA"
    assert base64.b64decode(user["client-certificate-data"]) == b"CERT"
    assert base64.b64decode(user["client-key-data"]) == b"KEY"
    assert not {"certificate-authority", "client-certificate", "client-key"} & {*cluster, *user}
    assert cluster["server"] == "https://127.0.0.1:6443"
    # Read by the chart's user inside the image, not the host's root.
    assert written.stat().st_mode & 0o777 == 0o644
    assert folder.stat().st_mode & 0o777 == 0o755


def test_the_image_scorer_runs_from_the_image_as_the_chart_runs_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    image_env = {"PYTHONOPTIMIZE": "2", "PATH": "/opt/gpu-live-scheduler/bin:/usr/bin"}
    monkeypatch.setattr(real_scheduler.image, "image_env", lambda name: image_env)
    plane = _plane_with_credentials(tmp_path)
    rootfs = tmp_path / "rootfs"
    mounted = real_scheduler.image.MountedImage("localhost/gpu-live-scheduler:abc", rootfs)
    made = real_scheduler.extenders(
        plane, tmp_path / "logs", ["names", real_scheduler.IMAGE_MODE], mounted_image=mounted
    )
    extender = made[real_scheduler.IMAGE_MODE]
    argv = extender.process.argv
    assert extender.names_only
    assert extender.inflight
    assert argv[0] == "unshare"
    user = real_scheduler.image.IMAGE_USER
    assert f"--userspec={user}:{user}" in argv
    assert f"--groups={user}" in argv
    assert "ro" in argv[: argv.index(f"--userspec={user}:{user}")]  # a read-only root
    # The image's environment (its binaries on PATH) and its own binary, with the checkout's
    # scorer's arguments.
    assert "PYTHONOPTIMIZE=2" in argv
    assert f"PATH={image_env['PATH']}" in argv
    command = argv[argv.index("gpu-scorer") :]
    assert f"--kubeconfig={real_scheduler.KUBECONFIG_IN_IMAGE}" in command

    def settings(args: list[str]) -> list[str]:  # but the port and the kubeconfig's path
        return [a for a in args if not a.startswith(("--port=", "--kubeconfig="))]

    checkout = made["names"].process.argv
    assert checkout[:3] == [sys.executable, "-m", "exporter_scheduler"]
    assert settings(command[1:]) == settings(checkout[3:])
    assert command[1:3] == ["serve", "--host=127.0.0.1"]
    assert "--node-cache" in command
    # The credentials are mounted read-only where the kubeconfig flag names them.
    credentials = tmp_path / "logs" / "image"
    mount = argv.index(str(credentials))
    assert argv[mount + 1] == str(rootfs / "etc" / "gpu-bench")
    assert (credentials / real_scheduler.KUBECONFIG_IN_IMAGE.name).exists()
    with pytest.raises(ValueError, match=r"dev\.py image"):
        real_scheduler.extenders(plane, tmp_path / "logs", [real_scheduler.IMAGE_MODE])


def test_a_run_of_the_image_mode_without_an_image_stops_before_any_setup(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    reason = "the image is older than the checkout: run `python3 dev.py image`"
    monkeypatch.setattr(real_scheduler.image, "current", lambda: (None, reason))

    def no_run(*args: Any, **kwargs: Any) -> dict[str, Any]:
        raise AssertionError("a control plane was started")

    monkeypatch.setattr(real_scheduler, "run", no_run)
    modes = f"none,names,{real_scheduler.IMAGE_MODE}"
    assert real_scheduler.main(["--nodes", "50,300", "--modes", modes]) == 2
    assert f"{real_scheduler.IMAGE_MODE}: {reason}" in capsys.readouterr().err


def test_a_patcher_that_never_started_stops_quietly() -> None:
    """An extender that fails to start is the error to report, not the patcher's stop."""
    patcher = real_scheduler.Patcher(cast(ControlPlane, None), real_scheduler.Config(nodes=1))
    patcher.stop()
    assert patcher.rate_per_s == 0.0


def test_a_kept_run_with_the_earlier_scorer_is_rerun_without_it() -> None:
    modes = ("none", "names", real_scheduler.BEFORE_MODE, "null-go-names")
    args = real_scheduler.parse_args(scheduler.arguments(quick=False, modes=modes))
    assert args.modes == ("none", "names", "null-go-names")


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
    assert names["over_null_go_interval"] == {"low": 0.8, "high": 0.964, "coverage": 0.75}
    assert "over_null_go_by_round" not in summary["modes"]["null-go-names"]
    # No extender does less than the Go null extender: its ratios show the machine's noise.
    assert summary["modes"]["none"]["over_null_go_by_round"] == [1.071, 1.0, 1.0]
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
        "0.95x, 0.80x-0.96x; its 75% interval 0.80x-0.96x, across 0.95x: this run does not "
        "resolve the target)"
    ) in section
    assert (
        "no extender ran at least as fast as the Go null extender in every round at 300 nodes"
    ) in section


def _paired_document(
    names: list[float], none: list[float], null: list[float], *, scorer: str = "names"
) -> dict[str, Any]:
    """A run whose rounds have these pods/s (`names`: the `scorer` mode's), summarised as the
    benchmark summarises them."""
    pods_per_s = {"none": none, scorer: names, "null-go-names": null}
    rounds = [
        real_scheduler.Round(mode, index, value, 1.0)
        for mode, values in pods_per_s.items()
        for index, value in enumerate(values)
    ]
    config = real_scheduler.Config(
        nodes=300, pods=100, rounds=len(names), modes=("none", scorer, "null-go-names")
    )
    patcher = cast(
        real_scheduler.Patcher,
        SimpleNamespace(rate_per_s=1.0, errors=0, cpu_s=0.0, started_s=0.0, stopped_s=1.0),
    )
    summary = real_scheduler.summarize(config, rounds, patcher)
    return {
        "machine": "2 logical CPUs",
        "measured_at": "2026-12-06 10:00 UTC",
        "sizes": [summary | {"config": {"nodes": 300, "pods": 100, "rounds": len(names)}}],
    }


@pytest.mark.parametrize(
    ("names", "says"),
    [
        pytest.param(
            [96.0, 97.0, 98.0, 99.0, 100.0, 101.0, 102.0, 103.0, 104.0],
            "its 96% interval 0.97x-1.03x, all at or above 0.95x",
            id="met",
        ),
        pytest.param(
            [86.0, 87.0, 88.0, 89.0, 90.0, 91.0, 92.0, 93.0, 94.0],
            "its 96% interval 0.87x-0.93x, all below 0.95x",
            id="missed",
        ),
        pytest.param(
            [70.0, 80.0, 85.0, 90.0, 95.0, 100.0, 105.0, 110.0, 120.0],
            "its 96% interval 0.80x-1.10x, across 0.95x: this run does not resolve the target",
            id="unresolved",
        ),
    ],
)
def test_the_section_says_whether_the_rounds_resolve_the_floor_target(
    names: list[float], says: str
) -> None:
    """Nine rounds: the second smallest to the second largest ratio hold the true median with
    96 % probability, whatever the noise's shape; the target is resolved only when that
    interval is all on one side of it."""
    document = _paired_document(names, none=[110.0] * 9, null=[100.0] * 9)
    section = real_scheduler.markdown_section(
        document, command="python -m benchmarks.real_scheduler", before=None, plotted=False
    )
    assert says in section


def test_the_image_scorer_is_held_to_the_target_as_the_checkouts_is() -> None:
    rounds = [86.0, 87.0, 88.0, 89.0, 90.0, 91.0, 92.0, 93.0, 94.0]
    document = _paired_document(
        rounds, none=[110.0] * 9, null=[100.0] * 9, scorer=real_scheduler.IMAGE_MODE
    )
    text = real_scheduler.pooled_text(real_scheduler.pooled([document, document]), 2)
    (line,) = [line for line in text.splitlines() if real_scheduler.IMAGE_MODE in line]
    assert "all below 0.95x" in line
    document["sizes"][0]["image"] = "localhost/gpu-live-scheduler:abc"
    section = real_scheduler.markdown_section(
        document, command="python -m benchmarks.real_scheduler", before=None, plotted=False
    )
    assert f"{real_scheduler.IMAGE_MODE} against the Go null extender" in section
    assert "NOT met: >= 0.95x" in section
    # Which image ran, and how it differs from `names`.
    assert "run from the image `localhost/gpu-live-scheduler:abc`" in section


def test_the_section_counts_the_rounds_where_no_extender_was_slower_than_the_null_one() -> None:
    document = _paired_document(
        [100.0, 100.0, 100.0, 100.0], none=[120.0, 90.0, 130.0, 75.0], null=[100.0] * 4
    )
    section = real_scheduler.markdown_section(
        document, command="python -m benchmarks.real_scheduler", before=None, plotted=False
    )
    assert (
        "the machine's noise at 300 nodes: no extender ran slower than the Go null extender in "
        "2 of 4 rounds (down to 0.75x)"
    ) in section


def _summarize_again(summary: dict[str, Any]) -> None:
    """`summary`'s modes made again from its rounds, as edited by the test."""
    rounds = [real_scheduler.Round(**r) for r in summary["rounds"]]
    patcher = cast(
        real_scheduler.Patcher,
        SimpleNamespace(rate_per_s=1.0, errors=0, cpu_s=0.0, started_s=0.0, stopped_s=1.0),
    )
    config = real_scheduler.Config(nodes=300, pods=100, modes=("none", "names", "null-go-names"))
    summary["modes"] = real_scheduler.summarize(config, rounds, patcher)["modes"]


def _set_per_round(summary: dict[str, Any], field: str, by_mode: dict[str, list[Any]]) -> None:
    """Give each round of a mode in `by_mode` its value of `field` (by round index), then make
    the summary's modes again from the rounds."""
    for entry in summary["rounds"]:
        if entry["mode"] in by_mode:
            entry[field] = by_mode[entry["mode"]][entry["round"]]
    _summarize_again(summary)


def test_the_extenders_cpu_per_pod_is_a_column_only_where_it_was_read() -> None:
    document = _paired_document([90.0, 95.0, 100.0], none=[120.0] * 3, null=[100.0] * 3)
    render = real_scheduler.markdown_section
    section = render(document, command="c", before=None, plotted=False)
    assert "extender CPU ms/pod" not in section  # an earlier run's document: no such figure
    summary = document["sizes"][0]  # type: ignore[index]
    cpu_by_mode = {"names": [0.4, 0.6, 0.5], "null-go-names": [0.2, 0.3, 0.1]}
    _set_per_round(summary, "extender_cpu_ms_per_pod", cpu_by_mode)
    assert summary["modes"]["names"]["extender_cpu_ms_per_pod_median"] == pytest.approx(0.5)
    assert summary["modes"]["none"]["extender_cpu_ms_per_pod_median"] is None
    section = render(document, command="c", before=None, plotted=False)
    assert "| extender CPU ms/pod |" in section
    names_row = next(line for line in section.splitlines() if "| names only (" in line)
    assert names_row.rstrip(" |").endswith("0.50")


def test_the_machines_idle_share_and_cpu_per_pod_are_columns_only_where_they_were_read() -> None:
    document = _paired_document([90.0, 95.0, 100.0], none=[120.0] * 3, null=[100.0] * 3)
    render = real_scheduler.markdown_section
    section = render(document, command="c", before=None, plotted=False)
    assert "machine idle" not in section  # an earlier run's document: no such figures
    summary = document["sizes"][0]  # type: ignore[index]
    _set_per_round(
        summary, "machine_idle_share", {"none": [0.1, 0.02, 0.03], "names": [0.01, 0.04, 0.02]}
    )
    _set_per_round(
        summary, "machine_cpu_ms_per_pod", {m: [10.0, 11.0, 12.0] for m in ("none", "names")}
    )
    assert summary["modes"]["none"]["machine_idle_share_median"] == pytest.approx(0.03)
    assert summary["modes"]["names"]["machine_cpu_ms_per_pod_median"] == pytest.approx(11.0)
    assert summary["modes"]["null-go-names"]["machine_idle_share_median"] is None
    section = render(document, command="c", before=None, plotted=False)
    assert "| machine idle | machine CPU ms/pod |" in section
    assert "the cores are saturated" in section
    cells = {
        row[2]: row[-3:-1]  # the last two columns (the line ends with "|")
        for row in ([c.strip() for c in line.split("|")] for line in section.splitlines())
        if len(row) > 3 and row[1] == "300"
    }
    assert cells["names only (`nodeCacheCapable: true`)"] == ["2.0%", "11.00"]
    assert cells["no extender"] == ["3.0%", "11.00"]
    assert cells["names only, null extender in Go"] == ["", ""]  # not read in its rounds


@pytest.mark.parametrize(
    ("stat", "ticks_per_s", "want"),
    [
        # user nice system idle iowait irq softirq steal guest guest_nice: guest is in user.
        pytest.param(
            "cpu  300 10 90 500 20 5 15 30 40 0\ncpu0 1 2 3 4\n", 100, (4.2, 5.2, 0.3), id="ten"
        ),
        pytest.param("cpu  8 0 4 20 0 0 0 0\n", 4, (3.0, 5.0, 0.0), id="eight-fields"),
        # A kernel from before irq, softirq and steal were counted.
        pytest.param("cpu 8 0 4 20 4\n", 4, (3.0, 6.0, 0.0), id="five-fields"),
    ],
)  # fmt: skip
def test_the_machines_cpu_is_read_from_the_first_line_of_proc_stat(
    stat: str, ticks_per_s: int, want: tuple[float, float, float]
) -> None:
    assert tuple(machine_cpu(stat, ticks_per_s)) == pytest.approx(want)


@pytest.mark.parametrize("stat", ["cpu0 1 2 3 4 5 6 7 8\n", "cpu 1 2 3 4\n", ""])
def test_a_proc_stat_without_its_cpu_line_is_a_clear_error(stat: str) -> None:
    with pytest.raises(ValueError, match="not a /proc/stat cpu line"):
        machine_cpu(stat, 100)


def test_this_machines_cpu_grows_as_a_process_spends_it() -> None:
    before = machine_cpu_s()
    if before is None:
        pytest.skip("no /proc/stat here")
    # Busy until the machine's busy time has moved on (it counts in clock ticks, 10 ms where
    # SC_CLK_TCK is 100): a process's CPU must show in the machine's.
    started = time.process_time()
    after = before
    while after.busy_s <= before.busy_s and time.process_time() - started < 2.0:
        after = machine_cpu_s() or before
    assert after.busy_s > before.busy_s
    assert after.steal_s >= before.steal_s


def _pod_event(kind: str, name: str, version: int, node: str = "") -> dict[str, Any]:
    spec = {"nodeName": node} if node else {}
    return {
        "type": kind,
        "object": {"metadata": {"name": name, "resourceVersion": str(version)}, "spec": spec},
    }


def test_binds_are_followed_across_watches_the_server_ends() -> None:
    names = ["p-0", "p-1", "p-2"]
    watches = [
        # Created, one bound, then the server closes the stream.
        [_pod_event("ADDED", n, 10 + i) for i, n in enumerate(names)]
        + [_pod_event("MODIFIED", "p-0", 20, "gpu-1")],
        # The next one ends with a Status: the resource version it names is not a Pod's.
        [
            _pod_event("MODIFIED", "p-1", 21, "gpu-2"),
            {"type": "ERROR", "object": {"kind": "Status", "code": 500}},
        ],
        # The last, with the bind seen before repeated: counted once.
        [_pod_event("MODIFIED", "p-0", 22, "gpu-1"), _pod_event("MODIFIED", "p-2", 23, "gpu-3")],
    ]
    paths: list[str] = []

    def watch(path: str) -> list[dict[str, Any]]:
        paths.append(path)
        return watches[len(paths) - 1]

    bind_times: dict[str, float] = {}
    machine_at: list[MachineCpu | None] = []
    real_scheduler.follow_binds(
        watch,
        "/pods?labelSelector=round%3Dr0",
        "5",
        names,
        deadline_s=time.monotonic() + 60,
        bind_times=bind_times,
        machine_at=machine_at,
    )
    assert [p.split("resourceVersion=")[1].split("&")[0] for p in paths] == ["5", "20", "21"]
    assert list(bind_times) == names
    assert bind_times["p-0"] <= bind_times["p-1"] <= bind_times["p-2"]
    assert len(machine_at) == 2  # at the first bind and at the last


def test_binds_followed_until_the_deadline_leave_the_rest_unbound() -> None:
    calls = [0]

    def watch(path: str) -> list[dict[str, Any]]:
        calls[0] += 1
        return [_pod_event("MODIFIED", "p-0", 7, "gpu-1")] if calls[0] == 1 else []

    bind_times: dict[str, float] = {}
    machine_at: list[MachineCpu | None] = []
    real_scheduler.follow_binds(
        watch,
        "/pods?x=1",
        "1",
        ["p-0", "p-1"],
        deadline_s=time.monotonic() + 1.0,
        bind_times=bind_times,
        machine_at=machine_at,
    )
    assert list(bind_times) == ["p-0"]
    assert len(machine_at) == 1  # no last bind: the round's machine figures are left out
    # Empty watches are retried after a pause (0.05 s), not in a hot loop, until the deadline.
    assert 2 <= calls[0] <= 40


def test_the_machines_share_and_cpu_per_pod_span_the_first_bind_to_the_last() -> None:
    first = MachineCpu(busy_s=100.0, idle_s=50.0, steal_s=1.0)
    last = MachineCpu(busy_s=101.8, idle_s=50.1, steal_s=1.1)
    result = real_scheduler.Round("names", 0, 200.0, 1.0)
    real_scheduler._add_machine(result, [first, last], placed=200)
    # 1.8 s busy, 0.1 s idle and 0.1 s stolen of 2 s: stolen time is neither idle nor a pod's.
    assert result.machine_idle_share == pytest.approx(0.05)
    assert result.machine_cpu_ms_per_pod == pytest.approx(9.0)
    for readings in ([first], [first, None], [None, last]):
        missing = real_scheduler.Round("names", 0, 200.0, 1.0)
        real_scheduler._add_machine(missing, readings, placed=200)
        assert missing.machine_idle_share is None
        assert missing.machine_cpu_ms_per_pod is None


def test_the_wait_on_the_wire_is_a_column_only_where_it_was_captured() -> None:
    document = _paired_document([90.0, 95.0, 100.0], none=[120.0] * 3, null=[100.0] * 3)
    render = real_scheduler.markdown_section
    assert "on the wire" not in render(document, command="c", before=None, plotted=False)
    summary = document["sizes"][0]  # type: ignore[index]
    filter_means = {"names": [1.6, 2.2, 1.7], "null-go-names": [0.5, 0.7, 0.6]}
    for entry in summary["rounds"]:
        if entry["mode"] in filter_means:
            mean_ms = filter_means[entry["mode"]][entry["round"]]
            entry["wire"] = {
                "filter": {"calls": 100, "median_ms": 1.0, "mean_ms": mean_ms, "p90_ms": 3.0},
                "prioritize": {"calls": 100, "median_ms": 0.5, "mean_ms": 0.9, "p90_ms": 2.0},
            }
    _summarize_again(summary)
    assert summary["modes"]["names"]["wire_mean_ms_median"] == {
        "filter": pytest.approx(1.7),
        "prioritize": pytest.approx(0.9),
    }
    assert summary["modes"]["none"]["wire_mean_ms_median"] == {}
    section = render(document, command="c", before=None, plotted=False)
    assert "| on the wire, mean ms (filter / prioritize) |" in section
    rows = {line.split("|")[2].strip(): line for line in section.splitlines() if "| 300 " in line}
    assert rows["names only (`nodeCacheCapable: true`)"].rstrip(" |").endswith("1.70 / 0.90")
    assert rows["names only, null extender in Go"].rstrip(" |").endswith("0.60 / 0.90")


def test_the_scorers_cpu_by_thread_is_a_table_only_where_it_was_read() -> None:
    document = _paired_document([90.0, 95.0, 100.0], none=[120.0] * 3, null=[100.0] * 3)
    render = real_scheduler.markdown_section
    assert "by thread" not in render(document, command="c", before=None, plotted=False)
    summary = document["sizes"][0]  # type: ignore[index]
    request_ms = [1.5, 1.2, 1.4]
    for entry in summary["rounds"]:
        if entry["mode"] == "names":
            entry["thread_cpu_ms_per_pod"] = {
                "request": request_ms[entry["round"]],
                "node-watch": 0.3,
                "pod-watch": 0.25,
                "verdict-expiry": 0.01,
                "gc-pacing": 0.02,
            }
    _summarize_again(summary)
    threads = summary["modes"]["names"]["thread_cpu_ms_per_pod_median"]
    assert threads["request"] == pytest.approx(1.4)
    assert summary["modes"]["null-go-names"]["thread_cpu_ms_per_pod_median"] == {}
    section = render(document, command="c", before=None, plotted=False)
    header = next(line for line in section.splitlines() if "| all threads |" in line)
    assert [c.strip() for c in header.strip("|").split("|")][2:] == [
        "request",
        "node-watch",
        "pod-watch",
        "log-writer",
        "the rest",
        "all threads",
    ]
    (row,) = (
        line
        for line in section.splitlines()
        if line.startswith("| 300")
        and "names only (" in line
        and line.rstrip(" |").endswith("1.98")
    )
    # No log line was written in these rounds; the rest is the expiry timer and the GC pacer.
    assert [c.strip() for c in row.strip("|").split("|")][2:] == [
        "1.40",
        "0.30",
        "0.25",
        "0.00",
        "0.03",
        "1.98",
    ]


def test_the_control_planes_cpu_by_process_is_a_table_only_where_it_was_read() -> None:
    document = _paired_document([90.0, 95.0, 100.0], none=[120.0] * 3, null=[100.0] * 3)
    render = real_scheduler.markdown_section
    assert "by process" not in render(document, command="c", before=None, plotted=False)
    summary = document["sizes"][0]  # type: ignore[index]
    apiserver_ms = {"none": [4.0, 4.4, 4.2], "names": [5.0, 5.6, 5.2], "null-go-names": [4.5] * 3}
    for entry in summary["rounds"]:
        entry["process_cpu_ms_per_pod"] = {
            "etcd": 1.0,
            "kube-apiserver": apiserver_ms[entry["mode"]][entry["round"]],
            "kube-scheduler": 3.0,
        }
        entry["extender_cpu_ms_per_pod"] = {"none": None, "names": 1.5, "null-go-names": 0.5}[
            entry["mode"]
        ]
    _summarize_again(summary)
    medians = summary["modes"]["names"]["process_cpu_ms_per_pod_median"]
    assert medians == {"etcd": 1.0, "kube-apiserver": 5.2, "kube-scheduler": 3.0}
    section = render(document, command="c", before=None, plotted=False)
    lines = section.splitlines()
    header = next(i for i, line in enumerate(lines) if "| kube-apiserver |" in line)
    assert [c.strip() for c in lines[header].strip("|").split("|")] == [
        "nodes",
        "mode",
        "etcd",
        "kube-apiserver",
        "kube-scheduler",
        "extender",
        "together",
    ]
    rows = [[c.strip() for c in line.strip("|").split("|")][2:] for line in lines[header + 2 :]]
    # No extender: its cell is empty, and the sum is the control plane's alone.
    assert rows[:3] == [
        ["1.00", "4.20", "3.00", "", "8.20"],
        ["1.00", "5.20", "3.00", "1.50", "10.70"],
        ["1.00", "4.50", "3.00", "0.50", "9.00"],
    ]


def test_a_process_gone_is_left_out_of_the_cpu_read() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()  # reaped: its pid names no process now
    spent = real_scheduler.processes_cpu_s({"this": os.getpid(), "gone": child.pid})
    assert set(spent) == {"this"}
    assert spent["this"] > 0


def test_a_scorers_cpu_by_thread_is_read_from_its_metrics(tmp_path: Path) -> None:
    served = tmp_path / "metrics"
    served.write_text(
        "# TYPE gpu_scorer_thread_cpu_seconds_total counter\n"
        'gpu_scorer_thread_cpu_seconds_total{thread="request"} 1.25\n'
        'gpu_scorer_thread_cpu_seconds_total{thread="pod-watch"} 0.5\n'
        'gpu_scorer_thread_cpu_seconds_created{thread="request"} 1.7e9\n'
        'gpu_scorer_request_duration_seconds_sum{verb="filter"} 3.0\n'
    )
    scorer = cast(real_scheduler.ScorerProcess, SimpleNamespace(metrics=served.read_text))
    assert real_scheduler.scorer_thread_cpu_s(scorer) == {"request": 1.25, "pod-watch": 0.5}
    served.write_text('gpu_scorer_request_duration_seconds_sum{verb="filter"} 3.0\n')
    assert real_scheduler.scorer_thread_cpu_s(scorer) == {}  # a scorer from before the metric


def test_a_round_is_captured_only_for_a_mode_with_an_extender(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """No extender, no capture; an extender's round gets its calls' summary, and the capture's
    file is removed once read."""
    opened: list[int] = []

    class FakeCapture:
        def __init__(self, port: int, path: Path) -> None:
            opened.append(port)
            self.path = path

        def __enter__(self) -> FakeCapture:
            self.path.write_bytes(b"pcap")
            return self

        def __exit__(self, *exc: object) -> None:
            return None

        def calls(self) -> list[wire_capture.Call]:
            return [wire_capture.Call("filter", 1.0, 1.002)]

    monkeypatch.setattr(wire_capture, "Capture", FakeCapture)
    monkeypatch.setattr(
        real_scheduler,
        "measure",
        lambda plane, mode, index, config, made: real_scheduler.Round(mode, index, 100.0, 1.0),
    )
    extender = cast(real_scheduler.Extender, SimpleNamespace(url="http://127.0.0.1:4321"))
    ready = cast(
        real_scheduler.Bench,
        SimpleNamespace(plane=None, made={"names": extender}, scratch=tmp_path),
    )
    config = real_scheduler.Config(nodes=300, capture=True, modes=("none", "names"))
    assert real_scheduler.measure_round(ready, "none", 0, config).wire == {}
    names = real_scheduler.measure_round(ready, "names", 0, config)
    assert names.wire["filter"]["mean_ms"] == pytest.approx(2.0)
    assert opened == [4321]
    assert list(tmp_path.iterdir()) == []
    uncaptured = dataclasses.replace(config, capture=False)
    assert real_scheduler.measure_round(ready, "names", 1, uncaptured).wire == {}
    assert opened == [4321]


def test_a_first_burst_with_no_extender_warms_up_and_is_not_counted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    patcher = SimpleNamespace(rate_per_s=1.0, errors=0, cpu_s=0.0, started_s=0.0, stopped_s=1.0)
    ready = SimpleNamespace(plane=None, made={}, patcher=patcher, image=None)
    placed: list[tuple[str, int]] = []

    @contextlib.contextmanager
    def bench(config: real_scheduler.Config, **_: Any) -> Iterator[SimpleNamespace]:
        yield ready

    def measure(
        plane: Any, mode: str, round_index: int, config: Any, made: Any
    ) -> real_scheduler.Round:
        placed.append((mode, round_index))
        slow = round_index == real_scheduler.WARM_UP_ROUND
        return real_scheduler.Round(mode, round_index, 10.0 if slow else 100.0, 1.0)

    monkeypatch.setattr(real_scheduler, "bench", bench)
    monkeypatch.setattr(real_scheduler, "measure", measure)
    config = real_scheduler.Config(nodes=300, rounds=2, modes=("none", "names", "null-go-names"))
    summary = real_scheduler.run(config, progress=lambda line: None)
    assert placed[0] == ("none", real_scheduler.WARM_UP_ROUND)
    assert placed[1:] == [
        ("none", 0), ("names", 0), ("null-go-names", 0),
        ("names", 1), ("null-go-names", 1), ("none", 1),
    ]  # fmt: skip
    assert summary["modes"]["none"]["pods_per_s"] == [100.0, 100.0]
    assert all(r["round"] != real_scheduler.WARM_UP_ROUND for r in summary["rounds"])
    assert summary["warm_up_pods_per_s"] == 10.0
    document = {"machine": "m", "measured_at": "t", "sizes": [summary]}
    section = real_scheduler.markdown_section(document, command="c", before=None, plotted=False)
    assert "a burst with no extender that is not counted" in section
    assert "(10 pods/s at 300 nodes)." in section


def test_pooled_runs_pair_each_round_with_the_null_extender_of_its_own_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two runs whose round 0s differ: each round is paired within its run, never across."""
    first = _paired_document([90.0, 95.0, 100.0], none=[120.0] * 3, null=[100.0] * 3)
    second = _paired_document([180.0, 190.0, 200.0], none=[150.0] * 3, null=[200.0] * 3)
    pooled = real_scheduler.pooled([first, second])
    names = pooled[300]["names"]
    assert names["rounds"] == 6
    assert sorted(names["over_null_go_by_round"]) == [0.9, 0.9, 0.95, 0.95, 1.0, 1.0]
    assert names["over_null_go_interval"] == {"low": 0.9, "high": 1.0, "coverage": 0.969}
    assert pooled[300]["none"]["over_null_go_by_round"] == [1.2] * 3 + [0.75] * 3
    paths = []
    for index, document in enumerate((first, second)):
        paths.append(tmp_path / f"run{index}.json")
        paths[-1].write_text(json.dumps(document))
    assert real_scheduler.main(["--pool", *map(str, paths)]) == 0
    text = capsys.readouterr().out
    assert "2 runs pooled" in text
    assert "its 97% interval 0.90x-1.00x, across 0.95x" in text
    assert "no extender ran slower than the Go null extender in 3 of 6 rounds (down to 0.75x)" in (
        text
    )


def test_pooling_a_file_that_is_no_run_is_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"benchmark": "scorer_latency", "rows": []}))
    assert real_scheduler.main(["--pool", str(other)]) == 2
    assert "not a readable `--json` document" in capsys.readouterr().err


@pytest.mark.parametrize("count", range(1, 8))
def test_the_rounds_orders_balance_which_mode_runs_before_which(count: int) -> None:
    modes = [f"m{i}" for i in range(count)]
    rows = [real_scheduler.round_order(modes, index) for index in range(2 * count)]
    cycle = count if count % 2 == 0 else 2 * count  # the design's rows, then again
    assert rows[cycle:] == rows[: 2 * count - cycle]
    assert all(sorted(row) == modes for row in rows)  # every mode once a round
    before = Counter(pair for row in rows[:cycle] for pair in itertools.pairwise(row))
    pairs = list(itertools.permutations(modes, 2))
    assert set(before) == set(pairs)
    assert len(set(before.values())) <= 1  # each ordered pair equally often
    assert real_scheduler.round_order(["none", "names", "null-go-names"], 0)[0] == "none"
