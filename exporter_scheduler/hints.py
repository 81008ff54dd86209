"""Pod hints: what a workload may ask of the scorer through its own annotations.

Hints live under the same prefix as the node annotations. They are parsed once per request, not
per node, and a hint that cannot be understood is an error for the whole pod (every node rejects
it with a reason naming the annotation): silently ignoring a typo would schedule the pod somewhere
its owner asked us not to.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from gpu_contract.schema import DEFAULT_KEYS, Keys, normalize_model_name

MODEL_PREFERENCE: Final = "gpu-model-preference"
FALLBACK_UTILIZATION: Final = "gpu-fallback-utilization"
MAX_UTILIZATION: Final = "max-utilization"
MIN_GPU_MEMORY_MIB: Final = "min-gpu-memory-mib"
# Utilization one unit of the pod's GPU request adds to a GPU once it runs: what the scorer
# counts for the pod while the node's data cannot show it yet (exporter_scheduler/inflight.py).
EXPECTED_GPU_LOAD: Final = "expected-gpu-load"
# Group caps (exporter_scheduler/spread.py): the group is the pod's `spread-group` label.
SPREAD_GROUP_LABEL: Final = "spread-group"
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
)

# A preference entry that matches every node, whatever its model (or none): "anything else last".
ANY_MODEL: Final = "*"
MAX_PREFERENCE_ENTRIES: Final = 16
MAX_PREFERENCE_ENTRY_CHARS: Final = 64
# 16 TiB on one GPU is far beyond any product; the cap also keeps int() away from huge inputs.
MAX_GPU_MEMORY_MIB: Final = 16 * 1024 * 1024
_MAX_NUMBER_CHARS: Final = 32


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
    prefix = keys.prefix
    get = annotations.get

    preference: tuple[str, ...] = ()
    key = prefix + MODEL_PREFERENCE
    text = get(key)
    if text is not None:
        parsed = _parse_preference(text)
        if isinstance(parsed, str):
            return HintError(key, text, parsed)
        preference = parsed

    fractions: list[float | None] = []
    for name in (FALLBACK_UTILIZATION, MAX_UTILIZATION):
        key = prefix + name
        text = get(key)
        if text is None:
            fractions.append(None)
            continue
        value = _parse_fraction(text)
        if isinstance(value, str):
            return HintError(key, text, value)
        fractions.append(value)

    min_memory: int | None = None
    key = prefix + MIN_GPU_MEMORY_MIB
    text = get(key)
    if text is not None:
        memory = _parse_mib(text)
        if isinstance(memory, str):
            return HintError(key, text, memory)
        min_memory = memory

    load: float | None = None
    key = prefix + EXPECTED_GPU_LOAD
    text = get(key)
    if text is not None:
        value = _parse_fraction(text)
        if isinstance(value, str):
            return HintError(key, text, value)
        load = value

    spread_max: int | None = None
    key = prefix + SPREAD_MAX_PER_DOMAIN
    text = get(key)
    if text is not None:
        count = _parse_count(text)
        if isinstance(count, str):
            return HintError(key, text, count)
        spread_max = count

    spread_key: str | None = None
    key = prefix + SPREAD_TOPOLOGY_KEY
    text = get(key)
    if text is not None:
        if not isinstance(text, str) or not _LABEL_KEY.fullmatch(text.strip()):
            return HintError(key, str(text), "not a label key (e.g. topology.kubernetes.io/zone)")
        spread_key = text.strip()

    if (
        not preference
        and fractions == [None, None]
        and min_memory is None
        and load is None
        and spread_max is None
        and spread_key is None
    ):
        return NO_HINTS
    return PodHints(
        preference, fractions[0], fractions[1], min_memory, load, spread_max, spread_key
    )


def _parse_preference(text: str) -> tuple[str, ...] | str:
    if not isinstance(text, str):
        return "not a string"
    entries = [normalize_model_name(part) for part in text.split(",")]
    if entries == [""]:
        return "empty preference list"
    if any(not entry for entry in entries):
        return "empty entry in the comma-separated list"
    if len(entries) > MAX_PREFERENCE_ENTRIES:
        return f"more than {MAX_PREFERENCE_ENTRIES} entries"
    if any(len(entry) > MAX_PREFERENCE_ENTRY_CHARS for entry in entries):
        return f"an entry longer than {MAX_PREFERENCE_ENTRY_CHARS} characters"
    if ANY_MODEL in entries[:-1]:
        return f"'{ANY_MODEL}' may only be the last entry"
    # A repeated entry can never match anything its first occurrence did not: keep the first.
    return tuple(dict.fromkeys(entries))


def _parse_fraction(text: str) -> float | str:
    if not isinstance(text, str):
        return "not a string"
    stripped = text.strip()
    if len(stripped) > _MAX_NUMBER_CHARS:
        return "not a number"
    try:
        value = float(stripped)
    except ValueError:
        return "not a number"
    if not math.isfinite(value):
        return "not a finite number"
    if not 0.0 <= value <= 1.0:
        return "not a fraction between 0 and 1"
    return value


def _parse_count(text: str) -> int | str:
    if not isinstance(text, str):
        return "not a string"
    stripped = text.strip()
    if not stripped.isascii() or not stripped.isdigit() or len(stripped) > _MAX_NUMBER_CHARS:
        return "not a whole number"
    value = int(stripped)
    if not 1 <= value <= MAX_SPREAD_PER_DOMAIN:
        return f"not between 1 and {MAX_SPREAD_PER_DOMAIN}"
    return value


def _parse_mib(text: str) -> int | str:
    if not isinstance(text, str):
        return "not a string"
    stripped = text.strip()
    if not stripped.isascii() or not stripped.isdigit() or len(stripped) > _MAX_NUMBER_CHARS:
        return "not a whole number of MiB (digits only, no unit)"
    value = int(stripped)
    if value > MAX_GPU_MEMORY_MIB:
        return f"above {MAX_GPU_MEMORY_MIB} MiB"
    return value


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
