"""The in-flight accounting cost benchmark: one small run of this checkout against an export of
HEAD, with the mix of pod classes and with one class."""

from __future__ import annotations

import argparse
import shutil
import subprocess

import pytest

from benchmarks import inflight_cost


@pytest.mark.skipif(shutil.which("git") is None, reason="the --before tree is a git export")
@pytest.mark.parametrize("classes", ["mix", "one"])
def test_a_small_run_times_every_step_of_both_trees(classes: str) -> None:
    probe = subprocess.run(
        ["git", "-C", str(inflight_cost.ROOT), "rev-parse", "HEAD"],
        capture_output=True,
        check=False,
    )
    if probe.returncode != 0:
        pytest.skip("not a git checkout")
    args = argparse.Namespace(
        before="HEAD", nodes=60, pods=40, keep=20, classes=classes, rounds=1, pause_ms="0"
    )
    result = inflight_cost.run(args)
    assert set(result["trees"]) == {"before (HEAD)", "this checkout"}
    for tree in result["trees"].values():
        assert set(tree["median_us"]) == set(inflight_cost.STEPS)
        assert all(us > 0 for us in tree["median_us"].values())
        assert tree["cpu_us_per_pod"] > 0
        # Every bind was applied and every pod beyond `keep` deleted: the watch's record.
        assert tree["bound_at_end"] == 20
        if classes == "one":
            assert tree["pod_classes"] == 1
        else:
            assert tree["pod_classes"] > 1


def test_pauses_take_turns_pod_by_pod_and_each_has_its_own_medians() -> None:
    args = argparse.Namespace(
        before=None, nodes=40, pods=30, keep=10, classes="one", rounds=1, pause_ms="0,2"
    )
    result = inflight_cost.run(args)
    (tree,) = result["trees"].values()
    assert set(tree["by_pause_ms"]) == {"0", "2"}
    for steps in tree["by_pause_ms"].values():
        assert set(steps) == {*inflight_cost.STEPS, "reference"}
        assert all(us > 0 for us in steps.values())
    # The first pause's medians are the tree's own.
    assert {step: tree["by_pause_ms"]["0"][step] for step in inflight_cost.STEPS} == tree[
        "median_us"
    ]
    assert tree["bound_at_end"] == 10


@pytest.mark.parametrize("pauses", ["10,10", "-1", "ten"])
def test_pauses_that_are_not_distinct_milliseconds_are_refused(pauses: str) -> None:
    with pytest.raises(SystemExit) as refused:
        inflight_cost.main([f"--pause-ms={pauses}"])
    assert refused.value.code == 2
