"""The operator's scoring policy: limits, freshness bounds, missing-data handling and score weights.

One immutable value, validated when it is built, so that a bad setting fails at start-up with a
message naming the field and its bound instead of surfacing as odd verdicts on the request path.
Settings, the policy file and the CLI all end in a `Policy`; the scorer reads nothing else.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final, Literal

from gpu_contract.schema import DEFAULT_KEYS, Keys

MissingData = Literal["lenient", "strict"]

# Bounds checked by `Policy.__post_init__`; exported so the settings layer and the docs agree.
MIN_TEMPERATURE_LIMIT_C: Final = 1
MAX_TEMPERATURE_LIMIT_C: Final = 150
# Weights are used at a resolution of 0.001 (integer arithmetic keeps scores bit-for-bit
# reproducible), so their sum must reach at least one such step.
WEIGHT_RESOLUTION: Final = 0.001
MAX_WEIGHT: Final = 1000.0
# 16 TiB per GPU, the bound of the pods' memory hints (`hints.MAX_GPU_MEMORY_MIB`).
MAX_GPU_MEMORY_MIB: Final = 16 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class Policy:
    """What the scorer enforces. Every field has a safe default; see docs/scoring.md."""

    keys: Keys = DEFAULT_KEYS
    # A node whose mean GPU utilization is above this fraction fails the filter.
    utilization_limit: float = 0.90
    # The hottest GPU at or above this temperature fails the filter. 85 C sits below the
    # slowdown (clock-throttling) temperature of current NVIDIA data-centre GPUs, so a node
    # is avoided before its GPUs start to throttle the work already there.
    temperature_limit_c: int = 85
    # 3 x the agent's 60 s heartbeat: two missed heartbeats are tolerated before data is stale.
    stale_after_s: float = 180.0
    # `updated-at` this far in the scorer's future is still accepted (NTP-level drift).
    clock_skew_tolerance_s: float = 30.0
    # How far `updated-at` (node clock, time of sampling) may run ahead of the API server's
    # record of the agent's last write (server clock, always after sampling).
    managed_fields_lag_tolerance_s: float = 30.0
    missing_data: MissingData = "lenient"
    # Treat GPU annotations as unknown data (the missing-data policy) unless managedFields shows
    # the agent wrote them (`judge.written_by_agent`). On in the chart with its GPU-data
    # admission policy: then only the agent's service account may write them at all.
    require_agent_writer: bool = False
    # The score is a weighted mean of three headrooms; only the ratios between weights matter.
    weight_utilization: float = 0.70
    weight_fragmentation: float = 0.15
    weight_temperature: float = 0.15
    gpu_resource_name: str = "nvidia.com/gpu"
    # -- in-flight pods (exporter_scheduler/core/inflight.py): GPU pods bound since the data
    # Longest a bound pod counts as in flight, whatever the node publishes: long enough for a
    # GPU image's pull and start-up, short enough that a node whose agent never shows the pod
    # is not held for it long.
    inflight_max_s: float = 600.0
    # How long after every container of a pod runs its load is taken to show in the agent's
    # utilization: the agent's averaging window (one sample interval, 5 s) plus the start-up
    # of a GPU process (CUDA context, weights loaded to the GPU).
    inflight_load_delay_s: float = 60.0
    # Utilization one unit of an in-flight pod's GPU request is expected to add to a GPU, for
    # pods without an `expected-gpu-load` hint: a whole GPU busy, the conservative default
    # (a time-sliced share sets its fraction in the hint).
    inflight_gpu_load: float = 1.0
    # Where allocations are published, the device plugin hands a pod any k of its unallocated
    # GPUs, blind to load: a node passes only when the chance that all k it hands out are
    # candidates is at least this (7 of 8 candidates pass a 1-GPU pod; 4 of 8 do not).
    min_gpu_fit_probability: float = 0.75
    # The device plugin's choice of GPUs is blind to load (NVIDIA's picks by topology or in no
    # defined order), so a node is judged on the GPUs it could hand out. False only where GPUs
    # are assigned by their load (a load-aware allocator): the best k candidates are counted.
    blind_device_plugin: bool = True
    # -- the pod's own load (exporter_scheduler/core/ownload.py): a GPU is a candidate only if
    # its load plus the load the pod will add stays within the limit, and the score reads the
    # headroom left after it. False judges GPUs by their load now (more GPUs pushed over the
    # limit once pods run; fewer pods wait).
    own_load: bool = True
    # The utilization a pod adds per GPU when neither its hint nor its workload's running pods
    # say: the mean utilization per GPU of the placement simulation's pods (docs/scoring.md,
    # "The pod's own load", for the sweep behind it).
    own_load_gpu_load: float = 0.30
    # Memory a pod's processes hold per GPU when neither hint nor learned figure says: none
    # (a pod that needs memory free says so with `min-gpu-memory-mib`).
    own_load_gpu_memory_mib: int = 0
    # The tenant profile this policy is (`exporter_scheduler.config.profiles`); `default` for the
    # top-level policy. Named in explanations, logs and the request metrics.
    profile: str = "default"

    def __post_init__(self) -> None:
        _check_fraction("utilization_limit", self.utilization_limit)
        if isinstance(self.temperature_limit_c, bool) or not isinstance(
            self.temperature_limit_c, int
        ):
            raise ValueError(
                f"temperature_limit_c must be an integer number of degrees Celsius, "
                f"got {self.temperature_limit_c!r}"
            )
        if not MIN_TEMPERATURE_LIMIT_C <= self.temperature_limit_c <= MAX_TEMPERATURE_LIMIT_C:
            raise ValueError(
                f"temperature_limit_c must be between {MIN_TEMPERATURE_LIMIT_C} and "
                f"{MAX_TEMPERATURE_LIMIT_C}, got {self.temperature_limit_c}"
            )
        _check_seconds("stale_after_s", self.stale_after_s, allow_zero=False)
        _check_seconds("clock_skew_tolerance_s", self.clock_skew_tolerance_s, allow_zero=True)
        _check_seconds(
            "managed_fields_lag_tolerance_s",
            self.managed_fields_lag_tolerance_s,
            allow_zero=True,
        )
        if self.missing_data not in ("lenient", "strict"):
            raise ValueError(
                f"missing_data must be 'lenient' or 'strict', got {self.missing_data!r}"
            )
        for name, weight in (
            ("weight_utilization", self.weight_utilization),
            ("weight_fragmentation", self.weight_fragmentation),
            ("weight_temperature", self.weight_temperature),
        ):
            if not _is_real(weight) or not 0.0 <= weight <= MAX_WEIGHT:
                raise ValueError(f"{name} must be between 0 and {MAX_WEIGHT:g}, got {weight!r}")
        if sum(weight_milli(self)) == 0:
            raise ValueError(
                "weight_utilization + weight_fragmentation + weight_temperature must be at "
                f"least {WEIGHT_RESOLUTION} (weights are used to the nearest {WEIGHT_RESOLUTION})"
            )
        _check_seconds("inflight_max_s", self.inflight_max_s, allow_zero=True)
        _check_seconds("inflight_load_delay_s", self.inflight_load_delay_s, allow_zero=True)
        _check_fraction("inflight_gpu_load", self.inflight_gpu_load)
        _check_fraction("min_gpu_fit_probability", self.min_gpu_fit_probability)
        _check_fraction("own_load_gpu_load", self.own_load_gpu_load)
        if (
            isinstance(self.own_load_gpu_memory_mib, bool)
            or not isinstance(self.own_load_gpu_memory_mib, int)
            or not 0 <= self.own_load_gpu_memory_mib <= MAX_GPU_MEMORY_MIB
        ):
            raise ValueError(
                f"own_load_gpu_memory_mib must be a whole number of MiB between 0 and "
                f"{MAX_GPU_MEMORY_MIB}, got {self.own_load_gpu_memory_mib!r}"
            )
        if not self.gpu_resource_name.strip():
            raise ValueError("gpu_resource_name must not be empty")


def weight_milli(policy: Policy) -> tuple[int, int, int]:
    """The three weights in thousandths, as the integer score arithmetic uses them."""
    return (
        round(policy.weight_utilization * 1000),
        round(policy.weight_fragmentation * 1000),
        round(policy.weight_temperature * 1000),
    )


def _is_real(value: object) -> bool:
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(float(value))
    )


def _check_fraction(name: str, value: float) -> None:
    if not _is_real(value) or not 0.0 <= value <= 1.0:
        raise ValueError(f"{name} must be a fraction between 0 and 1, got {value!r}")


def _check_seconds(name: str, value: float, *, allow_zero: bool) -> None:
    if not _is_real(value) or value < 0 or (value == 0 and not allow_zero):
        bound = "at least 0" if allow_zero else "greater than 0"
        raise ValueError(f"{name} must be a finite number of seconds {bound}, got {value!r}")


def format_fraction_limit(value: float) -> str:
    """A limit as reason texts show it: `0.90`, or more digits only when they matter (`0.875`)."""
    text = f"{value:.2f}"
    if float(text) == value:
        return text
    return f"{value:.4f}".rstrip("0")


def format_seconds(value: float) -> str:
    """`180` for whole seconds, `2.5` otherwise: reason texts never show `180.0`."""
    return str(int(value)) if float(value).is_integer() else f"{value:g}"
