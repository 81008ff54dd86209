"""The agent's settings: one validated object built from flags, environment and defaults.

Every setting is a command-line flag (`--sample-interval-s`) and an environment variable with
the `GPU_AGENT_` prefix (`GPU_AGENT_SAMPLE_INTERVAL_S`), named with its unit; the node name is
also read from `NODE_NAME`, which the chart fills from the pod's `spec.nodeName`. A setting
renamed to carry its unit still accepts its old spelling (`RENAMED`). Flags override the
environment, which overrides the defaults. Bounds are checked once at start-up, and a violation
is reported as one line naming the setting, its flag and variable, and the bound
(`settings_error_message`).

`AgentSettings.model_fields`, `flag_name` and `env_names` are the public list of accepted names;
the chart's consistency check imports them.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Final, Literal

from pydantic import AliasChoices, Field, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from agent.allocations import DEFAULT_POD_RESOURCES_SOCKET
from agent.dra import DEFAULT_DRIVER, TaintPolicy
from agent.limiter import WritePolicy
from gpu_contract.schema import DEFAULT_PREFIX, Keys, PrefixError, normalize_prefix

ENV_PREFIX = "GPU_AGENT_"

SourceKind = Literal["nvml", "simulated"]
LogFormat = Literal["text", "json"]
LogLevel = Literal["DEBUG", "INFO", "WARNING", "ERROR"]


# Settings whose names gained their unit; the old spellings (flags and variables that
# docs/agent.md listed) are still accepted, as deprecated aliases, so that existing manifests
# and scripts keep working. New name -> old name.
RENAMED: Final[dict[str, str]] = {
    "sample_interval_s": "sample_interval",
    "min_write_interval_s": "min_write_interval",
    "heartbeat_s": "heartbeat",
    "temperature_deadband_c": "temperature_deadband",
    "memory_deadband_fraction": "memory_deadband",
    "per_gpu_temperature_deadband_c": "per_gpu_temperature_deadband",
    "per_gpu_memory_deadband_fraction": "per_gpu_memory_deadband",
    "pod_memory_deadband_fraction": "pod_memory_deadband",
    "backoff_base_s": "backoff_base",
    "backoff_max_s": "backoff_max",
}
_OLD_NAMES: Final = {old: new for new, old in RENAMED.items()}
# The write rules' numbers (`WritePolicy`), each a setting of the same name; `per_gpu_compare`
# is fixed by design.
WRITE_POLICY_SETTINGS: Final = tuple(
    f.name for f in dataclasses.fields(WritePolicy) if f.name != "per_gpu_compare"
)


def _renamed(name: str) -> AliasChoices:
    """Read setting `name` from its own variable, then from its old one, or by either name."""
    old = RENAMED[name]
    return AliasChoices(name, ENV_PREFIX + name.upper(), old, ENV_PREFIX + old.upper())


class SettingsError(ValueError):
    """Invalid settings; the message is one line an operator can act on."""


class AgentSettings(BaseSettings):
    """The agent's settings. Durations are seconds; names match the flags."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        extra="forbid",
        populate_by_name=True,
        frozen=True,
    )

    node_name: str | None = Field(
        default=None,
        validation_alias=AliasChoices(f"{ENV_PREFIX}NODE_NAME", "NODE_NAME"),
        description="The Node this agent annotates (its own). Required to write.",
    )
    source: SourceKind = Field(default="nvml", description="Where GPU readings come from.")
    sample_interval_s: float = Field(
        validation_alias=_renamed("sample_interval_s"),
        default=5.0,
        gt=0,
        le=3600,
        description="Seconds between samples (ticks).",
    )
    min_write_interval_s: float = Field(
        validation_alias=_renamed("min_write_interval_s"),
        default=10.0,
        gt=0,
        description="Minimum seconds between two write attempts.",
    )
    heartbeat_s: float = Field(
        validation_alias=_renamed("heartbeat_s"),
        default=60.0,
        gt=0,
        description="Write at least this often (seconds) while the API is up.",
    )
    utilization_deadband: float = Field(
        default=0.05, ge=0, le=1, description="Utilization change that is worth a write."
    )
    utilization_max_deadband: float = Field(
        default=0.10,
        ge=0,
        le=1,
        description="Change of the busiest GPU's utilization (utilization-max) worth a write.",
    )
    fragmentation_deadband: float = Field(
        default=0.05, ge=0, le=1, description="Memory fragmentation change worth a write."
    )
    temperature_deadband_c: float = Field(
        validation_alias=_renamed("temperature_deadband_c"),
        default=5.0,
        ge=0,
        le=100,
        description="Change of the hottest GPU's temperature (degrees C) worth a write.",
    )
    memory_deadband_fraction: float = Field(
        validation_alias=_renamed("memory_deadband_fraction"),
        default=0.05,
        ge=0,
        le=1,
        description="Free-memory change worth a write, as a fraction of total GPU memory.",
    )
    improving_deadband_factor: float = Field(
        default=3.0,
        ge=1,
        le=100,
        description=(
            "A move towards more headroom (idler, cooler, more free memory) must be this many "
            "times its deadband to be written before the heartbeat; 1: symmetric deadbands."
        ),
    )
    per_gpu_utilization_deadband: float = Field(
        default=0.15, ge=0, le=1, description="Change of one GPU's utilization worth a write."
    )
    per_gpu_temperature_deadband_c: float = Field(
        validation_alias=_renamed("per_gpu_temperature_deadband_c"),
        default=5.0,
        ge=0,
        le=100,
        description="Change of one GPU's temperature (degrees C) worth a write.",
    )
    per_gpu_memory_deadband_fraction: float = Field(
        validation_alias=_renamed("per_gpu_memory_deadband_fraction"),
        default=0.05,
        ge=0,
        le=1,
        description="Change of one GPU's free memory worth a write, as a fraction of one GPU's.",
    )
    pod_utilization_deadband: float = Field(
        default=0.15,
        ge=0,
        le=1,
        description="Change of a pod's utilization on one GPU (pod-gpu-usage) worth a write.",
    )
    pod_memory_deadband_fraction: float = Field(
        validation_alias=_renamed("pod_memory_deadband_fraction"),
        default=0.05,
        ge=0,
        le=1,
        description=(
            "Change of a pod's memory on one GPU (pod-gpu-usage) worth a write, as a fraction "
            "of one GPU's memory."
        ),
    )
    backoff_base_s: float = Field(
        validation_alias=_renamed("backoff_base_s"),
        default=10.0,
        gt=0,
        description="First wait (seconds) after a failed write.",
    )
    backoff_max_s: float = Field(
        validation_alias=_renamed("backoff_max_s"),
        default=120.0,
        gt=0,
        le=3600,
        description="Longest wait (seconds) between failed writes.",
    )
    api_timeout: float = Field(
        default=5.0, gt=0, le=60, description="Read timeout (seconds) of one API request."
    )
    pod_resources: bool = Field(
        default=True,
        description=(
            "Read GPU allocations (per-gpu-allocated) from the kubelet's pod-resources API; "
            "false: never ask the kubelet, leave the key out."
        ),
    )
    pod_resources_socket: str = Field(
        default=DEFAULT_POD_RESOURCES_SOCKET,
        min_length=1,
        description="The kubelet's pod-resources unix socket.",
    )
    pod_resources_timeout: float = Field(
        default=1.0, gt=0, le=30, description="Seconds one pod-resources call may take."
    )
    dra_taints: bool = Field(
        default=True,
        description=(
            "Publish a DeviceTaintRule (NoSchedule) for each of the node's DRA GPUs that breaks "
            "the device rules; without the API or its RBAC the agent says so once and goes on."
        ),
    )
    dra_driver: str = Field(
        default=DEFAULT_DRIVER,
        min_length=1,
        description="The DRA driver whose ResourceSlices publish this node's GPUs.",
    )
    dra_utilization_limit: float = Field(
        default=0.90,
        gt=0,
        le=1,
        description="Taint a GPU whose window-averaged utilization is above this (the scorer's).",
    )
    dra_utilization_margin: float = Field(
        default=0.10,
        ge=0,
        lt=1,
        description="Untaint only when utilization is below the limit minus this.",
    )
    dra_temperature_limit: int = Field(
        default=85,
        ge=1,
        le=150,
        description="Taint a GPU at or above this temperature, degrees C (the scorer's).",
    )
    dra_temperature_margin: int = Field(
        default=5,
        ge=0,
        le=50,
        description="Untaint only when the temperature is below the limit minus this.",
    )
    dra_min_write_interval: float = Field(
        default=60.0,
        gt=0,
        le=3600,
        description="Minimum seconds between two taint writes of one GPU.",
    )
    dra_max_writes_per_hour: int = Field(
        default=12, ge=1, le=3600, description="Most taint writes of one GPU in any hour."
    )
    dra_resync_interval: float = Field(
        default=300.0,
        gt=0,
        le=86400,
        description="Seconds between re-reads of the ResourceSlices and the agent's rules.",
    )
    process_attribution: bool = Field(
        default=False,
        description=(
            "Attribute GPUs shared by several pods to the pods per process (NVML's per-process "
            "figures, processes mapped to pods by their cgroups, pods named by the API server); "
            "needs the host's PID namespace (hostPID) and 'list' on pods. Off: those pods' "
            "figures are '-'."
        ),
    )
    proc_root: str = Field(
        default="/proc",
        min_length=1,
        description="Where the processes NVML names are visible (the host's /proc with hostPID).",
    )
    annotation_prefix: str = Field(
        default=DEFAULT_PREFIX, description="Annotation key prefix (a DNS subdomain you own)."
    )
    kubeconfig: str | None = Field(
        default=None, description="Path to a kubeconfig; unset means the in-cluster config."
    )
    metrics_port: int = Field(
        default=9400, ge=0, le=65535, description="Port of /metrics, /healthz, /readyz; 0: off."
    )
    metrics_address: str = Field(
        default="0.0.0.0", description="Address the metrics and health server binds."
    )
    simulated_gpus: int = Field(default=8, ge=1, le=64, description="GPUs of the simulated source.")
    simulated_model: str = Field(
        default="NVIDIA A100-SXM4-80GB", min_length=1, description="Simulated GPU product name."
    )
    simulated_lose_gpu_after: float | None = Field(
        default=None, gt=0, description="Simulated source: lose one GPU after this many seconds."
    )
    simulated_pods: bool = Field(
        default=False,
        description="Simulated source: publish its jobs as pods on time-sliced GPUs.",
    )
    seed: int = Field(default=0, description="Seed of the simulated trace and the start jitter.")
    log_level: LogLevel = Field(default="INFO", description="Log level.")
    log_format: LogFormat = Field(default="text", description="Log line format.")

    @field_validator("annotation_prefix")
    @classmethod
    def _prefix(cls, value: str) -> str:
        try:
            return normalize_prefix(value)
        except PrefixError as exc:
            raise ValueError(str(exc)) from None

    @field_validator("log_level", mode="before")
    @classmethod
    def _upper(cls, value: object) -> object:
        return value.upper() if isinstance(value, str) else value

    @model_validator(mode="after")
    def _ordering(self) -> AgentSettings:
        # The limiter's guarantees need heartbeat >= min write interval >= sample interval.
        if self.min_write_interval_s < self.sample_interval_s:
            raise ValueError(
                f"min-write-interval-s ({self.min_write_interval_s:g}) must be >= "
                f"sample-interval-s ({self.sample_interval_s:g})"
            )
        if self.heartbeat_s < self.min_write_interval_s:
            raise ValueError(
                f"heartbeat-s ({self.heartbeat_s:g}) must be >= min-write-interval-s "
                f"({self.min_write_interval_s:g})"
            )
        if self.dra_utilization_margin >= self.dra_utilization_limit:
            raise ValueError(
                f"dra-utilization-margin ({self.dra_utilization_margin:g}) must be < "
                f"dra-utilization-limit ({self.dra_utilization_limit:g})"
            )
        if self.dra_temperature_margin >= self.dra_temperature_limit:
            raise ValueError(
                f"dra-temperature-margin ({self.dra_temperature_margin}) must be < "
                f"dra-temperature-limit ({self.dra_temperature_limit})"
            )
        if self.process_attribution and not self.pod_resources:
            raise ValueError(
                "process-attribution needs pod-resources: without the kubelet's allocations no "
                "pod holds a GPU"
            )
        if self.backoff_max_s < self.backoff_base_s:
            raise ValueError(
                f"backoff-max-s ({self.backoff_max_s:g}) must be >= backoff-base-s "
                f"({self.backoff_base_s:g})"
            )
        return self

    def write_policy(self) -> WritePolicy:
        # Every number of the write rules is a setting of the same name (units included).
        return WritePolicy(**{name: getattr(self, name) for name in WRITE_POLICY_SETTINGS})

    def taint_policy(self) -> TaintPolicy:
        try:
            return TaintPolicy(
                utilization_limit=self.dra_utilization_limit,
                utilization_margin=self.dra_utilization_margin,
                temperature_limit_c=self.dra_temperature_limit,
                temperature_margin_c=self.dra_temperature_margin,
                min_write_interval_s=self.dra_min_write_interval,
                max_writes_per_hour=self.dra_max_writes_per_hour,
                backoff_base_s=max(self.backoff_base_s, self.dra_min_write_interval),
                backoff_max_s=max(self.backoff_max_s, self.dra_min_write_interval),
            )
        except ValueError as exc:
            raise SettingsError(f"invalid settings: {exc}") from None

    def keys(self) -> Keys:
        return Keys.for_prefix(self.annotation_prefix)

    def log_level_number(self) -> int:
        return int(logging.getLevelName(self.log_level))


def flag_name(field_name: str) -> str:
    """`sample_interval_s` -> `--sample-interval-s`."""
    return "--" + field_name.replace("_", "-")


def env_names(field_name: str) -> tuple[str, ...]:
    """The environment variables a setting is read from, preferred first (then deprecated)."""
    if field_name == "node_name":
        return (ENV_PREFIX + "NODE_NAME", "NODE_NAME")
    old = RENAMED.get(field_name)
    return (ENV_PREFIX + field_name.upper(), *(() if old is None else (ENV_PREFIX + old.upper(),)))


def settings_error_message(error: ValidationError) -> str:
    """One line per violated bound, naming the flag and variable: what an operator needs."""
    parts: list[str] = []
    for item in error.errors():
        loc = [str(part) for part in item.get("loc", ())]
        message = str(item.get("msg", "invalid")).removeprefix("Value error, ")
        if loc:
            name = loc[0]
            if name.startswith(ENV_PREFIX.lower()) or name.startswith(ENV_PREFIX):
                name = name[len(ENV_PREFIX) :].lower()
            name = name.lower()
            name = _OLD_NAMES.get(name, name)
            if name == "node_name" or name in AgentSettings.model_fields:
                names = env_names(name)[:1] if name in RENAMED else env_names(name)
                label = f"{flag_name(name)} / {' / '.join(names)}"
            else:
                label = name
            got = item.get("input")
            parts.append(f"{label}: {message} (got {got!r})")
        else:
            parts.append(message)
    return "invalid settings: " + "; ".join(parts)


def load_settings(**overrides: object) -> AgentSettings:
    """Settings from the environment with `overrides` (the given flags) on top."""
    given = {k: v for k, v in overrides.items() if v is not None}
    try:
        return AgentSettings(**given)  # type: ignore[arg-type]
    except ValidationError as exc:
        raise SettingsError(settings_error_message(exc)) from None
