"""Rejections after the node rules: the one type for "reject this node, although it passed".

Three decisions overrule what the node rules said of a node, each with one uniform reason and
unresolvable (evicting pods cures none of them):

- a pod hint the scorer cannot accept rejects every node, passed or not: the pod must be fixed;
- the model preference chain rejects the passing nodes of the ranks it did not keep;
- a spread cap rejects the passing nodes whose domain is full or unlabelled.

The first that applies gives the reason, in that order. `evaluate` (full verdicts, for replies
and explanations) and the names-only judgement (verdict entries, for replies) both ask this one
type for each node, so the two paths cannot tell a node different things.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Final, NamedTuple

import msgspec

from exporter_scheduler.core.hints import HintError
from exporter_scheduler.core.records import ChainOutcome, NodeVerdict, RuleOutcome

NO_BLOCKS: Final[Mapping[str, str]] = MappingProxyType({})


class Overrides(NamedTuple):
    """What overrules the node rules for one request's nodes (see the module docstring)."""

    hint: HintError | None = None
    # The chain as resolved over the request's nodes; it rejects only where it kept a rank.
    chain: ChainOutcome | None = None
    # Spread cap: node name -> the reason its domain takes no more of the group.
    blocked: Mapping[str, str] = NO_BLOCKS

    @property
    def active(self) -> bool:
        """Whether any node can be overruled (when not, verdicts stand as the rules gave them)."""
        chain = self.chain
        rejects_ranks = chain is not None and chain.not_preferred is not None
        return self.hint is not None or rejects_ranks or bool(self.blocked)

    def reason(self, name: str, *, passed: bool, rank: int | None) -> str | None:
        """Why the node `name`, which the node rules passed or not and which has model `rank`,
        is rejected after them; None when the rules' verdict stands."""
        found = self._overrule(name, passed=passed, rank=rank)
        return None if found is None else found[0]

    def apply(self, verdict: NodeVerdict) -> NodeVerdict:
        """`verdict` after the overrides: rejected, unresolvable, scored 0, where one applies;
        the model rule records the chain's rejection."""
        found = self._overrule(verdict.name, passed=verdict.passed, rank=verdict.model_rank)
        if found is None:
            return verdict
        reason, model_rule = found
        rules = (
            verdict.rules
            if model_rule is None
            else msgspec.structs.replace(verdict.rules, model=model_rule)
        )
        return msgspec.structs.replace(
            verdict,
            passed=False,
            reason=reason,
            unresolvable=True,
            score=0,
            breakdown=None,
            rules=rules,
            at_or_below_threshold=False,
        )

    def _overrule(
        self, name: str, *, passed: bool, rank: int | None
    ) -> tuple[str, RuleOutcome | None] | None:
        """The reason, and the model rule's outcome where the chain is what rejects."""
        if self.hint is not None:
            return self.hint.reason, None
        if not passed:
            return None
        chain = self.chain
        rejection = None if chain is None else chain.not_preferred
        if rejection is not None and chain is not None and rank != chain.chosen_rank:
            return rejection.reason or "", rejection
        blocked = self.blocked.get(name)
        return None if blocked is None else (blocked, None)
