"""Who uses each GPU, and how much: the `pod-gpu-usage` key of the contract (additive in version 1).

The scorer counts the load an incoming pod will add to a GPU (docs/scoring.md). It learns that load
from the running pods of the same workload, so the agent publishes, for every pod that holds a GPU
on its node, what the pod uses of each of its GPUs:

    pod-gpu-usage: default/infer-7d9f-abc=0:0.31:10240;train/job-0=2:0.97:70112,3:0.95:70010

One entry per pod, `<namespace>/<name>=` then one `<gpu>:<utilization>:<memory-used-mib>` per GPU
the pod holds (NVML index order, joined by `,`), entries joined by `;` in pod order. `utilization`
is the pod's share of the GPU's SM-busy fraction over the same window as `utilization`, and
`memory-used-mib` the GPU memory its processes hold. On a GPU the pod holds alone, these are the
GPU's own figures (whole-GPU attribution); on a GPU shared by time-slicing or MPS they come from
NVML's per-process accounting, and where that is not readable the pod's figures there are `-`
(unknown), never the whole GPU's load, which would teach a reader several times the real share.

Bounded for 8 GPUs with many time-sliced pods each: at most `MAX_PODS` entries and
`MAX_VALUE_CHARS` characters; the encoder keeps the first entries in pod order that fit and says
how many it left out, so a huge node costs a bounded write and a reader a bounded parse. A reader
drops a bad entry alone (with a problem named), as the per-GPU keys drop a bad value alone.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from typing import Final, NamedTuple

# 8 GPUs x 8 time-sliced pods: every pod of a full node of today's largest sharing setups.
MAX_PODS: Final = 64
# 64 entries of a typical `namespace/deployment-hash-suffix` with one GPU each fit well below
# this; it keeps one Node's annotations far from the API server's 256 KiB limit.
MAX_VALUE_CHARS: Final = 8192

UNKNOWN: Final = "-"
_POD_SEP: Final = ";"
_GPU_SEP: Final = ","
# A namespace is a DNS label and a pod name a DNS subdomain: neither holds `=`, `;`, `,` or `:`.
_POD_REF = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?/[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
_MAX_GPU_INDEX: Final = 1023
_MAX_MIB_DIGITS: Final = 9


class GpuShare(NamedTuple):
    """What one pod uses of one GPU; `None` is unknown (written `-`)."""

    gpu_index: int
    utilization: float | None = None
    memory_used_mib: int | None = None


class PodUsage(NamedTuple):
    """One pod's use of the node's GPUs: `pod` is `namespace/name`, `gpus` in NVML index order."""

    pod: str
    gpus: tuple[GpuShare, ...]


class Encoded(NamedTuple):
    text: str | None  # None: no pod holds a GPU (the key is removed)
    left_out: int  # pods that did not fit under MAX_PODS / MAX_VALUE_CHARS


def pod_ref(namespace: str, name: str) -> str:
    return f"{namespace}/{name}"


def _fraction(value: float | None) -> str:
    if value is None or not math.isfinite(value):
        return UNKNOWN
    return f"{min(1.0, max(0.0, value)):.2f}"


def _mib(value: int | None) -> str:
    return UNKNOWN if value is None else str(max(0, int(value)))


def _entry(usage: PodUsage) -> str:
    shares = _GPU_SEP.join(
        f"{share.gpu_index}:{_fraction(share.utilization)}:{_mib(share.memory_used_mib)}"
        for share in sorted(usage.gpus)
    )
    return f"{usage.pod}={shares}"


def encode(pods: Iterable[PodUsage]) -> Encoded:
    """The key's value for `pods` (pods holding no GPU are skipped), within the size bounds."""
    entries = [_entry(usage) for usage in sorted(pods) if usage.gpus]
    kept: list[str] = []
    size = 0
    for entry in entries:
        grown = size + len(entry) + (1 if kept else 0)
        if len(kept) == MAX_PODS or grown > MAX_VALUE_CHARS:
            break
        kept.append(entry)
        size = grown
    return Encoded(_POD_SEP.join(kept) or None, len(entries) - len(kept))


class Decoded(NamedTuple):
    pods: tuple[PodUsage, ...]
    problems: tuple[str, ...]


def _parse_fraction(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        raise ValueError("utilization") from None
    if not math.isfinite(value) or not 0.0 <= value <= 1.0:
        raise ValueError("utilization")
    return value


def _parse_share(text: str, gpu_count: int | None) -> GpuShare:
    index_text, sep1, rest = text.partition(":")
    utilization_text, sep2, memory_text = rest.partition(":")
    if not (sep1 and sep2):
        raise ValueError("form")
    if not index_text.isascii() or not index_text.isdigit() or len(index_text) > 4:
        raise ValueError("gpu index")
    index = int(index_text)
    if index > _MAX_GPU_INDEX or (gpu_count is not None and index >= gpu_count):
        raise ValueError("gpu index")
    utilization = None if utilization_text == UNKNOWN else _parse_fraction(utilization_text)
    if memory_text == UNKNOWN:
        memory = None
    elif memory_text.isascii() and memory_text.isdigit() and len(memory_text) <= _MAX_MIB_DIGITS:
        memory = int(memory_text)
    else:
        raise ValueError("memory")
    return GpuShare(index, utilization, memory)


def decode(text: str | None, *, gpu_count: int | None = None) -> Decoded:
    """The pods in `text`; a bad entry (or a GPU index at or past `gpu_count`) is dropped alone."""
    if text is None or not text.strip():
        return Decoded((), ())
    if len(text) > MAX_VALUE_CHARS:
        return Decoded((), (f"pod-gpu-usage invalid (over {MAX_VALUE_CHARS} characters)",))
    pods: list[PodUsage] = []
    entries = text.split(_POD_SEP, MAX_PODS)
    bad = max(0, len(entries) - MAX_PODS)  # past the bound: not read at all
    for entry in entries[:MAX_PODS]:
        ref, sep, shares_text = entry.strip().partition("=")
        try:
            if not sep or not _POD_REF.match(ref):
                raise ValueError("pod")
            shares = tuple(_parse_share(s, gpu_count) for s in shares_text.split(_GPU_SEP))
            if len({share.gpu_index for share in shares}) != len(shares):
                raise ValueError("repeated gpu")
        except ValueError:
            bad += 1
            continue
        pods.append(PodUsage(ref, shares))
    problems = (f"pod-gpu-usage invalid on {bad} of its entries",) if bad else ()
    return Decoded(tuple(pods), problems)
