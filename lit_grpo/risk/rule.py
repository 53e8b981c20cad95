"""The infer/defer rule applied to open contexts between rounds (docs/guide.md#multi-round-tasks-and-tree-rollouts): it
sees the policy and its risk head only through a ``ContextRisk`` (``lit_grpo.buffers.protocols``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from lit_grpo.buffers.protocols import ContextRisk
from lit_grpo.risk.head import first_token_constraints, forced_defer, value_rule_defers
from lit_grpo.run.rules import NamesFirstTokens


class RiskRule:
    """The decision rule for ``expand_trees`` at each round's open contexts.

    ``threshold`` (the default): force a defer (allow only ``defer_token_ids`` as the first token) wherever
    P(error) > tau; ``tau=None`` forces a defer everywhere. ``value``: at every context, force a defer where the
    CVaR at ``cvar_level`` of the return of inferring is below that of deferring, and force an answer (only
    ``answer_token_ids`` first) elsewhere; tau plays no part.
    """

    def __init__(self, risk: ContextRisk, tau: float | None, defer_token_ids: Sequence[int],
                 decision: str = "threshold", cvar_level: float = 0.0,
                 answer_token_ids: Sequence[int] = ()) -> None:
        self.risk, self.tau = risk, tau
        self.defer_token_ids = tuple(defer_token_ids)
        self.decision, self.cvar_level, self.answer_token_ids = decision, cvar_level, tuple(answer_token_ids)

    @classmethod
    def for_task(cls, risk: ContextRisk, tau: float | None, task: NamesFirstTokens, tokenizer: Any,
                 decision: str = "threshold", cvar_level: float = 0.0) -> RiskRule:
        """The rule with ``task``'s defer (and, for the value rule, answer) first tokens (``run.rules``'
        ``NamesDeferTokens``, ``NamesAnswerTokens``)."""
        answer_ids = task.answer_token_ids(tokenizer) if decision == "value" else ()
        return cls(risk, tau, task.defer_token_ids(tokenizer), decision, cvar_level, answer_ids)

    def __call__(self, contexts: list[list[int]], depth: int) -> tuple[tuple[int, ...] | None, ...]:
        if self.decision == "threshold":
            p_error = self.risk.p_error(contexts)  # [B]
            return first_token_constraints(forced_defer(p_error, self.tau), self.defer_token_ids)
        with torch.no_grad():
            probs = self.risk.branch_probs(contexts)  # [B, 2, K]
            defers = value_rule_defers(probs, self.risk.atoms.to(probs.device), self.cvar_level).cpu()
        return tuple(self.defer_token_ids if flag else self.answer_token_ids for flag in defers.tolist())
