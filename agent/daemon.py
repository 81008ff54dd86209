"""The agent's tick and the loop that runs it.

`Agent.tick` is the unit: read the source (and, on its own schedule, the kubelet's device
allocations; with per-process attribution, the pods of the shared GPUs' processes), aggregate,
ask the limiter, maybe patch, then update the limiter and the metrics.
It takes the monotonic and wall times as arguments, so tests drive it over simulated hours with a
fake clock and never sleep. `run_daemon` wraps it in an APScheduler interval
job (one instance at a time, missed runs coalesced), serves the health endpoints, and stops cleanly
on SIGTERM/SIGINT: the current tick finishes, the scheduler stops, then the source is closed
(`nvmlShutdown`), and the process exits 0.

Nothing a tick meets may kill the loop: a source that raises becomes an `unavailable` reading, an
API error becomes a backoff, and anything else is logged and counted as a failed tick.
"""

from __future__ import annotations

import logging
import random
import signal
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from types import FrameType
from typing import Protocol

from apscheduler.schedulers.background import BackgroundScheduler  # type: ignore[import-untyped]

from agent.aggregate import aggregate
from agent.allocations import (
    NO_GPU_DEVICES,
    AllocationPolicy,
    AllocationQueryError,
    AllocationTracker,
)
from agent.attribution import attribute, shared_gpus
from agent.kube import ApiError, ForbiddenError, UnauthorizedError
from agent.limiter import (
    Decision,
    LimiterState,
    WritePolicy,
    decide,
    record_failure,
    record_success,
)
from agent.metrics import AgentMetrics
from agent.records import DeviceAllocations, NodeReading, ProcessOwner
from agent.sources import GpuSource
from agent.tainter import DeviceTainter
from gpu_contract.schema import DEFAULT_KEYS, Keys, NodeGpuState, encode

log = logging.getLogger(__name__)

DEFAULT_POLICY = WritePolicy()
# /healthz fails when no tick completed within this many sample intervals.
HEALTHY_TICK_INTERVALS = 3


class AnnotationWriter(Protocol):
    """What the daemon needs from `agent.kube.NodeAnnotator` (tests may pass a fake)."""

    def patch(self, annotations: Mapping[str, str]) -> None: ...


class ProcessOwnerSource(Protocol):
    """What the daemon needs from `agent.cgroups.OwnerResolver` (tests may fake it)."""

    def resolve(self, pids: Iterable[int], *, now_s: float) -> Mapping[int, ProcessOwner]: ...


class AllocationSource(Protocol):
    """What the daemon needs from `agent.podresources.PodResourcesClient` (tests may fake it)."""

    def query(self) -> DeviceAllocations:
        """Every allocatable and assigned device ID; raises `AllocationQueryError`."""
        ...

    def close(self) -> None: ...


@dataclass(frozen=True, slots=True)
class TickResult:
    """What one tick saw and did (for tests, `gpu-agent once` and debugging)."""

    reading: NodeReading
    state: NodeGpuState
    decision: Decision
    keys: Keys
    # The failed write's error; None when the write succeeded or none was attempted.
    write_error: ApiError | None = None
    # True only when a patch reached the API server and was accepted.
    written: bool = False

    @property
    def annotations(self) -> dict[str, str]:
        """`state` as annotations; encoded on demand, as most ticks write nothing."""
        return encode(self.state, self.keys)


def memory_total_mib(reading: NodeReading) -> int | None:
    """Total GPU memory of the readable GPUs: what the memory deadband is a fraction of."""
    totals = [g.memory_total_mib for g in reading.gpus if g.memory_total_mib is not None]
    return sum(totals) if totals else None


def _unavailable_reading(now: datetime, error: BaseException) -> NodeReading:
    return NodeReading(
        sampled_at=now,
        gpus=(),
        device_count=0,
        fatal=f"gpu source failed: {type(error).__name__}: {error}",
        error_kinds=(type(error).__name__,),
    )


class Agent:
    """One node's agent: owns the limiter state and runs ticks. Not thread-safe by design: the
    scheduler runs at most one tick at a time."""

    def __init__(
        self,
        *,
        source: GpuSource,
        writer: AnnotationWriter | None,
        policy: WritePolicy = DEFAULT_POLICY,
        keys: Keys = DEFAULT_KEYS,
        metrics: AgentMetrics | None = None,
        sample_interval_s: float = 5.0,
        start_s: float,
        jitter_s: float = 0.0,
        heartbeat_lead_s: float = 0.0,
        request_budget_s: float = 0.0,
        allocations: AllocationSource | None = None,
        allocation_policy: AllocationPolicy | None = None,
        tainter: DeviceTainter | None = None,
        process_owners: ProcessOwnerSource | None = None,
    ) -> None:
        self.source = source
        # None: no DRA device taints (turned off, or a dry run).
        self.tainter = tainter
        # None: per-process attribution is off; pods' figures on shared GPUs are unknown.
        self.process_owners = process_owners
        # None: allocations are not asked for and per-gpu-allocated is never published.
        self.allocations = allocations
        self.allocation_policy = (
            allocation_policy if allocation_policy is not None else AllocationPolicy()
        )
        self.allocation_tracker = AllocationTracker()
        self.writer = writer
        self.policy = policy
        self.keys = keys
        self.metrics = metrics if metrics is not None else AgentMetrics()
        self.sample_interval_s = sample_interval_s
        # The longest one API request may take (connect + read timeout): a tick waiting on a slow
        # API server is alive, so liveness allows for it on top of the sample intervals.
        self.request_budget_s = request_budget_s
        self.limiter = LimiterState.initial(
            now_s=start_s, jitter_s=jitter_s, heartbeat_lead_s=heartbeat_lead_s
        )
        self.started_s = start_s
        self.last_tick_s: float | None = None
        self.last_result: TickResult | None = None
        # The last write attempt's error class, for readiness: refused credentials make the pod
        # unready so a rollout with broken RBAC stops instead of spreading.
        self._last_write_error: ApiError | None = None
        if allocations is not None:
            self.metrics.process_attribution.set(1 if process_owners is not None else 0)
            if process_owners is None:
                # Said once: it holds for the agent's life, and the metric keeps saying it.
                log.info(
                    "per-process attribution off: pods sharing a GPU (time-slicing, MPS, MIG) "
                    "get '-' for their figures in pod-gpu-usage; pods holding a GPU alone get "
                    "the GPU's own (--process-attribution, the chart's "
                    "agent.podUsage.processAttribution)"
                )

    def tick(self, *, now_s: float, wall_now: datetime) -> TickResult:
        """One sample, one decision, at most one write. Never raises for GPU or API faults."""
        started = time.perf_counter()
        try:
            result = self._tick(now_s=now_s, wall_now=wall_now)
            if self.tainter is not None:
                try:
                    self.tainter.tick(result.reading, now_s=now_s)
                except Exception:
                    # The taint side must not stop the annotations; its faults are its own.
                    log.exception("DRA device taints raised; the annotations are unaffected")
        finally:
            self.metrics.tick_duration.observe(time.perf_counter() - started)
        self.last_tick_s = now_s
        self.last_result = result
        return result

    def _tick(self, *, now_s: float, wall_now: datetime) -> TickResult:
        read_started = time.perf_counter()
        try:
            reading = self.source.read(wall_now)
        except Exception as exc:
            # The source promises not to raise; if it does anyway, publish `unavailable`
            # rather than stop sampling.
            log.exception("gpu source raised; reporting the node unavailable")
            reading = _unavailable_reading(wall_now, exc)
        self.metrics.source_read_duration.observe(time.perf_counter() - read_started)
        self.metrics.samples.inc()
        self.metrics.nvml_errors_seen(reading.error_kinds)

        reading = self._with_allocations(reading, now_s)
        reading = self._with_process_owners(reading, now_s)
        state = aggregate(reading, None if self.tainter is None else self.tainter.device_names())
        self._account_attribution(reading)
        self.metrics.health_observed(state.health)
        self._account_allocations(reading, state, now_s)
        decision = decide(
            self.limiter,
            state,
            now_s=now_s,
            memory_total_mib=memory_total_mib(reading),
            policy=self.policy,
        )
        if not decision.write:
            self.metrics.write_suppressed(decision.reason)
            return TickResult(reading, state, decision, self.keys)
        if self.writer is None:
            # Dry run: behave as if the write succeeded, so the limiter's rhythm is the real one.
            self.limiter = record_success(self.limiter, written=state, now_s=now_s)
            return TickResult(reading, state, decision, self.keys)

        try:
            try:
                self.writer.patch(encode(state, self.keys))
            except ApiError:
                raise
            except Exception as unexpected:
                # A writer bug is still a failed attempt: recording it keeps the minimum interval
                # and the backoff, where letting it escape would retry on every tick.
                log.exception("write raised an unexpected error; treating it as a failed write")
                raise ApiError(
                    f"unexpected {type(unexpected).__name__} while writing: {unexpected}"
                ) from unexpected
        except ApiError as error:
            self.limiter = record_failure(
                self.limiter, now_s=now_s, policy=self.policy, retry_after_s=error.retry_after_s
            )
            self._last_write_error = error
            self.metrics.write_failed(
                error.code, consecutive_failures=self.limiter.consecutive_failures
            )
            wait_s = (self.limiter.retry_at_s or now_s) - now_s
            log.warning(
                "write failed (%s attempt in a row), next attempt in %.0f s: %s",
                _ordinal(self.limiter.consecutive_failures),
                wait_s,
                error,
            )
            return TickResult(reading, state, decision, self.keys, error)
        recovered = self.limiter.consecutive_failures > 0
        self.limiter = record_success(self.limiter, written=state, now_s=now_s)
        self._last_write_error = None
        self.metrics.write_succeeded(decision.reason, now_s=now_s)
        if recovered:
            log.info("write succeeded again after API errors")
        log.debug("wrote annotations (%s%s)", decision.reason.value, _changed(decision))
        return TickResult(reading, state, decision, self.keys, written=True)

    def _with_allocations(self, reading: NodeReading, now_s: float) -> NodeReading:
        """The reading with the kubelet's allocations, asked for when the schedule says so."""
        if self.allocations is None:
            return reading
        policy = self.allocation_policy
        tracker = self.allocation_tracker
        if tracker.due(now_s):
            try:
                found = self.allocations.query()
            except AllocationQueryError as error:
                tracker = tracker.failed(error.reason, now_s=now_s, policy=policy)
                self.metrics.pod_resources_requests.labels(result=error.reason).inc()
                if tracker.log_due(error.reason, now_s=now_s, policy=policy):
                    log.warning(
                        "kubelet pod-resources unreadable (%s), next try in %.0f s: %s",
                        error.reason,
                        tracker.next_attempt_s - now_s,
                        error,
                    )
                    tracker = tracker.logged(error.reason, now_s=now_s)
            except Exception:
                # A client bug must not stop sampling; it counts as a failed query.
                log.exception("pod-resources query raised; treating it as a failed query")
                tracker = tracker.failed("error", now_s=now_s, policy=policy)
                self.metrics.pod_resources_requests.labels(result="error").inc()
            else:
                tracker = tracker.succeeded(found, now_s=now_s)
                self.metrics.pod_resources_requests.labels(result="ok").inc()
        self.allocation_tracker = tracker
        current = tracker.current(now_s, policy)
        return reading if current is None else replace(reading, allocations=current)

    def _with_process_owners(self, reading: NodeReading, now_s: float) -> NodeReading:
        """The reading with the owners of the processes on GPUs several pods share."""
        if self.process_owners is None or reading.allocations is None:
            return reading
        shared = shared_gpus(reading.gpus, reading.allocations)
        pids = {
            pid
            for gpu in reading.gpus
            if gpu.index in shared and gpu.processes is not None
            for part in (gpu.processes.memory_used_mib, gpu.processes.sm_busy)
            for pid, _ in part or ()
        }
        try:
            owners = self.process_owners.resolve(pids, now_s=now_s)
        except Exception:
            # A resolver bug must not stop sampling: the shared GPUs' pods are unknown this tick.
            # Unknown, not zero: with no owner known, every pod's share would read as 0.
            log.exception("resolving GPU processes to pods raised; their figures are unknown")
            return reading
        return replace(reading, process_owners=owners)

    def _account_attribution(self, reading: NodeReading) -> None:
        if reading.allocations is None:
            return
        found = attribute(reading)
        for outcome, count in found.outcomes.items():
            self.metrics.pod_attribution.labels(outcome=outcome).inc(count)
        for owner, count in found.owners.items():
            self.metrics.gpu_processes.labels(owner=owner).inc(count)

    def _account_allocations(self, reading: NodeReading, state: NodeGpuState, now_s: float) -> None:
        """The metric and the (rate-limited) log line that say why per-gpu-allocated is absent."""
        if self.allocations is None:
            return
        published = any(g.allocated is not None for g in state.gpus)
        self.metrics.allocations_published.set(1 if published else 0)
        tracker = self.allocation_tracker
        policy = self.allocation_policy
        if published:
            if tracker.logged_reason is not None:
                log.info("per-gpu-allocated published again")
                self.allocation_tracker = tracker.logged(None, now_s=now_s)
            return
        if not reading.gpus:
            return  # no GPU read this tick: nothing to allocate, nothing to explain
        reason = tracker.failing_reason or NO_GPU_DEVICES
        self.metrics.allocations_unknown.labels(reason=reason).inc()
        if reason == NO_GPU_DEVICES and tracker.log_due(reason, now_s=now_s, policy=policy):
            log.warning(
                "per-gpu-allocated left out: no device the kubelet hands out is a GPU of this "
                "node by UUID (no NVIDIA device plugin, GPUs given out by DRA, or a device plugin "
                "naming devices by index instead of UUID)"
            )
            self.allocation_tracker = tracker.logged(reason, now_s=now_s)

    def healthz(self, now_s: float) -> tuple[bool, str]:
        """Alive while a tick completed within a few sample intervals (or since start)."""
        reference = self.last_tick_s if self.last_tick_s is not None else self.started_s
        age_s = now_s - reference
        limit_s = HEALTHY_TICK_INTERVALS * self.sample_interval_s + self.request_budget_s
        if age_s <= limit_s:
            return True, f"last tick {age_s:.1f}s ago"
        return False, f"no tick for {age_s:.1f}s (limit {limit_s:g}s)"

    def readyz(self) -> tuple[bool, str]:
        """Ready after the first tick, unless the API refuses the agent's credentials."""
        if self.last_tick_s is None:
            return False, "no sample taken yet"
        error = self._last_write_error
        if isinstance(error, UnauthorizedError | ForbiddenError):
            return False, f"API refuses the agent's writes ({error.code})"
        return True, "sampling"


def _ordinal(n: int) -> str:
    return f"{n}{'th' if 10 <= n % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"


def _changed(decision: Decision) -> str:
    return f": {', '.join(decision.changed)}" if decision.changed else ""


def start_jitter_s(*, seed: int | None, max_s: float) -> float:
    """A random start delay in [0, max_s); seeded runs are reproducible."""
    rng = random.Random(seed) if seed is not None else random.SystemRandom()
    return rng.uniform(0.0, max_s)


def random_fraction(*, seed: int | None) -> float:
    """A uniform draw in [0, 1), e.g. for the heartbeat lead; seeded runs are reproducible."""
    # Offset the seed so the draw is independent of the start jitter's.
    rng = random.Random(seed + 1) if seed is not None else random.SystemRandom()
    return rng.random()


class TickLoop:
    """Runs `agent.tick` every `interval_s` in a background scheduler; `stop()` awaits the tick."""

    def __init__(
        self,
        agent: Agent,
        *,
        interval_s: float,
        monotonic: Callable[[], float] = time.monotonic,
        wall: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self._agent = agent
        self._monotonic = monotonic
        self._wall = wall
        self._scheduler = BackgroundScheduler(timezone=UTC)
        self._scheduler.add_job(
            self._run_tick,
            "interval",
            seconds=interval_s,
            # First tick right away: sampling is not jittered, only writing is.
            next_run_time=datetime.now(UTC),
            max_instances=1,
            coalesce=True,
            misfire_grace_time=None,
            id="tick",
        )

    def _run_tick(self) -> None:
        try:
            self._agent.tick(now_s=self._monotonic(), wall_now=self._wall())
        except Exception:
            # A bug must not end the loop; /healthz will show whether ticks still complete.
            log.exception("tick failed")

    def start(self) -> None:
        self._scheduler.start()

    def stop(self) -> None:
        # wait=True: a tick in progress finishes before the source is closed under it.
        self._scheduler.shutdown(wait=True)


@contextmanager
def stop_on_signals(stop: threading.Event) -> Iterator[None]:
    """Within the block, SIGTERM and SIGINT set `stop` instead of killing the process.

    Entered before the slow parts of start-up (reading the Node through a possibly hung API), so
    a pod stopped while starting still exits 0 rather than dying by the signal.
    """

    def handle(signum: int, _frame: FrameType | None) -> None:
        log.info("received %s; finishing the current tick", signal.Signals(signum).name)
        stop.set()

    previous = {sig: signal.signal(sig, handle) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def run_until_signalled(
    loop: TickLoop, *, on_stop: Callable[[], None], stop_event: threading.Event | None = None
) -> None:
    """Start `loop`, block until SIGTERM/SIGINT (or `stop_event`), then stop in order: the tick
    in progress finishes, the scheduler stops, then `on_stop` (which closes the source)."""
    stop = stop_event if stop_event is not None else threading.Event()
    with stop_on_signals(stop):
        started = False
        try:
            # A signal that came during start-up: no tick at all, straight to the clean stop.
            if not stop.is_set():
                loop.start()
                started = True
            while not stop.wait(timeout=1.0):
                pass
        finally:
            if started:
                loop.stop()
            on_stop()
