"""The node annotation contract, version 1: the one thing the agent and the scorer share.

The agent encodes a `NodeGpuState` into `gpu-scheduler.example.com/*` annotation strings and a JSON
merge patch; the scorer decodes whatever it finds on a Node back into a `DecodedAnnotations`. Both
binaries import this module, and it imports neither pynvml nor kubernetes, so a scorer image never
loads NVML and the agent never links the scorer's HTTP stack.

Decoding is deliberately lenient per field and strict per value: one unparsable or out-of-range
value (NaN, inf, negative, a fraction above 1) drops that field alone, with a problem recorded,
while the rest of the node's data stays usable. An unknown `schema-version` drops everything,
because the meaning of every other key may have changed. The per-GPU keys follow the same rule
per GPU: one bad value drops that GPU's value, a list whose length disagrees with `gpu-count`
drops that key.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, Final, NamedTuple, TypeVar

from gpu_contract.podusage import PodUsage
from gpu_contract.podusage import decode as decode_pod_usage
from gpu_contract.podusage import encode as encode_pod_usage

SCHEMA_VERSION: Final = "1"
DEFAULT_PREFIX: Final = "gpu-scheduler.example.com/"
# The API server stamps this manager's entry in metadata.managedFields with its own clock on every
# write that changes the Node; the scorer uses that time to catch a node clock that lies.
FIELD_MANAGER: Final = "gpu-scheduler-agent"

# A DNS subdomain (RFC 1123), as Kubernetes requires for an annotation key's prefix.
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_MAX_PREFIX_LEN: Final = 253
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_MAX_DEVICE_NAME_CHARS: Final = 63


class Health(StrEnum):
    OK = "ok"
    DEGRADED = "degraded"
    UNAVAILABLE = "unavailable"


class Field(StrEnum):
    """Key names after the prefix. The order here is the order of encoded output."""

    UTILIZATION = "utilization"
    UTILIZATION_MAX = "utilization-max"
    MEMORY_FRAGMENTATION = "memory-fragmentation"
    MEMORY_FREE_MIB = "memory-free-mib"
    MEMORY_LARGEST_FREE_MIB = "memory-largest-free-mib"
    TEMPERATURE = "temperature"
    GPU_MODEL = "gpu-model"
    GPU_COUNT = "gpu-count"
    HEALTH = "health"
    HEALTH_DETAIL = "health-detail"
    UPDATED_AT = "updated-at"
    SCHEMA_VERSION = "schema-version"
    # One value per GPU in NVML index order (additive within version 1: older readers ignore them).
    PER_GPU_UTILIZATION = "per-gpu-utilization"
    PER_GPU_MEMORY_FREE_MIB = "per-gpu-memory-free-mib"
    PER_GPU_TEMPERATURE = "per-gpu-temperature"
    PER_GPU_ALLOCATED = "per-gpu-allocated"
    # Each GPU's DRA device name in its driver's ResourceSlice (matched by UUID), where the node's
    # GPUs are DRA devices: the name claims and DeviceTaintRules use, which need not be
    # `gpu-<index>` (NVIDIA's driver names a GPU after its minor number, not its NVML index).
    PER_GPU_DRA_DEVICE = "per-gpu-dra-device"
    # Each pod's use of the GPUs it holds (`gpu_contract.podusage`; additive within version 1).
    POD_GPU_USAGE = "pod-gpu-usage"


MIXED_MODELS: Final = "mixed"
# The per-GPU value of a GPU that was not measured (lost, field not supported, allocation unknown).
NOT_MEASURED: Final = "-"
# Far above any real node, low enough that a hand-edited annotation cannot make a reader loop long.
MAX_PER_GPU_VALUES: Final = 1024
# Long enough for a few per-GPU problems, short enough to stay readable in `kubectl describe node`.
MAX_HEALTH_DETAIL_CHARS: Final = 256


class PrefixError(ValueError):
    """The configured annotation prefix is not a DNS subdomain followed by `/`."""


def normalize_prefix(prefix: str) -> str:
    """Return the prefix with exactly one trailing `/`, or raise `PrefixError` naming the rule."""
    domain = prefix.strip().rstrip("/")
    if not domain or len(domain) > _MAX_PREFIX_LEN or not _DNS_SUBDOMAIN.match(domain):
        raise PrefixError(
            f"annotation prefix {prefix!r} must be a DNS subdomain (lowercase letters, digits, "
            f"'-' and '.', at most {_MAX_PREFIX_LEN} characters), optionally followed by '/'"
        )
    return domain + "/"


@dataclass(frozen=True, slots=True)
class Keys:
    """The full annotation keys for one prefix, computed once and reused on every encode/decode."""

    prefix: str
    by_field: Mapping[Field, str]
    by_key: Mapping[str, Field]

    @classmethod
    def for_prefix(cls, prefix: str = DEFAULT_PREFIX) -> Keys:
        normalized = normalize_prefix(prefix)
        by_field = {f: normalized + f.value for f in Field}
        return cls(normalized, by_field, {k: f for f, k in by_field.items()})

    def __getitem__(self, f: Field) -> str:
        return self.by_field[f]


DEFAULT_KEYS: Final = Keys.for_prefix(DEFAULT_PREFIX)


class GpuState(NamedTuple):
    """One GPU's published values; `None` means "not measured" (written as `-`).

    `memory_free_mib` is the largest single allocation the GPU can still give (its free memory,
    or on a MIG-enabled GPU one MIG device's or creatable instance's worth); `allocated` is True
    when every schedulable share of the GPU is assigned to a pod; `dra_device` is the GPU's
    device name in the DRA driver's ResourceSlice (None where it is not a DRA device, or unknown).
    """

    utilization: float | None = None
    memory_free_mib: int | None = None
    temperature_c: int | None = None
    allocated: bool | None = None
    dra_device: str | None = None


@dataclass(frozen=True, slots=True)
class NodeGpuState:
    """What the agent publishes about one node. `None` means "not measured": the key is omitted.

    `gpus` holds one `GpuState` per GPU in NVML index order (lost GPUs included, all `None`), or
    nothing when the node publishes no per-GPU data. `pods` holds what each pod holding a GPU
    uses of it (`gpu_contract.podusage`), or nothing when that is not known.
    """

    health: Health
    updated_at: datetime
    utilization: float | None = None
    utilization_max: float | None = None
    memory_fragmentation: float | None = None
    memory_free_mib: int | None = None
    memory_largest_free_mib: int | None = None
    temperature_c: int | None = None
    gpu_model: str | None = None
    gpu_count: int | None = None
    health_detail: str | None = None
    gpus: tuple[GpuState, ...] = ()
    pods: tuple[PodUsage, ...] = ()


def normalize_model_name(product_name: str) -> str:
    """`NVIDIA A100-SXM4-80GB` -> `NVIDIA-A100-SXM4-80GB`, the `nvidia.com/gpu.product` style."""
    return "-".join(product_name.split())


def format_fraction(value: float) -> str:
    """Two decimals, clamped to [0, 1], never an exponent: `0.42`."""
    clamped = min(1.0, max(0.0, value))
    return f"{clamped:.2f}"


def _fraction_or_none(value: float | None) -> str | None:
    # NaN would clamp to 0.00 and read as an idle GPU: a value that is not a number is unmeasured.
    if value is None or not math.isfinite(value):
        return None
    return format_fraction(value)


def format_timestamp(moment: datetime) -> str:
    """RFC 3339 UTC with second resolution and a `Z`: `2026-11-30T14:19:24Z`."""
    if moment.tzinfo is None:
        raise ValueError("timestamps must be timezone-aware")
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_timestamp(text: str) -> datetime | None:
    """Parse an RFC 3339 timestamp (any offset, optional fraction) to aware UTC; `None` if invalid.

    Kubernetes writes `...Z`; a hand-edited annotation may carry an offset. A timestamp without
    an offset is refused rather than guessed at, because its age would depend on the reader's zone.
    """
    candidate = text.strip()
    if len(candidate) < 20 or candidate[10] not in "Tt":
        return None
    if candidate[-1] in "Zz":
        candidate = candidate[:-1] + "+00:00"
    try:
        parsed = datetime.fromisoformat(candidate)
        if parsed.tzinfo is None:
            return None
        return parsed.astimezone(UTC)
    except (ValueError, OverflowError):  # OverflowError: an offset that leaves years 1..9999
        return None


def _clean_detail(detail: str) -> str:
    flat = " ".join(detail.split())
    if len(flat) <= MAX_HEALTH_DETAIL_CHARS:
        return flat
    return flat[: MAX_HEALTH_DETAIL_CHARS - 1] + "…"


def encode(state: NodeGpuState, keys: Keys = DEFAULT_KEYS) -> dict[str, str]:
    """The annotations for `state`: full key -> string value, unmeasured fields left out."""
    values: dict[Field, str | None] = {
        Field.UTILIZATION: _fraction_or_none(state.utilization),
        Field.UTILIZATION_MAX: _fraction_or_none(state.utilization_max),
        Field.MEMORY_FRAGMENTATION: _fraction_or_none(state.memory_fragmentation),
        Field.MEMORY_FREE_MIB: _format_count(state.memory_free_mib),
        Field.MEMORY_LARGEST_FREE_MIB: _format_count(state.memory_largest_free_mib),
        Field.TEMPERATURE: _format_temperature(state.temperature_c),
        Field.GPU_MODEL: state.gpu_model,
        Field.GPU_COUNT: _format_count(state.gpu_count),
        Field.HEALTH: state.health.value,
        Field.HEALTH_DETAIL: (
            _clean_detail(state.health_detail)
            if state.health_detail and state.health_detail.strip() and state.health is not Health.OK
            else None
        ),
        Field.UPDATED_AT: format_timestamp(state.updated_at),
        Field.SCHEMA_VERSION: SCHEMA_VERSION,
    }
    values.update(_encode_per_gpu(state))
    values[Field.POD_GPU_USAGE] = encode_pod_usage(state.pods).text
    return {keys[f]: v for f, v in values.items() if v is not None}


def _format_count(value: int | None) -> str | None:
    return None if value is None else str(max(0, int(value)))


def _format_allocated(value: bool | None) -> str | None:
    return None if value is None else ("1" if value else "0")


def _format_temperature(value: int | None) -> str | None:
    return None if value is None else str(int(value))


def _format_device(name: str | None) -> str | None:
    # A name that is not a device name (a DNS label) is written as unknown, never as a value
    # that would break the column's commas.
    return name if name is not None and _parse_device(name) is not None else None


def _encode_per_gpu(state: NodeGpuState) -> dict[Field, str | None]:
    gpus = state.gpus
    # A list that disagrees with gpu-count would be dropped by every reader: never write one.
    if not gpus or (state.gpu_count is not None and len(gpus) != state.gpu_count):
        return {}
    columns = (
        (Field.PER_GPU_UTILIZATION, [_fraction_or_none(g.utilization) for g in gpus]),
        (Field.PER_GPU_MEMORY_FREE_MIB, [_format_count(g.memory_free_mib) for g in gpus]),
        (Field.PER_GPU_TEMPERATURE, [_format_temperature(g.temperature_c) for g in gpus]),
        (Field.PER_GPU_ALLOCATED, [_format_allocated(g.allocated) for g in gpus]),
        (Field.PER_GPU_DRA_DEVICE, [_format_device(g.dra_device) for g in gpus]),
    )
    # A column no GPU measured is left out, like any unmeasured field (not written as `-,-,-`).
    return {
        f: ",".join(NOT_MEASURED if v is None else v for v in texts)
        if any(v is not None for v in texts)
        else None
        for f, texts in columns
    }


def merge_patch(
    annotations: Mapping[str, str],
    keys: Keys = DEFAULT_KEYS,
    current: Mapping[str, str] | None = None,
) -> dict[str, dict[str, dict[str, str | None]]]:
    """A JSON merge patch body that makes the Node's prefix keys exactly `annotations`.

    Every schema key missing from `annotations` is deleted with `null`; so is any other key under
    the prefix that `current` (the Node's annotations as last seen) holds, such as a key of an
    older schema. Keys outside the prefix are never named, so other writers' annotations survive.
    """
    body: dict[str, str | None] = dict(annotations)
    for full_key in keys.by_key:
        body.setdefault(full_key, None)
    if current:
        for full_key in current:
            if full_key.startswith(keys.prefix):
                body.setdefault(full_key, None)
    return {"metadata": {"annotations": body}}


@dataclass(frozen=True, slots=True)
class DecodedAnnotations:
    """What a reader can trust from a Node's annotations.

    `state` is `None` when the node carries no usable data at all (no annotations of the prefix,
    an unknown schema version, or no parsable `updated-at`); `problems` says why, and also lists
    each single field that was dropped for a bad value.
    """

    state: NodeGpuState | None
    problems: tuple[str, ...] = field(default=())
    schema_version: str | None = None


_FRACTION_FIELDS: Final = (Field.UTILIZATION, Field.UTILIZATION_MAX, Field.MEMORY_FRAGMENTATION)
_COUNT_FIELDS: Final = (Field.MEMORY_FREE_MIB, Field.MEMORY_LARGEST_FREE_MIB, Field.GPU_COUNT)


def _parse_fraction(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    if not math.isfinite(value) or value < 0.0 or value > 1.0:
        return None
    return value


# Far above any real MiB count, far below Python's int-parsing digit limit.
_MAX_COUNT_DIGITS: Final = 15


def _parse_count(text: str) -> int | None:
    stripped = text.strip()
    if not stripped.isascii() or not stripped.isdigit() or len(stripped) > _MAX_COUNT_DIGITS:
        return None
    return int(stripped)


def _parse_temperature(text: str) -> int | None:
    stripped = text.strip()
    body = stripped[1:] if stripped.startswith("-") else stripped
    if not body.isascii() or not body.isdigit() or len(body) > 4:
        return None
    return int(stripped)


def _parse_allocated(text: str) -> bool | None:
    stripped = text.strip()
    return {"1": True, "0": False}.get(stripped)


def _parse_device(text: str) -> str | None:
    # ResourceSlice device names are DNS labels (resource.k8s.io validation).
    name = text.strip()
    return name if len(name) <= _MAX_DEVICE_NAME_CHARS and _DNS_LABEL.match(name) else None


_HEALTH_BY_TEXT: Final = {h.value: h for h in Health}
_T = TypeVar("_T")


def _gpu_list(indexes: Sequence[int]) -> str:
    if len(indexes) == 1:
        return f"gpu {indexes[0]}"
    return f"{len(indexes)} gpus (first gpu {indexes[0]})"


def _per_gpu_column(
    text: str | None,
    f: Field,
    parse: Callable[[str], _T | None],
    *,
    expected: int | None,
    problems: list[str],
) -> tuple[list[_T | None] | None, int | None]:
    """One per-GPU key's values and the GPU count the next key must match.

    A key whose value count differs from `expected` (`gpu-count`, or without one the first
    per-GPU key present) is dropped whole, because its values cannot be matched to GPUs; a single
    bad value drops that GPU's value alone, as a bad node-level value drops its field alone.
    """
    if text is None:
        return None, expected
    items = text.split(",", MAX_PER_GPU_VALUES)
    if len(items) > MAX_PER_GPU_VALUES:
        problems.append(f"{f.value} invalid (more than {MAX_PER_GPU_VALUES} values)")
        return None, expected
    if expected is not None and len(items) != expected:
        problems.append(f"{f.value} invalid ({len(items)} values for {expected} gpus)")
        return None, expected
    values: list[_T | None] = []
    bad: list[int] = []
    for index, item in enumerate(items):
        value = None if item.strip() == NOT_MEASURED else parse(item)
        if value is None and item.strip() != NOT_MEASURED:
            bad.append(index)
        values.append(value)
    if bad:
        problems.append(f"{f.value} invalid on {_gpu_list(bad)}")
    return values, len(items)


# The per-GPU keys in `GpuState`'s field order, each with its value parser; the first
# `_MEASURED_COLUMNS` are readings of the GPU, the rest describe it.
_PER_GPU_PARSERS: Final[tuple[tuple[Field, Callable[[str], Any]], ...]] = (
    (Field.PER_GPU_UTILIZATION, _parse_fraction),
    (Field.PER_GPU_MEMORY_FREE_MIB, _parse_count),
    (Field.PER_GPU_TEMPERATURE, _parse_temperature),
    (Field.PER_GPU_ALLOCATED, _parse_allocated),
    (Field.PER_GPU_DRA_DEVICE, _parse_device),
)
_MEASURED_COLUMNS: Final = 4


def _decode_per_gpu(
    annotations: Mapping[str, str], keys: Keys, gpu_count: int | None, problems: list[str]
) -> tuple[GpuState, ...]:
    """The per-GPU table (one `GpuState` per GPU), or `()` when no per-GPU key is usable."""
    n = gpu_count
    columns: list[list[Any] | None] = []
    for f, parse in _PER_GPU_PARSERS:
        column, n = _per_gpu_column(
            annotations.get(keys[f]), f, parse, expected=n, problems=problems
        )
        columns.append(column)
    # Device names alone are no reading of a GPU: without a measured column there is no table.
    if n is None or all(c is None for c in columns[:_MEASURED_COLUMNS]):
        return ()
    unknown: list[None] = [None] * n
    return tuple(
        GpuState(*values)
        for values in zip(*(unknown if c is None else c for c in columns), strict=True)
    )


def decode(annotations: Mapping[str, str], keys: Keys = DEFAULT_KEYS) -> DecodedAnnotations:
    """Read the contract back from a Node's annotations, dropping (and naming) bad values.

    A record with no `schema-version` but a parsable `updated-at` is the original design's format,
    written before the version key existed (`utilization` and `updated-at` alone); it is read as
    version 1, since version 1 only added keys, and its missing `health` counts as `ok`.
    """
    get = annotations.get
    problems: list[str] = []
    version = get(keys[Field.SCHEMA_VERSION])
    if version is None:
        if not any(k.startswith(keys.prefix) for k in annotations):
            return DecodedAnnotations(None, ("no gpu annotations",))
        problems.append("schema-version missing (read as 1)")
    elif version.strip() != SCHEMA_VERSION:
        return DecodedAnnotations(None, (f"unknown schema-version {version!r}",), version)

    updated_text = get(keys[Field.UPDATED_AT])
    updated_at = None if updated_text is None else parse_timestamp(updated_text)
    if updated_at is None:
        reason = "updated-at missing" if updated_text is None else "updated-at unparsable"
        return DecodedAnnotations(None, (*problems, reason), version)

    health_text = get(keys[Field.HEALTH])
    health = None if health_text is None else _HEALTH_BY_TEXT.get(health_text.strip())
    if health is None:
        if health_text is None and version is None:
            health = Health.OK
        else:
            # Without a health verdict the numbers may still be right; treat the node as
            # degraded rather than discarding what was measured.
            problems.append("health missing" if health_text is None else "health unparsable")
            health = Health.DEGRADED

    fractions: list[float | None] = []
    for f in _FRACTION_FIELDS:
        text = get(keys[f])
        value = None if text is None else _parse_fraction(text)
        if text is not None and value is None:
            problems.append(f"{f.value} invalid")
        fractions.append(value)

    counts: list[int | None] = []
    for f in _COUNT_FIELDS:
        text = get(keys[f])
        count = None if text is None else _parse_count(text)
        if text is not None and count is None:
            problems.append(f"{f.value} invalid")
        counts.append(count)

    temperature_text = get(keys[Field.TEMPERATURE])
    temperature = None if temperature_text is None else _parse_temperature(temperature_text)
    if temperature_text is not None and temperature is None:
        problems.append("temperature invalid")

    model = get(keys[Field.GPU_MODEL])
    model = model.strip() if model else None
    state = NodeGpuState(
        health=health,
        updated_at=updated_at,
        utilization=fractions[0],
        utilization_max=fractions[1],
        memory_fragmentation=fractions[2],
        memory_free_mib=counts[0],
        memory_largest_free_mib=counts[1],
        temperature_c=temperature,
        gpu_model=model or None,
        gpu_count=counts[2],
        health_detail=get(keys[Field.HEALTH_DETAIL]),
        gpus=_decode_per_gpu(annotations, keys, counts[2], problems),
        pods=_decode_pods(annotations, keys, counts[2], problems),
    )
    return DecodedAnnotations(state, tuple(problems), version)


def _decode_pods(
    annotations: Mapping[str, str], keys: Keys, gpu_count: int | None, problems: list[str]
) -> tuple[PodUsage, ...]:
    decoded = decode_pod_usage(annotations.get(keys[Field.POD_GPU_USAGE]), gpu_count=gpu_count)
    problems.extend(decoded.problems)
    return decoded.pods
