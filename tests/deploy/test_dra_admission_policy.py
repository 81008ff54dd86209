"""The agent's DeviceTaintRule admission policy, evaluated: its CEL on the rules the agent writes.

The policy is taken from the chart as helm renders it, compiled with cel-python and run the way
the API server runs it (tests/deploy/admission_cel.py's order): an agent may create, change and
delete only rules that name one device of its own node's pool, of the configured driver, with a
NoSchedule taint under the prefix. The rule bodies are `agent.dra.rule_body`'s, the ones the agent
sends. tests/e2e/test_dra.py asks a real kube-apiserver the same questions.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
from celpy.adapter import json_to_cel

from agent.dra import DraDevice, TaintKind, rule_body
from tests.deploy.admission_cel import CelPolicy, Verdict, _Error
from tests.deploy.chart_support import FULLNAME, Manifest, render
from tests.deploy.test_admission_policy import AGENT_USER, NODE, PREFIX, user_info

pytestmark = pytest.mark.helm

POLICY_NAME = f"{FULLNAME}-agent-own-device-taints"
DRIVER = "gpu.nvidia.com"


def policy(variant: str = "defaults") -> CelPolicy:
    rendered = render(variant)
    return CelPolicy(
        rendered.get("ValidatingAdmissionPolicy", POLICY_NAME),
        rendered.get("ValidatingAdmissionPolicyBinding", POLICY_NAME),
    )


def admit(
    checker: CelPolicy,
    operation: str,
    *,
    new: Manifest | None,
    old: Manifest | None,
    user: Manifest,
) -> Verdict:
    """One request on a cluster-scoped DeviceTaintRule, evaluated as the API server does."""
    request = {
        "operation": operation,
        "name": (new or old or {}).get("metadata", {}).get("name", ""),
        "kind": {"group": "resource.k8s.io", "version": "v1", "kind": "DeviceTaintRule"},
        "userInfo": user,
        "dryRun": False,
    }
    activation: dict[str, Any] = {
        "object": json_to_cel(new),
        "oldObject": json_to_cel(old),
        "request": json_to_cel(request),
    }
    if not all(checker._evaluate(c, activation) for c in checker.conditions):
        return Verdict(applies=False, allowed=True)
    messages = []
    for check, _message_program, message in checker.validations:
        try:
            passed = checker._evaluate(check, activation)
        except _Error:
            passed = False  # failurePolicy: Fail
        if not passed:
            messages.append(message)
    return Verdict(applies=True, allowed=not messages, messages=tuple(messages))


def rule(
    *,
    pool: str = NODE,
    device: str = "gpu-0",
    driver: str = DRIVER,
    key: str = "utilization",
    effect: str = "NoSchedule",
    prefix: str = PREFIX,
) -> Manifest:
    body = rule_body(
        DraDevice(driver, pool, device, "GPU-a"),
        TaintKind.UTILIZATION,
        prefix=prefix,
        api_version="v1",
    )
    body["spec"]["taint"]["key"] = f"{prefix}{key}" if "/" not in key else key
    body["spec"]["taint"]["effect"] = effect
    return body


def without_device(manifest: Manifest) -> Manifest:
    changed = copy.deepcopy(manifest)
    del changed["spec"]["deviceSelector"]["device"]
    return changed


POOL = "may taint only devices of its own node's pool"
ONE_DEVICE = "names exactly one device"
TAINT = "may only taint NoSchedule"

CASES = [
    pytest.param("CREATE", rule(), None, user_info(), (), id="create-own-device"),
    pytest.param("UPDATE", rule(key="temperature"), rule(), user_info(), (), id="change-own-key"),
    pytest.param("DELETE", None, rule(), user_info(), (), id="delete-own"),
    pytest.param("CREATE", rule(pool="gpu-node-2"), None, user_info(), (POOL,), id="other-pool"),
    pytest.param(
        "DELETE", None, rule(pool="gpu-node-2"), user_info(), (POOL,), id="delete-other-nodes-rule"
    ),
    pytest.param(
        "UPDATE",
        rule(),
        rule(pool="gpu-node-2"),
        user_info(),
        (POOL,),
        id="take-over-other-nodes-rule",
    ),
    pytest.param(
        "UPDATE",
        rule(pool="gpu-node-2"),
        rule(),
        user_info(),
        (POOL,),
        id="move-own-rule-to-other-pool",
    ),
    pytest.param("CREATE", rule(), None, user_info(node=None), (POOL,), id="no-node-claim"),
    pytest.param(
        "CREATE",
        rule(),
        None,
        user_info(extra_nodes=[NODE, "gpu-node-2"]),
        (POOL,),
        id="two-node-claims",
    ),
    pytest.param(
        "CREATE",
        rule(driver="other.example.com"),
        None,
        user_info(),
        (ONE_DEVICE,),
        id="other-driver",
    ),
    pytest.param(
        "CREATE", without_device(rule()), None, user_info(), (ONE_DEVICE,), id="whole-pool"
    ),
    pytest.param(
        "CREATE", rule(effect="NoExecute"), None, user_info(), (TAINT,), id="no-execute-would-evict"
    ),
    pytest.param(
        "CREATE",
        rule(key="example.com/maintenance"),
        None,
        user_info(),
        (TAINT,),
        id="key-outside-prefix",
    ),
    pytest.param(
        "DELETE",
        None,
        rule(key="example.com/maintenance"),
        user_info(),
        (TAINT,),
        id="delete-someone-elses-taint",
    ),
]


@pytest.mark.parametrize(("operation", "new", "old", "user", "denied"), CASES)
def test_agent_may_touch_only_its_own_nodes_device_taints(
    operation: str,
    new: Manifest | None,
    old: Manifest | None,
    user: Manifest,
    denied: tuple[str, ...],
) -> None:
    verdict = admit(policy(), operation, new=new, old=old, user=user)
    assert verdict.applies
    assert verdict.allowed == (not denied), verdict.messages
    assert len(verdict.messages) == len(denied)
    for message, part in zip(verdict.messages, denied, strict=True):
        assert part in message


def test_other_users_are_not_held_to_it() -> None:
    admin = user_info("system:admin", node=None)
    verdict = admit(policy(), "CREATE", new=rule(pool="anything"), old=None, user=admin)
    assert verdict == Verdict(applies=False, allowed=True)


def test_the_configured_driver_is_the_one_allowed() -> None:
    checker = policy("dra-other-driver")
    allowed = admit(
        checker, "CREATE", new=rule(driver="gpu.example.org"), old=None, user=user_info()
    )
    assert allowed.allowed
    assert not admit(checker, "CREATE", new=rule(), old=None, user=user_info()).allowed


def test_the_policy_is_absent_when_dra_or_admission_is_off() -> None:
    for variant in ("dra-off", "admission-policy-off"):
        assert render(variant).maybe("ValidatingAdmissionPolicy", POLICY_NAME) is None


def test_the_agent_user_is_the_charts_service_account() -> None:
    manifest = render("defaults").get("ValidatingAdmissionPolicy", POLICY_NAME)
    assert AGENT_USER in manifest["spec"]["matchConditions"][0]["expression"]
