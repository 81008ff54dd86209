"""The GPU pod label (`scorer.gpuPodLabel`), rendered by helm; its conditions run with cel-python.

Enabled, the chart renders a MutatingAdmissionPolicy that labels GPU pods
`<prefix>/gpu-pod=true`, gives the scorer the matching `--pod-label-selector` in both of its
modes, and, with `labelExisting`, a post-install and post-upgrade hook Job that runs `gpu-scorer
label-gpu-pods` for the pods created before the policy. The policy's conditions must pick the
pods the scorer's Pod watch counts (the GPU resource in any container's or init container's
requests or limits) and the Job must label them under the scorer's own prefix and resource.
tests/e2e/test_gpu_pod_label.py runs the policy and the command on a real kube-apiserver.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import pytest

from exporter_scheduler.cli import build_parser
from exporter_scheduler.config.settings import load_settings
from exporter_scheduler.core.hints import GPU_POD_LABEL_VALUE
from exporter_scheduler.edges.podlabels import label_key
from gpu_contract.schema import Keys
from tests.deploy.admission_cel import MatchConditions
from tests.deploy.chart_support import (
    FULLNAME,
    NAMESPACE,
    HelmError,
    Manifest,
    Rendered,
    containers,
    env_of,
    notes,
    parse_manifests,
    render,
    template,
)

pytestmark = pytest.mark.helm

POLICY = f"{FULLNAME}-gpu-pod-label"
JOB = f"{FULLNAME}-label-gpu-pods"
KEY = "gpu-scheduler.example.com/gpu-pod"
ENABLED = {"scorer": {"gpuPodLabel": {"enabled": True}}}
HOOK = "helm.sh/hook"
# What the GPU pod label adds to a release: nothing else may appear.
POLICY_OBJECTS = {
    ("MutatingAdmissionPolicy", POLICY),
    ("MutatingAdmissionPolicyBinding", POLICY),
}
JOB_OBJECTS = {
    ("ServiceAccount", JOB),
    ("ClusterRole", JOB),
    ("ClusterRoleBinding", JOB),
    ("Job", JOB),
}


def kinds_and_names(rendered: Rendered) -> set[tuple[str, str]]:
    return {(m["kind"], m["metadata"]["name"]) for m in rendered.manifests}


def scorer_env(rendered: Rendered) -> dict[str, str]:
    deployment = rendered.maybe("Deployment", f"{FULLNAME}-scorer")
    if deployment is None:  # sidecar mode
        deployment = rendered.get("Deployment", f"{FULLNAME}-scheduler")
    return env_of(containers(deployment)["scorer"], rendered)


def without_checksums(manifest: Manifest) -> Manifest:
    """A manifest less its pod template's config checksum (which the scorer's settings move)."""
    if manifest["kind"] != "Deployment":
        return manifest
    copy = {**manifest, "spec": {**manifest["spec"]}}
    template_ = copy["spec"]["template"]
    annotations = dict(template_["metadata"].get("annotations", {}))
    annotations.pop("checksum/config", None)
    copy["spec"]["template"] = {
        **template_,
        "metadata": {**template_["metadata"], "annotations": annotations},
    }
    return copy


# ---------------------------------------------------------------------- what is rendered


def test_off_by_default_renders_nothing_of_it() -> None:
    defaults = render("defaults")
    assert kinds_and_names(defaults) & (POLICY_OBJECTS | JOB_OBJECTS) == set()
    assert defaults.of_kind("MutatingAdmissionPolicy") == []
    assert defaults.of_kind("Job") == []
    assert "GPU_SCORER_POD_LABEL_SELECTOR" not in scorer_env(defaults)
    assert KEY not in defaults.text


def test_enabled_adds_the_policy_the_job_and_the_selector_and_changes_nothing_else() -> None:
    defaults, enabled = render("defaults"), render("gpu-pod-label")
    assert kinds_and_names(enabled) - kinds_and_names(defaults) == POLICY_OBJECTS | JOB_OBJECTS
    assert kinds_and_names(defaults) <= kinds_and_names(enabled)
    changed = sorted(
        (m["kind"], m["metadata"]["name"])
        for m in defaults.manifests
        if without_checksums(enabled.get(m["kind"], m["metadata"]["name"])) != without_checksums(m)
    )
    # The scorer's settings alone; its pods roll with them (the checksum).
    assert changed == [("ConfigMap", f"{FULLNAME}-scorer")]
    env = scorer_env(enabled)
    assert env["GPU_SCORER_POD_LABEL_SELECTOR"] == f"{KEY}=true"
    assert {k: v for k, v in env.items() if k != "GPU_SCORER_POD_LABEL_SELECTOR"} == scorer_env(
        defaults
    )


def test_the_selector_is_the_label_the_scorer_and_its_command_use() -> None:
    # The chart spells the key itself; it must be the one the scorer's code builds.
    keys = Keys.for_prefix("gpu-scheduler.example.com")
    assert scorer_env(render("gpu-pod-label"))["GPU_SCORER_POD_LABEL_SELECTOR"] == (
        f"{label_key(keys)}={GPU_POD_LABEL_VALUE}"
    )
    custom = render("gpu-pod-label-sidecar-no-job")
    acme = Keys.for_prefix("gpu.acme.io")
    assert scorer_env(custom)["GPU_SCORER_POD_LABEL_SELECTOR"] == f"{label_key(acme)}=true"
    expression = custom.get("MutatingAdmissionPolicy", POLICY)["spec"]["mutations"][0]
    assert f'{{"{label_key(acme)}": "true"}}' in expression["applyConfiguration"]["expression"]


def test_the_policy_labels_on_create_and_update_never_refuses_and_binds_everywhere() -> None:
    rendered = render("gpu-pod-label")
    spec = rendered.get("MutatingAdmissionPolicy", POLICY)["spec"]
    assert spec["failurePolicy"] == "Ignore"
    assert spec["reinvocationPolicy"] == "Never"
    assert spec["matchConstraints"]["resourceRules"] == [
        {
            "apiGroups": [""],
            "apiVersions": ["v1"],
            "operations": ["CREATE", "UPDATE"],
            "resources": ["pods"],
        }
    ]
    assert [c["name"] for c in spec["matchConditions"]] == ["requests-gpus", "lacks-the-label"]
    (mutation,) = spec["mutations"]
    assert mutation["patchType"] == "ApplyConfiguration"
    assert mutation["applyConfiguration"]["expression"] == (
        f'Object{{metadata: Object.metadata{{labels: {{"{KEY}": "true"}}}}}}'
    )
    binding = rendered.get("MutatingAdmissionPolicyBinding", POLICY)["spec"]
    assert binding == {"policyName": POLICY}  # no matchResources: every namespace


def test_the_policy_checks_the_resource_the_guard_checks() -> None:
    # One predicate for "a GPU pod", shared with the schedulerName guard.
    rendered = render("gpu-pod-label")
    ours = rendered.get("MutatingAdmissionPolicy", POLICY)["spec"]["matchConditions"][0]
    guard = rendered.get("ValidatingAdmissionPolicy", f"{FULLNAME}-require-scheduler")
    assert guard["spec"]["matchConditions"][0]["expression"] == ours["expression"]


@pytest.mark.parametrize("variant", ["gpu-pod-label", "gpu-pod-label-sidecar-no-job"])
def test_the_scorer_selects_the_label_in_both_modes(variant: str) -> None:
    rendered = render(variant)
    prefix = "gpu.acme.io" if "sidecar" in variant else "gpu-scheduler.example.com"
    assert scorer_env(rendered)["GPU_SCORER_POD_LABEL_SELECTOR"] == f"{prefix}/gpu-pod=true"
    assert scorer_env(rendered)["GPU_SCORER_POD_WATCH"] == "true"


def test_without_label_existing_there_is_no_job_and_no_rbac_for_it() -> None:
    rendered = render("gpu-pod-label-sidecar-no-job")
    assert kinds_and_names(rendered) & JOB_OBJECTS == set()
    assert not any(HOOK in m["metadata"].get("annotations", {}) for m in rendered.manifests)
    assert kinds_and_names(rendered) >= POLICY_OBJECTS


def test_the_pod_watch_off_with_the_label_on_fails_with_a_clear_message() -> None:
    with pytest.raises(HelmError, match=r"scorer.podWatch=false turns that watch off"):
        template({"scorer": {"podWatch": False, "gpuPodLabel": {"enabled": True}}})


def test_the_scorer_off_renders_nothing_of_it() -> None:
    text = template({"scorer": {"enabled": False, "gpuPodLabel": {"enabled": True}}})
    names = {(m["kind"], m["metadata"]["name"]) for m in parse_manifests(text)}
    assert names & (POLICY_OBJECTS | JOB_OBJECTS) == set()


def test_notes_show_how_to_list_the_labelled_pods() -> None:
    assert f"kubectl get pods -A -l {KEY}=true" in notes(ENABLED)
    assert f"-l {KEY}" not in notes({})


# ---------------------------------------------------------------------- the hook Job


def test_the_job_and_its_identity_are_hooks_created_in_order_and_deleted_after() -> None:
    rendered = render("gpu-pod-label")
    weights = {}
    for kind, name in JOB_OBJECTS:
        annotations = rendered.get(kind, name)["metadata"]["annotations"]
        assert annotations[HOOK] == "post-install,post-upgrade", kind
        assert annotations["helm.sh/hook-delete-policy"] == (
            "before-hook-creation,hook-succeeded"
        ), kind
        weights[kind] = int(annotations["helm.sh/hook-weight"])
    # helm creates hooks by ascending weight: the identity exists before the Job's pod.
    assert weights["ServiceAccount"] < weights["ClusterRoleBinding"] < weights["Job"]
    assert weights["ClusterRole"] < weights["ClusterRoleBinding"]
    # Only the Job is a hook in the release: the policy is an ordinary object, there first.
    hooks = {
        (m["kind"], m["metadata"]["name"])
        for m in rendered.manifests
        if HOOK in m["metadata"].get("annotations", {})
    }
    assert hooks == JOB_OBJECTS


def test_the_job_may_only_list_and_patch_pods() -> None:
    rendered = render("gpu-pod-label")
    role = rendered.get("ClusterRole", JOB)
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "patch"]}]
    binding = rendered.get("ClusterRoleBinding", JOB)
    assert binding["roleRef"]["name"] == JOB
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": JOB, "namespace": NAMESPACE}]
    pod = rendered.get("Job", JOB)["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == JOB
    assert pod["automountServiceAccountToken"] is True


def test_the_job_runs_as_the_scorer_runs() -> None:
    rendered = render("gpu-pod-label")
    job = rendered.get("Job", JOB)
    assert job["spec"]["backoffLimit"] <= 3
    assert 0 < job["spec"]["activeDeadlineSeconds"] <= 3600
    pod = job["spec"]["template"]["spec"]
    scorer_pod = rendered.get("Deployment", f"{FULLNAME}-scorer")["spec"]["template"]["spec"]
    assert pod["restartPolicy"] == "Never"
    assert pod["securityContext"] == scorer_pod["securityContext"]
    (container,) = pod["containers"]
    scorer = containers(rendered.get("Deployment", f"{FULLNAME}-scorer"))["scorer"]
    for key in ("image", "imagePullPolicy", "command", "resources", "securityContext"):
        assert container[key] == scorer[key], key
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert {m["mountPath"] for m in container["volumeMounts"]} == {"/tmp"}


@dataclass(frozen=True)
class JobCase:
    values: dict[str, Any]
    prefix: str
    resource: str


JOB_CASES = {
    "defaults": JobCase(ENABLED, "gpu-scheduler.example.com/", "nvidia.com/gpu"),
    "own prefix and resource": JobCase(
        {
            "annotationPrefix": "gpu.acme.io",
            "scorer": {
                "gpuPodLabel": {"enabled": True},
                "policy": {"gpu_resource_name": "amd.com/gpu"},
                "logLevel": "debug",
            },
        },
        "gpu.acme.io/",
        "amd.com/gpu",
    ),
}


@pytest.mark.parametrize("case", list(JOB_CASES))
def test_the_job_labels_with_the_scorers_prefix_and_resource(
    case: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in [n for n in os.environ if n.startswith("GPU_SCORER_")]:
        monkeypatch.delenv(name)
    spec = JOB_CASES[case]
    rendered = Rendered("", parse_manifests(template(spec.values)))
    (container,) = rendered.get("Job", JOB)["spec"]["template"]["spec"]["containers"]
    args = build_parser().parse_args(container["args"])
    assert args.command == "label-gpu-pods"
    assert args.dry_run is False
    flags = {k: v for k, v in vars(args).items() if k not in ("command", "dry_run")}
    settings = load_settings(flags)
    assert settings.annotation_prefix == spec.prefix
    assert settings.gpu_resource_name == spec.resource
    assert settings.kubeconfig is None  # the pod's own token
    # The label the Job sets is the one the scorer selects and the policy sets.
    selector = scorer_env(rendered)["GPU_SCORER_POD_LABEL_SELECTOR"]
    assert selector == f"{label_key(Keys.for_prefix(settings.annotation_prefix))}=true"
    conditions = MatchConditions(rendered.get("MutatingAdmissionPolicy", POLICY))
    assert conditions.hold(gpu_pod(limits={spec.resource: "1"}))


def test_no_network_policy_holds_the_jobs_pod_back() -> None:
    # The Job talks to the API server: an egress rule selecting its pod would cut it off, and a
    # Service selecting it would send it the extender's traffic.
    rendered = render("gpu-pod-label")
    labels = rendered.get("Job", JOB)["spec"]["template"]["metadata"]["labels"]
    for policy in rendered.of_kind("NetworkPolicy"):
        assert policy["spec"]["policyTypes"] == ["Ingress"]
    for kind in ("Service", "PodDisruptionBudget", "NetworkPolicy"):
        for selecting in rendered.of_kind(kind):
            spec = selecting["spec"]
            selector = spec.get("selector", spec.get("podSelector", {}))
            selector = selector.get("matchLabels", selector)
            assert not selector.items() <= labels.items(), selecting["metadata"]["name"]


# ---------------------------------------------------------------------- the policy's conditions


def gpu_pod(
    *,
    requests: dict[str, str] | None = None,
    limits: dict[str, str] | None = None,
    init: bool = False,
    labels: dict[str, str] | None = None,
) -> Manifest:
    """A pod whose one container (or init container, beside a plain one) asks for these."""
    resources = {key: value for key, value in (("requests", requests), ("limits", limits)) if value}
    asking: Manifest = {"name": "main", "image": "registry.example/train:1"}
    if resources:
        asking["resources"] = resources
    spec: Manifest = {"containers": [asking]}
    if init:
        spec = {
            "initContainers": [{**asking, "name": "fetch"}],
            "containers": [{"name": "main", "image": "registry.example/train:1"}],
        }
    metadata: Manifest = {"name": "train", "namespace": "ml"}
    if labels is not None:
        metadata["labels"] = labels
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


GPU = {"nvidia.com/gpu": "1"}


@dataclass(frozen=True)
class Case:
    pod: Manifest
    labelled: bool
    operation: str = "CREATE"


CASES = {
    "gpu limit in a container": Case(gpu_pod(limits=GPU), labelled=True),
    "gpu request in a container": Case(gpu_pod(requests=GPU), labelled=True),
    "gpu request in an init container": Case(gpu_pod(requests=GPU, init=True), labelled=True),
    "gpu limit in an init container": Case(gpu_pod(limits=GPU, init=True), labelled=True),
    "gpu pod with other labels": Case(gpu_pod(limits=GPU, labels={"app": "train"}), labelled=True),
    "gpu pod labelled false": Case(gpu_pod(limits=GPU, labels={KEY: "false"}), labelled=True),
    "gpu pod updated without the label": Case(
        gpu_pod(limits=GPU, labels={"app": "train"}), labelled=True, operation="UPDATE"
    ),
    "gpu pod already labelled": Case(gpu_pod(limits=GPU, labels={KEY: "true"}), labelled=False),
    "gpu pod already labelled, updated": Case(
        gpu_pod(limits=GPU, labels={KEY: "true"}), labelled=False, operation="UPDATE"
    ),
    "cpu pod": Case(gpu_pod(requests={"cpu": "2"}, limits={"memory": "1Gi"}), labelled=False),
    "cpu pod updated": Case(gpu_pod(requests={"cpu": "2"}), labelled=False, operation="UPDATE"),
    "pod without resources": Case(gpu_pod(), labelled=False),
    "another vendor's gpu": Case(gpu_pod(limits={"amd.com/gpu": "1"}), labelled=False),
    "a gpu-like name": Case(gpu_pod(limits={"nvidia.com/gpu.shared": "1"}), labelled=False),
    "deleted": Case(gpu_pod(limits=GPU), labelled=False, operation="DELETE"),
}


@pytest.fixture(scope="module")
def conditions() -> MatchConditions:
    return MatchConditions(render("gpu-pod-label").get("MutatingAdmissionPolicy", POLICY))


@pytest.mark.parametrize("case", list(CASES))
def test_the_policy_applies_to_gpu_pods_without_the_label(
    case: str, conditions: MatchConditions
) -> None:
    spec = CASES[case]
    old = spec.pod if spec.operation == "UPDATE" else None
    assert conditions.hold(spec.pod, operation=spec.operation, old=old) is spec.labelled


def test_the_policy_follows_the_scorers_gpu_resource() -> None:
    values = {
        **ENABLED,
        "scorer": {**ENABLED["scorer"], "policy": {"gpu_resource_name": "amd.com/gpu"}},
    }
    rendered = Rendered("", parse_manifests(template(values)))
    conditions = MatchConditions(rendered.get("MutatingAdmissionPolicy", POLICY))
    assert conditions.hold(gpu_pod(limits={"amd.com/gpu": "1"}))
    assert not conditions.hold(gpu_pod(limits=GPU))
