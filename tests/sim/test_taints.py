"""The fleet's DRA taint writes: the write bounds hold on real traces; looser rules cost more."""

from __future__ import annotations

from agent.dra import TaintPolicy
from fleet_sim.taints import _max_in_window, simulate_taints
from fleet_sim.traces import Profile, make_fleet


def test_at_most_one_taint_write_per_gpu_per_minute_on_a_mixed_fleet() -> None:
    run = simulate_taints(nodes=20, duration_s=1800.0, seed=3)
    assert run.max_writes_per_gpu_per_minute == 1
    assert run.writes > 0
    assert set(run.by_reason) <= {"taint", "untaint", "change"}
    assert run.writes_per_node_per_minute == run.writes / 20 / ((1800.0 - 120.0) / 60.0)


def test_idle_nodes_never_write_and_training_nodes_stay_tainted() -> None:
    idle = make_fleet(4, seed=1, mix={Profile.IDLE: 1.0})
    assert simulate_taints(nodes=4, duration_s=900.0, specs=idle).writes == 0
    training = make_fleet(4, seed=1, mix={Profile.TRAINING: 1.0})
    run = simulate_taints(nodes=4, duration_s=900.0, specs=training)
    assert run.gpus_ever_tainted > 0
    assert run.tainted_fraction > 0.5


def test_no_margin_and_no_interval_writes_more() -> None:
    loose = TaintPolicy(
        utilization_margin=0.0,
        temperature_margin_c=0,
        min_write_interval_s=5.0,
        max_writes_per_hour=3600,
    )
    tight = simulate_taints(nodes=10, duration_s=1800.0, seed=5)
    assert simulate_taints(nodes=10, duration_s=1800.0, seed=5, policy=loose).writes > tight.writes


def test_max_in_window() -> None:
    assert _max_in_window([], 60.0) == 0
    assert _max_in_window([0.0, 59.0, 60.0, 200.0], 60.0) == 2
    assert _max_in_window([0.0, 60.0, 120.0], 60.0) == 1
