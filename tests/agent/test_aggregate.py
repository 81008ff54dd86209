"""The node aggregate and memory fragmentation: named cases, then properties."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.aggregate import aggregate, memory_fragmentation
from agent.records import DeviceAllocations, GpuReading, NodeReading
from gpu_contract.schema import GpuState, Health, NodeGpuState, decode, encode

NOW = datetime(2026, 11, 30, 12, 0, 0, 750_000, tzinfo=UTC)


def gpu(
    index: int,
    *,
    utilization: float | None = 0.5,
    free: int | None = 40_000,
    temperature: int | None = 50,
    name: str | None = "NVIDIA A100-SXM4-80GB",
    problems: tuple[str, ...] = (),
    mig: bool = False,
    largest: int | None = None,
    mig_uuids: tuple[str, ...] = (),
) -> GpuReading:
    return GpuReading(
        uuid=f"GPU-{index}",
        mig_device_uuids=mig_uuids,
        index=index,
        name=name,
        utilization=utilization,
        memory_total_mib=81920,
        memory_free_mib=free,
        temperature_c=temperature,
        mig_enabled=mig,
        memory_largest_allocation_mib=largest,
        problems=problems,
    )


def node(*gpus: GpuReading, device_count: int | None = None, **extra: object) -> NodeReading:
    count = len(gpus) if device_count is None else device_count
    return NodeReading(sampled_at=NOW, gpus=gpus, device_count=count, **extra)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("free", "expected"),
    [
        pytest.param([], 0.0, id="no-gpu"),
        pytest.param([30_000], 0.0, id="one-gpu"),
        pytest.param([0, 0, 0], 0.0, id="nothing-free"),
        pytest.param([40_000, 40_000], 0.5, id="two-equal-halves"),
        pytest.param([80_000, 0], 0.0, id="all-free-on-one-gpu"),
        pytest.param([10_000] * 8, 0.875, id="eight-equal-slivers"),
        pytest.param([60_000, 20_000], 0.25, id="uneven"),
        pytest.param([-5, 100], 0.0, id="negative-counts-as-zero"),
    ],
)
def test_memory_fragmentation(free: list[int], expected: float) -> None:
    assert memory_fragmentation(free) == pytest.approx(expected)


def test_healthy_node() -> None:
    state = aggregate(
        node(
            gpu(0, utilization=0.2, free=10_000, temperature=45),
            gpu(1, utilization=0.6, free=30_000, temperature=71),
        )
    )
    assert state == NodeGpuState(
        health=Health.OK,
        updated_at=datetime(2026, 11, 30, 12, 0, 0, tzinfo=UTC),
        utilization=pytest.approx(0.4),  # type: ignore[arg-type]
        utilization_max=0.6,
        memory_fragmentation=pytest.approx(0.25),  # type: ignore[arg-type]
        memory_free_mib=40_000,
        memory_largest_free_mib=30_000,
        temperature_c=71,
        gpu_model="NVIDIA-A100-SXM4-80GB",
        gpu_count=2,
        health_detail=None,
        gpus=(
            GpuState(utilization=0.2, memory_free_mib=10_000, temperature_c=45),
            GpuState(utilization=0.6, memory_free_mib=30_000, temperature_c=71),
        ),
    )


@pytest.mark.parametrize(
    ("reading", "health", "detail"),
    [
        pytest.param(node(gpu(0), gpu(1)), Health.OK, None, id="ok"),
        pytest.param(
            node(gpu(0), device_count=2, lost=("gpu 1: lost",)),
            Health.DEGRADED,
            "gpu 1: lost",
            id="one-gpu-lost",
        ),
        pytest.param(
            node(
                gpu(0), gpu(1, temperature=None, problems=("temperature not supported on gpu 1",))
            ),
            Health.DEGRADED,
            "temperature not supported on gpu 1",
            id="field-not-supported",
        ),
        pytest.param(
            node(
                gpu(0, problems=("name not permitted on gpu 0",)),
                device_count=2,
                lost=("gpu 1: lost",),
            ),
            Health.DEGRADED,
            "gpu 1: lost; name not permitted on gpu 0",
            id="lost-listed-before-field-problems",
        ),
        pytest.param(
            node(device_count=2, lost=("gpu 0: lost", "gpu 1: lost")),
            Health.UNAVAILABLE,
            "gpu 0: lost; gpu 1: lost",
            id="every-gpu-lost",
        ),
        pytest.param(node(), Health.UNAVAILABLE, "no gpus reported", id="no-gpus"),
        pytest.param(
            node(gpu(0), fatal="Uninitialized"),
            Health.UNAVAILABLE,
            "nvml: Uninitialized",
            id="nvml-failed",
        ),
        pytest.param(
            node(gpu(0, problems=("x on gpu 0",)), gpu(1, problems=("x on gpu 0",))),
            Health.DEGRADED,
            "x on gpu 0",
            id="duplicate-problems-once",
        ),
    ],
)
def test_health(reading: NodeReading, health: Health, detail: str | None) -> None:
    state = aggregate(reading)
    assert state.health is health
    assert state.health_detail == detail


def test_lost_gpu_keeps_gpu_count_and_drops_its_values() -> None:
    state = aggregate(
        node(gpu(0, free=10_000), gpu(2, free=5_000), device_count=3, lost=("gpu 1: lost",))
    )
    assert state.gpu_count == 3
    assert state.memory_free_mib == 15_000
    assert state.memory_largest_free_mib == 10_000


@pytest.mark.parametrize(
    ("gpus", "largest_mib", "fragmentation"),
    [
        pytest.param(
            [gpu(0, free=30_000), gpu(1, free=10_000)],
            30_000,
            0.25,
            id="plain-gpus-free-is-largest",
        ),
        pytest.param(
            [gpu(0, free=30_000, largest=30_000), gpu(1, free=10_000, largest=10_000)],
            30_000,
            0.25,
            id="plain-gpus-with-explicit-largest",
        ),
        pytest.param(
            [gpu(0, free=69_000, mig=True, largest=9_856)],
            9_856,
            1 - 9_856 / 69_000,
            id="one-mig-gpu-of-small-instances-is-fragmented",
        ),
        pytest.param(
            [gpu(0, free=69_000, mig=True, largest=9_856), gpu(1, free=20_000)],
            20_000,
            1 - 20_000 / 89_000,
            id="plain-gpu-beats-bigger-mig-sum",
        ),
        pytest.param(
            [gpu(0, free=80_000, mig=True, largest=80_000)],
            80_000,
            0.0,
            id="mig-gpu-without-instances-is-one-block",
        ),
        pytest.param(
            [gpu(0, free=50_000, mig=True), gpu(1, free=10_000)],
            10_000,
            1 - 10_000 / 60_000,
            id="mig-gpu-without-largest-offers-no-known-block",
        ),
        pytest.param(
            [gpu(0, free=50_000, mig=True)],
            None,
            None,
            id="only-mig-gpu-without-largest-omits-both",
        ),
        pytest.param(
            [gpu(0, free=5_000, largest=9_000)],
            5_000,
            0.0,
            id="largest-never-above-free",
        ),
    ],
)
def test_largest_free_is_the_biggest_single_allocation(
    gpus: list[GpuReading], largest_mib: int | None, fragmentation: float | None
) -> None:
    state = aggregate(node(*gpus))
    assert state.memory_free_mib == sum(g.memory_free_mib or 0 for g in gpus)
    assert state.memory_largest_free_mib == largest_mib
    if fragmentation is None:
        assert state.memory_fragmentation is None
    else:
        assert state.memory_fragmentation == pytest.approx(fragmentation)


def test_fatal_publishes_no_numbers() -> None:
    state = aggregate(node(gpu(0), fatal="Driver Not Loaded"))
    assert state.utilization is None
    assert state.memory_free_mib is None
    assert state.temperature_c is None
    assert state.gpu_count is None
    assert state.gpu_model is None


@pytest.mark.parametrize(
    ("names", "model"),
    [
        pytest.param(["NVIDIA A100-SXM4-80GB"] * 2, "NVIDIA-A100-SXM4-80GB", id="same"),
        pytest.param(["NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB"], "mixed", id="mixed"),
        pytest.param(["NVIDIA H200", None], "NVIDIA-H200", id="one-name-unreadable"),
        pytest.param([None, None], None, id="no-name-readable"),
        pytest.param(["  Tesla   V100-SXM2-16GB "], "Tesla-V100-SXM2-16GB", id="odd-spacing"),
    ],
)
def test_gpu_model(names: list[str | None], model: str | None) -> None:
    state = aggregate(node(*(gpu(i, name=n) for i, n in enumerate(names))))
    assert state.gpu_model == model


def test_unmeasured_fields_are_none_not_zero() -> None:
    state = aggregate(node(gpu(0, utilization=None, free=None, temperature=None, problems=("p",))))
    assert state.utilization is None
    assert state.utilization_max is None
    assert state.memory_fragmentation is None
    assert state.memory_free_mib is None
    assert state.memory_largest_free_mib is None
    assert state.temperature_c is None
    annotations = encode(state)
    assert not any(k.endswith(("/utilization", "/temperature")) for k in annotations)


def test_a_gpu_missing_one_field_still_counts_for_the_others() -> None:
    state = aggregate(node(gpu(0, utilization=0.9, free=None), gpu(1, utilization=None, free=100)))
    assert state.utilization == pytest.approx(0.9)
    assert state.memory_free_mib == 100
    assert state.memory_fragmentation == 0.0  # one GPU with a known free value


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        pytest.param(math.nan, None, id="nan-dropped"),
        pytest.param(math.inf, None, id="inf-dropped"),
        pytest.param(1.7, 1.0, id="above-one-clamped"),
        pytest.param(-0.2, 0.0, id="below-zero-clamped"),
    ],
)
def test_bad_utilization_values(value: float, expected: float | None) -> None:
    assert aggregate(node(gpu(0, utilization=value))).utilization == expected


@pytest.mark.parametrize(
    ("sampled_at", "expected"),
    [
        pytest.param(NOW, datetime(2026, 11, 30, 12, 0, 0, tzinfo=UTC), id="utc-truncated"),
        pytest.param(
            datetime(2026, 11, 30, 14, 0, 5, 999_999, tzinfo=timezone(timedelta(hours=2))),
            datetime(2026, 11, 30, 12, 0, 5, tzinfo=UTC),
            id="offset-converted",
        ),
        pytest.param(
            datetime(2026, 11, 30, 12, 0, 5),
            datetime(2026, 11, 30, 12, 0, 5, tzinfo=UTC),
            id="naive-taken-as-utc",
        ),
    ],
)
def test_updated_at(sampled_at: datetime, expected: datetime) -> None:
    reading = NodeReading(sampled_at=sampled_at, gpus=(gpu(0),), device_count=1)
    state = aggregate(reading)
    assert state.updated_at == expected
    assert state.updated_at.tzinfo is UTC


# -- properties ---------------------------------------------------------------------------------

free_lists = st.lists(st.integers(min_value=0, max_value=200_000), max_size=16)
optional_fraction = st.one_of(st.none(), st.floats(min_value=0.0, max_value=1.0))
optional_free = st.one_of(st.none(), st.integers(min_value=0, max_value=200_000))
optional_temperature = st.one_of(st.none(), st.integers(min_value=-10, max_value=120))


@st.composite
def readings(draw: st.DrawFn) -> NodeReading:
    count = draw(st.integers(min_value=0, max_value=8))
    gpus = []
    lost = []
    for i in range(count):
        if draw(st.booleans()) and draw(st.booleans()):
            lost.append(f"gpu {i}: lost")
            continue
        utilization = draw(optional_fraction)
        free = draw(optional_free)
        temperature = draw(optional_temperature)
        mig = draw(st.booleans())
        largest = draw(optional_free) if mig else None
        problems = tuple(
            f"{what} not supported on gpu {i}"
            for what, value in (("utilization", utilization), ("memory", free))
            if value is None
        )
        gpus.append(
            gpu(
                i,
                utilization=utilization,
                free=free,
                temperature=temperature,
                problems=problems,
                mig=mig,
                largest=largest,
            )
        )
    fatal = draw(st.one_of(st.none(), st.just("Uninitialized")))
    return node(*gpus, device_count=count, lost=tuple(lost), fatal=fatal)


@given(free_lists)
def test_fragmentation_is_a_fraction(free: list[int]) -> None:
    value = memory_fragmentation(free)
    assert 0.0 <= value < 1.0
    if len(free) <= 1 or sum(free) == 0:
        assert value == 0.0


@given(free_lists, st.permutations(range(16)))
def test_fragmentation_ignores_gpu_order(free: list[int], order: list[int]) -> None:
    shuffled = [free[i] for i in order if i < len(free)]
    assert memory_fragmentation(shuffled) == pytest.approx(memory_fragmentation(free))


@given(readings())
def test_aggregate_invariants(reading: NodeReading) -> None:
    state = aggregate(reading)
    measured = [g for g in reading.gpus if g.memory_free_mib is not None]
    if state.memory_largest_free_mib is not None:
        assert state.memory_free_mib is not None
        # The biggest single request fits on one GPU: never more than any one GPU has free.
        assert 0 <= state.memory_largest_free_mib <= max(g.memory_free_mib or 0 for g in measured)
        assert state.memory_fragmentation is not None
        assert 0.0 <= state.memory_fragmentation <= 1.0
        if state.memory_free_mib > 0:
            assert state.memory_fragmentation == pytest.approx(
                1 - state.memory_largest_free_mib / state.memory_free_mib
            )
    plain = [g for g in measured if not g.mig_enabled]
    if state.memory_free_mib is not None and plain:
        assert state.memory_largest_free_mib is not None
        assert state.memory_largest_free_mib >= max(g.memory_free_mib or 0 for g in plain)
    for fraction in (state.utilization, state.utilization_max, state.memory_fragmentation):
        assert fraction is None or 0.0 <= fraction <= 1.0
    if state.utilization is not None:
        assert state.utilization_max is not None
        assert state.utilization <= state.utilization_max + 1e-12
    # Omitted, never zero: a value exists only where some GPU measured it.
    if reading.fatal is None and measured:
        assert state.memory_free_mib == sum(g.memory_free_mib or 0 for g in measured)
    else:
        assert state.memory_free_mib is None
    if not any(g.utilization is not None for g in reading.gpus) or reading.fatal:
        assert state.utilization is None
    if not any(g.temperature_c is not None for g in reading.gpus) or reading.fatal:
        assert state.temperature_c is None
    # Health follows the faults.
    if reading.fatal or not reading.gpus:
        assert state.health is Health.UNAVAILABLE
    elif reading.lost or any(g.problems for g in reading.gpus):
        assert state.health is Health.DEGRADED
    else:
        assert state.health is Health.OK
    assert (state.health_detail is None) == (state.health is Health.OK)
    assert state.updated_at.microsecond == 0


@given(readings())
def test_aggregate_round_trips_through_the_contract(reading: NodeReading) -> None:
    state = aggregate(reading)
    decoded = decode(encode(state))
    assert decoded.problems == ()
    assert decoded.state is not None
    assert decoded.state.health is state.health
    assert decoded.state.memory_free_mib == state.memory_free_mib
    assert decoded.state.gpu_count == state.gpu_count


# ------------------------------------------------------------------------- the per-GPU table


def _table(reading: NodeReading) -> list[tuple[object, ...]]:
    return [
        (g.utilization, g.memory_free_mib, g.temperature_c, g.allocated)
        for g in aggregate(reading).gpus
    ]


def test_each_gpus_dra_device_is_found_by_uuid() -> None:
    """Names by UUID, whatever the order; a GPU no device names, and a lost GPU, have none."""
    reading = node(gpu(0), gpu(1), gpu(2), device_count=4, lost=("gpu 3: lost",))
    uuids = [g.uuid for g in reading.gpus]
    names = {uuids[0]: "gpu-2", uuids[1]: "gpu-0", "GPU-elsewhere": "gpu-9"}
    assert [g.dra_device for g in aggregate(reading, names).gpus] == ["gpu-2", "gpu-0", None, None]
    assert [g.dra_device for g in aggregate(reading).gpus] == [None] * 4


@pytest.mark.parametrize(
    ("reading", "expected"),
    [
        pytest.param(
            node(gpu(0, utilization=0.25, free=1000, temperature=40), gpu(1, utilization=0.75)),
            [(0.25, 1000, 40, None), (0.75, 40_000, 50, None)],
            id="nvml-index-order-with-allocations-unknown",
        ),
        pytest.param(
            node(gpu(0), gpu(2), device_count=3, lost=("gpu 1: lost",)),
            [(0.5, 40_000, 50, None), (None, None, None, None), (0.5, 40_000, 50, None)],
            id="lost-gpu-keeps-its-place",
        ),
        pytest.param(
            node(gpu(0, utilization=math.nan, temperature=None), gpu(1, utilization=1.7)),
            [(None, 40_000, None, None), (1.0, 40_000, 50, None)],
            id="nan-unmeasured-out-of-range-clamped",
        ),
        pytest.param(
            node(gpu(0, mig=True, free=60_000, largest=20_000), gpu(1, mig=True, largest=None)),
            [(0.5, 20_000, 50, None), (0.5, None, 50, None)],
            id="mig-gpu-publishes-its-largest-allocation",
        ),
        pytest.param(
            node(gpu(0), gpu(0)),
            [],
            id="duplicate-indexes-no-table",
        ),
        pytest.param(
            node(gpu(0), gpu(5), device_count=2),
            [],
            id="index-beyond-the-count-no-table",
        ),
    ],
)
def test_per_gpu_table(reading: NodeReading, expected: list[tuple[object, ...]]) -> None:
    assert _table(reading) == expected


def _allocations(allocatable: set[str], assigned: set[str]) -> DeviceAllocations:
    return DeviceAllocations(frozenset(allocatable), frozenset(assigned))


def test_allocations_reach_the_table_by_uuid() -> None:
    reading = node(
        gpu(0),
        gpu(1, mig=True, largest=10_000, mig_uuids=("MIG-a", "MIG-b")),
        gpu(2),
        allocations=_allocations(
            {"GPU-0", "MIG-a", "MIG-b", "GPU-2::0", "GPU-2::1"}, {"GPU-0", "MIG-a", "GPU-2::1"}
        ),
    )
    assert [g.allocated for g in aggregate(reading).gpus] == [True, False, False]


def test_allocations_naming_no_gpu_of_the_node_publish_nothing() -> None:
    reading = node(gpu(0), allocations=_allocations({"0", "1"}, {"0"}))
    assert [g.allocated for g in aggregate(reading).gpus] == [None]
    assert "gpu-scheduler.example.com/per-gpu-allocated" not in encode(aggregate(reading))


@given(
    st.lists(
        st.tuples(
            st.one_of(st.none(), st.floats(allow_nan=True)),
            st.one_of(st.none(), st.integers(-10, 200_000)),
            st.one_of(st.none(), st.integers(-20, 120)),
        ),
        min_size=1,
        max_size=8,
    )
)
def test_node_aggregates_are_recomputable_from_the_table(
    values: list[tuple[float | None, int | None, int | None]],
) -> None:
    """The per-GPU keys and the node keys come from the same reads: they never disagree."""
    reading = node(
        *(gpu(i, utilization=u, free=f, temperature=t) for i, (u, f, t) in enumerate(values))
    )
    state = aggregate(reading)
    decoded = decode(encode(state)).state
    assert decoded is not None
    assert len(decoded.gpus) == len(values) or not any(v is not None for g in state.gpus for v in g)
    temperatures = [g.temperature_c for g in state.gpus if g.temperature_c is not None]
    assert state.temperature_c == (max(temperatures) if temperatures else None)
    largest = [g.memory_free_mib for g in state.gpus if g.memory_free_mib is not None]
    assert state.memory_largest_free_mib == (max(largest) if largest else None)
    utilizations = [g.utilization for g in state.gpus if g.utilization is not None]
    assert state.utilization_max == (max(utilizations) if utilizations else None)
