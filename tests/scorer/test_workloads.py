"""A pod's workload, and what the scorer learns of each workload from its running pods."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

import msgspec
import pytest

from exporter_scheduler.core.decoding import predecode
from exporter_scheduler.core.inflight import BoundPod
from exporter_scheduler.core.records import NodeInput
from exporter_scheduler.core.workload import Owner, workload_of
from exporter_scheduler.edges.podobjects import OBJECT, PAGE, bound_pod
from exporter_scheduler.serving.wire import decode_args
from exporter_scheduler.serving.workloads import MAX_SAMPLES_PER_WORKLOAD, WorkloadLoads
from gpu_contract.podusage import GpuShare, PodUsage
from gpu_contract.schema import DEFAULT_KEYS, GpuState, Health, NodeGpuState, encode
from tests.scorer._http_helpers import args_body
from tests.scorer._http_helpers import node as node_doc
from tests.scorer._http_helpers import pod as pod_doc
from tests.scorer.scoring_builders import NOW, PREFIX

RS = Owner("ReplicaSet", "llm-7c9f8d6b5", controller=True)

WORKLOAD_CASES = [
    pytest.param(
        {"pod-template-hash": "7c9f8d6b5"}, [RS], {}, "ml/Deployment/llm", id="deployment"
    ),
    pytest.param(
        {"pod-template-hash": "5d4c3b2a1"},
        [Owner("ReplicaSet", "llm-5d4c3b2a1", controller=True)],
        {},
        "ml/Deployment/llm",
        id="every-revision-of-a-deployment-is-one-workload",
    ),
    pytest.param({}, [RS], {}, "ml/ReplicaSet/llm-7c9f8d6b5", id="bare-replicaset"),
    pytest.param(
        {}, [Owner("StatefulSet", "db", controller=True)], {}, "ml/StatefulSet/db", id="statefulset"
    ),
    pytest.param({}, [Owner("Job", "train", controller=True)], {}, "ml/Job/train", id="job"),
    pytest.param(
        {"jobset.sigs.k8s.io/jobset-name": "big", "jobset.sigs.k8s.io/replicatedjob-name": "w"},
        [Owner("Job", "big-w-0", controller=True)],
        {},
        "ml/JobSet/big/w",
        id="jobset-replicated-job-over-its-jobs",
    ),
    pytest.param(
        {
            "leaderworkerset.sigs.k8s.io/name": "srv",
            "leaderworkerset.sigs.k8s.io/worker-index": "0",
        },
        [Owner("StatefulSet", "srv", controller=True)],
        {},
        "ml/LeaderWorkerSet/srv/leader",
        id="lws-leader",
    ),
    pytest.param(
        {
            "leaderworkerset.sigs.k8s.io/name": "srv",
            "leaderworkerset.sigs.k8s.io/worker-index": "2",
        },
        [Owner("StatefulSet", "srv-0", controller=True)],
        {},
        "ml/LeaderWorkerSet/srv/worker",
        id="lws-workers-of-every-group",
    ),
    pytest.param(
        {"training.kubeflow.org/job-name": "pt", "training.kubeflow.org/replica-type": "Worker"},
        [Owner("PyTorchJob", "pt", controller=True)],
        {},
        "ml/TrainingJob/pt/worker",
        id="kubeflow-replica-type",
    ),
    pytest.param(
        {"pod-template-hash": "7c9f8d6b5"},
        [RS],
        {PREFIX + "workload": "shared-model"},
        "ml/hint/shared-model",
        id="hint-names-the-workload",
    ),
    pytest.param({}, [Owner("ReplicaSet", "x", controller=False)], {}, None, id="not-controller"),
    pytest.param({}, [], {}, None, id="bare-pod-has-no-siblings"),
]


@pytest.mark.parametrize(("labels", "owners", "annotations", "expected"), WORKLOAD_CASES)
def test_workload_of(
    labels: dict[str, str], owners: list[Owner], annotations: dict[str, str], expected: str | None
) -> None:
    assert workload_of("ml", labels, owners, annotations, PREFIX) == expected


def test_the_pod_watch_keys_each_pod_by_its_workload() -> None:
    page = PAGE.decode(
        b'{"items": [{"metadata": {"name": "llm-7c9f8d6b5-abcde", "namespace": "ml",'
        b' "labels": {"pod-template-hash": "7c9f8d6b5"},'
        b' "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet",'
        b' "name": "llm-7c9f8d6b5", "uid": "u", "controller": true}]},'
        b' "spec": {"nodeName": "n1", "containers": [{"name": "c",'
        b' "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}]}'
    )
    assert page.items is not None
    # Pages keep each Pod raw; the watch decodes a bound GPU pod whole (`PodCache._keep`).
    pod = bound_pod(OBJECT.decode(page.items[0]), resource="nvidia.com/gpu")
    assert pod is not None
    assert pod.workload == "ml/Deployment/llm"


# ----------------------------------------------------------------------------- learning


def _bound(name: str, node: str, workload: str | None, running_age_s: float | None) -> BoundPod:
    return BoundPod(
        namespace="ml",
        name=name,
        uid=name,
        node=node,
        gpus=1,
        bound_at=NOW - timedelta(seconds=900),
        admitted_at=NOW - timedelta(seconds=890),
        running_since=None if running_age_s is None else NOW - timedelta(seconds=running_age_s),
        workload=workload,
    )


def _node(
    name: str, sampled_at: datetime, usage: dict[str, tuple[float | None, int | None]]
) -> NodeInput:
    state = NodeGpuState(
        health=Health.OK,
        updated_at=sampled_at,
        utilization=0.5,
        gpu_count=len(usage),
        gpus=tuple(GpuState(0.5, 40_000, 50) for _ in usage),
        pods=tuple(
            PodUsage(f"ml/{pod}", (GpuShare(index, util, mem),))
            for index, (pod, (util, mem)) in enumerate(usage.items())
        ),
    )
    annotations = encode(state)
    return NodeInput(name, annotations, predecoded=(PREFIX, predecode(annotations, DEFAULT_KEYS)))


DEPLOY = "ml/Deployment/llm"


def _store(
    *, min_pods: int = 2, max_age_s: float = 3600.0, max_workloads: int = 10_000
) -> WorkloadLoads:
    return WorkloadLoads(
        keys_prefix=PREFIX,
        load_delay_s=60.0,
        min_pods=min_pods,
        max_age_s=max_age_s,
        max_workloads=max_workloads,
    )


def test_running_siblings_past_their_ramp_teach_the_load() -> None:
    store = _store()
    store.set_pods(
        "n1",
        (
            _bound("a", "n1", DEPLOY, 600),
            _bound("b", "n1", DEPLOY, 600),
            _bound("ramping", "n1", DEPLOY, 30),  # sampled before its window shows its load
            _bound("alone", "n1", None, 600),  # no workload: nothing to teach
        ),
    )
    node = _node(
        "n1",
        NOW,
        {"a": (0.62, 20_000), "b": (0.58, 18_000), "ramping": (0.05, 1000), "alone": (0.9, 1)},
    )
    assert store.observe(node) == 2
    learned = store.learned_for(DEPLOY, NOW)
    assert learned is not None
    assert (learned.utilization_bp, learned.memory_mib, learned.pods) == (6500, 20_480, 2)


def test_a_young_pods_idle_reading_is_not_learned_a_busy_one_is() -> None:
    """Until a pod has run `settle_s`, a utilization below the default may be its start-up (a
    worker loading its data reads idle): only its memory is recorded. A busy reading counts
    at once, and an idle one counts once the pod has settled."""
    store = WorkloadLoads(keys_prefix=PREFIX, load_delay_s=60.0, settle_s=300.0, settle_floor=0.5)
    young = (_bound("a", "n1", DEPLOY, 120), _bound("b", "n1", DEPLOY, 120))
    store.set_pods("n1", young)
    store.observe(_node("n1", NOW, {"a": (0.02, 20_000), "b": (0.03, 20_000)}))
    learned = store.learned_for(DEPLOY, NOW)
    assert learned is not None
    assert (learned.utilization_bp, learned.memory_mib) == (None, 20_480)

    store.observe(_node("n1", NOW, {"a": (0.85, 20_000), "b": (0.8, 20_000)}))
    learned = store.learned_for(DEPLOY, NOW)
    assert learned is not None
    assert learned.utilization_bp == 8500

    settled = (_bound("a", "n1", DEPLOY, 301), _bound("b", "n1", DEPLOY, 301))
    store.set_pods("n1", settled)
    store.observe(_node("n1", NOW, {"a": (0.02, 20_000), "b": (0.03, 20_000)}))
    learned = store.learned_for(DEPLOY, NOW)
    assert learned is not None
    assert learned.utilization_bp == 500


def test_too_few_samples_and_old_samples_are_not_trusted() -> None:
    store = _store(min_pods=2, max_age_s=600.0)
    store.set_pods("n1", (_bound("a", "n1", DEPLOY, 600),))
    store.observe(_node("n1", NOW, {"a": (0.6, None)}))
    assert store.learned_for(DEPLOY, NOW) is None  # one sample: below the floor
    store.set_pods("n1", (_bound("a", "n1", DEPLOY, 600), _bound("b", "n1", DEPLOY, 600)))
    store.observe(_node("n1", NOW, {"a": (0.6, None), "b": (0.6, None)}))
    assert store.learned_for(DEPLOY, NOW) is not None
    assert store.learned_for(DEPLOY, NOW + timedelta(seconds=601)) is None


def test_the_figure_follows_a_workload_whose_load_changes() -> None:
    store = _store(max_age_s=600.0)
    pods = (_bound("a", "n1", DEPLOY, 3000), _bound("b", "n1", DEPLOY, 3000))
    store.set_pods("n1", pods)
    store.observe(_node("n1", NOW - timedelta(seconds=900), {"a": (0.8, None), "b": (0.8, None)}))
    store.observe(_node("n1", NOW, {"a": (0.2, None), "b": (0.2, None)}))
    learned = store.learned_for(DEPLOY, NOW)
    assert learned is not None
    assert learned.utilization_bp == 2000


def test_a_pod_the_watch_does_not_know_is_skipped() -> None:
    store = _store()
    store.set_pods("n1", (_bound("a", "n1", DEPLOY, 600),))
    assert store.observe(_node("n1", NOW, {"gone": (0.9, 100)})) == 0
    assert store.observe(_node("n2", NOW, {"a": (0.9, 100)})) == 0


def test_workloads_are_capped_least_recently_sampled_first() -> None:
    store = _store(min_pods=1, max_workloads=2)
    for index, workload in enumerate(("w1", "w2", "w3")):
        store.set_pods("n1", (_bound("p", "n1", workload, 600),))
        store.observe(_node("n1", NOW + timedelta(seconds=index), {"p": (0.5, None)}))
    assert len(store) == 2
    assert all(
        len(entry.samples) <= MAX_SAMPLES_PER_WORKLOAD for entry in store._workloads.values()
    )
    assert store.learned_for("w1", NOW) is None
    assert store.learned_for("w3", NOW + timedelta(seconds=2)) is not None


def test_a_learned_figure_changes_the_pods_class_and_verdict() -> None:
    from exporter_scheduler.core.judge import evaluate  # noqa: PLC0415
    from exporter_scheduler.core.policy import Policy  # noqa: PLC0415
    from tests.scorer.scoring_builders import Gpu, gpu_node, pod, runs  # noqa: PLC0415

    store = _store()
    store.set_pods("n1", (_bound("a", "n1", DEPLOY, 600), _bound("b", "n1", DEPLOY, 600)))
    store.observe(_node("n1", NOW, {"a": (0.7, None), "b": (0.7, None)}))
    half = gpu_node("half", runs((1, Gpu(utilization=0.45))))
    heavy = msgspec.structs.replace(pod(), learned=store.learned_for(DEPLOY, NOW))
    policy = Policy(own_load_gpu_load=0.30)
    assert evaluate(heavy, [half], NOW, policy).passed_names() == []
    assert evaluate(pod(), [half], NOW, policy).passed_names() == ["half"]


# ----------------------------------------------------------------------------- both modes


def test_full_node_requests_teach_what_the_node_watch_teaches() -> None:
    """The same agent write, seen by the Node watch (names-only) or in a request's Nodes
    (full-node), gives the same figure; a Node sent again with the same data is not read."""
    pods = (_bound("a", "n1", DEPLOY, 600), _bound("b", "n1", DEPLOY, 600))
    data = _node("n1", NOW, {"a": (0.62, 20_000), "b": (0.58, 18_000)})
    watched, requested = _store(), _store()
    watched.set_pods("n1", pods)
    requested.set_pods("n1", pods)
    watched.observe(data)

    def records(*nodes: tuple[str, Mapping[str, str]]) -> list[Any]:
        body = args_body(pod_doc(), [node_doc(name, values) for name, values in nodes])
        return list(decode_args(body, gpu_resource_name="nvidia.com/gpu").records)

    sent = records(("n1", data.annotations), ("n2", {}))
    assert requested.observe_requested(sent, DEFAULT_KEYS) == 2  # both new (n2: no usage)
    assert requested.learned_for(DEPLOY, NOW) == watched.learned_for(DEPLOY, NOW) is not None
    again = records(("n1", data.annotations), ("n2", {}))
    assert requested.observe_requested(again, DEFAULT_KEYS) == 0


def test_pods_are_stamped_with_their_workloads_figure() -> None:
    store = _store()
    pods = (_bound("a", "n1", DEPLOY, 600), _bound("b", "n1", DEPLOY, 600))
    assert store.stamp(pods, NOW) is pods  # nothing learned yet: the same tuple
    store.set_pods("n1", pods)
    generation = store.generation
    store.observe(_node("n1", NOW, {"a": (0.7, None), "b": (0.7, None)}))
    assert store.generation > generation
    stamped = store.stamp(pods, NOW)
    assert [p.learned for p in stamped] == [store.learned_for(DEPLOY, NOW)] * 2
    assert store.stamp(stamped, NOW) is stamped
    pods_of = store.stamped_pods_of({"n1": pods}.get, NOW)  # type: ignore[arg-type]
    assert pods_of("n1") is pods_of("n1")  # a stable key for the full-node verdict cache
    assert pods_of("n1") == stamped


def test_the_node_store_hands_in_flight_pods_their_workloads_figure() -> None:
    from exporter_scheduler.serving.nodestore import NodeStore  # noqa: PLC0415

    learned = _store()
    teachers = (_bound("a", "n1", DEPLOY, 600), _bound("b", "n1", DEPLOY, 600))
    learned.set_pods("n1", teachers)
    learned.observe(_node("n1", NOW, {"a": (0.7, None), "b": (0.7, None)}))
    store = NodeStore(clock=lambda: NOW, learned=learned)
    store.set_pods("n2", (_bound("c", "n2", DEPLOY, None),))
    assert store.pods_of("n2")[0].learned == learned.learned_for(DEPLOY, NOW)


def test_a_full_node_app_learns_from_its_requests() -> None:
    """Full-node mode with the Pod watch: the request's own Nodes teach the workload's load
    (0.70 on n1), and the next replica avoids the half-busy GPUs it would have taken under
    the default 0.30."""
    import json  # noqa: PLC0415

    from exporter_scheduler.core.policy import Policy  # noqa: PLC0415
    from exporter_scheduler.serving.app import ScorerApp  # noqa: PLC0415

    teachers = (_bound("a", "n1", DEPLOY, 600), _bound("b", "n1", DEPLOY, 600))
    data = _node("n1", NOW, {"a": (0.7, None), "b": (0.7, None)})
    replica = {
        "metadata": {
            "name": "llm-7c9f8d6b5-new",
            "namespace": "ml",
            "labels": {"pod-template-hash": "7c9f8d6b5"},
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "ReplicaSet",
                    "name": "llm-7c9f8d6b5",
                    "uid": "u",
                    "controller": True,
                }
            ],
        },
        "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
    }
    body = args_body(replica, [node_doc("n1", data.annotations)])

    def passed(learn: bool) -> list[str]:
        store = _store()
        store.set_pods("n1", teachers)
        app = ScorerApp(
            policy=Policy(own_load_gpu_load=0.30),
            clock=lambda: NOW,
            pods_of={"n1": teachers}.get,  # type: ignore[arg-type]
            workloads=store,
            learn_from_requests=learn,
        )
        reply = json.loads(app.handle("filter", body).body)
        return [item["metadata"]["name"] for item in reply["Nodes"]["items"]]

    assert passed(learn=False) == ["n1"]  # 0.50 + the default 0.30: within 0.90
    assert passed(learn=True) == []  # 0.50 + its siblings' 0.70
