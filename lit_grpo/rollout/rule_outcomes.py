"""The infer/defer rule measured on held-out prompts: fresh greedy episodes under the rule at one tau
(docs/guide.md#multi-round-tasks-and-tree-rollouts calibration runs and the risk-coverage curve)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch

from lit_grpo.buffers.protocols import SamplingPolicy
from lit_grpo.engines import RolloutEngine, SamplingSpec
from lit_grpo.risk.head import selective_error
from lit_grpo.risk.rule import RiskRule
from lit_grpo.rollout.trees import greedy_trees
from lit_grpo.tasks import MultiRoundTask, PromptRecord
from lit_grpo.tree import SegmentNode, depth_first


@dataclass(frozen=True)
class RuleOutcome:
    """Greedy episodes under the rule at one tau: per episode ``covered`` (it ended in a committed answer, not a
    forced defer), ``errors`` (covered and wrong) and ``returns``; per inferring decision point the head's
    ``decision_p_error`` and whether that answer was an ``decision_error``."""

    tau: float | None
    covered: torch.Tensor  # [B] bool
    errors: torch.Tensor  # [B] bool
    returns: torch.Tensor  # [B]
    decision_p_error: torch.Tensor  # [M]
    decision_error: torch.Tensor  # [M] bool

    @property
    def coverage(self) -> float:
        return float(self.covered.float().mean())

    @property
    def selective_error(self) -> float | None:
        return selective_error(self.errors, self.covered)


@runtime_checkable
class MeasuresRiskRule(Protocol):
    """A DataModule that measures the infer/defer rule on its held-out prompts (``RolloutDataModule``), as
    ``callbacks.RiskThreshold`` calibrates and draws the risk-coverage curve."""

    def val_records(self) -> list[PromptRecord]: ...

    def rule_outcome(self, module: SamplingPolicy, records: Sequence[PromptRecord], tau: float | None,
                     decision: str = "threshold", cvar_level: float = 0.0) -> RuleOutcome: ...


def rule_outcome(task: MultiRoundTask, engine: RolloutEngine, module: SamplingPolicy, records: Sequence[PromptRecord],
                 rounds: int, sampling: SamplingSpec, tau: float | None, decision: str = "threshold",
                 cvar_level: float = 0.0) -> RuleOutcome:
    """Fresh greedy episodes of the held-out ``records``, up to ``rounds`` rounds, under the rule at ``tau``
    (``decision`` and ``cvar_level`` as in ``RiskRule``; the calibration runs of
    docs/guide.md#risk-averse-inferdefer-the-risk-head); the risk head's success threshold defines an error."""
    risk = module.context_risk()
    if risk is None:
        raise ValueError("rule_outcome: the module has no risk head (SamplingPolicy.context_risk is None)")
    rule = RiskRule.for_task(risk, tau, task, module.tokenizer, decision, cvar_level)
    roots = greedy_trees(task, engine, module.tokenizer, records, rounds, sampling, rule)
    threshold = risk.success_threshold
    covered, errors, returns, decisions = [], [], [], []
    for root in roots:
        path = depth_first(root)[1:]
        last = path[-1]
        # covered: an answer the rule let through (a forced defer that went astray is not covered)
        committed = isinstance(last, SegmentNode) and bool(last.segment) and last.terminal and \
            (last.allowed is None or last.allowed == rule.answer_token_ids)
        covered.append(committed)
        errors.append(committed and last.reward < threshold)
        returns.append(sum(node.reward for node in path))
        if committed:  # the head's calibration is read at the decisions it let through
            decisions.append(last)
    p_error = risk.p_error([list(n.context) for n in decisions]) if decisions else torch.zeros(0)
    decision_error = torch.tensor([n.reward < threshold for n in decisions], dtype=torch.bool)
    return RuleOutcome(rule.tau, torch.tensor(covered), torch.tensor(errors), torch.tensor(returns), p_error,
                       decision_error)
