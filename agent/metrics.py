"""The agent's Prometheus metrics, in a registry of their own per daemon.

A registry per `AgentMetrics` (not the process-global default) lets every test, and every agent in
one process, start from zero. The age of the last successful write is computed at scrape time from
the monotonic clock, so it keeps growing while writes fail or the tick loop is stuck.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from agent.allocations import QUERY_FAILURE_REASONS, UNKNOWN_REASONS
from agent.attribution import OWNER_OUTCOMES, Outcome
from agent.dra import TAINT_SUPPRESS_REASONS, TAINT_WRITE_REASONS, TaintKind, TaintReason
from agent.limiter import SUPPRESS_REASONS, WRITE_REASONS, Reason
from gpu_contract.schema import Health

# Ticks are sub-millisecond without I/O; a slow NVML or a timing-out API pushes them to seconds.
_TICK_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)


class AgentMetrics:
    """Counters and gauges the daemon updates once per tick."""

    def __init__(
        self,
        *,
        registry: CollectorRegistry | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self._monotonic = monotonic
        self._last_success_s: float | None = None
        self.samples = Counter("gpu_agent_samples", "Sampling ticks run.", registry=self.registry)
        self.writes = Counter(
            "gpu_agent_writes",
            "Successful Node annotation patches, by why they were written.",
            ["reason"],
            registry=self.registry,
        )
        self.writes_suppressed = Counter(
            "gpu_agent_writes_suppressed",
            "Ticks that did not write, by why.",
            ["reason"],
            registry=self.registry,
        )
        self.api_errors = Counter(
            "gpu_agent_api_errors",
            "Failed API requests, by HTTP status code (or 'transport').",
            ["code"],
            registry=self.registry,
        )
        self.nvml_errors = Counter(
            "gpu_agent_nvml_errors",
            "Failed NVML calls, by NVML error kind.",
            ["kind"],
            registry=self.registry,
        )
        self.last_write_age = Gauge(
            "gpu_agent_last_write_age_seconds",
            "Seconds since the last successful write; +Inf before the first.",
            registry=self.registry,
        )
        self.last_write_age.set_function(self._age_s)
        self.tick_duration = Histogram(
            "gpu_agent_tick_duration_seconds",
            "Wall time of one tick, API request included.",
            buckets=_TICK_BUCKETS_S,
            registry=self.registry,
        )
        self.source_read_duration = Histogram(
            "gpu_agent_source_read_duration_seconds",
            "Wall time of reading the GPUs (NVML) in one tick.",
            buckets=_TICK_BUCKETS_S,
            registry=self.registry,
        )
        self.backoff = Gauge(
            "gpu_agent_write_consecutive_failures",
            "Consecutive failed writes (0 when the last write succeeded).",
            registry=self.registry,
        )
        # One series per value, 1 for the current one: alerts select a state without a join,
        # and the series exist (at 0) before a node ever degrades.
        self.health = Gauge(
            "gpu_agent_health",
            "The node's health as last sampled (1 for the current value, 0 for the others).",
            ["health"],
            registry=self.registry,
        )
        self._health_children = {h: self.health.labels(health=h.value) for h in Health}
        self.pod_resources_requests = Counter(
            "gpu_agent_pod_resources_requests",
            "Queries of the kubelet's pod-resources API, by result ('ok' or why it failed).",
            ["result"],
            registry=self.registry,
        )
        self.allocations_unknown = Counter(
            "gpu_agent_allocations_unknown",
            "Ticks that published no per-gpu-allocated although asked to, by why.",
            ["reason"],
            registry=self.registry,
        )
        self.allocations_published = Gauge(
            "gpu_agent_allocations_published",
            "1 when the last tick's state carried per-gpu-allocated, else 0.",
            registry=self.registry,
        )
        # DRA device taints (agent/tainter.py).
        self.dra_state = Gauge(
            "gpu_agent_dra_state",
            "What the DRA device-taint side does (1 for the current state, 0 for the others): "
            "active, no-devices, api-missing, forbidden, error.",
            ["state"],
            registry=self.registry,
        )
        self.dra_writes = Counter(
            "gpu_agent_dra_taint_writes",
            "Successful DeviceTaintRule writes, by why: taint, untaint, change (of the key).",
            ["reason"],
            registry=self.registry,
        )
        self.dra_suppressed = Counter(
            "gpu_agent_dra_taint_writes_suppressed",
            "Due DeviceTaintRule writes held back, by why.",
            ["reason"],
            registry=self.registry,
        )
        self.dra_api_errors = Counter(
            "gpu_agent_dra_api_errors",
            "Failed DRA API requests (discovery, lists, rule writes), by HTTP status code.",
            ["code"],
            registry=self.registry,
        )
        self.dra_tainted = Gauge(
            "gpu_agent_dra_tainted_gpus",
            "GPUs of this node whose DeviceTaintRule the server holds, by taint key.",
            ["key"],
            registry=self.registry,
        )
        for taint_reason in TAINT_WRITE_REASONS:
            self.dra_writes.labels(reason=taint_reason.value)
        for taint_reason in TAINT_SUPPRESS_REASONS:
            if taint_reason is not TaintReason.IN_SYNC:
                self.dra_suppressed.labels(reason=taint_reason.value)
        for kind in TaintKind:
            self.dra_tainted.labels(key=kind.value)
        self.pod_attribution = Counter(
            "gpu_agent_pod_attribution",
            "Each pod's figures on each GPU it holds, per tick, by how they were found.",
            ["outcome"],
            registry=self.registry,
        )
        self.gpu_processes = Counter(
            "gpu_agent_gpu_processes",
            "Processes seen on GPUs shared by several pods, per tick, by whose they turned out.",
            ["owner"],
            registry=self.registry,
        )
        self.process_attribution = Gauge(
            "gpu_agent_process_attribution",
            "1 when shared GPUs are attributed to pods per process (host PIDs visible), else 0.",
            registry=self.registry,
        )
        # Pre-create every label value so dashboards see zeros rather than absent series.
        for outcome in Outcome:
            self.pod_attribution.labels(outcome=outcome.value)
        for owner in OWNER_OUTCOMES:
            self.gpu_processes.labels(owner=owner)
        for result in ("ok", *QUERY_FAILURE_REASONS):
            self.pod_resources_requests.labels(result=result)
        for reason_text in UNKNOWN_REASONS:
            self.allocations_unknown.labels(reason=reason_text)
        for reason in WRITE_REASONS:
            self.writes.labels(reason=reason.value)
        for reason in SUPPRESS_REASONS:
            self.writes_suppressed.labels(reason=reason.value)

    def _age_s(self) -> float:
        if self._last_success_s is None:
            return math.inf
        return max(0.0, self._monotonic() - self._last_success_s)

    def write_succeeded(self, reason: Reason, *, now_s: float) -> None:
        self.writes.labels(reason=reason.value).inc()
        self._last_success_s = now_s
        self.backoff.set(0)

    def write_failed(self, code: str, *, consecutive_failures: int) -> None:
        self.api_errors.labels(code=code).inc()
        self.backoff.set(consecutive_failures)

    def write_suppressed(self, reason: Reason) -> None:
        self.writes_suppressed.labels(reason=reason.value).inc()

    def nvml_errors_seen(self, kinds: tuple[str, ...]) -> None:
        for kind in kinds:
            self.nvml_errors.labels(kind=kind).inc()

    def health_observed(self, health: Health) -> None:
        for value, child in self._health_children.items():
            child.set(1 if value is health else 0)

    def value(self, name: str, labels: dict[str, str] | None = None) -> float:
        """A sample's current value (0 when absent): for tests and the `once` command."""
        found = self.registry.get_sample_value(name, labels or {})
        return 0.0 if found is None else found
