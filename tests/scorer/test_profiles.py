"""Tenant profiles: parsing and its errors, label selectors, choosing, and the request path.

A profile is a whole `Policy` chosen by the pod's namespace (its name, or its labels from the
Namespace watch). These tests drive `parse_profiles` and `PolicySet.choose` directly, the
`ScorerApp` with a fake source of namespace labels (its `NamespaceLabels` protocol), and the
`NamespaceCache` hooks with watch lines in the shape kube-apiserver v1.36 sends.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from exporter_scheduler.config.profiles import (
    LabelSelector,
    PolicySet,
    Profile,
    ProfileError,
    Requirement,
    parse_profiles,
)
from exporter_scheduler.config.settings import POLICY_FIELDS, SettingsError, load_settings
from exporter_scheduler.core.policy import Policy
from exporter_scheduler.core.records import NodeInput
from exporter_scheduler.edges.listwatch import WatchExpiredError
from exporter_scheduler.edges.namespacecache import NamespaceCache
from exporter_scheduler.serving.app import ScorerApp
from exporter_scheduler.serving.metrics import Verb
from exporter_scheduler.serving.nodestore import NodeStore
from tests.scorer._http_helpers import NOW, args_body, fixed_clock, gpu_annotations
from tests.scorer._http_helpers import node as node_object
from tests.scorer._http_helpers import pod as pod_object

# What a profile may set: every policy setting (the cluster-wide ones are refused by name).
PROFILE_FIELDS = tuple(f for f in POLICY_FIELDS if f != "annotation_prefix")
# The pod's own load off: these cases are about which profile's limits apply, read against
# the nodes' load as published.
BASE = Policy(own_load=False)


def _parse(raw: object, default: Policy = BASE) -> tuple[Profile, ...]:
    return parse_profiles(raw, default, PROFILE_FIELDS)


# ----------------------------------------------------------------------------- parsing


@dataclass(frozen=True)
class ParseCase:
    name: str
    raw: object
    # Per profile: (name, namespaces, whether it has a selector, {policy field: value}).
    expected: list[tuple[str, tuple[str, ...], bool, dict[str, Any]]]


PARSED = [
    ParseCase("no-profiles-key", None, []),
    ParseCase("empty-list", [], []),
    ParseCase(
        "by-name-with-dashed-and-underscored-keys",
        [
            {
                "name": "prod",
                "namespaces": ["prod", "prod-*"],
                "utilization-limit": 0.70,
                "missing_data": "strict",
            }
        ],
        [
            (
                "prod",
                ("prod", "prod-*"),
                False,
                {"utilization_limit": 0.70, "missing_data": "strict"},
            )
        ],
    ),
    ParseCase(
        "one-namespace-as-a-string",
        [{"name": "lab", "namespaces": "lab"}],
        [("lab", ("lab",), False, {})],
    ),
    ParseCase(
        "by-selector-alone",
        [{"name": "research", "namespace-selector": {"matchLabels": {"team": "research"}}}],
        [("research", (), True, {})],
    ),
    ParseCase(
        "name-and-selector-together",
        [
            {
                "name": "ml",
                "namespaces": ["ml-*"],
                "namespace_selector": {"matchExpressions": [{"key": "tier", "operator": "Exists"}]},
                "stale-after-s": 60,
            }
        ],
        [("ml", ("ml-*",), True, {"stale_after_s": 60})],
    ),
    ParseCase(
        "order-kept",
        [{"name": "b", "namespaces": ["x"]}, {"name": "a", "namespaces": ["y"]}],
        [("b", ("x",), False, {}), ("a", ("y",), False, {})],
    ),
]


@pytest.mark.parametrize("case", PARSED, ids=lambda c: c.name)
def test_profiles_parse(case: ParseCase) -> None:
    profiles = _parse(case.raw)
    got = [(p.name, p.namespaces, p.selector is not None) for p in profiles]
    assert got == [(name, ns, has) for name, ns, has, _ in case.expected]
    for profile, (name, _, _, overrides) in zip(profiles, case.expected, strict=True):
        assert profile.policy.profile == name
        for setting, value in overrides.items():
            assert getattr(profile.policy, setting) == value
        # Everything it does not override is the top-level policy's.
        untouched = set(PROFILE_FIELDS) - set(overrides)
        assert all(getattr(profile.policy, f) == getattr(BASE, f) for f in untouched)


def test_a_profile_builds_on_the_top_level_policy_as_configured() -> None:
    default = Policy(utilization_limit=0.85, temperature_limit_c=80)
    (profile,) = _parse(
        [{"name": "prod", "namespaces": ["prod"], "utilization-limit": 0.7}], default
    )
    assert profile.policy.utilization_limit == 0.7
    assert profile.policy.temperature_limit_c == 80
    assert profile.policy.keys is default.keys


@dataclass(frozen=True)
class ErrorCase:
    name: str
    raw: object
    # The message names where (the profile, else its index) and the key.
    message: str


def _one(**entry: Any) -> list[dict[str, Any]]:
    return [{"name": "research", "namespaces": ["research"], **entry}]


def _selector(selector: object) -> list[dict[str, Any]]:
    return [{"name": "research", "namespace-selector": selector}]


ERRORS = [
    ErrorCase("not-a-list", {"name": "x"}, "profiles must be a list"),
    ErrorCase("entry-not-a-mapping", ["research"], "profiles[0]: must be a mapping"),
    ErrorCase("name-missing", [{"namespaces": ["a"]}], "profiles[0]: name must be a DNS label"),
    ErrorCase(
        "name-upper-case", [{"name": "Research", "namespaces": ["a"]}], "profiles[0]: name must"
    ),
    ErrorCase("name-with-dot", [{"name": "team.a", "namespaces": ["a"]}], "profiles[0]: name must"),
    ErrorCase("name-default", [{"name": "default", "namespaces": ["a"]}], "other than 'default'"),
    ErrorCase("name-too-long", [{"name": "a" * 64, "namespaces": ["a"]}], "profiles[0]: name must"),
    ErrorCase(
        "name-used-twice",
        [{"name": "a", "namespaces": ["x"]}, {"name": "a", "namespaces": ["y"]}],
        "profile 'a': the name is used twice",
    ),
    ErrorCase(
        "second-entry-named-by-index",
        [{"name": "a", "namespaces": ["x"]}, {"namespaces": ["y"]}],
        "profiles[1]: name must",
    ),
    ErrorCase(
        "no-namespaces-nor-selector",
        [{"name": "research", "utilization-limit": 0.9}],
        "profile 'research': needs namespaces and/or namespace-selector",
    ),
    ErrorCase(
        "namespaces-not-strings",
        [{"name": "research", "namespaces": [1]}],
        "profile 'research': namespaces must be a list of names or globs",
    ),
    ErrorCase(
        "namespaces-empty-name",
        [{"name": "research", "namespaces": [""]}],
        "profile 'research': namespaces must be",
    ),
    ErrorCase(
        "annotation-prefix-is-cluster-wide",
        _one(**{"annotation-prefix": "gpu.acme.io"}),
        "profile 'research': annotation-prefix is cluster-wide",
    ),
    ErrorCase(
        "gpu-resource-is-cluster-wide",
        _one(**{"gpu-resource-name": "amd.com/gpu"}),
        "profile 'research': gpu-resource-name is cluster-wide",
    ),
    ErrorCase(
        "unknown-setting",
        _one(**{"utilisation-limit": 0.9}),
        "profile 'research': unknown setting 'utilisation-limit'",
    ),
    ErrorCase(
        "profile-is-not-a-setting",
        _one(profile="other"),
        "profile 'research': unknown setting 'profile'",
    ),
    ErrorCase(
        "fraction-out-of-range",
        _one(**{"utilization-limit": 1.5}),
        "profile 'research': utilization_limit must be a fraction between 0 and 1",
    ),
    ErrorCase(
        "missing-data-value",
        _one(**{"missing-data": "maybe"}),
        "profile 'research': missing_data must be 'lenient' or 'strict'",
    ),
    ErrorCase(
        "temperature-not-an-integer",
        _one(**{"temperature-limit-c": "hot"}),
        "profile 'research': temperature_limit_c must be an integer",
    ),
    ErrorCase(
        "seconds-negative",
        _one(**{"inflight-max-s": -1}),
        "profile 'research': inflight_max_s must be",
    ),
    ErrorCase(
        "weights-all-zero",
        _one(**{"weight-utilization": 0, "weight-fragmentation": 0, "weight-temperature": 0}),
        "profile 'research': weight_utilization + weight_fragmentation + weight_temperature",
    ),
    ErrorCase(
        "selector-not-a-mapping",
        _selector(["team=research"]),
        "profile 'research': namespace-selector takes matchLabels and/or matchExpressions",
    ),
    ErrorCase(
        "selector-unknown-key",
        _selector({"matchFields": {"a": "b"}}),
        "profile 'research': namespace-selector takes matchLabels",
    ),
    ErrorCase(
        "selector-empty",
        _selector({"matchLabels": {}}),
        "profile 'research': namespace-selector is empty",
    ),
    ErrorCase(
        "match-labels-value-not-a-string",
        _selector({"matchLabels": {"gpu": True}}),
        "profile 'research': namespace-selector.matchLabels must map strings to strings",
    ),
    ErrorCase(
        "expression-without-key",
        _selector({"matchExpressions": [{"operator": "Exists"}]}),
        "profile 'research': namespace-selector.matchExpressions[0]: needs a key",
    ),
    ErrorCase(
        "expression-unknown-operator",
        _selector({"matchExpressions": [{"key": "tier", "operator": "Gt", "values": ["1"]}]}),
        "profile 'research': namespace-selector.matchExpressions[0]: operator must be one of",
    ),
    ErrorCase(
        "in-without-values",
        _selector({"matchExpressions": [{"key": "tier", "operator": "In"}]}),
        "matchExpressions[0]: In needs values",
    ),
    ErrorCase(
        "not-in-without-values",
        _selector(
            {
                "matchExpressions": [
                    {"key": "a", "operator": "Exists"},
                    {"key": "tier", "operator": "NotIn", "values": []},
                ]
            }
        ),
        "profile 'research': namespace-selector.matchExpressions[1]: NotIn needs values",
    ),
    ErrorCase(
        "exists-with-values",
        _selector({"matchExpressions": [{"key": "tier", "operator": "Exists", "values": ["a"]}]}),
        "matchExpressions[0]: Exists takes no values",
    ),
    ErrorCase(
        "values-not-strings",
        _selector({"matchExpressions": [{"key": "tier", "operator": "In", "values": [1]}]}),
        "matchExpressions[0]: values must be a list of strings",
    ),
]


@pytest.mark.parametrize("case", ERRORS, ids=lambda c: c.name)
def test_profile_errors_name_the_profile_and_the_key(case: ErrorCase) -> None:
    with pytest.raises(ProfileError) as raised:
        _parse(case.raw)
    assert case.message in str(raised.value)


def _policy_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "policy.yaml"
    path.write_text(text)
    return path


def test_a_bad_profile_in_the_policy_file_stops_start_up_naming_it(tmp_path: Path) -> None:
    path = _policy_file(
        tmp_path,
        "utilization-limit: 0.9\n"
        "profiles:\n"
        "  - name: research\n"
        "    namespaces: [research]\n"
        "    utilization-limit: 1.5\n",
    )
    with pytest.raises(SettingsError) as raised:
        load_settings({"policy_file": str(path)})
    assert str(raised.value) == (
        "invalid settings: policy file: profile 'research': utilization_limit must be a "
        "fraction between 0 and 1, got 1.5"
    )


def test_the_policy_file_profiles_become_the_policy_set(tmp_path: Path) -> None:
    path = _policy_file(
        tmp_path,
        "utilization-limit: 0.85\n"
        "profiles:\n"
        "  - name: research\n"
        "    namespace-selector:\n"
        "      matchLabels: {team: research}\n"
        "    utilization-limit: 0.97\n"
        "  - name: prod\n"
        "    namespaces: [prod]\n"
        "    missing-data: strict\n",
    )
    policies = load_settings({"policy_file": str(path)}).policy_set()
    assert [p.name for p in policies.profiles] == ["research", "prod"]
    assert policies.reads_labels
    assert policies.default.utilization_limit == 0.85
    assert policies.choose("lab", {"team": "research"}).utilization_limit == 0.97
    prod = policies.choose("prod", {})
    assert (prod.profile, prod.missing_data, prod.utilization_limit) == ("prod", "strict", 0.85)


# ----------------------------------------------------------------------------- selectors


@dataclass(frozen=True)
class SelectorCase:
    name: str
    selector: dict[str, Any]
    labels: dict[str, str]
    matches: bool


def _expr(key: str, operator: str, *values: str) -> dict[str, Any]:
    entry: dict[str, Any] = {"key": key, "operator": operator}
    if values:
        entry["values"] = list(values)
    return {"matchExpressions": [entry]}


SELECTORS = [
    SelectorCase("match-labels-equal", {"matchLabels": {"team": "ml"}}, {"team": "ml"}, True),
    SelectorCase("match-labels-other-value", {"matchLabels": {"team": "ml"}}, {"team": "x"}, False),
    SelectorCase("match-labels-missing-key", {"matchLabels": {"team": "ml"}}, {}, False),
    SelectorCase(
        "match-labels-every-pair",
        {"matchLabels": {"team": "ml", "tier": "batch"}},
        {"team": "ml"},
        False,
    ),
    SelectorCase(
        "match-labels-extra-labels-ignored",
        {"matchLabels": {"team": "ml"}},
        {"team": "ml", "kubernetes.io/metadata.name": "lab"},
        True,
    ),
    SelectorCase("in-listed", _expr("tier", "In", "batch", "dev"), {"tier": "dev"}, True),
    SelectorCase("in-not-listed", _expr("tier", "In", "batch"), {"tier": "prod"}, False),
    SelectorCase("in-missing-key", _expr("tier", "In", "batch"), {}, False),
    SelectorCase("not-in-listed", _expr("tier", "NotIn", "prod"), {"tier": "prod"}, False),
    SelectorCase("not-in-not-listed", _expr("tier", "NotIn", "prod"), {"tier": "dev"}, True),
    # As Kubernetes reads a selector: a namespace without the key is "not in" any values.
    SelectorCase("not-in-missing-key", _expr("tier", "NotIn", "prod"), {}, True),
    SelectorCase("exists-present", _expr("gpu", "Exists"), {"gpu": ""}, True),
    SelectorCase("exists-absent", _expr("gpu", "Exists"), {"team": "ml"}, False),
    SelectorCase("does-not-exist-absent", _expr("gpu", "DoesNotExist"), {}, True),
    SelectorCase("does-not-exist-present", _expr("gpu", "DoesNotExist"), {"gpu": "a"}, False),
    SelectorCase(
        "labels-and-expressions-both-hold",
        {"matchLabels": {"team": "ml"}, **_expr("tier", "NotIn", "prod")},
        {"team": "ml", "tier": "dev"},
        True,
    ),
    SelectorCase(
        "labels-hold-expression-fails",
        {"matchLabels": {"team": "ml"}, **_expr("tier", "NotIn", "prod")},
        {"team": "ml", "tier": "prod"},
        False,
    ),
    SelectorCase(
        "every-expression-must-hold",
        {
            "matchExpressions": [
                {"key": "team", "operator": "Exists"},
                {"key": "tier", "operator": "In", "values": ["batch"]},
            ]
        },
        {"team": "ml"},
        False,
    ),
]


@pytest.mark.parametrize("case", SELECTORS, ids=lambda c: c.name)
def test_namespace_selector_semantics(case: SelectorCase) -> None:
    (profile,) = _parse([{"name": "p", "namespace-selector": case.selector}])
    assert profile.selector is not None
    assert profile.selector.matches(case.labels) is case.matches
    assert profile.matches("any-namespace", case.labels) is case.matches


def test_selector_values_parse_to_requirements() -> None:
    (profile,) = _parse(
        [
            {
                "name": "p",
                "namespace-selector": {
                    "matchLabels": {"z": "1", "a": "2"},
                    **_expr("tier", "In", "batch", "dev"),
                },
            }
        ]
    )
    assert profile.selector == LabelSelector(
        (("a", "2"), ("z", "1")), (Requirement("tier", "In", ("batch", "dev")),)
    )


# ----------------------------------------------------------------------------- choosing

CHOOSER = PolicySet(
    BASE,
    _parse(
        [
            {"name": "prod", "namespaces": ["prod", "prod-?"], "utilization-limit": 0.7},
            # Overlaps `prod` for `prod`; listed second, so `prod` wins there.
            {"name": "wide", "namespaces": ["p*"]},
            {
                "name": "research",
                "namespace-selector": {"matchLabels": {"team": "research"}},
            },
            {
                "name": "ml-gpu",
                "namespaces": ["ml-*"],
                "namespace-selector": _expr("gpu", "Exists"),
            },
            {"name": "sets", "namespaces": ["[ab]-team"]},
        ]
    ),
)


@dataclass(frozen=True)
class ChooseCase:
    name: str
    namespace: str
    labels: Mapping[str, str]
    profile: str


CHOICES = [
    ChooseCase("exact-name", "prod", {}, "prod"),
    ChooseCase("first-match-wins-over-a-later-glob", "prod", {"team": "research"}, "prod"),
    ChooseCase("glob-question-mark", "prod-1", {}, "prod"),
    ChooseCase("glob-question-mark-one-character-only", "prod-12", {}, "wide"),
    ChooseCase("later-glob", "platform", {}, "wide"),
    ChooseCase("earlier-profile-wins-over-a-selector", "pipelines", {"team": "research"}, "wide"),
    ChooseCase("selector", "lab", {"team": "research"}, "research"),
    ChooseCase("selector-labels-unknown", "lab", {}, "default"),
    ChooseCase("name-and-selector-both-hold", "ml-train", {"gpu": "a100"}, "ml-gpu"),
    ChooseCase("name-holds-selector-does-not", "ml-train", {}, "default"),
    ChooseCase("selector-holds-name-does-not", "train", {"gpu": "a100"}, "default"),
    ChooseCase("glob-character-set", "b-team", {}, "sets"),
    ChooseCase("globs-are-case-sensitive", "Prod", {}, "default"),
    ChooseCase("no-match-gets-the-top-level-policy", "kube-system", {}, "default"),
]


@pytest.mark.parametrize("case", CHOICES, ids=lambda c: c.name)
def test_the_first_matching_profile_is_chosen(case: ChooseCase) -> None:
    chosen = CHOOSER.choose(case.namespace, case.labels)
    assert chosen.profile == case.profile
    if case.profile == "default":
        assert chosen is BASE


def test_only_selectors_need_the_namespace_watch() -> None:
    by_name = PolicySet(BASE, _parse([{"name": "a", "namespaces": ["a"]}]))
    assert not by_name.reads_labels
    assert not PolicySet(BASE).reads_labels
    assert CHOOSER.reads_labels
    assert CHOOSER.policies()[0] is BASE
    assert [p.profile for p in CHOOSER.policies()] == [
        "default",
        "prod",
        "wide",
        "research",
        "ml-gpu",
        "sets",
    ]


# ----------------------------------------------------------------------------- the request path


@dataclass
class FakeNamespaces:
    """The app's `NamespaceLabels`: labels by namespace, and a generation bumped on change."""

    known: dict[str, dict[str, str]] = field(default_factory=dict)
    generation: int = 0
    reads: int = 0

    def labels(self, namespace: str) -> Mapping[str, str]:
        self.reads += 1
        return self.known.get(namespace, {})


TENANTS = _parse(
    [
        # Chosen by name: only nodes well below saturation, and no node without data.
        {
            "name": "prod",
            "namespaces": ["prod"],
            "utilization-limit": 0.70,
            "missing-data": "strict",
        },
        # Chosen by a namespace label: packs nodes up to 0.97.
        {
            "name": "research",
            "namespace-selector": {"matchLabels": {"team": "research"}},
            "utilization-limit": 0.97,
        },
    ]
)
# The same three nodes for every tenant.
NODE_UTILIZATION = {"warm": 0.80, "hot": 0.95}
NODES = ["warm", "hot", "blank"]


def _node_objects() -> list[dict[str, Any]]:
    objects = [node_object(n, gpu_annotations(utilization=u)) for n, u in NODE_UTILIZATION.items()]
    return [*objects, node_object("blank", {})]  # no GPU data at all


def _names_store() -> NodeStore:
    store = NodeStore(clock=fixed_clock())
    store.replace(
        [
            *(NodeInput(n, gpu_annotations(utilization=u)) for n, u in NODE_UTILIZATION.items()),
            NodeInput("blank", {}),
        ]
    )
    return store


def _tenant_app(names_only: bool, namespaces: FakeNamespaces | None = None) -> ScorerApp:
    return ScorerApp(
        policy=BASE,
        clock=fixed_clock(),
        node_store=_names_store() if names_only else None,
        profiles=TENANTS,
        namespace_labels=namespaces,
    )


def _body(namespace: str, names_only: bool, annotations: Mapping[str, str] | None = None) -> bytes:
    doc = pod_object(annotations)
    doc["metadata"]["namespace"] = namespace
    if names_only:
        return args_body(doc, names=NODES)
    return args_body(doc, nodes=_node_objects())


def _filter(app: ScorerApp, namespace: str, names_only: bool) -> dict[str, Any]:
    reply = json.loads(app.handle("filter", _body(namespace, names_only)).body)
    if names_only:
        passed = reply["NodeNames"]
    else:
        passed = [item["metadata"]["name"] for item in reply["Nodes"]["items"]]
    return {
        "passed": passed,
        "failed": reply["FailedNodes"],
        "unresolvable": reply["FailedAndUnresolvableNodes"],
    }


@dataclass(frozen=True)
class TenantCase:
    name: str
    namespace: str
    passed: list[str]
    failed: dict[str, str]
    unresolvable: dict[str, str]
    profile: str


TENANT_CASES = [
    TenantCase(
        "prod-by-name-strict-and-below-0.70",
        "prod",
        [],
        {"warm": "gpu utilization above 0.70", "hot": "gpu utilization above 0.70"},
        {"blank": "gpu data missing"},
        "prod",
    ),
    TenantCase(
        "research-by-label-packs-to-0.97", "lab", ["warm", "hot", "blank"], {}, {}, "research"
    ),
    TenantCase(
        "others-get-the-top-level-policy",
        "other",
        ["warm", "blank"],
        {"hot": "gpu utilization above 0.90"},
        {},
        "default",
    ),
]
MODES = [pytest.param(True, id="names-only"), pytest.param(False, id="full-node")]


@pytest.mark.parametrize("names_only", MODES)
@pytest.mark.parametrize("case", TENANT_CASES, ids=lambda c: c.name)
def test_profiles_give_different_verdicts_on_the_same_nodes(
    case: TenantCase, names_only: bool
) -> None:
    app = _tenant_app(names_only, FakeNamespaces({"lab": {"team": "research"}}))
    got = _filter(app, case.namespace, names_only)
    assert got == {"passed": case.passed, "failed": case.failed, "unresolvable": case.unresolvable}
    explained = json.loads(app.handle("explain", _body(case.namespace, names_only)).body)
    assert explained["policy"]["profile"] == case.profile
    text = app.handle("explain", _body(case.namespace, names_only), query=b"output=text").body
    assert text.decode().splitlines()[1].startswith(f"policy {case.profile}: utilization limit")


@pytest.mark.parametrize("names_only", MODES)
def test_the_same_pod_scores_by_its_namespace_profile(names_only: bool) -> None:
    app = _tenant_app(names_only, FakeNamespaces({"lab": {"team": "research"}}))
    scores = {}
    for namespace in ("lab", "other"):
        reply = json.loads(app.handle("prioritize", _body(namespace, names_only)).body)
        scores[namespace] = {entry["Host"]: entry["Score"] for entry in reply}
    # Research may use the hot node (it scores above 0); under the top-level limit it fails.
    assert scores["lab"]["hot"] > 0
    assert scores["other"]["hot"] == 0
    assert scores["lab"]["warm"] == scores["other"]["warm"] > 0


def test_requests_are_counted_by_profile() -> None:
    app = _tenant_app(False, FakeNamespaces({"lab": {"team": "research"}}))
    sent: list[tuple[str, Verb]] = [("prod", "filter"), ("lab", "filter"), ("lab", "prioritize")]
    for namespace, verb in sent:
        app.handle(verb, _body(namespace, names_only=False))
    app.handle("explain", _body("other", names_only=False))  # a diagnosis, not a request
    metrics = app.metrics.render()[0].decode()
    samples = {
        line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith("gpu_scorer_requests_total{")
    }
    assert samples == {
        'gpu_scorer_requests_total{profile="prod",verb="filter"}': 1.0,
        'gpu_scorer_requests_total{profile="research",verb="filter"}': 1.0,
        'gpu_scorer_requests_total{profile="research",verb="prioritize"}': 1.0,
    }


@pytest.mark.parametrize("names_only", MODES)
def test_the_request_log_line_names_the_profile(
    names_only: bool, caplog: pytest.LogCaptureFixture
) -> None:
    app = _tenant_app(names_only)
    with caplog.at_level(logging.INFO, logger="exporter_scheduler"):
        _filter(app, "prod", names_only)
    summaries = [r for r in caplog.records if r.getMessage() == "nodes rejected"]
    assert len(summaries) == 1
    fields = summaries[0].__dict__["fields"]
    assert fields["pod_class"]["profile"] == "prod"
    assert fields["reasons"] == {"gpu data missing": 1, "gpu utilization above 0.70": 2}


def test_the_profile_chosen_is_remembered_until_namespace_labels_change() -> None:
    namespaces = FakeNamespaces()
    app = _tenant_app(False, namespaces)
    assert _filter(app, "lab", names_only=False)["passed"] == ["warm", "blank"]  # default
    reads = namespaces.reads
    # Labels change but the source has not said so (no new generation): the memo holds, and
    # the request path does not read the labels again.
    namespaces.known["lab"] = {"team": "research"}
    assert _filter(app, "lab", names_only=False)["passed"] == ["warm", "blank"]
    assert namespaces.reads == reads
    # The watch bumps its generation on the change: the next request chooses again.
    namespaces.generation += 1
    assert _filter(app, "lab", names_only=False)["passed"] == ["warm", "hot", "blank"]
    # The label removed again: back to the top-level policy.
    namespaces.known["lab"] = {}
    namespaces.generation += 1
    assert _filter(app, "lab", names_only=False)["passed"] == ["warm", "blank"]


def test_without_a_namespace_watch_only_names_choose() -> None:
    app = _tenant_app(False, namespaces=None)
    assert _filter(app, "lab", names_only=False)["passed"] == ["warm", "blank"]
    assert _filter(app, "prod", names_only=False)["passed"] == []


def test_a_pod_hint_still_applies_under_a_profile() -> None:
    app = _tenant_app(False, FakeNamespaces({"lab": {"team": "research"}}))
    # The pod's own max-utilization is below the profile's limit: the lower one holds.
    body = _body("lab", False, {"gpu-scheduler.example.com/max-utilization": "0.85"})
    reply = json.loads(app.handle("filter", body).body)
    assert reply["FailedNodes"] == {"hot": "gpu utilization above 0.85"}


# ----------------------------------------------------------------------------- the namespace watch

# The shape kube-apiserver v1.36 sends (managedFields shortened): the server adds the
# `kubernetes.io/metadata.name` label to every namespace.
_CREATED = "2026-11-30T13:00:00Z"


def _namespace(
    name: str, rv: str, labels: Mapping[str, str], *, phase: str = "Active", **meta: Any
) -> dict[str, Any]:
    return {
        "kind": "Namespace",
        "apiVersion": "v1",
        "metadata": {
            "name": name,
            "uid": f"uid-{name}",
            "resourceVersion": rv,
            "creationTimestamp": _CREATED,
            "labels": {"kubernetes.io/metadata.name": name, **labels},
            **meta,
            "managedFields": [
                {
                    "manager": "kubectl-create",
                    "operation": "Update",
                    "apiVersion": "v1",
                    "time": _CREATED,
                    "fieldsType": "FieldsV1",
                    "fieldsV1": {"f:metadata": {"f:labels": {".": {}}}},
                }
            ],
        },
        "spec": {"finalizers": ["kubernetes"]},
        "status": {"phase": phase},
    }


def _line(kind: str, obj: Mapping[str, Any]) -> bytes:
    return json.dumps({"type": kind, "object": obj}, separators=(",", ":")).encode()


def _listed(cache: NamespaceCache, *items: Mapping[str, Any], rv: str = "100") -> None:
    page = {"kind": "NamespaceList", "apiVersion": "v1", "metadata": {"resourceVersion": rv}}
    cache._replace(cache._page.decode(json.dumps({**page, "items": list(items)})).items or [])


BOOKMARK = _line(
    "BOOKMARK",
    {"kind": "Namespace", "apiVersion": "v1", "metadata": {"resourceVersion": "300"},
     "spec": {}, "status": {}},
)  # fmt: skip
EXPIRED = _line(
    "ERROR",
    {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
     "message": "too old resource version: 1 (237)", "reason": "Expired", "code": 410},
)  # fmt: skip


@dataclass(frozen=True)
class WatchCase:
    name: str
    lines: Sequence[bytes]
    # Labels of `lab` afterwards (without the server's metadata.name label), None: unknown.
    lab: dict[str, str] | None
    bumped: int  # generations added by the lines


WATCHES = [
    WatchCase(
        "added",
        [_line("ADDED", _namespace("lab", "201", {"team": "research"}))],
        {"team": "research"},
        1,
    ),
    WatchCase(
        "annotations-only-change-nothing",
        [
            _line("ADDED", _namespace("lab", "201", {"team": "research"})),
            _line(
                "MODIFIED",
                _namespace("lab", "202", {"team": "research"}, annotations={"owner": "ml"}),
            ),
        ],
        {"team": "research"},
        1,
    ),
    WatchCase(
        "label-added",
        [
            _line("ADDED", _namespace("lab", "201", {"team": "research"})),
            _line("MODIFIED", _namespace("lab", "203", {"team": "research", "tier": "batch"})),
        ],
        {"team": "research", "tier": "batch"},
        2,
    ),
    WatchCase(
        "terminating-keeps-labels",
        [
            _line("ADDED", _namespace("lab", "201", {"team": "research"})),
            _line(
                "MODIFIED",
                _namespace(
                    "lab",
                    "204",
                    {"team": "research"},
                    phase="Terminating",
                    deletionTimestamp="2026-11-30T13:05:00Z",
                ),
            ),
        ],
        {"team": "research"},
        1,
    ),
    WatchCase(
        "deleted",
        [
            _line("ADDED", _namespace("lab", "201", {"team": "research"})),
            _line("DELETED", _namespace("lab", "205", {"team": "research"})),
        ],
        None,
        2,
    ),
    WatchCase(
        "deleted-unknown-changes-nothing",
        [_line("DELETED", _namespace("gone", "205", {}))],
        None,
        0,
    ),
    WatchCase("bookmark-changes-nothing", [BOOKMARK], None, 0),
]


@pytest.mark.parametrize("case", WATCHES, ids=lambda c: c.name)
def test_namespace_watch_events(case: WatchCase) -> None:
    cache = NamespaceCache()
    _listed(cache, _namespace("default", "34", {}))
    before = cache.generation
    for line in case.lines:
        cache._apply(line)
    lab = cache.labels("lab")
    expected = None if case.lab is None else {"kubernetes.io/metadata.name": "lab", **case.lab}
    assert (dict(lab) if lab else None) == expected
    assert cache.generation - before == case.bumped
    assert cache.labels("default") == {"kubernetes.io/metadata.name": "default"}


def test_namespace_watch_keeps_the_last_resource_version() -> None:
    cache = NamespaceCache()
    _listed(cache)
    cache._apply(_line("ADDED", _namespace("lab", "201", {})))
    cache._apply(BOOKMARK)
    assert cache._resource_version == "300"


def test_an_expired_namespace_watch_asks_for_a_relist() -> None:
    cache = NamespaceCache()
    _listed(cache)
    with pytest.raises(WatchExpiredError):
        cache._apply(EXPIRED)


@dataclass(frozen=True)
class RelistCase:
    name: str
    first: list[dict[str, Any]]
    second: list[dict[str, Any]]
    bumped: bool


RELISTS = [
    RelistCase(
        "same-labels-newer-versions",
        [_namespace("lab", "201", {"team": "research"})],
        [_namespace("lab", "250", {"team": "research"}, annotations={"a": "b"})],
        bumped=False,
    ),
    RelistCase(
        "label-changed-while-disconnected",
        [_namespace("lab", "201", {"team": "research"})],
        [_namespace("lab", "250", {"team": "platform"})],
        bumped=True,
    ),
    RelistCase(
        "namespace-gone",
        [_namespace("lab", "201", {}), _namespace("old", "202", {})],
        [_namespace("lab", "201", {})],
        bumped=True,
    ),
]


@pytest.mark.parametrize("case", RELISTS, ids=lambda c: c.name)
def test_a_relist_bumps_the_generation_only_on_a_label_change(case: RelistCase) -> None:
    cache = NamespaceCache()
    _listed(cache, *case.first)
    assert cache.generation == 1  # from nothing to the first list
    _listed(cache, *case.second, rv="260")
    assert cache.generation == (2 if case.bumped else 1)
    assert {n for n in ("lab", "old") if cache.labels(n)} == {
        o["metadata"]["name"] for o in case.second
    }


def test_the_app_chooses_again_after_the_namespace_watch_sees_a_label_change() -> None:
    """The real cache as the app's label source: an event flips the profile chosen."""
    cache = NamespaceCache()
    _listed(cache, _namespace("lab", "201", {}))
    app = ScorerApp(policy=BASE, clock=fixed_clock(NOW), profiles=TENANTS, namespace_labels=cache)
    assert _filter(app, "lab", names_only=False)["passed"] == ["warm", "blank"]
    cache._apply(_line("MODIFIED", _namespace("lab", "202", {"team": "research"})))
    assert _filter(app, "lab", names_only=False)["passed"] == ["warm", "hot", "blank"]
