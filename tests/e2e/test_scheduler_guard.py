"""The schedulerName guard on a real kube-apiserver v1.37, driven with kubectl as a user would.

The chart's two ValidatingAdmissionPolicies and their bindings, rendered by helm, applied as the
chart would: with the default validationActions (Warn, Audit) a pod that breaks a rule is
created, kubectl prints the API server's `Warning` header, the audit log records the failure and
`apiserver_validating_admission_policy_check_total` counts it; with Deny it is refused with the
same message; with the scorer judging DRA pods, a pod with a ResourceClaim is held too. Each
message is compared with the one cel-python computes from the same rendered policy
(tests/deploy/admission_cel.py), and with the kubectl session docs/deploy.md shows.

`restrict-scheduler` holds every namespace, and other tests create pods naming the scheduler
wherever they like, so these tests run on a control plane of their own, with audit logging on.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from loopback_cluster.control_plane import ControlPlane, KubeApi, ManagedProcess, Ports
from loopback_cluster.workload import apply, wait_for
from tests.deploy.admission_cel import CelPolicy
from tests.deploy.chart_support import FULLNAME, ROOT, parse_manifests, template
from tests.e2e.support import kube_version, require_control_plane

REQUIRE = f"{FULLNAME}-require-scheduler"
RESTRICT = f"{FULLNAME}-restrict-scheduler"
OPT_IN = {"gpu-scheduler.example.com/scheduler": "gpu-scheduler"}
OPTED_IN, ELSEWHERE = "ml-team", "sandbox"
DOCS = ROOT / "docs" / "deploy.md"

_VAP = "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies"
_BINDING = "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings"
MODES: dict[str, dict[str, Any]] = {
    # The chart's defaults.
    "warn": {},
    "deny": {
        "schedulerGuard": {
            "requireScheduler": {"validationActions": ["Deny"]},
            "restrictScheduler": {"validationActions": ["Deny"]},
        }
    },
    # The scorer judging DRA pods: pods with ResourceClaims are held to the scheduler too.
    "deny-with-claims": {
        "scorer": {"dra": {"enabled": True}},
        "schedulerGuard": {
            "requireScheduler": {"validationActions": ["Deny"]},
            "restrictScheduler": {"validationActions": ["Deny"]},
        },
    },
}

# Metadata of every pod creation (the annotations a policy adds are part of it); nothing else.
AUDIT_POLICY = """\
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
  - level: Metadata
    verbs: ["create"]
    resources:
      - group: ""
        resources: ["pods"]
  - level: None
"""
VALIDATION_FAILURE = "validation.policy.admission.k8s.io/validation_failure"


class AuditedControlPlane(ControlPlane):
    """The loopback control plane, its kube-apiserver writing an audit log of pod creations."""

    @property
    def audit_log(self) -> Path:
        return self.state_dir / "audit.log"

    def apiserver(self) -> ManagedProcess:
        process = super().apiserver()
        policy = self.state_dir / "audit-policy.yaml"
        policy.write_text(AUDIT_POLICY)
        process.argv += [f"--audit-policy-file={policy}", f"--audit-log-path={self.audit_log}"]
        return process

    def audit_events(self) -> list[dict[str, Any]]:
        if not self.audit_log.is_file():
            return []
        lines = self.audit_log.read_text().splitlines()
        return [json.loads(line) for line in lines if line.strip()]


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AuditedControlPlane]:
    require_control_plane()
    state_dir = tmp_path_factory.mktemp("guard-plane")
    control_plane = AuditedControlPlane(state_dir, Ports.free(), tie_to_parent=True)
    control_plane.up()
    try:
        yield control_plane
    finally:
        control_plane.down()


@dataclass(frozen=True)
class Run:
    rc: int
    stdout: str
    stderr: str


@dataclass(frozen=True)
class Kubectl:
    binary: Path
    kubeconfig: Path
    cache_dir: Path

    def __call__(self, *args: str, cwd: Path | None = None) -> Run:
        env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
        done = subprocess.run(
            [str(self.binary), "--kubeconfig", str(self.kubeconfig), "--cache-dir",
             str(self.cache_dir), *args],
            capture_output=True, text=True, timeout=60, check=False, cwd=cwd, env=env,
        )  # fmt: skip
        return Run(done.returncode, done.stdout, done.stderr)


def kubectl_binary() -> Path:
    """kubectl from .tools/bin (`python3 dev.py tools`) or PATH; skip without it, fail in CI."""
    local = ROOT / ".tools" / "bin" / "kubectl"
    if local.is_file() and os.access(local, os.X_OK):
        return local
    found = shutil.which("kubectl")
    if found:
        return Path(found)
    message = "kubectl not found in .tools/bin or PATH (python3 dev.py tools installs it)"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(message + "; CI must run the guard checks")
    pytest.skip(message)


@dataclass(frozen=True)
class Cluster:
    """The control plane, its admin client, kubectl, and the two namespaces the tests use."""

    plane: AuditedControlPlane
    admin: KubeApi
    kubectl: Kubectl
    # The Namespace objects as the API server holds them.
    namespaces: dict[str, dict[str, Any]]
    # Where pod manifests are written for `kubectl create -f`.
    workdir: Path

    def create(
        self,
        namespace: str,
        manifest: dict[str, Any],
        *,
        file: str | None = None,
        dry_run: bool = False,
    ) -> Run:
        """`kubectl -n <namespace> create -f <file>` (default `<pod name>.yaml`), as
        docs/deploy.md shows it."""
        path = self.workdir / (file or f"{manifest['metadata']['name']}.yaml")
        path.write_text(json.dumps(manifest))
        flags = ["--dry-run=server"] if dry_run else []
        return self.kubectl("-n", namespace, "create", *flags, "-f", path.name, cwd=self.workdir)

    def pod_exists(self, namespace: str, name: str) -> bool:
        status, _ = self.admin.raw("GET", f"/api/v1/namespaces/{namespace}/pods/{name}")
        assert status in (200, 404)
        return status == 200

    def delete_pod(self, namespace: str, name: str) -> None:
        self.admin.delete(f"/api/v1/namespaces/{namespace}/pods/{name}")


@pytest.fixture(scope="module")
def cluster(
    plane: AuditedControlPlane, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    """One namespace that opted in, one that did not, each with the ServiceAccount pods need."""
    kubectl = Kubectl(kubectl_binary(), plane.admin_kubeconfig, tmp_path_factory.mktemp("cache"))
    with plane.admin() as admin:
        for name, labels in ((OPTED_IN, OPT_IN), (ELSEWHERE, {})):
            admin.create("/api/v1/namespaces", {"metadata": {"name": name, "labels": labels}})
            admin.create(
                f"/api/v1/namespaces/{name}/serviceaccounts", {"metadata": {"name": "default"}}
            )
        namespaces = {
            name: admin.get(f"/api/v1/namespaces/{name}") for name in (OPTED_IN, ELSEWHERE)
        }
        yield Cluster(plane, admin, kubectl, namespaces, tmp_path_factory.mktemp("pods"))


def pod(
    name: str,
    *,
    scheduler: str | None = None,
    gpu_in: str | None = "containers",
) -> dict[str, Any]:
    """A pod asking for a GPU in its `containers` or `initContainers`, through a ResourceClaim
    template (`claims`: DRA alone, no GPU resource), or not at all (None)."""
    gpu = {"limits": {"nvidia.com/gpu": "1"}}
    main: dict[str, Any] = {"name": "main", "image": "registry.example/train:1"}
    spec: dict[str, Any] = {"containers": [main], "terminationGracePeriodSeconds": 0}
    if gpu_in == "containers":
        main["resources"] = gpu
    elif gpu_in == "claims":
        spec["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}]
        main["resources"] = {"claims": [{"name": "gpu"}]}
    elif gpu_in == "initContainers":
        spec["initContainers"] = [
            {"name": "warmup", "image": "registry.example/train:1", "resources": gpu}
        ]
    if scheduler is not None:
        spec["schedulerName"] = scheduler
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


@dataclass(frozen=True)
class Guard:
    mode: str
    cluster: Cluster
    # The rendered policies, evaluated offline: what each message should read.
    policies: dict[str, CelPolicy]
    # A pod that breaks restrict-scheduler, created before the policies.
    existing: str | None = None

    @property
    def denies(self) -> bool:
        return self.mode != "warn"

    @property
    def holds_claims(self) -> bool:
        return self.mode == "deny-with-claims"


def _rendered_guard(values: dict[str, Any]) -> list[dict[str, Any]]:
    manifests = parse_manifests(template(values, kube_version=kube_version()))
    chosen = [m for m in manifests if m["metadata"]["name"] in (REQUIRE, RESTRICT)]
    assert {m["kind"] for m in chosen} == {
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    }
    return chosen


@pytest.fixture(scope="module", params=list(MODES))
def guard(request: pytest.FixtureRequest, cluster: Cluster) -> Iterator[Guard]:
    mode = str(request.param)
    admin = cluster.admin
    manifests = _rendered_guard(MODES[mode])
    existing = None
    if mode == "deny":
        existing = "existing"
        admin.create(
            f"/api/v1/namespaces/{ELSEWHERE}/pods", pod(existing, scheduler="gpu-scheduler")
        )
    for manifest in manifests:
        apply(admin, manifest)
    by_name = {(m["kind"], m["metadata"]["name"]): m for m in manifests}
    policies = {
        name: CelPolicy(
            by_name[("ValidatingAdmissionPolicy", name)],
            by_name[("ValidatingAdmissionPolicyBinding", name)],
        )
        for name in (REQUIRE, RESTRICT)
    }

    # The bindings take effect when the API server's policy informer has them (about a second),
    # and until then it may still hold the previous mode's policies of the same names: wait
    # until a server-side dry run of a pod breaking each rule gets this mode's answer, its
    # action and its message as computed offline from this mode's policies.
    def effective() -> bool:
        for namespace, probe, policy in (
            (OPTED_IN, pod("probe"), REQUIRE),
            (ELSEWHERE, pod("probe", scheduler="gpu-scheduler"), RESTRICT),
        ):
            stderr = cluster.create(namespace, probe, dry_run=True).stderr
            (message,) = (
                policies[policy].admit_create(probe, cluster.namespaces[namespace]).messages
            )
            if ("denied request" if mode != "warn" else "Warning:") not in stderr:
                return False
            if message not in stderr:
                return False
        return True

    wait_for(f"the guard policies in {mode} mode", effective, timeout_s=20, interval_s=0.3)
    try:
        yield Guard(mode, cluster, policies, existing)
    finally:
        for manifest in manifests:
            collection = _VAP if manifest["kind"] == "ValidatingAdmissionPolicy" else _BINDING
            admin.delete(f"{collection}/{manifest['metadata']['name']}")
        if existing is not None:
            admin.delete(f"/api/v1/namespaces/{ELSEWHERE}/pods/{existing}")


@dataclass(frozen=True)
class Case:
    namespace: str
    pod: dict[str, Any]
    # The guard policy the pod breaks, if any.
    breaks: str | None
    # It breaks it only where the guard holds pods with ResourceClaims.
    with_claims_only: bool = False

    def broken(self, guard: Guard) -> str | None:
        return None if self.with_claims_only and not guard.holds_claims else self.breaks


CASES = {
    "gpu pod without schedulerName, opted-in namespace": Case(OPTED_IN, pod("train"), REQUIRE),
    "gpu in an init container, opted-in namespace": Case(
        OPTED_IN, pod("warmup", gpu_in="initContainers"), REQUIRE
    ),
    "gpu pod naming another scheduler, opted-in namespace": Case(
        OPTED_IN, pod("volcano", scheduler="volcano"), REQUIRE
    ),
    "gpu pod naming gpu-scheduler, opted-in namespace": Case(
        OPTED_IN, pod("placed", scheduler="gpu-scheduler"), None
    ),
    "cpu pod, opted-in namespace": Case(OPTED_IN, pod("web", gpu_in=None), None),
    "pod with a resource claim only, opted-in namespace": Case(
        OPTED_IN, pod("claims", gpu_in="claims"), REQUIRE, with_claims_only=True
    ),
    "pod with a resource claim naming gpu-scheduler, opted-in namespace": Case(
        OPTED_IN, pod("claims-placed", scheduler="gpu-scheduler", gpu_in="claims"), None
    ),
    "gpu pod naming gpu-scheduler, namespace not opted in": Case(
        ELSEWHERE, pod("train", scheduler="gpu-scheduler"), RESTRICT
    ),
    "cpu pod naming gpu-scheduler, namespace not opted in": Case(
        ELSEWHERE, pod("web", scheduler="gpu-scheduler", gpu_in=None), RESTRICT
    ),
    "gpu pod with the default scheduler, namespace not opted in": Case(
        ELSEWHERE, pod("train-default"), None
    ),
}


def expected_message(guard: Guard, case: Case, namespace: dict[str, Any]) -> str:
    policy = case.broken(guard)
    assert policy is not None
    verdict = guard.policies[policy].admit_create(case.pod, namespace)
    (message,) = verdict.messages
    return message


@pytest.mark.parametrize("case", [pytest.param(c, id=n) for n, c in CASES.items()])
def test_the_api_server_warns_or_refuses_as_the_mode_says(guard: Guard, case: Case) -> None:
    cluster = guard.cluster
    name = case.pod["metadata"]["name"]
    run = cluster.create(case.namespace, case.pod)
    try:
        policy = case.broken(guard)
        if policy is None:
            assert (run.rc, run.stderr) == (0, ""), run
            assert cluster.pod_exists(case.namespace, name)
            return
        message = expected_message(guard, case, cluster.namespaces[case.namespace])
        if not guard.denies:
            assert run.rc == 0, run
            assert run.stderr == (
                f"Warning: Validation failed for ValidatingAdmissionPolicy '{policy}' with "
                f"binding '{policy}': {message}\n"
            )
            assert run.stdout == f"pod/{name} created\n"
            assert cluster.pod_exists(case.namespace, name)
        else:
            assert run.rc == 1, run
            assert run.stderr == (
                f'Error from server (Forbidden): error when creating "{name}.yaml": pods '
                f"\"{name}\" is forbidden: ValidatingAdmissionPolicy '{policy}' with binding "
                f"'{policy}' denied request: {message}\n"
            )
            assert not cluster.pod_exists(case.namespace, name)
    finally:
        cluster.delete_pod(case.namespace, name)


# The audit annotation comes with the Audit action of the default bindings.
@pytest.mark.parametrize("guard", ["warn"], indirect=True)
def test_warnings_are_audited_and_counted(guard: Guard) -> None:
    cluster = guard.cluster
    before = _checks(cluster.admin, REQUIRE, "warn")
    case = CASES["gpu pod without schedulerName, opted-in namespace"]
    manifest = {**case.pod, "metadata": {"name": "audited"}}
    try:
        assert cluster.create(OPTED_IN, manifest).rc == 0

        def audited() -> dict[str, Any] | None:
            for event in cluster.plane.audit_events():
                ref = event.get("objectRef", {})
                if (
                    ref.get("namespace") == OPTED_IN
                    and ref.get("name") == "audited"
                    and event.get("stage") == "ResponseComplete"
                ):
                    return dict(event)
            return None

        event = wait_for("the audit event of the pod creation", audited, timeout_s=10)
        (failure,) = json.loads(event["annotations"][VALIDATION_FAILURE])
        assert failure == {
            "message": "set spec.schedulerName: gpu-scheduler (pods requesting nvidia.com/gpu "
            "in namespace ml-team are placed on live GPU state); this pod names default-scheduler",
            "policy": REQUIRE,
            "binding": REQUIRE,
            "expressionIndex": 0,
            "validationActions": ["Warn", "Audit"],
        }
        assert event["responseStatus"]["code"] == 201
        # One failure, counted once per action.
        assert _checks(cluster.admin, REQUIRE, "warn") == before + 1
    finally:
        cluster.delete_pod(OPTED_IN, "audited")


def _checks(admin: KubeApi, policy: str, action: str) -> float:
    status, body = admin.raw("GET", "/metrics")
    assert status == 200
    pattern = re.compile(
        r"^apiserver_validating_admission_policy_check_total\{(?P<labels>[^}]*)\} (?P<value>\S+)$"
    )
    total = 0.0
    for line in body.decode().splitlines():
        found = pattern.match(line)
        wanted = (f'policy="{policy}"', f'enforcement_action="{action}"')
        if found and all(label in found["labels"] for label in wanted):
            total += float(found["value"])
    return total


@pytest.mark.parametrize("guard", ["deny"], indirect=True)
def test_only_creation_is_checked(guard: Guard) -> None:
    # A pod created before the guard denied it can still be labelled (an UPDATE).
    assert guard.existing is not None
    path = f"/api/v1/namespaces/{ELSEWHERE}/pods/{guard.existing}"
    patched = guard.cluster.admin.merge_patch(path, {"metadata": {"labels": {"checked": "yes"}}})
    assert patched["metadata"]["labels"] == {"checked": "yes"}
    assert patched["spec"]["schedulerName"] == "gpu-scheduler"


@pytest.mark.parametrize("guard", ["warn", "deny"], indirect=True)
def test_the_docs_show_what_the_api_server_says(guard: Guard) -> None:
    # Every `Warning:` and `Error from server` line of the guard's session in docs/deploy.md is
    # one the API server returns for the same commands.
    text = DOCS.read_text()
    session = text[text.index("<!-- guard-session -->") : text.index("<!-- /guard-session -->")]
    shown = [
        line for line in session.splitlines() if line.startswith(("Warning: ", "Error from server"))
    ]
    returned: list[str] = []
    for file, case_name in (
        ("gpu-pod.yaml", "gpu pod without schedulerName, opted-in namespace"),
        ("gpu-pod-live.yaml", "gpu pod naming gpu-scheduler, namespace not opted in"),
    ):
        case = CASES[case_name]
        try:
            returned += guard.cluster.create(
                case.namespace, case.pod, file=file
            ).stderr.splitlines()
        finally:
            guard.cluster.delete_pod(case.namespace, case.pod["metadata"]["name"])
    prefix = "Warning: " if guard.mode == "warn" else "Error from server"
    this_mode = [line for line in shown if line.startswith(prefix)]
    assert len(this_mode) == 2, shown
    assert set(this_mode) <= set(returned), (this_mode, returned)
