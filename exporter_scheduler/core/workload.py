"""A pod's workload: the owner it shares with its siblings, whose running pods show its load.

The scorer counts the load a pod will add once it runs (`exporter_scheduler.core.ownload`). The
best estimate of that load, short of the pod's own hint, is what its siblings use now: replicas
of one Deployment serve the same model, workers of one Job run the same step. So each GPU pod is
keyed by its workload, a string `namespace/kind/name[/role]`, read from what the controllers
themselves write on the pods they create (first match wins):

1. the pod's own `workload` hint (`<prefix>workload` annotation): the workload owner's word,
   for pods none of the rules below fits (a custom controller, bare pods started by a script);
2. the labels of the multi-role training and serving APIs, whose pods are owned by
   intermediate Jobs or StatefulSets that would split one workload into many:
   JobSet (`jobset.sigs.k8s.io/jobset-name` and `jobset.sigs.k8s.io/replicatedjob-name`: one
   workload per replicated job, since a driver and its workers load GPUs differently),
   LeaderWorkerSet (`leaderworkerset.sigs.k8s.io/name`, the leader, worker index 0, apart from
   the workers), the Kubeflow training operators (`training.kubeflow.org/job-name` and
   `training.kubeflow.org/replica-type`: a parameter server is not a worker);
3. the controller owner reference: a ReplicaSet whose pods carry `pod-template-hash` is a
   Deployment's, and is keyed by the Deployment (the ReplicaSet's name minus `-<hash>`), so
   every revision of one Deployment is one workload: a rolling update starts a ReplicaSet with
   no running pods, and its first replicas would otherwise get the default while a dozen
   siblings serving the same model show the load; a revision that does change the load is
   followed as its pods replace the old ones and the old samples age out. A StatefulSet, a Job,
   a bare ReplicaSet, or any other controller kind is keyed by itself;
4. none: a pod without siblings (a notebook, a bare pod). It gets the policy's default.

Pure: a function of the pod's labels, owner references and annotations.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Final, NamedTuple

WORKLOAD_HINT: Final = "workload"
# The Deployment controller's label on every pod of a ReplicaSet it made.
POD_TEMPLATE_HASH: Final = "pod-template-hash"
JOBSET_NAME: Final = "jobset.sigs.k8s.io/jobset-name"
JOBSET_REPLICATED_JOB: Final = "jobset.sigs.k8s.io/replicatedjob-name"
LWS_NAME: Final = "leaderworkerset.sigs.k8s.io/name"
LWS_WORKER_INDEX: Final = "leaderworkerset.sigs.k8s.io/worker-index"
KUBEFLOW_JOB_NAME: Final = "training.kubeflow.org/job-name"
KUBEFLOW_REPLICA_TYPE: Final = "training.kubeflow.org/replica-type"
# A workload name longer than this is cut: it is a key in a bounded map, never parsed back.
MAX_WORKLOAD_CHARS: Final = 512


class Owner(NamedTuple):
    """One `metadata.ownerReferences` entry, as far as the workload reads it."""

    kind: str
    name: str
    controller: bool


def workload_of(
    namespace: str,
    labels: Mapping[str, str] | None,
    owners: Sequence[Owner],
    annotations: Mapping[str, str] | None,
    prefix: str,
) -> str | None:
    """The workload key of a pod, or None for a pod without siblings (module docstring)."""
    key = _workload(labels or {}, owners, annotations or {}, prefix)
    if key is None:
        return None
    return f"{namespace}/{key}"[:MAX_WORKLOAD_CHARS]


def _workload(
    labels: Mapping[str, str],
    owners: Sequence[Owner],
    annotations: Mapping[str, str],
    prefix: str,
) -> str | None:
    hint = annotations.get(prefix + WORKLOAD_HINT)
    if isinstance(hint, str) and hint.strip():
        return "hint/" + hint.strip()
    jobset = labels.get(JOBSET_NAME)
    if jobset:
        return f"JobSet/{jobset}/{labels.get(JOBSET_REPLICATED_JOB, '')}"
    lws = labels.get(LWS_NAME)
    if lws:
        role = "leader" if labels.get(LWS_WORKER_INDEX) == "0" else "worker"
        return f"LeaderWorkerSet/{lws}/{role}"
    kubeflow = labels.get(KUBEFLOW_JOB_NAME)
    if kubeflow:
        return f"TrainingJob/{kubeflow}/{labels.get(KUBEFLOW_REPLICA_TYPE, '').lower()}"
    controller = next((owner for owner in owners if owner.controller), None)
    if controller is None or not controller.name:
        return None
    template_hash = labels.get(POD_TEMPLATE_HASH)
    if (
        controller.kind == "ReplicaSet"
        and template_hash
        and controller.name.endswith("-" + template_hash)
    ):
        return "Deployment/" + controller.name[: -len(template_hash) - 1]
    return f"{controller.kind}/{controller.name}"
