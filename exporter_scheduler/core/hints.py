"""Pod hints: what a workload may ask of the scorer through its own annotations.

Hints live under the same prefix as the node annotations. They are parsed once per request, not
per node, and a hint that cannot be understood is an error for the whole pod (every node rejects
it with a reason naming the annotation): silently ignoring a typo would schedule the pod somewhere
its owner asked us not to.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Final, TypeVar

from gpu_contract.schema import DEFAULT_KEYS, Keys, normalize_model_name

MODEL_PREFERENCE: Final = "gpu-model-preference"
FALLBACK_UTILIZATION: Final = "gpu-fallback-utilization"
MAX_UTILIZATION: Final = "max-utilization"
MIN_GPU_MEMORY_MIB: Final = "min-gpu-memory-mib"
# Utilization one unit of the pod's GPU request adds to a GPU once it runs: what the scorer
# counts for the pod while the node's data cannot show it yet (exporter_scheduler/core/inflight.py).
EXPECTED_GPU_LOAD: Final = "expected-gpu-load"
# Memory the pod's processes will hold on each GPU it gets, MiB: counted with its load
# (exporter_scheduler/core/ownload.py); unlike `min-gpu-memory-mib` it is an estimate of use.
EXPECTED_GPU_MEMORY_MIB: Final = "expected-gpu-memory-mib"
# Group caps (exporter_scheduler/core/spread.py): the group is the pod's `spread-group` label.
SPREAD_GROUP_LABEL: Final = "spread-group"
# Set to "true" on each GPU pod at admission by the chart's MutatingAdmissionPolicy (and on older
# pods by `gpu-scorer label-gpu-pods`), so that the Pod watch can select GPU pods on the server.
GPU_POD_LABEL: Final = "gpu-pod"
GPU_POD_LABEL_VALUE: Final = "true"
SPREAD_MAX_PER_DOMAIN: Final = "spread-max-per-domain"
SPREAD_TOPOLOGY_KEY: Final = "spread-topology-key"
MAX_SPREAD_PER_DOMAIN: Final = 100_000
# A qualified label key: an optional DNS-subdomain prefix and `/`, then a name of at most 63.
_LABEL_KEY: Final = re.compile(
    r"(?:(?=.{1,253}/)[a-z0-9]([-a-z0-9]*[a-z0-9])?(?:\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"(?=.{1,63}$)[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?"
)
# The order in which hints are checked, and so which one an error names when several are bad.
HINT_NAMES: Final = (
    MODEL_PREFERENCE,
    FALLBACK_UTILIZATION,
    MAX_UTILIZATION,
    MIN_GPU_MEMORY_MIB,
    EXPECTED_GPU_LOAD,
    SPREAD_MAX_PER_DOMAIN,
    SPREAD_TOPOLOGY_KEY,
    EXPECTED_GPU_MEMORY_MIB,
)

# A preference entry that matches every node, whatever its model (or none): "anything else last".
ANY_MODEL: Final = "*"
MAX_PREFERENCE_ENTRIES: Final = 16
MAX_PREFERENCE_ENTRY_CHARS: Final = 64
# 16 TiB on one GPU is far beyond any product; the cap also keeps int() away from huge inputs.
MAX_GPU_MEMORY_MIB: Final = 16 * 1024 * 1024
_MAX_NUMBER_CHARS: Final = 32
_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class PodHints:
    """The hints a pod gave; an absent hint is `None` (or an empty preference)."""

    # Entries as written (whitespace collapsed to `-`), most preferred first.
    model_preference: tuple[str, ...] = ()
    fallback_utilization: float | None = None
    max_utilization: float | None = None
    min_gpu_memory_mib: int | None = None
    expected_gpu_load: float | None = None
    spread_max_per_domain: int | None = None
    spread_topology_key: str | None = None
    expected_gpu_memory_mib: int | None = None


NO_HINTS: Final = PodHints()


@dataclass(frozen=True, slots=True)
class HintError:
    """An annotation the scorer could not accept: which one, its value and what is wrong."""

    annotation: str
    value: str
    problem: str

    @property
    def reason(self) -> str:
        """The uniform filter reason: names the annotation, never the (pod-specific) value."""
        return f"invalid pod annotation {self.annotation}"


def parse_hints(annotations: Mapping[str, str], keys: Keys = DEFAULT_KEYS) -> PodHints | HintError:
    """Read a pod's hints; the first bad one (in `HINT_NAMES` order) comes back as a `HintError`."""
    if not any(keys.prefix + name in annotations for name in HINT_NAMES):
        return NO_HINTS
    hint = _Reader(annotations, keys.prefix)
    try:
        return PodHints(
            hint.read(MODEL_PREFERENCE, _parse_preference) or (),
            hint.read(FALLBACK_UTILIZATION, _parse_fraction),
            hint.read(MAX_UTILIZATION, _parse_fraction),
            hint.read(MIN_GPU_MEMORY_MIB, _parse_mib),
            hint.read(EXPECTED_GPU_LOAD, _parse_fraction),
            hint.read(SPREAD_MAX_PER_DOMAIN, _parse_count),
            hint.read(SPREAD_TOPOLOGY_KEY, _parse_label_key),
            hint.read(EXPECTED_GPU_MEMORY_MIB, _parse_mib),
        )
    except _HintRejectedError as bad:
        return bad.error


class _InvalidValueError(ValueError):
    """A parser's verdict on a value: what is wrong with it (a `HintError`'s `problem`)."""


class _HintRejectedError(Exception):
    def __init__(self, error: HintError) -> None:
        super().__init__(error.reason)
        self.error = error


class _Reader:
    """One pod's annotations under the prefix: each hint parsed, or the first bad one raised."""

    __slots__ = ("annotations", "prefix")

    def __init__(self, annotations: Mapping[str, str], prefix: str) -> None:
        self.annotations = annotations
        self.prefix = prefix

    def read(self, name: str, parse: Callable[[str], _T]) -> _T | None:
        key = self.prefix + name
        text = self.annotations.get(key)
        if text is None:
            return None
        if not isinstance(text, str):
            raise _HintRejectedError(HintError(key, str(text), "not a string"))
        try:
            return parse(text)
        except _InvalidValueError as problem:
            raise _HintRejectedError(HintError(key, text, str(problem))) from None


def _parse_preference(text: str) -> tuple[str, ...]:
    entries = [normalize_model_name(part) for part in text.split(",")]
    if entries == [""]:
        raise _InvalidValueError("empty preference list")
    if any(not entry for entry in entries):
        raise _InvalidValueError("empty entry in the comma-separated list")
    if len(entries) > MAX_PREFERENCE_ENTRIES:
        raise _InvalidValueError(f"more than {MAX_PREFERENCE_ENTRIES} entries")
    if any(len(entry) > MAX_PREFERENCE_ENTRY_CHARS for entry in entries):
        raise _InvalidValueError(f"an entry longer than {MAX_PREFERENCE_ENTRY_CHARS} characters")
    if ANY_MODEL in entries[:-1]:
        raise _InvalidValueError(f"'{ANY_MODEL}' may only be the last entry")
    # A repeated entry can never match anything its first occurrence did not: keep the first.
    return tuple(dict.fromkeys(entries))


def _parse_fraction(text: str) -> float:
    stripped = text.strip()
    if len(stripped) > _MAX_NUMBER_CHARS:
        raise _InvalidValueError("not a number")
    try:
        value = float(stripped)
    except ValueError:
        raise _InvalidValueError("not a number") from None
    if not math.isfinite(value):
        raise _InvalidValueError("not a finite number")
    if not 0.0 <= value <= 1.0:
        raise _InvalidValueError("not a fraction between 0 and 1")
    return value


def _digits(text: str, problem: str) -> int:
    """A whole number written in ASCII digits only (no sign, no unit, no exponent)."""
    stripped = text.strip()
    if not stripped.isascii() or not stripped.isdigit() or len(stripped) > _MAX_NUMBER_CHARS:
        raise _InvalidValueError(problem)
    return int(stripped)


def _parse_count(text: str) -> int:
    value = _digits(text, "not a whole number")
    if not 1 <= value <= MAX_SPREAD_PER_DOMAIN:
        raise _InvalidValueError(f"not between 1 and {MAX_SPREAD_PER_DOMAIN}")
    return value


def _parse_mib(text: str) -> int:
    value = _digits(text, "not a whole number of MiB (digits only, no unit)")
    if value > MAX_GPU_MEMORY_MIB:
        raise _InvalidValueError(f"above {MAX_GPU_MEMORY_MIB} MiB")
    return value


def _parse_label_key(text: str) -> str:
    stripped = text.strip()
    if not _LABEL_KEY.fullmatch(stripped):
        raise _InvalidValueError("not a label key (e.g. topology.kubernetes.io/zone)")
    return stripped


def model_rank(model: str | None, patterns: tuple[str, ...], any_rank: int | None) -> int | None:
    """The index of the first preference entry matching a node's `gpu-model`, else `None`.

    An entry matches when its `-`-separated tokens appear as consecutive whole tokens of the
    model name, ignoring case: `A100` matches `NVIDIA-A100-SXM4-80GB` but not `NVIDIA-A10`,
    and `A100-80GB` matches `NVIDIA-A100-80GB-PCIe`. `patterns` come from `match_patterns`.
    """
    if model is not None:
        padded = "-" + model.lower() + "-"
        for index, pattern in enumerate(patterns):
            if pattern in padded:
                return index
    return any_rank


def match_patterns(preference: tuple[str, ...]) -> tuple[tuple[str, ...], int | None]:
    """Precomputed `-token-` patterns for `model_rank`, and the rank of `*` if the list ends so."""
    any_rank = len(preference) - 1 if preference and preference[-1] == ANY_MODEL else None
    listed = preference[:-1] if any_rank is not None else preference
    return tuple("-" + entry.lower() + "-" for entry in listed), any_rank
