"""Live GPU state steers kube-scheduler's DRA allocator, on a real control plane.

The test plays NVIDIA's DRA driver (a ResourceSlice per node, pool named after the node, each GPU
a device `gpu-<minor>` with a `uuid` attribute) and the resourceclaim controller (a claim per pod
from a ResourceClaimTemplate, named in the pod's status), which do not run here. The agent's DRA
side runs in this process with the real client, under the chart's RBAC and admission policy and
a pod-bound token; its GPU readings are set by the test. The real kube-scheduler allocates, and
its choices are read from each claim's `status.allocation`.

The control plane is the newest built: Kubernetes 1.37 serves DeviceTaintRule as
resource.k8s.io/v1; on 1.36 it is resource.k8s.io/v1beta2, off by default, and the test turns on
the DRADeviceTaints and DRADeviceTaintRules feature gates (API server and scheduler) and the
v1beta2 API (API server).
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import json
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

import pytest

from agent.daemon import Agent
from agent.dra import TaintPolicy
from agent.dra_api import DraClient
from agent.kube import ForbiddenError, api_client_for
from agent.metrics import AgentMetrics
from agent.records import GpuReading, NodeReading
from agent.simulated import SimulatedSource
from agent.tainter import DeviceTainter, DraState
from exporter_scheduler.core.dra import ANY_DEVICE, NO_DEVICES
from exporter_scheduler.edges.dracache import DraCache
from loopback_cluster.control_plane import (
    ApiError,
    BuildSpec,
    ControlPlane,
    ExtenderConfig,
    KubeApi,
    SchedulerConfig,
    free_port,
    running_control_plane,
)
from loopback_cluster.workload import (
    ScorerProcess,
    per_gpu_node_state,
    publish,
    running,
    scorer_process,
    wait_for,
)
from tests.deploy.chart_support import NAMESPACE, Rendered, parse_manifests, template
from tests.deploy.image_support import (
    chart_container,
    image_process,
    mounted_image,
    service_account_files,
)
from tests.e2e.support import (
    WATCH_SYNC_S,
    AgentIdentity,
    Scope,
    explain_nodes,
    installed_agent,
    require_control_plane,
)

DRIVER = "gpu.nvidia.com"
PREFIX = "gpu-scheduler.example.com/"
SCHEDULER = "dra-e2e"
# The scheduler that calls the scorer, with DRA judging on (no managedResources).
SCORED_SCHEDULER = "dra-scored-e2e"
# A DeviceClass that backs the GPU extended resource with DRA (extendedResourceName); pods that
# request nvidia.com/gpu on a node without a device plugin get a claim the scheduler makes.
EXTENDED_CLASS = "gpu-extended.nvidia.com"
GPU_RESOURCE = "nvidia.com/gpu"
GPUS = 8
BURST = 20
CLAIM_NAME = "gpu"
TEMPLATE = "one-gpu"
GATE = "e2e.example.com/claims-ready"
RESOURCE = "/apis/resource.k8s.io"
T0 = datetime(2026, 12, 3, 10, 0, tzinfo=UTC)
# v1.36 serves DeviceTaintRule as v1beta2, behind these gates on the API server and the scheduler;
# from v1.37 it is GA (resource.k8s.io/v1) and on by default.
BETA_GATES: Final = {"DRADeviceTaints": True, "DRADeviceTaintRules": True}
BETA_API: Final = ("resource.k8s.io/v1beta2=true",)


@pytest.fixture(scope="module")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """This module's own control plane (overrides the suite's): the version the matrix chose,
    with DeviceTaintRule's gates where that version still has them behind gates."""
    require_control_plane()
    beta = BuildSpec.for_version().release < (1, 37)
    with running_control_plane(
        tmp_path_factory.mktemp("dra-plane"),
        feature_gates=BETA_GATES if beta else None,
        runtime_config=BETA_API if beta else (),
    ) as plane:
        plane.start_scheduler(SchedulerConfig(SCHEDULER))
        with plane.admin() as api:
            api.create(
                f"{RESOURCE}/v1/deviceclasses",
                {
                    "metadata": {"name": DRIVER},
                    "spec": {
                        "selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]
                    },
                },
            )
            api.create(
                f"{RESOURCE}/v1/namespaces/default/resourceclaimtemplates",
                {
                    "metadata": {"name": TEMPLATE},
                    "spec": {
                        "spec": {
                            "devices": {
                                "requests": [
                                    {"name": CLAIM_NAME, "exactly": {"deviceClassName": DRIVER}}
                                ]
                            }
                        }
                    },
                },
            )
        yield plane


def uuid_of(minor: int) -> str:
    return f"GPU-5f3c1e2a-0000-4000-8000-{minor:012d}"


def publish_slice(api: KubeApi, node: str, uuids: list[str] | None = None) -> None:
    """The ResourceSlice NVIDIA's DRA driver publishes for `node` (resource.k8s.io/v1)."""
    uuids = uuids or [uuid_of(minor) for minor in range(GPUS)]
    api.create(
        f"{RESOURCE}/v1/resourceslices",
        {
            "metadata": {"name": f"{node}-{DRIVER}"},
            "spec": {
                "driver": DRIVER,
                "nodeName": node,
                "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                "devices": [
                    {
                        "name": f"gpu-{minor}",
                        "attributes": {
                            "type": {"string": "gpu"},
                            "uuid": {"string": uuids[minor]},
                            "productName": {"string": "NVIDIA H100 80GB HBM3"},
                        },
                        "capacity": {"memory": {"value": "80Gi"}},
                    }
                    for minor in range(GPUS)
                ],
            },
        },
    )


@dataclass
class SetSource:
    """A GPU source whose readings the test sets: (utilization, temperature) per minor."""

    gpus: dict[int, tuple[float, int]] = field(
        default_factory=lambda: dict.fromkeys(range(GPUS), (0.10, 45))
    )

    def read(self, now: datetime) -> NodeReading:
        return NodeReading(
            sampled_at=now,
            gpus=tuple(
                GpuReading(uuid_of(m), m, "NVIDIA H100 80GB HBM3", u, 81559, 80000, t)
                for m, (u, t) in sorted(self.gpus.items())
            ),
            device_count=GPUS,
            lost=tuple(f"gpu {m}: lost" for m in range(GPUS) if m not in self.gpus),
        )

    def close(self) -> None:
        pass


@dataclass
class DraAgent:
    agent: Agent
    tainter: DeviceTainter
    source: SetSource
    now_s: float = 0.0

    def tick(self, *, after_s: float) -> None:
        self.now_s += after_s
        self.agent.tick(now_s=self.now_s, wall_now=T0)


@pytest.fixture
def identity(scope: Scope) -> Iterator[AgentIdentity]:
    with installed_agent(scope, policies=("agent-own-device-taints",)) as found:
        publish_slice(scope.api, found.own_node)
        try:
            yield found
        finally:
            scope.api.delete(f"{RESOURCE}/v1/resourceslices/{found.own_node}-{DRIVER}")


@pytest.fixture
def dra_agent(
    identity: AgentIdentity, control_plane: ControlPlane, tmp_path: Path
) -> Iterator[DraAgent]:
    kubeconfig = control_plane.token_kubeconfig(tmp_path / "agent.kubeconfig", identity.token)
    api_client = api_client_for(str(kubeconfig))
    metrics = AgentMetrics()
    source = SetSource()
    tainter = DeviceTainter(
        DraClient(api_client, node_name=identity.own_node),
        node_name=identity.own_node,
        driver=DRIVER,
        prefix=PREFIX,
        policy=TaintPolicy(),
        metrics=metrics,
    )
    agent = Agent(source=source, writer=None, metrics=metrics, start_s=0.0, tainter=tainter)
    try:
        yield DraAgent(agent, tainter, source)
    finally:
        version = tainter.api.rules_version if tainter.api is not None else "v1"
        with control_plane.admin() as api:
            for device in rules(control_plane, identity.own_node):
                name = f"gpu-scheduler.{identity.own_node}.{device}"
                api.delete(f"{RESOURCE}/{version}/devicetaintrules/{name}")
        api_client.close()


def rules(plane: ControlPlane, node: str) -> dict[str, str]:
    """device -> taint key of the DeviceTaintRules naming `node`'s pool, as the server holds."""
    with plane.admin() as api:
        for version in ("v1", "v1beta2"):
            status, _ = api.raw("GET", f"{RESOURCE}/{version}/devicetaintrules")
            if status == 200:
                items = api.get(f"{RESOURCE}/{version}/devicetaintrules")["items"]
                return {
                    r["spec"]["deviceSelector"]["device"]: r["spec"]["taint"]["key"]
                    for r in items
                    if r["spec"]["deviceSelector"].get("pool") == node
                }
    raise AssertionError("no DeviceTaintRule API served")


# ----------------------------------------------------------------------------- claims and pods


def claim_pods(
    scope: Scope, prefix: str, count: int, *, scheduler: str = SCHEDULER, cpu: str | None = None
) -> list[str]:
    """`count` pods, each with a claim from the template made as the resourceclaim controller
    makes it; each pod is held by a scheduling gate until its claim is ready, then released."""
    api = scope.api
    template = api.get(f"{RESOURCE}/v1/namespaces/default/resourceclaimtemplates/{TEMPLATE}")
    names = []
    for index in range(count):
        name = scope.name(f"{prefix}-{index}")
        scope.pod(
            {
                "metadata": {"name": name},
                "spec": {
                    "schedulerName": scheduler,
                    "schedulingGates": [{"name": GATE}],
                    "terminationGracePeriodSeconds": 0,
                    "resourceClaims": [{"name": CLAIM_NAME, "resourceClaimTemplateName": TEMPLATE}],
                    "containers": [
                        {
                            "name": "cuda",
                            "image": "nvcr.io/nvidia/cuda:12.4.1-base-ubuntu22.04",
                            "resources": {
                                "claims": [{"name": CLAIM_NAME}],
                                **({"requests": {"cpu": cpu}} if cpu else {}),
                            },
                        }
                    ],
                },
            }
        )
        pod = api.get(f"/api/v1/namespaces/default/pods/{name}")
        claim = f"{name}-{CLAIM_NAME}"
        api.create(
            f"{RESOURCE}/v1/namespaces/default/resourceclaims",
            {
                "metadata": {
                    "name": claim,
                    "annotations": {"resource.kubernetes.io/pod-claim-name": CLAIM_NAME},
                    "ownerReferences": [
                        {
                            "apiVersion": "v1",
                            "kind": "Pod",
                            "name": name,
                            "uid": pod["metadata"]["uid"],
                            "controller": True,
                            "blockOwnerDeletion": True,
                        }
                    ],
                },
                "spec": template["spec"]["spec"],
            },
        )
        api.merge_patch(
            f"/api/v1/namespaces/default/pods/{name}/status",
            {
                "status": {
                    "resourceClaimStatuses": [{"name": CLAIM_NAME, "resourceClaimName": claim}]
                }
            },
        )
        names.append(name)
    for name in names:
        api.merge_patch(
            f"/api/v1/namespaces/default/pods/{name}", {"spec": {"schedulingGates": []}}
        )
    return names


def outcome(api: KubeApi, pods: list[str]) -> dict[str, str | None] | None:
    """pod -> allocated device (None: unschedulable), once the scheduler tried every pod."""
    found: dict[str, str | None] = {}
    for name in pods:
        pod = api.get(f"/api/v1/namespaces/default/pods/{name}")
        claim = api.get(f"{RESOURCE}/v1/namespaces/default/resourceclaims/{name}-{CLAIM_NAME}")
        allocation = claim.get("status", {}).get("allocation")
        if pod["spec"].get("nodeName") and allocation:
            (result,) = allocation["devices"]["results"]
            found[name] = str(result["device"])
            continue
        conditions = pod.get("status", {}).get("conditions", [])
        if any(
            c["type"] == "PodScheduled"
            and c["status"] == "False"
            and c["reason"] == "Unschedulable"
            for c in conditions
        ):
            found[name] = None
            continue
        return None
    return found


def release(api: KubeApi, pods: list[str]) -> None:
    """Delete the pods, then their claims. No controller removes the claims' finalizers here,
    so this does, until each claim is gone: a scheduling cycle already under way for a pod
    being deleted (one retried once an earlier pod's GPU was freed) may still write its claim's
    allocation, and with it the scheduler's finalizer, after a first removal."""
    for name in pods:
        api.delete(f"/api/v1/namespaces/default/pods/{name}?gracePeriodSeconds=0")
    claims = f"{RESOURCE}/v1/namespaces/default/resourceclaims"
    for name in pods:
        api.delete(f"{claims}/{name}-{CLAIM_NAME}")
    wanted = {f"{name}-{CLAIM_NAME}" for name in pods}

    def gone() -> bool:
        left = [c for c in api.get(claims)["items"] if c["metadata"]["name"] in wanted]
        for claim in left:
            path = f"{claims}/{claim['metadata']['name']}"
            if claim["metadata"].get("finalizers"):
                with contextlib.suppress(ApiError):  # gone meanwhile: the next listing says so
                    api.merge_patch(path, {"metadata": {"finalizers": None}})
            if not claim["metadata"].get("deletionTimestamp"):
                api.delete(path)
        return not left

    wait_for("the burst's claims to be gone", gone, timeout_s=30)


def burst(scope: Scope, prefix: str) -> dict[str, str | None]:
    pods = claim_pods(scope, prefix, BURST)
    result = wait_for(
        f"the scheduler to try all {BURST} pods",
        lambda: outcome(scope.api, pods),
        timeout_s=90,
        interval_s=0.5,
    )
    release(scope.api, pods)
    return result


def pinned_claim_pod(
    scope: Scope, short_name: str, device_uuid: str, *, tolerate: str | None
) -> str:
    """A pod with its own claim for the GPU of `device_uuid`, tolerating the key `tolerate`."""
    request: dict[str, Any] = {
        "deviceClassName": DRIVER,
        "selectors": [
            {"cel": {"expression": f'device.attributes["{DRIVER}"].uuid == "{device_uuid}"'}}
        ],
    }
    if tolerate is not None:
        request["tolerations"] = [{"key": tolerate, "operator": "Exists", "effect": "NoSchedule"}]
    name = scope.name(short_name)
    scope.api.create(
        f"{RESOURCE}/v1/namespaces/default/resourceclaims",
        {
            "metadata": {"name": f"{name}-{CLAIM_NAME}"},
            "spec": {"devices": {"requests": [{"name": CLAIM_NAME, "exactly": request}]}},
        },
    )
    scope.pod(
        {
            "metadata": {"name": name},
            "spec": {
                "schedulerName": SCHEDULER,
                "terminationGracePeriodSeconds": 0,
                "resourceClaims": [
                    {"name": CLAIM_NAME, "resourceClaimName": f"{name}-{CLAIM_NAME}"}
                ],
                "containers": [
                    {
                        "name": "cuda",
                        "image": "nvcr.io/nvidia/cuda:12.4.1-base-ubuntu22.04",
                        "resources": {"claims": [{"name": CLAIM_NAME}]},
                    }
                ],
            },
        }
    )
    return name


_probes = itertools.count()


def scheduler_sees(scope: Scope, device_uuid: str, *, tainted: bool) -> None:
    """Wait until kube-scheduler's view of the GPU's taint is `tainted`, read from its own
    allocations: a probe claim for that GPU alone is refused while the scheduler has the rule and
    allocated once it has the deletion. A probe that shows the old view is released and retried
    (a fresh pod is tried at once; a refused one would wait in the unschedulable queue)."""

    def probe() -> bool:
        name = pinned_claim_pod(scope, f"probe-{next(_probes)}", device_uuid, tolerate=None)
        found = wait_for(
            "the scheduler to try the probe",
            lambda: outcome(scope.api, [name]),
            timeout_s=30,
            interval_s=0.2,
        )
        release(scope.api, [name])
        return (found[name] is None) == tainted

    wait_for(f"the scheduler to see the taint {'on' if tainted else 'off'}", probe, timeout_s=60)


# ----------------------------------------------------------------------------- tests


def test_allocator_skips_tainted_gpus_while_a_cool_one_fits_and_takes_a_recovered_one(
    dra_agent: DraAgent, identity: AgentIdentity, control_plane: ControlPlane, scope: Scope
) -> None:
    node = identity.own_node
    source = dra_agent.source
    dra_agent.tick(after_s=5)
    assert str(dra_agent.tainter.state) == DraState.ACTIVE.value
    assert dra_agent.tainter.api is not None
    assert dra_agent.tainter.api.rules_version == (
        "v1" if control_plane.spec.release >= (1, 37) else "v1beta2"
    )
    assert rules(control_plane, node) == {}

    # gpu-0 busy, gpu-2 hot, gpu-4 lost: first fit would take gpu-0 first.
    source.gpus[0] = (0.97, 60)
    source.gpus[2] = (0.30, 88)
    del source.gpus[4]
    dra_agent.tick(after_s=5)
    tainted = {
        "gpu-0": PREFIX + "utilization",
        "gpu-2": PREFIX + "temperature",
        "gpu-4": PREFIX + "health",
    }
    assert rules(control_plane, node) == tainted
    # Owned by the Node, as the driver's slices are: collected with it.
    version = dra_agent.tainter.api.rules_version
    held = scope.api.get(f"{RESOURCE}/{version}/devicetaintrules/gpu-scheduler.{node}.gpu-0")
    node_uid = scope.api.get(f"/api/v1/nodes/{node}")["metadata"]["uid"]
    assert held["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Node", "name": node, "uid": node_uid}
    ]
    # The last rule written (gpu-4's): once the scheduler honours it, it has the others too.
    scheduler_sees(scope, uuid_of(4), tainted=True)

    first = burst(scope, "a")
    allocated = [d for d in first.values() if d is not None]
    cool = {f"gpu-{m}" for m in range(GPUS)} - set(tainted)
    assert sorted(allocated) == sorted(cool), first  # every cool GPU, no tainted one
    assert sum(d is None for d in first.values()) == BURST - len(cool)

    # gpu-0 cools down inside the margin (held), then below it; the write waits its minute.
    source.gpus[0] = (0.85, 60)
    dra_agent.tick(after_s=5)
    assert "gpu-0" in rules(control_plane, node)
    source.gpus[0] = (0.10, 45)
    dra_agent.tick(after_s=5)
    assert "gpu-0" in rules(control_plane, node)
    dra_agent.tick(after_s=60)
    assert rules(control_plane, node) == {k: v for k, v in tainted.items() if k != "gpu-0"}
    scheduler_sees(scope, uuid_of(0), tainted=False)

    second = burst(scope, "b")
    allocated = [d for d in second.values() if d is not None]
    assert sorted(allocated) == sorted(cool | {"gpu-0"}), second


def test_agent_cannot_write_a_rule_for_another_nodes_pool(
    dra_agent: DraAgent, identity: AgentIdentity, control_plane: ControlPlane
) -> None:
    dra_agent.tick(after_s=5)
    api = dra_agent.tainter.api
    assert api is not None
    client = dra_agent.tainter.client
    foreign_name = f"gpu-scheduler.{identity.other_node}.gpu-0"
    foreign: dict[str, Any] = {
        "apiVersion": f"resource.k8s.io/{api.rules_version}",
        "kind": "DeviceTaintRule",
        "metadata": {"name": foreign_name},
        "spec": {
            "deviceSelector": {"driver": DRIVER, "pool": identity.other_node, "device": "gpu-0"},
            "taint": {"key": PREFIX + "utilization", "effect": "NoSchedule"},
        },
    }

    def refused() -> ForbiddenError | None:
        try:
            client.apply_rule(api, foreign)
        except ForbiddenError as error:
            return error
        # Allowed before the policy informer had the binding: undo and ask again.
        with control_plane.admin() as admin:
            admin.delete(f"{RESOURCE}/{api.rules_version}/devicetaintrules/{foreign_name}")
        return None

    error = wait_for("the admission policy to refuse", refused, timeout_s=15, interval_s=0.2)
    assert "may taint only devices of its own node's pool" in str(error)
    evicting = {**foreign, "metadata": {"name": f"gpu-scheduler.{identity.own_node}.gpu-1"}}
    evicting["spec"] = {
        "deviceSelector": {"driver": DRIVER, "pool": identity.own_node, "device": "gpu-1"},
        "taint": {"key": PREFIX + "utilization", "effect": "NoExecute"},
    }
    with pytest.raises(ForbiddenError, match="may only taint NoSchedule"):
        client.apply_rule(api, evicting)
    assert rules(control_plane, identity.other_node) == {}


def test_a_claim_that_tolerates_the_key_may_get_a_tainted_gpu(
    dra_agent: DraAgent, identity: AgentIdentity, control_plane: ControlPlane, scope: Scope
) -> None:
    dra_agent.source.gpus[3] = (0.99, 60)
    dra_agent.tick(after_s=5)
    assert rules(control_plane, identity.own_node) == {"gpu-3": PREFIX + "utilization"}
    scheduler_sees(scope, uuid_of(3), tainted=True)
    plain = pinned_claim_pod(scope, "plain", uuid_of(3), tolerate=None)
    tolerant = pinned_claim_pod(scope, "tolerant", uuid_of(3), tolerate=PREFIX + "utilization")
    pods = [plain, tolerant]
    result = wait_for(
        "the scheduler to try both pods",
        lambda: outcome(scope.api, pods),
        timeout_s=60,
        interval_s=0.5,
    )
    release(scope.api, pods)
    assert result == {plain: None, tolerant: "gpu-3"}


def test_the_agent_binary_taints_a_lost_gpu_through_the_chart_rbac_and_policy(
    identity: AgentIdentity, control_plane: ControlPlane, scope: Scope, tmp_path: Path
) -> None:
    """`gpu-agent run` from the built image, as the chart's pod spec runs it (its user, its
    environment, a read-only root, the service-account files of its identity), on a simulated
    source losing a GPU."""
    seed = 3
    simulated = SimulatedSource(gpus=GPUS, seed=seed)
    uuids = [gpu.uuid for gpu in simulated.read(T0).gpus]
    simulated.close()
    # The driver numbers the GPUs against NVML's order (device gpu-<7-i> is GPU i, as minor
    # numbers may run): the agent finds each GPU's device by UUID.
    names = [f"gpu-{GPUS - 1 - index}" for index in range(GPUS)]
    lost = names[seed % GPUS]  # the simulated source loses GPU seed % gpus
    # The agent's token is bound to identity.own_node; run it as that node with the slice of
    # the simulated GPUs instead of the test's own.
    scope.api.delete(f"{RESOURCE}/v1/resourceslices/{identity.own_node}-{DRIVER}")
    publish_slice(scope.api, identity.own_node, uuids[::-1])
    values = {
        "agent": {
            "source": "simulated",
            "simulated": {"gpus": GPUS, "seed": seed},
            # No kubelet here; without its socket the chart runs the agent as its non-root user.
            "podResources": {"enabled": False},
            "sampleIntervalSeconds": 1,
            "minWriteIntervalSeconds": 1,
            "metricsPort": free_port(),
        }
    }
    text = template(values)
    rendered = Rendered(text=text, manifests=parse_manifests(text))
    credentials = service_account_files(
        tmp_path / "serviceaccount",
        token=identity.token,
        ca_file=control_plane.pki.ca_cert,
        namespace=NAMESPACE,
    )
    with mounted_image() as mounted:
        container = chart_container(
            rendered,
            "agent",
            fields={"spec.nodeName": identity.own_node},
            service_account=credentials,
            api_port=control_plane.ports.apiserver,
        )
        # Not chart values: lose the GPU soon, and write its taint within seconds, not the
        # default minute, so that a busy GPU's taint turns into the health one at once.
        container = dataclasses.replace(
            container,
            argv=[*container.argv, "--simulated-lose-gpu-after=3", "--dra-min-write-interval=1"],
        )
        agent = image_process(mounted, container, tmp_path / "agent.log", "gpu-agent")
        with running(agent):

            def health_rule() -> dict[str, str] | None:
                found = rules(control_plane, identity.own_node)
                return found if found.get(lost) == PREFIX + "health" else None

            held = wait_for(f"a health rule on {lost}", health_rule, timeout_s=60, interval_s=0.5)
            # Each GPU's device name on the Node; the lost GPU's is unknown (it reads nothing).
            published = [None if i == seed % GPUS else name for i, name in enumerate(names)]
            wanted = ",".join(name or "-" for name in published)

            def device_names() -> str | None:
                node = scope.api.get(f"/api/v1/nodes/{identity.own_node}")
                text = node["metadata"].get("annotations", {}).get(PREFIX + "per-gpu-dra-device")
                return text if text == wanted else None

            wait_for("the GPUs' device names on the Node", device_names, timeout_s=30)
    assert held[lost] == PREFIX + "health", agent.log()
    assert all(key.startswith(PREFIX) for key in held.values())
    assert "DRA device taints active" in agent.log()
    assert rules(control_plane, identity.other_node) == {}
    with control_plane.admin() as api:
        for device in held:
            api.delete(f"{RESOURCE}/v1/devicetaintrules/gpu-scheduler.{identity.own_node}.{device}")


# ----------------------------------------------------------------------------- with the scorer


@pytest.fixture(scope="module")
def dra_scorer(
    control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ScorerProcess]:
    """`gpu-scorer serve --dra` (names only) and a kube-scheduler calling it for every pod of
    its profile, as the chart registers it with scorer.dra.enabled (no managedResources)."""
    log_dir = tmp_path_factory.mktemp("dra-scorer")
    scorer = scorer_process(
        log_dir,
        kubeconfig=control_plane.admin_kubeconfig,
        name="gpu-scorer-dra",
        extra_args=[
            "--dra",
            f"--dra-device-classes={DRIVER},{EXTENDED_CLASS}",
            "--dra-extended-resource",
            # What these pods add to a GPU, stated rather than the policy's default: node b's
            # GPUs (0.55) must keep room for it under the 0.90 limit.
            "--own-load-gpu-load=0.30",
        ],
    )
    scorer.start()
    try:
        scorer.wait_ready()
        watches = (
            "gpu_scorer_claim_cache_ready",
            "gpu_scorer_claim_template_cache_ready",
            "gpu_scorer_taint_rule_cache_ready",
        )
        wait_for(
            "the scorer's DRA watches to list",
            lambda: all(scorer.metric(m) == 1 for m in watches),
            timeout_s=WATCH_SYNC_S,
        )
        extender = ExtenderConfig(
            scorer.url, node_cache_capable=True, ignorable=False, managed_resource=None
        )
        control_plane.start_scheduler(SchedulerConfig(SCORED_SCHEDULER, extender))
        try:
            yield scorer
        finally:
            control_plane.stop_scheduler(f"kube-scheduler-{SCORED_SCHEDULER}")
    finally:
        scorer.kill()


def allocated_claim(api: KubeApi, name: str, pool: str, device: str) -> str:
    """A claim of another workload holding `device` of `pool`, allocated as the scheduler
    records it (status.allocation), so the allocator and the scorer count it as taken."""
    api.create(
        f"{RESOURCE}/v1/namespaces/default/resourceclaims",
        {
            "metadata": {"name": name, "finalizers": ["resource.kubernetes.io/delete-protection"]},
            "spec": {
                "devices": {
                    "requests": [{"name": CLAIM_NAME, "exactly": {"deviceClassName": DRIVER}}]
                }
            },
        },
    )
    api.merge_patch(
        f"{RESOURCE}/v1/namespaces/default/resourceclaims/{name}/status",
        {
            "status": {
                "allocation": {
                    "devices": {
                        "results": [
                            {
                                "request": CLAIM_NAME,
                                "driver": DRIVER,
                                "pool": pool,
                                "device": device,
                            }
                        ]
                    }
                }
            }
        },
    )
    return name


def scorer_holds(scorer: ScorerProcess, claim: str, pool: str) -> None:
    """Wait until the scorer's watch has `claim`'s allocation of gpu-3 of `pool` (the layout's
    last claim: its watch is in order, so it has the earlier ones too)."""
    probe = {
        "metadata": {"name": "probe", "namespace": "default"},
        "spec": {"resourceClaims": [{"name": CLAIM_NAME, "resourceClaimName": claim}]},
    }
    wait_for(
        "the scorer to hold the other claims' allocations",
        lambda: explained_claims(scorer, probe, [pool]) == [[pool, "gpu-3"]],
        timeout_s=WATCH_SYNC_S,
    )


def explained_dra(scorer: ScorerProcess, pod: dict[str, Any], nodes: list[str]) -> Any:
    """The pod's DRA request as the scorer's explain reports it (`pod.dra`; None for a pod it
    judges without DRA)."""
    body = json.dumps({"Pod": pod, "Nodes": None, "NodeNames": nodes}).encode()
    request = urllib.request.Request(
        f"{scorer.url}/explain", data=body, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        document = json.loads(response.read())
    return document.get("pod", {}).get("dra")


def explained_claims(
    scorer: ScorerProcess, pod: dict[str, Any], nodes: list[str]
) -> list[list[str]] | None:
    """The allocations of the pod's claims as the scorer's explain reports them (None: the
    scorer does not know the pod's claims yet)."""
    dra = explained_dra(scorer, pod, nodes)
    if not dra or not dra["claims"]:
        return None
    return [list(pair) for claim in dra["claims"] for pair in claim["allocated"]]


def pools_of(api: KubeApi, pods: list[str]) -> dict[str, str | None]:
    """pod -> the pool (node) of its claim's device, once every pod is allocated."""

    def allocated() -> dict[str, str | None] | None:
        found: dict[str, str | None] = {}
        for name in pods:
            claim = api.get(f"{RESOURCE}/v1/namespaces/default/resourceclaims/{name}-{CLAIM_NAME}")
            allocation = claim.get("status", {}).get("allocation")
            if not allocation:
                return None
            (result,) = allocation["devices"]["results"]
            found[name] = f"{result['pool']}/{result['device']}"
        return found

    return wait_for(f"{len(pods)} claims to be allocated", allocated, timeout_s=90, interval_s=0.5)


def hot_free_gpus_layout(
    scope: Scope, *, dra_only: bool = False, renumbered: bool = False
) -> tuple[str, str, list[str]]:
    """Nodes a and b (and the other workloads' claims on a, of devices gpu-0..3) as the two
    scored tests lay them out: a's devices of those claims idle, its free ones hot. `dra_only`:
    the nodes advertise no GPU extended resource (no device plugin), so a pod requesting it is
    served by the DeviceClass that names it. `renumbered`: a's driver numbers its devices
    against NVML's order (device gpu-<7-i> is GPU i, as minor numbers may run), and a's agent
    publishes each GPU's device name; else it publishes none and device gpu-<i> is GPU i."""
    api = scope.api
    a, b = scope.node("a", cpu="64"), scope.node("b", cpu="4")
    for node in (a, b):
        if dra_only:
            gone = {GPU_RESOURCE: None}
            api.merge_patch(
                f"/api/v1/nodes/{node}/status",
                {"status": {"allocatable": gone, "capacity": gone}},
            )
        publish_slice(api, node)
    others = [allocated_claim(api, scope.name(f"other-{m}"), a, f"gpu-{m}") for m in range(4)]
    if renumbered:
        names = [f"gpu-{GPUS - 1 - index}" for index in range(GPUS)]
        a_state = per_gpu_node_state([(0.97, None)] * 4 + [(0.0, None)] * 4, dra_devices=names)
    else:
        a_state = per_gpu_node_state([(0.0, None)] * 4 + [(0.97, None)] * 4)
    publish(api, a, a_state)
    publish(api, b, per_gpu_node_state([(0.55, None)] * 8))
    return a, b, others


def remove_layout(api: KubeApi, nodes: list[str], claims: list[str]) -> None:
    for name in claims:
        path = f"{RESOURCE}/v1/namespaces/default/resourceclaims/{name}"
        api.merge_patch(path, {"metadata": {"finalizers": None}})
        api.delete(path)
    for node in nodes:
        api.delete(f"{RESOURCE}/v1/resourceslices/{node}-{DRIVER}")


def test_scorer_keeps_claim_pods_off_a_node_whose_free_gpus_are_hot(
    dra_scorer: ScorerProcess, scope: Scope
) -> None:
    """Node a: its 4 idle GPUs are allocated to other claims, its 4 free ones are hot (no taint
    yet: the agent's write waits its minute). Node a's mean (0.49) is below node b's (0.55, on
    GPUs that still fit a pod's own load) and b has few CPUs, so on node-level data alone and by
    kube-scheduler's own scores a looks better; only the claims show that the allocator would
    hand out a hot GPU there. Node a's device numbers run against its GPUs' order, so the claims
    are matched to GPUs by the device names its agent publishes: read as `gpu-<index>`, the
    claims would hold a's hot GPUs and leave its idle ones free. Every claim pod goes to b;
    explain shows what was counted on a and why."""
    api = scope.api
    a, b, others = hot_free_gpus_layout(scope, renumbered=True)
    try:
        scorer_holds(dra_scorer, others[-1], a)
        scope.settle()
        pods = claim_pods(scope, "scored", 6, scheduler=SCORED_SCHEDULER, cpu="500m")
        placed = pools_of(api, pods)
        assert all(str(device).startswith(f"{b}/") for device in placed.values()), placed
        pod = api.get(f"/api/v1/namespaces/default/pods/{pods[0]}")
        explained = explain_nodes(dra_scorer.url, api, pod, [a, b], names_only=True)
        table_a = explained[a]["gpus"]["table"]
        assert [row["status"] for row in table_a] == ["utilization"] * 4 + ["allocated"] * 4
        assert [row["device"] for row in table_a] == [f"gpu-{GPUS - 1 - i}" for i in range(GPUS)]
        assert explained[a]["verdict"] == "fail"
        assert explained[a]["reason"] == "no gpu at or below utilization 0.90"
        assert explained[b]["verdict"] == "pass"
        assert explained[b]["gpus"]["counted"] != []
        assert explained[b]["gpus"]["allocation_checked"] is True
        release(api, pods)
    finally:
        remove_layout(api, [a, b], others)


def test_a_claim_the_scorer_has_not_seen_is_judged_on_its_template(
    dra_scorer: ScorerProcess,
) -> None:
    """A pod whose status names a claim made from the template, before the claim's event has
    reached the scorer (here: a claim never made): the scorer reads its request from the
    template the API server holds, so the pod is judged as asking 1 GPU, nothing allocated."""
    claim = "probe-gpu-not-made-yet"
    probe = {
        "metadata": {"name": "probe", "namespace": "default"},
        "spec": {"resourceClaims": [{"name": CLAIM_NAME, "resourceClaimTemplateName": TEMPLATE}]},
        "status": {"resourceClaimStatuses": [{"name": CLAIM_NAME, "resourceClaimName": claim}]},
    }
    dra = explained_dra(dra_scorer, probe, [])
    assert dra["claims_read_from_templates"] == [claim]
    assert dra["claims"] == [{"claim": f"default/{claim}", "gpus": 1, "allocated": []}]
    assert dra["unknown_claims"] == []


def extended_claims(api: KubeApi, pods: list[str]) -> dict[str, str] | None:
    """pod -> `pool/device` of the claim the scheduler made for its extended resource, once
    every pod has one allocated (None before)."""
    found: dict[str, str] = {}
    listing = api.get(f"{RESOURCE}/v1/namespaces/default/resourceclaims")["items"]
    for name in pods:
        owned = [
            c
            for c in listing
            if any(o.get("name") == name for o in c["metadata"].get("ownerReferences", []))
        ]
        allocation = owned[0].get("status", {}).get("allocation") if owned else None
        if not allocation:
            return None
        (result,) = allocation["devices"]["results"]
        found[name] = f"{result['pool']}/{result['device']}"
    return found


def test_scorer_keeps_dra_backed_extended_resource_pods_off_hot_free_gpus(
    dra_scorer: ScorerProcess, scope: Scope
) -> None:
    """The same layout, nodes without a device plugin, and a DeviceClass whose
    extendedResourceName is nvidia.com/gpu: pods requesting nvidia.com/gpu get a claim the
    scheduler makes at binding (DRAExtendedResource: beta and on in 1.36, on in 1.37), and the
    scorer (`--dra-extended-resource`) judges them on the devices left as it judges claims."""
    api = scope.api
    api.create(
        f"{RESOURCE}/v1/deviceclasses",
        {
            "metadata": {"name": EXTENDED_CLASS},
            "spec": {
                "selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}],
                "extendedResourceName": GPU_RESOURCE,
            },
        },
    )
    a, b, others = hot_free_gpus_layout(scope, dra_only=True)
    pods: list[str] = []
    try:
        scorer_holds(dra_scorer, others[-1], a)
        scope.settle()
        for index in range(4):
            name = scope.name(f"extended-{index}")
            scope.pod(
                {
                    "metadata": {"name": name},
                    "spec": {
                        "schedulerName": SCORED_SCHEDULER,
                        "terminationGracePeriodSeconds": 0,
                        "containers": [
                            {
                                "name": "cuda",
                                "image": "nvcr.io/nvidia/cuda:12.4.1-base-ubuntu22.04",
                                "resources": {
                                    "requests": {"cpu": "500m", GPU_RESOURCE: "1"},
                                    "limits": {GPU_RESOURCE: "1"},
                                },
                            }
                        ],
                    },
                }
            )
            pods.append(name)
        placed = wait_for(
            "the scheduler's claims for the extended resource to be allocated",
            lambda: extended_claims(api, pods),
            timeout_s=90,
            interval_s=0.5,
        )
        assert all(device.startswith(f"{b}/") for device in placed.values()), placed
        pod = api.get(f"/api/v1/namespaces/default/pods/{pods[0]}")
        pod["spec"].pop("nodeName", None)  # as the scheduler sent it, before binding
        explained = explain_nodes(dra_scorer.url, api, pod, [a, b], names_only=True)
        assert [row["status"] for row in explained[a]["gpus"]["table"]][:4] == ["allocated"] * 4
        assert explained[a]["verdict"] == "fail"
    finally:
        for name in pods:
            api.delete(f"/api/v1/namespaces/default/pods/{name}?gracePeriodSeconds=0")
        listing = api.get(f"{RESOURCE}/v1/namespaces/default/resourceclaims")["items"]
        made = [
            c["metadata"]["name"]
            for c in listing
            if any(o.get("name") in pods for o in c["metadata"].get("ownerReferences", []))
        ]
        remove_layout(api, [a, b], others + made)
        api.delete(f"{RESOURCE}/v1/deviceclasses/{EXTENDED_CLASS}")


def test_the_dra_watch_holds_what_the_api_server_holds(
    control_plane: ControlPlane, scope: Scope
) -> None:
    """The scorer's DRA watch (edges/dracache.py) against the real API server: a claim's GPU
    count, its allocation as the status changes and its deletion; a DeviceTaintRule of the
    driver in the version the server serves (v1 in 1.37, v1beta2 in 1.36), widened to its
    whole pool, and its deletion."""
    api = scope.api
    pool = scope.name("pool")
    rules_version = "v1" if control_plane.spec.release >= (1, 37) else "v1beta2"
    rule_name = scope.name("rule")
    claim_name = scope.name("watched")
    with DraCache(
        driver=DRIVER,
        device_classes=[DRIVER],
        kubeconfig=str(control_plane.admin_kubeconfig),
    ) as cache:
        assert cache.wait_until(lambda c: c.data.claims_ready and c.data.taints_ready, 30.0)
        allocated_claim(api, claim_name, pool, "gpu-2")
        assert cache.wait_until(
            lambda c: c.data.devices(pool).allocated == {"gpu-2": f"default/{claim_name}"}, 30.0
        )
        claim = cache.data.claim("default", claim_name)
        assert claim is not None
        assert claim.gpus == 1
        api.create(
            f"{RESOURCE}/{rules_version}/devicetaintrules",
            {
                "metadata": {"name": rule_name},
                "spec": {
                    "deviceSelector": {"driver": DRIVER, "pool": pool, "device": "gpu-5"},
                    "taint": {"key": PREFIX + "utilization", "effect": "NoSchedule"},
                },
            },
        )
        assert cache.wait_until(
            lambda c: (
                [t.key for t in c.data.devices(pool).taints.get("gpu-5", ())]
                == [PREFIX + "utilization"]
            ),
            30.0,
        )
        # The same rule widened to the whole pool: every device of it.
        api.merge_patch(
            f"{RESOURCE}/{rules_version}/devicetaintrules/{rule_name}",
            {"spec": {"deviceSelector": {"device": None}}},
        )
        assert cache.wait_until(lambda c: list(c.data.devices(pool).taints) == [ANY_DEVICE], 30.0)
        api.delete(f"{RESOURCE}/{rules_version}/devicetaintrules/{rule_name}")
        path = f"{RESOURCE}/v1/namespaces/default/resourceclaims/{claim_name}"
        api.merge_patch(path, {"metadata": {"finalizers": None}})
        api.delete(path)
        assert cache.wait_until(lambda c: c.data.devices(pool) is NO_DEVICES, 30.0)
        assert cache.data.claim("default", claim_name) is None
        assert cache.absent is None
