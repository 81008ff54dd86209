"""What the DRA watch keeps, as the request path reads it: claims, their allocations by pool,
and the device taints by pool (`edges.dracache` fills it from its two watches).

A DeviceTaintRule may select one device, every device of a pool (no device), or a device name,
or every device, in every pool (no pool); a rule naming another driver is not kept, one naming
no driver is every driver's (as kube-scheduler's ResourceSlice tracker applies them). The
taints of every pool are folded into each pool's own mapping, so a pool's taints are one
lookup, and the exclusions they make on a pool without rules or allocations of its own are
`default_exclusions`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Container, Iterable, Mapping
from types import MappingProxyType
from typing import Final

from exporter_scheduler.core.dra import (
    NO_DEVICES,
    NO_EXCLUSIONS,
    ClaimInfo,
    DeviceTaint,
    ExcludedKey,
    NodeDevices,
    RuleTarget,
    base_exclusions,
    taints_by_pool,
)

_NO_TAINTS: Final[Mapping[str, tuple[DeviceTaint, ...]]] = MappingProxyType({})
_NO_ALLOCATIONS: Final[Mapping[str, str]] = MappingProxyType({})


class _EveryPool:
    """Every pool: where a rule without a pool taints devices everywhere."""

    def __contains__(self, pool: object) -> bool:
        return True


_EVERY_POOL: Final = _EveryPool()


class DraData:
    """The claims and taints, as the request path reads them (one dict lookup each).

    Written by the two watch threads, read by requests without a lock: every write replaces a
    pool's mapping whole (copy on write), so a reader sees it before or after a change.
    """

    def __init__(self, *, driver: str, device_classes: Iterable[str]) -> None:
        self.driver = driver
        self.device_classes = frozenset(device_classes)
        self._claims: dict[str, ClaimInfo] = {}
        # namespace/name -> what a claim made from the ResourceClaimTemplate asks (nothing
        # allocated): a pod's claim the claim watch has not seen yet is judged on it.
        self._templates: dict[str, ClaimInfo] = {}
        self._allocated: dict[str, Mapping[str, str]] = {}  # pool -> device -> claim ref
        self._rules: dict[str, RuleTarget] = {}
        # pool -> device (or `ANY_DEVICE`) -> taints, every pool's taints included
        self._taints: dict[str, Mapping[str, tuple[DeviceTaint, ...]]] = {}
        # device (or `ANY_DEVICE`) -> the taints of rules without a pool
        self._everywhere: Mapping[str, tuple[DeviceTaint, ...]] = _NO_TAINTS
        # pool -> `core.dra.base_exclusions`, kept at each write; each change to `on_exclusions`
        self.base_exclusions: dict[str, ExcludedKey] = {}
        # Those of a pool that is not in `base_exclusions`: the rules without a pool's.
        self.default_exclusions: ExcludedKey = NO_EXCLUSIONS
        self.on_exclusions: Callable[[str, ExcludedKey], None] | None = None
        self.claims_ready = False
        self.taints_ready = False
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ reads (any thread)
    def claim(self, namespace: str, name: str) -> ClaimInfo | None:
        return self._claims.get(f"{namespace}/{name}")

    def template(self, namespace: str, name: str) -> ClaimInfo | None:
        return self._templates.get(f"{namespace}/{name}")

    def devices(self, pool: str) -> NodeDevices:
        allocated = self._allocated.get(pool, _NO_ALLOCATIONS)
        taints = self._taints.get(pool, self._everywhere)
        if allocated is _NO_ALLOCATIONS and taints is _NO_TAINTS:
            return NO_DEVICES
        return NodeDevices(allocated, taints)

    def tainted_pools(self) -> Container[str]:
        return _EVERY_POOL if self._everywhere else self._taints.keys()

    def __len__(self) -> int:
        return len(self._claims)

    def _rebase(self, pools: Iterable[str]) -> None:
        """Under the lock: `base_exclusions` of `pools` again, each change told the listener."""
        for pool in pools:
            key = base_exclusions(self.devices(pool))
            if key != self.base_exclusions.get(pool, self.default_exclusions):
                self.base_exclusions[pool] = key
                if self.on_exclusions is not None:
                    self.on_exclusions(pool, key)

    # ------------------------------------------------------------------ claims (its thread)
    def replace_claims(self, claims: Iterable[ClaimInfo]) -> None:
        fresh = {claim.ref: claim for claim in claims}
        allocated: dict[str, dict[str, str]] = {}
        for claim in fresh.values():
            for pool, device in claim.allocated:
                allocated.setdefault(pool, {})[device] = claim.ref
        with self._lock:
            self._claims = fresh
            self._allocated = {pool: MappingProxyType(d) for pool, d in allocated.items()}
            self._rebase([*self._allocated, *self._taints, *self.base_exclusions])
            self.claims_ready = True

    def put_claim(self, claim: ClaimInfo) -> bool:
        with self._lock:
            old = self._claims.get(claim.ref)
            if old == claim:
                return False
            self._claims[claim.ref] = claim
            self._reindex(old, claim)
        return True

    def delete_claim(self, ref: str) -> bool:
        with self._lock:
            old = self._claims.pop(ref, None)
            if old is None:
                return False
            self._reindex(old, None)
        return True

    # ------------------------------------------------------------------ templates (its thread)
    def replace_templates(self, templates: Iterable[ClaimInfo]) -> None:
        self._templates = {template.ref: template for template in templates}

    def put_template(self, template: ClaimInfo) -> bool:
        if self._templates.get(template.ref) == template:
            return False
        self._templates[template.ref] = template
        return True

    def delete_template(self, ref: str) -> bool:
        return self._templates.pop(ref, None) is not None

    def _reindex(self, old: ClaimInfo | None, new: ClaimInfo | None) -> None:
        before = set() if old is None else set(old.allocated)
        after = set() if new is None else set(new.allocated)
        if before == after:
            return
        changed: dict[str, dict[str, str]] = {}
        for pool, device in before - after:
            pool_map = changed.setdefault(pool, dict(self._allocated.get(pool, {})))
            if old is not None and pool_map.get(device) == old.ref:
                del pool_map[device]
        for pool, device in after - before:
            assert new is not None
            changed.setdefault(pool, dict(self._allocated.get(pool, {})))[device] = new.ref
        for pool, pool_map in changed.items():
            if pool_map:
                self._allocated[pool] = MappingProxyType(pool_map)
            else:
                self._allocated.pop(pool, None)
        self._rebase(changed)

    # ------------------------------------------------------------------ rules (its thread)
    def replace_rules(self, rules: Mapping[str, RuleTarget]) -> None:
        with self._lock:
            self._rules = dict(rules)
            self._reindex_rules()
            self.taints_ready = True

    def put_rule(self, name: str, taint: RuleTarget | None) -> bool:
        with self._lock:
            old = self._rules.get(name)
            if old == taint:
                return False
            if taint is None:
                del self._rules[name]
            else:
                self._rules[name] = taint
            self._reindex_rules()
        return True

    def _reindex_rules(self) -> None:
        """Under the lock. Rules are few (one per tainted GPU): the index is rebuilt whole, and
        the pools whose taints changed get their exclusions again."""
        was, was_everywhere = self._taints, self._everywhere
        self._taints, everywhere = taints_by_pool(self._rules.values())
        self._everywhere = everywhere or _NO_TAINTS  # `devices` tells an empty pool by identity
        if self._everywhere != was_everywhere:
            self.default_exclusions = (
                base_exclusions(NodeDevices(_NO_ALLOCATIONS, self._everywhere))
                if self._everywhere
                else NO_EXCLUSIONS
            )
            pools: Iterable[str] = {*was, *self._taints, *self._allocated, *self.base_exclusions}
        else:
            pools = (p for p in {*was, *self._taints} if was.get(p) != self._taints.get(p))
        self._rebase(pools)
