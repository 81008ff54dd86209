"""The tick and the loop, driven with injected times and in-memory fakes (no HTTP here)."""

from __future__ import annotations

import logging
import os
import signal
import threading
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from itertools import pairwise
from typing import Any

import pytest

from agent.allocations import AllocationPolicy, AllocationQueryError
from agent.cgroups import OwnerResolver, read_cgroup_file
from agent.daemon import Agent, TickLoop, memory_total_mib, run_until_signalled, start_jitter_s
from agent.http import HealthServer
from agent.kube import (
    ApiError,
    ForbiddenError,
    NotFoundError,
    ServerError,
    TooManyRequestsError,
    TransportError,
    UnauthorizedError,
)
from agent.limiter import Reason, WritePolicy
from agent.metrics import AgentMetrics
from agent.nvml import NvmlSource
from agent.records import DeviceAllocations, GpuReading, NodeReading, PodDevices
from agent.sources import open_source
from gpu_contract.schema import DEFAULT_KEYS, Field, Health
from tests.agent.fake_nvml import FakeNvml, FakeProcess, a100

T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


def reading(
    now: datetime, *, utilization: float = 0.5, temperature_c: int = 60, lost: bool = False
) -> NodeReading:
    gpus = tuple(
        GpuReading(
            uuid=f"GPU-{i}",
            index=i,
            name="NVIDIA A100-SXM4-80GB",
            utilization=utilization,
            memory_total_mib=81920,
            memory_free_mib=40000,
            temperature_c=temperature_c,
        )
        for i in range(2 if not lost else 1)
    )
    return NodeReading(
        sampled_at=now,
        gpus=gpus,
        device_count=2,
        lost=("gpu 1: lost",) if lost else (),
        error_kinds=("GpuIsLost",) if lost else (),
    )


@dataclass
class FakeSource:
    """A source whose next readings the test sets; records reads and close."""

    utilization: float = 0.5
    temperature_c: int = 60
    lost: bool = False
    fail: Exception | None = None
    reads: list[datetime] = field(default_factory=list)
    closed: int = 0

    def read(self, now: datetime) -> NodeReading:
        self.reads.append(now)
        if self.fail is not None:
            raise self.fail
        return reading(
            now, utilization=self.utilization, temperature_c=self.temperature_c, lost=self.lost
        )

    def close(self) -> None:
        self.closed += 1


@dataclass
class FakeWriter:
    """Records patches; raises the queued errors first."""

    errors: list[ApiError] = field(default_factory=list)
    patches: list[dict[str, str]] = field(default_factory=list)
    attempts: int = 0

    def patch(self, annotations: Mapping[str, str]) -> None:
        self.attempts += 1
        if self.errors:
            raise self.errors.pop(0)
        self.patches.append(dict(annotations))


def make_agent(
    source: object, writer: FakeWriter | None, *, jitter_s: float = 0.0
) -> tuple[Agent, AgentMetrics, list[float]]:
    clock = [0.0]
    metrics = AgentMetrics(monotonic=lambda: clock[0])
    agent = Agent(
        source=source,  # type: ignore[arg-type]
        writer=writer,
        policy=WritePolicy(),
        metrics=metrics,
        sample_interval_s=5.0,
        start_s=0.0,
        jitter_s=jitter_s,
    )
    return agent, metrics, clock


def tick_at(agent: Agent, clock: list[float], now_s: float):  # type: ignore[no-untyped-def]
    clock[0] = now_s
    return agent.tick(now_s=now_s, wall_now=T0 + timedelta(seconds=now_s))


def test_tick_writes_first_then_suppresses_and_counts() -> None:
    source, writer = FakeSource(), FakeWriter()
    agent, metrics, clock = make_agent(source, writer, jitter_s=4.0)

    assert tick_at(agent, clock, 0.0).decision.reason is Reason.JITTER_PENDING
    first = tick_at(agent, clock, 5.0)
    assert first.written
    assert first.decision.reason is Reason.FIRST_WRITE
    assert writer.patches[0][DEFAULT_KEYS[Field.UPDATED_AT]] == "2026-11-30T12:00:05Z"
    assert tick_at(agent, clock, 10.0).decision.reason is Reason.BELOW_DEADBAND
    source.utilization = 0.9
    assert tick_at(agent, clock, 12.0).decision.reason is Reason.WITHIN_MIN_INTERVAL
    assert tick_at(agent, clock, 15.0).decision.reason is Reason.DEADBAND_EXCEEDED

    assert metrics.value("gpu_agent_samples_total") == 5
    assert metrics.value("gpu_agent_writes_total", {"reason": "first-write"}) == 1
    assert metrics.value("gpu_agent_writes_total", {"reason": "deadband-exceeded"}) == 1
    for reason, count in [("jitter-pending", 1), ("below-deadband", 1), ("within-min-interval", 1)]:
        assert metrics.value("gpu_agent_writes_suppressed_total", {"reason": reason}) == count
    clock[0] = 22.5
    assert metrics.value("gpu_agent_last_write_age_seconds") == 7.5
    assert metrics.value("gpu_agent_tick_duration_seconds_count") == 5


def test_metric_names_follow_prometheus_conventions() -> None:
    families = {family.name: family for family in AgentMetrics().registry.collect()}
    assert set(families) == {
        "gpu_agent_samples",
        "gpu_agent_writes",
        "gpu_agent_writes_suppressed",
        "gpu_agent_api_errors",
        "gpu_agent_nvml_errors",
        "gpu_agent_last_write_age_seconds",
        "gpu_agent_tick_duration_seconds",
        "gpu_agent_source_read_duration_seconds",
        "gpu_agent_write_consecutive_failures",
        "gpu_agent_health",
        "gpu_agent_pod_resources_requests",
        "gpu_agent_allocations_unknown",
        "gpu_agent_allocations_published",
        "gpu_agent_dra_state",
        "gpu_agent_dra_taint_writes",
        "gpu_agent_dra_taint_writes_suppressed",
        "gpu_agent_dra_api_errors",
        "gpu_agent_dra_tainted_gpus",
        "gpu_agent_pod_attribution",
        "gpu_agent_gpu_processes",
        "gpu_agent_process_attribution",
    }
    for name, family in families.items():
        samples = {sample.name for sample in family.samples}
        if family.type == "counter":
            # Exposed as `_total` (plus `_created`), never a bare counter name.
            assert samples <= {f"{name}_total", f"{name}_created"}, name
        measured = name.removeprefix("gpu_agent_")
        if family.type == "histogram" or "age" in measured or "duration" in measured:
            assert name.endswith("_seconds"), name
    assert "gpu_agent_samples_total" in {s.name for s in families["gpu_agent_samples"].samples}
    assert families["gpu_agent_writes"].samples[0].labels.keys() == {"reason"}
    assert {s.labels["reason"] for s in families["gpu_agent_writes_suppressed"].samples} >= {
        "within-min-interval",
        "below-deadband",
        "backing-off",
        "jitter-pending",
    }


def test_write_age_is_infinite_before_the_first_write() -> None:
    _, metrics, _ = make_agent(FakeSource(), FakeWriter())
    assert metrics.value("gpu_agent_last_write_age_seconds") == float("inf")


def test_lost_gpu_degrades_and_counts_nvml_error_kind() -> None:
    source, writer = FakeSource(), FakeWriter()
    agent, metrics, clock = make_agent(source, writer)
    tick_at(agent, clock, 0.0)
    source.lost = True
    result = tick_at(agent, clock, 10.0)
    assert result.decision.reason is Reason.DISCRETE_CHANGE
    assert writer.patches[-1][DEFAULT_KEYS[Field.HEALTH]] == "degraded"
    assert writer.patches[-1][DEFAULT_KEYS[Field.HEALTH_DETAIL]] == "gpu 1: lost"
    assert metrics.value("gpu_agent_nvml_errors_total", {"kind": "GpuIsLost"}) == 1


def _health_gauge(metrics: AgentMetrics) -> dict[str, float]:
    return {h: metrics.value("gpu_agent_health", {"health": h}) for h in Health}


def test_health_gauge_follows_every_sample() -> None:
    source = FakeSource()
    agent, metrics, clock = make_agent(source, FakeWriter())
    # Every value is exported before the first sample, so an alert on `degraded` has a series.
    assert _health_gauge(metrics) == {"ok": 0, "degraded": 0, "unavailable": 0}
    tick_at(agent, clock, 0.0)
    assert _health_gauge(metrics) == {"ok": 1, "degraded": 0, "unavailable": 0}
    source.lost = True
    tick_at(agent, clock, 5.0)  # within the minimum interval: the gauge moves without a write
    assert _health_gauge(metrics) == {"ok": 0, "degraded": 1, "unavailable": 0}
    source.fail = RuntimeError("driver went away")
    tick_at(agent, clock, 10.0)
    assert _health_gauge(metrics) == {"ok": 0, "degraded": 0, "unavailable": 1}


def test_source_that_raises_is_published_unavailable_not_fatal() -> None:
    source, writer = FakeSource(fail=RuntimeError("driver went away")), FakeWriter()
    agent, metrics, clock = make_agent(source, writer)
    result = tick_at(agent, clock, 0.0)
    assert result.written
    assert writer.patches[0][DEFAULT_KEYS[Field.HEALTH]] == "unavailable"
    assert "driver went away" in writer.patches[0][DEFAULT_KEYS[Field.HEALTH_DETAIL]]
    assert metrics.value("gpu_agent_nvml_errors_total", {"kind": "RuntimeError"}) == 1


@pytest.mark.parametrize(
    ("error", "code", "retry_at_s"),
    [
        pytest.param(UnauthorizedError("401", status=401), "401", 10.0, id="401"),
        pytest.param(ForbiddenError("403", status=403), "403", 10.0, id="403"),
        pytest.param(NotFoundError("404", status=404), "404", 10.0, id="404"),
        pytest.param(TooManyRequestsError("429", retry_after_s=42.0), "429", 42.0, id="429"),
        pytest.param(ServerError("503", status=503), "503", 10.0, id="503"),
        pytest.param(
            ServerError("503", status=503, retry_after_s=30.0), "503", 30.0, id="503-retry-after"
        ),
        pytest.param(TransportError("reset"), "transport", 10.0, id="transport"),
    ],
)
def test_api_error_backs_off_and_is_counted(error: ApiError, code: str, retry_at_s: float) -> None:
    writer = FakeWriter(errors=[error])
    agent, metrics, clock = make_agent(FakeSource(), writer)
    failed = tick_at(agent, clock, 0.0)
    assert failed.write_error is error
    assert not failed.written
    assert metrics.value("gpu_agent_api_errors_total", {"code": code}) == 1
    assert metrics.value("gpu_agent_write_consecutive_failures") == 1
    assert tick_at(agent, clock, retry_at_s - 0.1).decision.reason is Reason.BACKING_OFF
    retried = tick_at(agent, clock, retry_at_s)
    assert retried.written
    assert retried.decision.reason is Reason.FIRST_WRITE
    assert writer.attempts == 2


def test_a_writer_bug_counts_as_a_failed_write_not_a_storm() -> None:
    class BrokenWriter(FakeWriter):
        def patch(self, annotations: Mapping[str, str]) -> None:
            self.attempts += 1
            raise KeyError("bug in the writer")

    writer = BrokenWriter()
    agent, metrics, clock = make_agent(FakeSource(), writer)
    failed = tick_at(agent, clock, 0.0)
    assert not failed.written
    assert isinstance(failed.write_error, ApiError)
    assert "KeyError" in str(failed.write_error)
    assert metrics.value("gpu_agent_api_errors_total", {"code": "error"}) == 1
    # The next ticks wait out the backoff instead of trying again every sample interval.
    for now_s in (5.0, 9.9):
        assert tick_at(agent, clock, now_s).decision.reason is Reason.BACKING_OFF
    assert writer.attempts == 1
    tick_at(agent, clock, 10.0)
    assert writer.attempts == 2
    assert agent.limiter.consecutive_failures == 2


@pytest.mark.parametrize(
    ("error", "ready"),
    [
        pytest.param(UnauthorizedError("401", status=401), False, id="401-unready"),
        pytest.param(ForbiddenError("403", status=403), False, id="403-unready"),
        pytest.param(ServerError("500", status=500), True, id="5xx-stays-ready"),
        pytest.param(TransportError("timeout"), True, id="timeout-stays-ready"),
    ],
)
def test_readiness_after_api_errors(error: ApiError, ready: bool) -> None:
    agent, _, clock = make_agent(FakeSource(), FakeWriter(errors=[error]))
    assert agent.readyz()[0] is False  # no sample yet
    tick_at(agent, clock, 0.0)
    assert agent.readyz()[0] is ready
    tick_at(agent, clock, 10.0)  # the retry succeeds
    assert agent.readyz()[0] is True


def test_liveness_follows_completed_ticks() -> None:
    agent, _, clock = make_agent(FakeSource(), FakeWriter())
    assert agent.healthz(15.0)[0] is True  # start-up grace: three intervals
    assert agent.healthz(15.1)[0] is False
    tick_at(agent, clock, 20.0)
    assert agent.healthz(35.0)[0] is True
    ok, detail = agent.healthz(35.5)
    assert not ok
    assert "no tick for 15.5s" in detail


def test_dry_run_agent_keeps_the_real_rhythm_without_writing() -> None:
    agent, metrics, clock = make_agent(FakeSource(), None)
    assert tick_at(agent, clock, 0.0).decision.reason is Reason.FIRST_WRITE
    assert tick_at(agent, clock, 5.0).decision.reason is Reason.BELOW_DEADBAND
    assert metrics.value("gpu_agent_writes_total", {"reason": "first-write"}) == 0


def test_memory_total_ignores_unreadable_gpus() -> None:
    lost = reading(T0, lost=True)
    assert memory_total_mib(lost) == 81920
    assert memory_total_mib(NodeReading(sampled_at=T0, gpus=(), device_count=0)) is None


def test_start_jitter_is_seeded_and_bounded() -> None:
    assert start_jitter_s(seed=3, max_s=10.0) == start_jitter_s(seed=3, max_s=10.0)
    assert all(0.0 <= start_jitter_s(seed=s, max_s=10.0) < 10.0 for s in range(50))


# --- simulated hours with the real simulated source -------------------------------------------


def simulated_hour(writer: FakeWriter, *, jitter_s: float = 3.0) -> tuple[Agent, list[float]]:
    source = open_source("simulated", simulated_gpus=8, seed=7, start=T0)
    agent, _, clock = make_agent(source, writer, jitter_s=jitter_s)
    attempts: list[float] = []
    for step in range(int(3600 / 5)):
        before = writer.attempts
        tick_at(agent, clock, step * 5.0)
        if writer.attempts > before:
            attempts.append(step * 5.0)
    return agent, attempts


def test_simulated_hour_respects_every_rate_limit() -> None:
    writer = FakeWriter()
    _, attempts = simulated_hour(writer)
    gaps = [b - a for a, b in pairwise(attempts)]
    assert attempts[0] == 5.0  # the first tick after the 3 s jitter
    assert min(gaps) >= 10.0
    assert max(gaps) <= 60.0 + 5.0
    # The trace is busy, yet deadbands keep writes well below one per tick.
    assert 60 <= len(attempts) < 720 / 2


def test_simulated_hour_of_api_outage_does_not_storm() -> None:
    writer = FakeWriter(errors=[TransportError("connection reset")] * 10_000)
    agent, attempts = simulated_hour(writer)
    gaps = [b - a for a, b in pairwise(attempts)]
    assert min(gaps) >= 10.0
    # 10, 20, 40, 80 s, then one attempt per 120 s cap: about 33 attempts in the hour.
    assert len(attempts) <= 36
    assert gaps[-5:] == [120.0] * 5
    assert agent.limiter.last_written is None


# --- the loop ------------------------------------------------------------------------------


def test_loop_finishes_the_tick_then_closes_the_source() -> None:
    stop = threading.Event()
    events: list[str] = []

    class Recording(FakeSource):
        def read(self, now: datetime) -> NodeReading:
            events.append("read")
            if len(self.reads) >= 1:
                stop.set()  # a "signal" arrives while this tick runs
            return super().read(now)

        def close(self) -> None:
            events.append("close")
            super().close()

    source = Recording()
    agent, _, _ = make_agent(source, FakeWriter())
    loop = TickLoop(agent, interval_s=0.01)
    run_until_signalled(loop, on_stop=source.close, stop_event=stop)
    assert events[-1] == "close"
    assert events.count("close") == 1
    assert len(source.reads) >= 2
    assert agent.last_result is not None


def test_sigterm_finishes_the_tick_then_shuts_nvml_down(monkeypatch: pytest.MonkeyPatch) -> None:
    """A real SIGTERM to this process, while a tick reads NVML (real pynvml, fake library)."""
    order: list[str] = []

    class OrderedNvml(FakeNvml):
        def nvmlDeviceGetCount_v2(self, count_ref: Any) -> int:  # noqa: N802
            order.append("count")
            if order.count("count") == 2:
                # The kubelet stops the pod in the middle of the second tick.
                os.kill(os.getpid(), signal.SIGTERM)
            return super().nvmlDeviceGetCount_v2(count_ref)

        def nvmlDeviceGetTemperatureV(self, handle: Any, temp_ref: Any) -> int:  # noqa: N802
            order.append("temperature")  # read after the count: the tick went on to the end
            return super().nvmlDeviceGetTemperatureV(handle, temp_ref)

        def nvmlShutdown(self) -> int:  # noqa: N802
            order.append("shutdown")
            return super().nvmlShutdown()

    fake = OrderedNvml([a100(0)]).install(monkeypatch)
    source = NvmlSource.open()
    writer = FakeWriter()
    agent, _, _ = make_agent(source, writer)
    previous = signal.getsignal(signal.SIGTERM)
    run_until_signalled(TickLoop(agent, interval_s=0.5), on_stop=source.close)
    assert signal.getsignal(signal.SIGTERM) is previous
    assert order == ["count", "temperature", "count", "temperature", "shutdown"]
    assert fake.initialized == 0
    assert agent.last_result is not None
    assert agent.last_result.reading.gpus[0].temperature_c == 40


def test_health_server_serves_metrics_and_probes() -> None:
    agent, metrics, clock = make_agent(FakeSource(), FakeWriter())
    with HealthServer(
        registry=metrics.registry,
        healthz=lambda: agent.healthz(clock[0]),
        readyz=agent.readyz,
        host="127.0.0.1",
        port=0,
    ) as server:
        base = f"http://127.0.0.1:{server.port}"

        def get(path: str) -> tuple[int, str]:
            try:
                with urllib.request.urlopen(base + path, timeout=5) as response:
                    return response.status, response.read().decode()
            except urllib.error.HTTPError as error:
                return error.code, error.read().decode()

        assert get("/readyz") == (503, "not ok: no sample taken yet\n")
        tick_at(agent, clock, 0.0)
        assert get("/readyz") == (200, "ok: sampling\n")
        assert get("/healthz")[0] == 200
        clock[0] = 100.0
        assert get("/healthz")[0] == 503
        status, body = get("/metrics")
        assert status == 200
        assert "gpu_agent_samples_total 1.0" in body
        assert 'gpu_agent_writes_total{reason="first-write"} 1.0' in body
        assert "gpu_agent_last_write_age_seconds 100.0" in body
        assert get("/nope")[0] == 404


def test_liveness_allows_one_slow_api_request() -> None:
    agent = Agent(
        source=FakeSource(),  # type: ignore[arg-type]
        writer=FakeWriter(),
        sample_interval_s=5.0,
        start_s=0.0,
        request_budget_s=8.0,
    )
    assert agent.healthz(23.0)[0] is True
    assert agent.healthz(23.1)[0] is False


def test_only_the_newest_state_is_sent_after_a_failure() -> None:
    source = FakeSource(utilization=0.2)
    writer = FakeWriter(errors=[ServerError("503", status=503)])
    agent, _, clock = make_agent(source, writer)
    assert tick_at(agent, clock, 0.0).write_error is not None
    source.utilization = 0.3
    tick_at(agent, clock, 5.0)  # backing off
    source.utilization = 0.9
    assert tick_at(agent, clock, 10.0).written
    assert len(writer.patches) == 1
    sent = writer.patches[0]
    assert sent[DEFAULT_KEYS[Field.UTILIZATION]] == "0.90"
    assert sent[DEFAULT_KEYS[Field.UPDATED_AT]] == "2026-11-30T12:00:10Z"


# ------------------------------------------------------------------ allocations in the tick


@dataclass
class FakeAllocations:
    """The kubelet seam: answers with `answer` or raises the queued errors first."""

    answer: DeviceAllocations = field(
        default_factory=lambda: DeviceAllocations(
            frozenset({"GPU-0", "GPU-1"}), frozenset({"GPU-1"})
        )
    )
    errors: list[Exception] = field(default_factory=list)
    queries: list[float] = field(default_factory=list)
    clock: list[float] = field(default_factory=lambda: [0.0])

    def query(self) -> DeviceAllocations:
        self.queries.append(self.clock[0])
        if self.errors:
            raise self.errors.pop(0)
        return self.answer

    def close(self) -> None:
        return None


ALLOCATED_KEY = DEFAULT_KEYS[Field.PER_GPU_ALLOCATED]


def run_ticks(
    agent: Agent, kubelet: FakeAllocations, until_s: float, step_s: float = 5.0
) -> list[dict[str, str]]:
    """Tick every `step_s` up to `until_s`; each tick's annotations."""
    seen = []
    now_s = 0.0
    while now_s <= until_s:
        kubelet.clock[0] = now_s
        seen.append(agent.tick(now_s=now_s, wall_now=T0 + timedelta(seconds=now_s)).annotations)
        now_s += step_s
    return seen


def allocation_agent(kubelet: FakeAllocations) -> tuple[Agent, AgentMetrics]:
    metrics = AgentMetrics()
    agent = Agent(
        source=FakeSource(),  # type: ignore[arg-type]
        writer=FakeWriter(),
        metrics=metrics,
        start_s=0.0,
        allocations=kubelet,
        allocation_policy=AllocationPolicy(retry_base_s=10.0, retry_max_s=40.0, keep_last_s=60.0),
    )
    return agent, metrics


def test_allocations_are_published_from_the_kubelet() -> None:
    kubelet = FakeAllocations()
    agent, metrics = allocation_agent(kubelet)
    (annotations,) = run_ticks(agent, kubelet, until_s=0.0)
    assert annotations[ALLOCATED_KEY] == "0,1"
    assert metrics.value("gpu_agent_pod_resources_requests_total", {"result": "ok"}) == 1
    assert metrics.value("gpu_agent_allocations_published") == 1


def test_a_failing_kubelet_is_retried_on_back_off_and_then_left_out(
    caplog: pytest.LogCaptureFixture,
) -> None:
    kubelet = FakeAllocations(
        errors=[AllocationQueryError("refused", "nothing answers") for _ in range(4)]
    )
    agent, metrics = allocation_agent(kubelet)
    kubelet.errors.insert(0, RuntimeError("not yet"))  # a client bug counts as a failed query
    seen = run_ticks(agent, kubelet, until_s=100.0)
    # Bug at 0 (10 s), refused at 10 (20 s), 30 (40 s), 70 (40 s, capped): not every tick.
    assert kubelet.queries == [0.0, 10.0, 30.0, 70.0]
    assert all(ALLOCATED_KEY not in a for a in seen)
    assert metrics.value("gpu_agent_pod_resources_requests_total", {"result": "refused"}) == 3
    assert metrics.value("gpu_agent_pod_resources_requests_total", {"result": "error"}) == 1
    # Every tick without the key is counted under the reason of the last failed query.
    assert metrics.value("gpu_agent_allocations_unknown_total", {"reason": "error"}) == 2
    assert metrics.value("gpu_agent_allocations_unknown_total", {"reason": "refused"}) == 19
    assert metrics.value("gpu_agent_allocations_published") == 0
    # One line per reason, not one per failed query.
    warnings = [r for r in caplog.records if "pod-resources unreadable" in r.getMessage()]
    assert [w.getMessage().split("(")[1].split(")")[0] for w in warnings] == ["refused"]


def test_a_short_kubelet_outage_keeps_the_last_allocations() -> None:
    kubelet = FakeAllocations()
    agent, _ = allocation_agent(kubelet)
    run_ticks(agent, kubelet, until_s=0.0)
    kubelet.errors = [AllocationQueryError("refused", "restarting")]
    kubelet.clock[0] = 5.0
    during = agent.tick(now_s=5.0, wall_now=T0 + timedelta(seconds=5)).annotations
    assert during[ALLOCATED_KEY] == "0,1"  # within the grace: no flap, no extra writes
    kubelet.clock[0] = 15.0
    after = agent.tick(now_s=15.0, wall_now=T0 + timedelta(seconds=15)).annotations
    assert after[ALLOCATED_KEY] == "0,1"
    assert kubelet.queries == [0.0, 5.0, 15.0]


def test_devices_that_are_no_gpu_here_say_so(caplog: pytest.LogCaptureFixture) -> None:
    kubelet = FakeAllocations(answer=DeviceAllocations(frozenset({"0", "1"}), frozenset()))
    agent, metrics = allocation_agent(kubelet)
    seen = run_ticks(agent, kubelet, until_s=10.0)
    assert all(ALLOCATED_KEY not in a for a in seen)
    assert metrics.value("gpu_agent_allocations_unknown_total", {"reason": "no-gpu-devices"}) == 3
    assert sum("naming devices by index" in r.getMessage() for r in caplog.records) == 1


def test_without_a_kubelet_source_nothing_is_asked_or_counted() -> None:
    agent, metrics, _ = make_agent(FakeSource(), FakeWriter())
    result = agent.tick(now_s=0.0, wall_now=T0)
    assert ALLOCATED_KEY not in result.annotations
    assert metrics.value("gpu_agent_allocations_unknown_total", {"reason": "no-gpu-devices"}) == 0


# ------------------------------------------------- who uses each GPU (pod-gpu-usage) in the tick

POD_USAGE_KEY = DEFAULT_KEYS[Field.POD_GPU_USAGE]
UID_A = "7e1c3a52-9b0d-4f6e-8a21-3c5d7e9f1b24"
UID_B = "0f0f0f0f-0000-4000-8000-000000000000"


def _pod_usage_agent(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any, *, per_process: bool
) -> tuple[Agent, AgentMetrics, FakeNvml]:
    """Real pynvml over a fake NVML: GPU 0 time-sliced by pods a and b, GPU 1 held by c alone."""
    fake = FakeNvml([a100(0), a100(1)]).install(monkeypatch)
    gpu0, gpu1 = fake.gpus
    gpu0.add_samples((1_000, 80))
    gpu0.memory_used_mib = 30_000
    gpu0.processes = [FakeProcess(10, 20_000), FakeProcess(20, 9_000), FakeProcess(30, 512)]
    gpu0.process_samples = [(10, 1_000, 60), (20, 1_000, 20), (10, 1_500, 60), (30, 1_500, 20)]
    gpu1.add_samples((1_000, 50))
    gpu1.memory_used_mib = 40_000
    for pid, text in {
        10: f"0::/kubepods.slice/kubepods-pod{UID_A.replace('-', '_')}.slice/crio-1.scope",
        20: f"0::/kubepods/burstable/pod{UID_B}/2",
        30: "0::/system.slice/nvidia-persistenced.service",
    }.items():
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "cgroup").write_text(text + "\n")
    uuid0, uuid1 = gpu0.uuid, gpu1.uuid
    kubelet = FakeAllocations(
        answer=DeviceAllocations(
            frozenset({f"{uuid0}::0", f"{uuid0}::1", uuid1}),
            frozenset({f"{uuid0}::0", f"{uuid0}::1", uuid1}),
            (
                PodDevices("ml/a", frozenset({f"{uuid0}::0"})),
                PodDevices("ml/b", frozenset({f"{uuid0}::1"})),
                PodDevices("train/c", frozenset({uuid1})),
            ),
        )
    )
    owners = (
        OwnerResolver(
            read_cgroup=lambda pid: read_cgroup_file(str(tmp_path), pid),
            list_pods=lambda: {UID_A: "ml/a", UID_B: "ml/b"},
        )
        if per_process
        else None
    )
    metrics = AgentMetrics()
    agent = Agent(
        source=NvmlSource.open(processes=per_process),
        writer=FakeWriter(),
        metrics=metrics,
        start_s=0.0,
        allocations=kubelet,
        process_owners=owners,
    )
    return agent, metrics, fake


def test_pods_figures_per_process_on_a_shared_gpu(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    agent, metrics, _ = _pod_usage_agent(monkeypatch, tmp_path, per_process=True)
    annotations = agent.tick(now_s=0.0, wall_now=T0).annotations
    # GPU 0 at 0.80: a has 120 of 160 SM samples (0.60), b 20 (0.10), the host daemon the rest.
    # Memory: each pod's processes; GPU 1 is c's alone: 0.50 and total - free (reserved incl.).
    assert annotations[POD_USAGE_KEY] == "ml/a=0:0.60:20000;ml/b=0:0.10:9000;train/c=1:0.50:40512"
    assert metrics.value("gpu_agent_pod_attribution_total", {"outcome": "processes"}) == 2
    assert metrics.value("gpu_agent_pod_attribution_total", {"outcome": "whole-gpu"}) == 1
    assert metrics.value("gpu_agent_gpu_processes_total", {"owner": "pod"}) == 2
    assert metrics.value("gpu_agent_gpu_processes_total", {"owner": "no-pod"}) == 1
    assert metrics.value("gpu_agent_process_attribution") == 1


def test_without_host_processes_shared_pods_are_unknown_and_it_is_said_once(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="agent.daemon")
    agent, metrics, fake = _pod_usage_agent(monkeypatch, tmp_path, per_process=False)
    first = agent.tick(now_s=0.0, wall_now=T0).annotations
    agent.tick(now_s=5.0, wall_now=T0 + timedelta(seconds=5))
    assert first[POD_USAGE_KEY] == "ml/a=0:-:-;ml/b=0:-:-;train/c=1:0.50:40512"
    assert fake.calls["nvmlDeviceGetProcessUtilization"] == 0
    assert metrics.value("gpu_agent_pod_attribution_total", {"outcome": "no-host-processes"}) == 4
    assert metrics.value("gpu_agent_process_attribution") == 0
    assert sum("per-process attribution off" in r.getMessage() for r in caplog.records) == 1


def test_a_resolver_that_raises_leaves_the_shared_pods_unknown(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    agent, _, _ = _pod_usage_agent(monkeypatch, tmp_path, per_process=True)

    class Broken:
        def resolve(self, pids: Any, *, now_s: float) -> Mapping[int, Any]:
            raise RuntimeError("bug")

    agent.process_owners = Broken()
    annotations = agent.tick(now_s=0.0, wall_now=T0).annotations
    # Unknown, not zero: zero would tell a reader these pods use nothing.
    assert annotations[POD_USAGE_KEY].startswith("ml/a=0:-:-;ml/b=0:-:-;")
