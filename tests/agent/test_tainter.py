"""The DRA side of a tick: a fake `DraClient` at the agent's own seam, driven with `now_s`.

Each fault class the API can answer with has its named case: no DRA, no DeviceTaintRules, 403
on a read and on a write (RBAC, the admission policy), 409, 429 with Retry-After, a malformed
ResourceSlice. The real client against a real API server is exercised in tests/e2e/test_dra.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException  # type: ignore[import-untyped]

from agent.daemon import Agent
from agent.dra import TaintKind, TaintPolicy
from agent.dra_api import DraApi, DraApiMissing
from agent.kube import (
    ApiError,
    ConflictError,
    ForbiddenError,
    NotFoundError,
    ServerError,
    TooManyRequestsError,
    classify,
)
from agent.metrics import AgentMetrics
from agent.records import GpuReading, NodeReading
from agent.tainter import DeviceTainter, DraState
from tests.agent.test_daemon import FakeSource, FakeWriter
from tests.agent.test_dra import DRIVER, NODE, PREFIX, device, resource_slice

T0 = datetime(2026, 12, 3, 10, 0, tzinfo=UTC)
API = DraApi("v1", "v1")


@dataclass
class FakeDra:
    """Answers as `DraClient` does; `fail` maps a method name to the error it raises next."""

    slices: list[object] = field(
        default_factory=lambda: [
            resource_slice(devices=[device(0, "GPU-a"), device(1, "GPU-b"), device(2, "GPU-c")])
        ]
    )
    rules: dict[str, dict[str, Any]] = field(default_factory=dict)
    fail: dict[str, Exception] = field(default_factory=dict)
    calls: list[str] = field(default_factory=list)
    missing: str | None = None

    def _maybe_fail(self, name: str) -> None:
        self.calls.append(name)
        error = self.fail.pop(name, None)
        if error is not None:
            raise error

    def discover(self) -> DraApi:
        self._maybe_fail("discover")
        if self.missing is not None:
            raise DraApiMissing(self.missing)
        return API

    def node_uid(self) -> str | None:
        self._maybe_fail("node_uid")
        return "6f1f2c1e-0000-4000-8000-000000000001"

    def list_slices(self, api: DraApi, *, driver: str) -> list[object]:
        self._maybe_fail("list_slices")
        return self.slices

    def list_rules(self, api: DraApi, *, label_selector: str) -> list[object]:
        self._maybe_fail("list_rules")
        return list(self.rules.values())

    def apply_rule(self, api: DraApi, body: Mapping[str, Any]) -> None:
        self._maybe_fail("apply_rule")
        self.rules[body["metadata"]["name"]] = dict(body)

    def delete_rule(self, api: DraApi, name: str) -> None:
        self._maybe_fail("delete_rule")
        self.rules.pop(name, None)

    def keys(self) -> dict[str, str]:
        return {
            r["spec"]["deviceSelector"]["device"]: r["spec"]["taint"]["key"].removeprefix(PREFIX)
            for r in self.rules.values()
        }


def reading(*gpus: tuple[str, float, int], fatal: str | None = None) -> NodeReading:
    return NodeReading(
        sampled_at=T0,
        gpus=tuple(
            GpuReading(uuid, i, "H100", util, 81920, 40000, temp)
            for i, (uuid, util, temp) in enumerate(gpus)
        ),
        device_count=3,
        fatal=fatal,
    )


COOL = (("GPU-a", 0.1, 40), ("GPU-b", 0.2, 45), ("GPU-c", 0.3, 50))
B_BUSY = (("GPU-a", 0.1, 40), ("GPU-b", 0.97, 60), ("GPU-c", 0.3, 50))


def tainter(fake: FakeDra, metrics: AgentMetrics | None = None) -> DeviceTainter:
    return DeviceTainter(
        fake,
        node_name=NODE,
        driver=DRIVER,
        prefix=PREFIX,
        policy=TaintPolicy(),
        metrics=metrics or AgentMetrics(),
        resync_interval_s=300.0,
    )


def test_busy_gpu_is_tainted_at_once_and_untainted_a_minute_later_below_the_margin() -> None:
    fake = FakeDra()
    metrics = AgentMetrics()
    agent = tainter(fake, metrics)
    agent.tick(reading(*COOL), now_s=0.0)
    assert fake.rules == {}
    agent.tick(reading(*B_BUSY), now_s=5.0)
    assert fake.keys() == {"gpu-1": "utilization"}
    # 0.85 is inside the margin: held. 0.5 after 30 s: within the minute. At 65 s: released.
    agent.tick(reading(("GPU-a", 0.1, 40), ("GPU-b", 0.85, 60), ("GPU-c", 0.3, 50)), now_s=10.0)
    agent.tick(reading(*COOL), now_s=35.0)
    assert fake.keys() == {"gpu-1": "utilization"}
    agent.tick(reading(*COOL), now_s=65.0)
    assert fake.keys() == {}
    assert metrics.value("gpu_agent_dra_taint_writes_total", {"reason": "taint"}) == 1
    assert metrics.value("gpu_agent_dra_taint_writes_total", {"reason": "untaint"}) == 1
    suppressed = {"reason": "within-min-interval"}
    assert metrics.value("gpu_agent_dra_taint_writes_suppressed_total", suppressed) == 1
    assert metrics.value("gpu_agent_dra_state", {"state": "active"}) == 1


def test_lost_gpu_gets_the_health_taint_and_loses_it_when_read_again() -> None:
    fake = FakeDra()
    agent = tainter(fake)
    agent.tick(reading(*COOL), now_s=0.0)
    agent.tick(reading(*COOL[:2]), now_s=5.0)
    assert fake.keys() == {"gpu-2": "health"}
    agent.tick(reading(*COOL), now_s=70.0)
    assert fake.keys() == {}


def test_nvml_failing_taints_every_gpu_it_read_before() -> None:
    fake = FakeDra()
    agent = tainter(fake)
    agent.tick(reading(*COOL), now_s=0.0)
    agent.tick(reading(fatal="nvmlInit failed"), now_s=5.0)
    assert fake.keys() == {"gpu-0": "health", "gpu-1": "health", "gpu-2": "health"}


def test_restart_learns_held_rules_and_removes_rules_of_vanished_devices() -> None:
    fake = FakeDra()
    first = tainter(fake)
    first.tick(reading(*COOL), now_s=0.0)
    first.tick(reading(*B_BUSY), now_s=5.0)
    fake.slices = [resource_slice(devices=[device(1, "GPU-b"), device(2, "GPU-c")])]
    fake.rules["gpu-scheduler.gpu-node-1.gpu-0"] = {
        **fake.rules["gpu-scheduler.gpu-node-1.gpu-1"],
        "metadata": {"name": "gpu-scheduler.gpu-node-1.gpu-0"},
        "spec": {
            "deviceSelector": {"driver": DRIVER, "pool": NODE, "device": "gpu-0"},
            "taint": {"key": PREFIX + "temperature", "effect": "NoSchedule"},
        },
    }
    restarted = tainter(fake)
    restarted.tick(reading(*B_BUSY), now_s=1000.0)
    # gpu-1 is still busy: the held rule is kept, not rewritten; gpu-0 is gone: its rule too.
    assert fake.keys() == {"gpu-1": "utilization"}
    assert fake.calls.count("apply_rule") == 1
    assert restarted.tainted() == {"gpu-1": TaintKind.UTILIZATION}


def _status(code: int, *, headers: dict[str, str] | None = None) -> ApiException:
    exc = ApiException(status=code, reason="x")
    exc.body = '{"kind":"Status","message":"denied by policy"}'
    exc.headers = headers or {}
    return exc


NOT_ACTIVE_CASES = [
    pytest.param(
        FakeDra(missing="the API server serves no resource.k8s.io ResourceSlices (no DRA)"),
        DraState.API_MISSING,
        id="no-dra",
    ),
    pytest.param(
        FakeDra(missing="the API server serves no resource.k8s.io DeviceTaintRules"),
        DraState.API_MISSING,
        id="no-device-taint-rules",
    ),
    pytest.param(
        FakeDra(fail={"list_slices": ForbiddenError("403", status=403)}),
        DraState.FORBIDDEN,
        id="403-listing-slices",
    ),
    pytest.param(
        FakeDra(fail={"list_rules": ForbiddenError("403", status=403)}),
        DraState.FORBIDDEN,
        id="403-listing-rules",
    ),
    pytest.param(
        FakeDra(fail={"discover": ServerError("503", status=503)}), DraState.ERROR, id="503"
    ),
    pytest.param(FakeDra(slices=[]), DraState.NO_DEVICES, id="no-slices-for-this-node"),
    pytest.param(
        FakeDra(slices=[{"metadata": {"name": "broken"}}, "junk"]),
        DraState.NO_DEVICES,
        id="malformed-slices",
    ),
    pytest.param(
        FakeDra(slices=[resource_slice(devices=[device(0, "MIG-x")])]),
        DraState.NO_DEVICES,
        id="no-uuid-matches-nvml",
    ),
]


@pytest.mark.parametrize(("fake", "state"), NOT_ACTIVE_CASES)
def test_without_usable_dra_nothing_is_written_and_one_line_says_why(
    fake: FakeDra, state: DraState, caplog: pytest.LogCaptureFixture
) -> None:
    metrics = AgentMetrics()
    agent = tainter(fake, metrics)
    for now_s in (0.0, 5.0, 10.0):
        agent.tick(reading(*B_BUSY), now_s=now_s)
    assert fake.rules == {}
    assert agent.state is state
    assert metrics.value("gpu_agent_dra_state", {"state": state.value}) == 1
    lines = [r for r in caplog.records if "DRA device taints" in r.getMessage()]
    assert len(lines) == 1, [r.getMessage() for r in lines]
    assert state.value in lines[0].getMessage()


def test_an_error_at_resync_is_retried_sooner_and_then_works() -> None:
    fake = FakeDra(fail={"discover": ServerError("503", status=503)})
    agent = tainter(fake)
    agent.tick(reading(*B_BUSY), now_s=0.0)
    assert agent.state is DraState.ERROR
    agent.tick(reading(*B_BUSY), now_s=30.0)
    assert fake.rules == {}
    agent.tick(reading(*B_BUSY), now_s=60.0)
    assert str(agent.state) == DraState.ACTIVE.value
    assert fake.keys() == {"gpu-1": "utilization"}


WRITE_FAULTS = [
    pytest.param(ForbiddenError("denied by policy", status=403), 60.0, id="403-admission"),
    pytest.param(ConflictError("conflict", status=409), 60.0, id="409"),
    pytest.param(TooManyRequestsError("slow down", retry_after_s=300.0), 300.0, id="429-retry"),
    pytest.param(ServerError("boom", status=500), 60.0, id="500"),
]


@pytest.mark.parametrize(("error", "wait_s"), WRITE_FAULTS)
def test_a_failed_rule_write_backs_off_and_retries(error: ApiError, wait_s: float) -> None:
    fake = FakeDra()
    metrics = AgentMetrics()
    agent = tainter(fake, metrics)
    agent.tick(reading(*COOL), now_s=0.0)
    fake.fail["apply_rule"] = error
    agent.tick(reading(*B_BUSY), now_s=5.0)
    assert fake.rules == {}
    assert metrics.value("gpu_agent_dra_api_errors_total", {"code": error.code}) == 1
    agent.tick(reading(*B_BUSY), now_s=5.0 + wait_s - 1)
    assert fake.calls.count("apply_rule") == 1
    agent.tick(reading(*B_BUSY), now_s=5.0 + wait_s)
    assert fake.keys() == {"gpu-1": "utilization"}


CLASSIFY_CASES = [
    pytest.param(_status(403), ForbiddenError, "forbade applying DeviceTaintRule", id="403"),
    pytest.param(_status(404), NotFoundError, "not found (404)", id="404"),
    pytest.param(_status(409), ConflictError, "conflict applying", id="409"),
    pytest.param(_status(429, headers={"Retry-After": "7"}), TooManyRequestsError, "429", id="429"),
]


@pytest.mark.parametrize(("exc", "kind", "text"), CLASSIFY_CASES)
def test_dra_failures_are_classified_with_the_request_named(
    exc: ApiException, kind: type[ApiError], text: str
) -> None:
    error = classify(exc, node_name=NODE, action="applying DeviceTaintRule 'x'")
    assert isinstance(error, kind)
    assert text in str(error)
    if isinstance(error, TooManyRequestsError):
        assert error.retry_after_s == 7.0


class _Broken(FakeDra):
    def list_slices(self, api: DraApi, *, driver: str) -> list[object]:
        raise RuntimeError("a bug in the DRA side")


def test_the_agent_tick_runs_the_taints_and_survives_their_bugs(
    caplog: pytest.LogCaptureFixture,
) -> None:
    fake = FakeDra(slices=[resource_slice(devices=[device(0, "GPU-0")])])
    working = Agent(
        source=FakeSource(utilization=0.99), writer=None, start_s=0.0, tainter=tainter(fake)
    )
    working.tick(now_s=5.0, wall_now=T0)
    assert fake.keys() == {"gpu-0": "utilization"}
    broken = Agent(source=FakeSource(), writer=None, start_s=0.0, tainter=tainter(_Broken()))
    assert broken.tick(now_s=5.0, wall_now=T0).state is not None
    assert "DRA device taints raised" in caplog.text


def test_the_agent_publishes_each_gpus_device_name_as_found_by_uuid() -> None:
    """The driver numbers devices by minor, not NVML index: GPU 0 (`GPU-0`) is device gpu-1.
    The names are known after the tainter's first resync, so they go out with the next write,
    as a change of their own, and stay out of the annotations while DRA is not active."""
    fake = FakeDra(slices=[resource_slice(devices=[device(1, "GPU-0"), device(0, "GPU-1")])])
    writer = FakeWriter()
    agent = Agent(source=FakeSource(), writer=writer, start_s=0.0, tainter=tainter(fake))
    key = PREFIX + "per-gpu-dra-device"
    agent.tick(now_s=0.0, wall_now=T0)
    assert key not in writer.patches[-1]
    assert agent.tainter is not None
    assert agent.tainter.device_names() == {"GPU-0": "gpu-1", "GPU-1": "gpu-0"}
    result = agent.tick(now_s=20.0, wall_now=T0)
    assert "per-gpu-dra-device" in result.decision.changed
    assert writer.patches[-1][key] == "gpu-1,gpu-0"
    result = agent.tick(now_s=40.0, wall_now=T0)
    assert not result.decision.write  # unchanged names are no change
    missing = FakeDra(missing="the API server serves no resource.k8s.io DeviceTaintRules")
    without = tainter(missing)
    without.tick(reading(*COOL), now_s=0.0)
    assert without.device_names() == {}


def test_a_404_on_a_rule_write_makes_the_next_tick_discover_again() -> None:
    fake = FakeDra()
    agent = tainter(fake)
    agent.tick(reading(*COOL), now_s=0.0)
    fake.fail["apply_rule"] = NotFoundError("gone", status=404)
    agent.tick(reading(*B_BUSY), now_s=5.0)
    assert fake.calls.count("discover") == 1
    fake.missing = "the API server serves no resource.k8s.io DeviceTaintRules"
    agent.tick(reading(*B_BUSY), now_s=10.0)
    assert fake.calls.count("discover") == 2
    assert agent.state is DraState.API_MISSING
    assert fake.rules == {}


def test_rules_are_owned_by_the_node_unless_it_cannot_be_read() -> None:
    fake = FakeDra()
    agent = tainter(fake)
    agent.tick(reading(*B_BUSY), now_s=0.0)
    (rule,) = fake.rules.values()
    assert rule["metadata"]["ownerReferences"] == [
        {
            "apiVersion": "v1",
            "kind": "Node",
            "name": NODE,
            "uid": "6f1f2c1e-0000-4000-8000-000000000001",
        }
    ]
    unreadable = FakeDra(fail={"node_uid": ForbiddenError("403", status=403)})
    agent = tainter(unreadable)
    agent.tick(reading(*B_BUSY), now_s=0.0)
    (rule,) = unreadable.rules.values()
    assert "ownerReferences" not in rule["metadata"]
