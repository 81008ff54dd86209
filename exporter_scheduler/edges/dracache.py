"""The DRA watch: what DRA pods' verdicts read of ResourceClaims, their templates and
DeviceTaintRules.

A pod that asks for GPUs through Dynamic Resource Allocation is judged on the GPUs
kube-scheduler's allocator may still give it (`core.dra`): the node's devices less those
allocated to another claim and those tainted against its claims. This cache keeps the least
that decides that, off the request path:

- of each ResourceClaim (all namespaces): its GPU request count for the configured device
  classes, the tolerations of those requests, and its allocation results for the driver as
  (pool, device); indexed by pool, which NVIDIA's driver names after the node;
- of each ResourceClaimTemplate: the same of the claims made from it (nothing allocated), which
  a pod's claim is judged on until the claim's own event arrives;
- of each DeviceTaintRule that can select the driver's devices: (pool, device, key, value,
  effect), where no pool is every pool and no device every device of the pool
  (`edges.dradata`).

Everything else of those objects is skipped by msgspec in C: at 30,000 GPU claims a few MB,
and one watch event per claim allocated or released (docs/scoring.md, "DRA pods").

The API's versions are found once at start (resource.k8s.io v1, else v1beta2/v1beta1). A
cluster without DRA or without DeviceTaintRules gets one log line (DRA pods judged without
claims or taints), never a crash loop; until the claims' first LIST, as any other pod.
"""

from __future__ import annotations

import json
import logging
import random
import sys
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any, Final

import msgspec

from exporter_scheduler.core.dra import (
    ALL_GPUS,
    NOT_GPUS,
    ClaimInfo,
    DeviceTaint,
    RuleTarget,
    Toleration,
    first_gpu_count,
)
from exporter_scheduler.edges.dradata import DraData
from exporter_scheduler.edges.listwatch import CacheTuning, ListWatch, call_list
from exporter_scheduler.serving.metrics import ScorerMetrics

log = logging.getLogger("exporter_scheduler.dracache")

DRA_GROUP: Final = "resource.k8s.io"
# Newest first. ResourceClaim is v1 from 1.34; DeviceTaintRule is v1 from 1.37, v1beta2 (gated)
# in 1.36.
DRA_VERSIONS: Final = ("v1", "v1beta2", "v1beta1")


# ----------------------------------------------------------------------------- wire structs
class _Meta(msgspec.Struct):
    name: str | None = None
    namespace: str | None = None
    resourceVersion: str | None = None  # noqa: N815 (Kubernetes JSON name)
    continue_: str | None = msgspec.field(default=None, name="continue")


class _Toleration(msgspec.Struct):
    key: str | None = None
    operator: str | None = None
    value: str | None = None
    effect: str | None = None


class _Exact(msgspec.Struct):
    deviceClassName: str | None = None  # noqa: N815
    allocationMode: str | None = None  # noqa: N815
    count: int | None = None
    tolerations: list[_Toleration] | None = None


class _Request(_Exact):
    # v1: the request is `exactly` one class or `firstAvailable` of several; v1beta1 has the
    # `exactly` fields on the request itself.
    exactly: _Exact | None = None
    firstAvailable: list[_Exact] | None = None  # noqa: N815


class _Devices(msgspec.Struct):
    requests: list[_Request] | None = None


class _ClaimSpec(msgspec.Struct):
    devices: _Devices | None = None


class _Result(msgspec.Struct):
    driver: str = ""
    pool: str = ""
    device: str = ""


class _AllocatedDevices(msgspec.Struct):
    results: list[_Result] | None = None


class _Allocation(msgspec.Struct):
    devices: _AllocatedDevices | None = None


class _ClaimStatus(msgspec.Struct):
    allocation: _Allocation | None = None


class _Selector(msgspec.Struct):
    driver: str | None = None
    pool: str | None = None
    device: str | None = None


class _Taint(msgspec.Struct):
    key: str = ""
    value: str | None = None
    effect: str = ""


class _RuleSpec(msgspec.Struct):
    deviceSelector: _Selector | None = None  # noqa: N815
    taint: _Taint | None = None


class _Claim(msgspec.Struct):
    metadata: _Meta | None = None
    spec: _ClaimSpec | None = None
    status: _ClaimStatus | None = None
    code: int | None = None
    reason: str | None = None
    message: str | None = None


class _TemplateSpec(msgspec.Struct):
    spec: _ClaimSpec | None = None  # what each claim made from the template asks


class _Template(msgspec.Struct):
    metadata: _Meta | None = None
    spec: _TemplateSpec | None = None
    code: int | None = None
    reason: str | None = None
    message: str | None = None


class _TemplateList(msgspec.Struct):
    metadata: _Meta | None = None
    items: list[_Template] | None = None


class _TemplateEvent(msgspec.Struct):
    type: str = ""
    object: _Template | None = None


class _Rule(msgspec.Struct):
    metadata: _Meta | None = None
    spec: _RuleSpec | None = None
    code: int | None = None
    reason: str | None = None
    message: str | None = None


class _ClaimList(msgspec.Struct):
    metadata: _Meta | None = None
    items: list[_Claim] | None = None


class _ClaimEvent(msgspec.Struct):
    type: str = ""
    object: _Claim | None = None


class _RuleList(msgspec.Struct):
    metadata: _Meta | None = None
    items: list[_Rule] | None = None


class _RuleEvent(msgspec.Struct):
    type: str = ""
    object: _Rule | None = None


# ----------------------------------------------------------------------------- what is kept
def claim_info(
    obj: _Claim, *, device_classes: frozenset[str], driver: str
) -> tuple[str, ClaimInfo] | None:
    """`(namespace/name, what a verdict reads)` of a decoded claim; None without a name."""
    meta = obj.metadata
    if meta is None or not meta.name:
        return None
    ref = sys.intern(f"{meta.namespace or ''}/{meta.name}")
    gpus = 0
    flexible: list[tuple[int, ...]] = []
    tolerations: list[Toleration] = []
    devices = None if obj.spec is None else obj.spec.devices
    for request in (None if devices is None else devices.requests) or ():
        exact = request.exactly or request
        options: list[_Exact] = [exact] if exact.deviceClassName else []
        # firstAvailable: the allocator takes the first alternative that fits the node.
        options.extend(request.firstAvailable or ())
        alternatives: list[int] = []
        for option in options:
            if option.deviceClassName not in device_classes:
                # Another class: a way out after a GPU alternative; before the first one, not
                # seen here (the request counts as its GPU alternatives).
                if alternatives:
                    alternatives.append(NOT_GPUS)
                continue
            if not alternatives:  # the first GPU alternative's tolerations stand for all
                tolerations.extend(
                    Toleration(t.key, t.operator or "Equal", t.value, t.effect)
                    for t in option.tolerations or ()
                )
            mode = option.allocationMode or "ExactCount"
            alternatives.append(max(1, option.count or 1) if mode == "ExactCount" else ALL_GPUS)
        if not alternatives:
            continue
        gpus += first_gpu_count(tuple(alternatives))
        if len(alternatives) > 1 or alternatives[0] == ALL_GPUS:
            flexible.append(tuple(alternatives))
    allocated: list[tuple[str, str]] = []
    allocation = None if obj.status is None else obj.status.allocation
    results = None if allocation is None or allocation.devices is None else allocation.devices
    for result in (None if results is None else results.results) or ():
        if result.driver == driver and result.pool and result.device:
            allocated.append((sys.intern(result.pool), sys.intern(result.device)))
    return ref, ClaimInfo(ref, gpus, tuple(allocated), tuple(tolerations), tuple(flexible))


def template_info(
    obj: _Template, *, device_classes: frozenset[str], driver: str
) -> tuple[str, ClaimInfo] | None:
    """`(namespace/name, what a claim made from it asks)` of a decoded ResourceClaimTemplate:
    its claims' request as `claim_info` reads a claim's, nothing allocated; None without a
    name."""
    spec = None if obj.spec is None else obj.spec.spec
    as_claim = _Claim(metadata=obj.metadata, spec=spec)
    return claim_info(as_claim, device_classes=device_classes, driver=driver)


def rule_taint(obj: _Rule, *, driver: str) -> RuleTarget | None:
    """`(pool, device, taint)` of a rule that can select the driver's devices, None in pool or
    device for every one (`core.dra.taints_by_pool`); None for a rule that selects none of them
    (another driver's, or no selector: kube-scheduler's tracker applies a rule without one to no
    device) or has no taint key."""
    meta, spec = obj.metadata, obj.spec
    if meta is None or spec is None or spec.deviceSelector is None or spec.taint is None:
        return None
    selector, taint = spec.deviceSelector, spec.taint
    if not taint.key or (selector.driver is not None and selector.driver != driver):
        return None
    if selector.pool == "" or selector.device == "":
        return None  # names no pool or device there is
    return (
        None if selector.pool is None else sys.intern(selector.pool),
        None if selector.device is None else sys.intern(selector.device),
        DeviceTaint(taint.key, taint.effect, taint.value, meta.name or ""),
    )


# ----------------------------------------------------------------------------- the watches
class _DraWatch(ListWatch):
    """A list + watch of one resource.k8s.io resource through the client's `call_api`: the
    client's typed APIs do not cover every version of DeviceTaintRule this meets."""

    resource = ""

    def __init__(
        self,
        data: DraData,
        version: str,
        *,
        metrics: ScorerMetrics | None,
        tuning: CacheTuning | None,
        rng: random.Random | None,
        api: Any,
    ) -> None:
        super().__init__(kubeconfig=None, metrics=metrics, tuning=tuning, rng=rng, api=api)
        self.data = data
        self._path = f"/apis/{DRA_GROUP}/{version}/{self.resource}"

    def _list(self, **kwargs: Any) -> Any:
        return call_list(self._api, self._path, **kwargs)


class ClaimWatch(_DraWatch):
    kind = "claim"
    resource = "resourceclaims"
    _page = msgspec.json.Decoder(_ClaimList)
    _event = msgspec.json.Decoder(_ClaimEvent)

    def _info(self, obj: Any) -> tuple[str, ClaimInfo] | None:
        data = self.data
        return claim_info(obj, device_classes=data.device_classes, driver=data.driver)

    def _keep(self, items: list[Any]) -> list[Any]:
        kept = []
        for item in items:
            info = self._info(item)
            if info is not None:
                kept.append(info[1])
        return kept

    def _replace(self, items: list[Any]) -> None:
        self.data.replace_claims(items)

    def _on_event(self, kind: str, obj: Any) -> bool:
        info = self._info(obj)
        if info is None:
            return False
        if kind == "DELETED":
            return self._delete(info[0])
        return self._put(info[1])

    def _put(self, info: ClaimInfo) -> bool:
        return self.data.put_claim(info)

    def _delete(self, ref: str) -> bool:
        return self.data.delete_claim(ref)


class TemplateWatch(ClaimWatch):
    """ResourceClaimTemplates, kept as the claims made from them: a pod's claim made from one is
    judged on the template's request until the claim watch has the claim
    (`serving.dra.dra_pod`)."""

    kind = "claim_template"
    resource = "resourceclaimtemplates"
    _page = msgspec.json.Decoder(_TemplateList)
    _event = msgspec.json.Decoder(_TemplateEvent)

    def _info(self, obj: Any) -> tuple[str, ClaimInfo] | None:
        data = self.data
        return template_info(obj, device_classes=data.device_classes, driver=data.driver)

    def _replace(self, items: list[Any]) -> None:
        self.data.replace_templates(items)

    def _put(self, info: ClaimInfo) -> bool:
        return self.data.put_template(info)

    def _delete(self, ref: str) -> bool:
        return self.data.delete_template(ref)


class TaintRuleWatch(_DraWatch):
    kind = "taint_rule"
    resource = "devicetaintrules"
    _page = msgspec.json.Decoder(_RuleList)
    _event = msgspec.json.Decoder(_RuleEvent)

    def _keep(self, items: list[Any]) -> list[Any]:
        kept = []
        for item in items:
            taint = rule_taint(item, driver=self.data.driver)
            if taint is not None and item.metadata is not None:
                kept.append((item.metadata.name, taint))
        return kept

    def _replace(self, items: list[Any]) -> None:
        self.data.replace_rules(dict(items))

    def _on_event(self, kind: str, obj: Any) -> bool:
        name = obj.metadata.name
        taint = None if kind == "DELETED" else rule_taint(obj, driver=self.data.driver)
        return self.data.put_rule(name, taint)


def discover(api: Any) -> dict[str, str]:
    """resource name -> the newest version serving it, of the two this cache watches; empty
    when the API server serves no resource.k8s.io (404)."""
    found: dict[str, str] = {}
    try:
        group = _get_json(api, f"/apis/{DRA_GROUP}")
    except Exception as exc:
        if getattr(exc, "status", None) == 404:
            return found
        raise
    served = {v.get("version") for v in group.get("versions", []) if isinstance(v, dict)}
    for version in DRA_VERSIONS:
        if version not in served:
            continue
        listing = _get_json(api, f"/apis/{DRA_GROUP}/{version}")
        names = {r.get("name") for r in listing.get("resources", []) if isinstance(r, dict)}
        for resource in ("resourceclaims", "resourceclaimtemplates", "devicetaintrules"):
            if resource in names:
                found.setdefault(resource, version)
    return found


def _get_json(api: Any, path: str) -> dict[str, Any]:
    response = api.api_client.call_api(
        path,
        "GET",
        header_params={"Accept": "application/json"},
        auth_settings=["BearerToken"],
        _return_http_data_only=True,
        _preload_content=False,
        _request_timeout=(10.0, 30.0),
    )
    try:
        body = json.loads(response.data or b"{}")
    finally:
        response.release_conn()
    return body if isinstance(body, dict) else {}


class DraCache:
    """The watches over one `DraData` (claims, templates, taint rules), started once the API's
    versions are known.

    `start` returns at once; discovery runs in the background and retries API errors with
    back-off. A cluster that serves no ResourceClaims gets one log line and no watch.
    """

    def __init__(
        self,
        *,
        driver: str,
        device_classes: Iterable[str],
        kubeconfig: str | None = None,
        metrics: ScorerMetrics | None = None,
        tuning: CacheTuning | None = None,
        rng: random.Random | None = None,
        api: Any = None,
    ) -> None:
        self.data = DraData(driver=driver, device_classes=device_classes)
        self.kubeconfig = kubeconfig
        self.metrics = metrics if metrics is not None else ScorerMetrics()
        self.tuning = tuning if tuning is not None else CacheTuning()
        self._rng = rng if rng is not None else random.Random()
        self._api = api
        self._stop = threading.Event()
        self._watches: list[ListWatch] = []
        self._thread: threading.Thread | None = None
        # Why there is no DRA data, once discovery found the API lacking (None: it is there,
        # or discovery has not answered yet).
        self.absent: str | None = None

    def start(self) -> DraCache:
        if self._api is None:
            from exporter_scheduler.edges.listwatch import make_api  # noqa: PLC0415

            self._api = make_api(self.kubeconfig)
        self._thread = threading.Thread(
            target=self._discover, name="gpu-scorer-dra-discovery", daemon=True
        )
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 10.0) -> None:
        self._stop.set()
        # Discovery first: it may be starting a watch, which is then in `_watches` to stop.
        if self._thread is not None:
            self._thread.join(timeout_s)
        for watch in self._watches:
            watch.stop(timeout_s)

    def __enter__(self) -> DraCache:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _discover(self) -> None:
        backoff_s = self.tuning.backoff_initial_s
        while not self._stop.is_set():
            try:
                found = discover(self._api)
                break
            except Exception as exc:
                log.warning(
                    "DRA API discovery failed; retrying",
                    extra={"fields": {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}},
                )
                self._stop.wait(self._rng.uniform(backoff_s / 2, backoff_s))
                backoff_s = min(backoff_s * 2, self.tuning.backoff_max_s)
        else:
            return
        if "resourceclaims" not in found:
            self.absent = f"the API server serves no {DRA_GROUP} ResourceClaims"
            log.info(
                "DRA pods judged as other pods: no DRA data",
                extra={"fields": {"why": self.absent}},
            )
            return
        if "devicetaintrules" not in found:
            self.absent = f"the API server serves no {DRA_GROUP} DeviceTaintRules"
            log.info(
                "DRA pods judged without device taints",
                extra={"fields": {"why": self.absent}},
            )
        kinds: list[tuple[type[_DraWatch], str]] = [(ClaimWatch, found["resourceclaims"])]
        if "resourceclaimtemplates" in found:  # served with ResourceClaims, in every version
            kinds.append((TemplateWatch, found["resourceclaimtemplates"]))
        if "devicetaintrules" in found:
            kinds.append((TaintRuleWatch, found["devicetaintrules"]))
        watches: list[ListWatch] = [
            kind(
                self.data,
                version,
                metrics=self.metrics,
                tuning=self.tuning,
                rng=self._rng,
                api=self._api,
            )
            for kind, version in kinds
        ]
        for watch in watches:
            if self._stop.is_set():
                return
            watch.start()
            self._watches.append(watch)

    @property
    def ready(self) -> bool:
        return self.data.claims_ready

    def wait_until(self, predicate: Callable[[DraCache], bool], timeout_s: float) -> bool:
        """Poll `predicate(self)` until it holds or the deadline passes (tests, start-up)."""
        deadline = time.monotonic() + timeout_s
        while not predicate(self):
            if time.monotonic() >= deadline or self._stop.wait(0.02):
                return predicate(self)
        return True
