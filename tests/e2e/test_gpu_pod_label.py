"""The GPU pod label on a real kube-apiserver v1.37 (v1.36 with `LOOPBACK_KUBERNETES=v1.36`).

The chart's MutatingAdmissionPolicy and its binding, rendered by helm with
`scorer.gpuPodLabel.enabled`, are applied as the chart applies them. Once the API server has the
policy in effect (a dry-run creation of a GPU pod comes back labelled), a GPU pod is created
with the label and a CPU pod without it, and an update that drops the label gets it back. The
pods created before the policy are labelled by the real `gpu-scorer label-gpu-pods`, run with
the arguments and the identity (ServiceAccount, ClusterRole, binding) of the chart's hook Job;
run again, it labels nothing.

The binding holds every namespace, and other tests create GPU pods that expect no label: these
tests run on a control plane of their own.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from loopback_cluster.control_plane import SERVICE_ACCOUNT_ISSUER, ControlPlane, KubeApi
from loopback_cluster.workload import apply, gpu_pod, service_account_token, wait_for
from tests.deploy.chart_support import FULLNAME, Manifest, parse_manifests, template
from tests.deploy.chart_support import NAMESPACE as RELEASE_NAMESPACE
from tests.e2e.support import create_namespace, kube_version, started_control_plane

NAMESPACE = "gpu-label"
KEY = "gpu-scheduler.example.com/gpu-pod"
VALUES = {"scorer": {"gpuPodLabel": {"enabled": True}}}
PODS = f"/api/v1/namespaces/{NAMESPACE}/pods"
JOB = f"{FULLNAME}-label-gpu-pods"
# The API server builds its admission policies from a watch of them: in effect within a second
# or two on loopback. The deadline of the wait.
POLICY_IN_EFFECT_S = 30.0
# The command lists a few dozen pods and patches most: a second or two, with its own retries.
COMMAND_S = 120.0
# Pods created before the policy, enough that a patch's answer left unread on its pooled
# connection (which failed about one patch in ten) shows as a retry.
OLD_GPU_PODS = 24


@dataclass(frozen=True)
class Installed:
    api: KubeApi
    plane: ControlPlane
    # The Job's `gpu-scorer` arguments, as the chart renders them.
    job_args: list[str]
    # A kubeconfig of the Job's ServiceAccount, bound to its ClusterRole as the chart binds it.
    job_kubeconfig: Path
    job_token: str
    # Pods created before the policy: GPU pods, then others.
    old_gpu_pods: tuple[str, ...]
    old_cpu_pods: tuple[str, ...]


def cpu_pod(name: str) -> Manifest:
    pod = gpu_pod(name, scheduler_name="default-scheduler", namespace=NAMESPACE)
    (container,) = pod["spec"]["containers"]
    container["resources"] = {"requests": {"cpu": "100m"}, "limits": {"memory": "64Mi"}}
    return pod


def init_gpu_pod(name: str) -> Manifest:
    """A pod whose init container alone asks for the GPU, as a limit."""
    pod = cpu_pod(name)
    pod["spec"]["initContainers"] = [
        {"name": "warm", "image": "pause:3.10", "resources": {"limits": {"nvidia.com/gpu": "1"}}}
    ]
    return pod


def main_gpu_pod(name: str) -> Manifest:
    return gpu_pod(name, scheduler_name="default-scheduler", namespace=NAMESPACE)


def labels(api: KubeApi, name: str) -> dict[str, str]:
    found: dict[str, str] = api.get(f"{PODS}/{name}")["metadata"].get("labels", {})
    return found


def chart_objects() -> dict[str, list[Manifest]]:
    rendered = parse_manifests(template(VALUES, kube_version=kube_version()))
    by_kind: dict[str, list[Manifest]] = {}
    for manifest in rendered:
        by_kind.setdefault(manifest["kind"], []).append(manifest)
    return by_kind


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Installed]:
    with started_control_plane(tmp_path_factory, "gpu-pod-label") as plane, plane.admin() as api:
        create_namespace(api, NAMESPACE)
        old_gpu = (*(f"old-gpu-{i}" for i in range(OLD_GPU_PODS)), "old-init-gpu")
        for name in old_gpu[:-1]:
            api.create(PODS, main_gpu_pod(name))
        api.create(PODS, init_gpu_pod(old_gpu[-1]))
        api.create(PODS, cpu_pod("old-cpu"))

        objects = chart_objects()
        (policy,) = objects["MutatingAdmissionPolicy"]
        (binding,) = objects["MutatingAdmissionPolicyBinding"]
        apply(api, policy)
        apply(api, binding)
        wait_until_in_effect(api)
        (job,) = objects["Job"]
        (container,) = job["spec"]["template"]["spec"]["containers"]
        assert container["command"] == ["gpu-scorer"]
        token = job_identity(api, objects)
        kubeconfig = plane.token_kubeconfig(tmp_path_factory.mktemp("job") / "kubeconfig", token)
        with plane.as_token(token) as as_job:  # RBAC, too, is read from a watch
            wait_for(
                "the Job's binding to let it list pods",
                lambda: as_job.raw("GET", "/api/v1/pods?limit=1")[0] == 200,
                timeout_s=POLICY_IN_EFFECT_S,
            )
        yield Installed(
            api, plane, list(container["args"]), kubeconfig, token, old_gpu, ("old-cpu",)
        )


def job_identity(api: KubeApi, objects: dict[str, list[Manifest]]) -> str:
    """Apply the hook Job's ServiceAccount, ClusterRole and binding as rendered; a token of
    that ServiceAccount."""
    create_namespace(api, RELEASE_NAMESPACE)
    for kind in ("ServiceAccount", "ClusterRole", "ClusterRoleBinding"):
        (manifest,) = [m for m in objects[kind] if m["metadata"]["name"] == JOB]
        apply(api, manifest, namespace=RELEASE_NAMESPACE)
    return service_account_token(
        api, namespace=RELEASE_NAMESPACE, service_account=JOB, audience=SERVICE_ACCOUNT_ISSUER
    )


def wait_until_in_effect(api: KubeApi) -> None:
    """Until a dry-run creation of a GPU pod comes back labelled: the policy is then in effect
    for every request after it (nothing is stored)."""
    probe = main_gpu_pod("probe")

    def labelled() -> bool:
        created = api.create(f"{PODS}?dryRun=All", probe)
        return bool(created["metadata"].get("labels", {}).get(KEY) == "true")

    wait_for("the GPU pod label policy to be in effect", labelled, timeout_s=POLICY_IN_EFFECT_S)


def label_gpu_pods(installed: Installed) -> tuple[dict[str, Any], str]:
    """Run `gpu-scorer label-gpu-pods` as the hook Job does, against the loopback API server:
    its JSON summary line, and its log."""
    env = {
        k: v for k, v in os.environ.items() if not k.startswith("GPU_SCORER_") and k != "KUBECONFIG"
    }
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "exporter_scheduler",
            *installed.job_args,
            f"--kubeconfig={installed.job_kubeconfig}",
        ],
        capture_output=True,
        text=True,
        timeout=COMMAND_S,
        check=False,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    summary: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return summary, done.stderr


def test_the_policy_labels_gpu_pods_and_no_others(installed: Installed) -> None:
    api = installed.api
    created = {
        "new-gpu": api.create(PODS, main_gpu_pod("new-gpu")),
        "new-init-gpu": api.create(PODS, init_gpu_pod("new-init-gpu")),
        "new-cpu": api.create(PODS, cpu_pod("new-cpu")),
    }
    assert created["new-gpu"]["metadata"]["labels"] == {"app": "gpu-e2e", KEY: "true"}
    assert created["new-init-gpu"]["metadata"]["labels"] == {"app": "gpu-e2e", KEY: "true"}
    assert created["new-cpu"]["metadata"]["labels"] == {"app": "gpu-e2e"}
    # As stored, not only as answered.
    assert labels(api, "new-gpu")[KEY] == "true"
    assert KEY not in labels(api, "new-cpu")
    # The policy is in the chart as it renders it: its name, its binding.
    policy = api.get(
        f"/apis/admissionregistration.k8s.io/v1/mutatingadmissionpolicies/{FULLNAME}-gpu-pod-label"
    )
    assert policy["spec"]["failurePolicy"] == "Ignore"


def test_an_update_that_drops_the_label_gets_it_back(installed: Installed) -> None:
    api = installed.api
    api.create(PODS, main_gpu_pod("relabelled"))
    updated = api.merge_patch(f"{PODS}/relabelled", {"metadata": {"labels": {KEY: None}}})
    assert updated["metadata"]["labels"][KEY] == "true"
    changed = api.merge_patch(f"{PODS}/relabelled", {"metadata": {"labels": {KEY: "false"}}})
    assert changed["metadata"]["labels"][KEY] == "true"
    # A CPU pod's update leaves it unlabelled.
    api.create(PODS, cpu_pod("cpu-updated"))
    cpu = api.merge_patch(f"{PODS}/cpu-updated", {"metadata": {"labels": {"team": "ml"}}})
    assert KEY not in cpu["metadata"]["labels"]


def test_label_gpu_pods_labels_the_pods_from_before_the_policy_once(
    installed: Installed,
) -> None:
    api = installed.api
    for name in installed.old_gpu_pods:
        assert KEY not in labels(api, name)  # the policy labels new pods, not these

    first, log = label_gpu_pods(installed)
    assert first["labelled"] == len(installed.old_gpu_pods), first
    assert first["gpu_pods"] == len(installed.old_gpu_pods), first
    assert (first["failed"], first["gone"], first["error"], first["dry_run"]) == (
        0,
        0,
        None,
        False,
    )
    assert "retrying" not in log  # nothing here is throttled or failing
    for name in installed.old_gpu_pods:
        assert labels(api, name)[KEY] == "true"
    for name in installed.old_cpu_pods:
        assert KEY not in labels(api, name)

    second, _ = label_gpu_pods(installed)
    unlabelled = api.get(f"/api/v1/pods?labelSelector={KEY}!=true")["items"]
    assert second["listed"] == len(unlabelled), second  # the CPU pods, listed and left
    assert (second["gpu_pods"], second["labelled"], second["failed"]) == (0, 0, 0), second


def test_the_jobs_identity_may_do_nothing_else(installed: Installed) -> None:
    with installed.plane.as_token(installed.job_token) as job:
        assert job.raw("GET", f"{PODS}/old-cpu")[0] == 403
        assert job.raw("DELETE", f"{PODS}/old-cpu")[0] == 403
        assert job.raw("GET", "/api/v1/nodes")[0] == 403
        assert job.raw("POST", PODS, cpu_pod("by-the-job"))[0] == 403
