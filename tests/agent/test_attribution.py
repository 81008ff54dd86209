"""Who uses each GPU: named cases for exclusive, time-sliced and MIG GPUs and every data fault."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime

import pytest

from agent.aggregate import aggregate
from agent.attribution import Attribution, pod_usage, shared_gpus
from agent.records import (
    DeviceAllocations,
    GpuProcesses,
    GpuReading,
    NodeReading,
    PodDevices,
    ProcessOwner,
)
from gpu_contract.podusage import GpuShare, PodUsage

T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


def gpu(
    index: int,
    *,
    utilization: float | None = 0.60,
    free: int | None = 61_920,
    mig: bool = False,
    migs: tuple[str, ...] = (),
    processes: GpuProcesses | None = None,
) -> GpuReading:
    return GpuReading(
        uuid=f"GPU-{index}",
        index=index,
        name="NVIDIA A100-SXM4-80GB",
        utilization=utilization,
        memory_total_mib=81_920,
        memory_free_mib=free,
        temperature_c=50,
        mig_enabled=mig,
        mig_device_uuids=migs,
        processes=processes,
    )


def held(**pods: set[str]) -> DeviceAllocations:
    """`held(a={"GPU-0"})`: pod `ns/a` holds those device IDs (every ID allocatable)."""
    entries = tuple(PodDevices(f"ns/{name}", frozenset(ids)) for name, ids in sorted(pods.items()))
    every = frozenset(i for e in entries for i in e.device_ids)
    return DeviceAllocations(every, every, entries)


def owned(**pids: str | int) -> dict[int, ProcessOwner]:
    """`owned(p10="a", p11="no-pod")`: pid 10 is pod ns/a's, pid 11 has outcome no-pod."""
    out: dict[int, ProcessOwner] = {}
    for key, value in pids.items():
        pid = int(key.removeprefix("p"))
        name = str(value)
        out[pid] = (
            ProcessOwner(f"ns/{name}", "pod")
            if name not in {"no-pod", "vanished", "unreadable", "unnamed"}
            else ProcessOwner(None, name)
        )
    return out


TIME_SLICED = held(a={"GPU-0::0"}, b={"GPU-0::1"})
BOTH_BUSY = GpuProcesses(
    memory_used_mib=((10, 8_000), (20, 12_000)), sm_busy=((10, 300.0), (20, 100.0))
)


def shares(result: Attribution) -> dict[str, tuple[tuple[int, float | None, int | None], ...]]:
    return {
        p.pod: tuple(
            (
                s.gpu_index,
                None if s.utilization is None else round(s.utilization, 4),
                s.memory_used_mib,
            )
            for s in p.gpus
        )
        for p in result.pods
    }


@pytest.mark.parametrize(
    ("gpus", "allocations", "owners", "expected", "outcomes"),
    [
        pytest.param(
            [gpu(0), gpu(1)],
            held(a={"GPU-0"}),
            None,
            {"ns/a": ((0, 0.6, 20_000),)},
            {"whole-gpu": 1},
            id="exclusive-whole-gpu-needs-no-processes",
        ),
        pytest.param(
            [gpu(0), gpu(1, utilization=0.9, free=1_920)],
            held(a={"GPU-0", "GPU-1"}),
            None,
            {"ns/a": ((0, 0.6, 20_000), (1, 0.9, 80_000))},
            {"whole-gpu": 2},
            id="exclusive-two-gpus",
        ),
        pytest.param(
            [gpu(0)],
            held(a={"GPU-0::3"}),
            None,
            {"ns/a": ((0, 0.6, 20_000),)},
            {"whole-gpu": 1},
            id="only-pod-on-a-time-sliced-gpu-is-alone",
        ),
        pytest.param(
            [gpu(0, utilization=None, free=None)],
            held(a={"GPU-0"}),
            None,
            {"ns/a": ((0, None, None),)},
            {"whole-gpu": 1},
            id="exclusive-gpu-with-unmeasured-fields",
        ),
        pytest.param(
            [gpu(0, processes=BOTH_BUSY)],
            TIME_SLICED,
            None,
            {"ns/a": ((0, None, None),), "ns/b": ((0, None, None),)},
            {"no-host-processes": 2},
            id="shared-without-host-processes-is-unknown",
        ),
        pytest.param(
            [gpu(0, processes=BOTH_BUSY)],
            TIME_SLICED,
            owned(p10="a", p20="b"),
            {"ns/a": ((0, 0.45, 8_000),), "ns/b": ((0, 0.15, 12_000),)},
            {"processes": 2},
            id="shared-split-by-sm-samples",
        ),
        pytest.param(
            [
                gpu(
                    0,
                    processes=GpuProcesses(
                        ((10, 8_000), (11, 1_000), (30, 500)),
                        ((10, 100.0), (11, 100.0), (30, 200.0)),
                    ),
                )
            ],
            TIME_SLICED,
            owned(p10="a", p11="a", p30="no-pod"),
            {"ns/a": ((0, 0.3, 9_000),), "ns/b": ((0, 0.0, 0),)},
            {"processes": 2},
            id="a-process-of-no-pod-keeps-its-part-and-an-idle-pod-is-zero",
        ),
        pytest.param(
            [gpu(0, processes=GpuProcesses(((10, 8_000), (20, 2_000)), ()))],
            TIME_SLICED,
            owned(p10="a", p20="b"),
            {"ns/a": ((0, 0.0, 8_000),), "ns/b": ((0, 0.0, 2_000),)},
            {"processes": 2},
            id="no-samples-in-the-window-is-no-sm-time",
        ),
        pytest.param(
            [gpu(0, processes=GpuProcesses(None, ((10, 50.0),)))],
            TIME_SLICED,
            owned(p10="a"),
            {"ns/a": ((0, 0.6, None),), "ns/b": ((0, 0.0, None),)},
            {"no-process-data": 2},
            id="process-list-unreadable",
        ),
        pytest.param(
            [gpu(0, processes=GpuProcesses(((10, 8_000),), None))],
            TIME_SLICED,
            owned(p10="a"),
            {"ns/a": ((0, None, 8_000),), "ns/b": ((0, None, 0),)},
            {"no-process-data": 2},
            id="samples-unreadable",
        ),
        pytest.param(
            [gpu(0)],
            TIME_SLICED,
            owned(),
            {"ns/a": ((0, None, None),), "ns/b": ((0, None, None),)},
            {"no-process-data": 2},
            id="processes-not-read",
        ),
        pytest.param(
            [gpu(0, processes=GpuProcesses(((10, None), (20, 100)), ((10, 1.0), (20, 1.0))))],
            TIME_SLICED,
            owned(p10="a", p20="b"),
            {"ns/a": ((0, 0.3, None),), "ns/b": ((0, 0.3, 100),)},
            {"processes": 1, "no-process-data": 1},
            id="a-process-without-a-memory-figure-makes-its-pods-memory-unknown",
        ),
        pytest.param(
            [gpu(0, processes=BOTH_BUSY)],
            TIME_SLICED,
            owned(p10="a", p20="vanished"),
            {"ns/a": ((0, 0.45, 8_000),), "ns/b": ((0, 0.0, 0),)},
            {"processes": 2},
            id="a-vanished-process-is-nobodys",
        ),
        pytest.param(
            [gpu(0, processes=BOTH_BUSY)],
            TIME_SLICED,
            owned(p10="a", p20="elsewhere"),
            {"ns/a": ((0, 0.45, 8_000),), "ns/b": ((0, 0.0, 0),)},
            {"processes": 2},
            id="a-process-of-a-pod-not-holding-the-gpu-is-nobodys",
        ),
        pytest.param(
            [gpu(0, utilization=None, mig=True, migs=("MIG-x",), processes=BOTH_BUSY)],
            held(a={"MIG-x"}),
            owned(p10="a", p20="b"),
            {"ns/a": ((0, None, 8_000),)},
            {"no-process-data": 1},
            id="mig-gpu-never-whole-gpu",
        ),
        pytest.param(
            [gpu(0)],
            held(a={"nvidia.com/foo-0"}, b={"cpu-1"}),
            None,
            {},
            {},
            id="devices-of-other-resources-ignored",
        ),
    ],
)
def test_pod_usage(
    gpus: list[GpuReading],
    allocations: DeviceAllocations,
    owners: dict[int, ProcessOwner] | None,
    expected: dict[str, tuple[tuple[int, float | None, int | None], ...]],
    outcomes: dict[str, int],
) -> None:
    result = pod_usage(gpus, allocations, owners)
    assert shares(result) == expected
    assert result.outcomes == Counter(outcomes)


def test_process_owners_are_counted_by_outcome() -> None:
    processes = GpuProcesses(((10, 1), (20, 1), (30, 1), (40, 1)), ((50, 1.0),))
    result = pod_usage(
        [gpu(0, processes=processes)],
        TIME_SLICED,
        owned(p10="a", p20="elsewhere", p30="no-pod", p40="unreadable"),
    )
    # pid 50 appears in the samples only and was never resolved: it counts as vanished.
    assert result.owners == Counter(
        {"pod": 1, "other-pod": 1, "no-pod": 1, "unreadable": 1, "vanished": 1}
    )


def test_shares_of_the_pods_add_up_to_the_gpu() -> None:
    result = pod_usage([gpu(0, processes=BOTH_BUSY)], TIME_SLICED, owned(p10="a", p20="b"))
    total = sum(s.utilization or 0.0 for p in result.pods for s in p.gpus)
    assert total == pytest.approx(0.60)


def test_no_allocations_no_pods() -> None:
    assert pod_usage([gpu(0)], None, None) == Attribution(())


def test_shared_gpus_are_those_needing_processes() -> None:
    gpus = [gpu(0), gpu(1), gpu(2, mig=True, migs=("MIG-z",))]
    allocations = held(a={"GPU-0::0", "GPU-1"}, b={"GPU-0::1"}, c={"MIG-z"})
    assert shared_gpus(gpus, allocations) == {0, 2}
    assert shared_gpus(gpus, None) == set()


def test_aggregate_publishes_the_pods() -> None:
    reading = NodeReading(
        sampled_at=T0, gpus=(gpu(0), gpu(1)), device_count=2, allocations=held(a={"GPU-1"})
    )
    assert aggregate(reading).pods == (PodUsage("ns/a", (GpuShare(1, 0.6, 20_000),)),)
