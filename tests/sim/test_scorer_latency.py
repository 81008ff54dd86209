"""The scorer latency benchmark: its arithmetic, its churn, and one small run of its live path."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from benchmarks import scorer_latency
from benchmarks.kube_requests import nodes_to_find
from benchmarks.scorer_latency import (
    CHILD,
    NULLS,
    ON_THIS_INTERPRETER,
    ROOT,
    Runner,
    churn_pool,
    measure,
    meeting,
    targets,
)
from loopback_cluster import image
from tests.deploy.image_support import require_image
from tests.e2e.support import require_control_plane


def test_a_request_meets_the_events_whose_intervals_overlap_its_round_trip() -> None:
    events = [(1.0, 1.1), (2.0, 2.5), (3.0, 3.2)]
    requests = [
        (0.5, 0.9),  # before the first event
        (1.05, 1.2),  # starts while one is applied
        (1.9, 2.1),  # one starts during it
        (2.6, 2.9),  # between two
        (2.1, 2.2),  # inside one
        (3.3, 4.0),  # after the last
    ]
    assert meeting(requests, events) == [False, True, True, False, True, False]
    assert meeting(requests, []) == [False] * len(requests)


def test_every_churn_write_is_a_later_version_of_its_node() -> None:
    pool = churn_pool(20, 60, seed=1, per_gpu=False)
    last: dict[int, int] = {}
    seen: dict[int, str] = {}
    for entry in pool:
        i, rewrite, node = entry["i"], entry["rewrite"], entry["node"]
        assert node["metadata"]["name"] == f"gpu-node-{i:05d}"
        assert rewrite == last.get(i, 0) + 1
        # An identical write would be a no-op at the API server: no watch event.
        annotations = json.dumps(node["metadata"]["annotations"], sort_keys=True)
        assert annotations != seen.get(i)
        last[i], seen[i] = rewrite, annotations
    assert len(last) > 10  # spread over the nodes, not one node rewritten


def test_targets_are_the_medians_during_churn_and_the_floor_ratio() -> None:
    def names(nodes: int, ms: float) -> dict[str, object]:
        row = {
            "mode": "names",
            "nodes": nodes,
            "window_names": nodes_to_find(nodes),
            "events_per_s_target": 100.0,
        }
        return row | {"after_filter": {"median_ms": ms}}

    rows = [
        names(500, 0.29),
        names(5000, 1.6),
        {"mode": "full", "nodes": 500, "after_filter_over_floor": 1.4},
    ]
    checks = targets(rows)
    assert [(c["limit"], c["met"]) for c in checks] == [(0.3, True), (1.5, False), (1.5, True)]
    assert "during churn (100 node events/s)" in checks[0]["target"]
    assert "5,000 nodes (500-name windows" in checks[1]["target"]


def _small_names_row(
    scratch: Path, runner: Runner = ON_THIS_INTERPRETER, go_null: Path | None = None
) -> dict[str, Any]:
    """Small and short, but the whole path: the stand-in's writes reach the scorer's node cache
    through its own LIST + WATCH while 12 pods' requests are timed, at 60 nodes."""
    return measure(
        "names",
        60,
        12,
        trees={"after": ROOT},
        scratch=scratch,
        events_per_s=400.0,
        quick=True,
        runner=runner,
        go_null=go_null,
    )


def test_a_names_only_row_measures_requests_while_watch_events_arrive(tmp_path: Path) -> None:
    row = _small_names_row(tmp_path)
    assert row["after_events_per_s"] > 50
    assert row["churn_written_per_s"] > 50
    assert 0 <= row["after_requests_meeting_events"] <= 1
    for key in ("after_filter", "after_prioritize", "after_filter_handler"):
        assert row[key]["n"] == 12
    assert row["after_quiet"]["n"] == 5
    # The floor decoded every sample's body as a verdict reads it (a body it cannot decode
    # would end its connection, and the sample with it).
    assert row["floor"]["n"] == 12
    assert row["after_quiet_events"] == 0  # quiet: no churn
    assert row["after_event_us"] > 0
    assert row["classes_event_us"]["after"] > 0
    # Below 100 nodes kube-scheduler sends every node; one fresh pod for priming, for each of
    # the quiet phase's untimed and timed pods, and for each sample.
    assert row["window_names"] == row["window_names_median"] == 60
    assert row["pods_sent"] == 1 + 5 + 5 + 12


def test_the_null_extenders_answer_every_sample_beside_the_scorer(tmp_path: Path) -> None:
    """`--nulls`: the compiled Go extender that decides nothing (built with the control plane)
    and the Python one on the scorer's edge get every timed sample's filter and prioritize,
    the same bytes the scorer gets (a request either cannot read fails the run)."""
    require_control_plane()
    row = _small_names_row(tmp_path, go_null=scorer_latency.go_null_binary())
    assert set(row["nulls"]) == set(NULLS)
    for label in NULLS:
        for verb in ("filter", "prioritize"):
            assert row["nulls"][label][verb]["n"] == 12
    assert row["after_filter"]["n"] == row["floor"]["n"] == 12


def test_a_go_null_extender_that_names_no_address_is_an_error(tmp_path: Path) -> None:
    script = tmp_path / "null-extender"
    script.write_text("#!/bin/sh\necho 'null-extender: bind: address in use' >&2\nexit 1\n")
    script.chmod(0o755)
    with pytest.raises(RuntimeError, match="null_go did not start: null-extender: bind"):
        scorer_latency._start_go_null(script)


def test_nulls_without_the_control_plane_stop_before_any_server(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    reason = "control plane not built: run `python3 dev.py cluster build`"
    monkeypatch.setattr(scorer_latency, "missing_binaries_reason", lambda: reason)

    def no_measure(*args: Any, **kwargs: Any) -> dict[str, Any]:
        raise AssertionError("a server was started")

    monkeypatch.setattr(scorer_latency, "measure", no_measure)
    assert scorer_latency.main(["--nulls", "--only", "names:500"]) == 2
    assert f"--nulls: {reason}" in capsys.readouterr().err


def test_a_server_runs_on_this_interpreter_or_from_the_image(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    assert Runner().command(["nothing", "--port", "1"]) == [
        sys.executable,
        str(CHILD),
        "nothing",
        "--port",
        "1",
    ]
    monkeypatch.setattr(image, "image_env", lambda name: {"PYTHONOPTIMIZE": "2"})
    mounted = image.MountedImage("localhost/gpu-live-scheduler:abc", tmp_path / "rootfs")
    before, scratch = tmp_path / "before", tmp_path / "scratch"
    argv = Runner(mounted, (ROOT, before), scratch).command(["nothing", "--port", "1"])
    # The image's interpreter (on its PATH) runs this checkout's script, with its environment.
    assert argv[-5:] == ["python", str(CHILD), "nothing", "--port", "1"]
    assert "PYTHONOPTIMIZE=2" in argv
    setup = argv[: argv.index("--", argv.index("container-setup"))]
    # The trees read-only and the scratch folder writable, each at its own path.
    for tree in (ROOT, before):
        assert setup[setup.index(str(tree)) + 1] == str(mounted.rootfs) + str(tree)
    assert setup[setup.index(f"rw:{scratch}") + 1] == str(mounted.rootfs) + str(scratch)


def test_a_run_from_the_image_without_one_stops_before_any_server(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    reason = "no image built: run `python3 dev.py image`"
    monkeypatch.setattr(image, "current", lambda: (None, reason))

    def no_measure(*args: Any, **kwargs: Any) -> dict[str, Any]:
        raise AssertionError("a server was started")

    monkeypatch.setattr(scorer_latency, "measure", no_measure)
    assert scorer_latency.main(["--image", "--only", "names:500"]) == 2
    assert f"--image: {reason}" in capsys.readouterr().err


def test_the_servers_run_from_the_image(tmp_path: Path) -> None:
    """The whole path from the image: its interpreter serves, reads the stand-in's kubeconfig
    and writes its log in the scratch folder (skipped without the image locally, as the image's
    own tests are; CI builds it)."""
    require_image()
    with image.mounted_current() as mounted:
        row = _small_names_row(tmp_path, Runner(mounted, (ROOT,), tmp_path))
    for key in ("after_filter", "after_prioritize", "floor"):
        assert row[key]["n"] == 12
    assert row["after_events_per_s"] > 50
    assert scorer_latency.log_lines(tmp_path, ["after"], "names", 60)["after"] > 0
