"""The hot-and-cold request path benchmark: one small run, this checkout alone."""

from __future__ import annotations

import argparse

from benchmarks import scorer_cold


def test_a_small_run_times_every_stage_at_every_gap() -> None:
    args = argparse.Namespace(before=None, nodes=150, pairs=30, rounds=1, gaps_ms=[0.0, 1.0])
    result = scorer_cold.run(args)
    assert result["config"]["window_names"] == 100  # kube-scheduler's floor of 100 nodes
    medians = result["us_median"]["this checkout"]
    assert set(medians) == {"0.0", "1.0"}
    for stages in medians.values():
        assert set(stages) == set(scorer_cold.STAGES)
        # A filter and a prioritize take some time; the work after a filter's reply too (its
        # counters, and one in ten nodes rejected: its log line).
        assert all(stages[stage] > 0 for stage in ("filter", "filter_after", "prioritize"))
