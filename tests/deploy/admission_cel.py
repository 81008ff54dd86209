"""A rendered ValidatingAdmissionPolicy and its binding, evaluated offline with cel-python.

The order is the API server's: the binding's namespaceSelector picks the namespaces; the policy
applies when every matchCondition is true; its variables are computed in order; the request is
then allowed when every validation is true, and each failed one gives its messageExpression (or,
when that fails, its message). An evaluation error follows the policy's failurePolicy: with
`Fail` it counts as a failed check, with `Ignore` as a passed one.

The e2e suite compares the messages computed here with those a real kube-apiserver returns, so
an expression that cel-python and the API server read differently shows up there.

`MatchConditions` answers the first question alone, whether a policy applies to a request, for
a MutatingAdmissionPolicy: what it then writes is checked on a real kube-apiserver.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import celpy
from celpy import celtypes
from celpy.adapter import json_to_cel
from celpy.evaluation import CELEvalError

Manifest = dict[str, Any]

EVALUATION_ERROR = "<evaluation error>"


@dataclass(frozen=True)
class Verdict:
    applies: bool
    allowed: bool
    messages: tuple[str, ...] = ()


NOT_APPLIED = Verdict(applies=False, allowed=True)


def selector_matches(selector: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """A Kubernetes label selector, as the API server reads a binding's namespaceSelector."""
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for requirement in selector.get("matchExpressions") or ():
        key, operator = requirement["key"], requirement["operator"]
        values = requirement.get("values") or []
        present = key in labels
        holds = {
            "In": present and labels.get(key) in values,
            "NotIn": not present or labels.get(key) not in values,
            "Exists": present,
            "DoesNotExist": not present,
        }[operator]
        if not holds:
            return False
    return True


class _Error(Exception):
    """An expression failed to evaluate."""


class CelPolicy:
    """One policy and the binding that puts it to work, compiled once."""

    def __init__(self, policy: Manifest, binding: Manifest) -> None:
        assert binding["spec"]["policyName"] == policy["metadata"]["name"]
        self.name = policy["metadata"]["name"]
        self.spec = policy["spec"]
        self.binding = binding["spec"]
        self._environment = celpy.Environment()
        self.conditions = [
            self._program(c["expression"]) for c in self.spec.get("matchConditions", [])
        ]
        self.variables = [
            (v["name"], self._program(v["expression"])) for v in self.spec.get("variables", [])
        ]
        self.validations = [
            (
                self._program(v["expression"]),
                self._program(v["messageExpression"]) if "messageExpression" in v else None,
                v.get("message", ""),
            )
            for v in self.spec["validations"]
        ]

    def _program(self, expression: str) -> celpy.Runner:
        return self._environment.program(self._environment.compile(expression))

    def admit_create(self, obj: Manifest, namespace: Manifest) -> Verdict:
        """A CREATE of the namespaced `obj` in `namespace` (a Namespace object)."""
        labels = namespace["metadata"].get("labels") or {}
        selector = self.binding.get("matchResources", {}).get("namespaceSelector")
        if selector is not None and not selector_matches(selector, labels):
            return NOT_APPLIED
        request = {
            "operation": "CREATE",
            "namespace": namespace["metadata"]["name"],
            "name": obj["metadata"].get("name", ""),
            "kind": {"group": "", "version": "v1", "kind": obj["kind"]},
            "dryRun": False,
        }
        activation: dict[str, Any] = {
            "object": json_to_cel(obj),
            "oldObject": json_to_cel(None),
            "request": json_to_cel(request),
            "namespaceObject": json_to_cel(namespace),
        }
        fail = self.spec.get("failurePolicy", "Fail") == "Fail"
        try:
            if not all(self._evaluate(c, activation) for c in self.conditions):
                return NOT_APPLIED
            variables: dict[celtypes.StringType, Any] = {}
            for name, program in self.variables:
                activation["variables"] = celtypes.MapType(variables)
                variables[celtypes.StringType(name)] = self._value(program, activation)
            activation["variables"] = celtypes.MapType(variables)
        except _Error:
            return Verdict(
                applies=True, allowed=not fail, messages=(EVALUATION_ERROR,) if fail else ()
            )
        messages: list[str] = []
        for check, message_program, message in self.validations:
            try:
                passed = self._evaluate(check, activation)
            except _Error:
                passed = not fail
            if passed:
                continue
            text = message  # what the API server falls back to when messageExpression fails
            if message_program is not None:
                with contextlib.suppress(_Error):
                    text = str(self._value(message_program, activation))
            messages.append(text)
        return Verdict(applies=True, allowed=not messages, messages=tuple(messages))

    @staticmethod
    def _value(program: celpy.Runner, activation: dict[str, Any]) -> Any:
        try:
            result = program.evaluate(activation)
        except CELEvalError as exc:
            raise _Error(str(exc)) from None
        if isinstance(result, CELEvalError):
            raise _Error(str(result))
        return result

    def _evaluate(self, program: celpy.Runner, activation: dict[str, Any]) -> bool:
        return bool(self._value(program, activation))


class MatchConditions:
    """Whether a policy applies to a request: its operations and its matchConditions, all true.

    For a MutatingAdmissionPolicy, whose mutation (an `Object{...}` apply configuration typed
    by the API server's schemas) cel-python cannot build: the e2e suite checks the mutation on
    a real kube-apiserver. An evaluation error raises, naming the condition: the tests' objects
    are well formed, so an error is a broken expression, not a pod the policy should skip."""

    def __init__(self, policy: Manifest) -> None:
        spec = policy["spec"]
        rules = spec["matchConstraints"]["resourceRules"]
        self.operations = {op for rule in rules for op in rule["operations"]}
        environment = celpy.Environment()
        self.conditions = [
            (c["name"], environment.program(environment.compile(c["expression"])))
            for c in spec.get("matchConditions", [])
        ]

    def hold(
        self, obj: Manifest, *, operation: str = "CREATE", old: Manifest | None = None
    ) -> bool:
        if operation not in self.operations:
            return False
        request = {"operation": operation, "name": obj["metadata"].get("name", ""), "dryRun": False}
        activation: dict[str, Any] = {
            "object": json_to_cel(obj),
            "oldObject": json_to_cel(old),
            "request": json_to_cel(request),
        }
        for name, program in self.conditions:
            try:
                result = program.evaluate(activation)
            except CELEvalError as exc:
                raise AssertionError(f"matchCondition {name}: {exc}") from None
            if isinstance(result, CELEvalError):
                raise AssertionError(f"matchCondition {name}: {result}")
            if not result:
                return False
        return True
