"""The simulated GPU traces: seeded, physically plausible, and each profile shaped as described."""

from __future__ import annotations

from datetime import UTC, datetime

import numpy as np
import pytest

from agent.aggregate import aggregate
from fleet_sim.traces import (
    A100_80GB,
    T4_16GB,
    NodeSpec,
    Profile,
    generate,
    make_fleet,
    node_reading,
)
from gpu_contract import Health

T0 = datetime(2026, 1, 5, tzinfo=UTC)


def _fleet_of(profile: Profile, count: int = 6, gpus: int = 4) -> list[NodeSpec]:
    return [NodeSpec(f"n{i}", A100_80GB, gpus, profile, 30.0) for i in range(count)]


def test_same_seed_same_traces() -> None:
    specs = make_fleet(20, seed=3)
    a = generate(specs, ticks=60, interval_s=5.0, seed=9)
    b = generate(make_fleet(20, seed=3), ticks=60, interval_s=5.0, seed=9)
    assert specs == make_fleet(20, seed=3)
    np.testing.assert_array_equal(a.utilization, b.utilization)
    np.testing.assert_array_equal(a.memory_used_mib, b.memory_used_mib)
    np.testing.assert_array_equal(a.temperature_c, b.temperature_c)


def test_other_seed_other_traces() -> None:
    specs = make_fleet(20, seed=3)
    a = generate(specs, ticks=60, interval_s=5.0, seed=9)
    b = generate(specs, ticks=60, interval_s=5.0, seed=10)
    assert not np.array_equal(a.utilization, b.utilization)


def test_values_stay_physical() -> None:
    specs = make_fleet(60, seed=1)
    traces = generate(specs, ticks=240, interval_s=5.0, seed=2)
    assert traces.utilization.min() >= 0.0
    assert traces.utilization.max() <= 1.0
    totals = np.array([s.model.memory_total_mib for s in specs]).reshape(1, -1, 1)
    assert (traces.memory_used_mib >= 0).all()
    assert (traces.memory_used_mib <= totals).all()
    ambient = np.array([s.ambient_c for s in specs]).reshape(1, -1, 1)
    # Within the chassis spread below ambient, never more than full load above it.
    assert (traces.temperature_c >= ambient - 3).all()
    assert (traces.temperature_c <= ambient + 48).all()


@pytest.mark.parametrize(
    ("profile", "low", "high"),
    [
        pytest.param(Profile.TRAINING, 0.80, 0.99, id="training-steady-high"),
        pytest.param(Profile.IDLE, 0.0, 0.02, id="idle-near-zero"),
        pytest.param(Profile.INFERENCE, 0.15, 0.70, id="inference-moderate"),
    ],
)
def test_profile_mean_utilization(profile: Profile, low: float, high: float) -> None:
    traces = generate(_fleet_of(profile), ticks=720, interval_s=5.0, seed=4)
    assert low <= float(traces.utilization.mean()) <= high


def test_batch_jobs_start_and_end() -> None:
    traces = generate(_fleet_of(Profile.BATCH, count=8), ticks=1440, interval_s=5.0, seed=5)
    busy = traces.utilization.max(axis=2) > 0.3
    # Every node has both running and idle stretches over two hours, and switches between them.
    switches = np.abs(np.diff(busy.astype(int), axis=0)).sum(axis=0)
    assert busy.any(axis=0).sum() >= 6
    assert (~busy).any(axis=0).sum() >= 6
    assert switches.sum() >= 8


def test_diurnal_swings_over_a_day() -> None:
    traces = generate(_fleet_of(Profile.DIURNAL, count=4), ticks=144, interval_s=600.0, seed=6)
    per_node = traces.utilization.mean(axis=2)
    swing = per_node.max(axis=0) - per_node.min(axis=0)
    assert (swing > 0.5).all()


def test_temperature_follows_load_with_lag() -> None:
    traces = generate(_fleet_of(Profile.TRAINING, count=4), ticks=720, interval_s=5.0, seed=7)
    util = traces.utilization[:, :, 0]
    temp = traces.temperature_c[:, :, 0].astype(float)
    # Hot when busy, cooler in checkpoint dips, and never a jump of tens of degrees per sample.
    assert np.corrcoef(util.ravel(), temp.ravel())[0, 1] > 0.3
    assert np.abs(np.diff(temp, axis=0)).max() <= 0.1 * 45 + 2


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        pytest.param({"node_count": -1}, "node_count", id="negative-count"),
        pytest.param({"node_count": 3, "gpus_per_node": 0}, "gpus_per_node", id="zero-gpus"),
        pytest.param({"node_count": 3, "mix": {Profile.IDLE: 0.0}}, "mix", id="empty-mix"),
    ],
)
def test_make_fleet_rejects_bad_input(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make_fleet(seed=1, **kwargs)  # type: ignore[arg-type]


def test_make_fleet_follows_mix() -> None:
    only_idle = make_fleet(30, seed=2, mix={Profile.IDLE: 1.0})
    assert {s.profile for s in only_idle} == {Profile.IDLE}


@pytest.mark.parametrize(
    ("ticks", "interval_s", "message"),
    [
        pytest.param(0, 5.0, "ticks", id="no-ticks"),
        pytest.param(10, 0.0, "interval_s", id="zero-interval"),
    ],
)
def test_generate_rejects_bad_input(ticks: int, interval_s: float, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        generate(_fleet_of(Profile.IDLE), ticks=ticks, interval_s=interval_s, seed=1)


def test_generate_rejects_mixed_gpu_counts() -> None:
    specs = [
        NodeSpec("a", A100_80GB, 8, Profile.IDLE, 30.0),
        NodeSpec("b", T4_16GB, 4, Profile.IDLE, 30.0),
    ]
    with pytest.raises(ValueError, match="gpu_count"):
        generate(specs, ticks=5, interval_s=5.0, seed=1)


def test_node_reading_feeds_the_real_aggregation() -> None:
    spec = NodeSpec("n0", T4_16GB, 2, Profile.INFERENCE, 30.0)
    reading = node_reading(
        spec,
        uuids=["GPU-a", "GPU-b"],
        sampled_at=T0,
        utilization=[0.25, 0.75],
        memory_used_mib=[1000, 15000],
        temperature_c=[40, 70],
    )
    assert [g.memory_free_mib for g in reading.gpus] == [14360, 360]
    state = aggregate(reading)
    assert state.health is Health.OK
    assert state.utilization == pytest.approx(0.5)
    assert state.temperature_c == 70
    assert state.gpu_count == 2
    assert state.memory_largest_free_mib == 14360
