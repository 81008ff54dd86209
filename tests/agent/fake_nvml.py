# ruff: noqa: N802, PLR0917  (methods are named and shaped like the C symbols they fake)
"""A fake libnvidia-ml *below* pynvml, so tests run the real pynvml wrappers without a GPU.

pynvml resolves every C symbol through `pynvml._nvmlGetFunctionPointer(name)` and loads the
library into `pynvml.nvmlLib` on first `nvmlInit`. `FakeNvml.install` replaces the lookup with one
that returns Python functions with the C signatures: they receive the same ctypes objects pynvml
passes (`byref(...)` pointers, string buffers, sample arrays), fill them, and return NVML status
codes, which pynvml turns into its own `NVMLError_*` exceptions. Setting `nvmlLib` skips the
library load; `library_missing=True` instead makes the real load fail as it does on a node without
the driver.

Device handles are opaque pointers whose address encodes the GPU (and MIG slot), exactly what
real handles are to pynvml: values it passes back untouched.

Use the `fake_nvml` fixture (`from tests.agent.fake_nvml import fake_nvml_fixture`) or
`FakeNvml(...).install(monkeypatch)`.
"""

from __future__ import annotations

import ctypes
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pynvml  # type: ignore[import-untyped]
import pytest

MIB = 1024 * 1024
_GPU_HANDLE_BASE = 0x10_000
_MIG_HANDLE_BASE = 0x20_000
_MIG_SLOTS_PER_GPU = 16

# Error codes by the names NVML uses, for readable test tables.
NOT_SUPPORTED: int = pynvml.NVML_ERROR_NOT_SUPPORTED
NO_PERMISSION: int = pynvml.NVML_ERROR_NO_PERMISSION
NOT_FOUND: int = pynvml.NVML_ERROR_NOT_FOUND
GPU_IS_LOST: int = pynvml.NVML_ERROR_GPU_IS_LOST
UNKNOWN: int = pynvml.NVML_ERROR_UNKNOWN
UNINITIALIZED: int = pynvml.NVML_ERROR_UNINITIALIZED
DRIVER_NOT_LOADED: int = pynvml.NVML_ERROR_DRIVER_NOT_LOADED
TIMEOUT: int = pynvml.NVML_ERROR_TIMEOUT
INVALID_ARGUMENT: int = pynvml.NVML_ERROR_INVALID_ARGUMENT
SUCCESS: int = pynvml.NVML_SUCCESS
VERSION_MISMATCH: int = pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH


@dataclass
class FakeMigProfile:
    """One GPU instance profile: `profile` is the NVML_GPU_INSTANCE_PROFILE_* enum value."""

    profile: int
    profile_id: int
    memory_mib: int
    remaining: int


@dataclass
class FakeMigDevice:
    memory_total_mib: int
    memory_used_mib: int
    # Empty: `MIG-<gpu index>-<slot>-fake`, unique per device.
    uuid: str = ""


@dataclass
class FakeProcess:
    """A process on a GPU: `used_memory_mib` None is NVML_VALUE_NOT_AVAILABLE (no figure)."""

    pid: int
    used_memory_mib: int | None = 0
    graphics: bool = False


@dataclass
class FakeGpu:
    """One GPU as the fake driver reports it; every field may be changed between ticks."""

    uuid: str
    name: str = "NVIDIA A100-SXM4-80GB"
    memory_total_mib: int = 81920
    memory_reserved_mib: int = 512
    memory_used_mib: int = 0
    # Driver utilization samples: (timestamp in microseconds, percent).
    utilization_samples: list[tuple[int, int]] = field(default_factory=list)
    # What nvmlDeviceGetUtilizationRates reports (the fallback).
    utilization_rate_percent: int = 0
    temperature_c: int = 40
    mig_mode: int = 0
    mig_profiles: list[FakeMigProfile] = field(default_factory=list)
    # Slot -> MIG device; slots not present are empty.
    mig_devices: dict[int, FakeMigDevice] = field(default_factory=dict)
    # NVML function name -> status code that call returns for this GPU.
    faults: dict[str, int] = field(default_factory=dict)
    # The same, for calls on this GPU's MIG device handles.
    mig_faults: dict[str, int] = field(default_factory=dict)
    # Every call on a lost GPU returns NVML_ERROR_GPU_IS_LOST.
    lost: bool = False
    # Running processes (compute and graphics lists) and per-process utilization samples:
    # (pid, timestamp in microseconds, SM percent).
    processes: list[FakeProcess] = field(default_factory=list)
    process_samples: list[tuple[int, int, int]] = field(default_factory=list)
    # When set, nvmlDeviceGetProcessUtilization's sizing call answers this status instead of
    # "insufficient size" (e.g. SUCCESS, which pynvml then raises as an error).
    process_sizing_status: int | None = None

    def add_samples(self, *samples: tuple[int, int]) -> None:
        self.utilization_samples.extend(samples)


def _out(ref: Any) -> Any:
    """The ctypes object behind a `byref(...)` argument."""
    return ref._obj


def _handle_value(handle: Any) -> int:
    return int(ctypes.cast(handle, ctypes.c_void_p).value or 0)


def _set_handle(ref: Any, value: int) -> None:
    target = _out(ref)
    ctypes.memmove(
        ctypes.addressof(target),
        ctypes.byref(ctypes.c_void_p(value)),
        ctypes.sizeof(ctypes.c_void_p),
    )


def _int(arg: Any) -> int:
    return int(getattr(arg, "value", arg))


class FakeNvml:
    """The fake driver: GPUs, call counts, and switches for each fault class."""

    def __init__(self, gpus: list[FakeGpu] | None = None) -> None:
        self.gpus: list[FakeGpu] = gpus if gpus is not None else []
        # Symbols the "library" does not export: pynvml raises NVMLError_FunctionNotFound.
        self.missing_functions: set[str] = set()
        # Status code nvmlInitWithFlags returns (e.g. DRIVER_NOT_LOADED).
        self.init_error: int | None = None
        # When set, every call but shutdown returns it (init too): NVML failing as a whole.
        self.global_error: int | None = None
        self.library_missing = False
        self.initialized = 0
        self.calls: Counter[str] = Counter()
        self._monkeypatch: pytest.MonkeyPatch | None = None

    # -- installation ---------------------------------------------------------------------------

    def install(self, monkeypatch: pytest.MonkeyPatch) -> FakeNvml:
        self._monkeypatch = monkeypatch
        monkeypatch.setattr(pynvml, "_nvmlGetFunctionPointer", self.lookup)
        monkeypatch.setattr(pynvml, "nvmlLib", self)
        monkeypatch.setattr(pynvml, "_nvmlLib_refcount", pynvml._nvmlLib_refcount)
        return self

    def make_library_missing(self) -> None:
        """The real `_LoadNvmlLibrary` runs and fails to load libnvidia-ml.so.1."""
        assert self._monkeypatch is not None, "install() first"
        self.library_missing = True

        def no_library(*_args: Any, **_kwargs: Any) -> Any:
            raise OSError("libnvidia-ml.so.1: cannot open shared object file")

        self._monkeypatch.setattr(pynvml, "nvmlLib", None)
        self._monkeypatch.setattr(pynvml, "CDLL", no_library)

    def lookup(self, name: str) -> Callable[..., int]:
        """Stands in for `pynvml._nvmlGetFunctionPointer`."""
        if pynvml.nvmlLib is None:
            raise pynvml.NVMLError(UNINITIALIZED)
        impl = getattr(self, name, None) if name.startswith("nvml") else None
        if impl is None or name in self.missing_functions:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)

        # A plain function (not a bound method), so pynvml may set `restype` on it as on a
        # ctypes function pointer.
        def c_function(*args: Any) -> int:
            self.calls[name] += 1
            if name in ("nvmlShutdown", "nvmlErrorString"):
                return int(impl(*args))
            if self.global_error is not None:
                return self.global_error
            if name != "nvmlInitWithFlags" and self.initialized <= 0:
                return UNINITIALIZED
            return int(impl(*args))

        return c_function

    # -- helpers -------------------------------------------------------------------------------

    def _gpu(self, handle: Any, function: str) -> tuple[FakeGpu | None, int]:
        value = _handle_value(handle) - _GPU_HANDLE_BASE
        if not 0 <= value < len(self.gpus):
            return None, INVALID_ARGUMENT
        gpu = self.gpus[value]
        if gpu.lost:
            return None, GPU_IS_LOST
        if function in gpu.faults:
            return None, gpu.faults[function]
        return gpu, SUCCESS

    def _mig(self, handle: Any) -> FakeMigDevice | None:
        found = self._mig_slot(handle)
        return None if found is None else found[2]

    def _mig_slot(self, handle: Any) -> tuple[int, int, FakeMigDevice] | None:
        value = _handle_value(handle) - _MIG_HANDLE_BASE
        if value < 0:
            return None
        gpu_index, slot = divmod(value, _MIG_SLOTS_PER_GPU)
        if gpu_index >= len(self.gpus):
            return None
        mig = self.gpus[gpu_index].mig_devices.get(slot)
        return None if mig is None else (gpu_index, slot, mig)

    # -- the exported symbols (C signatures, as pynvml calls them) -------------------------------

    def nvmlInitWithFlags(self, _flags: Any) -> int:
        if self.init_error is not None:
            return self.init_error
        self.initialized += 1
        return SUCCESS

    def nvmlShutdown(self) -> int:
        if self.initialized <= 0:
            return UNINITIALIZED
        self.initialized -= 1
        return SUCCESS

    def nvmlErrorString(self, code: Any) -> bytes:
        return f"fake NVML error {_int(code)}".encode()

    def nvmlDeviceGetCount_v2(self, count_ref: Any) -> int:
        _out(count_ref).value = len(self.gpus)
        return SUCCESS

    def nvmlDeviceGetHandleByIndex_v2(self, index: Any, handle_ref: Any) -> int:
        i = _int(index)
        if not 0 <= i < len(self.gpus):
            return INVALID_ARGUMENT
        gpu = self.gpus[i]
        if gpu.lost:
            return GPU_IS_LOST
        if "nvmlDeviceGetHandleByIndex_v2" in gpu.faults:
            return gpu.faults["nvmlDeviceGetHandleByIndex_v2"]
        _set_handle(handle_ref, _GPU_HANDLE_BASE + i)
        return SUCCESS

    def nvmlDeviceGetUUID(self, handle: Any, buffer: Any, _size: Any) -> int:
        mig_slot = self._mig_slot(handle)
        if mig_slot is not None:
            gpu_index, slot, mig = mig_slot
            if "nvmlDeviceGetUUID" in self.gpus[gpu_index].mig_faults:
                return self.gpus[gpu_index].mig_faults["nvmlDeviceGetUUID"]
            buffer.value = (mig.uuid or f"MIG-{gpu_index}-{slot}-fake").encode()
            return SUCCESS
        gpu, status = self._gpu(handle, "nvmlDeviceGetUUID")
        if gpu is None:
            return status
        buffer.value = gpu.uuid.encode()
        return SUCCESS

    def nvmlDeviceGetName(self, handle: Any, buffer: Any, _size: Any) -> int:
        gpu, status = self._gpu(handle, "nvmlDeviceGetName")
        if gpu is None:
            return status
        buffer.value = gpu.name.encode()
        return SUCCESS

    def nvmlDeviceGetSamples(
        self,
        handle: Any,
        sampling_type: Any,
        last_seen: Any,
        value_type_ref: Any,
        count_ref: Any,
        samples: Any,
    ) -> int:
        gpu, status = self._gpu(handle, "nvmlDeviceGetSamples")
        if gpu is None:
            return status
        if _int(sampling_type) != pynvml.NVML_GPU_UTILIZATION_SAMPLES:
            return NOT_SUPPORTED
        since = _int(last_seen)
        fresh = [(ts, v) for ts, v in gpu.utilization_samples if ts > since]
        if not fresh:
            return NOT_FOUND
        _out(value_type_ref).value = pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
        count = _out(count_ref)
        if samples is None:
            count.value = len(fresh)  # the size query
            return SUCCESS
        written = min(len(fresh), count.value)
        for slot, (ts, value) in enumerate(fresh[:written]):
            samples[slot].timeStamp = ts
            samples[slot].sampleValue.uiVal = value
        count.value = written
        return SUCCESS

    def _running(
        self, handle: Any, function: str, count_ref: Any, procs: Any, graphics: bool
    ) -> int:
        gpu, status = self._gpu(handle, function)
        if gpu is None:
            return status
        listed = [p for p in gpu.processes if p.graphics is graphics]
        count = _out(count_ref)
        if procs is None or count.value < len(listed):
            count.value = len(listed)
            return SUCCESS if not listed else pynvml.NVML_ERROR_INSUFFICIENT_SIZE
        for slot, process in enumerate(listed):
            procs[slot].pid = process.pid
            procs[slot].usedGpuMemory = (
                pynvml.NVML_VALUE_NOT_AVAILABLE_ulonglong.value
                if process.used_memory_mib is None
                else process.used_memory_mib * MIB
            )
            procs[slot].gpuInstanceId = 0xFFFFFFFF
            procs[slot].computeInstanceId = 0xFFFFFFFF
        count.value = len(listed)
        return SUCCESS

    def nvmlDeviceGetComputeRunningProcesses_v3(
        self, handle: Any, count_ref: Any, procs: Any
    ) -> int:
        name = "nvmlDeviceGetComputeRunningProcesses_v3"
        return self._running(handle, name, count_ref, procs, graphics=False)

    def nvmlDeviceGetGraphicsRunningProcesses_v3(
        self, handle: Any, count_ref: Any, procs: Any
    ) -> int:
        name = "nvmlDeviceGetGraphicsRunningProcesses_v3"
        return self._running(handle, name, count_ref, procs, graphics=True)

    def nvmlDeviceGetProcessUtilization(
        self, handle: Any, samples: Any, count_ref: Any, last_seen: Any
    ) -> int:
        gpu, status = self._gpu(handle, "nvmlDeviceGetProcessUtilization")
        if gpu is None:
            return status
        since = _int(last_seen)
        fresh = [(pid, ts, sm) for pid, ts, sm in gpu.process_samples if ts > since]
        count = _out(count_ref)
        if samples is None:
            if gpu.process_sizing_status is not None:
                return gpu.process_sizing_status
            if not fresh:
                return NOT_FOUND
            count.value = len(fresh)
            return pynvml.NVML_ERROR_INSUFFICIENT_SIZE
        written = min(len(fresh), count.value)
        for slot, (pid, ts, sm) in enumerate(fresh[:written]):
            samples[slot].pid = pid
            samples[slot].timeStamp = ts
            samples[slot].smUtil = sm
        count.value = written
        return SUCCESS

    def nvmlDeviceGetUtilizationRates(self, handle: Any, util_ref: Any) -> int:
        gpu, status = self._gpu(handle, "nvmlDeviceGetUtilizationRates")
        if gpu is None:
            return status
        _out(util_ref).gpu = gpu.utilization_rate_percent
        _out(util_ref).memory = 0
        return SUCCESS

    def _fill_memory(self, info: Any, total: int, reserved: int, used: int, v2: bool) -> None:
        info.total = total * MIB
        if v2:
            info.reserved = reserved * MIB
            info.used = used * MIB
            info.free = max(0, total - reserved - used) * MIB
        else:
            # v1 folds the reserved memory into "used".
            info.used = (reserved + used) * MIB
            info.free = max(0, total - reserved - used) * MIB

    def nvmlDeviceGetMemoryInfo_v2(self, handle: Any, info_ref: Any) -> int:
        info = _out(info_ref)
        if info.version != pynvml.nvmlMemory_v2:
            return VERSION_MISMATCH
        return self._memory(handle, "nvmlDeviceGetMemoryInfo_v2", info, v2=True)

    def nvmlDeviceGetMemoryInfo(self, handle: Any, info_ref: Any) -> int:
        return self._memory(handle, "nvmlDeviceGetMemoryInfo", _out(info_ref), v2=False)

    def _memory(self, handle: Any, function: str, info: Any, *, v2: bool) -> int:
        mig = self._mig(handle)
        if mig is not None:
            self._fill_memory(info, mig.memory_total_mib, 0, mig.memory_used_mib, v2)
            return SUCCESS
        gpu, status = self._gpu(handle, function)
        if gpu is None:
            return status
        self._fill_memory(
            info, gpu.memory_total_mib, gpu.memory_reserved_mib, gpu.memory_used_mib, v2
        )
        return SUCCESS

    def nvmlDeviceGetTemperatureV(self, handle: Any, temp_ref: Any) -> int:
        gpu, status = self._gpu(handle, "nvmlDeviceGetTemperatureV")
        if gpu is None:
            return status
        temp = _out(temp_ref)
        if temp.version != pynvml.nvmlTemperature_v1:
            return VERSION_MISMATCH
        if temp.sensorType != pynvml.NVML_TEMPERATURE_GPU:
            return INVALID_ARGUMENT
        temp.temperature = gpu.temperature_c
        return SUCCESS

    def nvmlDeviceGetTemperature(self, handle: Any, sensor: Any, temp_ref: Any) -> int:
        gpu, status = self._gpu(handle, "nvmlDeviceGetTemperature")
        if gpu is None:
            return status
        if _int(sensor) != pynvml.NVML_TEMPERATURE_GPU:
            return INVALID_ARGUMENT
        _out(temp_ref).value = gpu.temperature_c
        return SUCCESS

    def nvmlDeviceGetMigMode(self, handle: Any, current_ref: Any, pending_ref: Any) -> int:
        gpu, status = self._gpu(handle, "nvmlDeviceGetMigMode")
        if gpu is None:
            return status
        _out(current_ref).value = gpu.mig_mode
        _out(pending_ref).value = gpu.mig_mode
        return SUCCESS

    def nvmlDeviceGetGpuInstanceProfileInfoV(self, handle: Any, profile: Any, info_ref: Any) -> int:
        gpu, status = self._gpu(handle, "nvmlDeviceGetGpuInstanceProfileInfoV")
        if gpu is None:
            return status
        if gpu.mig_mode != pynvml.NVML_DEVICE_MIG_ENABLE:
            return NOT_SUPPORTED
        info = _out(info_ref)
        if info.version != pynvml.nvmlGpuInstanceProfileInfo_v2:
            return VERSION_MISMATCH
        for p in gpu.mig_profiles:
            if p.profile == _int(profile):
                info.id = p.profile_id
                info.memorySizeMB = p.memory_mib
                return SUCCESS
        return NOT_SUPPORTED

    def nvmlDeviceGetGpuInstanceRemainingCapacity(
        self, handle: Any, profile_id: Any, count_ref: Any
    ) -> int:
        gpu, status = self._gpu(handle, "nvmlDeviceGetGpuInstanceRemainingCapacity")
        if gpu is None:
            return status
        for p in gpu.mig_profiles:
            if p.profile_id == _int(profile_id):
                _out(count_ref).value = p.remaining
                return SUCCESS
        return INVALID_ARGUMENT

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: Any, count_ref: Any) -> int:
        gpu, status = self._gpu(handle, "nvmlDeviceGetMaxMigDeviceCount")
        if gpu is None:
            return status
        _out(count_ref).value = 7 if gpu.mig_mode == pynvml.NVML_DEVICE_MIG_ENABLE else 0
        return SUCCESS

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: Any, index: Any, mig_ref: Any) -> int:
        gpu, status = self._gpu(handle, "nvmlDeviceGetMigDeviceHandleByIndex")
        if gpu is None:
            return status
        slot = _int(index)
        if slot not in gpu.mig_devices:
            return NOT_FOUND
        gpu_index = _handle_value(handle) - _GPU_HANDLE_BASE
        _set_handle(mig_ref, _MIG_HANDLE_BASE + gpu_index * _MIG_SLOTS_PER_GPU + slot)
        return SUCCESS


def a100(index: int, **overrides: Any) -> FakeGpu:
    """A healthy A100-80GB with a UUID derived from `index`."""
    overrides.setdefault("uuid", f"GPU-{index:08d}-0000-0000-0000-000000000000")
    return FakeGpu(**overrides)


def h100_mig_profiles(
    *, one: int = 7, two: int = 3, three: int = 2, four: int = 1, seven: int = 1
) -> list[FakeMigProfile]:
    """H100-80GB GPU instance profiles (ids and sizes as NVML reports them) with the given
    remaining capacities; the defaults are those of a GPU with no instance yet."""
    return [
        FakeMigProfile(pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE, 19, 9856, one),
        FakeMigProfile(pynvml.NVML_GPU_INSTANCE_PROFILE_2_SLICE, 14, 20096, two),
        FakeMigProfile(pynvml.NVML_GPU_INSTANCE_PROFILE_3_SLICE, 9, 40192, three),
        FakeMigProfile(pynvml.NVML_GPU_INSTANCE_PROFILE_4_SLICE, 5, 40192, four),
        FakeMigProfile(pynvml.NVML_GPU_INSTANCE_PROFILE_7_SLICE, 0, 80384, seven),
    ]


@pytest.fixture(name="fake_nvml")
def fake_nvml_fixture(monkeypatch: pytest.MonkeyPatch) -> FakeNvml:
    """A fake NVML with two healthy A100s, installed below pynvml for one test."""
    return FakeNvml([a100(0), a100(1)]).install(monkeypatch)
