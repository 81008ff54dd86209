"""Where GPU readings come from: the one interface the agent samples through.

Two sources exist: real NVML (`agent.nvml`, the only module that imports pynvml) and a seeded
simulation (`agent.simulated`), so every feature can run and be tested without a GPU. The NVML
module is imported only when asked for, so a simulated agent never loads the NVIDIA library.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal, Protocol

from agent.records import NodeReading, SourceUnavailable

__all__ = ["SOURCE_KINDS", "GpuSource", "SourceKind", "SourceUnavailable", "open_source"]

SourceKind = Literal["nvml", "simulated"]
SOURCE_KINDS: tuple[SourceKind, ...] = ("nvml", "simulated")


class GpuSource(Protocol):
    """Reads every GPU of the node once per call."""

    def read(self, now: datetime) -> NodeReading:
        """One tick's reading, stamped `now`.

        Never raises for a per-GPU fault or a failing NVML call: those are reported in the
        reading (`problems`, `lost`, `fatal`, `error_kinds`), so the agent degrades, not dies.
        """
        ...

    def close(self) -> None:
        """Release the source (for NVML: `nvmlShutdown()`). Safe to call more than once."""
        ...


def open_source(
    kind: SourceKind,
    *,
    simulated_gpus: int = 8,
    simulated_model: str = "NVIDIA A100-SXM4-80GB",
    seed: int = 0,
    lose_gpu_after_s: float | None = None,
    start: datetime | None = None,
    processes: bool = False,
    simulated_pods: bool = False,
) -> GpuSource:
    """Open the source named by `kind`; raises `SourceUnavailable` when it cannot start.

    The `simulated_*`, `seed`, `lose_gpu_after_s` and `start` arguments apply to the simulated
    source only (see `agent.simulated.SimulatedSource`). `processes` makes the NVML source read
    each GPU's processes, for per-process attribution;
    `simulated_pods` makes the simulated source publish its jobs as pods.
    """
    if kind == "simulated":
        from agent.simulated import SimulatedSource  # noqa: PLC0415  (load only what is used)

        return SimulatedSource(
            gpus=simulated_gpus,
            model=simulated_model,
            seed=seed,
            lose_gpu_after_s=lose_gpu_after_s,
            start=start,
            pods=simulated_pods,
        )
    if kind == "nvml":
        # Imported here so that a simulated agent never loads pynvml or the NVIDIA library.
        from agent.nvml import NvmlSource  # noqa: PLC0415

        return NvmlSource.open(processes=processes)
    raise ValueError(f"unknown gpu source {kind!r}; expected one of {', '.join(SOURCE_KINDS)}")
