"""Where a row's tokens sit: position numbering of padded rows and the sampler's first-token constraints, shared by
the engines (prefill), the policy (log-probs) and the buffer, which all sit above ``buffers/``."""

from __future__ import annotations

from dataclasses import dataclass

import torch


def padded_positions(attention_mask: torch.Tensor) -> torch.Tensor:
    """Position ids ``[N, L]`` of padded rows (right-padded in training, left-padded in the hf engine's prefill):
    every row's real tokens count from 0; padding gets 0 or its predecessor's and is masked out. The one numbering:
    the hf engine (``engines/hf_decode.py``, above ``buffers/``) and the trainer both take it from here, so sampler
    and trainer number alike."""
    return (attention_mask.long().cumsum(dim=1) - 1).clamp(min=0)


@dataclass(frozen=True)
class FirstTokenConstraint:
    """The first-token constraint the sampler applied to each row (the risk rule's forced defer), so the trainer
    scores the same renormalised distribution. ``decision_index [N]``: the column of each row's first completion
    token; ``allowed_ids [N, C]``: the ids allowed there, -1 padding; a row of only -1 was unconstrained."""

    decision_index: torch.Tensor  # [N] long
    allowed_ids: torch.Tensor  # [N, C] long

    def rows(self, start: int, end: int) -> FirstTokenConstraint:
        return FirstTokenConstraint(self.decision_index[start:end], self.allowed_ids[start:end])

    def at(self, rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
        """The allowed ids ``[M, C]`` of the tokens at ``(rows [M], cols [M])``: the row's set at its decision
        column, all -1 (unconstrained) elsewhere."""
        decision = self.decision_index.to(rows.device)[rows]  # [M]
        allowed = self.allowed_ids.to(rows.device)[rows]  # [M, C]
        return torch.where((cols == decision)[:, None], allowed, -1)


def batch_constraint(batch: dict[str, torch.Tensor]) -> FirstTokenConstraint | None:
    """The sampler's first-token restrictions of a minibatch, if it has rows that had one."""
    allowed = batch.get("first_token_allowed")
    if allowed is None or not (allowed >= 0).any():
        return None
    return FirstTokenConstraint(batch["decision_index"], allowed)
