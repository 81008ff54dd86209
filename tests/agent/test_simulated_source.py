"""The simulated source: deterministic in (seed, time), realistic in shape and bounds."""

from __future__ import annotations

import itertools
import statistics
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.aggregate import aggregate
from agent.simulated import SimulatedSource, memory_total_mib_for
from agent.sources import open_source
from gpu_contract.schema import Health

START = datetime(2026, 11, 30, 12, 0, 0, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return START + timedelta(seconds=seconds)


def sim(**kwargs: object) -> SimulatedSource:
    kwargs.setdefault("start", START)
    return SimulatedSource(**kwargs)  # type: ignore[arg-type]


def test_same_seed_and_times_give_the_same_readings_in_any_order() -> None:
    times = [at(s) for s in range(0, 3600, 37)]
    forward = [sim(seed=7).read(t) for t in times]
    one = sim(seed=7)
    backward = [one.read(t) for t in reversed(times)][::-1]
    assert forward == backward
    assert [sim(seed=7).read(t) for t in times[:5]] == forward[:5]


def test_different_seeds_differ() -> None:
    times = [at(s) for s in range(0, 600, 5)]
    a = [sim(seed=1).read(t).gpus for t in times]
    b = [sim(seed=2).read(t).gpus for t in times]
    assert a != b


def test_start_defaults_to_the_first_read() -> None:
    anchored = SimulatedSource(seed=3)
    first = anchored.read(at(500))
    assert anchored.start == at(500)
    assert first.gpus == sim(seed=3, start=at(500)).read(at(500)).gpus


@given(seed=st.integers(min_value=0, max_value=2**32), offset_s=st.floats(0, 86_400 * 30))
@settings(max_examples=50, deadline=None)
def test_readings_stay_in_physical_bounds(seed: int, offset_s: float) -> None:
    source = sim(gpus=4, seed=seed)
    reading = source.read(at(offset_s))
    assert reading.device_count == 4
    assert len({g.uuid for g in reading.gpus}) == 4
    for g in reading.gpus:
        assert g.utilization is not None
        assert 0.0 <= g.utilization <= 1.0
        assert g.memory_total_mib == 81920
        assert g.memory_free_mib is not None
        assert 0 <= g.memory_free_mib < g.memory_total_mib
        # No MIG in the simulation: one pod may have all of a GPU's free memory.
        assert g.mig_enabled is False
        assert g.memory_largest_allocation_mib == g.memory_free_mib
        assert g.temperature_c is not None
        assert 30 <= g.temperature_c <= 80
        assert g.name == "NVIDIA A100-SXM4-80GB"
        assert g.problems == ()
    assert aggregate(reading).health is Health.OK


def test_trace_has_bursts_idle_stretches_and_memory_churn() -> None:
    source = sim(gpus=8, seed=11)
    readings = [source.read(at(s)) for s in range(0, 4 * 3600, 10)]
    utilizations = [g.utilization or 0.0 for r in readings for g in r.gpus]
    idle = sum(u < 0.05 for u in utilizations) / len(utilizations)
    busy = sum(u > 0.6 for u in utilizations) / len(utilizations)
    assert 0.15 < idle < 0.8, idle
    assert 0.1 < busy < 0.7, busy
    # Memory is allocated and freed in whole-GiB job chunks.
    free_values = {g.memory_free_mib for r in readings for g in r.gpus}
    assert len(free_values) > 10
    first_gpu_free = [r.gpus[0].memory_free_mib or 0 for r in readings]
    # Below full, every change is a whole number of GiB (a job arriving or leaving).
    changes = [b - a for a, b in itertools.pairwise(first_gpu_free) if a != b and a and b]
    assert changes
    assert all(abs(c) % 1024 == 0 for c in changes)
    assert any(c > 0 for c in changes)
    assert any(c < 0 for c in changes)


def test_temperature_lags_load() -> None:
    source = sim(gpus=1, seed=5)
    readings = [source.read(at(s)) for s in range(0, 4 * 3600, 5)]
    temperatures = [r.gpus[0].temperature_c or 0 for r in readings]
    utilizations = [r.gpus[0].utilization or 0.0 for r in readings]
    # Smooth: a 5 s step moves the temperature by at most a few degrees (time constant 60 s).
    steps = [abs(b - a) for a, b in itertools.pairwise(temperatures)]
    assert max(steps) <= 5
    # Warms with load: temperature correlates with the load of the preceding minute.
    lagged = [statistics.fmean(utilizations[max(0, i - 12) : i + 1]) for i in range(len(readings))]
    assert statistics.correlation(lagged, [float(t) for t in temperatures]) > 0.7


def test_set_load_pushes_utilization_memory_and_heat() -> None:
    base = sim(gpus=2, seed=9)
    loaded = sim(gpus=2, seed=9)
    loaded.set_load(0.5, 30_000, now=at(100))
    before = loaded.read(at(99))
    assert before == base.read(at(99))
    plain = base.read(at(400))
    pushed = loaded.read(at(400))
    for p, q in zip(plain.gpus, pushed.gpus, strict=True):
        assert q.utilization == pytest.approx(min(1.0, (p.utilization or 0.0) + 0.5))
        assert (q.temperature_c or 0) >= (p.temperature_c or 0)
    plain_free = sum(g.memory_free_mib or 0 for g in plain.gpus)
    pushed_free = sum(g.memory_free_mib or 0 for g in pushed.gpus)
    assert plain_free - pushed_free == min(30_000, plain_free)
    # Warms with a lag: right after the push the GPU is cooler than five minutes later.
    assert loaded.read(at(101)).gpus[0].temperature_c <= pushed.gpus[0].temperature_c  # type: ignore[operator]


def test_set_load_takes_memory_from_the_gpu_with_most_free_first() -> None:
    source = sim(gpus=3, seed=4)
    plain = source.read(at(50))
    source.set_load(0.0, 1024)
    pushed = source.read(at(50))
    most_free = max(plain.gpus, key=lambda g: (g.memory_free_mib or 0, -g.index))
    for p, q in zip(plain.gpus, pushed.gpus, strict=True):
        expected = (p.memory_free_mib or 0) - (1024 if p.index == most_free.index else 0)
        assert q.memory_free_mib == expected
        assert q.memory_largest_allocation_mib == expected


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        pytest.param({"gpus": -1}, "simulated gpus must be >= 0", id="negative-gpus"),
        pytest.param({"model": " "}, "simulated model must not be empty", id="empty-model"),
        pytest.param({"lose_gpu_after_s": -1.0}, "lose_gpu_after_s", id="negative-lose-after"),
    ],
)
def test_bad_arguments_are_refused(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        sim(**kwargs)


@pytest.mark.parametrize(
    ("extra_utilization", "extra_memory_mib"),
    [pytest.param(-0.1, 0, id="negative-utilization"), pytest.param(0.1, -1, id="negative-mem")],
)
def test_bad_load_is_refused(extra_utilization: float, extra_memory_mib: int) -> None:
    with pytest.raises(ValueError, match="must be >= 0"):
        sim().set_load(extra_utilization, extra_memory_mib)


def test_a_gpu_is_lost_after_the_given_time() -> None:
    source = sim(gpus=4, seed=6, lose_gpu_after_s=120)
    before = source.read(at(119))
    after = source.read(at(120))
    assert len(before.gpus) == 4
    assert before.lost == ()
    lost_index = 6 % 4
    assert [g.index for g in after.gpus] == [i for i in range(4) if i != lost_index]
    assert after.lost == (f"gpu {lost_index}: lost",)
    assert after.error_kinds == ("GpuIsLost",)
    assert after.device_count == 4
    state = aggregate(after)
    assert state.health is Health.DEGRADED
    assert state.gpu_count == 4


def test_one_gpu_lost_of_one_is_unavailable() -> None:
    state = aggregate(sim(gpus=1, lose_gpu_after_s=0).read(START))
    assert state.health is Health.UNAVAILABLE


def test_zero_gpus_is_unavailable() -> None:
    state = aggregate(sim(gpus=0).read(START))
    assert state.health is Health.UNAVAILABLE
    assert state.gpu_count == 0


@pytest.mark.parametrize(
    ("model", "total_mib"),
    [
        pytest.param("NVIDIA A100-SXM4-80GB", 81920, id="a100-80"),
        pytest.param("Tesla V100-SXM2-16GB", 16384, id="v100-16"),
        pytest.param("NVIDIA H100 80GB HBM3", 81920, id="h100"),
        pytest.param("NVIDIA H200", 143771, id="h200-by-table"),
        pytest.param("Some Future GPU", 16384, id="unknown-default"),
    ],
)
def test_memory_total_from_the_model(model: str, total_mib: int) -> None:
    assert memory_total_mib_for(model) == total_mib


def test_open_source_builds_the_simulation() -> None:
    source = open_source(
        "simulated", simulated_gpus=2, simulated_model="NVIDIA H200", seed=1, start=START
    )
    reading = source.read(START)
    assert [g.name for g in reading.gpus] == ["NVIDIA H200", "NVIDIA H200"]
    assert aggregate(reading).gpu_model == "NVIDIA-H200"
    source.close()
    source.close()


def test_open_source_refuses_an_unknown_kind() -> None:
    with pytest.raises(ValueError, match="unknown gpu source 'rocm'"):
        open_source("rocm")  # type: ignore[arg-type]


def test_a_long_run_keeps_the_trace_caches_bounded_and_the_readings_exact() -> None:
    """Twelve simulated hours of 8 GPUs touch 17 280 slot entries per cache, twice the limit: the
    caches stay within it (a daemon's memory stays flat), and clearing them changes no reading."""
    long_run = sim(gpus=8, seed=9)
    last = None
    for minute in range(0, 12 * 60, 5):
        last = long_run.read(at(minute * 60.0))
    caches = (
        long_run._job_cache,
        long_run._running_cache,
        long_run._load_cache,
        long_run._temperature_cache,
    )
    # A few thousand entries each (about a MB), not the whole history.
    assert all(len(cache) <= 8192 for cache in caches)
    assert last is not None
    assert last.gpus == sim(gpus=8, seed=9).read(at((12 * 60 - 5) * 60.0)).gpus


def test_jobs_as_pods_whole_and_time_sliced() -> None:
    """With pods on, a GPU with one job is that pod's alone, one with several is shared."""
    start = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
    source = SimulatedSource(gpus=8, seed=0, start=start, pods=True)
    state = aggregate(source.read(start + timedelta(seconds=30)))
    by_gpu: dict[int, list[tuple[str, float | None]]] = {}
    for pod in state.pods:
        assert pod.pod.startswith("sim/job-")
        for share in pod.gpus:
            assert share.memory_used_mib is not None
            by_gpu.setdefault(share.gpu_index, []).append((pod.pod, share.utilization))
    assert any(len(v) == 1 for v in by_gpu.values()), "a GPU held by one pod"
    assert any(len(v) > 1 for v in by_gpu.values()), "a time-sliced GPU"
    for index, shares in by_gpu.items():
        total = sum(u or 0.0 for _, u in shares)
        assert total == pytest.approx(state.gpus[index].utilization, abs=0.011)
    # Pods off (the default): no allocations, no pods.
    plain = SimulatedSource(gpus=8, seed=0, start=start)
    assert aggregate(plain.read(start + timedelta(seconds=30))).pods == ()
