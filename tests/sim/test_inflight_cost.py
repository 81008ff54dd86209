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
    args = argparse.Namespace(before="HEAD", nodes=60, pods=40, keep=20, classes=classes, rounds=1)
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
