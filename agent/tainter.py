"""The agent's DRA side: keeps one DeviceTaintRule per GPU that breaks the device rules.

Runs once per tick after the annotation write, with the same reading. The decisions are
`agent.dra`'s (pure); this module holds the per-GPU state, asks `DraClient` (the only I/O), and
reports through metrics and a log line per change of state. It never raises for an API fault:
without DRA, without DeviceTaintRules, or without the RBAC to use them, it does nothing, says
why once, and looks again at the next resync.

Resync (at start, then every `resync_interval_s`, sooner after an error): discover the API,
list the node's ResourceSlices and the agent's own rules. Listing the rules at every resync
learns what the server holds after a restart and repairs a rule removed by hand; a rule for a
device no longer published is deleted then.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol

from agent.dra import (
    MANAGED_BY,
    MANAGED_BY_LABEL,
    DraDevice,
    TaintKind,
    TaintPolicy,
    TaintReason,
    TaintState,
    conditions,
    decide_taint,
    node_devices,
    own_rules,
    rule_body,
    rule_name,
    taint_failed,
    taint_written,
)
from agent.dra_api import DraApi, DraApiMissing
from agent.kube import ApiError, ForbiddenError, NotFoundError
from agent.metrics import AgentMetrics
from agent.records import NodeReading

log = logging.getLogger(__name__)


class DraState(StrEnum):
    """What the DRA side is doing; the values are the `gpu_agent_dra_state` labels."""

    ACTIVE = "active"
    NO_DEVICES = "no-devices"
    API_MISSING = "api-missing"
    FORBIDDEN = "forbidden"
    ERROR = "error"


class DraApiClient(Protocol):
    """What the tainter needs from `agent.dra_api.DraClient` (tests pass a fake)."""

    def discover(self) -> DraApi: ...
    def node_uid(self) -> str | None: ...
    def list_slices(self, api: DraApi, *, driver: str) -> list[object]: ...
    def list_rules(self, api: DraApi, *, label_selector: str) -> list[object]: ...
    def apply_rule(self, api: DraApi, body: Mapping[str, Any]) -> None: ...
    def delete_rule(self, api: DraApi, name: str) -> None: ...


@dataclass(slots=True)
class _Gpu:
    device: DraDevice
    state: TaintState = field(default_factory=TaintState)


class DeviceTainter:
    """One node's DeviceTaintRules. Not thread-safe: the tick loop runs one tick at a time."""

    def __init__(
        self,
        client: DraApiClient,
        *,
        node_name: str,
        driver: str,
        prefix: str,
        policy: TaintPolicy,
        metrics: AgentMetrics,
        resync_interval_s: float = 300.0,
    ) -> None:
        self.client = client
        self.node_name = node_name
        self.driver = driver
        self.prefix = prefix
        self.policy = policy
        self.metrics = metrics
        self.resync_interval_s = resync_interval_s
        self.api: DraApi | None = None
        self.state: DraState | None = None
        self.gpus: dict[str, _Gpu] = {}
        # Every GPU UUID NVML has read since start: one of them missing now is a lost GPU.
        self.seen_uuids: frozenset[str] = frozenset()
        self.next_resync_s: float | None = None
        # The Node's UID, the owner of the rules; read once, None while unknown.
        self.node_uid: str | None = None
        self._logged_problems: tuple[str, ...] = ()

    def device_names(self) -> dict[str, str]:
        """GPU UUID -> its device name in the driver's ResourceSlice, as of the last resync:
        published per GPU (`per-gpu-dra-device`) so readers can match claims and rules, which
        name devices, to the GPUs' readings. Empty while the DRA side is not active."""
        if self.state is not DraState.ACTIVE:
            return {}
        return {uuid: gpu.device.name for uuid, gpu in self.gpus.items()}

    # ------------------------------------------------------------------ tick
    def tick(self, reading: NodeReading, *, now_s: float) -> None:
        self.seen_uuids |= {g.uuid for g in reading.gpus}
        if self.next_resync_s is None or now_s >= self.next_resync_s:
            self._resync(now_s)
        api = self.api
        if self.state is not DraState.ACTIVE or api is None:
            return
        read = [(g.uuid, g.utilization, g.temperature_c) for g in reading.gpus]
        if reading.fatal is not None:
            read = []  # NVML itself failed: every GPU it read before counts as lost
        found = conditions(read, (g.device for g in self.gpus.values()), seen_uuids=self.seen_uuids)
        for uuid, condition in found.items():
            gpu = self.gpus[uuid]
            decision = decide_taint(gpu.state, condition, now_s=now_s, policy=self.policy)
            if decision.action is None:
                if decision.reason is not TaintReason.IN_SYNC:
                    self.metrics.dra_suppressed.labels(reason=decision.reason.value).inc()
                continue
            self._write(api, gpu, decision.wanted, decision.reason, now_s=now_s)
            if self.api is None:
                break  # the API is gone: the next tick discovers it again
        self._publish_counts()

    def _write(
        self,
        api: DraApi,
        gpu: _Gpu,
        wanted: TaintKind | None,
        reason: TaintReason,
        *,
        now_s: float,
    ) -> None:
        device = gpu.device
        try:
            if wanted is None:
                self.client.delete_rule(api, rule_name(device))
            else:
                body = rule_body(
                    device,
                    wanted,
                    prefix=self.prefix,
                    api_version=api.rules_version,
                    node_uid=self.node_uid,
                )
                self.client.apply_rule(api, body)
        except ApiError as error:
            gpu.state = taint_failed(
                gpu.state, now_s=now_s, policy=self.policy, retry_after_s=error.retry_after_s
            )
            self.metrics.dra_api_errors.labels(code=error.code).inc()
            if isinstance(error, NotFoundError):
                # The resource itself is gone (a downgrade, the API turned off): discover again
                # at the next tick rather than retry a path that no longer exists.
                self.api = None
                self.next_resync_s = now_s
            log.warning(
                "device taint write for %s (%s) failed, next attempt in %.0f s: %s",
                device.name,
                reason.value,
                (gpu.state.retry_at_s or now_s) - now_s,
                error,
            )
            return
        gpu.state = taint_written(gpu.state, wanted=wanted, now_s=now_s)
        self.metrics.dra_writes.labels(reason=reason.value).inc()
        log.info(
            "device %s %s%s",
            device.name,
            "untainted" if wanted is None else "tainted ",
            "" if wanted is None else f"{self.prefix}{wanted.value}:NoSchedule",
        )

    # ------------------------------------------------------------------ resync
    def _resync(self, now_s: float) -> None:
        try:
            state = self._resync_once()
        except DraApiMissing as missing:
            self._set_state(DraState.API_MISSING, str(missing))
        except ForbiddenError as error:
            self._set_state(DraState.FORBIDDEN, str(error))
        except ApiError as error:
            self.metrics.dra_api_errors.labels(code=error.code).inc()
            self._set_state(DraState.ERROR, str(error))
            # An error is retried sooner than a settled state is rechecked.
            self.next_resync_s = now_s + min(self.resync_interval_s, self.policy.backoff_base_s)
            return
        else:
            self._set_state(state, self._state_detail(state))
        self.next_resync_s = now_s + self.resync_interval_s

    def _resync_once(self) -> DraState:
        if self.api is None or self.state is not DraState.ACTIVE:
            self.api = self.client.discover()
        api = self.api
        if self.node_uid is None:
            try:
                self.node_uid = self.client.node_uid()
            except ApiError as error:
                # Rules without an owner still work; they are only not collected with the Node.
                log.warning("cannot read node %r for the rules' owner: %s", self.node_name, error)
        found = node_devices(
            self.client.list_slices(api, driver=self.driver),
            driver=self.driver,
            node_name=self.node_name,
        )
        if found.problems != self._logged_problems:
            for problem in found.problems:
                log.warning("DRA: %s", problem)
            self._logged_problems = found.problems
        # A GPU keeps its write history across resyncs, even if its device was renamed.
        previous = self.gpus
        self.gpus = {
            d.uuid: _Gpu(d, previous[d.uuid].state if d.uuid in previous else TaintState())
            for d in found.devices
        }
        by_device = {gpu.device.name: gpu for gpu in self.gpus.values()}
        rules = own_rules(
            self.client.list_rules(api, label_selector=f"{MANAGED_BY_LABEL}={MANAGED_BY}"),
            driver=self.driver,
            node_name=self.node_name,
            prefix=self.prefix,
        )
        held = {rule.device: rule for rule in rules}
        for gpu in self.gpus.values():
            rule = held.get(gpu.device.name)
            published = rule.kind if rule is not None else None
            if gpu.state.published != published:
                # The server is the truth: a rule removed by hand is written again if still due.
                gpu.state = TaintState(
                    published=published,
                    attempts_s=gpu.state.attempts_s,
                    consecutive_failures=gpu.state.consecutive_failures,
                    retry_at_s=gpu.state.retry_at_s,
                )
        for rule in rules:
            if rule.device not in by_device or rule.kind is None:
                self.client.delete_rule(api, rule.name)
                log.info("deleted DeviceTaintRule %s (its device or key is gone)", rule.name)
        self._publish_counts()
        matched = [g for g in self.gpus.values() if g.device.uuid in self.seen_uuids]
        return DraState.ACTIVE if matched or not self.seen_uuids else DraState.NO_DEVICES

    def _state_detail(self, state: DraState) -> str:
        if state is DraState.ACTIVE:
            names = ", ".join(sorted(g.device.name for g in self.gpus.values())) or "none yet"
            return f"driver {self.driver}, pool {self.node_name}: devices {names}"
        return (
            f"no device of driver {self.driver} in pool {self.node_name} has the uuid of a GPU "
            "NVML reads (DRA driver not installed, another driver name, or GPUs given out by "
            "the device plugin)"
        )

    def _set_state(self, state: DraState, detail: str) -> None:
        for value in DraState:
            self.metrics.dra_state.labels(state=value.value).set(1 if value is state else 0)
        if state is not self.state:
            level = logging.INFO if state is DraState.ACTIVE else logging.WARNING
            log.log(level, "DRA device taints %s: %s", state.value, detail)
            self.state = state

    def _publish_counts(self) -> None:
        counts = dict.fromkeys(TaintKind, 0)
        for gpu in self.gpus.values():
            if gpu.state.published is not None:
                counts[gpu.state.published] += 1
        for kind, count in counts.items():
            self.metrics.dra_tainted.labels(key=kind.value).set(count)

    def tainted(self) -> dict[str, TaintKind]:
        """Device name -> the taint the server holds (for tests and debugging)."""
        return {
            g.device.name: g.state.published
            for g in self.gpus.values()
            if g.state.published is not None
        }
