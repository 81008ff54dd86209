"""NvmlSource through the real pynvml wrappers, NVML faked below them (tests/agent/fake_nvml.py).

Each fault class NVML can produce has a named case: what the reading then says, and what the
aggregate then publishes.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pynvml  # type: ignore[import-untyped]
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.aggregate import aggregate
from agent.nvml import NvmlSource, error_kind
from agent.sources import SourceUnavailable, open_source
from gpu_contract.schema import Health
from tests.agent.fake_nvml import (
    DRIVER_NOT_LOADED,
    GPU_IS_LOST,
    NO_PERMISSION,
    NOT_SUPPORTED,
    TIMEOUT,
    UNINITIALIZED,
    UNKNOWN,
    FakeMigDevice,
    FakeMigProfile,
    FakeNvml,
    a100,
    fake_nvml_fixture,  # noqa: F401  (the fixture, by name)
    h100_mig_profiles,
)

NOW = datetime(2026, 11, 30, 12, 0, 0, tzinfo=UTC)


@pytest.fixture
def source(fake_nvml: FakeNvml) -> Iterator[NvmlSource]:
    opened = NvmlSource.open()
    yield opened
    opened.close()


def test_reads_every_field_through_pynvml(fake_nvml: FakeNvml, source: NvmlSource) -> None:
    fake_nvml.gpus[0].add_samples((1_000, 40), (2_000, 60))
    fake_nvml.gpus[0].memory_used_mib = 10_240
    fake_nvml.gpus[0].temperature_c = 61
    fake_nvml.gpus[1].utilization_rate_percent = 25  # no samples yet: the fallback answers

    reading = source.read(NOW)

    assert reading.device_count == 2
    assert reading.fatal is None
    assert reading.lost == ()
    first, second = reading.gpus
    assert first.uuid == "GPU-00000000-0000-0000-0000-000000000000"
    assert first.index == 0
    assert first.name == "NVIDIA A100-SXM4-80GB"
    assert first.utilization == pytest.approx(0.5)
    assert first.memory_total_mib == 81920
    # v2 memory info: reserved memory is neither free nor counted as used by a job.
    assert first.memory_free_mib == 81920 - 512 - 10_240
    assert first.temperature_c == 61
    assert first.mig_enabled is False
    assert first.problems == ()
    assert second.utilization == pytest.approx(0.25)
    assert reading.error_kinds == ()
    assert fake_nvml.calls["nvmlDeviceGetMemoryInfo_v2"] == 2


def test_each_tick_averages_exactly_the_samples_since_the_previous_tick(
    fake_nvml: FakeNvml, source: NvmlSource
) -> None:
    gpu = fake_nvml.gpus[0]
    gpu.add_samples((100, 10), (200, 30))
    assert source.read(NOW).gpus[0].utilization == pytest.approx(0.20)
    gpu.add_samples((300, 90), (400, 70), (500, 80))
    assert source.read(NOW + timedelta(seconds=5)).gpus[0].utilization == pytest.approx(0.80)
    gpu.add_samples((600, 0))
    assert source.read(NOW + timedelta(seconds=10)).gpus[0].utilization == pytest.approx(0.0)


def test_a_tick_without_new_samples_falls_back_to_the_current_rate(
    fake_nvml: FakeNvml, source: NvmlSource
) -> None:
    gpu = fake_nvml.gpus[0]
    gpu.add_samples((100, 90))
    gpu.utilization_rate_percent = 35
    assert source.read(NOW).gpus[0].utilization == pytest.approx(0.90)
    second = source.read(NOW + timedelta(seconds=1))
    assert second.gpus[0].utilization == pytest.approx(0.35)
    # "No new sample" is an answer, not an NVML error.
    assert second.error_kinds == ()


def test_samples_are_tracked_per_uuid_not_per_index(
    fake_nvml: FakeNvml, source: NvmlSource
) -> None:
    fake_nvml.gpus[0].add_samples((100, 20))
    fake_nvml.gpus[1].add_samples((100, 60))
    source.read(NOW)
    # The driver re-enumerates: the same GPUs come back at swapped indexes.
    fake_nvml.gpus.reverse()
    fake_nvml.gpus[0].add_samples((200, 100))  # was index 1
    reading = source.read(NOW + timedelta(seconds=5))
    by_uuid = {g.uuid: g for g in reading.gpus}
    assert by_uuid["GPU-00000001-0000-0000-0000-000000000000"].utilization == pytest.approx(1.0)
    assert by_uuid["GPU-00000001-0000-0000-0000-000000000000"].index == 0


@pytest.mark.parametrize(
    ("function", "code", "field", "problem", "kind"),
    [
        pytest.param(
            "nvmlDeviceGetTemperatureV",
            NOT_SUPPORTED,
            "temperature_c",
            "temperature not supported on gpu 1",
            "NotSupported",
            id="temperature-not-supported",
        ),
        pytest.param(
            "nvmlDeviceGetMemoryInfo_v2",
            NOT_SUPPORTED,
            "memory_free_mib",
            "memory not supported on gpu 1",
            "NotSupported",
            id="memory-not-supported",
        ),
        pytest.param(
            "nvmlDeviceGetName",
            NO_PERMISSION,
            "name",
            "name not permitted on gpu 1",
            "NoPermission",
            id="name-no-permission",
        ),
        pytest.param(
            "nvmlDeviceGetTemperatureV",
            TIMEOUT,
            "temperature_c",
            "temperature unreadable on gpu 1 (Timeout)",
            "Timeout",
            id="temperature-timeout",
        ),
        pytest.param(
            "nvmlDeviceGetMigMode",
            NO_PERMISSION,
            "mig_enabled",
            "mig mode not permitted on gpu 1",
            "NoPermission",
            id="mig-mode-no-permission",
        ),
    ],
)
def test_an_unreadable_field_is_none_with_a_problem(  # noqa: PLR0917
    fake_nvml: FakeNvml,
    source: NvmlSource,
    function: str,
    code: int,
    field: str,
    problem: str,
    kind: str,
) -> None:
    fake_nvml.gpus[1].faults[function] = code
    reading = source.read(NOW)
    healthy, faulty = reading.gpus
    assert getattr(faulty, field) is None
    assert faulty.problems == (problem,)
    assert healthy.problems == ()
    assert getattr(healthy, field) is not None
    assert reading.error_kinds == (kind,)
    state = aggregate(reading)
    assert state.health is Health.DEGRADED
    assert state.health_detail == problem


def test_utilization_unsupported_everywhere_is_omitted_not_zero(
    fake_nvml: FakeNvml, source: NvmlSource
) -> None:
    for gpu in fake_nvml.gpus:
        gpu.faults["nvmlDeviceGetSamples"] = NOT_SUPPORTED
        gpu.faults["nvmlDeviceGetUtilizationRates"] = NOT_SUPPORTED
    reading = source.read(NOW)
    assert [g.utilization for g in reading.gpus] == [None, None]
    state = aggregate(reading)
    assert state.utilization is None
    assert state.utilization_max is None
    assert state.health_detail == (
        "utilization not supported on gpu 0; utilization not supported on gpu 1"
    )


def test_samples_not_supported_uses_rates_and_stops_asking(
    fake_nvml: FakeNvml, source: NvmlSource
) -> None:
    gpu = fake_nvml.gpus[0]
    gpu.faults["nvmlDeviceGetSamples"] = NOT_SUPPORTED
    gpu.utilization_rate_percent = 70
    first = source.read(NOW)
    assert first.gpus[0].utilization == pytest.approx(0.70)
    assert first.gpus[0].problems == ()
    assert first.error_kinds == ("NotSupported",)
    second = source.read(NOW + timedelta(seconds=5))
    assert second.error_kinds == ()
    # GPU 1 has a sample buffer: asked on both ticks; GPU 0 only on the first.
    assert fake_nvml.calls["nvmlDeviceGetSamples"] == 2 + 2 - 1


def test_temperature_v_function_not_found_falls_back_to_the_deprecated_call(
    fake_nvml: FakeNvml, source: NvmlSource
) -> None:
    fake_nvml.missing_functions.add("nvmlDeviceGetTemperatureV")
    fake_nvml.gpus[0].temperature_c = 66
    first = source.read(NOW)
    assert [g.temperature_c for g in first.gpus] == [66, 40]
    assert all(g.problems == () for g in first.gpus)
    assert first.error_kinds == ("FunctionNotFound",)  # counted once, not per GPU or tick
    assert source.read(NOW + timedelta(seconds=5)).error_kinds == ()
    assert fake_nvml.calls["nvmlDeviceGetTemperature"] == 4
    assert aggregate(first).health is Health.OK


def test_temperature_with_neither_call_is_degraded(fake_nvml: FakeNvml, source: NvmlSource) -> None:
    fake_nvml.missing_functions.update({"nvmlDeviceGetTemperatureV", "nvmlDeviceGetTemperature"})
    reading = source.read(NOW)
    assert [g.temperature_c for g in reading.gpus] == [None, None]
    state = aggregate(reading)
    assert state.health is Health.DEGRADED
    assert state.temperature_c is None
    assert "temperature unreadable on gpu 0 (FunctionNotFound)" in (state.health_detail or "")


def test_memory_v2_missing_falls_back_to_v1(fake_nvml: FakeNvml, source: NvmlSource) -> None:
    fake_nvml.missing_functions.add("nvmlDeviceGetMemoryInfo_v2")
    fake_nvml.gpus[0].memory_used_mib = 1024
    reading = source.read(NOW)
    assert reading.gpus[0].memory_free_mib == 81920 - 512 - 1024
    assert reading.gpus[0].problems == ()
    assert reading.error_kinds == ("FunctionNotFound",)


@pytest.mark.parametrize(
    ("code", "reason"),
    [
        pytest.param(GPU_IS_LOST, "lost", id="gpu-is-lost"),
        pytest.param(UNKNOWN, "lost", id="unknown-error"),
        pytest.param(pynvml.NVML_ERROR_RESET_REQUIRED, "lost", id="reset-required"),
    ],
)
def test_a_gpu_lost_mid_run_is_reported_and_the_others_keep_reporting(
    fake_nvml: FakeNvml, source: NvmlSource, code: int, reason: str
) -> None:
    fake_nvml.gpus.append(a100(2))
    assert len(source.read(NOW).gpus) == 3
    # The device stops answering in the middle of being read (after its handle was obtained).
    fake_nvml.gpus[1].faults["nvmlDeviceGetMemoryInfo_v2"] = code
    reading = source.read(NOW + timedelta(seconds=5))
    assert [g.index for g in reading.gpus] == [0, 2]
    assert reading.lost == (f"gpu 1: {reason}",)
    assert reading.device_count == 3
    assert reading.error_kinds == (error_kind(pynvml.NVMLError(code)),)
    state = aggregate(reading)
    assert state.health is Health.DEGRADED
    assert state.health_detail == "gpu 1: lost"
    assert state.gpu_count == 3


def test_a_gpu_whose_handle_cannot_be_had_is_reported(
    fake_nvml: FakeNvml, source: NvmlSource
) -> None:
    fake_nvml.gpus[0].faults["nvmlDeviceGetHandleByIndex_v2"] = NO_PERMISSION
    reading = source.read(NOW)
    assert reading.lost == ("gpu 0: unreadable (NoPermission)",)
    assert [g.index for g in reading.gpus] == [1]


def test_every_gpu_lost_is_unavailable(fake_nvml: FakeNvml, source: NvmlSource) -> None:
    for gpu in fake_nvml.gpus:
        gpu.lost = True
    reading = source.read(NOW)
    assert reading.gpus == ()
    assert reading.lost == ("gpu 0: lost", "gpu 1: lost")
    assert reading.error_kinds == ("GpuIsLost", "GpuIsLost")
    state = aggregate(reading)
    assert state.health is Health.UNAVAILABLE
    assert state.gpu_count == 2
    assert state.utilization is None


@pytest.mark.parametrize(
    ("code", "kind"),
    [
        pytest.param(UNINITIALIZED, "Uninitialized", id="uninitialized"),
        pytest.param(DRIVER_NOT_LOADED, "DriverNotLoaded", id="driver-unloaded"),
        pytest.param(
            pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH, "LibRmVersionMismatch", id="rm-mismatch"
        ),
    ],
)
def test_nvml_failing_as_a_whole_mid_run_is_fatal_then_recovers(
    fake_nvml: FakeNvml, source: NvmlSource, code: int, kind: str
) -> None:
    fake_nvml.global_error = code
    reading = source.read(NOW)
    assert reading.fatal == str(pynvml.NVMLError(code))
    assert reading.gpus == ()
    assert reading.error_kinds == (kind,)
    state = aggregate(reading)
    assert state.health is Health.UNAVAILABLE
    assert state.health_detail == f"nvml: {reading.fatal}"
    # Still down on the next tick: NVML is initialised again, and that fails too.
    still_down = source.read(NOW + timedelta(seconds=1))
    assert still_down.fatal is not None
    assert still_down.error_kinds == (kind,)
    # The driver comes back: the next tick initialises NVML again and reads normally.
    fake_nvml.global_error = None
    recovered = source.read(NOW + timedelta(seconds=5))
    assert recovered.fatal is None
    assert len(recovered.gpus) == 2
    assert fake_nvml.calls["nvmlInitWithFlags"] == 3
    source.close()
    assert fake_nvml.initialized == 0


def test_device_count_failing_is_fatal(fake_nvml: FakeNvml, source: NvmlSource) -> None:
    fake_nvml.missing_functions.add("nvmlDeviceGetCount_v2")
    reading = source.read(NOW)
    assert reading.fatal == "device count failed: Function Not Found"
    assert reading.error_kinds == ("FunctionNotFound",)
    assert aggregate(reading).health is Health.UNAVAILABLE


def test_no_gpus_is_unavailable_not_an_error(fake_nvml: FakeNvml, source: NvmlSource) -> None:
    fake_nvml.gpus.clear()
    reading = source.read(NOW)
    assert reading.fatal is None
    assert reading.device_count == 0
    state = aggregate(reading)
    assert state.health is Health.UNAVAILABLE
    assert state.health_detail == "no gpus reported"
    assert state.gpu_count == 0


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        pytest.param("library", "NVML library (libnvidia-ml.so.1) not found", id="library-missing"),
        pytest.param("driver", "NVIDIA driver not loaded", id="driver-not-loaded"),
        pytest.param("permission", "no permission to open NVML", id="no-permission"),
        pytest.param("other", "cannot initialise NVML (Unknown", id="other-init-error"),
    ],
)
def test_open_fails_with_one_clear_message(fake_nvml: FakeNvml, setup: str, message: str) -> None:
    if setup == "library":
        fake_nvml.make_library_missing()
    else:
        fake_nvml.init_error = {
            "driver": DRIVER_NOT_LOADED,
            "permission": NO_PERMISSION,
            "other": UNKNOWN,
        }[setup]
    with pytest.raises(SourceUnavailable) as raised:
        open_source("nvml")
    text = str(raised.value)
    assert text.startswith(message)
    assert "\n" not in text
    assert "--source simulated" in text
    assert isinstance(raised.value.__cause__, pynvml.NVMLError)


def test_close_shuts_nvml_down_once(fake_nvml: FakeNvml) -> None:
    opened = open_source("nvml")
    assert fake_nvml.initialized == 1
    opened.close()
    opened.close()
    assert fake_nvml.initialized == 0
    assert fake_nvml.calls["nvmlShutdown"] == 1
    reading = opened.read(NOW)
    assert reading.fatal == "source closed"


def test_mig_gpu_counts_free_instance_capacity(fake_nvml: FakeNvml, source: NvmlSource) -> None:
    mig = fake_nvml.gpus[1]
    mig.name = "NVIDIA H100 80GB HBM3"
    mig.mig_mode = pynvml.NVML_DEVICE_MIG_ENABLE
    # A 3g.40gb instance exists (4 of 8 memory slices); 1 GiB of it is in use.
    mig.mig_profiles = h100_mig_profiles(one=4, two=2, three=1, four=0, seven=0)
    mig.mig_devices = {0: FakeMigDevice(memory_total_mib=40192, memory_used_mib=1024)}
    # Raw free memory of the parent, which MIG makes meaningless for placement.
    mig.memory_used_mib = 41216

    reading = source.read(NOW)
    gpu = reading.gpus[1]
    assert gpu.mig_enabled is True
    # Unpartitioned: best of 4 x 9856 (1g), 2 x 20096 (2g), 1 x 40192 (3g) = 40192 MiB;
    # plus the free memory inside the existing instance: 40192 - 1024.
    assert gpu.memory_free_mib == 40192 + (40192 - 1024)
    # One pod gets one MIG device: at most a new 3g.40gb instance, not the 79 GiB sum.
    assert gpu.memory_largest_allocation_mib == 40192
    assert reading.gpus[0].memory_largest_allocation_mib == reading.gpus[0].memory_free_mib
    assert gpu.problems == ()
    assert reading.error_kinds == ()
    # Profiles are read once while MIG stays on; remaining capacity every tick.
    source.read(NOW + timedelta(seconds=5))
    profile_count = pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT
    assert fake_nvml.calls["nvmlDeviceGetGpuInstanceProfileInfoV"] == profile_count
    assert fake_nvml.calls["nvmlDeviceGetGpuInstanceRemainingCapacity"] == 2 * 5
    # The kubelet names MIG devices by their own UUIDs; the reading says whose they are.
    assert gpu.mig_device_uuids == ("MIG-1-0-fake",)
    assert reading.gpus[0].mig_device_uuids == ()


def _mig_gpu(fake_nvml: FakeNvml, devices: dict[int, FakeMigDevice]) -> None:
    mig = fake_nvml.gpus[1]
    mig.mig_mode = pynvml.NVML_DEVICE_MIG_ENABLE
    mig.mig_profiles = h100_mig_profiles(one=0, two=0, three=0, four=0, seven=0)
    mig.mig_devices = devices


def test_mig_device_uuids_are_read_once_per_device(fake_nvml: FakeNvml, source: NvmlSource) -> None:
    _mig_gpu(
        fake_nvml,
        {
            0: FakeMigDevice(40192, 0, uuid="MIG-aaaa"),
            4: FakeMigDevice(20096, 0, uuid="MIG-bbbb"),
        },
    )
    for tick in range(3):
        reading = source.read(NOW + timedelta(seconds=5 * tick))
        assert reading.gpus[1].mig_device_uuids == ("MIG-aaaa", "MIG-bbbb")
    # Two GPU UUIDs per tick, and each MIG device's once: not one NVML call per device per tick.
    assert fake_nvml.calls["nvmlDeviceGetUUID"] == 3 * 2 + 2

    # A device destroyed (slot 4 empty) and another created in slot 0 with a new size: new UUID.
    fake_nvml.gpus[1].mig_devices = {0: FakeMigDevice(9856, 0, uuid="MIG-cccc")}
    assert source.read(NOW + timedelta(seconds=15)).gpus[1].mig_device_uuids == ("MIG-cccc",)


def test_mig_device_uuids_are_read_again_every_minute(
    fake_nvml: FakeNvml, source: NvmlSource
) -> None:
    _mig_gpu(fake_nvml, {0: FakeMigDevice(40192, 0, uuid="MIG-aaaa")})
    source.read(NOW)
    # Re-created between two ticks with the same profile: same slot, same size, new UUID.
    fake_nvml.gpus[1].mig_devices = {0: FakeMigDevice(40192, 0, uuid="MIG-dddd")}
    seen = [
        source.read(NOW + timedelta(seconds=5 * tick)).gpus[1].mig_device_uuids
        for tick in range(1, 13)
    ]
    assert seen[0] == ("MIG-aaaa",)  # cached: the change is not visible at once
    assert seen[-1] == ("MIG-dddd",)  # but within 12 reads (a minute at 5 s)


def test_unreadable_mig_uuid_keeps_the_memory_reading(
    fake_nvml: FakeNvml, source: NvmlSource
) -> None:
    _mig_gpu(fake_nvml, {0: FakeMigDevice(40192, 1024)})
    fake_nvml.gpus[1].mig_faults["nvmlDeviceGetUUID"] = NOT_SUPPORTED
    gpu = source.read(NOW).gpus[1]
    assert gpu.mig_device_uuids == ()
    assert gpu.memory_largest_allocation_mib == 40192 - 1024
    assert gpu.problems == ("mig uuid not supported on gpu 1",)


@pytest.mark.parametrize(
    ("profiles", "devices", "free_mib", "largest_mib"),
    [
        pytest.param(
            h100_mig_profiles(),
            {},
            80384,
            80384,
            id="no-instance-yet-whole-gpu-creatable",
        ),
        pytest.param(
            h100_mig_profiles(one=0, two=0, three=0, four=0, seven=0),
            {slot: FakeMigDevice(memory_total_mib=9856, memory_used_mib=0) for slot in range(7)},
            7 * 9856,
            9856,
            id="seven-idle-1g-devices-largest-is-one-device",
        ),
        pytest.param(
            h100_mig_profiles(one=3, two=1, three=1, four=0, seven=0),
            {0: FakeMigDevice(memory_total_mib=40192, memory_used_mib=30000)},
            40192 + (40192 - 30000),
            40192,
            id="busy-instance-smaller-than-a-creatable-one",
        ),
        pytest.param(
            h100_mig_profiles(one=2, two=1, three=0, four=0, seven=0),
            {
                0: FakeMigDevice(memory_total_mib=40192, memory_used_mib=2048),
                1: FakeMigDevice(memory_total_mib=9856, memory_used_mib=0),
            },
            20096 + (40192 - 2048) + 9856,
            40192 - 2048,
            id="existing-instance-beats-creatable-profiles",
        ),
        pytest.param(
            h100_mig_profiles(one=0, two=0, three=0, four=0, seven=0),
            {0: FakeMigDevice(memory_total_mib=80384, memory_used_mib=80384)},
            0,
            0,
            id="full-7g-instance-nothing-fits",
        ),
    ],
)
def test_mig_largest_allocation_is_one_device_not_the_sum(
    *,
    fake_nvml: FakeNvml,
    source: NvmlSource,
    profiles: list[FakeMigProfile],
    devices: dict[int, FakeMigDevice],
    free_mib: int,
    largest_mib: int,
) -> None:
    for gpu in fake_nvml.gpus:
        gpu.name = "NVIDIA H100 80GB HBM3"
        gpu.mig_mode = pynvml.NVML_DEVICE_MIG_ENABLE
        gpu.mig_profiles = [replace(p) for p in profiles]
        gpu.mig_devices = dict(devices)
    reading = source.read(NOW)
    assert [(g.memory_free_mib, g.memory_largest_allocation_mib) for g in reading.gpus] == [
        (free_mib, largest_mib)
    ] * 2
    state = aggregate(reading)
    assert state.memory_free_mib == 2 * free_mib
    # The node's biggest single request is one GPU's largest allocation, never a sum.
    assert state.memory_largest_free_mib == largest_mib
    expected = 0.0 if free_mib == 0 else 1 - largest_mib / (2 * free_mib)
    assert state.memory_fragmentation == pytest.approx(expected)


def test_mig_and_plain_gpus_on_one_node(fake_nvml: FakeNvml, source: NvmlSource) -> None:
    plain, mig = fake_nvml.gpus
    plain.memory_used_mib = 81920 - 512 - 30_000  # 30 000 MiB free in one block
    mig.name = "NVIDIA H100 80GB HBM3"
    mig.mig_mode = pynvml.NVML_DEVICE_MIG_ENABLE
    mig.mig_profiles = h100_mig_profiles(one=0, two=0, three=0, four=0, seven=0)
    mig.mig_devices = {s: FakeMigDevice(memory_total_mib=9856, memory_used_mib=0) for s in range(7)}
    state = aggregate(source.read(NOW))
    assert state.memory_free_mib == 30_000 + 7 * 9856
    # 69 GiB free on the MIG GPU, but one request fits in 9856 MiB there: the plain GPU wins.
    assert state.memory_largest_free_mib == 30_000
    assert state.gpu_model == "mixed"


def test_mig_capacity_unreadable_is_degraded_not_raw_memory(
    fake_nvml: FakeNvml, source: NvmlSource
) -> None:
    mig = fake_nvml.gpus[0]
    mig.mig_mode = pynvml.NVML_DEVICE_MIG_ENABLE
    mig.mig_profiles = h100_mig_profiles()
    mig.faults["nvmlDeviceGetMaxMigDeviceCount"] = NO_PERMISSION
    reading = source.read(NOW)
    assert reading.gpus[0].memory_free_mib is None
    assert reading.gpus[0].memory_largest_allocation_mib is None
    assert reading.gpus[0].problems == ("mig capacity not permitted on gpu 0",)
    # The other GPU alone answers for the node's memory.
    assert aggregate(reading).memory_largest_free_mib == reading.gpus[1].memory_free_mib


def test_gpu_without_mig_support_is_not_a_fault(fake_nvml: FakeNvml, source: NvmlSource) -> None:
    fake_nvml.gpus[0].faults["nvmlDeviceGetMigMode"] = NOT_SUPPORTED
    reading = source.read(NOW)
    assert reading.gpus[0].mig_enabled is False
    assert reading.gpus[0].problems == ()
    assert aggregate(reading).health is Health.OK


def test_error_kind_names_every_nvml_error_class() -> None:
    assert error_kind(pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)) == "GpuIsLost"
    assert error_kind(pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)) == "FunctionNotFound"
    assert error_kind(pynvml.NVMLError(12345)) == "Error12345"


def test_a_transient_samples_error_uses_the_rate_once_then_retries(
    fake_nvml: FakeNvml, source: NvmlSource
) -> None:
    gpu = fake_nvml.gpus[0]
    gpu.faults["nvmlDeviceGetSamples"] = TIMEOUT
    gpu.utilization_rate_percent = 15
    gpu.add_samples((100, 80))
    first = source.read(NOW)
    assert first.gpus[0].utilization == pytest.approx(0.15)
    assert first.gpus[0].problems == ()
    assert first.error_kinds == ("Timeout",)
    del gpu.faults["nvmlDeviceGetSamples"]
    assert source.read(NOW + timedelta(seconds=5)).gpus[0].utilization == pytest.approx(0.80)


_FAULTABLE = (
    "nvmlDeviceGetHandleByIndex_v2",
    "nvmlDeviceGetUUID",
    "nvmlDeviceGetName",
    "nvmlDeviceGetSamples",
    "nvmlDeviceGetUtilizationRates",
    "nvmlDeviceGetMemoryInfo_v2",
    "nvmlDeviceGetTemperatureV",
    "nvmlDeviceGetMigMode",
)
_CODES = (NOT_SUPPORTED, NO_PERMISSION, TIMEOUT, GPU_IS_LOST, UNKNOWN, UNINITIALIZED)


@given(
    faults=st.lists(
        st.dictionaries(st.sampled_from(_FAULTABLE), st.sampled_from(_CODES), max_size=3),
        min_size=0,
        max_size=4,
    ),
    missing=st.sets(st.sampled_from(("nvmlDeviceGetTemperatureV", "nvmlDeviceGetSamples"))),
)
@settings(max_examples=60, deadline=None)
def test_any_mix_of_faults_gives_a_consistent_reading(
    faults: list[dict[str, int]], missing: set[str]
) -> None:
    with pytest.MonkeyPatch.context() as monkeypatch:
        fake = FakeNvml(
            [a100(i, faults=f, utilization_rate_percent=10) for i, f in enumerate(faults)]
        ).install(monkeypatch)
        fake.missing_functions |= missing
        opened = NvmlSource.open()
        try:
            reading = opened.read(NOW)
        finally:
            opened.close()
        state = aggregate(reading)
        if reading.fatal is not None:
            assert state.health is Health.UNAVAILABLE
            assert any(UNINITIALIZED in f.values() for f in faults)
            return
        assert len(reading.gpus) + len(reading.lost) == reading.device_count == len(faults)
        lost_indexes = {int(line.split()[1].rstrip(":")) for line in reading.lost}
        for index in lost_indexes:
            assert {GPU_IS_LOST, UNKNOWN, NO_PERMISSION, NOT_SUPPORTED, TIMEOUT} & set(
                faults[index].values()
            )
        for gpu in reading.gpus:
            if not faults[gpu.index] and not missing:
                assert gpu.problems == ()
                assert gpu.temperature_c == 40
            # A fault on a function the library lacks is never reached.
            reached = {c for name, c in faults[gpu.index].items() if name not in missing}
            assert not {GPU_IS_LOST, UNKNOWN} & reached
        if not any(faults) and not missing:
            assert reading.error_kinds == ()
        if not reading.gpus:
            assert state.health is Health.UNAVAILABLE
        elif reading.lost or any(g.problems for g in reading.gpus):
            assert state.health is Health.DEGRADED
        else:
            assert state.health is Health.OK
