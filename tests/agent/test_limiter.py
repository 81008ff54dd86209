"""The write decision: named table cases for every rule, and properties over random histories."""

from __future__ import annotations

import math
from dataclasses import replace
from datetime import UTC, datetime
from itertools import pairwise, permutations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.limiter import (
    Decision,
    LimiterState,
    PolicyError,
    Reason,
    WritePolicy,
    backoff_delay_s,
    decide,
    heartbeat_lead_s,
    record_failure,
    record_success,
)
from gpu_contract.podusage import GpuShare, PodUsage
from gpu_contract.schema import GpuState, Health, NodeGpuState

POLICY = WritePolicy()
TOTAL_MIB = 8 * 81920  # 5 % of it: 32768 MiB
T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


def gpu_state(**changes: object) -> NodeGpuState:
    base = NodeGpuState(
        health=Health.OK,
        updated_at=T0,
        utilization=0.50,
        utilization_max=0.70,
        memory_fragmentation=0.20,
        memory_free_mib=300_000,
        memory_largest_free_mib=80_000,
        temperature_c=60,
        gpu_model="NVIDIA-A100-SXM4-80GB",
        gpu_count=8,
    )
    return replace(base, **changes)  # type: ignore[arg-type]


WRITTEN = gpu_state()
# Wrote WRITTEN at t=100; it is now t=130 (past the minimum interval, before the heartbeat).
AFTER_WRITE = record_success(LimiterState.initial(now_s=0.0), written=WRITTEN, now_s=100.0)


def case(
    state: NodeGpuState,
    expected: Reason,
    changed: tuple[str, ...] = (),
    *,
    id: str,
    limiter: LimiterState = AFTER_WRITE,
    now_s: float = 130.0,
    total_mib: int | None = TOTAL_MIB,
) -> object:
    """A `test_decide` row; by default one tick at t=130 after writing WRITTEN at t=100."""
    return pytest.param(limiter, state, now_s, total_mib, expected, changed, id=id)


@pytest.mark.parametrize(
    ("limiter", "state", "now_s", "total_mib", "expected", "changed"),
    [
        case(
            WRITTEN,
            Reason.FIRST_WRITE,
            limiter=LimiterState.initial(now_s=0.0),
            now_s=0.0,
            id="first-write-without-jitter",
        ),
        case(
            WRITTEN,
            Reason.JITTER_PENDING,
            limiter=LimiterState.initial(now_s=0.0, jitter_s=7.0),
            now_s=6.9,
            id="jitter-pending",
        ),
        case(
            WRITTEN,
            Reason.FIRST_WRITE,
            limiter=LimiterState.initial(now_s=0.0, jitter_s=7.0),
            now_s=7.0,
            id="first-write-after-jitter",
        ),
        case(
            gpu_state(updated_at=datetime(2026, 11, 30, 12, 0, 30, tzinfo=UTC)),
            Reason.BELOW_DEADBAND,
            id="only-timestamp-changed",
        ),
        case(gpu_state(utilization=0.54), Reason.BELOW_DEADBAND, id="utilization-below-deadband"),
        case(
            gpu_state(utilization=0.55),
            Reason.DEADBAND_EXCEEDED,
            ("utilization",),
            id="utilization-exactly-deadband",
        ),
        case(
            gpu_state(utilization=0.45),
            Reason.BELOW_DEADBAND,
            id="utilization-down-by-deadband-waits-for-the-heartbeat",
        ),
        case(
            gpu_state(utilization=0.36),
            Reason.BELOW_DEADBAND,
            id="utilization-down-below-three-deadbands",
        ),
        case(
            gpu_state(utilization=0.35),
            Reason.DEADBAND_EXCEEDED,
            ("utilization",),
            id="utilization-down-by-three-deadbands",
        ),
        case(
            gpu_state(utilization=0.449),
            Reason.DEADBAND_EXCEEDED,
            ("utilization",),
            limiter=record_success(AFTER_WRITE, written=gpu_state(utilization=0.401), now_s=100.0),
            id="visible-text-moved-0.40-to-0.45",
        ),
        case(
            gpu_state(utilization_max=0.80),
            Reason.DEADBAND_EXCEEDED,
            ("utilization-max",),
            id="utilization-max-moved-its-own-deadband",
        ),
        case(
            gpu_state(utilization_max=0.79),
            Reason.BELOW_DEADBAND,
            id="utilization-max-below-its-wider-deadband",
        ),
        case(
            gpu_state(memory_fragmentation=0.26),
            Reason.DEADBAND_EXCEEDED,
            ("memory-fragmentation",),
            id="fragmentation",
        ),
        case(gpu_state(temperature_c=64), Reason.BELOW_DEADBAND, id="temperature-up-4"),
        case(
            gpu_state(temperature_c=65),
            Reason.DEADBAND_EXCEEDED,
            ("temperature",),
            id="temperature-up-5",
        ),
        case(gpu_state(temperature_c=55), Reason.BELOW_DEADBAND, id="temperature-down-5"),
        case(
            gpu_state(temperature_c=45),
            Reason.DEADBAND_EXCEEDED,
            ("temperature",),
            id="temperature-down-15",
        ),
        case(
            gpu_state(memory_free_mib=300_000 + 3 * 32_768 - 1),
            Reason.BELOW_DEADBAND,
            id="memory-freed-below-three-deadbands",
        ),
        case(
            gpu_state(memory_free_mib=300_000 + 3 * 32_768),
            Reason.DEADBAND_EXCEEDED,
            ("memory-free-mib",),
            id="memory-freed-three-deadbands",
        ),
        case(
            gpu_state(memory_fragmentation=0.05),
            Reason.DEADBAND_EXCEEDED,
            ("memory-fragmentation",),
            id="fragmentation-down-three-deadbands",
        ),
        case(
            gpu_state(memory_free_mib=300_000 - 32_000),
            Reason.BELOW_DEADBAND,
            id="memory-free-below-5-percent-of-total",
        ),
        case(
            gpu_state(memory_free_mib=300_000 - 32_768),
            Reason.DEADBAND_EXCEEDED,
            ("memory-free-mib",),
            id="memory-free-5-percent-of-total",
        ),
        case(
            gpu_state(memory_largest_free_mib=40_000),
            Reason.DEADBAND_EXCEEDED,
            ("memory-largest-free-mib",),
            id="largest-free",
        ),
        case(
            gpu_state(memory_free_mib=299_999),
            Reason.DEADBAND_EXCEEDED,
            ("memory-free-mib",),
            total_mib=None,
            id="memory-total-unknown-any-change",
        ),
        case(
            gpu_state(temperature_c=None),
            Reason.DEADBAND_EXCEEDED,
            ("temperature",),
            id="field-no-longer-measurable",
        ),
        case(
            gpu_state(health=Health.DEGRADED, health_detail="gpu 3: lost"),
            Reason.DISCRETE_CHANGE,
            ("health", "health-detail"),
            id="health-change",
        ),
        case(gpu_state(gpu_count=7), Reason.DISCRETE_CHANGE, ("gpu-count",), id="gpu-count-change"),
        case(
            gpu_state(gpu_model="mixed"),
            Reason.DISCRETE_CHANGE,
            ("gpu-model",),
            id="gpu-model-change",
        ),
        case(
            gpu_state(health=Health.UNAVAILABLE),
            Reason.WITHIN_MIN_INTERVAL,
            ("health",),
            now_s=105.0,
            id="discrete-change-waits-min-interval",
        ),
        case(
            gpu_state(utilization=0.9),
            Reason.WITHIN_MIN_INTERVAL,
            ("utilization",),
            now_s=109.9,
            id="deadband-waits-min-interval",
        ),
        case(WRITTEN, Reason.BELOW_DEADBAND, now_s=159.9, id="heartbeat-not-yet"),
        case(WRITTEN, Reason.HEARTBEAT_DUE, now_s=160.0, id="heartbeat-due"),
        case(
            WRITTEN,
            Reason.BACKING_OFF,
            limiter=record_failure(AFTER_WRITE, now_s=170.0, policy=POLICY),
            now_s=179.9,
            id="backing-off",
        ),
        case(
            WRITTEN,
            Reason.HEARTBEAT_DUE,
            limiter=record_failure(AFTER_WRITE, now_s=170.0, policy=POLICY),
            now_s=180.0,
            id="retry-after-backoff",
        ),
        case(
            WRITTEN,
            Reason.FIRST_WRITE,
            limiter=record_failure(LimiterState.initial(now_s=0.0), now_s=0.0, policy=POLICY),
            now_s=10.0,
            id="failed-first-write-retried-as-first",
        ),
        case(
            WRITTEN,
            Reason.WITHIN_MIN_INTERVAL,
            limiter=record_failure(
                AFTER_WRITE, now_s=170.0, policy=replace(POLICY, backoff_base_s=1.0)
            ),
            now_s=175.0,
            id="short-backoff-still-waits-min-interval",
        ),
    ],
)
def test_decide(
    *,
    limiter: LimiterState,
    state: NodeGpuState,
    now_s: float,
    total_mib: int | None,
    expected: Reason,
    changed: tuple[str, ...],
) -> None:
    decision = decide(limiter, state, now_s=now_s, memory_total_mib=total_mib, policy=POLICY)
    assert decision.reason is expected
    assert decision.write is (
        expected
        in {
            Reason.FIRST_WRITE,
            Reason.DISCRETE_CHANGE,
            Reason.DEADBAND_EXCEEDED,
            Reason.HEARTBEAT_DUE,
        }
    )
    assert decision.changed == changed


# Four GPUs of 80 GiB: the per-GPU memory deadband is 5 % of one GPU, 4096 MiB.
GPU_TOTAL_MIB = 4 * 81920
BASE_GPUS = (
    GpuState(utilization=0.10, memory_free_mib=80_000, temperature_c=50, allocated=False),
    GpuState(utilization=0.90, memory_free_mib=10_000, temperature_c=75, allocated=True),
    GpuState(utilization=0.50, memory_free_mib=40_000, temperature_c=60, allocated=True),
    GpuState(utilization=0.20, memory_free_mib=70_000, temperature_c=55, allocated=False),
)
WRITTEN_GPUS = gpu_state(gpu_count=4, gpus=BASE_GPUS)
AFTER_GPUS_WRITE = record_success(
    LimiterState.initial(now_s=0.0), written=WRITTEN_GPUS, now_s=100.0
)


def with_gpu(index: int, **changes: object) -> NodeGpuState:
    """WRITTEN_GPUS with GPU `index` changed."""
    gpus = list(BASE_GPUS)
    gpus[index] = gpus[index]._replace(**changes)
    return replace(WRITTEN_GPUS, gpus=tuple(gpus))


def gpu_case(
    state: NodeGpuState, expected: Reason, changed: tuple[str, ...] = (), *, id: str
) -> object:
    return pytest.param(state, expected, changed, id=id)


SWAPPED = replace(WRITTEN_GPUS, gpus=(BASE_GPUS[3], BASE_GPUS[1], BASE_GPUS[2], BASE_GPUS[0]))


@pytest.mark.parametrize(
    ("state", "expected", "changed"),
    [
        gpu_case(WRITTEN_GPUS, Reason.BELOW_DEADBAND, id="unchanged"),
        gpu_case(with_gpu(0, utilization=0.24), Reason.BELOW_DEADBAND, id="util-up-0.14"),
        gpu_case(
            with_gpu(0, utilization=0.25),
            Reason.DEADBAND_EXCEEDED,
            ("per-gpu-utilization",),
            id="util-up-0.15",
        ),
        gpu_case(with_gpu(1, utilization=0.46), Reason.BELOW_DEADBAND, id="util-down-0.44"),
        gpu_case(
            with_gpu(1, utilization=0.45),
            Reason.DEADBAND_EXCEEDED,
            ("per-gpu-utilization",),
            id="util-down-three-deadbands",
        ),
        gpu_case(with_gpu(2, temperature_c=64), Reason.BELOW_DEADBAND, id="temperature-up-4"),
        gpu_case(
            with_gpu(2, temperature_c=65),
            Reason.DEADBAND_EXCEEDED,
            ("per-gpu-temperature",),
            id="temperature-up-5",
        ),
        gpu_case(
            with_gpu(2, memory_free_mib=40_000 - 4095), Reason.BELOW_DEADBAND, id="memory-down"
        ),
        gpu_case(
            with_gpu(2, memory_free_mib=40_000 - 4096),
            Reason.DEADBAND_EXCEEDED,
            ("per-gpu-memory-free-mib",),
            id="memory-down-5-percent-of-one-gpu",
        ),
        gpu_case(
            with_gpu(0, allocated=True),
            Reason.DISCRETE_CHANGE,
            ("per-gpu-allocated",),
            id="allocation-flip",
        ),
        gpu_case(
            with_gpu(0, allocated=None),
            Reason.DISCRETE_CHANGE,
            ("per-gpu-allocated",),
            id="allocation-no-longer-known",
        ),
        gpu_case(
            with_gpu(2, temperature_c=None),
            Reason.DISCRETE_CHANGE,
            ("per-gpu-temperature",),
            id="gpu-value-no-longer-measured",
        ),
        gpu_case(
            replace(WRITTEN_GPUS, gpus=()), Reason.DISCRETE_CHANGE, ("per-gpu",), id="table-gone"
        ),
        # Two GPUs trading places is the same multiset: no scheduling decision changes.
        gpu_case(SWAPPED, Reason.BELOW_DEADBAND, id="two-gpus-swapped"),
        gpu_case(
            replace(SWAPPED, gpus=(*SWAPPED.gpus[:3], SWAPPED.gpus[3]._replace(utilization=0.30))),
            Reason.DEADBAND_EXCEEDED,
            # The fields named are those that moved GPU by GPU.
            ("per-gpu-memory-free-mib", "per-gpu-temperature"),
            id="swapped-and-one-moved",
        ),
    ],
)
def test_decide_per_gpu(state: NodeGpuState, expected: Reason, changed: tuple[str, ...]) -> None:
    decision = decide(
        AFTER_GPUS_WRITE, state, now_s=130.0, memory_total_mib=GPU_TOTAL_MIB, policy=POLICY
    )
    assert (decision.reason, decision.changed) == (expected, changed)


def test_by_index_comparison_sees_a_swap() -> None:
    policy = replace(POLICY, per_gpu_compare="by-index")
    decision = decide(
        AFTER_GPUS_WRITE, SWAPPED, now_s=130.0, memory_total_mib=GPU_TOTAL_MIB, policy=policy
    )
    assert decision.reason is Reason.DEADBAND_EXCEEDED
    assert decision.changed == ("per-gpu-memory-free-mib", "per-gpu-temperature")


def test_symmetric_deadbands_with_factor_one() -> None:
    policy = replace(POLICY, improving_deadband_factor=1.0)
    decision = decide(
        AFTER_WRITE,
        gpu_state(utilization=0.45),
        now_s=130.0,
        memory_total_mib=TOTAL_MIB,
        policy=policy,
    )
    assert decision.changed == ("utilization",)


ZERO_DEADBANDS = WritePolicy(
    utilization_deadband=0.0,
    fragmentation_deadband=0.0,
    temperature_deadband_c=0.0,
    memory_deadband_fraction=0.0,
)


@pytest.mark.parametrize(
    ("state", "expected", "changed"),
    [
        pytest.param(WRITTEN, Reason.BELOW_DEADBAND, (), id="unchanged-is-no-change"),
        pytest.param(
            gpu_state(updated_at=datetime(2026, 11, 30, 12, 0, 30, tzinfo=UTC)),
            Reason.BELOW_DEADBAND,
            (),
            id="only-timestamp",
        ),
        pytest.param(
            gpu_state(utilization=0.51), Reason.DEADBAND_EXCEEDED, ("utilization",), id="util"
        ),
        pytest.param(
            gpu_state(temperature_c=61), Reason.DEADBAND_EXCEEDED, ("temperature",), id="temp"
        ),
        pytest.param(
            gpu_state(memory_free_mib=299_999),
            Reason.DEADBAND_EXCEEDED,
            ("memory-free-mib",),
            id="memory",
        ),
        pytest.param(
            gpu_state(memory_fragmentation=0.21),
            Reason.DEADBAND_EXCEEDED,
            ("memory-fragmentation",),
            id="fragmentation",
        ),
    ],
)
def test_zero_deadband_means_any_change_not_every_tick(
    state: NodeGpuState, expected: Reason, changed: tuple[str, ...]
) -> None:
    decision = decide(
        AFTER_WRITE, state, now_s=130.0, memory_total_mib=TOTAL_MIB, policy=ZERO_DEADBANDS
    )
    assert decision.reason is expected
    assert decision.changed == changed


def test_failure_keeps_last_written_so_deadband_compares_with_the_server() -> None:
    failed = record_failure(AFTER_WRITE, now_s=120.0, policy=POLICY)
    assert failed.last_written == WRITTEN
    assert failed.last_success_s == 100.0
    assert failed.consecutive_failures == 1
    # The unsent change is not queued: once back, only the newest state matters.
    later = decide(failed, WRITTEN, now_s=131.0, memory_total_mib=TOTAL_MIB, policy=POLICY)
    assert later == Decision(False, Reason.BELOW_DEADBAND)


@pytest.mark.parametrize(
    ("failures", "retry_after_s", "expected_s"),
    [
        pytest.param(1, None, 10.0, id="first"),
        pytest.param(2, None, 20.0, id="second-doubles"),
        pytest.param(3, None, 40.0, id="third"),
        pytest.param(4, None, 80.0, id="fourth"),
        pytest.param(5, None, 120.0, id="capped"),
        pytest.param(500, None, 120.0, id="long-outage-capped-no-overflow"),
        pytest.param(1, 30.0, 30.0, id="retry-after-longer-wins"),
        pytest.param(3, 5.0, 40.0, id="retry-after-shorter-backoff-wins"),
        pytest.param(1, 3600.0, 120.0, id="retry-after-capped-at-max"),
        pytest.param(1, -4.0, 10.0, id="negative-retry-after-ignored"),
        pytest.param(1, math.nan, 10.0, id="nan-retry-after-ignored"),
    ],
)
def test_backoff_delay(failures: int, retry_after_s: float | None, expected_s: float) -> None:
    assert backoff_delay_s(failures, policy=POLICY, retry_after_s=retry_after_s) == expected_s


def test_record_failure_sets_retry_time_from_retry_after() -> None:
    failed = record_failure(AFTER_WRITE, now_s=200.0, policy=POLICY, retry_after_s=45.0)
    assert failed.retry_at_s == 245.0
    ok = record_success(failed, written=WRITTEN, now_s=245.0)
    assert ok.consecutive_failures == 0
    assert ok.retry_at_s is None


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        pytest.param({"heartbeat_s": 5.0}, "heartbeat_s", id="heartbeat-below-min-interval"),
        pytest.param({"min_write_interval_s": 0.0}, "min_write_interval_s", id="zero-interval"),
        pytest.param({"utilization_deadband": -0.1}, "utilization_deadband", id="neg-deadband"),
        pytest.param({"backoff_max_s": 1.0}, "backoff_max_s", id="max-below-base"),
        pytest.param({"heartbeat_s": math.inf}, "heartbeat_s", id="infinite-heartbeat"),
    ],
)
def test_policy_bounds(changes: dict[str, float], message: str) -> None:
    with pytest.raises(PolicyError, match=message):
        WritePolicy(**changes)


# --- properties over random histories ----------------------------------------------------------

SAMPLE_S = 5.0

steps = st.lists(
    st.tuples(
        st.floats(min_value=0.5, max_value=SAMPLE_S),  # time to the next tick
        st.floats(min_value=0.0, max_value=1.0),  # utilization
        st.integers(min_value=30, max_value=90),  # temperature
        st.integers(min_value=0, max_value=TOTAL_MIB),  # free memory
        st.sampled_from([Health.OK, Health.OK, Health.OK, Health.DEGRADED]),
        st.one_of(  # API outcome: None = success, else a failure with an optional Retry-After
            st.none(), st.none(), st.none(), st.floats(min_value=0, max_value=300) | st.just(-1.0)
        ),
    ),
    min_size=1,
    max_size=120,
)


def _run(
    history: list[tuple[float, float, int, int, Health, float | None]],
    *,
    jitter_s: float,
    lead_fraction: float = 0.0,
):
    lead_s = heartbeat_lead_s(policy=POLICY, fraction=lead_fraction)
    limiter = LimiterState.initial(now_s=0.0, jitter_s=jitter_s, heartbeat_lead_s=lead_s)
    now_s = 0.0
    log = []
    for dt, utilization, temperature, free_mib, health, failure in history:
        now_s += dt
        state = gpu_state(
            utilization=utilization,
            temperature_c=temperature,
            memory_free_mib=free_mib,
            health=health,
        )
        before = limiter
        decision = decide(before, state, now_s=now_s, memory_total_mib=TOTAL_MIB, policy=POLICY)
        if decision.write:
            if failure is None:
                limiter = record_success(limiter, written=state, now_s=now_s)
            else:
                retry_after = None if failure < 0 else failure
                limiter = record_failure(
                    limiter, now_s=now_s, policy=POLICY, retry_after_s=retry_after
                )
        log.append((now_s, state, before, decision, failure))
    return log


fractions = st.floats(min_value=0.0, max_value=0.999)


@settings(max_examples=300, deadline=None)
@given(steps, st.floats(min_value=0.0, max_value=10.0), fractions)
def test_attempts_never_closer_than_min_interval(history, jitter_s, lead):  # type: ignore[no-untyped-def]
    log = _run(history, jitter_s=jitter_s, lead_fraction=lead)
    attempts = [now for now, _, _, d, _ in log if d.write]
    assert all(b - a >= POLICY.min_write_interval_s for a, b in pairwise(attempts))
    assert all(t >= jitter_s for t in attempts)


@settings(max_examples=300, deadline=None)
@given(steps, st.floats(min_value=0.0, max_value=10.0), fractions)
def test_never_silent_longer_than_heartbeat_while_api_up(history, jitter_s, lead):  # type: ignore[no-untyped-def]
    up = [(dt, u, t, m, h, None) for dt, u, t, m, h, _ in history]
    log = _run(up, jitter_s=jitter_s, lead_fraction=lead)
    last_write_s = jitter_s  # the first write is due as soon as the jitter has passed
    for now_s, _, _, decision, _ in log:
        assert now_s - last_write_s <= POLICY.heartbeat_s + SAMPLE_S
        if decision.write:
            last_write_s = now_s


def _moved_towards_less_headroom_or_far(old: float, new: float, deadband: float) -> bool:
    """The rule restated: up (less headroom) by the deadband, down by three deadbands."""
    band = deadband if new > old else deadband * POLICY.improving_deadband_factor
    return abs(new - old) >= band - 1e-9


@settings(max_examples=300, deadline=None)
@given(steps)
def test_every_write_is_justified_and_deadbands_respected(history):  # type: ignore[no-untyped-def]
    deadband_mib = POLICY.memory_deadband_fraction * TOTAL_MIB
    for now_s, state, before, decision, _ in _run(history, jitter_s=0.0):
        last = before.last_written
        if last is None:
            continue
        moved = (
            _moved_towards_less_headroom_or_far(
                round(last.utilization or 0, 2),
                round(state.utilization or 0, 2),
                POLICY.utilization_deadband,
            )
            or _moved_towards_less_headroom_or_far(
                last.temperature_c or 0, state.temperature_c or 0, POLICY.temperature_deadband_c
            )
            or _moved_towards_less_headroom_or_far(
                -(last.memory_free_mib or 0), -(state.memory_free_mib or 0), deadband_mib
            )
        )
        discrete = state.health != last.health
        heartbeat = now_s - (before.last_success_s or 0.0) >= POLICY.heartbeat_s
        if decision.write:
            assert moved or discrete or heartbeat
        if decision.reason is Reason.BELOW_DEADBAND:
            assert not moved
            assert not discrete


def _gpu_close(old: GpuState, new: GpuState, per_gpu_mib: float) -> bool:
    return not (
        _moved_towards_less_headroom_or_far(
            round(old.utilization or 0, 2),
            round(new.utilization or 0, 2),
            POLICY.per_gpu_utilization_deadband,
        )
        or _moved_towards_less_headroom_or_far(
            old.temperature_c or 0, new.temperature_c or 0, POLICY.per_gpu_temperature_deadband_c
        )
        or _moved_towards_less_headroom_or_far(
            -(old.memory_free_mib or 0), -(new.memory_free_mib or 0), per_gpu_mib
        )
    )


# Few, close values, so that GPUs often trade places or stay within a deadband of each other.
_gpu_values = st.builds(
    GpuState,
    utilization=st.sampled_from([0.10, 0.20, 0.24, 0.25, 0.50, 0.90]),
    memory_free_mib=st.sampled_from([10_000, 12_000, 14_096, 40_000, 80_000]),
    temperature_c=st.sampled_from([40, 44, 45, 50, 70]),
    allocated=st.just(True),
    dra_device=st.none(),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(_gpu_values, min_size=3, max_size=3), min_size=2, max_size=30))
def test_per_gpu_values_written_exactly_when_no_pairing_exists(history):  # type: ignore[no-untyped-def]
    """Against a brute-force oracle: every pairing of the new GPUs with the written ones."""
    total_mib = 3 * 81920
    per_gpu_mib = POLICY.per_gpu_memory_deadband_fraction * total_mib / 3
    limiter = LimiterState.initial(now_s=0.0)
    for step, gpus in enumerate(history):
        now_s = 10.0 * step  # every tick past the minimum interval, none at the heartbeat
        state = gpu_state(gpu_count=3, gpus=tuple(gpus))
        decision = decide(limiter, state, now_s=now_s, memory_total_mib=total_mib, policy=POLICY)
        last = limiter.last_written
        quiet_s = None if limiter.last_success_s is None else now_s - limiter.last_success_s
        if last is not None and quiet_s is not None and quiet_s < POLICY.heartbeat_s:
            pairing = any(
                all(_gpu_close(last.gpus[j], state.gpus[i], per_gpu_mib) for i, j in enumerate(p))
                for p in permutations(range(3))
            )
            assert decision.write is not pairing
        if decision.write:
            limiter = record_success(limiter, written=state, now_s=now_s)


@settings(max_examples=300, deadline=None)
@given(steps)
def test_backoff_honoured_grows_and_caps(history):  # type: ignore[no-untyped-def]
    log = _run(history, jitter_s=0.0)
    previous_delay = 0.0
    for index, (now_s, _, before, decision, failure) in enumerate(log):
        if not decision.write or failure is None:
            if decision.write:
                previous_delay = 0.0
            continue
        failures = before.consecutive_failures + 1
        retry_after = None if failure < 0 else failure
        delay = backoff_delay_s(failures, policy=POLICY, retry_after_s=retry_after)
        assert delay <= POLICY.backoff_max_s
        if retry_after is None:
            assert delay >= previous_delay  # grows (until the cap) while failures continue
            previous_delay = delay
        # Retry-After (capped) honoured: no attempt before it.
        for later_s, _, _, later, _ in log[index + 1 :]:
            if later.write:
                assert later_s - now_s >= delay
                assert later_s - now_s >= min(retry_after or 0.0, POLICY.backoff_max_s)
                break


def _quiet_heartbeats(*, lead_fraction: float, minutes: int) -> list[float]:
    """Write times of a node whose values never move, ticking every 5 s."""
    lead_s = heartbeat_lead_s(policy=POLICY, fraction=lead_fraction)
    limiter = LimiterState.initial(now_s=0.0, heartbeat_lead_s=lead_s)
    state = gpu_state()
    written: list[float] = []
    for tick in range(minutes * 12 + 1):
        now_s = tick * 5.0
        if decide(limiter, state, now_s=now_s, memory_total_mib=TOTAL_MIB, policy=POLICY).write:
            limiter = record_success(limiter, written=state, now_s=now_s)
            written.append(now_s)
    return written


@pytest.mark.parametrize(
    ("fraction", "expected_s"),
    [
        pytest.param(0.0, [0.0, 60.0, 120.0, 180.0], id="no-lead"),
        pytest.param(0.5, [0.0, 35.0, 95.0, 155.0], id="half-span-lead-once"),
        pytest.param(0.999, [0.0, 15.0, 75.0, 135.0], id="longest-lead-at-the-next-tick"),
    ],
)
def test_heartbeat_lead_shifts_the_phase_once(fraction: float, expected_s: list[float]) -> None:
    """Quiet nodes started together spread their heartbeats instead of writing in step."""
    assert _quiet_heartbeats(lead_fraction=fraction, minutes=3) == expected_s


def test_heartbeat_lead_spreads_a_fleet_over_the_heartbeat() -> None:
    phases = {
        _quiet_heartbeats(lead_fraction=i / 50, minutes=2)[1] % POLICY.heartbeat_s
        for i in range(50)
    }
    # 5 s ticks: the phases cover every tick slot that the rules allow (10 s .. 60 s).
    assert len(phases) >= 10


# ---------------------------------------------------------------- pod-gpu-usage (per pod, per GPU)

# Two pods on the four GPUs above: one alone on GPU 1, two time-sliced on GPU 2.
BASE_PODS = (
    PodUsage("ml/infer-a", (GpuShare(2, 0.20, 10_000),)),
    PodUsage("ml/infer-b", (GpuShare(2, 0.60, 20_000),)),
    PodUsage("train/job-0", (GpuShare(1, 0.90, 70_000),)),
)
WRITTEN_PODS = replace(WRITTEN_GPUS, pods=BASE_PODS)
AFTER_PODS_WRITE = record_success(
    LimiterState.initial(now_s=0.0), written=WRITTEN_PODS, now_s=100.0
)


def with_share(pod: int, **changes: object) -> NodeGpuState:
    pods = list(BASE_PODS)
    pods[pod] = pods[pod]._replace(gpus=(pods[pod].gpus[0]._replace(**changes),))
    return replace(WRITTEN_PODS, pods=tuple(pods))


@pytest.mark.parametrize(
    ("state", "now_s", "expected"),
    [
        pytest.param(WRITTEN_PODS, 130.0, Reason.BELOW_DEADBAND, id="unchanged"),
        pytest.param(with_share(0, utilization=0.34), 130.0, Reason.BELOW_DEADBAND, id="util+0.14"),
        pytest.param(
            with_share(0, utilization=0.35), 130.0, Reason.DEADBAND_EXCEEDED, id="util+0.15"
        ),
        # Improving moves need three deadbands, as for the node's figures.
        pytest.param(with_share(1, utilization=0.16), 130.0, Reason.BELOW_DEADBAND, id="util-0.44"),
        pytest.param(
            with_share(1, utilization=0.15), 130.0, Reason.DEADBAND_EXCEEDED, id="util-0.45"
        ),
        # 5 % of one GPU's memory: 4096 MiB of 81920.
        pytest.param(
            with_share(2, memory_used_mib=74_095), 130.0, Reason.BELOW_DEADBAND, id="mem+4095"
        ),
        pytest.param(
            with_share(2, memory_used_mib=74_096), 130.0, Reason.DEADBAND_EXCEEDED, id="mem+4096"
        ),
        pytest.param(
            with_share(0, utilization=None), 130.0, Reason.DISCRETE_CHANGE, id="figure-gone"
        ),
        pytest.param(
            replace(WRITTEN_PODS, pods=BASE_PODS[1:]),
            130.0,
            Reason.DISCRETE_CHANGE,
            id="pod-left",
        ),
        pytest.param(
            replace(
                WRITTEN_PODS,
                pods=(*BASE_PODS, PodUsage("ml/infer-c", (GpuShare(2, 0.0, 0),))),
            ),
            130.0,
            Reason.DISCRETE_CHANGE,
            id="pod-arrived",
        ),
        pytest.param(with_share(2, gpu_index=3), 130.0, Reason.DISCRETE_CHANGE, id="pod-moved-gpu"),
        # A discrete change still waits for the minimum interval.
        pytest.param(
            replace(WRITTEN_PODS, pods=BASE_PODS[1:]),
            105.0,
            Reason.WITHIN_MIN_INTERVAL,
            id="pod-left-within-min-interval",
        ),
    ],
)
def test_decide_pod_usage(state: NodeGpuState, now_s: float, expected: Reason) -> None:
    decision = decide(
        AFTER_PODS_WRITE, state, now_s=now_s, memory_total_mib=GPU_TOTAL_MIB, policy=POLICY
    )
    assert decision.reason is expected
    assert decision.changed == (() if expected is Reason.BELOW_DEADBAND else ("pod-gpu-usage",))
