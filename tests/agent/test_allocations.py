"""Device IDs to GPUs (named cases of every ID shape), and the schedule of kubelet queries."""

from __future__ import annotations

import pytest

from agent.allocations import (
    AllocationPolicy,
    AllocationTracker,
    allocated_by_gpu,
    device_base_id,
)
from agent.records import DeviceAllocations, GpuReading


def gpu(index: int, *migs: str) -> GpuReading:
    return GpuReading(
        uuid=f"GPU-{index}",
        index=index,
        name="NVIDIA A100-SXM4-80GB",
        utilization=0.0,
        memory_total_mib=81920,
        memory_free_mib=81920,
        temperature_c=30,
        mig_device_uuids=migs,
    )


TWO = [gpu(0), gpu(1)]


@pytest.mark.parametrize(
    ("device_id", "base"),
    [
        pytest.param("GPU-0", "GPU-0", id="whole-gpu"),
        pytest.param("GPU-0::3", "GPU-0", id="replica"),
        pytest.param("MIG-abc::12", "MIG-abc", id="mig-replica"),
        pytest.param("GPU-0::x", "GPU-0::x", id="not-a-replica-number"),
        pytest.param("::1", "", id="empty-base"),
        pytest.param("0000:3b:00.0", "0000:3b:00.0", id="pci-address-is-not-a-replica"),
    ],
)
def test_device_base_id(device_id: str, base: str) -> None:
    assert device_base_id(device_id) == base


def allocations(allocatable: set[str], assigned: set[str]) -> DeviceAllocations:
    return DeviceAllocations(frozenset(allocatable), frozenset(assigned))


@pytest.mark.parametrize(
    ("gpus", "given", "expected"),
    [
        pytest.param(
            TWO,
            allocations({"GPU-0", "GPU-1"}, {"GPU-1"}),
            {0: False, 1: True},
            id="whole-gpus",
        ),
        pytest.param(
            TWO,
            allocations(
                {"GPU-0::0", "GPU-0::1", "GPU-1::0", "GPU-1::1"},
                {"GPU-0::0", "GPU-1::0", "GPU-1::1"},
            ),
            {0: False, 1: True},
            id="time-sliced-every-replica-counts",
        ),
        pytest.param(
            [gpu(0, "MIG-a", "MIG-b"), gpu(1, "MIG-c")],
            allocations({"MIG-a", "MIG-b", "MIG-c"}, {"MIG-a", "MIG-c"}),
            {0: False, 1: True},
            id="mig-devices-map-to-their-gpu",
        ),
        pytest.param(
            [gpu(0, "MIG-a")],
            allocations({"MIG-a::0", "MIG-a::1"}, {"MIG-a::0", "MIG-a::1"}),
            {0: True},
            id="time-sliced-mig",
        ),
        pytest.param(
            TWO,
            allocations({"GPU-0"}, {"GPU-1"}),
            {0: False, 1: True},
            id="assigned-but-no-longer-offered-is-held",
        ),
        pytest.param(
            TWO,
            allocations({"GPU-0"}, set()),
            {0: False, 1: None},
            id="not-offered-by-the-kubelet-is-unknown",
        ),
        pytest.param(
            TWO,
            allocations({"GPU-0", "GPU-1", "0", "1", "mlx5_0"}, {"0", "GPU-0"}),
            {0: True, 1: False},
            id="other-plugins-devices-ignored",
        ),
        pytest.param(
            TWO,
            allocations({"0", "1"}, {"0"}),
            None,
            id="device-plugin-naming-by-index-maps-nothing",
        ),
        pytest.param(TWO, allocations(set(), set()), None, id="no-devices-at-all"),
    ],
)
def test_allocated_by_gpu(
    gpus: list[GpuReading], given: DeviceAllocations, expected: dict[int, bool | None] | None
) -> None:
    assert allocated_by_gpu(gpus, given) == expected


POLICY = AllocationPolicy(retry_base_s=10.0, retry_max_s=40.0, keep_last_s=60.0, log_every_s=600.0)
GOOD = allocations({"GPU-0"}, {"GPU-0"})


def test_asks_every_tick_while_the_kubelet_answers() -> None:
    tracker = AllocationTracker().succeeded(GOOD, now_s=0.0)
    assert tracker.due(0.0)
    assert tracker.due(5.0)
    assert tracker.current(5.0, POLICY) == GOOD


def test_backs_off_while_failing_and_caps() -> None:
    tracker = AllocationTracker()
    delays = []
    now_s = 0.0
    for _ in range(5):
        assert tracker.due(now_s)
        tracker = tracker.failed("refused", now_s=now_s, policy=POLICY)
        delays.append(tracker.next_attempt_s - now_s)
        assert not tracker.due(tracker.next_attempt_s - 0.1)
        now_s = tracker.next_attempt_s
    assert delays == [10.0, 20.0, 40.0, 40.0, 40.0]
    assert tracker.succeeded(GOOD, now_s=now_s).next_attempt_s == now_s


@pytest.mark.parametrize(
    ("failed_at_s", "now_s", "published"),
    [
        pytest.param(30.0, 59.0, True, id="failure-within-the-grace-keeps-the-last-answer"),
        pytest.param(30.0, 60.0, True, id="grace-boundary"),
        pytest.param(30.0, 60.1, False, id="after-the-grace-unknown"),
    ],
)
def test_last_answer_kept_for_the_grace(failed_at_s: float, now_s: float, published: bool) -> None:
    tracker = AllocationTracker().succeeded(GOOD, now_s=0.0)
    tracker = tracker.failed("timeout", now_s=failed_at_s, policy=POLICY)
    assert (tracker.current(now_s, POLICY) is not None) is published


def test_never_answered_is_unknown() -> None:
    assert AllocationTracker().current(0.0, POLICY) is None


def test_log_lines_are_rate_limited_per_reason() -> None:
    tracker = AllocationTracker()
    assert tracker.log_due("refused", now_s=0.0, policy=POLICY)
    tracker = tracker.logged("refused", now_s=0.0)
    assert not tracker.log_due("refused", now_s=599.0, policy=POLICY)
    assert tracker.log_due("refused", now_s=600.0, policy=POLICY)
    assert tracker.log_due("timeout", now_s=1.0, policy=POLICY)  # a new reason: at once


def test_policy_rejects_negative_numbers() -> None:
    with pytest.raises(ValueError, match="keep_last_s"):
        AllocationPolicy(keep_last_s=-1.0)
