"""The Namespace watch: every namespace's labels, for tenant profiles chosen by label.

Started only when a profile has a `namespace-selector` (`PolicySet.reads_labels`). The request
path reads `labels(namespace)`, one dict lookup; a change of any namespace's labels bumps
`generation`, so whoever memoises the profile chosen per namespace knows to choose again.
Until the first LIST, and while the watch is failing, the last labels known are kept (a
namespace not seen yet has none, so only name-based profiles can match it).
"""

from __future__ import annotations

import logging
import random
import sys
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Final

import msgspec

from exporter_scheduler.edges.listwatch import CacheTuning, ListWatch
from exporter_scheduler.serving.metrics import ScorerMetrics

log = logging.getLogger("exporter_scheduler.namespacecache")

_NO_LABELS: Final[Mapping[str, str]] = MappingProxyType({})


class _Meta(msgspec.Struct):
    name: str | None = None
    resourceVersion: str | None = None  # noqa: N815 (Kubernetes JSON name)
    labels: dict[str, str] | None = None
    # NamespaceList only: the token for the next page (`continue` is a Python keyword).
    continue_: str | None = msgspec.field(default=None, name="continue")


class _Object(msgspec.Struct):
    metadata: _Meta | None = None
    code: int | None = None
    reason: str | None = None
    message: str | None = None


class _List(msgspec.Struct):
    metadata: _Meta | None = None
    items: list[_Object] | None = None


class _Event(msgspec.Struct):
    type: str = ""
    object: _Object | None = None


class NamespaceCache(ListWatch):
    """Namespace name -> labels, kept current by a background list + watch."""

    kind = "namespace"

    def __init__(
        self,
        *,
        kubeconfig: str | None = None,
        metrics: ScorerMetrics | None = None,
        tuning: CacheTuning | None = None,
        rng: random.Random | None = None,
        api: Any = None,
    ) -> None:
        super().__init__(kubeconfig=kubeconfig, metrics=metrics, tuning=tuning, rng=rng, api=api)
        self._page = msgspec.json.Decoder(_List)
        self._event = msgspec.json.Decoder(_Event)
        self._labels: dict[str, Mapping[str, str]] = {}
        self.generation = 0

    def labels(self, namespace: str) -> Mapping[str, str]:
        return self._labels.get(namespace, _NO_LABELS)

    def _list(self, **kwargs: Any) -> Any:
        return self._api.list_namespace(**kwargs)

    def _replace(self, items: list[Any]) -> None:
        fresh: dict[str, Mapping[str, str]] = {}
        for item in items:
            meta = item.metadata
            if meta is not None and meta.name:
                fresh[sys.intern(meta.name)] = MappingProxyType(dict(meta.labels or {}))
        if fresh != self._labels:
            self._labels = fresh
            self.generation += 1

    def _on_event(self, kind: str, obj: Any) -> bool:
        meta = obj.metadata
        name = sys.intern(meta.name)
        if kind == "DELETED":
            if self._labels.pop(name, None) is None:
                return False
        else:
            labels = MappingProxyType(dict(meta.labels or {}))
            if self._labels.get(name) == labels:
                return False  # annotations, finalizers: not what a profile reads
            self._labels = {**self._labels, name: labels}  # readers see one dict or the other
        self.generation += 1
        return True
