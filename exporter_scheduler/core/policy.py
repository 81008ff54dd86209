"""The operator's scoring policy: limits, freshness bounds, missing-data handling and score weights.

One immutable value, validated when it is built, so that a bad setting fails at start-up with a
message naming the field and its bound instead of surfacing as odd verdicts on the request path.
Settings, the policy file and the CLI all end in a `Policy`; the scorer reads nothing else.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Final, Generic, Literal, TypeVar

from gpu_contract.schema import DEFAULT_KEYS, Keys

MissingData = Literal["lenient", "strict"]
Unit = Literal["fraction", "C", "s", "weight", "MiB", ""]
T = TypeVar("T")

# Weights are used at a resolution of 0.001 (integer arithmetic keeps scores bit-for-bit
# reproducible), so their sum must reach at least one such step.
WEIGHT_RESOLUTION: Final = 0.001


@dataclass(frozen=True, slots=True)
class Setting(Generic[T]):
    """One policy setting, defined once: `Policy` takes its default and checks its bounds, the
    scorer's settings (flags, environment, policy file) derive their field from it, and a test
    holds the chart's values schema to it. `why` is the reason for the default."""

    name: str
    default: T
    help: str  # one line, for flags, the environment and the docs
    why: str = ""
    unit: Unit = ""
    minimum: float | None = None
    maximum: float | None = None
    exclusive_minimum: bool = False  # the minimum itself is not allowed
    choices: tuple[str, ...] = ()

    @property
    def real(self) -> bool:
        """A number that may have a fraction (checked finite)."""
        return isinstance(self.default, float)

    def check(self, value: object) -> None:
        """Raise `ValueError` naming the setting and its bound when `value` breaks it."""
        name, default = self.name, self.default
        if self.choices:
            if value not in self.choices:
                allowed = " or ".join(repr(c) for c in self.choices)
                raise ValueError(f"{name} must be {allowed}, got {value!r}")
        elif isinstance(default, bool):
            if not isinstance(value, bool):
                raise ValueError(f"{name} must be true or false, got {value!r}")
        elif isinstance(default, str):
            if not isinstance(value, str) or not value.strip():
                raise ValueError(f"{name} must not be empty")
        elif isinstance(default, int):
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(
                    f"{name} must be an integer number of {_UNIT_WORDS[self.unit]}, got {value!r}"
                )
            self._check_bounds(value)
        elif not _is_real(value):
            raise ValueError(f"{name} {self._bound_text()}, got {value!r}")
        else:
            self._check_bounds(float(value))  # type: ignore[arg-type]

    def _check_bounds(self, value: float) -> None:
        low, high = self.minimum, self.maximum
        if (low is not None and (value < low or (self.exclusive_minimum and value == low))) or (
            high is not None and value > high
        ):
            shown = value if self.unit == "C" else repr(value)
            raise ValueError(f"{self.name} {self._bound_text()}, got {shown}")

    def _bound_text(self) -> str:
        if self.unit == "fraction":
            return "must be a fraction between 0 and 1"
        if self.unit == "s":
            bound = "greater than 0" if self.exclusive_minimum else "at least 0"
            return f"must be a finite number of seconds {bound}"
        return f"must be between {self.minimum:g} and {self.maximum:g}"


_UNIT_WORDS: Final[dict[Unit, str]] = {"C": "degrees Celsius", "MiB": "MiB", "": "units"}


def _weight(name: str, default: float, headroom: str) -> Setting[float]:
    return Setting(
        name,
        default,
        f"Score weight of the {headroom} headroom (only the weights' ratios matter).",
        "The score is a weighted mean of three headrooms; utilization counts most.",
        unit="weight",
        minimum=0.0,
        maximum=1000.0,
    )


# The policy's settings, in the order flags, the policy file and the docs list them.
UTILIZATION_LIMIT: Final = Setting(
    "utilization_limit",
    0.90,
    "A node above this mean GPU utilization fails the filter.",
    "The original design's limit: room for a pod's load on a node not yet full.",
    unit="fraction",
    minimum=0.0,
    maximum=1.0,
)
TEMPERATURE_LIMIT_C: Final = Setting(
    "temperature_limit_c",
    85,
    "A node whose hottest GPU is at or above this (degrees C) fails the filter.",
    "85 C sits below the slowdown (clock-throttling) temperature of current NVIDIA data-centre "
    "GPUs, so a node is avoided before its GPUs start to throttle the work already there.",
    unit="C",
    minimum=1,
    maximum=150,
)
STALE_AFTER_S: Final = Setting(
    "stale_after_s",
    180.0,
    "Data older than this is stale (default 3 x the agent's heartbeat).",
    "3 x the agent's 60 s heartbeat: two missed heartbeats are tolerated before data is stale.",
    unit="s",
    minimum=0.0,
    exclusive_minimum=True,
)
CLOCK_SKEW_TOLERANCE_S: Final = Setting(
    "clock_skew_tolerance_s",
    30.0,
    "How far in the future updated-at may be before it counts as clock skew.",
    "`updated-at` this far in the scorer's future is still accepted (NTP-level drift).",
    unit="s",
    minimum=0.0,
)
MANAGED_FIELDS_LAG_TOLERANCE_S: Final = Setting(
    "managed_fields_lag_tolerance_s",
    30.0,
    "How far updated-at may run ahead of the API server's write time.",
    "updated-at (node clock, time of sampling) may run this far ahead of the API server's "
    "record of the agent's last write (server clock, always after sampling).",
    unit="s",
    minimum=0.0,
)
MISSING_DATA: Final[Setting[MissingData]] = Setting(
    "missing_data",
    "lenient",
    "lenient: missing/stale data passes with score 0; strict: it fails.",
    "Unknown data is not bad data: a node whose agent is late still takes pods, last.",
    choices=("lenient", "strict"),
)
REQUIRE_AGENT_WRITER: Final = Setting(
    "require_agent_writer",
    False,
    "Treat a Node's GPU annotations as unknown data (the missing-data policy) unless its "
    "managedFields show the agent wrote them.",
    "Off by default; on in the chart with its GPU-data admission policy, where only the "
    "agent's service account may write them at all (`judge.written_by_agent`).",
)
WEIGHT_UTILIZATION: Final = _weight("weight_utilization", 0.70, "utilization")
WEIGHT_FRAGMENTATION: Final = _weight("weight_fragmentation", 0.15, "fragmentation")
WEIGHT_TEMPERATURE: Final = _weight("weight_temperature", 0.15, "temperature")
GPU_RESOURCE_NAME: Final = Setting(
    "gpu_resource_name",
    "nvidia.com/gpu",
    "Extended resource a pod's GPUs are requested as.",
    "NVIDIA's device plugin's resource.",
)
INFLIGHT_MAX_S: Final = Setting(
    "inflight_max_s",
    600.0,
    "Longest a bound pod counts as in flight (from its bind), whatever its node publishes.",
    "Long enough for a GPU image's pull and start-up, short enough that a node whose agent "
    "never shows the pod is not held for it long.",
    unit="s",
    minimum=0.0,
)
INFLIGHT_LOAD_DELAY_S: Final = Setting(
    "inflight_load_delay_s",
    60.0,
    "How long after a pod's containers run its load is taken to show in the agent's utilization.",
    "The agent's averaging window (one sample interval, 5 s) plus the start-up of a GPU "
    "process (CUDA context, weights loaded to the GPU).",
    unit="s",
    minimum=0.0,
)
INFLIGHT_GPU_LOAD: Final = Setting(
    "inflight_gpu_load",
    1.0,
    "Utilization an in-flight pod adds per GPU unit, without its expected-gpu-load hint.",
    "A whole GPU busy, the conservative default (a time-sliced share sets its fraction in the "
    "hint).",
    unit="fraction",
    minimum=0.0,
    maximum=1.0,
)
MIN_GPU_FIT_PROBABILITY: Final = Setting(
    "min_gpu_fit_probability",
    0.75,
    "Least chance that the k GPUs a blind device plugin hands out are all candidates (nodes "
    "publishing per-gpu-allocated).",
    "7 of 8 candidates pass a 1-GPU pod; 4 of 8 do not.",
    unit="fraction",
    minimum=0.0,
    maximum=1.0,
)
BLIND_DEVICE_PLUGIN: Final = Setting(
    "blind_device_plugin",
    True,
    "Judge a node on the GPUs a load-blind device plugin could hand out; false counts the best "
    "k (only for a load-aware GPU allocator).",
    "NVIDIA's device plugin picks by topology or in no defined order, blind to load.",
)
# 16 TiB per GPU, the bound of the pods' memory hints (`hints.MAX_GPU_MEMORY_MIB`).
MAX_GPU_MEMORY_MIB: Final = 16 * 1024 * 1024
OWN_LOAD: Final = Setting(
    "own_load",
    True,
    "Count the load a pod will add (hint, else learned from its workload's running pods, else "
    "own-load-gpu-load) when judging each GPU; false judges GPUs by their load now.",
    "A GPU at or below the limit at the bind is pushed over it by the pod's own load in 82 % of "
    "the simulation's pushes without it (docs/performance.md); the cost is pods that wait.",
)
OWN_LOAD_GPU_LOAD: Final = Setting(
    "own_load_gpu_load",
    0.50,
    "Utilization a pod adds per GPU when neither its expected-gpu-load hint nor its workload's "
    "running pods say.",
    "Pods with no siblings are mostly training pods and notebooks, which keep a GPU busier than "
    "the mean pod: in the placement simulation's sweep 0.50 pushes a third fewer GPUs over the "
    "limit than 0.30 and still leaves fewer pods waiting than an oracle (docs/scoring.md, "
    "docs/performance.md).",
    unit="fraction",
    minimum=0.0,
    maximum=1.0,
)
OWN_LOAD_GPU_MEMORY_MIB: Final = Setting(
    "own_load_gpu_memory_mib",
    0,
    "GPU memory a pod's processes hold per GPU when neither its expected-gpu-memory-mib hint nor "
    "its workload's running pods say (0: not checked).",
    "None: a pod that needs memory free says so with min-gpu-memory-mib.",
    unit="MiB",
    minimum=0,
    maximum=MAX_GPU_MEMORY_MIB,
)
POLICY_SETTINGS: Final[tuple[Setting[Any], ...]] = (
    UTILIZATION_LIMIT,
    TEMPERATURE_LIMIT_C,
    STALE_AFTER_S,
    CLOCK_SKEW_TOLERANCE_S,
    MANAGED_FIELDS_LAG_TOLERANCE_S,
    MISSING_DATA,
    REQUIRE_AGENT_WRITER,
    WEIGHT_UTILIZATION,
    WEIGHT_FRAGMENTATION,
    WEIGHT_TEMPERATURE,
    GPU_RESOURCE_NAME,
    INFLIGHT_MAX_S,
    INFLIGHT_LOAD_DELAY_S,
    INFLIGHT_GPU_LOAD,
    MIN_GPU_FIT_PROBABILITY,
    BLIND_DEVICE_PLUGIN,
    OWN_LOAD,
    OWN_LOAD_GPU_LOAD,
    OWN_LOAD_GPU_MEMORY_MIB,
)


@dataclass(frozen=True, slots=True)
class Policy:
    """What the scorer enforces. Every field but `keys` and `profile` is a `Setting` of
    `POLICY_SETTINGS`, which holds its default, bounds and reasons; see docs/scoring.md."""

    keys: Keys = DEFAULT_KEYS
    utilization_limit: float = UTILIZATION_LIMIT.default
    temperature_limit_c: int = TEMPERATURE_LIMIT_C.default
    stale_after_s: float = STALE_AFTER_S.default
    clock_skew_tolerance_s: float = CLOCK_SKEW_TOLERANCE_S.default
    managed_fields_lag_tolerance_s: float = MANAGED_FIELDS_LAG_TOLERANCE_S.default
    missing_data: MissingData = MISSING_DATA.default
    require_agent_writer: bool = REQUIRE_AGENT_WRITER.default
    weight_utilization: float = WEIGHT_UTILIZATION.default
    weight_fragmentation: float = WEIGHT_FRAGMENTATION.default
    weight_temperature: float = WEIGHT_TEMPERATURE.default
    gpu_resource_name: str = GPU_RESOURCE_NAME.default
    inflight_max_s: float = INFLIGHT_MAX_S.default
    inflight_load_delay_s: float = INFLIGHT_LOAD_DELAY_S.default
    inflight_gpu_load: float = INFLIGHT_GPU_LOAD.default
    min_gpu_fit_probability: float = MIN_GPU_FIT_PROBABILITY.default
    blind_device_plugin: bool = BLIND_DEVICE_PLUGIN.default
    # The pod's own load (core/ownload.py): a GPU is a candidate only if its load plus the load
    # the pod will add stays within the limit, and the score reads the headroom left after it.
    own_load: bool = OWN_LOAD.default
    own_load_gpu_load: float = OWN_LOAD_GPU_LOAD.default
    own_load_gpu_memory_mib: int = OWN_LOAD_GPU_MEMORY_MIB.default
    # The tenant profile this policy is (`exporter_scheduler.config.profiles`); `default` for the
    # top-level policy. Named in explanations, logs and the request metrics.
    profile: str = "default"

    def __post_init__(self) -> None:
        for setting in POLICY_SETTINGS:
            setting.check(getattr(self, setting.name))
        if sum(weight_milli(self)) == 0:
            raise ValueError(
                "weight_utilization + weight_fragmentation + weight_temperature must be at "
                f"least {WEIGHT_RESOLUTION} (weights are used to the nearest {WEIGHT_RESOLUTION})"
            )


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


def format_fraction_limit(value: float) -> str:
    """A limit as reason texts show it: `0.90`, or more digits only when they matter (`0.875`)."""
    text = f"{value:.2f}"
    if float(text) == value:
        return text
    return f"{value:.4f}".rstrip("0")


def format_seconds(value: float) -> str:
    """`180` for whole seconds, `2.5` otherwise: reason texts never show `180.0`."""
    return str(int(value)) if float(value).is_integer() else f"{value:g}"
