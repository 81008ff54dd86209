"""The agent's ValidatingAdmissionPolicy, evaluated: its CEL on real Node objects and user info.

The expressions are taken from the chart as helm renders it (never a copy), compiled with
cel-python, and run the way the API server runs a policy: the policy applies when every
matchCondition is true; the request is then allowed when every validation is true; an evaluation
error counts as a failure (failurePolicy: Fail). The old and new Nodes are the real objects a
kube-apiserver v1.36 returned around the agent's merge patches (fixtures 02, 10 and 11).
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from typing import Any

import celpy
import pytest
from celpy.adapter import json_to_cel
from celpy.evaluation import CELEvalError
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.deploy.chart_support import FIXTURES, FULLNAME, NAMESPACE, Manifest, render

pytestmark = pytest.mark.helm

APISERVER = FIXTURES / "kube-apiserver-v1.36"
NODE = "gpu-node-1"
PREFIX = "gpu-scheduler.example.com/"
AGENT_USER = f"system:serviceaccount:{NAMESPACE}:{FULLNAME}-agent"
NODE_NAME_CLAIM = "authentication.kubernetes.io/node-name"


def _response_node(name: str) -> Manifest:
    exchange = json.loads((APISERVER / name).read_text())
    body = exchange["response"]["body_json"]
    assert body["kind"] == "Node"
    return dict(body)


# Before the agent's first write (status from a kubelet), after it, after a change + removal.
NODE_BEFORE = _response_node("02-patch-node-status.json")
NODE_AGENT_WROTE = _response_node("10-merge-patch-annotations.json")
NODE_AGENT_CHANGED = _response_node("11-merge-patch-change-and-remove.json")


def user_info(
    username: str = AGENT_USER, *, node: str | None = NODE, extra_nodes: list[str] | None = None
) -> Manifest:
    """What the API server authenticates from a pod-bound service-account token (1.30+)."""
    extra: dict[str, list[str]] = {
        "authentication.kubernetes.io/pod-name": ["gls-gpu-live-scheduler-agent-x7k2p"],
        "authentication.kubernetes.io/pod-uid": ["3f1c9a1e-6c53-4d0e-9d0a-1f2e3d4c5b6a"],
        "authentication.kubernetes.io/credential-id": ["JTI=5d1f0c7e-7a55-4a7b-a1de-0c6f7b2f3e11"],
    }
    if node is not None:
        extra[NODE_NAME_CLAIM] = [node]
    if extra_nodes is not None:
        extra[NODE_NAME_CLAIM] = extra_nodes
    namespace = username.split(":")[2] if username.startswith("system:serviceaccount:") else ""
    groups = ["system:serviceaccounts", f"system:serviceaccounts:{namespace}"]
    info: Manifest = {
        "username": username,
        "uid": "1b4e28ba-2fa1-11d2-883f-0016d3cca427",
        "groups": [*groups, "system:authenticated"],
    }
    if username.startswith("system:serviceaccount:"):
        info["extra"] = extra
    return info


def admission_request(old: Manifest, new: Manifest, user: Manifest) -> Manifest:
    return {
        "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
        "kind": {"group": "", "version": "v1", "kind": "Node"},
        "resource": {"group": "", "version": "v1", "resource": "nodes"},
        "name": new["metadata"]["name"],
        "operation": "UPDATE",
        "userInfo": user,
        "dryRun": False,
    }


@dataclass(frozen=True)
class Verdict:
    applies: bool
    allowed: bool
    messages: tuple[str, ...]


class Policy:
    """A rendered ValidatingAdmissionPolicy, compiled once with cel-python."""

    def __init__(self, manifest: Manifest) -> None:
        self.spec = manifest["spec"]
        environment = celpy.Environment()
        self.conditions = [
            environment.program(environment.compile(c["expression"]))
            for c in self.spec["matchConditions"]
        ]
        self.validations = [
            (environment.program(environment.compile(v["expression"])), v["message"])
            for v in self.spec["validations"]
        ]

    def admit(self, old: Manifest, new: Manifest, user: Manifest) -> Verdict:
        activation = {
            "object": json_to_cel(new),
            "oldObject": json_to_cel(old),
            "request": json_to_cel(admission_request(old, new, user)),
        }
        if not all(_true(program, activation) for program in self.conditions):
            return Verdict(applies=False, allowed=True, messages=())
        failed = tuple(m for program, m in self.validations if not _true(program, activation))
        return Verdict(applies=True, allowed=not failed, messages=failed)


def _true(program: celpy.Runner, activation: dict[str, Any]) -> bool:
    try:
        result = program.evaluate(activation)
    except CELEvalError:
        return False  # failurePolicy: Fail
    if isinstance(result, CELEvalError):
        return False
    return bool(result)


@pytest.fixture(scope="module")
def policy() -> Policy:
    manifest = render("defaults").admission_policy()
    assert manifest["spec"]["failurePolicy"] == "Fail"
    return Policy(manifest)


def changed(node: Manifest, edit: Any) -> Manifest:
    copied = copy.deepcopy(node)
    edit(copied)
    return copied


def _set_annotation(key: str, value: str) -> Any:
    return lambda n: n["metadata"]["annotations"].__setitem__(key, value)


def _drop_annotation(key: str) -> Any:
    return lambda n: n["metadata"]["annotations"].pop(key)


def test_fixtures_are_the_agents_real_writes() -> None:
    before = NODE_BEFORE["metadata"]["annotations"]
    after = NODE_AGENT_WROTE["metadata"]["annotations"]
    assert not any(k.startswith(PREFIX) for k in before)
    assert any(k.startswith(PREFIX) for k in after)
    assert any(not k.startswith(PREFIX) for k in after)  # foreign annotations to protect


ALLOWED = [
    pytest.param(NODE_BEFORE, NODE_AGENT_WROTE, id="first-write-of-prefixed-annotations"),
    pytest.param(NODE_AGENT_WROTE, NODE_AGENT_CHANGED, id="change-and-remove-prefixed-keys"),
    pytest.param(NODE_AGENT_CHANGED, NODE_AGENT_CHANGED, id="no-op-patch"),
    pytest.param(
        NODE_AGENT_WROTE,
        changed(NODE_AGENT_WROTE, _drop_annotation(PREFIX + "utilization")),
        id="remove-one-prefixed-key",
    ),
    pytest.param(
        changed(NODE_BEFORE, lambda n: n["metadata"].pop("annotations")),
        changed(
            NODE_BEFORE, lambda n: n["metadata"].__setitem__("annotations", {PREFIX + "x": "1"})
        ),
        id="node-without-annotations-before",
    ),
    pytest.param(
        NODE_AGENT_WROTE,
        changed(
            NODE_AGENT_WROTE,
            lambda n: [
                n["metadata"]["annotations"].pop(k)
                for k in list(n["metadata"]["annotations"])
                if k.startswith(PREFIX)
            ],
        ),
        id="remove-every-prefixed-key",
    ),
]


@pytest.mark.parametrize(("old", "new"), ALLOWED)
def test_agent_may_change_its_own_nodes_prefixed_annotations(
    policy: Policy, old: Manifest, new: Manifest
) -> None:
    verdict = policy.admit(old, new, user_info())
    assert verdict == Verdict(applies=True, allowed=True, messages=())


FORBIDDEN = [
    pytest.param(
        NODE_AGENT_WROTE,
        changed(NODE_AGENT_WROTE, _set_annotation("other.example.com/keep", "no")),
        "add or change only annotations",
        id="change-foreign-annotation",
    ),
    pytest.param(
        NODE_AGENT_WROTE,
        changed(NODE_AGENT_WROTE, _set_annotation("example.org/added", "1")),
        "add or change only annotations",
        id="add-foreign-annotation",
    ),
    pytest.param(
        NODE_AGENT_WROTE,
        changed(NODE_AGENT_WROTE, _drop_annotation("other.example.com/keep")),
        "remove only annotations",
        id="remove-foreign-annotation",
    ),
    pytest.param(
        NODE_AGENT_WROTE,
        changed(NODE_AGENT_WROTE, _set_annotation("gpu-scheduler.example.com.evil/x", "1")),
        "add or change only annotations",
        id="look-alike-prefix",
    ),
    pytest.param(
        NODE_AGENT_WROTE,
        changed(NODE_AGENT_WROTE, lambda n: n["metadata"]["labels"].__setitem__("gpu", "fast")),
        "Node labels",
        id="add-label",
    ),
    pytest.param(
        NODE_AGENT_WROTE,
        changed(NODE_AGENT_WROTE, lambda n: n["metadata"].pop("labels")),
        "Node labels",
        id="remove-all-labels",
    ),
    pytest.param(
        NODE_AGENT_WROTE,
        changed(NODE_AGENT_WROTE, lambda n: n["spec"].__setitem__("unschedulable", True)),
        "Node spec",
        id="cordon",
    ),
    pytest.param(
        NODE_AGENT_WROTE,
        changed(NODE_AGENT_WROTE, lambda n: n["spec"].pop("taints")),
        "Node spec",
        id="remove-taints",
    ),
    pytest.param(
        NODE_AGENT_WROTE,
        changed(
            NODE_AGENT_WROTE,
            lambda n: n["status"]["allocatable"].__setitem__("nvidia.com/gpu", "0"),
        ),
        "Node status",
        id="status-change",
    ),
    pytest.param(
        NODE_AGENT_WROTE,
        changed(NODE_AGENT_WROTE, lambda n: n["metadata"].__setitem__("finalizers", ["x/y"])),
        "finalizers",
        id="add-finalizer",
    ),
]


@pytest.mark.parametrize(("old", "new", "reason"), FORBIDDEN)
def test_agent_may_not_change_anything_else(
    policy: Policy, old: Manifest, new: Manifest, reason: str
) -> None:
    verdict = policy.admit(old, new, user_info())
    assert verdict.applies
    assert not verdict.allowed
    assert len(verdict.messages) == 1
    assert reason in verdict.messages[0]


def _renamed(node: Manifest, name: str) -> Manifest:
    return changed(node, lambda n: n["metadata"].__setitem__("name", name))


@pytest.mark.parametrize(
    "user",
    [
        pytest.param(user_info(node="gpu-node-2"), id="token-of-another-node"),
        pytest.param(user_info(node=None), id="token-without-node-claim"),
        pytest.param(user_info(extra_nodes=[NODE, "gpu-node-2"]), id="two-node-claims"),
        pytest.param(user_info(extra_nodes=[]), id="empty-node-claim"),
        pytest.param({k: v for k, v in user_info().items() if k != "extra"}, id="no-extra-at-all"),
    ],
)
def test_agent_may_change_only_the_node_its_token_names(policy: Policy, user: Manifest) -> None:
    verdict = policy.admit(NODE_BEFORE, NODE_AGENT_WROTE, user)
    assert verdict.applies
    assert not verdict.allowed
    assert verdict.messages == (policy.spec["validations"][0]["message"],)


def test_agent_on_one_node_cannot_write_another_node(policy: Policy) -> None:
    other_before = _renamed(NODE_BEFORE, "gpu-node-2")
    other_after = _renamed(NODE_AGENT_WROTE, "gpu-node-2")
    verdict = policy.admit(other_before, other_after, user_info(node=NODE))
    assert not verdict.allowed
    assert policy.admit(other_before, other_after, user_info(node="gpu-node-2")).allowed


@pytest.mark.parametrize(
    "username",
    [
        pytest.param("system:node:gpu-node-1", id="kubelet"),
        pytest.param("kubernetes-admin", id="admin"),
        pytest.param(f"system:serviceaccount:{NAMESPACE}:{FULLNAME}-scorer", id="scorer"),
        pytest.param(f"system:serviceaccount:other:{FULLNAME}-agent", id="same-name-other-ns"),
    ],
)
def test_everyone_else_is_untouched(policy: Policy, username: str) -> None:
    relabel = changed(NODE_AGENT_WROTE, lambda n: n["metadata"]["labels"].__setitem__("a", "b"))
    verdict = policy.admit(NODE_AGENT_WROTE, relabel, user_info(username))
    assert verdict == Verdict(applies=False, allowed=True, messages=())


def test_custom_prefix_is_what_the_policy_allows() -> None:
    custom = Policy(render("simulated-custom-prefix").admission_policy())
    ours = changed(NODE_BEFORE, _set_annotation("gpu.acme.io/utilization", "0.5"))
    default_prefix = changed(NODE_BEFORE, _set_annotation(PREFIX + "utilization", "0.5"))
    assert custom.admit(NODE_BEFORE, ours, user_info()).allowed
    assert not custom.admit(NODE_BEFORE, default_prefix, user_info()).allowed


def test_binding_points_at_the_policy_and_denies() -> None:
    rendered = render("defaults")
    policy_name = rendered.admission_policy()["metadata"]["name"]
    (binding,) = [
        b
        for b in rendered.of_kind("ValidatingAdmissionPolicyBinding")
        if b["spec"]["policyName"] == policy_name
    ]
    assert binding["spec"] == {"policyName": policy_name, "validationActions": ["Deny"]}
    rules = rendered.admission_policy()["spec"]["matchConstraints"]["resourceRules"]
    assert rules[0]["operations"] == ["UPDATE"]
    assert set(rules[0]["resources"]) == {"nodes", "nodes/status"}


_keys = st.from_regex(r"[a-z]{1,8}(\.[a-z]{1,8}){0,2}/[a-z\-]{1,12}", fullmatch=True)
_values = st.text(alphabet="0123456789.abc", max_size=6)


@settings(max_examples=40, deadline=None)
@given(
    prefixed=st.dictionaries(st.from_regex(r"[a-z\-]{1,12}", fullmatch=True), _values, max_size=4),
    foreign_change=st.one_of(st.none(), st.tuples(_keys, _values)),
)
def test_only_prefixed_changes_pass(
    policy: Policy, prefixed: dict[str, str], foreign_change: tuple[str, str] | None
) -> None:
    # Any set of prefixed annotations is allowed; any one foreign addition or change is not.
    def edit(node: Manifest) -> None:
        annotations = node["metadata"]["annotations"]
        for key in [k for k in annotations if k.startswith(PREFIX)]:
            del annotations[key]
        annotations.update({PREFIX + k: v for k, v in prefixed.items()})
        if foreign_change is not None:
            annotations[foreign_change[0]] = foreign_change[1]

    new = changed(NODE_AGENT_WROTE, edit)
    old_annotations = NODE_AGENT_WROTE["metadata"]["annotations"]
    foreign_differs = foreign_change is not None and (
        not foreign_change[0].startswith(PREFIX)
        and old_annotations.get(foreign_change[0]) != foreign_change[1]
    )
    assert policy.admit(NODE_AGENT_WROTE, new, user_info()).allowed is not foreign_differs
