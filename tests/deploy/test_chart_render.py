"""The chart, rendered by the real helm for every toggle: lint, OpenAPI validity, and what it says.

Each values variant in `chart_support.VARIANTS` is rendered once; every manifest is validated
against Kubernetes' OpenAPI schemas (1.36 and 1.37, strict: unknown fields fail). The
KubeSchedulerConfiguration is not an API object, so its fields are checked against the
kubescheduler.config.k8s.io/v1 Go types' JSON names, because kube-scheduler decodes it strictly.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml

from tests.deploy.chart_support import (
    CHART,
    CRD_KINDS,
    FIXTURES,
    FULLNAME,
    NAMESPACE,
    SCHEMA_VERSIONS,
    VARIANTS,
    HelmError,
    Manifest,
    Rendered,
    containers,
    env_of,
    lint,
    notes,
    openapi_errors,
    parse_manifests,
    render,
    template,
)

pytestmark = pytest.mark.helm

AGENT = f"{FULLNAME}-agent"
SCORER = f"{FULLNAME}-scorer"
SCHEDULER = f"{FULLNAME}-scheduler"


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_helm_lint_passes(variant: str) -> None:
    spec = VARIANTS[variant]
    output = lint(spec.values, kube_version=spec.kube_version)
    assert "0 chart(s) failed" in output


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_every_manifest_validates_against_kubernetes_openapi(variant: str) -> None:
    rendered = render(variant)
    errors: list[str] = []
    checked = 0
    for manifest in rendered.manifests:
        if (manifest["apiVersion"], manifest["kind"]) in CRD_KINDS:
            continue  # no OpenAPI schema without the CRD; its shape is asserted below
        for version in SCHEMA_VERSIONS:
            errors.extend(f"[{version}] {e}" for e in openapi_errors(manifest, version))
        checked += 1
    assert checked >= 5
    assert errors == []


def test_openapi_validation_catches_a_bad_manifest() -> None:
    # The validator itself must fail on an unknown field and a wrong type, or the test above
    # proves nothing.
    daemonset = json.loads(json.dumps(render("defaults").get("DaemonSet", AGENT)))
    daemonset["spec"]["template"]["spec"]["containers"][0]["imagePullPolcy"] = "Always"
    daemonset["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = "thirty"
    errors = list(openapi_errors(daemonset, SCHEMA_VERSIONS[0]))
    assert any("imagePullPolcy" in e for e in errors)
    assert any("thirty" in e for e in errors)


# Field names of kubescheduler.config.k8s.io/v1 (k8s.io/kube-scheduler/config/v1/types.go).
SCHEDULER_CONFIG_FIELDS = {
    "apiVersion",
    "kind",
    "parallelism",
    "leaderElection",
    "clientConnection",
    "enableProfiling",
    "enableContentionProfiling",
    "percentageOfNodesToScore",
    "podInitialBackoffSeconds",
    "podMaxBackoffSeconds",
    "profiles",
    "extenders",
    "delayCacheUntilActive",
}
LEADER_ELECTION_FIELDS = {
    "leaderElect",
    "leaseDuration",
    "renewDeadline",
    "retryPeriod",
    "resourceLock",
    "resourceName",
    "resourceNamespace",
}
PROFILE_FIELDS = {"schedulerName", "percentageOfNodesToScore", "plugins", "pluginConfig"}
EXTENDER_FIELDS = {
    "urlPrefix",
    "filterVerb",
    "preemptVerb",
    "prioritizeVerb",
    "weight",
    "bindVerb",
    "enableHTTPS",
    "tlsConfig",
    "httpTimeout",
    "nodeCacheCapable",
    "managedResources",
    "ignorable",
}
TLS_FIELDS = {"insecure", "serverName", "certFile", "keyFile", "caFile", "certData", "keyData"}
TLS_FIELDS |= {"caData"}
MANAGED_RESOURCE_FIELDS = {"name", "ignoredByScheduler"}


def _scheduler_config_problems(config: dict[str, Any]) -> list[str]:
    problems = [f"unknown field {k}" for k in set(config) - SCHEDULER_CONFIG_FIELDS]
    if config.get("apiVersion") != "kubescheduler.config.k8s.io/v1":
        problems.append(f"apiVersion {config.get('apiVersion')}")
    if config.get("kind") != "KubeSchedulerConfiguration":
        problems.append(f"kind {config.get('kind')}")
    problems += [
        f"leaderElection.{k}" for k in set(config["leaderElection"]) - LEADER_ELECTION_FIELDS
    ]
    for profile in config["profiles"]:
        problems += [f"profile.{k}" for k in set(profile) - PROFILE_FIELDS]
    for extender in config["extenders"]:
        problems += [f"extender.{k}" for k in set(extender) - EXTENDER_FIELDS]
        problems += [f"tlsConfig.{k}" for k in set(extender.get("tlsConfig", {})) - TLS_FIELDS]
        for resource in extender.get("managedResources", ()):
            problems += [f"managedResources.{k}" for k in set(resource) - MANAGED_RESOURCE_FIELDS]
        if not isinstance(extender["weight"], int) or extender["weight"] <= 0:
            problems.append("weight must be a positive integer")
        if not str(extender["httpTimeout"]).endswith(("s", "ms", "m")):
            problems.append("httpTimeout must be a Go duration")
    return problems


@pytest.mark.parametrize(
    "variant",
    [v for v in VARIANTS if VARIANTS[v].values.get("scheduler", {}).get("enabled", True)],
)
def test_scheduler_configuration_uses_only_known_fields(variant: str) -> None:
    assert _scheduler_config_problems(render(variant).scheduler_config()) == []


def test_scheduler_configuration_check_catches_a_typo() -> None:
    config = render("defaults").scheduler_config()
    config["extenders"][0]["enableHttps"] = True  # the legacy Policy spelling, not v1's
    assert _scheduler_config_problems(config) == ["extender.enableHttps"]


@pytest.mark.parametrize(
    ("variant", "capture"),
    [
        pytest.param("defaults", "sched-extender-nodecache.yaml", id="names-only"),
        pytest.param("full-node", "sched-extender.yaml", id="full-node"),
    ],
)
def test_scheduler_configuration_matches_a_real_v1_36_configuration(
    variant: str, capture: str
) -> None:
    # The fixtures are configurations a real kube-scheduler v1.36 ran with; the chart's must use
    # the same field names and verb spellings.
    fixture = FIXTURES / "kube-scheduler-v1.36" / "config"
    real = yaml.safe_load((fixture / capture).read_text())
    ours = render(variant).scheduler_config()
    real_extender, our_extender = real["extenders"][0], ours["extenders"][0]
    assert set(real_extender) <= set(our_extender)
    for key in ("filterVerb", "prioritizeVerb", "nodeCacheCapable", "managedResources"):
        assert our_extender[key] == real_extender[key], key
    assert ours["profiles"][0]["schedulerName"] == real["profiles"][0]["schedulerName"]


# ---------------------------------------------------------------------- the agent DaemonSet


def test_agent_runs_on_gpu_nodes_only_and_tolerates_gpu_taints() -> None:
    pod = render("defaults").get("DaemonSet", AGENT)["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    tolerated = {(t["key"], t.get("effect")) for t in pod["tolerations"]}
    assert {("nvidia.com/gpu", "NoSchedule"), ("nvidia.com/gpu", "NoExecute")} <= tolerated
    assert "runtimeClassName" not in pod
    simulated = render("simulated-custom-prefix").get("DaemonSet", AGENT)
    assert simulated["spec"]["template"]["spec"]["runtimeClassName"] == "nvidia"


def test_agent_sees_gpus_through_the_runtime_without_taking_one() -> None:
    rendered = render("defaults")
    agent = containers(rendered.get("DaemonSet", AGENT))["agent"]
    env = {e["name"]: e for e in agent["env"]}
    assert env["NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert env["NVIDIA_VISIBLE_DEVICES"]["value"] == "all"
    assert env["NVIDIA_DRIVER_CAPABILITIES"]["value"] == "utility"
    resources = agent["resources"]
    for section in ("requests", "limits"):
        assert not any("nvidia.com" in name for name in resources.get(section, {}))
    assert resources["requests"] == {"cpu": "20m", "memory": "112Mi"}
    assert resources["limits"] == {"memory": "192Mi"}


LEAST_PRIVILEGE = {
    "allowPrivilegeEscalation": False,
    "readOnlyRootFilesystem": True,
    "capabilities": {"drop": ["ALL"]},
}


def test_agent_runs_with_least_privilege() -> None:
    daemonset = render("pod-resources-off").get("DaemonSet", AGENT)
    pod = daemonset["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert containers(daemonset)["agent"]["securityContext"] == LEAST_PRIVILEGE
    assert "hostNetwork" not in pod
    assert "hostPID" not in pod
    assert [v["name"] for v in pod["volumes"]] == ["tmp"]


def test_agent_reads_the_kubelet_socket_read_only_as_uid_0_without_capabilities() -> None:
    rendered = render("defaults")
    daemonset = rendered.get("DaemonSet", AGENT)
    pod = daemonset["spec"]["template"]["spec"]
    agent = containers(daemonset)["agent"]
    # The socket is root's, mode 0755: uid 0, but nothing else a root container usually has.
    assert agent["securityContext"] == {**LEAST_PRIVILEGE, "runAsUser": 0, "runAsNonRoot": False}
    volume = next(v for v in pod["volumes"] if v["name"] == "pod-resources")
    assert volume["hostPath"] == {
        "path": "/var/lib/kubelet/pod-resources",
        "type": "DirectoryOrCreate",
    }
    mount = next(m for m in agent["volumeMounts"] if m["name"] == "pod-resources")
    assert mount == {
        "name": "pod-resources",
        "mountPath": "/var/lib/kubelet/pod-resources",
        "readOnly": True,
    }
    env = env_of(agent, rendered)
    assert env["GPU_AGENT_POD_RESOURCES"] == "true"
    assert env["GPU_AGENT_POD_RESOURCES_SOCKET"] == mount["mountPath"] + "/kubelet.sock"
    assert "hostNetwork" not in pod
    assert "hostPID" not in pod


def test_pod_resources_off_means_no_mount_and_the_flag_off() -> None:
    rendered = render("pod-resources-off")
    agent = containers(rendered.get("DaemonSet", AGENT))["agent"]
    assert [m["name"] for m in agent["volumeMounts"]] == ["tmp"]
    env = env_of(agent, rendered)
    assert env["GPU_AGENT_POD_RESOURCES"] == "false"
    assert "GPU_AGENT_POD_RESOURCES_SOCKET" not in env


def test_agent_probes_its_health_endpoints_and_rolls_in_percentages() -> None:
    daemonset = render("defaults").get("DaemonSet", AGENT)
    agent = containers(daemonset)["agent"]
    assert agent["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert agent["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    assert daemonset["spec"]["updateStrategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxUnavailable": "10%"},
    }


def test_a_settings_change_changes_the_config_checksum() -> None:
    def checksum(rendered: Rendered) -> str:
        daemonset = rendered.get("DaemonSet", AGENT)
        value = daemonset["spec"]["template"]["metadata"]["annotations"]["checksum/config"]
        assert isinstance(value, str)
        return value

    default = checksum(render("defaults"))
    assert len(default) == 64
    assert checksum(render("service-monitor")) == default  # not a setting of the agent
    assert checksum(render("simulated-custom-prefix")) != default


NODE_RULE = {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "patch"]}
DRA_RULES = [
    {"apiGroups": ["resource.k8s.io"], "resources": ["resourceslices"], "verbs": ["get", "list"]},
    {
        "apiGroups": ["resource.k8s.io"],
        "resources": ["devicetaintrules"],
        "verbs": ["get", "list", "create", "patch", "delete"],
    },
]


@pytest.mark.parametrize(
    ("variant", "rules"),
    [("defaults", [NODE_RULE, *DRA_RULES]), ("dra-off", [NODE_RULE])],
)
def test_agent_rbac_is_nodes_get_patch_and_dra_read_slices_write_rules(
    variant: str, rules: list[Manifest]
) -> None:
    role = render(variant).get("ClusterRole", AGENT)
    assert role["rules"] == rules
    binding = render("defaults").get("ClusterRoleBinding", AGENT)
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": AGENT, "namespace": NAMESPACE}
    ]


def test_process_attribution_is_host_pid_and_a_pod_list_only_when_asked() -> None:
    rendered = render("process-attribution")
    daemonset = rendered.get("DaemonSet", AGENT)
    pod = daemonset["spec"]["template"]["spec"]
    agent = containers(daemonset)["agent"]
    assert pod["hostPID"] is True
    assert "hostNetwork" not in pod
    # Nothing more than with pod-resources alone: uid 0, every capability dropped.
    assert agent["securityContext"] == {**LEAST_PRIVILEGE, "runAsUser": 0, "runAsNonRoot": False}
    assert env_of(agent, rendered)["GPU_AGENT_PROCESS_ATTRIBUTION"] == "true"
    role = rendered.get("ClusterRole", AGENT)
    assert role["rules"] == [
        NODE_RULE,
        *DRA_RULES,
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]},
    ]
    default = render("defaults")
    assert "GPU_AGENT_PROCESS_ATTRIBUTION" not in env_of(
        containers(default.get("DaemonSet", AGENT))["agent"], default
    )


def _policy_names(variant: str) -> set[str]:
    rendered = render(variant)
    policies = {m["metadata"]["name"] for m in rendered.of_kind("ValidatingAdmissionPolicy")}
    bound = {m["spec"]["policyName"] for m in rendered.of_kind("ValidatingAdmissionPolicyBinding")}
    assert bound == policies, "every policy has its binding and no binding dangles"
    return policies


AGENT_POLICY = f"{FULLNAME}-agent-own-node-annotations"
DRA_POLICY = f"{FULLNAME}-agent-own-device-taints"
GPU_DATA_POLICY = f"{FULLNAME}-gpu-data-writers"
# The schedulerName guard (tests/deploy/test_scheduler_guard_policy.py).
GUARD_POLICIES = {f"{FULLNAME}-require-scheduler", f"{FULLNAME}-restrict-scheduler"}


@pytest.mark.parametrize(
    ("variant", "expected"),
    [
        ("defaults", {AGENT_POLICY, DRA_POLICY, GPU_DATA_POLICY, *GUARD_POLICIES}),
        ("admission-policy-off", {GPU_DATA_POLICY, *GUARD_POLICIES}),
        ("gpu-data-policy-off", {AGENT_POLICY, DRA_POLICY, *GUARD_POLICIES}),
        ("scheduler-guard-off", {AGENT_POLICY, DRA_POLICY, GPU_DATA_POLICY}),
        ("dra-off", {AGENT_POLICY, GPU_DATA_POLICY, *GUARD_POLICIES}),
    ],
)
def test_admission_policy_toggles(variant: str, expected: set[str]) -> None:
    assert _policy_names(variant) == expected


# ---------------------------------------------------------------------- the scorer


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        pytest.param({}, "true", id="follows-the-gpu-data-policy"),
        pytest.param({"gpuDataPolicy": {"enabled": False}}, "false", id="policy-off"),
        pytest.param(
            {"gpuDataPolicy": {"enabled": False}, "scorer": {"requireAgentWriter": True}},
            "true",
            id="on-without-the-policy",
        ),
        pytest.param({"scorer": {"requireAgentWriter": False}}, "false", id="off-with-the-policy"),
    ],
)
def test_scorer_requires_the_agents_writes_where_only_the_agent_may_write(
    values: dict[str, Any], expected: str
) -> None:
    rendered = Rendered(text="", manifests=parse_manifests(template(values)))
    scorer = containers(rendered.get("Deployment", SCORER))["scorer"]
    assert env_of(scorer, rendered)["GPU_SCORER_REQUIRE_AGENT_WRITER"] == expected


def test_scorer_has_no_credentials_in_full_node_mode_without_the_pod_watch() -> None:
    rendered = render("full-node-no-pod-watch")
    deployment = rendered.get("Deployment", SCORER)
    assert deployment["spec"]["replicas"] >= 2
    assert deployment["spec"]["template"]["spec"]["automountServiceAccountToken"] is False
    assert rendered.get("ServiceAccount", SCORER)["automountServiceAccountToken"] is False
    assert rendered.maybe("ClusterRole", SCORER) is None
    assert rendered.maybe("ClusterRoleBinding", SCORER) is None
    assert rendered.scheduler_config()["extenders"][0]["nodeCacheCapable"] is False
    scorer = containers(deployment)["scorer"]
    assert env_of(scorer, rendered)["GPU_SCORER_POD_WATCH"] == "false"


NODES_RULE = {"apiGroups": [""], "resources": ["nodes"], "verbs": ["list", "watch"]}
PODS_RULE = {"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch"]}


@pytest.mark.parametrize(
    ("variant", "rules", "node_cache", "pod_watch"),
    [
        # Names only (the default): its Node cache, and the pod watch of in-flight accounting.
        pytest.param("defaults", [NODES_RULE, PODS_RULE], True, "true", id="names-only"),
        # Full nodes: no Node watch, but the pod watch needs the token all the same.
        pytest.param("full-node", [PODS_RULE], False, "true", id="full-node"),
        # Full nodes, learning workloads' loads from every node: a Node watch that only teaches.
        pytest.param(
            "full-node-own-load-node-watch",
            [NODES_RULE, PODS_RULE],
            False,
            "true",
            id="full-node-own-load-node-watch",
        ),
        pytest.param("no-pod-watch", [NODES_RULE], True, "false", id="names-only-no-pod-watch"),
    ],
)
def test_scorer_may_only_list_and_watch_what_its_watches_read(
    variant: str, rules: list[Manifest], node_cache: bool, pod_watch: str
) -> None:
    rendered = render(variant)
    deployment = rendered.get("Deployment", SCORER)
    assert deployment["spec"]["template"]["spec"]["automountServiceAccountToken"] is True
    assert rendered.get("ServiceAccount", SCORER)["automountServiceAccountToken"] is True
    assert rendered.get("ClusterRole", SCORER)["rules"] == rules
    binding = rendered.get("ClusterRoleBinding", SCORER)
    assert binding["roleRef"]["name"] == SCORER
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": SCORER, "namespace": NAMESPACE}
    ]
    assert rendered.scheduler_config()["extenders"][0]["nodeCacheCapable"] is node_cache
    env = env_of(containers(deployment)["scorer"], rendered)
    assert env["GPU_SCORER_POD_WATCH"] == pod_watch
    learns_from_nodes = variant == "full-node-own-load-node-watch"
    assert env.get("GPU_SCORER_OWN_LOAD_NODE_WATCH") == (
        "true" if learns_from_nodes else (None if node_cache else "false")
    )


DRA_RULE = {
    "apiGroups": ["resource.k8s.io"],
    "resources": ["resourceclaims", "resourceclaimtemplates", "devicetaintrules"],
    "verbs": ["list", "watch"],
}


def test_dra_judging_sends_every_pod_and_lets_the_scorer_watch_claims_and_taints() -> None:
    """A pod asking only through ResourceClaims requests no extended resource, and
    kube-scheduler sends an extender with managedResources only pods that request one of
    them: with DRA judging on, the registration has none, and the scorer may list and watch
    claims, claim templates and device taint rules (and nothing more)."""
    rendered = render("scorer-dra")
    extender = rendered.scheduler_config()["extenders"][0]
    assert "managedResources" not in extender
    assert rendered.get("ClusterRole", SCORER)["rules"] == [NODES_RULE, PODS_RULE, DRA_RULE]
    env = env_of(containers(rendered.get("Deployment", SCORER))["scorer"], rendered)
    assert env["GPU_SCORER_DRA"] == "true"
    assert env["GPU_SCORER_DRA_DRIVER"] == "gpu.nvidia.com"
    assert env["GPU_SCORER_DRA_DEVICE_CLASSES"] == "gpu.nvidia.com"
    assert env["GPU_SCORER_DRA_EXTENDED_RESOURCE"] == "true"
    # Off (the default): the GPU resource is managed, no DRA rule, the watch off.
    defaults = render("defaults")
    assert defaults.scheduler_config()["extenders"][0]["managedResources"] == [
        {"name": "nvidia.com/gpu", "ignoredByScheduler": False}
    ]
    assert DRA_RULE not in defaults.get("ClusterRole", SCORER)["rules"]
    default_env = env_of(containers(defaults.get("Deployment", SCORER))["scorer"], defaults)
    assert default_env["GPU_SCORER_DRA"] == "false"
    assert "GPU_SCORER_DRA_DRIVER" not in default_env


@pytest.mark.parametrize("variant", ["sidecar", "sidecar-full-node"])
def test_a_sidecar_scorer_watches_with_the_schedulers_identity(variant: str) -> None:
    # system:kube-scheduler already lists and watches nodes and pods; the chart adds no role.
    rendered = render(variant)
    assert rendered.maybe("ClusterRole", SCORER) is None
    scheduler = rendered.get("Deployment", SCHEDULER)["spec"]["template"]["spec"]
    assert scheduler.get("automountServiceAccountToken", True) is True
    env = env_of(containers(rendered.get("Deployment", SCHEDULER))["scorer"], rendered)
    assert env["GPU_SCORER_POD_WATCH"] == "true"


def test_scorer_is_spread_probed_and_protected_by_a_disruption_budget() -> None:
    rendered = render("defaults")
    pod = rendered.get("Deployment", SCORER)["spec"]["template"]["spec"]
    keys = {c["topologyKey"] for c in pod["topologySpreadConstraints"]}
    assert keys == {"kubernetes.io/hostname", "topology.kubernetes.io/zone"}
    scorer = containers(rendered.get("Deployment", SCORER))["scorer"]
    assert scorer["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert scorer["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert rendered.get("PodDisruptionBudget", SCORER)["spec"]["maxUnavailable"] == 1
    service = rendered.get("Service", SCORER)
    assert service["spec"]["selector"]["app.kubernetes.io/component"] == "scorer"


# ---------------------------------------------------------------------- the second scheduler


def test_scheduler_uses_its_own_name_and_lease() -> None:
    config = render("defaults").scheduler_config()
    assert [p["schedulerName"] for p in config["profiles"]] == ["gpu-scheduler"]
    election = config["leaderElection"]
    assert election["leaderElect"] is True
    assert election["resourceName"] == SCHEDULER
    assert election["resourceNamespace"] == NAMESPACE
    assert (election["resourceNamespace"], election["resourceName"]) != (
        "kube-system",
        "kube-scheduler",
    )


def test_scheduler_registers_the_extender() -> None:
    extender = render("defaults").scheduler_config()["extenders"][0]
    assert extender == {
        "urlPrefix": f"http://{SCORER}.{NAMESPACE}.svc:8888",
        "filterVerb": "filter",
        "prioritizeVerb": "prioritize",
        "weight": 5,
        "nodeCacheCapable": True,
        "ignorable": True,
        "httpTimeout": "2s",
        "enableHTTPS": False,
        "managedResources": [{"name": "nvidia.com/gpu", "ignoredByScheduler": False}],
    }
    custom = render("path-prefix-policy").scheduler_config()["extenders"][0]
    assert custom["urlPrefix"].endswith(":8888/gpu-extender")
    assert (custom["ignorable"], custom["weight"], custom["httpTimeout"]) == (False, 10, "500ms")


def test_scheduler_rbac_follows_the_multiple_schedulers_guide() -> None:
    rendered = render("defaults")
    cluster_roles = {b["roleRef"]["name"] for b in rendered.of_kind("ClusterRoleBinding")}
    assert {"system:kube-scheduler", "system:volume-scheduler"} <= cluster_roles
    reader = rendered.get("RoleBinding", f"{SCHEDULER}-extension-apiserver-authentication-reader")
    assert reader["metadata"]["namespace"] == "kube-system"
    assert reader["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": "extension-apiserver-authentication-reader",
    }
    lease_role = rendered.get("Role", f"{SCHEDULER}-leader-election")
    named = [r for r in lease_role["rules"] if "resourceNames" in r]
    assert named == [
        {
            "apiGroups": ["coordination.k8s.io"],
            "resources": ["leases"],
            "resourceNames": [SCHEDULER],
            "verbs": ["get", "update"],
        }
    ]


@pytest.mark.parametrize(
    ("variant", "image"),
    [
        pytest.param("defaults", "registry.k8s.io/kube-scheduler:v1.36.0", id="cluster-1.36"),
        pytest.param(
            "defaults-k8s-1.37", "registry.k8s.io/kube-scheduler:v1.37.0", id="cluster-1.37"
        ),
        pytest.param("pinned-images", "registry.k8s.io/kube-scheduler:v1.33.2", id="pinned-tag"),
    ],
)
def test_scheduler_image_follows_the_cluster_version_unless_pinned(
    variant: str, image: str
) -> None:
    deployment = render(variant).get("Deployment", SCHEDULER)
    assert containers(deployment)["kube-scheduler"]["image"] == image


def test_scheduler_off_renders_no_scheduler() -> None:
    rendered = render("scheduler-off")
    assert rendered.maybe("Deployment", SCHEDULER) is None
    assert not [m for m in rendered.manifests if m["metadata"]["name"].startswith(SCHEDULER)]
    assert rendered.maybe("Deployment", SCORER) is not None


def test_sidecar_mode_calls_the_scorer_on_localhost() -> None:
    rendered = render("sidecar")
    assert rendered.maybe("Deployment", SCORER) is None
    assert rendered.maybe("PodDisruptionBudget", SCORER) is None
    scheduler = rendered.get("Deployment", SCHEDULER)
    assert set(containers(scheduler)) == {"kube-scheduler", "scorer"}
    assert rendered.scheduler_config()["extenders"][0]["urlPrefix"] == "http://127.0.0.1:8888"
    service = rendered.get("Service", SCORER)
    assert service["spec"]["selector"]["app.kubernetes.io/component"] == "scheduler"
    # The scorer's settings reach the sidecar too.
    assert env_of(containers(scheduler)["scorer"], rendered)["GPU_SCORER_PORT"] == "8888"


def test_tls_makes_the_scheduler_verify_the_scorer() -> None:
    rendered = render("tls")
    extender = rendered.scheduler_config()["extenders"][0]
    assert extender["urlPrefix"].startswith("https://")
    assert extender["enableHTTPS"] is True
    assert extender["tlsConfig"]["serverName"] == f"{SCORER}.{NAMESPACE}.svc"
    assert extender["tlsConfig"]["caFile"].endswith("/ca/ca.crt")
    assert "certFile" not in extender["tlsConfig"]
    scorer = containers(rendered.get("Deployment", SCORER))["scorer"]
    # Probes use the plain metrics port, which serves no extender verb.
    assert scorer["readinessProbe"]["httpGet"]["port"] == "metrics"
    env = env_of(scorer, rendered)
    assert env["GPU_SCORER_TLS_CERT_FILE"].endswith("/tls.crt")
    assert "GPU_SCORER_TLS_CLIENT_CA_FILE" not in env


def test_mutual_tls_gives_the_scheduler_a_client_certificate() -> None:
    rendered = render("mtls-service-monitor")
    tls = rendered.scheduler_config()["extenders"][0]["tlsConfig"]
    assert tls["certFile"].endswith("/client/tls.crt")
    assert tls["keyFile"].endswith("/client/tls.key")
    scorer = containers(rendered.get("Deployment", SCORER))["scorer"]
    assert "GPU_SCORER_TLS_CLIENT_CA_FILE" in env_of(scorer, rendered)
    # The kubelet has no client certificate: probes use the plain metrics port.
    assert scorer["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    volumes = rendered.get("Deployment", SCHEDULER)["spec"]["template"]["spec"]["volumes"]
    secrets = {v["secret"]["secretName"] for v in volumes if "secret" in v}
    assert secrets == {"gpu-scorer-tls", "gpu-scheduler-client-tls"}


def test_sidecar_tls_verifies_localhost() -> None:
    tls = render("sidecar-tls").scheduler_config()["extenders"][0]["tlsConfig"]
    assert tls["serverName"] == "localhost"


# ---------------------------------------------------------------------- monitoring, NOTES


def test_service_monitors_for_both_metrics_endpoints() -> None:
    assert not render("defaults").of_kind("ServiceMonitor")
    rendered = render("service-monitor")
    monitors = {m["metadata"]["name"]: m for m in rendered.of_kind("ServiceMonitor")}
    assert set(monitors) == {AGENT, SCORER}
    for monitor in monitors.values():
        assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
        assert monitor["metadata"]["labels"]["release"] == "prom"
        assert monitor["spec"]["endpoints"][0]["path"] == "/metrics"
    headless = rendered.get("Service", f"{AGENT}-metrics")
    assert headless["spec"]["clusterIP"] == "None"
    port_names = {p["name"] for p in headless["spec"]["ports"]}
    assert monitors[AGENT]["spec"]["endpoints"][0]["port"] in port_names
    # With mutual TLS on the extender port the scorer is still scraped on its plain metrics port.
    tls_monitor = render("mtls-service-monitor").get("ServiceMonitor", SCORER)
    endpoint = tls_monitor["spec"]["endpoints"][0]
    assert endpoint["port"] == "metrics"
    assert "scheme" not in endpoint


@pytest.mark.parametrize(
    "variant",
    ["defaults", "sidecar-tls", "scheduler-off", "simulated-custom-prefix", "no-pod-watch"],
)
def test_notes_tell_how_to_see_annotations_opt_in_and_check_the_scorer(variant: str) -> None:
    values = VARIANTS[variant].values
    text = notes(values)
    prefix = values.get("annotationPrefix", "gpu-scheduler.example.com") + "/"
    assert f"kubectl describe node <gpu-node> | grep {prefix}" in text
    assert "gpu_scorer_request_duration_seconds_count" in text
    if values.get("scheduler", {}).get("enabled", True):
        assert "schedulerName: gpu-scheduler" in text
        assert f"{prefix}gpu-model-preference" in text
        assert f"{prefix}expected-gpu-load" in text
        assert "FailedScheduling" in text
    else:
        assert f"http://{SCORER}.{NAMESPACE}.svc:8888" in text
    if variant == "sidecar-tls":
        assert f"deploy/{SCHEDULER} -c scorer" in text
        # The metrics port is plain HTTP whatever the extender port uses.
        assert "http://127.0.0.1:9401/metrics" in text
    watching = values.get("scorer", {}).get("podWatch", True)
    assert ("grep '^gpu_scorer_inflight_accounting'" in text) is watching


# ---------------------------------------------------------------------- refusals


@pytest.mark.parametrize(
    ("values", "message"),
    [
        pytest.param(
            {"scorer": {"mode": "sidecar"}, "scheduler": {"enabled": False}},
            "scorer.mode=sidecar",
            id="sidecar-without-scheduler",
        ),
        pytest.param(
            {"scorer": {"tls": {"enabled": True}}}, "scorer.tls.secretName", id="tls-without-secret"
        ),
        pytest.param(
            {"scorer": {"tls": {"clientAuth": True}}},
            "scorer.tls.clientAuth needs scorer.tls.enabled",
            id="mtls-without-tls",
        ),
        pytest.param(
            {"scorer": {"tls": {**VARIANTS["tls"].values["scorer"]["tls"], "clientAuth": True}}},
            "clientSecretName",
            id="mtls-without-client-certificate",
        ),
        pytest.param({"agent": {"sampleIntervalSecs": 5}}, "additional properties", id="typo"),
        pytest.param({"agent": {"source": "dcgm"}}, "agent/source", id="unknown-source"),
        pytest.param({"annotationPrefix": "Not A Domain"}, "annotationPrefix", id="bad-prefix"),
        pytest.param(
            {"scheduler": {"extender": {"httpTimeout": "5"}}}, "httpTimeout", id="timeout-no-unit"
        ),
        pytest.param(
            {"scorer": {"policy": {"utilization_limit": 1.5}}}, "utilization_limit", id="bad-policy"
        ),
        pytest.param({"scorer": {"policy": {"stale_after": 9}}}, "stale_after", id="policy-typo"),
        pytest.param(
            {"scorer": {"policy": {"min_gpu_fit_probability": 1.5}}},
            "min_gpu_fit_probability",
            id="fit-probability-above-1",
        ),
        pytest.param(
            {"scorer": {"policy": {"inflight_max_s": -1}}}, "inflight_max_s", id="negative-seconds"
        ),
        pytest.param({"scorer": {"podWatch": "yes"}}, "podWatch", id="pod-watch-not-a-bool"),
    ],
)
def test_bad_values_fail_with_a_clear_message(values: dict[str, Any], message: str) -> None:
    with pytest.raises(HelmError, match="(?s)" + message.replace(".", r"\.")):
        template(values)


def test_clusters_older_than_the_oldest_minor_ci_runs_are_refused() -> None:
    with pytest.raises(HelmError, match="kubeVersion"):
        template({}, kube_version="1.35.9")


def _uncovered(value: Any, node: Manifest, path: str) -> list[str]:
    """Values with no schema entry (or no description), walking values and schema together."""
    if "description" not in node and path:
        return [f"{path} (no description)"]
    properties = node.get("properties")
    if not isinstance(value, dict) or properties is None:
        return []  # a scalar, a list, or a free-form object (labels, resources, ...)
    missing = []
    for key, child in value.items():
        where = f"{path}.{key}" if path else key
        if key not in properties:
            missing.append(where)
        else:
            missing += _uncovered(child, properties[key], where)
    return missing


def test_values_schema_covers_every_value() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert _uncovered(values, schema, "") == []
    assert _uncovered({"agent": {"nope": 1}}, schema, "") == ["agent.nope"]


def test_values_schema_rejects_unknown_keys_everywhere() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    open_objects: list[str] = []

    def walk(node: Manifest, where: str) -> None:
        if node.get("type") == "object" and "properties" in node:
            if node.get("additionalProperties") is not False:
                open_objects.append(where or "<root>")
            for key, child in node["properties"].items():
                walk(child, f"{where}.{key}")

    walk(schema, "")
    assert open_objects == []


# ---------------------------------------------------------------------- network policies


def _ingress_by_port(rendered: Rendered, name: str) -> dict[str, list[Manifest]]:
    policy = rendered.get("NetworkPolicy", name)
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    rules = policy["spec"].get("ingress") or []
    return {rule["ports"][0]["port"]: rule["from"] for rule in rules}


PROMETHEUS_PEER = {
    "namespaceSelector": {},
    "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}},
}


def test_only_the_scheduler_reaches_the_extender_and_only_the_scraper_the_metrics() -> None:
    rendered = render("defaults")
    scorer = _ingress_by_port(rendered, SCORER)
    scheduler_pods = {
        "matchLabels": {
            "app.kubernetes.io/name": "gpu-live-scheduler",
            "app.kubernetes.io/instance": "gls",
            "app.kubernetes.io/component": "scheduler",
        }
    }
    assert scorer == {"http": [{"podSelector": scheduler_pods}], "metrics": [PROMETHEUS_PEER]}
    assert _ingress_by_port(rendered, AGENT) == {"metrics": [PROMETHEUS_PEER]}
    # The policies select the pods they mean to protect.
    deployment = rendered.get("Deployment", SCORER)
    selector = rendered.get("NetworkPolicy", SCORER)["spec"]["podSelector"]["matchLabels"]
    assert selector.items() <= deployment["spec"]["template"]["metadata"]["labels"].items()


def test_network_policy_variants() -> None:
    assert not render("network-policy-off").of_kind("NetworkPolicy")
    # Sidecar: the scheduler calls the scorer on 127.0.0.1; only the agent gets a policy.
    assert [p["metadata"]["name"] for p in render("sidecar").of_kind("NetworkPolicy")] == [AGENT]
    extra = render("network-policy-extra-extender")
    scorer = _ingress_by_port(extra, SCORER)
    assert list(scorer) == ["http"]
    assert scorer["http"][0]["podSelector"] == {"matchLabels": {"component": "kube-scheduler"}}
    # No scraper listed: nothing may reach the agent.
    assert extra.get("NetworkPolicy", AGENT)["spec"]["ingress"] is None


def test_cert_manager_issues_both_certificates_into_the_secrets_the_pods_mount() -> None:
    rendered = render("cert-manager-mtls")
    certificates = {c["metadata"]["name"]: c["spec"] for c in rendered.of_kind("Certificate")}
    serving = certificates[SCORER]
    client = certificates[f"{FULLNAME}-scheduler-extender-client"]
    assert serving["usages"] == ["digital signature", "key encipherment", "server auth"]
    assert client["usages"] == ["digital signature", "key encipherment", "client auth"]
    assert (
        serving["issuerRef"]
        == client["issuerRef"]
        == {
            "name": "gpu-ca",
            "kind": "ClusterIssuer",
            "group": "cert-manager.io",
        }
    )
    # The name kube-scheduler verifies is among the serving certificate's names.
    extender = rendered.scheduler_config()["extenders"][0]
    assert extender["tlsConfig"]["serverName"] in serving["dnsNames"]
    # The pods mount exactly the Secrets cert-manager writes.
    scorer_volumes = rendered.get("Deployment", SCORER)["spec"]["template"]["spec"]["volumes"]
    scheduler_volumes = rendered.get("Deployment", f"{FULLNAME}-scheduler")["spec"]["template"][
        "spec"
    ]["volumes"]
    mounted = {
        v["secret"]["secretName"] for v in scorer_volumes + scheduler_volumes if "secret" in v
    }
    assert mounted == {serving["secretName"], client["secretName"]}


def test_cert_manager_needs_an_issuer() -> None:
    values = {"scorer": {"tls": {"enabled": True, "certManager": {"enabled": True}}}}
    with pytest.raises(HelmError, match=r"issuerRef\.name"):
        template(values)
