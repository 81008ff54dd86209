"""The write-budget simulation: invariants of the agent's writes across a small fleet."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from datetime import UTC, datetime

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.aggregate import aggregate
from agent.limiter import WritePolicy
from fleet_sim.fleet import ApiStorm, FleetConfig, FleetResult, main, patch_bytes, simulate
from fleet_sim.pods import NodePods
from fleet_sim.traces import Profile, make_fleet, node_reading
from gpu_contract import DEFAULT_KEYS, merge_patch

BASE = FleetConfig(nodes=16, duration_s=1200.0, seed=3)
STORM = ApiStorm(start_s=400.0, end_s=700.0, retry_after_s=30.0)


def _config(**changes: object) -> FleetConfig:
    return replace(BASE, **changes)  # type: ignore[arg-type]


# Several tests read the same two runs; simulate each once per module.
@pytest.fixture(scope="module")
def base() -> FleetResult:
    return simulate(BASE)


@pytest.fixture(scope="module")
def stormy() -> FleetResult:
    return simulate(_config(storms=(STORM,)))


def test_writes_fewer_than_naive(base: FleetResult) -> None:
    assert 0 < base.writes < base.naive_writes
    assert base.bytes_written < base.naive_bytes_written
    assert base.naive_writes == pytest.approx(
        base.config.nodes * base.measured_s / base.config.interval_s, rel=0.02
    )


def test_data_age_bounded_by_heartbeat_plus_interval(base: FleetResult) -> None:
    bound = base.config.policy.heartbeat_s + base.config.interval_s
    ages = base.age_percentiles()
    assert ages["max"] <= bound
    assert 0 < ages["p50"] < ages["p99"] <= ages["max"]
    assert base.ages_api_up_s.size == base.ages_s.size


def test_no_node_writes_twice_within_the_minimum_interval(base: FleetResult) -> None:
    # Bins are one minimum write interval wide: a node can attempt at most once per bin.
    assert base.config.bin_s == base.config.policy.min_write_interval_s
    assert base.bin_attempts.max() <= base.config.nodes


def test_every_write_is_counted_once(base: FleetResult) -> None:
    assert int(base.node_writes.sum()) == base.writes
    assert base.writes_per_s_first(base.config.nodes) == pytest.approx(base.writes_per_s)
    assert sum(base.reasons.values()) == base.naive_writes
    assert base.extender_calls_per_s(50) == pytest.approx(base.writes_per_s * 50)
    assert base.naive_extender_calls_per_s(50) == pytest.approx(base.naive_writes_per_s * 50)


def test_same_seed_same_result() -> None:
    config = _config(nodes=6, duration_s=600.0, mix={Profile.INFERENCE: 1.0})
    first = simulate(config).summary()
    assert simulate(config).summary() == first


def test_idle_fleet_writes_about_one_heartbeat_per_minute() -> None:
    result = simulate(_config(nodes=8, duration_s=1200.0, mix={Profile.IDLE: 1.0}))
    heartbeat_ratio = result.config.interval_s / result.config.policy.heartbeat_s
    assert heartbeat_ratio * 0.9 <= result.write_ratio <= heartbeat_ratio * 1.6
    assert result.reasons["heartbeat-due"] > result.reasons["deadband-exceeded"]


def test_storm_backs_off_instead_of_piling_up(stormy: FleetResult) -> None:
    cfg = stormy.config
    starts = stormy.bin_starts_s
    during = (starts >= STORM.start_s) & (starts < STORM.end_s)
    assert stormy.bin_successes[during].sum() == 0
    storm_s = STORM.end_s - STORM.start_s
    # Each node tries at most once per Retry-After (the first try may fall anywhere).
    attempts = int(stormy.bin_attempts[during].sum())
    assert attempts <= cfg.nodes * (storm_s / STORM.retry_after_s + 1)
    assert attempts < int(stormy.bin_naive_attempts[during].sum()) / 5
    # No backlog: right after the storm no bin holds more than one write per node.
    after = (starts >= STORM.end_s) & (starts < STORM.end_s + 300.0)
    assert stormy.bin_successes[after].max() <= cfg.nodes
    assert stormy.failed_attempts > 0
    assert stormy.naive_failed_attempts > stormy.failed_attempts


def test_storm_recovers_within_the_longest_backoff(stormy: FleetResult) -> None:
    cfg = stormy.config
    bound = cfg.policy.heartbeat_s + cfg.interval_s
    settled = stormy.bin_starts_s >= STORM.end_s + cfg.policy.backoff_max_s + cfg.interval_s
    ages = stormy.bin_max_age_s[settled]
    assert np.nanmax(ages) <= bound + cfg.bin_s
    # While the API refuses writes, data ages past the bound, as it must.
    assert stormy.age_percentiles(api_up_only=False)["max"] > bound
    # Outside the storm's shadow the bound holds for every read.
    assert stormy.age_percentiles()["max"] <= bound


def test_wider_deadbands_write_less() -> None:
    narrow = simulate(_config(nodes=8, duration_s=900.0, mix={Profile.INFERENCE: 1.0}))
    wide = simulate(
        _config(
            nodes=8,
            duration_s=900.0,
            mix={Profile.INFERENCE: 1.0},
            policy=WritePolicy(utilization_deadband=0.2, temperature_deadband_c=10.0),
        )
    )
    assert wide.writes < narrow.writes


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        pytest.param({"nodes": 0}, "nodes", id="no-nodes"),
        pytest.param({"duration_s": 60.0}, "warmup", id="shorter-than-warmup"),
        pytest.param({"interval_s": 0.0}, "interval_s", id="zero-interval"),
    ],
)
def test_config_rejects_bad_values(changes: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        _config(**changes)


def test_specs_must_match_node_count() -> None:
    with pytest.raises(ValueError, match="node specs"):
        simulate(_config(nodes=3), specs=make_fleet(2, seed=1))


def test_patch_bytes_is_the_compact_merge_patch() -> None:
    annotations = {DEFAULT_KEYS.prefix + "utilization": "0.50"}
    body = json.dumps(merge_patch(annotations, DEFAULT_KEYS), separators=(",", ":"))
    assert patch_bytes(annotations) == len(body.encode())


def test_command_line_prints_a_summary(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["--nodes", "3", "--duration-s", "300", "--storm", "150:200:30"])
    assert code == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["nodes"] == 3
    assert summary["failed_attempts"] > 0
    assert not math.isnan(summary["write_ratio"])


def test_command_line_rejects_a_bad_storm() -> None:
    with pytest.raises(SystemExit):
        main(["--nodes", "3", "--duration-s", "300", "--storm", "soon"])


@settings(max_examples=8, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    profile=st.sampled_from(list(Profile)),
)
def test_any_seed_and_profile_keep_the_write_invariants(seed: int, profile: Profile) -> None:
    result = simulate(
        FleetConfig(nodes=3, duration_s=400.0, seed=seed, mix={profile: 1.0}, warmup_s=60.0)
    )
    bound = result.config.policy.heartbeat_s + result.config.interval_s
    assert result.writes <= result.naive_writes
    assert result.age_percentiles()["max"] <= bound
    assert result.bin_attempts.max() <= result.config.nodes


@pytest.mark.parametrize(
    ("profile", "shared"),
    [
        pytest.param(Profile.TRAINING, False, id="training-one-pod-whole-gpus"),
        pytest.param(Profile.DIURNAL, False, id="diurnal-a-pod-per-gpu"),
        pytest.param(Profile.INFERENCE, True, id="inference-time-sliced"),
        pytest.param(Profile.BATCH, False, id="batch-a-pod-per-run"),
    ],
)
def test_pods_hold_gpus_and_their_figures_are_attributed(profile: Profile, shared: bool) -> None:
    """Each profile's pods reach the published state through the agent's own attribution."""
    spec = make_fleet(1, seed=5, mix={profile: 1.0})[0]
    uuids = [f"GPU-{g}" for g in range(spec.gpu_count)]
    pods = NodePods(spec, node=0, uuids=uuids, ticks=3, seed=5)
    allocated = [True] * spec.gpu_count
    allocations, processes, owners = pods.at(
        1, allocated=allocated, utilization=[0.8] * 8, memory_used_mib=[40_000] * 8
    )
    reading = node_reading(
        spec,
        uuids=uuids,
        sampled_at=datetime(2026, 1, 5, tzinfo=UTC),
        utilization=[0.8] * 8,
        memory_used_mib=[40_000] * 8,
        temperature_c=[50] * 8,
        allocations=allocations,
        processes=processes,
        process_owners=owners,
    )
    state = aggregate(reading)
    assert all(g.allocated for g in state.gpus)
    held = {share.gpu_index for pod in state.pods for share in pod.gpus}
    assert held == set(range(spec.gpu_count))
    per_gpu_util: dict[int, float] = {}
    for pod in state.pods:
        for share in pod.gpus:
            assert share.utilization is not None
            assert share.memory_used_mib is not None
            per_gpu_util[share.gpu_index] = (
                per_gpu_util.get(share.gpu_index, 0.0) + share.utilization
            )
    # Whole GPUs give the GPU's figure; time-sliced pods' shares add up to it.
    assert all(u == pytest.approx(0.8) for u in per_gpu_util.values())
    # Time-sliced GPUs have several holders; whole GPUs one (training: one pod for all).
    assert (len(state.pods) > spec.gpu_count) is shared


def test_pod_figures_are_in_the_written_bodies() -> None:
    with_pods = simulate(_config(mix={Profile.INFERENCE: 1.0}, nodes=4))
    without = simulate(_config(mix={Profile.INFERENCE: 1.0}, nodes=4, pods=False))
    assert with_pods.bytes_written > without.bytes_written
    assert with_pods.config.pods
    assert with_pods.summary()["pods"] is True
