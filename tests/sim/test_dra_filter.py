"""The DRA filter benchmark: one small run, both pods measured, the claims held at 30,000."""

from __future__ import annotations

from benchmarks import dra_filter


def test_a_small_run_measures_both_pods_with_the_claims_in_place() -> None:
    row = dra_filter.measure(200, warm=5, samples=10, seed=3)
    assert row["nodes"] == 200
    assert row["window"] == 100  # kube-scheduler's floor of 100 names
    assert row["claims"] == dra_filter.CLAIMS  # each pod's claim made, an older one released
    assert row["plugin_filter_ms"] > 0
    assert row["dra_filter_ms"] > 0
    assert row["ratio"] > 0
