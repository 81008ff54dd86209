"""The scorer's settings: one class, read from flags, `GPU_SCORER_*` variables and a policy file.

Precedence, highest first: command-line flags, environment variables, the policy file
(`--policy-file`, YAML or JSON, policy fields only), built-in defaults. Everything is validated
at start-up, and a bad value stops the process with one message naming the setting, where it can
be set, and the bound it broke, instead of surfacing later as odd verdicts.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from contextvars import ContextVar
from pathlib import Path
from typing import Any, Final, Literal

import yaml
from pydantic import Field, TypeAdapter, ValidationError, field_validator, model_validator
from pydantic.fields import FieldInfo
from pydantic_settings import (
    BaseSettings,
    InitSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from exporter_scheduler.config.profiles import PolicySet, ProfileError, parse_profiles
from exporter_scheduler.core.policy import (
    MAX_TEMPERATURE_LIMIT_C,
    MAX_WEIGHT,
    MIN_TEMPERATURE_LIMIT_C,
)
from exporter_scheduler.core.policy import Policy as _Policy
from exporter_scheduler.edges.server import DEFAULT_KEEP_ALIVE_S, TlsFiles
from exporter_scheduler.serving.app import DEFAULT_MAX_BODY_BYTES
from gpu_contract.schema import DEFAULT_PREFIX, Keys, PrefixError

ENV_PREFIX: Final = "GPU_SCORER_"
_DEFAULT_POLICY: Final = _Policy()

# Settings a policy file may carry: what to decide, not how to serve.
POLICY_FIELDS: Final = (
    "annotation_prefix",
    "utilization_limit",
    "temperature_limit_c",
    "stale_after_s",
    "clock_skew_tolerance_s",
    "managed_fields_lag_tolerance_s",
    "missing_data",
    "require_agent_writer",
    "weight_utilization",
    "weight_fragmentation",
    "weight_temperature",
    "gpu_resource_name",
    "inflight_max_s",
    "inflight_load_delay_s",
    "inflight_gpu_load",
    "min_gpu_fit_probability",
    "blind_device_plugin",
    "own_load",
    "own_load_gpu_load",
    "own_load_gpu_memory_mib",
)

# What a profile may override: the policy settings but the cluster-wide ones.
_PROFILE_FIELDS: Final = tuple(f for f in POLICY_FIELDS if f != "annotation_prefix")
FILE_ONLY: Final = frozenset({"profiles"})

LogLevel = Literal["debug", "info", "warning", "error"]


class SettingsError(ValueError):
    """A setting is invalid; the message names it, where it comes from, and the bound."""


def flag_name(field: str) -> str:
    return "--" + field.replace("_", "-")


def env_name(field: str) -> str:
    return ENV_PREFIX + field.upper()


def _source(field: str) -> str:
    """`field (--flag / ENV)`: where an operator sets it, for messages about two settings."""
    return f"{field} ({flag_name(field)} / {env_name(field)})"


def _finite(value: float) -> float:
    if not math.isfinite(value):
        raise ValueError("must be a finite number")
    return value


class ScorerSettings(BaseSettings):
    """Every setting of `gpu-scorer serve` (docs/scorer.md has the table)."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="forbid", frozen=True)

    # -- serving
    host: str = Field("0.0.0.0", description="Address to listen on.")
    port: int = Field(8888, ge=1, le=65535, description="TCP port to listen on.")
    metrics_port: int | None = Field(
        None,
        ge=1,
        le=65535,
        description="A second port, plain HTTP, serving only /metrics, /healthz and /readyz "
        "(so a NetworkPolicy can let a scraper reach them and not the extender verbs).",
    )
    path_prefix: str = Field("/", description="URL path before /filter, /prioritize, /explain.")
    max_body_bytes: int = Field(
        DEFAULT_MAX_BODY_BYTES,
        ge=1024,
        le=1024**3,
        description="Largest request body accepted; larger ones get 413.",
    )
    keep_alive_s: int = Field(
        DEFAULT_KEEP_ALIVE_S,
        # kube-scheduler's client keeps idle connections 90 s; closing at or before that races
        # its next request on the connection, which then fails as an extender error.
        ge=91,
        le=3600,
        description="Idle keep-alive timeout; must outlast kube-scheduler's 90 s.",
    )
    tls_cert_file: Path | None = Field(None, description="Serve HTTPS with this certificate.")
    tls_key_file: Path | None = Field(None, description="Private key of --tls-cert-file.")
    tls_client_ca_file: Path | None = Field(
        None, description="Require client certificates signed by this CA."
    )
    log_level: LogLevel = Field("info", description="Log level (JSON lines on stderr).")
    # -- names-only mode
    node_cache: bool = Field(
        False, description="Keep a list+watch cache of Nodes (nodeCacheCapable: true)."
    )
    kubeconfig: Path | None = Field(
        None, description="Kubeconfig for --node-cache; in-cluster credentials when unset."
    )
    # -- policy
    policy_file: Path | None = Field(None, description="YAML/JSON file with policy settings.")
    annotation_prefix: str = Field(DEFAULT_PREFIX, description="Prefix of the agent's annotations.")
    utilization_limit: float = Field(
        _DEFAULT_POLICY.utilization_limit,
        ge=0.0,
        le=1.0,
        description="A node above this mean GPU utilization fails the filter.",
    )
    temperature_limit_c: int = Field(
        _DEFAULT_POLICY.temperature_limit_c,
        ge=MIN_TEMPERATURE_LIMIT_C,
        le=MAX_TEMPERATURE_LIMIT_C,
        description="A node whose hottest GPU is at or above this fails the filter.",
    )
    stale_after_s: float = Field(
        _DEFAULT_POLICY.stale_after_s,
        gt=0.0,
        description="Data older than this is stale (default 3 x the agent's heartbeat).",
    )
    clock_skew_tolerance_s: float = Field(
        _DEFAULT_POLICY.clock_skew_tolerance_s,
        ge=0.0,
        description="How far in the future updated-at may be before it counts as clock skew.",
    )
    managed_fields_lag_tolerance_s: float = Field(
        _DEFAULT_POLICY.managed_fields_lag_tolerance_s,
        ge=0.0,
        description="How far updated-at may run ahead of the API server's write time.",
    )
    missing_data: Literal["lenient", "strict"] = Field(
        _DEFAULT_POLICY.missing_data,
        description="lenient: missing/stale data passes with score 0; strict: it fails.",
    )
    require_agent_writer: bool = Field(
        _DEFAULT_POLICY.require_agent_writer,
        description="Treat a Node's GPU annotations as unknown data (the missing-data policy) "
        "unless its managedFields show the agent wrote them.",
    )
    weight_utilization: float = Field(
        _DEFAULT_POLICY.weight_utilization,
        ge=0.0,
        le=MAX_WEIGHT,
        description="Score weight of the utilization headroom (only the weights' ratios matter).",
    )
    weight_fragmentation: float = Field(
        _DEFAULT_POLICY.weight_fragmentation,
        ge=0.0,
        le=MAX_WEIGHT,
        description="Score weight of the fragmentation headroom (only the weights' ratios matter).",
    )
    weight_temperature: float = Field(
        _DEFAULT_POLICY.weight_temperature,
        ge=0.0,
        le=MAX_WEIGHT,
        description="Score weight of the temperature headroom (only the weights' ratios matter).",
    )
    gpu_resource_name: str = Field(
        _DEFAULT_POLICY.gpu_resource_name, description="Extended resource a pod's GPUs are in."
    )
    # -- in-flight pods
    pod_watch: bool = Field(
        True,
        description="Watch GPU pods bound to nodes and count those the nodes' data cannot show "
        "yet (in-flight accounting; needs list/watch on pods, and credentials as --node-cache).",
    )
    inflight_max_s: float = Field(
        _DEFAULT_POLICY.inflight_max_s,
        ge=0.0,
        description="Longest a bound pod counts as in flight, whatever its node publishes.",
    )
    inflight_load_delay_s: float = Field(
        _DEFAULT_POLICY.inflight_load_delay_s,
        ge=0.0,
        description="How long after a pod's containers run its load is taken to show in the "
        "agent's utilization.",
    )
    inflight_gpu_load: float = Field(
        _DEFAULT_POLICY.inflight_gpu_load,
        ge=0.0,
        le=1.0,
        description="Utilization an in-flight pod adds per GPU unit, without its "
        "expected-gpu-load hint.",
    )
    min_gpu_fit_probability: float = Field(
        _DEFAULT_POLICY.min_gpu_fit_probability,
        ge=0.0,
        le=1.0,
        description="Least chance that the k GPUs a blind device plugin hands out are all "
        "candidates (nodes publishing allocations).",
    )
    profiles: list[dict[str, Any]] = Field(
        default_factory=list,
        description="Policy file only: tenant profiles, each a name, namespaces and/or a "
        "namespace-selector, and the policy settings it overrides (docs/scoring.md).",
    )
    own_load: bool = Field(
        _DEFAULT_POLICY.own_load,
        description="Count the load a pod will add (hint, else learned from its workload's "
        "running pods, else own-load-gpu-load) when judging each GPU; false judges GPUs by "
        "their load now.",
    )
    own_load_gpu_load: float = Field(
        _DEFAULT_POLICY.own_load_gpu_load,
        ge=0.0,
        le=1.0,
        description="Utilization a pod adds per GPU when neither its expected-gpu-load hint "
        "nor its workload's running pods say.",
    )
    own_load_gpu_memory_mib: int = Field(
        _DEFAULT_POLICY.own_load_gpu_memory_mib,
        ge=0,
        le=16 * 1024 * 1024,
        description="GPU memory a pod's processes hold per GPU when neither its "
        "expected-gpu-memory-mib hint nor its workload's running pods say (0: not checked).",
    )
    own_load_min_samples: int = Field(
        2,
        ge=1,
        le=1000,
        description="Per-GPU samples of a workload's running pods below which its learned "
        "load is not trusted (the default applies).",
    )
    own_load_max_age_s: float = Field(
        3600.0,
        gt=0.0,
        description="Samples of a workload's pods older than this no longer count.",
    )
    own_load_max_workloads: int = Field(
        10_000,
        ge=1,
        le=10_000_000,
        description="Workloads whose load is kept (least recently sampled dropped first).",
    )
    blind_device_plugin: bool = Field(
        _DEFAULT_POLICY.blind_device_plugin,
        description="Judge a node on the GPUs a load-blind device plugin could hand out; false "
        "counts the best k (only for a load-aware GPU allocator).",
    )

    @field_validator(
        "utilization_limit",
        "stale_after_s",
        "clock_skew_tolerance_s",
        "managed_fields_lag_tolerance_s",
        "weight_utilization",
        "weight_fragmentation",
        "weight_temperature",
        "inflight_max_s",
        "inflight_load_delay_s",
        "inflight_gpu_load",
        "min_gpu_fit_probability",
        "own_load_gpu_load",
        "own_load_max_age_s",
    )
    @classmethod
    def _no_nan(cls, value: float) -> float:
        return _finite(value)

    @field_validator("annotation_prefix")
    @classmethod
    def _prefix(cls, value: str) -> str:
        return Keys.for_prefix(value).prefix

    @model_validator(mode="after")
    def _consistent(self) -> ScorerSettings:
        cert, key, ca = (_source("tls_cert_file"), _source("tls_key_file"),
                         _source("tls_client_ca_file"))  # fmt: skip
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            raise ValueError(f"{cert} and {key} must be given together")
        if self.tls_client_ca_file is not None and self.tls_cert_file is None:
            raise ValueError(f"{ca} needs {cert} and {key}")
        for name in ("tls_cert_file", "tls_key_file", "tls_client_ca_file"):
            path = getattr(self, name)
            if path is not None and not path.is_file():
                raise ValueError(f"{_source(name)}: file not found: {path}")
        if self.kubeconfig is not None and not self.kubeconfig.is_file():
            raise ValueError(f"{_source('kubeconfig')}: kubeconfig not found: {self.kubeconfig}")
        self.policy_set()  # raises ValueError naming the field (and profile) and its bound
        return self

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # Flags arrive as init arguments; the policy file ranks below the environment.
        return (
            init_settings,
            env_settings,
            InitSettingsSource(settings_cls, init_kwargs=_POLICY_FILE_VALUES.get() or {}),
        )

    def policy(self) -> _Policy:
        return _Policy(
            keys=Keys.for_prefix(self.annotation_prefix),
            utilization_limit=self.utilization_limit,
            temperature_limit_c=self.temperature_limit_c,
            stale_after_s=self.stale_after_s,
            clock_skew_tolerance_s=self.clock_skew_tolerance_s,
            managed_fields_lag_tolerance_s=self.managed_fields_lag_tolerance_s,
            missing_data=self.missing_data,
            require_agent_writer=self.require_agent_writer,
            weight_utilization=self.weight_utilization,
            weight_fragmentation=self.weight_fragmentation,
            weight_temperature=self.weight_temperature,
            gpu_resource_name=self.gpu_resource_name,
            inflight_max_s=self.inflight_max_s,
            inflight_load_delay_s=self.inflight_load_delay_s,
            inflight_gpu_load=self.inflight_gpu_load,
            min_gpu_fit_probability=self.min_gpu_fit_probability,
            blind_device_plugin=self.blind_device_plugin,
            own_load=self.own_load,
            own_load_gpu_load=self.own_load_gpu_load,
            own_load_gpu_memory_mib=self.own_load_gpu_memory_mib,
        )

    def policy_set(self) -> PolicySet:
        """The top-level policy and the tenant profiles built on it."""
        default = self.policy()
        try:
            profiles = parse_profiles(self.profiles, default, _PROFILE_FIELDS, _coerce)
        except ProfileError as exc:
            raise ValueError(f"policy file: {exc}") from None
        return PolicySet(default, profiles)

    def tls(self) -> TlsFiles | None:
        if self.tls_cert_file is None or self.tls_key_file is None:
            return None
        return TlsFiles(
            cert_file=str(self.tls_cert_file),
            key_file=str(self.tls_key_file),
            client_ca_file=None
            if self.tls_client_ca_file is None
            else str(self.tls_client_ca_file),
        )


_POLICY_FILE_VALUES: ContextVar[dict[str, Any] | None] = ContextVar(
    "_POLICY_FILE_VALUES", default=None
)


def read_policy_file(path: Path) -> dict[str, Any]:
    """Policy settings from a YAML or JSON mapping; keys may use `-` or `_`."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise SettingsError(f"policy file {path}: cannot read it ({exc.strerror})") from None
    try:
        loaded = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as exc:
        raise SettingsError(f"policy file {path}: not valid YAML/JSON ({exc})") from None
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise SettingsError(f"policy file {path}: must be a mapping of policy settings")
    values: dict[str, Any] = {}
    for key, value in loaded.items():
        name = str(key).replace("-", "_")
        if name == "profiles":
            values[name] = value  # checked with the policy it builds on (`policy_set`)
            continue
        if name not in POLICY_FIELDS:
            raise SettingsError(
                f"policy file {path}: unknown setting {key!r}; known: {', '.join(POLICY_FIELDS)}"
            )
        values[name] = value
    return values


def _coerce(field: str, value: object) -> object:
    """A profile's override read with the setting's own type (bounds are the Policy's)."""
    annotation = ScorerSettings.model_fields[field].annotation
    assert annotation is not None  # every setting is annotated
    try:
        return TypeAdapter(annotation).validate_python(value)
    except ValidationError as exc:
        message = "; ".join(str(e["msg"]) for e in exc.errors(include_url=False))
        raise ValueError(f"{message} (got {value!r})") from None


def _describe(field: str) -> str:
    if field in FILE_ONLY:
        return f"policy file's {field}"
    if field in ScorerSettings.model_fields:
        return f"setting {field} ({flag_name(field)} / {env_name(field)})"
    return f"setting {field}" if field else "settings"


def _format_validation_error(exc: ValidationError) -> str:
    lines = []
    for error in exc.errors(include_url=False):
        field = str(error["loc"][0]) if error["loc"] else ""
        message = str(error["msg"]).removeprefix("Value error, ")
        if error["type"] == "extra_forbidden":
            message = "no such setting"
        shown = "" if error.get("input") is None or not field else f" (got {error['input']!r})"
        lines.append(f"invalid {_describe(field)}: {message}{shown}")
    return "; ".join(lines)


def load_settings(flags: Mapping[str, Any] | None = None) -> ScorerSettings:
    """Build and validate the settings; raise `SettingsError` with one readable message."""
    given = {k: v for k, v in (flags or {}).items() if v is not None}
    file_arg = given.get("policy_file") or os.environ.get(env_name("policy_file"))
    file_values = read_policy_file(Path(file_arg)) if file_arg else {}
    token = _POLICY_FILE_VALUES.set(file_values)
    try:
        return ScorerSettings(**given)
    except ValidationError as exc:
        raise SettingsError(_format_validation_error(exc)) from None
    except (PrefixError, ValueError) as exc:
        raise SettingsError(f"invalid settings: {exc}") from None
    finally:
        _POLICY_FILE_VALUES.reset(token)


def settings_fields() -> dict[str, FieldInfo]:
    """Every setting and its pydantic field (for the CLI parser and the docs); `profiles` is
    the policy file's alone (a list of mappings has no flag)."""
    return {k: v for k, v in ScorerSettings.model_fields.items() if k not in FILE_ONLY}
