"""The scorer CPU benchmark: one small run of this checkout against an export of HEAD."""

from __future__ import annotations

import argparse
import shutil
import subprocess

import pytest

from benchmarks import scorer_cpu
from benchmarks.kube_requests import Rotation


@pytest.mark.skipif(shutil.which("git") is None, reason="the --before tree is a git export")
def test_a_small_run_measures_both_trees_with_rejections_logged() -> None:
    probe = subprocess.run(
        ["git", "-C", str(scorer_cpu.ROOT), "rev-parse", "HEAD"], capture_output=True, check=False
    )
    if probe.returncode != 0:
        pytest.skip("not a git checkout")
    args = argparse.Namespace(
        before="HEAD",
        nodes=200,
        percentage=0,
        pairs=40,
        rounds=2,
        log_level="info",
        cool_mib=1,
        fresh_lists=True,
    )
    result = scorer_cpu.run(args)
    assert set(result["cpu_us_per_pair"]) == {"before (HEAD)", "this checkout"}
    for values in result["cpu_us_per_pair"].values():
        assert len(values) == 2
        assert all(v > 0 for v in values)  # a filter and a prioritize cost some CPU
    assert result["ratio_to_before"] > 0
    assert result["config"]["log_level"] == "info"
    assert result["config"]["cool_mib"] == 1
    assert result["config"]["fresh_lists"] is True


def test_fresh_lists_send_each_window_in_an_order_not_sent_before() -> None:
    rotation = Rotation([f"node-{i:03d}" for i in range(200)])
    kept = [rotation.window() for _ in range(200)]
    assert kept[0] == kept[2]  # 100-name windows: each back every second pod, as it was
    fresh = scorer_cpu.FreshOrders(seed=1)
    sent = [fresh(window) for window in kept]
    assert len({tuple(window) for window in sent}) == len(sent)  # 100 rotations of each
    assert all(set(s) == set(k) for s, k in zip(sent, kept, strict=True))
    assert sent[0] != kept[0] or sent[2] != kept[2]
