"""The risk head on the policy's hidden states: its loss on the trees' observed returns of inferring, its input at
open contexts between rounds (vLLM returns no hidden states, so the trainer runs the forward), the detached head's
fit on its replay, and ``HeadOnContexts``, what the rollout side's infer/defer rule sees of it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from lit_grpo.buffers.positions import padded_positions
from lit_grpo.policy.logprobs import body_and_head, chunked_eval, last_hidden_states, logprobs_and_hidden
from lit_grpo.risk.draft import draft_confidences
from lit_grpo.risk.fit import RiskReplay, fit_head
from lit_grpo.risk.head import (
    INFER,
    RiskHead,
    confidence_features,
    error_probability,
    risk_loss,
)
from lit_grpo.risk.probes import ProbeLabels


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


def fit_on_replay(policy: Any, head: RiskHead, replay: RiskReplay, labels: ProbeLabels, pad_id: int,
                  steps: int, lr: float) -> dict[str, float]:
    """Add ``labels`` to the replay and fit the head on all of it at the current policy's hidden states."""
    replay.add(labels)
    rows = replay.labels()
    if not rows.contexts:
        return {"replay_rows": 0.0}
    # many rows share a context (a state probed again, both operands hidden): one forward per distinct context
    distinct = {context: index for index, context in enumerate(dict.fromkeys(rows.contexts))}
    features = context_features(policy, list(distinct), pad_id)  # [D, H + 2]
    features = features[torch.tensor([distinct[c] for c in rows.contexts])].to(head.atoms.device)  # [M, H + 2]
    loss = fit_head(head, features, rows.infer_returns.to(features.device), rows.defer_returns.to(features.device),
                    steps, lr)
    return {"replay_rows": float(len(rows.contexts)), "fit_loss": loss,
            "new_rows": float(len(labels.contexts))}


class HeadOnContexts:
    """The risk head read at open contexts through the policy's forward: a ``ContextRisk`` for the infer/defer rule
    (``lit_grpo.risk.rule.RiskRule``), which so never sees the model."""

    def __init__(self, policy: Any, head: RiskHead, pad_id: int) -> None:
        self.policy, self.head, self.pad_id = policy, head, pad_id

    @property
    def atoms(self) -> torch.Tensor:
        return self.head.atoms

    @property
    def success_threshold(self) -> float:
        return self.head.spec.success_threshold

    def p_error(self, contexts: Sequence[Sequence[int]]) -> torch.Tensor:
        return context_error_probability(self.policy, self.head, contexts, self.pad_id)  # [B]

    @torch.no_grad()
    def branch_probs(self, contexts: Sequence[Sequence[int]]) -> torch.Tensor:
        features = context_features(self.policy, contexts, self.pad_id).to(self.head.atoms.device)  # [B, H + 2]
        return self.head(features).softmax(-1)  # [B, 2, K]


@torch.no_grad()
def draft_features(policy: Any, contexts: Sequence[Sequence[int]], drafts: Sequence[Sequence[int]], pad_id: int,
                   batch_size: int = 256) -> torch.Tensor:
    """The draft-reading head's input (``risk/draft.py``): the hidden state at each draft's last token and the
    draft's confidences (``draft_confidences``) from the policy's log-probs of its own tokens ``-> [B, H + 3]``
    (float32, on the CPU). ``drafts`` are non-empty and exclude the stop token."""
    device = next(policy.parameters()).device

    def forward(rows: slice) -> torch.Tensor:
        part = [list(c) + list(d) for c, d in zip(contexts[rows], drafts[rows])]
        lengths = torch.tensor([len(r) for r in part])
        starts = torch.tensor([len(c) for c in contexts[rows]])
        # one padding column more than the longest row: every row has a column after its last token
        ids = torch.full((len(part), int(lengths.max()) + 1), pad_id, dtype=torch.long)
        for row, tokens in enumerate(part):
            ids[row, : len(tokens)] = torch.tensor(tokens)
        columns = torch.arange(ids.shape[1])
        mask = columns < lengths.unsqueeze(1)  # [B, L + 1]
        in_draft = mask & (columns >= starts.unsqueeze(1))  # [B, L + 1]
        logp, aligned = logprobs_and_hidden(policy, ids.to(device), mask.to(device), token_mask=in_draft.to(device))
        # aligned[:, t] is the state that predicts token t: at column `length`, the state at the draft's last token
        hidden = aligned[torch.arange(len(part), device=device), lengths.to(device)].float().cpu()  # [B, H]
        logp = logp.cpu()
        token_logprobs = [logp[row, int(starts[row]) : int(lengths[row])] for row in range(len(part))]
        return torch.cat([hidden, draft_confidences(token_logprobs)], dim=-1)

    return chunked_eval(policy, len(contexts), batch_size, forward)
