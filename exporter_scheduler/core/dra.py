"""DRA pods: the GPUs kube-scheduler's allocator may still give a pod, from claims and taints.

Where GPUs are Dynamic Resource Allocation devices, kube-scheduler's structured allocator picks
them: among the node's devices of the requested class it takes the first that fit, skipping a
device already allocated to another claim and a device with a `NoSchedule` or `NoExecute` taint
that the claim does not tolerate. It is blind to load. So a DRA pod is judged on the GPUs left
after those exclusions, with the k-GPU rule's blind draw (`core.gpus`): the allocator's order is
not the GPUs' merit, and the node passes only when the chance that the GPUs handed out are all
candidates reaches the policy's `min_gpu_fit_probability`.

The inputs are what the scorer's DRA watch keeps (exporter_scheduler/edges/dracache.py), the
least that decides a verdict:

- per claim, its GPU request count for the configured device classes, its allocation results
  for the driver as (pool, device), and the taint keys its GPU requests tolerate;
- per DeviceTaintRule that can select the driver's devices, the (pool, device, key, effect) it
  names; a rule without a pool is every pool's, one without a device every device's.

Exclusions are kept by device name, as claims and rules name devices, and matched to the
agent's per-GPU readings only when a node is judged (`gpu_exclusions`): by the device names the
agent publishes per GPU (`per-gpu-dra-device`, each GPU's device found in its driver's
ResourceSlice by UUID), else by the name alone, `gpu-<n>` read as GPU n. The fallback is right
only where the driver's number is the NVML index: NVIDIA's driver names a whole GPU after its
minor number (`gpu-<minor>`), which on most nodes, not all, is its NVML index. The pool is
named after the node. Everything here is pure: the request path hands in the pod's claims and
the node's allocations and taints as they are in memory.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from types import MappingProxyType
from typing import Final, Literal

import msgspec

from gpu_contract.schema import GpuState

# Why the allocator will not give a GPU to this pod.
Exclusion = Literal["allocated", "tainted"]
# Taint effects the allocator honours at allocation (`NoExecute` also evicts; `None`: none).
_BLOCKING_EFFECTS: Final = frozenset({"NoSchedule", "NoExecute"})
_DEVICE_PREFIX: Final = "gpu-"
# NVIDIA's driver names a MIG device after its parent: `gpu-<minor>-mig-<profile>-<id>-<start>`.
_MIG_INFIX: Final = "-mig-"
# The device key of a taint on every device of a pool (no device name is `*`: names are DNS
# labels).
ANY_DEVICE: Final = "*"


class Toleration(msgspec.Struct, frozen=True, gc=False):
    """A device toleration of a claim's request (resource.k8s.io DeviceToleration)."""

    key: str | None = None
    operator: str = "Equal"  # `Exists` with no key tolerates every taint
    value: str | None = None
    effect: str | None = None  # None: every effect


class DeviceTaint(msgspec.Struct, frozen=True, gc=False):
    """A taint on one device, from a DeviceTaintRule."""

    key: str
    effect: str
    value: str | None = None
    rule: str = ""  # the rule's name, for the explanation


class ClaimInfo(msgspec.Struct, frozen=True, gc=False):
    """What a verdict reads of one ResourceClaim."""

    # `namespace/name`
    ref: str
    # GPUs its requests for the configured classes ask for, each request by its first GPU
    # alternative (ExactCount: the count; `All`: 1): what a node without per-GPU data is
    # judged with. Where a node's GPUs are known, `choices` decide.
    gpus: int
    # (pool, device) of its allocation results for the driver; empty while unallocated.
    allocated: tuple[tuple[str, str], ...] = ()
    # The tolerations of its GPU requests (every request's, as one list).
    tolerations: tuple[Toleration, ...] = ()
    # The GPU requests whose size depends on the node (`gpus_on_node`): each its alternatives
    # in order, a count, `ALL_GPUS` (every GPU of the node) or `NOT_GPUS` (another class).
    # Empty when every GPU request is one ExactCount alternative.
    choices: tuple[tuple[int, ...], ...] = ()


class DraPod(msgspec.Struct, frozen=True, gc=False):
    """A pod that asks for GPUs through DRA, as its verdicts read it."""

    # Its GPU claims as known now (unknown names are in `missing`).
    claims: tuple[ClaimInfo, ...]
    # Claim names the pod references that the watch does not know (yet), nor a template of
    # them: counted as no GPUs.
    missing: tuple[str, ...] = ()
    # GPUs asked through a DRA-backed extended resource (the scheduler makes the claim later).
    extended: int = 0
    # Those of `claims` the watch does not know yet, read from the template they are made
    # from: their request as the template says, nothing allocated.
    from_templates: tuple[str, ...] = ()

    @property
    def gpus(self) -> int:
        return sum(claim.gpus for claim in self.claims) + self.extended

    @property
    def choices(self) -> tuple[tuple[int, ...], ...]:
        return tuple(choice for claim in self.claims for choice in claim.choices)

    @property
    def own(self) -> frozenset[str]:
        return frozenset(claim.ref for claim in self.claims)


class NodeDevices(msgspec.Struct, frozen=True, gc=False):
    """One node's (pool's) DRA state: its allocated devices and their taints."""

    # device name -> the claim (`namespace/name`) it is allocated to
    allocated: Mapping[str, str] = msgspec.field(default_factory=dict)
    # device name -> its taints
    taints: Mapping[str, tuple[DeviceTaint, ...]] = msgspec.field(default_factory=dict)


NO_DEVICES: Final = NodeDevices()


# A request alternative of `choices`: every GPU of the node (`All`), or another device class.
ALL_GPUS: Final = -1
NOT_GPUS: Final = -2


def first_gpu_count(alternatives: tuple[int, ...]) -> int:
    """What a request counts where the node's GPUs are unknown: its first GPU alternative's
    count (`All`: 1)."""
    for count in alternatives:
        if count != NOT_GPUS:
            return 1 if count == ALL_GPUS else count
    return 0


def gpus_on_node(
    choices: tuple[tuple[int, ...], ...], fixed: int, node_gpus: int, free: int
) -> int:
    """The GPUs the allocator gives the pod on a node of `node_gpus` GPUs of which `free` it
    may give: each request, in order, takes its first alternative that fits what is left
    (`firstAvailable`), an `All` alternative fitting only where no GPU of the node is excluded
    or taken, and another class's alternative taken as fitting (its devices are not seen
    here); a request none of whose alternatives fits counts its first GPU alternative (the
    allocator fails there, and so does the k-GPU rule). `fixed`: the GPUs of the pod's
    requests that have one size, taken first."""
    left = free - fixed
    total = fixed
    for alternatives in choices:
        taken: int | None = None
        for count in alternatives:
            if count == NOT_GPUS:
                taken = 0
            elif count == ALL_GPUS:
                taken = node_gpus if left == node_gpus > 0 else None
            else:
                taken = count if count <= left else None
            if taken is not None:
                break
        if taken is None:
            first = next((c for c in alternatives if c != NOT_GPUS), 1)
            taken = node_gpus if first == ALL_GPUS else first
        total += taken
        left -= taken
    return total


def device_index(name: str) -> int | None:
    """The GPU index a device name stands for when the node publishes no device names:
    `gpu-3` -> 3; None for any other device (a MIG device `gpu-0-mig-...`, a channel), which
    the per-GPU readings cannot speak for."""
    if not name.startswith(_DEVICE_PREFIX):
        return None
    digits = name[len(_DEVICE_PREFIX) :]
    if not digits.isdigit() or len(digits) > 4:
        return None
    return int(digits)


def gpu_exclusions(
    excluded: Mapping[str, Exclusion], gpus: Sequence[GpuState]
) -> dict[int, Exclusion]:
    """`excluded` (device name -> why) as GPU index -> why, for a node whose per-GPU table is
    `gpus`. Where the agent published the GPUs' device names, a device is the GPU that carries
    its name, and a device no GPU carries (a MIG device, a GPU the agent could not match) is no
    GPU of the table; where it published none, `gpu-<n>` is GPU n (`device_index`). An
    allocated MIG device takes its parent GPU from whole-GPU claims. A taint on every device
    of the pool (`ANY_DEVICE`) excludes every GPU not excluded otherwise."""
    if not excluded:
        return {}
    named = {gpu.dra_device: index for index, gpu in enumerate(gpus) if gpu.dra_device is not None}
    found: dict[int, Exclusion] = {}
    shares: list[str] = []
    for device, why in excluded.items():
        index = named.get(device) if named else device_index(device)
        if index is not None and index < len(gpus):
            found[index] = why
        elif why == "allocated" and _MIG_INFIX in device:
            shares.append(device)
    for device in shares:  # after the whole GPUs, so the result does not depend on order
        # A MIG device of a GPU (`gpu-<minor>-mig-<profile>-...`) holds a share of its parent:
        # the driver's shared counters keep the whole GPU from another claim.
        parent = device.partition(_MIG_INFIX)[0]
        index = named.get(parent) if named else device_index(parent)
        if index is not None and index < len(gpus):
            found.setdefault(index, "allocated")
    every = excluded.get(ANY_DEVICE)
    if every is not None:  # a taint on every device of the pool: the rest are tainted
        for index in range(len(gpus)):
            found.setdefault(index, every)
    return found


def tolerates(tolerations: Iterable[Toleration], taint: DeviceTaint) -> bool:
    """Kubernetes' toleration match (`DeviceToleration.ToleratesTaint`)."""
    for toleration in tolerations:
        if toleration.effect is not None and toleration.effect != taint.effect:
            continue
        if toleration.operator == "Exists":
            if toleration.key is None or toleration.key == taint.key:
                return True
        elif toleration.key == taint.key and (toleration.value or "") == (taint.value or ""):
            return True
    return False


def excluded_gpus(devices: NodeDevices, pod: DraPod) -> dict[str, Exclusion]:
    """The devices of one node the allocator will not give `pod` (name -> why): allocated to a
    claim that is not one of the pod's own, or tainted with a blocking effect that one of its
    claims does not tolerate (every claim must take its device through the same filter; an
    extended-resource request's claim, made by the scheduler, tolerates nothing)."""
    own = pod.own
    excluded: dict[str, Exclusion] = {
        device: "allocated" for device, claim in devices.allocated.items() if claim not in own
    }
    if not devices.taints:
        return excluded
    tolerating = [claim.tolerations for claim in pod.claims]
    if pod.extended or not tolerating:
        tolerating.append(())
    for device, taints in devices.taints.items():
        if device in excluded:
            continue
        for taint in taints:
            if taint.effect not in _BLOCKING_EFFECTS:
                continue
            if not all(tolerates(tolerations, taint) for tolerations in tolerating):
                excluded[device] = "tainted"
                break
    return excluded


# Exclusions of one node for a pod, as a memo key: (device name, why) pairs.
ExcludedKey = frozenset[tuple[str, Exclusion]]
NO_EXCLUSIONS: Final[ExcludedKey] = frozenset()
# A pod that tolerates no taint and holds no allocation: what every pod's exclusions reduce to
# on a node where it holds nothing and which has no taint its claims could tolerate.
_TOLERATING_NONE: Final = DraPod(claims=(), extended=1)


def base_exclusions(devices: NodeDevices) -> ExcludedKey:
    """The GPUs of one node that no pod holding none of them and tolerating no taint can get:
    every allocated one and every one with a blocking taint (`excluded_gpus` for such a pod)."""
    if devices is NO_DEVICES:
        return NO_EXCLUSIONS
    return frozenset(excluded_gpus(devices, _TOLERATING_NONE).items())


def tolerates_any(pod: DraPod) -> bool:
    """Whether any of the pod's claims has a toleration (else `base_exclusions` is its own
    exclusions wherever it holds no allocation)."""
    return any(claim.tolerations for claim in pod.claims)


def held_pools(pod: DraPod) -> frozenset[str]:
    """The pools (nodes) where one of the pod's own claims is allocated already."""
    return frozenset(pool for claim in pod.claims for pool, _ in claim.allocated)


# A rule's target: (pool, device); None in either is every pool, or every device of the pool.
RuleTarget = tuple[str | None, str | None, DeviceTaint]


def taints_by_pool(
    rules: Iterable[RuleTarget],
) -> tuple[dict[str, Mapping[str, tuple[DeviceTaint, ...]]], Mapping[str, tuple[DeviceTaint, ...]]]:
    """Rules as (pool -> device -> its taints, device -> taints of every pool): a rule for
    every device of a pool is kept under `ANY_DEVICE`, and the taints of every pool are in each
    pool's own mapping too, so a pool's taints are one lookup (the second mapping serves the
    pools with no rule of their own)."""
    everywhere: dict[str, tuple[DeviceTaint, ...]] = {}
    pools: dict[str, dict[str, tuple[DeviceTaint, ...]]] = {}
    for pool, device, taint in rules:
        devices = everywhere if pool is None else pools.setdefault(pool, {})
        key = ANY_DEVICE if device is None else device
        devices[key] = (*devices.get(key, ()), taint)
    for devices in pools.values():
        for key, taints in everywhere.items():
            devices[key] = (*devices.get(key, ()), *taints)
    return (
        {pool: MappingProxyType(devices) for pool, devices in pools.items()},
        MappingProxyType(everywhere),
    )
