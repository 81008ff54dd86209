"""Tenant profiles in the chart's values reach the scorer's policy file, as the scorer reads them.

`scorer.policy.profiles` is file-only (no flag or variable carries a list), so the chart writes
it into the policy ConfigMap the scorer mounts. The file is loaded here with the scorer's own
settings code; the values schema refuses a bad profile before anything is rendered; and a
profile chosen by namespace labels gets the scorer list/watch on Namespaces.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from exporter_scheduler.config.settings import load_settings
from tests.deploy.chart_support import (
    CHART,
    FULLNAME,
    NAMESPACE,
    TENANT_POLICY,
    HelmError,
    Manifest,
    containers,
    env_of,
    parse_manifests,
    render,
    template,
)

pytestmark = pytest.mark.helm

SCORER = f"{FULLNAME}-scorer"
SCHEDULER = f"{FULLNAME}-scheduler"
NAMESPACES_RULE = {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["list", "watch"]}


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """No GPU_SCORER_* from the test runner's own environment."""
    for name in list(os.environ):
        if name.startswith("GPU_SCORER_"):
            monkeypatch.delenv(name)
    return monkeypatch


def _policy_file(variant: str, folder: Path) -> Path:
    """The policy file the scorer container is pointed at, written where this test reads it."""
    rendered = render(variant)
    scorer = containers(rendered.get("Deployment", SCORER))["scorer"]
    mounted = Path(env_of(scorer, rendered)["GPU_SCORER_POLICY_FILE"])
    (mount,) = [m for m in scorer["volumeMounts"] if m["name"] == "scorer-policy"]
    assert mounted.parent == Path(mount["mountPath"])
    config_map = rendered.get("ConfigMap", f"{SCORER}-policy")
    local = folder / mounted.name
    local.write_text(config_map["data"][mounted.name])
    return local


def test_two_profiles_load_with_the_scorers_settings(
    clean_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    settings = load_settings({"policy_file": _policy_file("tenant-profiles", tmp_path)})
    policies = settings.policy_set()
    assert [p.name for p in policies.profiles] == ["training", "inference"]
    assert policies.reads_labels  # the inference profile chooses by labels
    assert policies.default.utilization_limit == 0.9

    training = policies.choose("ml-train-llama", {})
    assert (training.profile, training.utilization_limit, training.weight_temperature) == (
        "training",
        0.5,
        2,
    )
    # What a profile leaves alone comes from the top-level policy.
    assert training.missing_data == policies.default.missing_data
    assert policies.choose("research", {}).profile == "training"

    inference = policies.choose("serving", {"workload": "inference", "tier": "prod"})
    assert inference.profile == "inference"
    assert (inference.missing_data, inference.min_gpu_fit_probability) == ("strict", 0.9)
    assert inference.utilization_limit == 0.9
    # NotIn: a dev namespace labelled for inference gets the top-level policy.
    assert policies.choose("serving", {"workload": "inference", "tier": "dev"}) is policies.default
    assert policies.choose("web", {}) is policies.default


def test_the_policy_file_holds_the_profiles_as_given(tmp_path: Path) -> None:
    written = json.loads(_policy_file("tenant-profiles", tmp_path).read_text())
    assert written == TENANT_POLICY


@pytest.mark.parametrize(
    ("variant", "rules", "token"),
    [
        pytest.param(
            "tenant-profiles",
            [
                {"apiGroups": [""], "resources": ["nodes"], "verbs": ["list", "watch"]},
                {"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch"]},
                NAMESPACES_RULE,
            ],
            True,
            id="a-profile-chooses-by-labels",
        ),
        pytest.param(
            "tenant-profiles-by-name",
            [
                {"apiGroups": [""], "resources": ["nodes"], "verbs": ["list", "watch"]},
                {"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch"]},
            ],
            True,
            id="profiles-by-name-need-no-namespace-watch",
        ),
        # Full-node mode without the pod watch needs no credentials, unless a profile reads
        # namespace labels: then the Namespace watch alone needs the token and the role.
        pytest.param(
            "tenant-profiles-full-node-no-pod-watch",
            [NAMESPACES_RULE],
            True,
            id="full-node-no-pod-watch-still-watches-namespaces",
        ),
    ],
)
def test_the_scorer_may_watch_namespaces_exactly_when_a_profile_reads_their_labels(
    variant: str, rules: list[Manifest], token: bool
) -> None:
    rendered = render(variant)
    assert rendered.get("ClusterRole", SCORER)["rules"] == rules
    pod = rendered.get("Deployment", SCORER)["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is token
    assert rendered.get("ServiceAccount", SCORER)["automountServiceAccountToken"] is token
    binding = rendered.get("ClusterRoleBinding", SCORER)
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": SCORER, "namespace": NAMESPACE}
    ]


def test_a_sidecar_scorer_reads_namespaces_with_the_schedulers_identity() -> None:
    # system:kube-scheduler lists and watches namespaces (checked on a real API server in
    # tests/e2e/test_scheduler_guard.py); the chart adds no role of its own.
    rendered = parse_manifests(template({"scorer": {"mode": "sidecar", "policy": TENANT_POLICY}}))
    assert not [
        m for m in rendered if m["kind"] == "ClusterRole" and m["metadata"]["name"] == SCORER
    ]
    (scheduler,) = [
        m for m in rendered if m["kind"] == "Deployment" and m["metadata"]["name"] == SCHEDULER
    ]
    assert "scorer" in containers(scheduler)


def _with_profile(**profile: Any) -> dict[str, Any]:
    return {"scorer": {"policy": {"profiles": [profile]}}}


BAD_PROFILES = {
    "named default": (
        _with_profile(name="default", namespaces=["ml"]),
        'scorer.policy.profiles[0]: the name "default" stands for the top-level policy',
    ),
    "name not a DNS label": (
        _with_profile(name="Team_A", namespaces=["ml"]),
        "at '/scorer/policy/profiles/0/name': 'Team_A' does not match pattern",
    ),
    "no name": (
        {"scorer": {"policy": {"profiles": [{"namespaces": ["ml"]}]}}},
        "missing property 'name'",
    ),
    "matches nothing": (
        _with_profile(name="team-a"),
        "missing property 'namespaces'",
    ),
    "empty selector": (
        _with_profile(name="team-a", **{"namespace-selector": {}}),
        "at '/scorer/policy/profiles/0/namespace-selector': 'anyOf' failed",
    ),
    "unknown operator": (
        _with_profile(
            name="team-a",
            **{"namespace-selector": {"matchExpressions": [{"key": "t", "operator": "Equals"}]}},
        ),
        "value must be one of 'In', 'NotIn', 'Exists', 'DoesNotExist'",
    ),
    "In without values": (
        _with_profile(
            name="team-a",
            **{"namespace-selector": {"matchExpressions": [{"key": "t", "operator": "In"}]}},
        ),
        "matchExpressions/0': missing property 'values'",
    ),
    "Exists with values": (
        _with_profile(
            name="team-a",
            **{
                "namespace-selector": {
                    "matchExpressions": [{"key": "t", "operator": "Exists", "values": ["x"]}]
                }
            },
        ),
        "matchExpressions/0/values': maxItems",
    ),
    "matchLabels value not a string": (
        _with_profile(name="team-a", **{"namespace-selector": {"matchLabels": {"tier": 1}}}),
        "matchLabels/tier': got number, want string",
    ),
    "a setting's typo": (
        _with_profile(name="team-a", namespaces=["ml"], utilisation_limit=0.5),
        "additional properties 'utilisation_limit' not allowed",
    ),
    "the cluster-wide GPU resource": (
        _with_profile(name="team-a", namespaces=["ml"], gpu_resource_name="amd.com/gpu"),
        "additional properties 'gpu_resource_name' not allowed",
    ),
    "a setting out of bounds": (
        _with_profile(name="team-a", namespaces=["ml"], utilization_limit=1.5),
        "at '/scorer/policy/profiles/0/utilization_limit': maximum: got 1.5, want 1",
    ),
    "one name twice": (
        {
            "scorer": {
                "policy": {
                    "profiles": [
                        {"name": "team-a", "namespaces": ["a"]},
                        {"name": "team-a", "namespaces": ["b"]},
                    ]
                }
            }
        },
        'scorer.policy.profiles: the name "team-a" is used twice',
    ),
}


@pytest.mark.parametrize(
    ("values", "message"), [pytest.param(*case, id=name) for name, case in BAD_PROFILES.items()]
)
def test_a_bad_profile_is_refused_before_anything_is_rendered(
    values: dict[str, Any], message: str
) -> None:
    with pytest.raises(HelmError) as refused:
        template(values)
    assert message in str(refused.value)


def test_profile_keys_are_the_policy_keys_but_the_cluster_wide_ones() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    policy = schema["properties"]["scorer"]["properties"]["policy"]["properties"]
    profile = policy["profiles"]["items"]["properties"]
    own = {"name", "namespaces", "namespace-selector"}
    expected = {k: v for k, v in policy.items() if k not in ("profiles", "gpu_resource_name")}
    # The same keys with the same bounds: a setting added to the policy is added here too.
    assert {k: v for k, v in profile.items() if k not in own} == expected
