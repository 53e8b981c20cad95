"""The infer/defer rule measured on held-out prompts: fresh greedy episodes under the rule at one tau
(docs/guide.md#multi-round-tasks-and-tree-rollouts calibration runs and the risk-coverage curve)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from lit_grpo.buffers.protocols import SamplingPolicy
from lit_grpo.buffers.tree_layout import SegmentNode
from lit_grpo.risk.head import selective_error
from lit_grpo.risk.rule import RiskRule
from lit_grpo.rollout.trees import greedy_trees
from lit_grpo.tree import depth_first


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


def rule_outcome(module: SamplingPolicy, datamodule: Any, records: Sequence[Any], tau: float | None,
                 apply_rule: bool = True, success_threshold: float = 0.0, decision: str = "threshold",
                 cvar_level: float = 0.0) -> RuleOutcome:
    """Fresh greedy episodes of the held-out ``records`` with the rule at ``tau`` (the calibration runs of
    docs/guide.md#risk-averse-inferdefer-the-risk-head; ``decision``/``cvar_level`` as in ``RiskRule``);
    ``apply_rule=False`` plays the policy alone (no head needed; ``success_threshold`` then defines an error)."""
    task, tokenizer, risk = datamodule.task, module.tokenizer, module.context_risk()
    datamodule.sync_policy(module)
    rule = RiskRule.for_task(risk, tau, task, tokenizer, decision, cvar_level) if apply_rule else None
    sampling = datamodule.sampling_spec(module, greedy=True, seed=None)
    roots = greedy_trees(task, datamodule.engine, tokenizer, records, len(datamodule.branching), sampling, rule)
    threshold = risk.success_threshold if risk is not None else success_threshold
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
        if committed and risk is not None:  # the head's calibration is read at the decisions it let through
            decisions.append(last)
    p_error = risk.p_error([list(n.context) for n in decisions]) if decisions else torch.zeros(0)
    decision_error = torch.tensor([n.reward < threshold for n in decisions], dtype=torch.bool)
    return RuleOutcome(tau if apply_rule else None, torch.tensor(covered), torch.tensor(errors),
                       torch.tensor(returns), p_error, decision_error)
