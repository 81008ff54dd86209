"""DRA pods: judged on the GPUs kube-scheduler's allocator may still give them.

The core rule (`core.dra.excluded_gpus` feeding the k-GPU rule), what the DRA watch keeps of a
ResourceClaim and a DeviceTaintRule (`edges.dracache`), and the request path (`ScorerApp`) with
a DRA source in memory: a claim-only pod, a DRA-backed extended-resource pod, unknown claims,
and a request whose claims the watch has not listed yet.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

import msgspec
import pytest

from exporter_scheduler.core.dra import (
    ALL_GPUS,
    NO_DEVICES,
    NO_EXCLUSIONS,
    NOT_GPUS,
    ClaimInfo,
    DeviceTaint,
    DraPod,
    NodeDevices,
    Toleration,
    device_index,
    excluded_gpus,
    gpu_exclusions,
    gpus_on_node,
)
from exporter_scheduler.core.policy import Policy
from exporter_scheduler.core.records import NodeInput
from exporter_scheduler.edges.dracache import (
    ClaimWatch,
    DraCache,
    TemplateWatch,
    _Claim,
    _Rule,
    claim_info,
    discover,
    rule_taint,
)
from exporter_scheduler.edges.dradata import DraData
from exporter_scheduler.edges.listwatch import CacheTuning
from exporter_scheduler.serving.app import ScorerApp
from exporter_scheduler.serving.dra import dra_pod
from exporter_scheduler.serving.explain import explain
from gpu_contract.schema import GpuState
from tests.scorer._http_helpers import fixed_clock
from tests.scorer.scoring_builders import NOW, Gpu, bound_pod, gpu_node, pod, run, runs, with_pods

DRIVER = "gpu.nvidia.com"
PREFIX = "gpu-scheduler.example.com/"
HOT = Gpu(utilization=0.97)
COOL = Gpu(utilization=0.05)
POLICY = Policy(own_load=False)
UTIL_TAINT = DeviceTaint(PREFIX + "utilization", "NoSchedule", rule="r")


def claim(ref: str = "default/c", gpus: int = 1, *allocated: str, **kw: Any) -> ClaimInfo:
    return ClaimInfo(ref, gpus, tuple(("node-a", d) for d in allocated), **kw)


def dra_judged(node: NodeInput, devices: NodeDevices, dra: DraPod) -> NodeInput:
    return msgspec.structs.replace(node, dra_excluded=excluded_gpus(devices, dra))


def dra_pod_input(dra: DraPod) -> Any:
    return msgspec.structs.replace(pod(gpus=dra.gpus), dra=dra)


# ------------------------------------------------------------------------------- the core rule
@pytest.mark.parametrize(
    ("name", "index"),
    [("gpu-0", 0), ("gpu-12", 12), ("gpu-0-mig-9-0-1", None), ("gpu-", None), ("nic-0", None)],
)
def test_device_index(name: str, index: int | None) -> None:
    assert device_index(name) == index


def test_devices_of_other_claims_are_excluded_not_the_pods_own() -> None:
    mine = claim("default/mine", 1, "gpu-2")
    devices = NodeDevices({"gpu-0": "default/other", "gpu-2": "default/mine"})
    assert excluded_gpus(devices, DraPod((mine,))) == {"gpu-0": "allocated"}


@pytest.mark.parametrize(
    ("case", "tolerations", "excluded"),
    [
        ("no toleration", (), {"gpu-3": "tainted"}),
        ("key tolerated", (Toleration(PREFIX + "utilization", "Exists"),), {}),
        ("every key tolerated", (Toleration(None, "Exists"),), {}),
        ("other key", (Toleration(PREFIX + "temperature", "Exists"),), {"gpu-3": "tainted"}),
        ("other effect", (Toleration(None, "Exists", effect="NoExecute"),), {"gpu-3": "tainted"}),
    ],
)
def test_taints_exclude_unless_tolerated(
    case: str, tolerations: tuple[Toleration, ...], excluded: dict[str, str]
) -> None:
    devices = NodeDevices(taints={"gpu-3": (UTIL_TAINT,)})
    pod_claim = claim("default/c", 1, tolerations=tolerations)
    assert excluded_gpus(devices, DraPod((pod_claim,))) == excluded, case


def test_an_extended_resource_claim_tolerates_nothing() -> None:
    devices = NodeDevices(taints={"gpu-1": (UTIL_TAINT,)})
    assert excluded_gpus(devices, DraPod((), extended=1)) == {"gpu-1": "tainted"}


def test_a_none_effect_taint_excludes_nothing() -> None:
    devices = NodeDevices(taints={"gpu-1": (DeviceTaint("k", "None"),)})
    assert excluded_gpus(devices, DraPod((claim(),))) == {}


def test_devices_are_gpus_by_the_names_the_agent_published_else_by_number() -> None:
    """Published names decide (NVIDIA's driver names a GPU by its minor number, which need not
    be its NVML index); a device no GPU carries is none of them; without names, `gpu-<n>` is
    GPU n, and a number past the table is no GPU."""
    excluded = {"gpu-0": "allocated", "gpu-2": "tainted", "gpu-0-mig-9-0-1": "allocated"}
    named = tuple(GpuState(0.1, dra_device=f"gpu-{3 - i}") for i in range(4))
    assert gpu_exclusions(excluded, named) == {3: "allocated", 1: "tainted"}
    unnamed = tuple(GpuState(0.1) for _ in range(4))
    assert gpu_exclusions(excluded, unnamed) == {0: "allocated", 2: "tainted"}
    assert gpu_exclusions({"gpu-7": "allocated"}, unnamed) == {}
    partly = (GpuState(0.1, dra_device="gpu-1"), GpuState(0.1))
    assert gpu_exclusions({"gpu-1": "allocated", "gpu-0": "tainted"}, partly) == {0: "allocated"}


def test_an_allocated_mig_device_takes_its_parent_gpu_from_whole_gpu_claims() -> None:
    """The driver's shared counters keep a GPU with an allocated MIG device from a whole-GPU
    claim; a taint on a MIG device does not taint its parent."""
    excluded = {"gpu-1-mig-1g.10gb-19-0": "allocated", "gpu-2-mig-1g.10gb-19-1": "tainted"}
    named = tuple(GpuState(0.1, dra_device=f"gpu-{i}") for i in range(4))
    assert gpu_exclusions(excluded, named) == {1: "allocated"}
    unnamed = tuple(GpuState(0.1) for _ in range(4))
    assert gpu_exclusions(excluded, unnamed) == {1: "allocated"}
    # A whole-GPU exclusion of the same GPU is not overwritten.
    both = {"gpu-1": "tainted", "gpu-1-mig-1g.10gb-19-0": "allocated"}
    assert gpu_exclusions(both, named) == {1: "tainted"}


def test_claim_pod_judged_on_the_gpus_its_devices_name() -> None:
    """Node a's devices are numbered against its GPUs' order: gpu-0..3 (allocated to others)
    are its GPUs 7..4, the cool ones, and its free devices are its hot GPUs 0..3. Judged by the
    published names the node fails; read as `gpu-<index>` it would pass on the wrong GPUs."""
    table = runs((4, HOT), (4, COOL))
    names = [f"gpu-{7 - i}" for i in range(8)]
    dra = DraPod((claim(),))
    devices = NodeDevices({f"gpu-{i}": "default/o" for i in range(4)})
    named = gpu_node("node-a", table, dra_devices=names)
    verdict = run([dra_judged(named, devices, dra)], dra_pod_input(dra), POLICY).verdicts[0]
    assert not verdict.passed
    assert verdict.gpus is not None
    assert verdict.gpus.status == ("utilization",) * 4 + ("allocated",) * 4
    unnamed = gpu_node("node-a", table)
    assert run([dra_judged(unnamed, devices, dra)], dra_pod_input(dra), POLICY).verdicts[0].passed


def test_claim_pod_rejected_where_its_only_untainted_unallocated_gpus_are_hot() -> None:
    """Node a: GPUs 0-3 cool but allocated to others or tainted; 4-7 hot and free. Node b: all
    cool. The claim pod passes only b, and a's reason is the utilization step."""
    a = gpu_node("node-a", runs((4, COOL), (4, HOT)))
    b = gpu_node("node-b", runs((8, COOL)))
    dra = DraPod((claim(),))
    devices = NodeDevices(
        {"gpu-0": "default/x", "gpu-1": "default/y"},
        {"gpu-2": (UTIL_TAINT,), "gpu-3": (UTIL_TAINT,)},
    )
    nodes = [dra_judged(a, devices, dra), dra_judged(b, NO_DEVICES, dra)]
    evaluation = run(nodes, dra_pod_input(dra), POLICY)
    verdict_a, verdict_b = evaluation.verdicts
    assert (verdict_a.passed, verdict_b.passed) == (False, True)
    assert verdict_a.reason == "no gpu at or below utilization 0.90"
    assert verdict_a.gpus is not None
    assert verdict_a.gpus.status[:5] == (
        "allocated",
        "allocated",
        "tainted",
        "tainted",
        "utilization",
    )
    assert verdict_a.gpus.pool == 4
    # Without the claims' data the same node passes on its four cool GPUs.
    assert run([a], pod(), POLICY).verdicts[0].passed


def test_claim_pod_judged_as_a_blind_draw_over_what_is_left() -> None:
    """Left: 3 cool and 1 hot: the chance of a cool one is 0.75, the default least."""
    node = gpu_node("node-a", runs((3, COOL), (1, HOT), (4, COOL)))
    dra = DraPod((claim(),))
    devices = NodeDevices({f"gpu-{i}": "default/o" for i in range(4, 8)})
    verdict = run([dra_judged(node, devices, dra)], dra_pod_input(dra), POLICY).verdicts[0]
    assert verdict.passed
    assert verdict.gpus is not None
    assert verdict.gpus.fit_bp == 7500
    stricter = Policy(own_load=False, min_gpu_fit_probability=0.8)
    assert (
        not run([dra_judged(node, devices, dra)], dra_pod_input(dra), stricter).verdicts[0].passed
    )


def test_in_flight_pods_hold_no_gpus_for_a_dra_pod() -> None:
    """Claims show allocations; a bound pod's allocation-pending GPUs are not taken twice."""
    node = with_pods(gpu_node("node-a", runs((1, COOL), (7, HOT))), bound_pod(gpus=1))
    dra = DraPod((claim(),))
    judged = dra_judged(node, NO_DEVICES, dra)
    verdict = run([judged], dra_pod_input(dra), POLICY).verdicts[0]
    assert verdict.gpus is not None
    assert verdict.gpus.inflight == 0


def test_explain_names_each_excluded_device() -> None:
    node = gpu_node("node-a", runs((8, COOL)))
    dra = DraPod((claim(),))
    devices = NodeDevices({"gpu-0": "default/x"}, {"gpu-1": (UTIL_TAINT,)})
    the_pod = dra_pod_input(dra)
    evaluation = run([dra_judged(node, devices, dra)], the_pod, POLICY)
    document = explain(evaluation, the_pod, NOW, POLICY)
    text = json.dumps(document)
    assert '"allocated"' in text
    assert '"tainted"' in text


def test_explain_shows_each_gpus_device_name() -> None:
    names = [f"gpu-{7 - i}" for i in range(8)]
    node = gpu_node("node-a", runs((8, COOL)), dra_devices=names)
    dra = DraPod((claim(),))
    devices = NodeDevices({"gpu-7": "default/x"})
    the_pod = dra_pod_input(dra)
    evaluation = run([dra_judged(node, devices, dra)], the_pod, POLICY)
    document = explain(evaluation, the_pod, NOW, POLICY)
    (node_document,) = document["nodes"]
    rows = node_document["gpus"]["table"]
    assert [row["device"] for row in rows] == names
    assert rows[0]["status"] == "allocated"
    assert rows[1]["status"] == "candidate"


# ------------------------------------------------------------------------------- the watch's keep
CLAIM_V1 = {
    "metadata": {"name": "c", "namespace": "ns", "resourceVersion": "5"},
    "spec": {
        "devices": {
            "requests": [
                {
                    "name": "gpu",
                    "exactly": {
                        "deviceClassName": DRIVER,
                        "allocationMode": "ExactCount",
                        "count": 2,
                        "tolerations": [{"key": PREFIX + "utilization", "operator": "Exists"}],
                    },
                },
                {"name": "nic", "exactly": {"deviceClassName": "nic.example.com"}},
            ]
        }
    },
    "status": {
        "allocation": {
            "devices": {
                "results": [
                    {"request": "gpu", "driver": DRIVER, "pool": "node-a", "device": "gpu-1"},
                    {"request": "gpu", "driver": DRIVER, "pool": "node-a", "device": "gpu-4"},
                    {"request": "nic", "driver": "nic.example.com", "pool": "n", "device": "x"},
                ]
            }
        }
    },
}


def test_claim_keeps_gpu_count_tolerations_and_the_drivers_allocation() -> None:
    obj = msgspec.json.decode(json.dumps(CLAIM_V1), type=_Claim)
    kept = claim_info(obj, device_classes=frozenset({DRIVER}), driver=DRIVER)
    assert kept is not None
    ref, info = kept
    assert ref == "ns/c"
    assert info.gpus == 2
    assert info.allocated == (("node-a", "gpu-1"), ("node-a", "gpu-4"))
    assert info.tolerations == (Toleration(PREFIX + "utilization", "Exists"),)


def test_claim_v1beta1_request_shape_and_first_available() -> None:
    body = {
        "metadata": {"name": "c", "namespace": "ns"},
        "spec": {
            "devices": {
                "requests": [
                    {"name": "a", "deviceClassName": DRIVER},
                    {
                        "name": "b",
                        "firstAvailable": [
                            {"deviceClassName": "x"},
                            {"deviceClassName": DRIVER, "count": 3},
                        ],
                    },
                ]
            }
        },
    }
    obj = msgspec.json.decode(json.dumps(body), type=_Claim)
    kept = claim_info(obj, device_classes=frozenset({DRIVER}), driver=DRIVER)
    assert kept is not None
    assert kept[1].gpus == 4  # 1 for `a`, and `b`'s first GPU alternative
    # `x`, another class before `b`'s GPU alternative, is not seen: `b` is a fixed 3.
    assert kept[1].choices == ()
    assert kept[1].allocated == ()


@pytest.mark.parametrize(
    ("choices", "fixed", "node_gpus", "free", "k"),
    [
        pytest.param(((2, 1),), 0, 8, 8, 2, id="first-fits"),
        pytest.param(((2, 1),), 0, 8, 1, 1, id="second-fits"),
        pytest.param(((2, 1),), 0, 8, 0, 2, id="none-fits-first-counts"),
        pytest.param(((2, NOT_GPUS),), 0, 8, 1, 0, id="another-class-after"),
        pytest.param(((ALL_GPUS,),), 0, 8, 8, 8, id="all-on-a-free-node"),
        pytest.param(((ALL_GPUS,),), 0, 8, 7, 8, id="all-where-one-is-taken-fails"),
        pytest.param(((ALL_GPUS, 1),), 0, 8, 7, 1, id="all-else-one"),
        pytest.param(((ALL_GPUS,),), 1, 8, 8, 9, id="all-after-a-fixed-request-fails"),
        pytest.param(((4, 2), (4, 1)), 0, 8, 6, 5, id="each-request-takes-what-is-left"),
    ],
)
def test_the_gpus_a_pod_gets_on_a_node_are_its_first_alternatives_that_fit(
    choices: tuple[tuple[int, ...], ...], fixed: int, node_gpus: int, free: int, k: int
) -> None:
    assert gpus_on_node(choices, fixed, node_gpus, free) == k


def test_a_pod_whose_first_alternative_does_not_fit_is_judged_on_the_one_that_does() -> None:
    """firstAvailable [2 GPUs, 1 GPU]: on a node with one GPU left the allocator gives 1, so
    the node is judged for 1 (it would fail for 2); on a free node for 2."""
    flexible = DraPod((claim("default/flex", 2, choices=((2, 1),)),))
    node = gpu_node("node-a", runs((8, COOL)))
    taken = NodeDevices({f"gpu-{i}": "default/other" for i in range(7)})
    (one_left,) = run([dra_judged(node, taken, flexible)], dra_pod_input(flexible), POLICY).verdicts
    assert one_left.passed
    assert one_left.gpus is not None
    assert one_left.gpus.needed == 1
    (free,) = run(
        [dra_judged(node, NO_DEVICES, flexible)], dra_pod_input(flexible), POLICY
    ).verdicts
    assert free.gpus is not None
    assert free.gpus.needed == 2
    plain = DraPod((claim("default/two", 2),))
    (strict,) = run([dra_judged(node, taken, plain)], dra_pod_input(plain), POLICY).verdicts
    assert not strict.passed


def test_a_request_for_all_devices_is_kept_as_such() -> None:
    body = {
        "metadata": {"name": "c", "namespace": "ns"},
        "spec": {
            "devices": {
                "requests": [
                    {"name": "all", "exactly": {"deviceClassName": DRIVER, "allocationMode": "All"}}
                ]
            }
        },
    }
    kept = claim_info(
        msgspec.json.decode(json.dumps(body), type=_Claim),
        device_classes=frozenset({DRIVER}),
        driver=DRIVER,
    )
    assert kept is not None
    assert (kept[1].gpus, kept[1].choices) == (1, ((ALL_GPUS,),))


def test_a_pod_asking_all_gpus_needs_every_gpu_of_the_node_free_untainted_and_a_candidate() -> None:
    """kube-scheduler's allocator gives an `All` request every matching device of the node, and
    fails it where one is allocated or tainted: the pod lands on all of them, so each must be
    a candidate; judged with k = the node's GPU count, per node."""
    whole = DraPod((claim("default/all", 1, choices=((ALL_GPUS,),)),))
    cool = gpu_node("node-a", runs((8, COOL)))
    one_hot = gpu_node("node-b", runs((7, COOL), (1, HOT)))
    small = gpu_node("node-c", runs((4, COOL)))
    nodes = [dra_judged(node, NO_DEVICES, whole) for node in (cool, one_hot, small)]
    verdicts = run(nodes, dra_pod_input(whole), POLICY).verdicts
    assert [v.passed for v in verdicts] == [True, False, True]
    assert [v.gpus.needed for v in verdicts if v.gpus is not None] == [8, 8, 4]
    assert verdicts[1].reason == "fewer than 8 gpus at or below utilization 0.90"
    taken = NodeDevices({"gpu-5": "default/other"})
    (held,) = run([dra_judged(cool, taken, whole)], dra_pod_input(whole), POLICY).verdicts
    assert not held.passed
    assert held.gpus is not None
    assert held.gpus.status[5] == "allocated"
    # A one-GPU claim pod is another class: it passes the node with a hot GPU.
    one = DraPod((claim("default/one", 1),))
    assert (
        run([dra_judged(one_hot, NO_DEVICES, one)], dra_pod_input(one), POLICY).verdicts[0].passed
    )


@pytest.mark.parametrize(
    ("selector", "target"),
    [
        ({"driver": DRIVER, "pool": "node-a", "device": "gpu-3"}, ("node-a", "gpu-3")),
        ({"driver": "other", "pool": "node-a", "device": "gpu-3"}, None),
        ({"driver": DRIVER, "pool": "node-a"}, ("node-a", None)),
        ({"pool": "node-a", "device": "gpu-3"}, ("node-a", "gpu-3")),
        ({"driver": DRIVER, "device": "gpu-3"}, (None, "gpu-3")),
        ({"driver": DRIVER}, (None, None)),
        ({}, (None, None)),
        (None, None),
    ],
)
def test_rule_kept_for_what_its_selector_can_select_of_the_driver(
    selector: dict[str, str] | None, target: tuple[str | None, str | None] | None
) -> None:
    """A selector's fields narrow it as kube-scheduler's ResourceSlice tracker applies rules:
    no driver is every driver's, no pool every pool's, no device every device's; no selector
    at all selects nothing."""
    spec: dict[str, Any] = {"taint": {"key": "k", "effect": "NoSchedule"}}
    if selector is not None:
        spec["deviceSelector"] = selector
    body = {"metadata": {"name": "r"}, "spec": spec}
    taint = rule_taint(msgspec.json.decode(json.dumps(body), type=_Rule), driver=DRIVER)
    if target is None:
        assert taint is None
    else:
        assert taint is not None
        assert taint[:2] == target
        assert taint[2].key == "k"


def test_a_rule_over_a_whole_pool_taints_every_gpu_not_allocated_to_another_claim() -> None:
    data = DraData(driver=DRIVER, device_classes=[DRIVER])
    data.replace_claims([claim("default/x", 1, "gpu-1")])
    data.replace_rules({"pool": ("node-a", None, UTIL_TAINT)})
    dra = DraPod((claim(),))
    node = gpu_node("node-a", runs((4, COOL)))
    verdict = run([dra_judged(node, data.devices("node-a"), dra)], dra_pod_input(dra), POLICY)
    (judged,) = verdict.verdicts
    assert not judged.passed
    assert judged.gpus is not None
    assert judged.gpus.status == ("tainted", "allocated", "tainted", "tainted")
    tolerant = DraPod((claim(tolerations=(Toleration(PREFIX + "utilization", "Exists"),)),))
    verdict = run(
        [dra_judged(node, data.devices("node-a"), tolerant)], dra_pod_input(tolerant), POLICY
    )
    assert verdict.verdicts[0].passed
    assert "node-b" not in data.tainted_pools()


def test_a_rule_without_a_pool_taints_its_device_in_every_pool() -> None:
    data = DraData(driver=DRIVER, device_classes=[DRIVER])
    data.replace_claims([ClaimInfo("default/x", 1, (("node-a", "gpu-0"),))])
    data.replace_rules({"everywhere": (None, "gpu-2", UTIL_TAINT)})
    assert data.default_exclusions == {("gpu-2", "tainted")}
    assert data.base_exclusions["node-a"] == {("gpu-0", "allocated"), ("gpu-2", "tainted")}
    assert data.devices("node-b").taints == {"gpu-2": (UTIL_TAINT,)}
    assert "node-b" in data.tainted_pools()
    data.put_rule("pool", ("node-c", "gpu-3", UTIL_TAINT))
    assert data.devices("node-c").taints == {"gpu-3": (UTIL_TAINT,), "gpu-2": (UTIL_TAINT,)}
    data.put_rule("everywhere", None)
    assert data.default_exclusions == NO_EXCLUSIONS
    assert data.base_exclusions["node-a"] == {("gpu-0", "allocated")}
    assert data.devices("node-b") is NO_DEVICES
    assert "node-b" not in data.tainted_pools()


def test_data_indexes_allocations_by_pool_through_changes() -> None:
    data = DraData(driver=DRIVER, device_classes=[DRIVER])
    data.replace_claims([claim("ns/a", 1, "gpu-0")])
    assert data.devices("node-a").allocated == {"gpu-0": "ns/a"}
    assert data.put_claim(claim("ns/a", 1, "gpu-1"))
    assert not data.put_claim(claim("ns/a", 1, "gpu-1"))  # no change, no event
    assert data.devices("node-a").allocated == {"gpu-1": "ns/a"}
    assert data.delete_claim("ns/a")
    assert data.devices("node-a") is NO_DEVICES
    data.replace_rules({"r": ("node-a", "gpu-2", UTIL_TAINT)})
    assert data.devices("node-a").taints == {"gpu-2": (UTIL_TAINT,)}
    assert data.put_rule("r", None)
    assert data.devices("node-a") is NO_DEVICES


# ------------------------------------------------------------------------------- the request path
class _Source:
    def __init__(self, data: DraData) -> None:
        self.data = data
        self.claims_ready = data.claims_ready

    def claim(self, namespace: str, name: str) -> ClaimInfo | None:
        return self.data.claim(namespace, name)

    def template(self, namespace: str, name: str) -> ClaimInfo | None:
        return self.data.template(namespace, name)

    def devices(self, pool: str) -> NodeDevices:
        return self.data.devices(pool)


def test_dra_pod_from_claims_unknown_claims_and_an_unlisted_watch() -> None:
    data = DraData(driver=DRIVER, device_classes=[DRIVER])
    base = msgspec.structs.replace(pod(gpus=0), claim_names=("c", "unknown", "nic"))
    assert dra_pod(base, data, extended=False) is base  # not listed yet
    data.replace_claims([claim("default/c", 2), claim("default/nic", 0)])
    judged = dra_pod(base, data, extended=False)
    assert judged.dra is not None
    assert judged.gpu_request == 2
    assert judged.dra.missing == ("unknown",)
    assert dra_pod(pod(gpus=1), data, extended=False).dra is None
    extended = dra_pod(pod(gpus=2), data, extended=True)
    assert extended.dra == DraPod((), (), 2)
    assert extended.gpu_request == 2


def _claim_pod_doc(claim_name: str) -> dict[str, Any]:
    return {
        "metadata": {"name": "p", "namespace": "default", "uid": "u1"},
        "spec": {
            "containers": [{"name": "main"}],
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}],
        },
        "status": {"resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": claim_name}]},
    }


def test_app_filters_a_claim_pod_on_the_devices_left() -> None:
    data = DraData(driver=DRIVER, device_classes=[DRIVER])
    data.replace_claims([claim("default/p-gpu", 1), claim("default/x", 1, "gpu-0")])
    data.replace_rules({f"r{i}": ("node-a", f"gpu-{i}", UTIL_TAINT) for i in range(1, 4)})
    nodes = [
        gpu_node("node-a", runs((4, COOL), (4, HOT))),
        gpu_node("node-b", runs((8, COOL))),
    ]
    items = [{"metadata": {"name": n.name, "annotations": dict(n.annotations)}} for n in nodes]
    body = json.dumps(
        {"Pod": _claim_pod_doc("p-gpu"), "Nodes": {"items": items}, "NodeNames": None}
    ).encode()
    app = ScorerApp(policy=POLICY, clock=fixed_clock(NOW), dra=data)
    reply = json.loads(app.handle("filter", body).body)
    assert [n["metadata"]["name"] for n in reply["Nodes"]["items"]] == ["node-b"]
    assert reply["FailedNodes"] == {"node-a": "no gpu at or below utilization 0.90"}
    # The same pod without a DRA watch asks for no GPU: both nodes pass.
    plain = ScorerApp(policy=POLICY, clock=fixed_clock(NOW))
    assert len(json.loads(plain.handle("filter", body).body)["Nodes"]["items"]) == 2
    rendered = app.metrics.render()[0].decode()
    counted = 'outcome="failed",reason="no gpu at or below utilization 0.90"} 1.0'
    assert f"gpu_scorer_filter_verdicts_total{{{counted}" in rendered
    scores = json.loads(app.handle("prioritize", body).body)
    assert {s["Host"]: s["Score"] for s in scores}["node-a"] == 0


def test_a_claim_not_seen_yet_is_read_from_its_template() -> None:
    """The pod's status names its claim before the claim's event arrives: until it does, the
    claim is judged on the template it is made from; the claim itself once seen."""
    data = DraData(driver=DRIVER, device_classes=[DRIVER])
    data.replace_claims([claim("default/x", 1, "gpu-0")])
    data.replace_templates([claim("default/two-gpus", 2)])
    base = msgspec.structs.replace(
        pod(gpus=0), claim_names=("p-gpu",), claim_templates=(("p-gpu", "two-gpus"),)
    )
    judged = dra_pod(base, data, extended=False)
    assert judged.dra == DraPod((claim("default/p-gpu", 2),), from_templates=("p-gpu",))
    assert judged.gpu_request == 2
    data.put_claim(claim("default/p-gpu", 1, "gpu-5"))
    seen = dra_pod(base, data, extended=False)
    assert seen.dra == DraPod((claim("default/p-gpu", 1, "gpu-5"),))
    # Made from a template the watch does not know: as before the watch, no GPU.
    other = msgspec.structs.replace(base, claim_templates=(("p-gpu", "absent"),))
    assert data.delete_claim("default/p-gpu")
    assert dra_pod(other, data, extended=False) is other
    assert data.delete_template("default/two-gpus")
    assert dra_pod(base, data, extended=False) is base


def test_app_filters_a_claim_pod_whose_claim_is_not_seen_yet_on_its_template() -> None:
    """A claim pod of a burst whose claim's event has not arrived: judged on its template's
    request, so it fails the node whose only free GPUs are hot, and explain says so."""
    data = DraData(driver=DRIVER, device_classes=[DRIVER])
    data.replace_rules({})
    nodes = [
        gpu_node("node-a", runs((4, COOL), (4, HOT))),
        gpu_node("node-b", runs((8, COOL))),
    ]
    held = [claim(f"default/h{i}", 1, f"gpu-{i}") for i in range(4)]
    data.replace_claims(held)
    items = [{"metadata": {"name": n.name, "annotations": dict(n.annotations)}} for n in nodes]
    document = {"Pod": _claim_pod_doc("p-gpu"), "Nodes": {"items": items}, "NodeNames": None}
    body = json.dumps(document).encode()
    app = ScorerApp(policy=POLICY, clock=fixed_clock(NOW), dra=data)
    # Neither the claim nor its template seen: a pod without GPUs, both nodes pass.
    assert len(json.loads(app.handle("filter", body).body)["Nodes"]["items"]) == 2
    data.replace_templates([claim("default/one-gpu", 1)])
    reply = json.loads(app.handle("filter", body).body)
    assert [n["metadata"]["name"] for n in reply["Nodes"]["items"]] == ["node-b"]
    assert reply["FailedNodes"] == {"node-a": "no gpu at or below utilization 0.90"}
    explained = json.loads(app.handle("explain", body).body)
    assert explained["pod"]["dra"]["claims_read_from_templates"] == ["p-gpu"]
    assert explained["pod"]["dra"]["unknown_claims"] == []
    assert explained["pod"]["dra"]["claims"][0]["claim"] == "default/p-gpu"


def test_the_template_watch_keeps_what_a_claim_made_from_it_asks() -> None:
    data = DraData(driver=DRIVER, device_classes=[DRIVER])
    data.replace_templates([])
    watch = TemplateWatch(data, "v1", metrics=None, tuning=None, rng=None, api=object())
    template = {
        "metadata": {"name": "t", "namespace": "ns", "resourceVersion": "7"},
        "spec": {"metadata": {"labels": {"a": "b"}}, "spec": CLAIM_V1["spec"]},
    }
    watch._apply(json.dumps({"type": "ADDED", "object": template}).encode())
    kept = data.template("ns", "t")
    assert kept is not None
    assert (kept.ref, kept.gpus, kept.allocated) == ("ns/t", 2, ())
    assert kept.tolerations == (Toleration(PREFIX + "utilization", "Exists"),)
    watch._apply(json.dumps({"type": "DELETED", "object": template}).encode())
    assert data.template("ns", "t") is None


# ------------------------------------------------------------------------------- faults at start
class _ApiError(Exception):
    def __init__(self, status: int) -> None:
        super().__init__(f"HTTP {status}")
        self.status = status


class _Response:
    def __init__(self, body: dict[str, Any]) -> None:
        self.data = json.dumps(body).encode()

    def release_conn(self) -> None:
        pass


class _Client:
    """The client's `call_api` as discovery uses it: a scripted answer per path."""

    def __init__(self, answers: dict[str, list[Any]]) -> None:
        self.answers = answers
        self.calls: list[str] = []

    def call_api(self, path: str, method: str, **_: Any) -> _Response:
        self.calls.append(path)
        queue = self.answers[path]
        answer = queue.pop(0) if len(queue) > 1 else queue[0]
        if isinstance(answer, Exception):
            raise answer
        return _Response(answer)


class _Api:
    def __init__(self, client: _Client) -> None:
        self.api_client = client


FAST = CacheTuning(backoff_initial_s=0.01, backoff_max_s=0.02)


def test_without_the_dra_api_one_line_and_no_watch(caplog: pytest.LogCaptureFixture) -> None:
    client = _Client({"/apis/resource.k8s.io": [_ApiError(404)]})
    with caplog.at_level(logging.INFO, logger="exporter_scheduler.dracache"):
        cache = DraCache(driver=DRIVER, device_classes=[DRIVER], api=_Api(client), tuning=FAST)
        with cache:
            assert cache.wait_until(lambda c: c.absent is not None, 10.0)
    assert cache.absent == "the API server serves no resource.k8s.io ResourceClaims"
    assert not cache.ready
    assert client.calls == ["/apis/resource.k8s.io"]
    lines = [r.getMessage() for r in caplog.records]
    assert lines == ["DRA pods judged as other pods: no DRA data"]


def test_discovery_retries_api_errors_then_finds_the_resources() -> None:
    """An API error is not an answer: discovery raises (the cache retries with back-off), and
    the next try finds what is served."""
    group = {"versions": [{"version": "v1"}]}
    resources = {"resources": [{"name": "resourceclaims"}, {"name": "resourceclaimtemplates"}]}
    client = _Client(
        {
            "/apis/resource.k8s.io": [_ApiError(503), group],
            "/apis/resource.k8s.io/v1": [resources],
        }
    )
    with pytest.raises(_ApiError):
        discover(_Api(client))
    assert discover(_Api(client)) == {"resourceclaims": "v1", "resourceclaimtemplates": "v1"}
    retried = _Client(
        {
            "/apis/resource.k8s.io": [_ApiError(503), group],
            "/apis/resource.k8s.io/v1": [resources],
        }
    )
    cache = DraCache(driver=DRIVER, device_classes=[DRIVER], api=_Api(retried), tuning=FAST)
    # Discovery succeeds on its second try and starts the claim watch (whose LIST this fake
    # client cannot answer: it retries until stopped).
    with cache:
        assert cache.wait_until(lambda c: c.absent is not None, 10.0)
    assert retried.calls[:2] == ["/apis/resource.k8s.io", "/apis/resource.k8s.io"]
    assert cache.absent == "the API server serves no resource.k8s.io DeviceTaintRules"


def test_a_malformed_claim_event_is_skipped_and_the_rest_applied(
    caplog: pytest.LogCaptureFixture,
) -> None:
    data = DraData(driver=DRIVER, device_classes=[DRIVER])
    data.replace_claims([])
    watch = ClaimWatch(data, "v1", metrics=None, tuning=None, rng=None, api=object())
    bad = {"type": "ADDED", "object": {**CLAIM_V1, "spec": {"devices": {"requests": "x"}}}}
    with caplog.at_level(logging.WARNING):
        watch._apply(json.dumps(bad).encode())
    assert len(data) == 0
    assert "undecodable claim watch event skipped" in caplog.text
    watch._apply(json.dumps({"type": "ADDED", "object": CLAIM_V1}).encode())
    assert data.devices("node-a").allocated == {"gpu-1": "ns/c", "gpu-4": "ns/c"}
    watch._apply(json.dumps({"type": "DELETED", "object": CLAIM_V1}).encode())
    assert data.devices("node-a") is NO_DEVICES


class _HeldStream:
    """A watch response whose one event comes when the test releases it: the watch's read
    waits on the server meanwhile, as an idle watch's does."""

    def __init__(self, line: bytes) -> None:
        self.line = line
        self.reading = threading.Event()  # the watch is waiting on its read
        self.release = threading.Event()

    def stream(self, **_: Any) -> Iterator[bytes]:
        self.reading.set()
        self.release.wait()
        yield self.line + b"\n"

    def release_conn(self) -> None:
        pass


class _BatchedClaimWatch(ClaimWatch):
    batched = True


@pytest.mark.parametrize("watch_type", [ClaimWatch, _BatchedClaimWatch])
def test_a_claims_allocation_is_applied_as_it_comes_whatever_the_batch(
    watch_type: type[ClaimWatch],
) -> None:
    """A claim's allocation has no proposal to stand in for it until it is seen, so the claim
    watch applies each event as it comes, though a batch is set (`CacheTuning.event_batch_s`);
    the same stream on a batched watch holds it for the batch."""
    data = DraData(driver=DRIVER, device_classes=[DRIVER])
    data.replace_claims([])
    tuning = CacheTuning(event_batch_s=600.0)
    watch = watch_type(data, "v1", metrics=None, tuning=tuning, rng=None, api=object())
    response = _HeldStream(json.dumps({"type": "ADDED", "object": CLAIM_V1}).encode())
    watch._list = lambda **_: response  # type: ignore[method-assign]
    thread = threading.Thread(target=watch._watch_once, daemon=True)
    thread.start()
    assert response.reading.wait(30.0)
    # The read has waited on the "server" far longer than a buffered read takes (2 ms).
    time.sleep(0.05)
    response.release.set()
    thread.join(timeout=0.5 if watch_type is _BatchedClaimWatch else 30.0)
    try:
        if watch_type is ClaimWatch:
            assert not thread.is_alive()
            assert data.devices("node-a").allocated == {"gpu-1": "ns/c", "gpu-4": "ns/c"}
        else:
            assert thread.is_alive()  # waiting out the 600 s batch, the event not applied
            assert data.devices("node-a") is NO_DEVICES
    finally:
        watch._stop.set()
        thread.join(timeout=30.0)
    assert not thread.is_alive()
