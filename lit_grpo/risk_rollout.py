"""The risk head in the loop: its loss on the trees' observed returns of inferring, and the infer/defer rule
applied to open contexts between rounds (vLLM returns no hidden states, so the trainer runs the head's forward)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from lit_grpo.logprobs import (
    FirstTokenConstraint,
    body_and_head,
    chunked_eval,
    last_hidden_states,
    padded_positions,
)
from lit_grpo.risk import (
    INFER,
    RiskHead,
    confidence_features,
    error_probability,
    first_token_constraints,
    forced_defer,
    risk_loss,
    selective_error,
    value_rule_defers,
)
from lit_grpo.tree import depth_first
from lit_grpo.tree_rollout import SegmentNode, greedy_trees


def batch_constraint(batch: dict[str, torch.Tensor]) -> FirstTokenConstraint | None:
    """The sampler's first-token restrictions of a minibatch, if it has rows that had one."""
    allowed = batch.get("first_token_allowed")
    if allowed is None or not (allowed >= 0).any():
        return None
    return FirstTokenConstraint(batch["decision_index"], allowed)


def risk_head_loss(
    head: RiskHead, hidden: torch.Tensor, batch: dict[str, torch.Tensor], output_head: Any
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Cross-entropy of the head at each inferring row's decision point against the return it observed.

    ``hidden [N, L, H]`` is aligned with the tokens (``hidden[:, t]`` predicts token t), so the state at a row's
    decision point, its last context token, is ``hidden[row, decision_index]``. Rows that deferred carry no target.
    """
    rows = batch["inferred"].nonzero().squeeze(1)  # [M]
    decision_hidden = hidden[rows, batch["decision_index"][rows]]  # [M, H]
    logits = head(decision_features(decision_hidden, output_head))[:, INFER]  # [M, K]
    loss = risk_loss(logits, batch["rewards"][rows], head.atoms)
    p_error = error_probability(logits.detach().softmax(-1), head.atoms, head.spec.success_threshold)  # [M]
    observed = (batch["rewards"][rows] < head.spec.success_threshold).float()  # [M]
    stats = {"risk_loss": loss.detach(), "risk_rows": loss.new_tensor(float(len(rows)))}
    if len(rows):
        stats.update(risk_p_error=p_error.mean(), risk_observed_error=observed.mean())
    return loss, stats


@torch.no_grad()
def context_hidden_states(policy: Any, contexts: Sequence[Sequence[int]], pad_id: int,
                          batch_size: int = 256) -> torch.Tensor:
    """The policy's last-layer hidden state at the last token of each context ``[B, H]`` (float32, on the CPU):
    right-padded rows with positions from 0 (as in training), in eval mode, without the output head."""
    device = next(policy.parameters()).device

    def forward(rows: slice) -> torch.Tensor:
        part = contexts[rows]
        lengths = torch.tensor([len(c) for c in part])
        ids = torch.full((len(part), int(lengths.max())), pad_id, dtype=torch.long)
        for row, context in enumerate(part):
            ids[row, : len(context)] = torch.tensor(list(context))
        mask = (torch.arange(ids.shape[1]) < lengths.unsqueeze(1)).long().to(device)  # [B, L]
        hidden = last_hidden_states(policy, ids.to(device), mask, padded_positions(mask))  # [B, L, H]
        return hidden[torch.arange(len(part), device=device), (lengths - 1).to(device)].float().cpu()  # [B, H]

    return chunked_eval(policy, len(contexts), batch_size, forward)


def decision_features(hidden: torch.Tensor, output_head: Any) -> torch.Tensor:
    """The risk head's input at decision points: the hidden state ``[B, H]`` and the policy's confidence in its
    next token (one output-head row per decision, never per position) ``-> [B, H + 2]``."""
    logits = output_head(hidden.to(output_head.weight.dtype))  # [B, V]
    return torch.cat([hidden.float(), confidence_features(logits)], dim=-1)


@torch.no_grad()
def context_features(policy: Any, contexts: Sequence[Sequence[int]], pad_id: int,
                     batch_size: int = 256) -> torch.Tensor:
    """``decision_features`` at the last token of each context ``[B, H + 2]`` (float32, on the CPU)."""
    device = next(policy.parameters()).device
    hidden = context_hidden_states(policy, contexts, pad_id, batch_size)  # [B, H]
    return decision_features(hidden.to(device), body_and_head(policy)[1]).cpu()


def context_error_probability(policy: Any, head: RiskHead, contexts: Sequence[Sequence[int]], pad_id: int,
                              batch_size: int = 256) -> torch.Tensor:
    """P(error of inferring now) at each open context ``[B]``."""
    features = context_features(policy, contexts, pad_id, batch_size)  # [B, H + 2]
    with torch.no_grad():
        return head.error_probability(features.to(head.atoms.device)).cpu()


class RiskRule:
    """The decision rule for ``expand_trees`` at each round's open contexts.

    ``threshold`` (the default): force a defer (allow only ``defer_token_ids`` as the first token) wherever
    P(error) > tau; ``tau=None`` forces a defer everywhere. ``value``: at every context, force a defer where the
    CVaR at ``cvar_level`` of the return of inferring is below that of deferring, and force an answer (only
    ``answer_token_ids`` first) elsewhere; tau plays no part.
    """

    def __init__(self, policy: Any, head: RiskHead, tau: float | None, defer_token_ids: Sequence[int], pad_id: int,
                 decision: str = "threshold", cvar_level: float = 0.0,
                 answer_token_ids: Sequence[int] = ()) -> None:
        self.policy, self.head, self.tau = policy, head, tau
        self.defer_token_ids, self.pad_id = tuple(defer_token_ids), pad_id
        self.decision, self.cvar_level, self.answer_token_ids = decision, cvar_level, tuple(answer_token_ids)

    def __call__(self, contexts: list[list[int]], depth: int) -> tuple[tuple[int, ...] | None, ...]:
        if self.decision == "threshold":
            p_error = context_error_probability(self.policy, self.head, contexts, self.pad_id)  # [B]
            return first_token_constraints(forced_defer(p_error, self.tau), self.defer_token_ids)
        with torch.no_grad():
            features = context_features(self.policy, contexts, self.pad_id).to(self.head.atoms.device)  # [B, H+2]
            defers = value_rule_defers(self.head(features).softmax(-1), self.head.atoms, self.cvar_level).cpu()
        return tuple(self.defer_token_ids if flag else self.answer_token_ids for flag in defers.tolist())


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


def rule_outcome(module: Any, datamodule: Any, records: Sequence[Any], tau: float | None,
                 apply_rule: bool = True, success_threshold: float = 0.0, decision: str = "threshold",
                 cvar_level: float = 0.0) -> RuleOutcome:
    """Fresh greedy episodes of the held-out ``records`` with the rule at ``tau`` (design §6's calibration runs;
    ``decision``/``cvar_level`` as in ``RiskRule``); ``apply_rule=False`` plays the policy alone (no head needed;
    ``success_threshold`` then defines an error)."""
    task, tokenizer, head = datamodule.task, module.tokenizer, module.risk_head
    datamodule.sync_policy(module)
    rule = RiskRule(module.policy, head, tau, task.defer_token_ids(tokenizer), tokenizer.pad_token_id, decision,
                    cvar_level, task.answer_token_ids(tokenizer) if decision == "value" else ()) if apply_rule else None
    sampling = datamodule.sampling_spec(module, greedy=True, seed=None)
    roots = greedy_trees(task, datamodule.engine, tokenizer, records, len(datamodule.branching), sampling, rule)
    threshold = head.spec.success_threshold if head is not None else success_threshold
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
        if committed and head is not None:  # the head's calibration is read at the decisions it let through
            decisions.append(last)
    p_error = context_error_probability(module.policy, head, [list(n.context) for n in decisions],
                                        tokenizer.pad_token_id) if decisions else torch.zeros(0)
    decision_error = torch.tensor([n.reward < threshold for n in decisions], dtype=torch.bool)
    return RuleOutcome(tau if apply_rule else None, torch.tensor(covered), torch.tensor(errors),
                       torch.tensor(returns), p_error, decision_error)
