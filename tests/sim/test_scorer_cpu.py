"""The scorer CPU benchmark: one small run of this checkout against an export of HEAD."""

from __future__ import annotations

import argparse
import shutil
import subprocess

import pytest

from benchmarks import scorer_cpu


@pytest.mark.skipif(shutil.which("git") is None, reason="the --before tree is a git export")
def test_a_small_run_measures_both_trees_with_rejections_logged() -> None:
    probe = subprocess.run(
        ["git", "-C", str(scorer_cpu.ROOT), "rev-parse", "HEAD"], capture_output=True, check=False
    )
    if probe.returncode != 0:
        pytest.skip("not a git checkout")
    args = argparse.Namespace(
        before="HEAD", nodes=200, percentage=0, pairs=40, rounds=2, log_level="info", cool_mib=1
    )
    result = scorer_cpu.run(args)
    assert set(result["cpu_us_per_pair"]) == {"before (HEAD)", "this checkout"}
    for values in result["cpu_us_per_pair"].values():
        assert len(values) == 2
        assert all(v > 0 for v in values)  # a filter and a prioritize cost some CPU
    assert result["ratio_to_before"] > 0
    assert result["config"]["log_level"] == "info"
    assert result["config"]["cool_mib"] == 1
