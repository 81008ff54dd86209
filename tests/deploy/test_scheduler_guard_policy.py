"""The schedulerName guard, rendered by helm and evaluated offline with cel-python.

Two ValidatingAdmissionPolicies on pod creation: in the namespaces that opt in, a pod that
requests a GPU must name the chart's scheduler (`require-scheduler`); only those namespaces may
name it (`restrict-scheduler`). The first picks its namespaces with the binding's
namespaceSelector, the second reads the namespace's labels in CEL (a selector cannot say "every
namespace but these"), so the two must agree on which namespaces opted in: checked here for
every selector operator. tests/e2e/test_scheduler_guard.py runs the same policies on a real
kube-apiserver.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from tests.deploy.admission_cel import CelPolicy, Verdict, selector_matches
from tests.deploy.chart_support import (
    FULLNAME,
    GUARD_SELECTOR,
    VARIANTS,
    HelmError,
    Manifest,
    Rendered,
    notes,
    parse_manifests,
    render,
    template,
)

pytestmark = pytest.mark.helm

REQUIRE = f"{FULLNAME}-require-scheduler"
RESTRICT = f"{FULLNAME}-restrict-scheduler"
OPT_IN_LABEL = "gpu-scheduler.example.com/scheduler"


def guard_policies(rendered: Rendered) -> dict[str, CelPolicy]:
    """The guard's policies by name, each with its binding."""
    policies = {}
    for name in (REQUIRE, RESTRICT):
        policy = rendered.maybe("ValidatingAdmissionPolicy", name)
        if policy is not None:
            binding = rendered.get("ValidatingAdmissionPolicyBinding", name)
            policies[name] = CelPolicy(policy, binding)
    return policies


@pytest.fixture(scope="module")
def default_guard() -> dict[str, CelPolicy]:
    return guard_policies(render("defaults"))


def namespace(name: str, labels: dict[str, str] | None = None) -> Manifest:
    """A Namespace as the API server holds it (it adds the name label itself)."""
    return {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {
            "name": name,
            "labels": {"kubernetes.io/metadata.name": name, **(labels or {})},
        },
    }


OPTED_IN = namespace("ml-team", {OPT_IN_LABEL: "gpu-scheduler"})
ELSEWHERE = namespace("sandbox")
OTHER_SCHEDULERS_NAMESPACE = namespace("batch", {OPT_IN_LABEL: "volcano"})


def container(name: str = "main", **resources: dict[str, str]) -> Manifest:
    built: Manifest = {"name": name, "image": "registry.example/train:1"}
    if resources:
        built["resources"] = resources
    return built


GPU = {"limits": {"nvidia.com/gpu": "1"}}


@dataclass(frozen=True)
class PodSpec:
    containers: tuple[Manifest, ...] = (container(limits={"nvidia.com/gpu": "1"}),)
    init_containers: tuple[Manifest, ...] = ()
    # None: the field is absent (the API server defaults it to default-scheduler first).
    scheduler_name: str | None = "default-scheduler"
    extra: dict[str, Any] = field(default_factory=dict)

    def pod(self, name: str = "train") -> Manifest:
        spec: Manifest = {"containers": [dict(c) for c in self.containers], **self.extra}
        if self.init_containers:
            spec["initContainers"] = [dict(c) for c in self.init_containers]
        if self.scheduler_name is not None:
            spec["schedulerName"] = self.scheduler_name
        return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


GPU_POD = PodSpec()
CPU_POD = PodSpec(containers=(container(requests={"cpu": "2"}),))


@dataclass(frozen=True)
class Case:
    pod: PodSpec
    namespace: Manifest
    # The guard policies that refuse (or warn about) the pod.
    failing: frozenset[str]


CASES = {
    "gpu limit, default scheduler, opted-in namespace": Case(
        GPU_POD, OPTED_IN, frozenset({REQUIRE})
    ),
    "gpu limit, schedulerName absent, opted-in namespace": Case(
        PodSpec(scheduler_name=None), OPTED_IN, frozenset({REQUIRE})
    ),
    "gpu request only": Case(
        PodSpec(containers=(container(requests={"nvidia.com/gpu": "2"}),)),
        OPTED_IN,
        frozenset({REQUIRE}),
    ),
    "gpu in an init container only": Case(
        PodSpec(
            containers=(container(requests={"cpu": "1"}),),
            init_containers=(container("warmup", limits={"nvidia.com/gpu": "1"}),),
        ),
        OPTED_IN,
        frozenset({REQUIRE}),
    ),
    "gpu in the second container": Case(
        PodSpec(containers=(container("sidecar"), container("main", **GPU))),
        OPTED_IN,
        frozenset({REQUIRE}),
    ),
    # As kube-scheduler's managedResources: the resource named is enough.
    "gpu: 0 is still a request of the resource": Case(
        PodSpec(containers=(container(limits={"nvidia.com/gpu": "0"}),)),
        OPTED_IN,
        frozenset({REQUIRE}),
    ),
    "gpu pod naming another scheduler": Case(
        PodSpec(scheduler_name="volcano"), OPTED_IN, frozenset({REQUIRE})
    ),
    "gpu pod naming gpu-scheduler, opted-in namespace": Case(
        PodSpec(scheduler_name="gpu-scheduler"), OPTED_IN, frozenset()
    ),
    "cpu pod, opted-in namespace": Case(CPU_POD, OPTED_IN, frozenset()),
    "another vendor's gpu, opted-in namespace": Case(
        PodSpec(containers=(container(limits={"amd.com/gpu": "1"}),)), OPTED_IN, frozenset()
    ),
    "gpu pod naming gpu-scheduler, namespace not opted in": Case(
        PodSpec(scheduler_name="gpu-scheduler"), ELSEWHERE, frozenset({RESTRICT})
    ),
    "cpu pod naming gpu-scheduler, namespace not opted in": Case(
        PodSpec(containers=CPU_POD.containers, scheduler_name="gpu-scheduler"),
        ELSEWHERE,
        frozenset({RESTRICT}),
    ),
    "gpu pod, default scheduler, namespace not opted in": Case(GPU_POD, ELSEWHERE, frozenset()),
    "opt-in label naming another scheduler": Case(
        PodSpec(scheduler_name="gpu-scheduler"), OTHER_SCHEDULERS_NAMESPACE, frozenset({RESTRICT})
    ),
    "gpu pod, default scheduler, label naming another scheduler": Case(
        GPU_POD, OTHER_SCHEDULERS_NAMESPACE, frozenset()
    ),
}


@pytest.mark.parametrize("case", [pytest.param(c, id=n) for n, c in CASES.items()])
def test_which_pods_the_guard_holds(default_guard: dict[str, CelPolicy], case: Case) -> None:
    pod = case.pod.pod()
    failing = {
        name
        for name, policy in default_guard.items()
        if not policy.admit_create(pod, case.namespace).allowed
    }
    assert failing == case.failing


def test_the_messages_say_how_to_fix_it(default_guard: dict[str, CelPolicy]) -> None:
    require = default_guard[REQUIRE].admit_create(GPU_POD.pod(), OPTED_IN)
    assert require == Verdict(
        applies=True,
        allowed=False,
        messages=(
            "set spec.schedulerName: gpu-scheduler (pods requesting nvidia.com/gpu in namespace "
            "ml-team are placed on live GPU state); this pod names default-scheduler",
        ),
    )
    restrict = default_guard[RESTRICT].admit_create(
        PodSpec(scheduler_name="gpu-scheduler").pod(), ELSEWHERE
    )
    assert restrict.messages == (
        "namespace sandbox has not opted in to schedulerName gpu-scheduler: only namespaces "
        "labelled gpu-scheduler.example.com/scheduler=gpu-scheduler may use it (kubectl label "
        "namespace sandbox gpu-scheduler.example.com/scheduler=gpu-scheduler); or leave "
        "spec.schedulerName unset",
    )


CLAIM_POD = PodSpec(
    containers=({**container(), "resources": {"claims": [{"name": "gpu"}]}},),
    extra={"resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}]},
)


@pytest.mark.parametrize(
    ("values", "held"),
    [
        pytest.param({}, False, id="defaults"),
        pytest.param({"scorer": {"dra": {"enabled": True}}}, True, id="with-scorer-dra"),
        pytest.param(
            {"schedulerGuard": {"requireScheduler": {"resourceClaims": True}}}, True, id="asked"
        ),
        pytest.param(
            {
                "scorer": {"dra": {"enabled": True}},
                "schedulerGuard": {"requireScheduler": {"resourceClaims": False}},
            },
            False,
            id="turned-off",
        ),
    ],
)
def test_pods_with_resource_claims_are_held_where_the_scorer_judges_them(
    values: dict[str, Any], held: bool
) -> None:
    """A pod asking for GPUs through DRA alone requests no GPU resource; with the scorer
    judging DRA pods the guard holds any pod with a claim (admission cannot read its class)."""
    text = template(values)
    require = guard_policies(Rendered(text=text, manifests=parse_manifests(text)))[REQUIRE]
    verdict = require.admit_create(CLAIM_POD.pod(), OPTED_IN)
    assert verdict.allowed is not held
    placed = PodSpec(CLAIM_POD.containers, scheduler_name="gpu-scheduler", extra=CLAIM_POD.extra)
    assert require.admit_create(placed.pod(), OPTED_IN).allowed
    assert require.admit_create(CPU_POD.pod(), OPTED_IN).allowed
    if held:
        assert verdict.messages == (
            "set spec.schedulerName: gpu-scheduler (pods requesting nvidia.com/gpu or "
            "ResourceClaims in namespace ml-team are placed on live GPU state); this pod names "
            "default-scheduler",
        )


def test_both_policies_check_only_pod_creation_and_only_warn_by_default() -> None:
    rendered = render("defaults")
    for name in (REQUIRE, RESTRICT):
        spec = rendered.get("ValidatingAdmissionPolicy", name)["spec"]
        # spec.schedulerName is immutable: an update cannot change what creation checked.
        assert spec["matchConstraints"]["resourceRules"] == [
            {
                "apiGroups": [""],
                "apiVersions": ["v1"],
                "operations": ["CREATE"],
                "resources": ["pods"],
            }
        ]
        assert spec["failurePolicy"] == "Fail"
        assert all(v["reason"] == "Forbidden" for v in spec["validations"])
        binding = rendered.get("ValidatingAdmissionPolicyBinding", name)["spec"]
        assert binding["validationActions"] == ["Warn", "Audit"]
    require_binding = rendered.get("ValidatingAdmissionPolicyBinding", REQUIRE)["spec"]
    assert require_binding["matchResources"] == {
        "namespaceSelector": {"matchLabels": {OPT_IN_LABEL: "gpu-scheduler"}}
    }
    # Every namespace: the policy itself tells opted-in ones apart.
    assert (
        "matchResources" not in rendered.get("ValidatingAdmissionPolicyBinding", RESTRICT)["spec"]
    )


def test_deny_and_failure_policy_are_what_the_values_say() -> None:
    rendered = render("scheduler-guard-deny")
    require = rendered.get("ValidatingAdmissionPolicy", REQUIRE)["spec"]
    assert require["failurePolicy"] == "Ignore"
    actions = {
        name: rendered.get("ValidatingAdmissionPolicyBinding", name)["spec"]["validationActions"]
        for name in (REQUIRE, RESTRICT)
    }
    assert actions == {REQUIRE: ["Deny"], RESTRICT: ["Deny", "Audit"]}
    binding = rendered.get("ValidatingAdmissionPolicyBinding", REQUIRE)["spec"]
    assert binding["matchResources"]["namespaceSelector"] == GUARD_SELECTOR


@pytest.mark.parametrize(
    ("variant", "expected"),
    [
        pytest.param("defaults", {REQUIRE, RESTRICT}, id="on-by-default"),
        pytest.param("scheduler-guard-off", set(), id="both-off"),
        pytest.param("scheduler-off", set(), id="no-scheduler-to-guard"),
    ],
)
def test_guard_toggles(variant: str, expected: set[str]) -> None:
    assert set(guard_policies(render(variant))) == expected


# Label sets for the custom selector (GUARD_SELECTOR: every operator).
TENANT = {"gpu.acme.io/tenant": "yes", "team": "ml", "gpu.acme.io/quota": "8"}
LABEL_SETS = {
    "all terms hold": TENANT,
    "In: another value": {**TENANT, "team": "web"},
    "In: label missing": {k: v for k, v in TENANT.items() if k != "team"},
    "NotIn: a listed value": {**TENANT, "tier": "dev"},
    "NotIn: another value": {**TENANT, "tier": "prod"},
    "Exists: label missing": {k: v for k, v in TENANT.items() if k != "gpu.acme.io/quota"},
    "DoesNotExist: label present": {**TENANT, "legacy": "true"},
    "matchLabels: another value": {**TENANT, "gpu.acme.io/tenant": "no"},
    "no labels": {},
}


@pytest.fixture(scope="module")
def custom_guard() -> dict[str, CelPolicy]:
    return guard_policies(render("scheduler-guard-deny"))


@pytest.mark.parametrize("labels", [pytest.param(v, id=k) for k, v in LABEL_SETS.items()])
def test_both_policies_agree_on_which_namespaces_opted_in(
    custom_guard: dict[str, CelPolicy], labels: dict[str, str]
) -> None:
    ns = namespace("team-a", labels)
    opted_in = selector_matches(GUARD_SELECTOR, ns["metadata"]["labels"])
    require = custom_guard[REQUIRE].admit_create(GPU_POD.pod(), ns)
    restrict = custom_guard[RESTRICT].admit_create(PodSpec(scheduler_name="gpu-live").pod(), ns)
    assert require.applies is opted_in  # the binding's selector, as the API server reads it
    assert not require.allowed if opted_in else require.allowed
    assert restrict.allowed is opted_in  # the policy's CEL reading of the same selector


def test_the_selector_check_can_tell_namespaces_apart() -> None:
    # The table above needs both outcomes to mean anything.
    outcomes = {selector_matches(GUARD_SELECTOR, labels) for labels in LABEL_SETS.values()}
    assert outcomes == {True, False}


def test_a_selector_with_expressions_is_named_in_the_message(
    custom_guard: dict[str, CelPolicy],
) -> None:
    verdict = custom_guard[RESTRICT].admit_create(
        PodSpec(scheduler_name="gpu-live").pod(), namespace("web")
    )
    assert verdict.messages == (
        "namespace web has not opted in to schedulerName gpu-live: only namespaces whose labels "
        "match gpu.acme.io/tenant=yes,team in (ml,cv),tier notin (dev),gpu.acme.io/quota,!legacy "
        "may use it; or leave spec.schedulerName unset",
    )


def test_every_managed_gpu_resource_is_held_to_the_scheduler(
    custom_guard: dict[str, CelPolicy],
) -> None:
    ns = namespace("team-a", TENANT)
    mig = PodSpec(containers=(container(limits={"nvidia.com/mig-1g.10gb": "1"}),))
    verdict = custom_guard[REQUIRE].admit_create(mig.pod(), ns)
    assert verdict.messages == (
        "set spec.schedulerName: gpu-live (pods requesting nvidia.com/gpu or "
        "nvidia.com/mig-1g.10gb in namespace team-a are placed on live GPU state); this pod "
        "names default-scheduler",
    )
    assert (
        custom_guard[REQUIRE]
        .admit_create(PodSpec(containers=mig.containers, scheduler_name="gpu-live").pod(), ns)
        .allowed
    )


def test_the_opt_in_label_follows_the_prefix_and_the_scheduler_name() -> None:
    values = {"annotationPrefix": "gpu.acme.io", "scheduler": {"name": "live-gpu"}}
    rendered = Rendered("", parse_manifests(template(values)))
    binding = rendered.get("ValidatingAdmissionPolicyBinding", REQUIRE)["spec"]
    assert binding["matchResources"]["namespaceSelector"] == {
        "matchLabels": {"gpu.acme.io/scheduler": "live-gpu"}
    }
    restrict = guard_policies(rendered)[RESTRICT]
    labelled = namespace("ml", {"gpu.acme.io/scheduler": "live-gpu"})
    pod = PodSpec(scheduler_name="live-gpu").pod()
    assert restrict.admit_create(pod, labelled).allowed
    assert not restrict.admit_create(pod, namespace("ml")).allowed


@pytest.mark.parametrize(
    ("values", "message"),
    [
        pytest.param(
            {"schedulerGuard": {"requireScheduler": {"validationActions": ["Deny", "Warn"]}}},
            "schedulerGuard.requireScheduler.validationActions: Deny and Warn cannot be combined",
            id="deny-and-warn",
        ),
        pytest.param(
            {"schedulerGuard": {"restrictScheduler": {"validationActions": ["Block"]}}},
            "value must be one of 'Deny', 'Warn', 'Audit'",
            id="unknown-action",
        ),
        pytest.param(
            {"schedulerGuard": {"requireScheduler": {"validationActions": []}}},
            "minItems",
            id="no-action",
        ),
        pytest.param(
            {"schedulerGuard": {"namespaceSelector": {}}},
            "missing property 'matchLabels'",
            id="empty-selector-would-match-every-namespace",
        ),
        pytest.param(
            {
                "schedulerGuard": {
                    "namespaceSelector": {
                        "matchExpressions": [{"key": "team", "operator": "Equals"}]
                    }
                }
            },
            "value must be one of 'In', 'NotIn', 'Exists', 'DoesNotExist'",
            id="unknown-operator",
        ),
        pytest.param(
            {"schedulerGuard": {"namespaceSelector": {"matchLabels": {"team": "ml's"}}}},
            "does not match pattern",
            id="label-value-with-a-quote",
        ),
        pytest.param(
            {"schedulerGuard": {"requireScheduler": {"failurePolicy": "Warn"}}},
            "value must be one of 'Fail', 'Ignore'",
            id="bad-failure-policy",
        ),
        pytest.param(
            {"scheduler": {"name": "a" * 64}},
            "needs a label value of at most 63 characters: set schedulerGuard.namespaceSelector",
            id="scheduler-name-too-long-for-the-default-label",
        ),
    ],
)
def test_bad_guard_values_fail_with_a_clear_message(values: dict[str, Any], message: str) -> None:
    with pytest.raises(HelmError) as refused:
        template(values)
    assert message in str(refused.value)


@pytest.mark.parametrize(
    ("variant", "shown", "hidden"),
    [
        pytest.param(
            "defaults",
            [
                "kubectl label namespace <namespace> "
                "gpu-scheduler.example.com/scheduler=gpu-scheduler",
                "warns about a GPU pod in an opted-in namespace without schedulerName: "
                "gpu-scheduler",
                "warns about a pod with schedulerName: gpu-scheduler in any other namespace",
            ],
            [],
            id="label-command-and-warnings",
        ),
        pytest.param(
            "scheduler-guard-deny",
            [
                "give it labels that match gpu.acme.io/tenant=yes,team in (ml,cv)",
                "refuses a GPU pod in an opted-in namespace without schedulerName: gpu-live",
            ],
            ["kubectl label namespace"],
            id="selector-and-refusals",
        ),
        pytest.param("scheduler-guard-off", [], ["schedulerName guard"], id="off"),
    ],
)
def test_notes_say_how_a_namespace_opts_in(
    variant: str, shown: list[str], hidden: list[str]
) -> None:
    text = notes(VARIANTS[variant].values)
    for line in shown:
        assert line in text
    for line in hidden:
        assert line not in text
