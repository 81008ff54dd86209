"""Per-process memory and utilization through the real pynvml wrappers, NVML faked below them.

One named case per answer NVML can give: processes listed, none, a figure not available, samples
since the last tick, no sample (NotFound), pynvml's success-raised-as-error, not supported, a
failing call. None of them degrades the GPU; each leaves a defined part unknown.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime

import pytest

from agent.nvml import NvmlSource
from agent.records import GpuProcesses
from tests.agent.fake_nvml import (
    NO_PERMISSION,
    NOT_SUPPORTED,
    SUCCESS,
    TIMEOUT,
    FakeNvml,
    FakeProcess,
    a100,
)

NOW = datetime(2026, 11, 30, 12, 0, 0, tzinfo=UTC)


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeNvml:
    return FakeNvml([a100(0)]).install(monkeypatch)


@pytest.fixture
def source(fake: FakeNvml) -> Iterator[NvmlSource]:
    opened = NvmlSource.open(processes=True)
    yield opened
    opened.close()


def _processes(source: NvmlSource) -> GpuProcesses | None:
    reading = source.read(NOW)
    assert not reading.gpus[0].problems  # never a reason to call the GPU degraded
    return reading.gpus[0].processes


def test_processes_off_reads_none(fake: FakeNvml) -> None:
    fake.gpus[0].processes = [FakeProcess(10, 1024)]
    source = NvmlSource.open()
    try:
        assert source.read(NOW).gpus[0].processes is None
    finally:
        source.close()
    assert fake.calls["nvmlDeviceGetComputeRunningProcesses_v3"] == 0


@pytest.mark.parametrize(
    ("processes", "faults", "expected"),
    [
        pytest.param([], {}, (), id="no-process"),
        pytest.param(
            [FakeProcess(10, 8192), FakeProcess(20, 1024)],
            {},
            ((10, 8192), (20, 1024)),
            id="compute-processes",
        ),
        pytest.param(
            [FakeProcess(10, 8192), FakeProcess(30, 512, graphics=True)],
            {},
            ((10, 8192), (30, 512)),
            id="compute-and-graphics",
        ),
        pytest.param(
            [FakeProcess(10, 8192), FakeProcess(10, 8192, graphics=True)],
            {},
            ((10, 8192),),
            id="one-process-in-both-lists-counted-once",
        ),
        pytest.param([FakeProcess(10, None)], {}, ((10, None),), id="figure-not-available"),
        pytest.param(
            [FakeProcess(10, 8192)],
            {"nvmlDeviceGetGraphicsRunningProcesses_v3": NOT_SUPPORTED},
            ((10, 8192),),
            id="no-graphics-list-on-a-compute-gpu",
        ),
        pytest.param(
            [FakeProcess(10, 8192)],
            {"nvmlDeviceGetComputeRunningProcesses_v3": NO_PERMISSION},
            None,
            id="compute-list-refused",
        ),
        pytest.param(
            [FakeProcess(10, 8192)],
            {"nvmlDeviceGetGraphicsRunningProcesses_v3": TIMEOUT},
            None,
            id="graphics-list-failing",
        ),
    ],
)
def test_process_memory(
    fake: FakeNvml,
    source: NvmlSource,
    processes: list[FakeProcess],
    faults: dict[str, int],
    expected: tuple[tuple[int, int | None], ...] | None,
) -> None:
    fake.gpus[0].processes = processes
    fake.gpus[0].faults.update(faults)
    found = _processes(source)
    assert found is not None
    assert found.memory_used_mib == expected


def test_process_samples_are_summed_over_the_window(fake: FakeNvml, source: NvmlSource) -> None:
    gpu = fake.gpus[0]
    gpu.process_samples = [(10, 1_000, 40), (20, 1_000, 20), (10, 2_000, 60)]
    first = _processes(source)
    assert first is not None
    assert first.sm_busy == ((10, 100.0), (20, 20.0))
    # The next tick reads only what came after the newest sample seen.
    gpu.process_samples.append((20, 3_000, 30))
    second = _processes(source)
    assert second is not None
    assert second.sm_busy == ((20, 30.0),)
    # Nothing new: NotFound is an answer (no process busy), not unknown.
    third = _processes(source)
    assert third is not None
    assert third.sm_busy == ()


@pytest.mark.parametrize(
    ("setup", "expected", "asks_again"),
    [
        pytest.param(
            {"process_sizing_status": SUCCESS}, (), True, id="success-raised-by-pynvml-is-none"
        ),
        pytest.param(
            {"faults": {"nvmlDeviceGetProcessUtilization": NOT_SUPPORTED}},
            None,
            False,
            id="not-supported-stops-asking",
        ),
        pytest.param(
            {"faults": {"nvmlDeviceGetProcessUtilization": TIMEOUT}},
            None,
            True,
            id="failing-call-unknown-this-tick",
        ),
    ],
)
def test_process_sample_faults(
    fake: FakeNvml,
    source: NvmlSource,
    setup: dict[str, object],
    expected: tuple[tuple[int, float], ...] | None,
    asks_again: bool,
) -> None:
    gpu = fake.gpus[0]
    gpu.process_samples = [(10, 1_000, 40)]
    for name, value in setup.items():
        if name == "faults":
            assert isinstance(value, dict)
            gpu.faults.update(value)
        else:
            setattr(gpu, name, value)
    found = _processes(source)
    assert found is not None
    assert found.sm_busy == expected
    before = fake.calls["nvmlDeviceGetProcessUtilization"]
    source.read(NOW)
    assert (fake.calls["nvmlDeviceGetProcessUtilization"] > before) is asks_again


def test_missing_function_is_counted_once(fake: FakeNvml, source: NvmlSource) -> None:
    fake.missing_functions.add("nvmlDeviceGetProcessUtilization")
    first = source.read(NOW)
    second = source.read(NOW)
    assert first.gpus[0].processes is not None
    assert first.gpus[0].processes.sm_busy is None
    assert "FunctionNotFound" in first.error_kinds
    assert "FunctionNotFound" not in second.error_kinds
