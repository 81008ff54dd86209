"""The overrides (a bad hint, the model chain, a spread cap) read the same by both paths.

`evaluate` applies them to full verdicts; the names-only reply applies them to verdict entries
(`serving.verdicts.Judgement`). Each case judges the same nodes both ways and compares every
piece a reply or a counter reads.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field

import pytest

from exporter_scheduler.core.judge import evaluate
from exporter_scheduler.core.overrides import Overrides
from exporter_scheduler.core.podclass import PodClass
from exporter_scheduler.core.policy import Policy
from exporter_scheduler.core.records import PodInput
from exporter_scheduler.serving.verdicts import VerdictTable
from exporter_scheduler.serving.wire import encode_prioritize_reply
from tests.scorer.scoring_builders import A100, NOW, T4, V100, node, pod

NODES = (
    node("a-idle", model=A100, utilization=0.10),
    node("a-busy", model=A100, utilization=0.85),
    node("v-idle", model=V100, utilization=0.05),
    node("t-hot", model=T4, utilization=0.95),
    node("no-model", model=None, utilization=0.20),
    node("a-idle", model=A100, utilization=0.30),  # a name twice, as a request may carry it
)


@dataclass(frozen=True)
class Case:
    name: str
    pod: PodInput
    blocked: Mapping[str, str] = field(default_factory=dict)


CASES = [
    Case("none", pod()),
    Case("bad hint", pod(max_utilization="lots")),
    Case("chain keeps A100", pod(preference="A100,V100", fallback="0.50")),
    Case("chain falls back to V100", pod(preference="A100,V100", fallback="0.05")),
    Case("spread cap", pod(), {"a-idle": "spread group at most 1 per zone", "t-hot": "full"}),
    Case(
        "chain and spread cap",
        pod(preference="A100,V100", fallback="0.50"),
        {"a-busy": "node has no zone label", "v-idle": "full"},
    ),
]


# What a reply and the counters read: passing names, the two rejection maps, the prioritize
# bytes and the tally. The maps compare as maps: kube-scheduler decodes them into Go maps, and
# the reply lists the rules' rejections before the overrides' where `evaluate` keeps node order.
Reply = tuple[list[str], dict[str, str], dict[str, str], bytes, Counter[object]]


def _by_entries(case: Case) -> Reply:
    c = PodClass.of(case.pod, Policy())
    table = VerdictTable(c)
    entries = [table.judge(n, NOW, NOW.timestamp())[0] for n in NODES]
    judgement = table.judgement([n.name for n in NODES], entries, len(entries))
    judgement.block(case.blocked)
    failed, unresolvable = judgement.rejections()
    passed = [n.name for n, ok in zip(NODES, judgement.passed_mask(), strict=True) if ok]
    tally: Counter[object] = Counter(judgement.tally())
    return passed, failed, unresolvable, judgement.prioritize_reply(), tally


def _by_evaluate(case: Case) -> Reply:
    evaluation = evaluate(case.pod, NODES, NOW, Policy(), blocked=case.blocked)
    tally: Counter[object] = Counter(
        (v.passed, v.unresolvable, v.reason, v.data_status) for v in evaluation.verdicts
    )
    return (
        evaluation.passed_names(),
        evaluation.failed(),
        evaluation.unresolvable(),
        encode_prioritize_reply(evaluation.scores()),
        tally,
    )


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
def test_both_paths_apply_the_same_overrides(case: Case) -> None:
    assert _by_entries(case) == _by_evaluate(case)


@pytest.mark.parametrize("case", CASES[1:], ids=lambda case: case.name)
def test_each_case_overrules_some_passing_node(case: Case) -> None:
    """Each case but the first exercises an override (else the comparison above proves little)."""
    plain = {v.name for v in evaluate(pod(), NODES, NOW, Policy()).verdicts if v.passed}
    after = set(_by_evaluate(case)[0])
    assert after < plain


def test_the_first_override_that_applies_gives_the_reason() -> None:
    c = PodClass.of(pod(max_utilization="lots"), Policy())
    overrides = Overrides(hint=c.hint_problem, blocked={"n": "full"})
    assert overrides.reason("n", passed=True, rank=None) == c.hint_problem.reason  # type: ignore[union-attr]
    assert Overrides(blocked={"n": "full"}).reason("n", passed=False, rank=None) is None
    assert Overrides().active is False


def test_a_verdict_the_overrides_reject_is_unresolvable_and_scores_zero() -> None:
    verdict = evaluate(pod(), [node("n", utilization=0.1)], NOW, Policy()).verdicts[0]
    rejected = Overrides(blocked={"n": "full"}).apply(verdict)
    assert (rejected.passed, rejected.unresolvable, rejected.reason, rejected.score) == (
        False,
        True,
        "full",
        0,
    )
