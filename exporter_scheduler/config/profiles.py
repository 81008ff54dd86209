"""Tenant profiles: a policy per team, chosen by the pod's namespace.

A policy file may carry `profiles:`, a list of named overrides of the top-level policy, each
chosen by the namespace's name (names or shell-style globs) and/or its labels (a Kubernetes
label selector: `matchLabels` and `matchExpressions`, the labels read from a Namespace watch off
the request path). The first profile that matches wins; a namespace no profile matches gets the
top-level policy. Every profile is a whole `Policy`, built and checked at start-up, so a bad
override stops the scorer with a message naming the profile and the key.

Choosing is pure: `PolicySet.choose(namespace, labels)`. Each profile's policy is its own object,
so its pod classes, verdict tables and names-only entries are its own: a namespace whose labels
change simply looks its verdicts up under another policy, at no request-time cost.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal

from exporter_scheduler.core.policy import Policy

Operator = Literal["In", "NotIn", "Exists", "DoesNotExist"]
OPERATORS: Final[tuple[Operator, ...]] = ("In", "NotIn", "Exists", "DoesNotExist")
# What a profile may not override: the annotation prefix and the GPU resource are read by the
# node cache and by kube-scheduler's managedResources for every pod alike.
NOT_PER_PROFILE: Final = frozenset({"annotation_prefix", "gpu_resource_name"})
DEFAULT_PROFILE: Final = "default"
# A DNS label: profile names appear in metrics labels and log fields.
_NAME: Final = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


class ProfileError(ValueError):
    """A profile that cannot be used; the message names the profile and the key."""


@dataclass(frozen=True, slots=True)
class Requirement:
    """One `matchExpressions` entry."""

    key: str
    operator: Operator
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        if self.operator == "Exists":
            return self.key in labels
        if self.operator == "DoesNotExist":
            return self.key not in labels
        value = labels.get(self.key)
        if self.operator == "In":
            return value is not None and value in self.values
        return value is None or value not in self.values  # NotIn, as Kubernetes reads it


@dataclass(frozen=True, slots=True)
class LabelSelector:
    """A Kubernetes label selector: every `matchLabels` pair and every requirement must hold."""

    match_labels: tuple[tuple[str, str], ...] = ()
    match_expressions: tuple[Requirement, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(labels.get(k) == v for k, v in self.match_labels) and all(
            r.matches(labels) for r in self.match_expressions
        )


@dataclass(frozen=True, slots=True)
class Profile:
    name: str
    # Namespace names or globs (`ml-*`); empty: any name.
    namespaces: tuple[str, ...]
    selector: LabelSelector | None
    policy: Policy

    def matches(self, namespace: str, labels: Mapping[str, str]) -> bool:
        if self.namespaces and not any(fnmatch.fnmatchcase(namespace, p) for p in self.namespaces):
            return False
        return self.selector is None or self.selector.matches(labels)


@dataclass(frozen=True, slots=True)
class PolicySet:
    """The top-level policy and the profiles, in the order they are tried."""

    default: Policy
    profiles: tuple[Profile, ...] = ()

    @property
    def reads_labels(self) -> bool:
        """Whether choosing needs the namespaces' labels (a Namespace watch)."""
        return any(p.selector is not None for p in self.profiles)

    def choose(self, namespace: str, labels: Mapping[str, str]) -> Policy:
        for profile in self.profiles:
            if profile.matches(namespace, labels):
                return profile.policy
        return self.default

    def policies(self) -> tuple[Policy, ...]:
        return (self.default, *(p.policy for p in self.profiles))


def parse_profiles(
    raw: object,
    default: Policy,
    policy_fields: Sequence[str],
    coerce: Callable[[str, object], object] = lambda _field, value: value,
) -> tuple[Profile, ...]:
    """The `profiles:` list of a policy file, each built on `default`; raises `ProfileError`.

    `coerce(field, value)` reads a value as the setting of that name reads it (the settings
    layer passes its own types, so that `"false"` means false in a profile as everywhere
    else), raising ValueError for a value of the wrong kind."""
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise ProfileError("profiles must be a list of mappings, each with a name")
    profiles: list[Profile] = []
    seen: set[str] = set()
    for index, entry in enumerate(raw):
        where = f"profiles[{index}]"
        if not isinstance(entry, dict):
            raise ProfileError(f"{where}: must be a mapping with a name")
        name = entry.get("name")
        if not isinstance(name, str) or not _NAME.fullmatch(name) or name == DEFAULT_PROFILE:
            raise ProfileError(
                f"{where}: name must be a DNS label (lower case, digits, '-') other than "
                f"{DEFAULT_PROFILE!r}, got {name!r}"
            )
        where = f"profile {name!r}"
        if name in seen:
            raise ProfileError(f"{where}: the name is used twice")
        seen.add(name)
        namespaces = _namespaces(entry.get("namespaces"), where)
        raw_selector = entry.get("namespace-selector", entry.get("namespace_selector"))
        selector = _selector(raw_selector, where)
        if not namespaces and selector is None:
            raise ProfileError(f"{where}: needs namespaces and/or namespace-selector")
        overrides: dict[str, Any] = {}
        for key, value in entry.items():
            field = str(key).replace("-", "_")
            if field in ("name", "namespaces", "namespace_selector"):
                continue
            if field in NOT_PER_PROFILE:
                raise ProfileError(f"{where}: {key} is cluster-wide and cannot differ per profile")
            if field not in policy_fields:
                raise ProfileError(
                    f"{where}: unknown setting {key!r}; known: {', '.join(policy_fields)}"
                )
            try:
                overrides[field] = coerce(field, value)
            except ValueError as exc:
                raise ProfileError(f"{where}: {key}: {exc}") from None
        try:
            policy = dataclasses.replace(default, profile=name, **overrides)
        except (ValueError, TypeError) as exc:
            raise ProfileError(f"{where}: {exc}") from None
        profiles.append(Profile(name, namespaces, selector, policy))
    return tuple(profiles)


def _namespaces(raw: object, where: str) -> tuple[str, ...]:
    if raw is None:
        return ()
    if isinstance(raw, str):
        raw = [raw]
    if not isinstance(raw, list) or not all(isinstance(n, str) and n for n in raw):
        raise ProfileError(f"{where}: namespaces must be a list of names or globs")
    return tuple(raw)


def _selector(raw: object, where: str) -> LabelSelector | None:
    if raw is None:
        return None
    if not isinstance(raw, dict) or set(raw) - {"matchLabels", "matchExpressions"}:
        raise ProfileError(f"{where}: namespace-selector takes matchLabels and/or matchExpressions")
    labels = raw.get("matchLabels") or {}
    if not isinstance(labels, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in labels.items()
    ):
        raise ProfileError(f"{where}: namespace-selector.matchLabels must map strings to strings")
    expressions: list[Requirement] = []
    for i, item in enumerate(raw.get("matchExpressions") or ()):
        at = f"{where}: namespace-selector.matchExpressions[{i}]"
        if not isinstance(item, dict) or not isinstance(item.get("key"), str):
            raise ProfileError(f"{at}: needs a key")
        operator = item.get("operator")
        if operator not in OPERATORS:
            raise ProfileError(f"{at}: operator must be one of {', '.join(OPERATORS)}")
        values = item.get("values") or []
        if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
            raise ProfileError(f"{at}: values must be a list of strings")
        if operator in ("In", "NotIn") and not values:
            raise ProfileError(f"{at}: {operator} needs values")
        if operator in ("Exists", "DoesNotExist") and values:
            raise ProfileError(f"{at}: {operator} takes no values")
        expressions.append(Requirement(item["key"], operator, tuple(values)))
    if not labels and not expressions:
        raise ProfileError(f"{where}: namespace-selector is empty (it would match everything)")
    return LabelSelector(tuple(sorted(labels.items())), tuple(expressions))
