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
from exporter_scheduler.config.selectors import selector_error
from exporter_scheduler.config.serving import (
    DEFAULT_KEEP_ALIVE_S,
    DEFAULT_MAX_BODY_BYTES,
    TlsFiles,
)
from exporter_scheduler.core import policy as p
from exporter_scheduler.core.ownload import DEFAULT_SETTLE_S
from exporter_scheduler.core.policy import Policy as _Policy
from gpu_contract.schema import DEFAULT_PREFIX, Keys, PrefixError

ENV_PREFIX: Final = "GPU_SCORER_"

# Settings a policy file may carry: what to decide, not how to serve. Each but the prefix (which
# gives the policy its keys) is a `core.policy.Setting`, defined there once.
POLICY_FIELDS: Final = ("annotation_prefix", *(s.name for s in p.POLICY_SETTINGS))

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


def _field(setting: p.Setting[Any]) -> Any:
    """A policy setting's pydantic field: its default, bounds and help, from the one table."""
    exclusive = setting.exclusive_minimum
    return Field(
        setting.default,
        ge=None if exclusive else setting.minimum,
        gt=setting.minimum if exclusive else None,
        le=setting.maximum,
        description=setting.help,
    )


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
    utilization_limit: float = _field(p.UTILIZATION_LIMIT)
    temperature_limit_c: int = _field(p.TEMPERATURE_LIMIT_C)
    stale_after_s: float = _field(p.STALE_AFTER_S)
    clock_skew_tolerance_s: float = _field(p.CLOCK_SKEW_TOLERANCE_S)
    managed_fields_lag_tolerance_s: float = _field(p.MANAGED_FIELDS_LAG_TOLERANCE_S)
    missing_data: p.MissingData = _field(p.MISSING_DATA)
    require_agent_writer: bool = _field(p.REQUIRE_AGENT_WRITER)
    weight_utilization: float = _field(p.WEIGHT_UTILIZATION)
    weight_fragmentation: float = _field(p.WEIGHT_FRAGMENTATION)
    weight_temperature: float = _field(p.WEIGHT_TEMPERATURE)
    gpu_resource_name: str = _field(p.GPU_RESOURCE_NAME)
    # -- in-flight pods
    pod_watch: bool = Field(
        True,
        description="Watch GPU pods bound to nodes and count those the nodes' data cannot show "
        "yet (in-flight accounting; needs list/watch on pods, and credentials as --node-cache).",
    )
    pod_label_selector: str | None = Field(
        None,
        description="Watch only the pods with these labels (a label selector, e.g. "
        "gpu-scheduler.example.com/gpu-pod=true as the chart's admission policy sets it on GPU "
        "pods): the LIST's bytes and CPU then grow with the GPU pods rather than every bound "
        'pod; a GPU pod without the labels is not counted (docs/deploy.md, "GPU pod label").',
    )
    # -- DRA pods (docs/scoring.md, "DRA pods")
    dra: bool = Field(
        False,
        description="Judge pods that ask for GPUs through DRA on the devices the allocator may "
        "still give them (a watch of ResourceClaims and DeviceTaintRules; needs list/watch on "
        "both, and credentials as --node-cache).",
    )
    dra_driver: str = Field(
        "gpu.nvidia.com",
        min_length=1,
        description="The DRA driver whose devices are GPUs (pools named after nodes).",
    )
    dra_device_classes: str = Field(
        "gpu.nvidia.com",
        min_length=1,
        description="Comma-separated DeviceClasses whose requests count as GPUs.",
    )
    dra_extended_resource: bool = Field(
        False,
        description="The GPU extended resource (gpu-resource-name) is DRA-backed: a DeviceClass "
        "names it in extendedResourceName, so a pod requesting it is judged as a DRA pod.",
    )
    inflight_max_s: float = _field(p.INFLIGHT_MAX_S)
    inflight_load_delay_s: float = _field(p.INFLIGHT_LOAD_DELAY_S)
    inflight_gpu_load: float = _field(p.INFLIGHT_GPU_LOAD)
    min_gpu_fit_probability: float = _field(p.MIN_GPU_FIT_PROBABILITY)
    profiles: list[dict[str, Any]] = Field(
        default_factory=list,
        description="Policy file only: tenant profiles, each a name, namespaces and/or a "
        "namespace-selector, and the policy settings it overrides (docs/scoring.md).",
    )
    blind_device_plugin: bool = _field(p.BLIND_DEVICE_PLUGIN)
    own_load: bool = _field(p.OWN_LOAD)
    own_load_gpu_load: float = _field(p.OWN_LOAD_GPU_LOAD)
    own_load_gpu_memory_mib: int = _field(p.OWN_LOAD_GPU_MEMORY_MIB)
    # How the scorer learns a workload's load (serving/workloads.py): not policy, so not per
    # profile; they bound what is trusted and what memory it takes.
    own_load_min_pods: int = Field(
        2,
        ge=1,
        le=1000,
        description="Distinct running pods of a workload whose samples its learned load needs "
        "(fewer: the default applies).",
    )
    own_load_settle_s: float = Field(
        DEFAULT_SETTLE_S,
        ge=0.0,
        description="How long a pod runs before a utilization it shows below the default "
        "estimate is learned as its workload's load (earlier, it may be its start-up).",
    )
    own_load_max_age_s: float = Field(
        3600.0,
        gt=0.0,
        description="Samples of a workload's pods older than this no longer count.",
    )
    own_load_node_watch: bool = Field(
        False,
        description="Full-node mode: also watch Nodes (list/watch on nodes) to learn workloads' "
        "loads from every node's agent data; without it only the Nodes kube-scheduler sends "
        "teach, and a node full of one workload's replicas is never sent.",
    )
    own_load_max_workloads: int = Field(
        10_000,
        ge=1,
        le=10_000_000,
        description="Workloads whose load is kept (least recently sampled dropped first).",
    )

    @field_validator(*(s.name for s in p.POLICY_SETTINGS if s.real))
    @classmethod
    def _no_nan(cls, value: float) -> float:
        return _finite(value)

    @field_validator("annotation_prefix")
    @classmethod
    def _prefix(cls, value: str) -> str:
        return Keys.for_prefix(value).prefix

    @field_validator("pod_label_selector")
    @classmethod
    def _selector(cls, value: str | None) -> str | None:
        if value is not None and (why := selector_error(value)) is not None:
            raise ValueError(f"not a label selector the API server takes: {why}")
        return value

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
            **{s.name: getattr(self, s.name) for s in p.POLICY_SETTINGS},
        )

    def policy_set(self) -> PolicySet:
        """The top-level policy and the tenant profiles built on it."""
        default = self.policy()
        try:
            profiles = parse_profiles(self.profiles, default, _PROFILE_FIELDS, _coerce)
        except ProfileError as exc:
            raise ValueError(f"policy file: {exc}") from None
        return PolicySet(default, profiles)

    def kubeconfig_file(self) -> str | None:
        """The kubeconfig as the watches' clients take it; None: in-cluster credentials."""
        return None if self.kubeconfig is None else str(self.kubeconfig)

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
