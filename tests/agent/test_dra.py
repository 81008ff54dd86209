"""DRA device taints, the pure part: ResourceSlice matching, the device rules with hysteresis, and
the per-GPU write decision driven by `now_s`. Named table cases, plus properties over random
histories for the write bounds."""

from __future__ import annotations

import copy
from itertools import pairwise
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.dra import (
    DraDevice,
    GpuCondition,
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
    wanted_taint,
)

DRIVER = "gpu.nvidia.com"
NODE = "gpu-node-1"
PREFIX = "gpu-scheduler.example.com/"
POLICY = TaintPolicy()


def device(minor: int, uuid: str | None = None, **extra: Any) -> dict[str, Any]:
    """A GPU as NVIDIA's DRA driver publishes it (resource.k8s.io/v1)."""
    attributes: dict[str, Any] = {"type": {"string": "gpu"}, "productName": {"string": "H100"}}
    if uuid is not None:
        attributes["uuid"] = {"string": uuid}
    return {"name": f"gpu-{minor}", "attributes": attributes, **extra}


def resource_slice(
    name: str = f"{NODE}-gpu.nvidia.com-abcde",
    *,
    devices: list[Any] | None = None,
    driver: str = DRIVER,
    pool: str = NODE,
    node: str | None = NODE,
    generation: object = 1,
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "driver": driver,
        "pool": {"name": pool, "generation": generation, "resourceSliceCount": 1},
        "devices": devices if devices is not None else [device(0, "GPU-a"), device(1, "GPU-b")],
    }
    if node is not None:
        spec["nodeName"] = node
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": name},
        "spec": spec,
    }


def dev(minor: int, uuid: str) -> DraDevice:
    return DraDevice(DRIVER, NODE, f"gpu-{minor}", uuid)


def _v1beta1_slice() -> dict[str, Any]:
    item = resource_slice(devices=[])
    item["spec"]["devices"] = [
        {"name": "gpu-0", "basic": {"attributes": {"uuid": {"string": "GPU-a"}}}}
    ]
    return item


MATCH_CASES = [
    pytest.param([resource_slice()], (dev(0, "GPU-a"), dev(1, "GPU-b")), (), id="nvidia-shape"),
    pytest.param([resource_slice(driver="other.example.com")], (), (), id="other-driver-ignored"),
    pytest.param([resource_slice(pool="gpu-node-2", node="gpu-node-2")], (), (), id="other-pool"),
    pytest.param(
        [resource_slice(pool=NODE, node="gpu-node-2")],
        (),
        ("pool gpu-node-1 on another node",),
        id="own-pool-name-on-another-node-refused",
    ),
    pytest.param(
        [resource_slice(node=None)],
        (dev(0, "GPU-a"), dev(1, "GPU-b")),
        (),
        id="no-node-name-pool-decides",
    ),
    pytest.param([_v1beta1_slice()], (dev(0, "GPU-a"),), (), id="v1beta1-basic-attributes"),
    pytest.param(
        [resource_slice(devices=[device(0), device(1, "GPU-b")])],
        (dev(1, "GPU-b"),),
        (),
        id="device-without-uuid-skipped",
    ),
    pytest.param(
        [
            resource_slice("old", devices=[device(0, "GPU-old")], generation=1),
            resource_slice("new", devices=[device(0, "GPU-a")], generation=2),
        ],
        (dev(0, "GPU-a"),),
        (),
        id="only-newest-generation",
    ),
    pytest.param(
        [
            resource_slice("s1", devices=[device(0, "GPU-a")]),
            resource_slice("s2", devices=[device(1, "GPU-b")]),
        ],
        (dev(0, "GPU-a"), dev(1, "GPU-b")),
        (),
        id="pool-split-over-two-slices",
    ),
    pytest.param(
        [resource_slice(devices=[device(0, "GPU-a"), device(1, "GPU-a"), device(2, "GPU-c")])],
        (dev(2, "GPU-c"),),
        ("uuid GPU-a named by more than one device",),
        id="duplicate-uuid-never-tainted",
    ),
    pytest.param(
        ["not an object", {"metadata": {"name": "x"}}],
        (),
        ("? no spec", "x: no spec"),
        id="malformed-slice-skipped",
    ),
    pytest.param(
        [resource_slice(generation="1")], (), ("malformed pool generation",), id="bad-generation"
    ),
    pytest.param(
        [resource_slice(devices=[{"attributes": {}}, device(1, "GPU-b")])],
        (dev(1, "GPU-b"),),
        ("a device without a name",),
        id="nameless-device-skipped",
    ),
    pytest.param(
        [{"metadata": {"name": "y"}, "spec": {"driver": DRIVER, "pool": "flat"}}],
        (),
        ("y: no pool name",),
        id="pool-not-an-object",
    ),
]


@pytest.mark.parametrize(("slices", "expected", "problems"), MATCH_CASES)
def test_node_devices(
    slices: list[object], expected: tuple[DraDevice, ...], problems: tuple[str, ...]
) -> None:
    found = node_devices(slices, driver=DRIVER, node_name=NODE)
    assert found.devices == expected
    assert len(found.problems) == len(problems)
    for text, part in zip(found.problems, problems, strict=True):
        assert part.replace("? ", "?: ") in text


def test_conditions_match_by_uuid_and_find_lost_gpus() -> None:
    devices = [dev(0, "GPU-a"), dev(1, "GPU-b"), dev(2, "GPU-c"), dev(3, "GPU-mig-parent")]
    read = [("GPU-b", 0.95, 70), ("GPU-a", 0.10, 40), ("GPU-unpublished", 1.0, 90)]
    found = conditions(read, devices, seen_uuids=frozenset({"GPU-a", "GPU-b", "GPU-c"}))
    assert found == {
        "GPU-a": GpuCondition(0.10, 40),
        "GPU-b": GpuCondition(0.95, 70),
        # Read before, not now: lost. GPU-mig-parent was never read: not judged at all.
        "GPU-c": GpuCondition(None, None, lost=True),
    }


WANTED_CASES = [
    pytest.param(GpuCondition(0.50, 60), None, None, id="cool-idle"),
    pytest.param(GpuCondition(0.90, 60), None, None, id="at-utilization-limit-passes"),
    pytest.param(GpuCondition(0.91, 60), None, TaintKind.UTILIZATION, id="above-limit"),
    pytest.param(
        GpuCondition(0.85, 60),
        TaintKind.UTILIZATION,
        TaintKind.UTILIZATION,
        id="held-inside-margin",
    ),
    pytest.param(
        GpuCondition(0.80, 60),
        TaintKind.UTILIZATION,
        TaintKind.UTILIZATION,
        id="held-at-release-threshold",
    ),
    pytest.param(GpuCondition(0.79, 60), TaintKind.UTILIZATION, None, id="released-below-margin"),
    pytest.param(
        GpuCondition(None, 60),
        TaintKind.UTILIZATION,
        TaintKind.UTILIZATION,
        id="unreadable-keeps-held",
    ),
    pytest.param(GpuCondition(None, None), None, None, id="unreadable-never-taints"),
    pytest.param(GpuCondition(0.2, 85), None, TaintKind.TEMPERATURE, id="at-temperature-limit"),
    pytest.param(GpuCondition(0.2, 84), None, None, id="below-temperature-limit"),
    pytest.param(
        GpuCondition(0.2, 80),
        TaintKind.TEMPERATURE,
        TaintKind.TEMPERATURE,
        id="temperature-held-at-80",
    ),
    pytest.param(GpuCondition(0.2, 79), TaintKind.TEMPERATURE, None, id="temperature-released"),
    pytest.param(GpuCondition(0.95, 90), None, TaintKind.TEMPERATURE, id="hot-beats-busy"),
    pytest.param(
        GpuCondition(0.95, 90),
        TaintKind.UTILIZATION,
        TaintKind.TEMPERATURE,
        id="held-busy-turns-hot",
    ),
    pytest.param(
        GpuCondition(0.85, 82),
        TaintKind.TEMPERATURE,
        TaintKind.TEMPERATURE,
        id="held-hot-in-margin-not-busy-enough-for-a-new-taint",
    ),
    pytest.param(GpuCondition(None, None, lost=True), None, TaintKind.HEALTH, id="lost"),
    pytest.param(GpuCondition(0.1, 40), TaintKind.HEALTH, None, id="recovered-from-lost"),
]


@pytest.mark.parametrize(("condition", "published", "expected"), WANTED_CASES)
def test_wanted_taint(
    condition: GpuCondition, published: TaintKind | None, expected: TaintKind | None
) -> None:
    assert wanted_taint(condition, published=published, policy=POLICY) == expected


BUSY = GpuCondition(0.95, 60)
COOL = GpuCondition(0.10, 40)
TAINTED_AT_100 = taint_written(TaintState(), wanted=TaintKind.UTILIZATION, now_s=100.0)
FAILED_AT_100 = taint_failed(TaintState(), now_s=100.0, policy=POLICY)
FULL_HOUR = TaintState(attempts_s=tuple(float(t) for t in range(0, 720, 60)))

DECIDE_CASES = [
    pytest.param(TaintState(), BUSY, 0.0, "apply", TaintReason.TAINT, id="first-taint-at-once"),
    pytest.param(TaintState(), COOL, 0.0, None, TaintReason.IN_SYNC, id="cool-nothing"),
    pytest.param(TAINTED_AT_100, BUSY, 110.0, None, TaintReason.IN_SYNC, id="held-no-rewrite"),
    pytest.param(
        TAINTED_AT_100,
        COOL,
        130.0,
        None,
        TaintReason.WITHIN_MIN_INTERVAL,
        id="untaint-waits-a-minute",
    ),
    pytest.param(
        TAINTED_AT_100, COOL, 160.0, "delete", TaintReason.UNTAINT, id="untaint-after-a-minute"
    ),
    pytest.param(
        TAINTED_AT_100, GpuCondition(0.95, 90), 160.0, "apply", TaintReason.CHANGE, id="key-change"
    ),
    pytest.param(FAILED_AT_100, BUSY, 150.0, None, TaintReason.BACKING_OFF, id="backing-off"),
    pytest.param(FAILED_AT_100, BUSY, 160.0, "apply", TaintReason.TAINT, id="retry-after-backoff"),
    pytest.param(FULL_HOUR, BUSY, 3000.0, None, TaintReason.HOURLY_BUDGET, id="hourly-budget"),
    pytest.param(
        FULL_HOUR, BUSY, 3600.0, "apply", TaintReason.TAINT, id="budget-frees-after-an-hour"
    ),
]


@pytest.mark.parametrize(("state", "condition", "now_s", "action", "reason"), DECIDE_CASES)
def test_decide_taint(
    state: TaintState,
    condition: GpuCondition,
    now_s: float,
    action: str | None,
    reason: TaintReason,
) -> None:
    decision = decide_taint(state, condition, now_s=now_s, policy=POLICY)
    assert (decision.action, decision.reason) == (action, reason)


def test_backoff_doubles_honours_retry_after_and_resets() -> None:
    state = TaintState()
    waits = []
    for attempt in range(6):
        now_s = 1000.0 * attempt
        state = taint_failed(state, now_s=now_s, policy=POLICY)
        waits.append((state.retry_at_s or 0) - now_s)
    assert waits == [60, 120, 240, 480, 600, 600]
    throttled = taint_failed(TaintState(), now_s=0.0, policy=POLICY, retry_after_s=300.0)
    assert throttled.retry_at_s == 300.0
    capped = taint_failed(TaintState(), now_s=0.0, policy=POLICY, retry_after_s=1e9)
    assert capped.retry_at_s == POLICY.backoff_max_s
    recovered = taint_written(state, wanted=None, now_s=9000.0)
    assert (recovered.consecutive_failures, recovered.retry_at_s) == (0, None)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.floats(min_value=1, max_value=120),  # seconds to the next tick
            st.floats(min_value=0, max_value=1),  # utilization
            st.integers(min_value=30, max_value=100),  # temperature
            st.booleans(),  # the write succeeds
        ),
        min_size=1,
        max_size=300,
    )
)
def test_writes_are_spaced_and_bounded_per_hour(
    history: list[tuple[float, float, int, bool]],
) -> None:
    state, now_s, attempts = TaintState(), 0.0, []
    for step_s, utilization, temperature_c, succeeds in history:
        now_s += step_s
        decision = decide_taint(
            state, GpuCondition(utilization, temperature_c), now_s=now_s, policy=POLICY
        )
        if decision.action is None:
            continue
        attempts.append(now_s)
        if succeeds:
            state = taint_written(state, wanted=decision.wanted, now_s=now_s)
        else:
            state = taint_failed(state, now_s=now_s, policy=POLICY)
    for earlier, later in pairwise(attempts):
        assert later - earlier >= POLICY.min_write_interval_s
    for index, start in enumerate(attempts):
        in_hour = [t for t in attempts[index:] if t - start < 3600]
        assert len(in_hour) <= POLICY.max_writes_per_hour


def test_rule_body_names_exactly_one_device_no_schedule() -> None:
    body = rule_body(dev(3, "GPU-d"), TaintKind.UTILIZATION, prefix=PREFIX, api_version="v1")
    assert body == {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceTaintRule",
        "metadata": {
            "name": "gpu-scheduler.gpu-node-1.gpu-3",
            "labels": {"app.kubernetes.io/managed-by": "gpu-scheduler-agent"},
        },
        "spec": {
            "deviceSelector": {"driver": DRIVER, "pool": NODE, "device": "gpu-3"},
            "taint": {"key": "gpu-scheduler.example.com/utilization", "effect": "NoSchedule"},
        },
    }


def test_rule_name_is_a_bounded_dns_subdomain() -> None:
    long = DraDevice(DRIVER, "n" * 250, "gpu-0", "GPU-a")
    name = rule_name(long)
    assert len(name) == 253
    assert name != rule_name(DraDevice(DRIVER, "n" * 249, "gpu-0", "GPU-a"))


def test_own_rules_reads_back_what_the_agent_wrote_and_nothing_else() -> None:
    mine = rule_body(dev(0, "GPU-a"), TaintKind.TEMPERATURE, prefix=PREFIX, api_version="v1")
    other_node = copy.deepcopy(mine)
    other_node["spec"]["deviceSelector"]["pool"] = "gpu-node-2"
    foreign_key = copy.deepcopy(mine)
    foreign_key["spec"]["taint"]["key"] = "example.com/maintenance"
    old_key = copy.deepcopy(mine)
    old_key["metadata"]["name"] = "old"
    old_key["spec"]["taint"]["key"] = PREFIX + "retired"
    found = own_rules(
        [mine, other_node, foreign_key, old_key, "junk", {"metadata": {}, "spec": {}}],
        driver=DRIVER,
        node_name=NODE,
        prefix=PREFIX,
    )
    assert [(r.name, r.device, r.kind) for r in found] == [
        ("gpu-scheduler.gpu-node-1.gpu-0", "gpu-0", TaintKind.TEMPERATURE),
        ("old", "gpu-0", None),
    ]


@pytest.mark.parametrize(
    "changes",
    [
        pytest.param({"utilization_margin": 0.95}, id="margin-above-limit"),
        pytest.param({"temperature_margin_c": 85}, id="temperature-margin-equal-limit"),
        pytest.param({"min_write_interval_s": 0.0}, id="zero-interval"),
        pytest.param({"max_writes_per_hour": 0}, id="no-writes"),
        pytest.param({"utilization_limit": 1.5}, id="limit-above-one"),
    ],
)
def test_policy_rejects_bad_bounds(changes: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match=next(iter(changes))):
        TaintPolicy(**changes)


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)


def _mangled_slice(data: st.DataObject) -> object:
    """A driver's slice with any one part replaced by arbitrary JSON."""
    item = resource_slice()
    path = data.draw(
        st.sampled_from(
            [
                ("spec",),
                ("spec", "pool"),
                ("spec", "devices"),
                ("spec", "pool", "generation"),
                ("spec", "nodeName"),
                ("spec", "devices", 0),
                ("spec", "devices", 0, "attributes"),
                ("spec", "devices", 0, "attributes", "uuid"),
                ("spec", "devices", 0, "name"),
            ]
        )
    )
    target: Any = item
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = data.draw(JSON)
    return item


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_node_devices_never_raises_on_malformed_slices(data: st.DataObject) -> None:
    slices = [_mangled_slice(data), data.draw(JSON)]
    found = node_devices(slices, driver=DRIVER, node_name=NODE)
    assert all(d.pool == NODE and d.driver == DRIVER for d in found.devices)
    assert len({d.uuid for d in found.devices}) == len(found.devices)
