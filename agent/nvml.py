"""The one module that talks to NVML (through NVIDIA's `pynvml` binding).

Every NVML call goes through `NvmlSource._call`, which classifies a failure where it enters:
- a field the GPU cannot report (`NotSupported`, `NoPermission`, ...) becomes `None` plus a
  problem such as "temperature not supported on gpu 1" (the node is then `degraded`);
- a device fault (`GpuIsLost`, `Unknown`, `ResetRequired`) takes that GPU out of the tick as
  "gpu 3: lost" while the other GPUs keep reporting;
- NVML failing as a whole (`Uninitialized`, `DriverNotLoaded`, a driver/library mismatch) makes
  the tick `fatal`, and the next tick tries to initialise NVML again.
A missing library or driver at start raises `SourceUnavailable` with one line an operator can act
on. docs/fragmentation.md lists every fault and what it does to the node's health.

Utilization is the mean of the driver's own utilization samples since the previous tick
(`nvmlDeviceGetSamples` with the last timestamp seen per GPU UUID), so a 5 s tick reports the
whole 5 s, not one instant. MIG-enabled GPUs report the memory that can still be handed out as GPU
instances instead of raw free memory, and the largest single allocation one pod could get
(one MIG device's worth), because their free memory is never one block (see `_mig_free_mib`);
their MIG devices' UUIDs, which the kubelet hands out instead of the GPU's, are read once per
device and cached.

With per-process attribution on, each GPU's processes are read too: the memory each holds
(compute and graphics lists) and the SM-busy samples of each since the previous tick
(`nvmlDeviceGetProcessUtilization` with the last timestamp seen, the same window as the GPU's
utilization). A failure there leaves that part unknown (`None`) and never degrades the GPU.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final

import pynvml  # type: ignore[import-untyped]  # NVIDIA ships no type information

from agent.records import (
    MIG_UUID_REFRESH_READS,
    GpuMemo,
    GpuProcesses,
    GpuReading,
    NodeReading,
    SourceUnavailable,
)

_MIB: Final = 1024 * 1024

# Codes that mean NVML as a whole is gone: no GPU can be read until it is initialised again.
_NVML_DOWN: Final = frozenset(
    {
        pynvml.NVML_ERROR_UNINITIALIZED,
        pynvml.NVML_ERROR_DRIVER_NOT_LOADED,
        pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH,
        pynvml.NVML_ERROR_LIBRARY_NOT_FOUND,
    }
)
# Codes that mean this one device stopped answering: it is reported lost, the others carry on.
_DEVICE_LOST: Final = frozenset(
    {
        pynvml.NVML_ERROR_GPU_IS_LOST,
        pynvml.NVML_ERROR_UNKNOWN,
        pynvml.NVML_ERROR_RESET_REQUIRED,
    }
)
# A GPU instance profile or MIG slot that this GPU does not have: expected, not a fault.
_ABSENT: Final = frozenset(
    {
        pynvml.NVML_ERROR_NOT_SUPPORTED,
        pynvml.NVML_ERROR_INVALID_ARGUMENT,
        pynvml.NVML_ERROR_NOT_FOUND,
    }
)
_NO_SAMPLE_BUFFER: Final = frozenset(
    {pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_FUNCTION_NOT_FOUND}
)
_SAMPLE_VALUE_FIELDS: Final = {
    pynvml.NVML_VALUE_TYPE_DOUBLE: "dVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_INT: "uiVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG: "ulVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: "ullVal",
    pynvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG: "sllVal",
    pynvml.NVML_VALUE_TYPE_SIGNED_INT: "siVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_SHORT: "usVal",
}


def error_kind(error: pynvml.NVMLError) -> str:
    """`NVMLError_GpuIsLost` -> `GpuIsLost`: the label of the agent's NVML-errors metric."""
    name = type(error).__name__
    if name.startswith("NVMLError_"):
        return name.removeprefix("NVMLError_")
    return f"Error{getattr(error, 'value', '?')}"


def _code(error: pynvml.NVMLError) -> int:
    return int(getattr(error, "value", pynvml.NVML_ERROR_UNKNOWN))


class _NvmlDownError(Exception):
    """NVML as a whole failed during this tick."""

    def __init__(self, kind: str, text: str) -> None:
        super().__init__(text)
        self.kind = kind


class _DeviceFaultError(Exception):
    """One GPU stopped answering during this tick."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _field_problem(what: str, index: int, error: pynvml.NVMLError) -> str:
    code = _code(error)
    if code == pynvml.NVML_ERROR_NOT_SUPPORTED:
        return f"{what} not supported on gpu {index}"
    if code == pynvml.NVML_ERROR_NO_PERMISSION:
        return f"{what} not permitted on gpu {index}"
    return f"{what} unreadable on gpu {index} ({error_kind(error)})"


def _unavailable_message(error: pynvml.NVMLError) -> str:
    code = _code(error)
    hint = "use --source simulated to run without GPUs"
    if code == pynvml.NVML_ERROR_LIBRARY_NOT_FOUND:
        return (
            "NVML library (libnvidia-ml.so.1) not found: install the NVIDIA driver on the node "
            f"and run the pod with the NVIDIA container runtime, or {hint}"
        )
    if code == pynvml.NVML_ERROR_DRIVER_NOT_LOADED:
        return f"NVIDIA driver not loaded on this node (NVML: Driver Not Loaded); {hint}"
    if code == pynvml.NVML_ERROR_NO_PERMISSION:
        return f"no permission to open NVML (NVML: Insufficient Permissions); {hint}"
    return f"cannot initialise NVML ({error_kind(error)}: {error}); {hint}"


@dataclass(slots=True)
class _Tick:
    errors: list[str] = field(default_factory=list)


class NvmlSource:
    """Reads every GPU through NVML once per `read`. Open with `NvmlSource.open()`.

    With `processes`, each GPU's processes are read too (memory and utilization samples per pid),
    for attributing a shared GPU's load to its pods; the PIDs are the host's, which the agent can
    map to pods only when it shares the host's PID namespace.
    """

    def __init__(self, *, processes: bool = False) -> None:
        self.processes = processes
        self._inits = 0
        self._closed = False
        self._needs_init = False
        self._memo: dict[str, GpuMemo] = {}
        self._temperature_v_missing = False
        self._memory_v2_missing = False
        self._tick = _Tick()

    @classmethod
    def open(cls, *, processes: bool = False) -> NvmlSource:
        """Initialise NVML; raises `SourceUnavailable` (one clear line) when it cannot."""
        source = cls(processes=processes)
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as error:
            raise SourceUnavailable(_unavailable_message(error)) from error
        source._inits = 1
        return source

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for _ in range(self._inits):
            try:
                pynvml.nvmlShutdown()
            except pynvml.NVMLError:
                # Shutting down a library whose driver vanished cannot be done better than this.
                break
        self._inits = 0

    # -- the call funnel ----------------------------------------------------------------------

    def _call(
        self,
        fn: Callable[..., Any],
        *args: Any,
        expected: Collection[int] = (),
        **kwargs: Any,
    ) -> Any:
        """Call one pynvml function; record and classify its failure.

        Codes in `expected` are re-raised unrecorded (the caller treats them as an answer, not
        a fault); device and whole-NVML faults become `_DeviceFaultError` / `_NvmlDownError`.
        """
        try:
            return fn(*args, **kwargs)
        except pynvml.NVMLError as error:
            code = _code(error)
            if code in expected:
                raise
            kind = error_kind(error)
            self._tick.errors.append(kind)
            if code in _NVML_DOWN:
                raise _NvmlDownError(kind, str(error)) from error
            if code in _DEVICE_LOST:
                raise _DeviceFaultError("lost") from error
            raise

    # -- one tick -----------------------------------------------------------------------------

    def read(self, now: datetime) -> NodeReading:
        self._tick = _Tick()
        if self._closed:
            return NodeReading(sampled_at=now, gpus=(), device_count=0, fatal="source closed")
        try:
            if self._needs_init:
                self._init_again()
            return self._read_all(now)
        except _NvmlDownError as down:
            return NodeReading(
                sampled_at=now,
                gpus=(),
                device_count=0,
                fatal=str(down),
                error_kinds=tuple(self._tick.errors),
            )

    def _init_again(self) -> None:
        try:
            self._call(pynvml.nvmlInit)
        except pynvml.NVMLError as error:
            raise _NvmlDownError(error_kind(error), f"init failed: {error}") from error
        self._inits += 1
        self._needs_init = False

    def _read_all(self, now: datetime) -> NodeReading:
        try:
            count = int(self._call(pynvml.nvmlDeviceGetCount))
        except _NvmlDownError:
            # NVML lost its state (driver unloaded or reloaded): initialise again next tick.
            self._needs_init = True
            raise
        except _DeviceFaultError as fault:
            raise _NvmlDownError("Unknown", f"device count failed: {fault.reason}") from fault
        except pynvml.NVMLError as error:
            raise _NvmlDownError(error_kind(error), f"device count failed: {error}") from error
        gpus: list[GpuReading] = []
        lost: list[str] = []
        for index in range(count):
            try:
                gpus.append(self._read_gpu(index))
            except _NvmlDownError:
                self._needs_init = True
                raise
            except _DeviceFaultError as fault:
                lost.append(f"gpu {index}: {fault.reason}")
        return NodeReading(
            sampled_at=now,
            gpus=tuple(gpus),
            device_count=count,
            lost=tuple(lost),
            error_kinds=tuple(self._tick.errors),
        )

    def _field(self, what: str, index: int, problems: list[str], fn: Any, *args: Any) -> Any:
        try:
            return self._call(fn, *args)
        except pynvml.NVMLError as error:
            problems.append(_field_problem(what, index, error))
            return None

    def _read_gpu(self, index: int) -> GpuReading:
        try:
            handle = self._call(pynvml.nvmlDeviceGetHandleByIndex, index)
        except pynvml.NVMLError as error:
            # Without a handle nothing about the GPU can be read: a device fault, not a field.
            raise _DeviceFaultError(f"unreadable ({error_kind(error)})") from error
        problems: list[str] = []
        uuid = self._field("uuid", index, problems, pynvml.nvmlDeviceGetUUID, handle)
        # UUIDs key the per-GPU memory because indexes can change; without one, the index is
        # the best key there is for this tick.
        key = str(uuid) if uuid else f"index-{index}"
        memo = self._memo.setdefault(key, GpuMemo())
        name = self._field("name", index, problems, pynvml.nvmlDeviceGetName, handle)
        utilization = self._utilization(handle, index, memo, problems)
        total_mib, free_mib = self._memory(handle, index, problems)
        temperature_c = self._temperature(handle, index, problems)
        mig_enabled = self._mig_mode(handle, index, problems)
        largest_mib = free_mib
        mig_uuids: tuple[str, ...] = ()
        if mig_enabled:
            free_mib, largest_mib, mig_uuids = self._mig_free_mib(handle, index, memo, problems)
        else:
            memo.mig_profiles = None
            memo.mig_uuids.clear()
        processes = self._processes(handle, memo) if self.processes else None
        return GpuReading(
            uuid=key,
            index=index,
            name=str(name) if name else None,
            utilization=utilization,
            memory_total_mib=total_mib,
            memory_free_mib=free_mib,
            temperature_c=temperature_c,
            mig_enabled=mig_enabled,
            memory_largest_allocation_mib=largest_mib,
            problems=tuple(problems),
            mig_device_uuids=mig_uuids,
            processes=processes,
        )

    def _utilization(
        self, handle: Any, index: int, memo: GpuMemo, problems: list[str]
    ) -> float | None:
        if not memo.samples_unsupported:
            try:
                value_type, samples = self._call(
                    pynvml.nvmlDeviceGetSamples,
                    handle,
                    pynvml.NVML_GPU_UTILIZATION_SAMPLES,
                    memo.last_sample_us,
                    expected=(pynvml.NVML_ERROR_NOT_FOUND,),
                )
            except pynvml.NVMLError as error:
                # NotFound: no sample since the last tick (a tick shorter than the driver's
                # sampling period). NotSupported / FunctionNotFound: this GPU or driver has no
                # sample buffer, so stop asking. Anything else: this tick uses the rate.
                if _code(error) in _NO_SAMPLE_BUFFER:
                    memo.samples_unsupported = True
            else:
                attr = _SAMPLE_VALUE_FIELDS.get(int(value_type), "uiVal")
                fresh = [
                    (int(s.timeStamp), float(getattr(s.sampleValue, attr)))
                    for s in samples
                    if int(s.timeStamp) > memo.last_sample_us
                ]
                if fresh:
                    memo.last_sample_us = max(ts for ts, _ in fresh)
                    mean_percent = sum(v for _, v in fresh) / len(fresh)
                    return min(1.0, max(0.0, mean_percent / 100.0))
        rates = self._field(
            "utilization", index, problems, pynvml.nvmlDeviceGetUtilizationRates, handle
        )
        if rates is None:
            return None
        return min(1.0, max(0.0, int(rates.gpu) / 100.0))

    def _processes(self, handle: Any, memo: GpuMemo) -> GpuProcesses:
        """The GPU's processes: memory per pid, and SM-busy samples per pid since the last tick.

        Neither part makes the GPU degraded: per-process data only refines the pods' figures,
        and where it is missing those figures are unknown (`agent.attribution`).
        """
        return GpuProcesses(
            memory_used_mib=self._process_memory(handle),
            sm_busy=self._process_samples(handle, memo),
        )

    def _process_memory(self, handle: Any) -> tuple[tuple[int, int | None], ...] | None:
        found: dict[int, int | None] = {}
        try:
            listed = list(self._call(pynvml.nvmlDeviceGetComputeRunningProcesses, handle))
        except pynvml.NVMLError:
            return None  # counted by the funnel; the pods' memory on this GPU is unknown
        try:
            listed += self._call(
                pynvml.nvmlDeviceGetGraphicsRunningProcesses,
                handle,
                expected=(pynvml.NVML_ERROR_NOT_SUPPORTED,),
            )
        except pynvml.NVMLError as error:
            # A compute-only GPU has no graphics list: nothing more to add, not a fault.
            if _code(error) != pynvml.NVML_ERROR_NOT_SUPPORTED:
                return None
        for process in listed:
            pid = int(process.pid)
            used = process.usedGpuMemory
            mib = None if used is None else int(used) // _MIB
            # A process with both a compute and a graphics context is listed twice; one figure
            # is kept, and an unknown one (NVML_VALUE_NOT_AVAILABLE, pynvml's None) wins.
            if mib is None or (pid in found and found[pid] is None):
                found[pid] = None
            else:
                found[pid] = max(found.get(pid) or 0, mib)
        return tuple(sorted(found.items()))

    def _process_samples(self, handle: Any, memo: GpuMemo) -> tuple[tuple[int, float], ...] | None:
        if memo.process_samples_unsupported:
            return None
        try:
            samples = self._call(
                pynvml.nvmlDeviceGetProcessUtilization,
                handle,
                memo.last_process_sample_us,
                expected=(pynvml.NVML_SUCCESS, pynvml.NVML_ERROR_NOT_FOUND, *_NO_SAMPLE_BUFFER),
            )
        except pynvml.NVMLError as error:
            code = _code(error)
            # NotFound: no process was busy since the last tick (NVML keeps only samples of
            # processes with some utilization). Success raised as an error: pynvml's wrapper
            # raises the first call's status unless it is "insufficient size", and the driver
            # answers success when it has no sample to size. Both mean: no SM time.
            if code in (pynvml.NVML_ERROR_NOT_FOUND, pynvml.NVML_SUCCESS):
                return ()
            if code in _NO_SAMPLE_BUFFER:
                memo.process_samples_unsupported = True
                self._tick.errors.append(error_kind(error))
            return None
        busy: dict[int, float] = {}
        newest = memo.last_process_sample_us
        for sample in samples:
            stamp = int(sample.timeStamp)
            if stamp <= memo.last_process_sample_us:
                continue
            newest = max(newest, stamp)
            pid = int(sample.pid)
            busy[pid] = busy.get(pid, 0.0) + float(min(100, int(sample.smUtil)))
        memo.last_process_sample_us = newest
        return tuple(sorted(busy.items()))

    def _memory(
        self, handle: Any, index: int, problems: list[str]
    ) -> tuple[int | None, int | None]:
        info: Any = None
        if not self._memory_v2_missing:
            try:
                info = self._call(
                    pynvml.nvmlDeviceGetMemoryInfo,
                    handle,
                    version=pynvml.nvmlMemory_v2,
                    expected=(
                        pynvml.NVML_ERROR_FUNCTION_NOT_FOUND,
                        pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH,
                    ),
                )
            except pynvml.NVMLError as error:
                if _code(error) in (
                    pynvml.NVML_ERROR_FUNCTION_NOT_FOUND,
                    pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH,
                ):
                    # A driver older than the v2 call: v1 counts reserved memory as used,
                    # which errs on the safe side for "free".
                    self._memory_v2_missing = True
                    self._tick.errors.append(error_kind(error))
                else:
                    problems.append(_field_problem("memory", index, error))
                    return None, None
        if info is None:
            info = self._field("memory", index, problems, pynvml.nvmlDeviceGetMemoryInfo, handle)
            if info is None:
                return None, None
        return int(info.total) // _MIB, int(info.free) // _MIB

    def _temperature(self, handle: Any, index: int, problems: list[str]) -> int | None:
        if not self._temperature_v_missing:
            try:
                return int(
                    self._call(
                        pynvml.nvmlDeviceGetTemperatureV,
                        handle,
                        pynvml.NVML_TEMPERATURE_GPU,
                        expected=(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND,),
                    )
                )
            except pynvml.NVMLError as error:
                if _code(error) != pynvml.NVML_ERROR_FUNCTION_NOT_FOUND:
                    problems.append(_field_problem("temperature", index, error))
                    return None
                # A driver without the versioned call: use the deprecated one from now on, and
                # count the miss once rather than on every tick.
                self._temperature_v_missing = True
                self._tick.errors.append(error_kind(error))
        value = self._field(
            "temperature",
            index,
            problems,
            pynvml.nvmlDeviceGetTemperature,
            handle,
            pynvml.NVML_TEMPERATURE_GPU,
        )
        return None if value is None else int(value)

    def _mig_mode(self, handle: Any, index: int, problems: list[str]) -> bool | None:
        try:
            current, _pending = self._call(
                pynvml.nvmlDeviceGetMigMode,
                handle,
                expected=(pynvml.NVML_ERROR_NOT_SUPPORTED,),
            )
        except pynvml.NVMLError as error:
            if _code(error) == pynvml.NVML_ERROR_NOT_SUPPORTED:
                return False  # a GPU without MIG: an answer, not a fault
            problems.append(_field_problem("mig mode", index, error))
            return None
        return bool(int(current) == pynvml.NVML_DEVICE_MIG_ENABLE)

    def _mig_free_mib(
        self, handle: Any, index: int, memo: GpuMemo, problems: list[str]
    ) -> tuple[int | None, int | None, tuple[str, ...]]:
        """(free, largest single allocation, MIG device UUIDs) of a MIG-enabled GPU, MiB.

        free = the most memory that can still be carved out as new GPU instances of one profile
               (max over profiles of remaining capacity x profile memory)
             + the free memory inside the MIG devices that already exist.
        largest = the larger of: the most free memory inside one existing MIG device, and the
                  memory of the biggest profile that can still be created. A pod gets one MIG
                  device, so this, not `free`, is the biggest request the GPU can take.
        The raw free memory of the parent GPU would also count memory no instance can reach.
        The UUIDs (which the kubelet names MIG devices by) come from the same device handles.
        """
        memo.mig_uuid_reads += 1
        if memo.mig_uuid_reads >= MIG_UUID_REFRESH_READS:
            memo.mig_uuid_reads = 0
            memo.mig_uuids.clear()
        uuids: list[str] = []
        try:
            if memo.mig_profiles is None:
                memo.mig_profiles = self._mig_profiles(handle)
            unpartitioned = 0
            largest_creatable = 0
            for profile_id, memory_mib in memo.mig_profiles:
                remaining = int(
                    self._call(pynvml.nvmlDeviceGetGpuInstanceRemainingCapacity, handle, profile_id)
                )
                unpartitioned = max(unpartitioned, remaining * memory_mib)
                if remaining > 0:
                    largest_creatable = max(largest_creatable, memory_mib)
            in_devices = 0
            largest_in_device = 0
            slots = int(self._call(pynvml.nvmlDeviceGetMaxMigDeviceCount, handle))
            for slot in range(slots):
                try:
                    mig = self._call(
                        pynvml.nvmlDeviceGetMigDeviceHandleByIndex, handle, slot, expected=_ABSENT
                    )
                except pynvml.NVMLError as error:
                    if _code(error) in _ABSENT:
                        memo.mig_uuids.pop(slot, None)
                        continue  # an empty slot
                    raise
                info = self._call(pynvml.nvmlDeviceGetMemoryInfo, mig)
                device_free = int(info.free) // _MIB
                in_devices += device_free
                largest_in_device = max(largest_in_device, device_free)
                mig_uuid = self._mig_uuid(
                    mig, slot, int(info.total) // _MIB, memo=memo, index=index, problems=problems
                )
                if mig_uuid:
                    uuids.append(mig_uuid)
        except pynvml.NVMLError as error:
            problems.append(_field_problem("mig capacity", index, error))
            return None, None, tuple(uuids)
        return unpartitioned + in_devices, max(largest_creatable, largest_in_device), tuple(uuids)

    def _mig_uuid(
        self,
        mig: Any,
        slot: int,
        total_mib: int,
        *,
        memo: GpuMemo,
        index: int,
        problems: list[str],
    ) -> str | None:
        cached = memo.mig_uuids.get(slot)
        if cached is not None and cached[0] == total_mib:
            return cached[1]
        uuid = self._field("mig uuid", index, problems, pynvml.nvmlDeviceGetUUID, mig)
        if not uuid:
            memo.mig_uuids.pop(slot, None)
            return None
        memo.mig_uuids[slot] = (total_mib, str(uuid))
        return str(uuid)

    def _mig_profiles(self, handle: Any) -> tuple[tuple[int, int], ...]:
        profiles: list[tuple[int, int]] = []
        for profile in range(pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT):
            try:
                info = self._call(
                    pynvml.nvmlDeviceGetGpuInstanceProfileInfo, handle, profile, expected=_ABSENT
                )
            except pynvml.NVMLError as error:
                if _code(error) in _ABSENT:
                    continue  # this GPU has no such profile
                raise
            profiles.append((int(info.id), int(info.memorySizeMB)))
        return tuple(profiles)
