"""Per-token log-probs of given sequences under a causal LM."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class FirstTokenConstraint:
    """The first-token constraint the sampler applied to each row (the risk rule's forced defer), so the trainer
    scores the same renormalised distribution. ``decision_index [N]``: the column of each row's first completion
    token; ``allowed_ids [N, C]``: the ids allowed there, -1 padding; a row of only -1 was unconstrained."""

    decision_index: torch.Tensor  # [N] long
    allowed_ids: torch.Tensor  # [N, C] long

    def rows(self, start: int, end: int) -> FirstTokenConstraint:
        return FirstTokenConstraint(self.decision_index[start:end], self.allowed_ids[start:end])


def restrict_first_tokens(logits: torch.Tensor, constraint: FirstTokenConstraint) -> torch.Tensor:
    """``logits [N, L-1, V]`` (position t predicts token t+1) with every id outside a constrained row's allowed set
    at its decision position set to -inf, so log-softmax renormalises over the allowed ids, as the sampler did.

    Example: a row with decision_index 3 and allowed [7]: position 2 keeps only id 7, whose log-prob becomes 0.
    """
    constrained = (constraint.allowed_ids >= 0).any(dim=1)  # [N]
    if not constrained.any():
        return logits
    rows = constrained.nonzero().squeeze(1)  # [M]
    position = constraint.decision_index[rows] - 1  # [M]
    vocab = logits.shape[-1]
    allowed = constraint.allowed_ids[rows]  # [M, C]
    target = torch.where(allowed >= 0, allowed, vocab)  # [M, C]: padding goes to a spare column, dropped below
    keep = torch.zeros(len(rows), vocab + 1, dtype=torch.bool, device=logits.device)
    keep = keep.scatter(1, target, True)[:, :vocab]  # [M, V]
    restricted = logits[rows, position].masked_fill(~keep, float("-inf"))  # [M, V]
    logits = logits.clone()
    logits[rows, position] = restricted
    return logits


def gather_logprobs(logits: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
    """log softmax(logits)[token] without materialising the full log-softmax.  ``[N, T, V]``, ``[N, T]`` -> ``[N, T]``."""
    picked = logits.gather(-1, token_ids.unsqueeze(-1)).squeeze(-1)  # [N, T]
    return picked - torch.logsumexp(logits, dim=-1)


def sequence_logprobs(
    model: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    temperature: float = 1.0,
    constraint: FirstTokenConstraint | None = None,
) -> torch.Tensor:
    """Log-prob of every token given the tokens before it, from ``logits / temperature``.

    Args:
        model: a causal LM returning ``.logits`` ``[N, L, V]``.
        input_ids: ``[N, L]`` right-padded prompt + completion rows.
        attention_mask: ``[N, L]`` 1 on real tokens.
        temperature: the sampler's temperature, so the trainer scores the distribution that was sampled.
        constraint: the sampler's first-token constraints, if any were applied.

    Returns:
        ``[N, L]``; column 0 (no context) is 0, and so is every padded position.
    """
    mask = attention_mask.long()
    position_ids = (mask.cumsum(dim=1) - 1).clamp(min=0)  # [N, L]: every row starts at 0, as in generation
    logits = model(input_ids=input_ids, attention_mask=mask, position_ids=position_ids).logits  # [N, L, V]
    return logprobs_from_logits(logits, input_ids, attention_mask, temperature, constraint)


def logprobs_from_logits(
    logits: torch.Tensor,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    temperature: float,
    constraint: FirstTokenConstraint | None = None,
) -> torch.Tensor:
    """Per-token log-probs ``[N, L]`` from a forward's ``logits [N, L, V]``, aligned with ``input_ids``: column 0
    (no context) and padded positions are 0."""
    logits = logits[:, :-1].float() / temperature  # [N, L-1, V]: position t predicts token t+1
    if constraint is not None:
        logits = restrict_first_tokens(logits, constraint)
    logp = gather_logprobs(logits, input_ids[:, 1:])  # [N, L-1]
    logp = torch.cat([logp.new_zeros(logp.shape[0], 1), logp], dim=1)  # [N, L]
    return logp * attention_mask.to(logp.dtype)


@torch.no_grad()
def chunked_eval(model: Any, num_rows: int, batch_size: int, forward: Callable[[slice], torch.Tensor]) -> torch.Tensor:
    """``forward(rows)`` over consecutive slices of ``batch_size`` of ``num_rows`` rows, concatenated on dim 0: the
    no-grad passes (pi_old, pi_ref, values, risk) run in eval mode because the sampler ran without dropout, in
    chunks so that memory stays bounded; the model's training flag is restored even if a chunk fails."""
    was_training = model.training
    model.eval()
    try:
        return torch.cat([forward(slice(i, i + batch_size)) for i in range(0, num_rows, batch_size)], dim=0)
    finally:
        model.train(was_training)


def batched_sequence_logprobs(
    model: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    temperature: float,
    batch_size: int = 256,
    constraint: FirstTokenConstraint | None = None,
) -> torch.Tensor:
    """``sequence_logprobs`` in chunks, in eval mode (dropout off, as the sampler ran), without gradients: ``[N, L]``."""

    def forward(rows: slice) -> torch.Tensor:
        restriction = None if constraint is None else constraint.rows(rows.start, rows.stop)
        return sequence_logprobs(model, input_ids[rows], attention_mask[rows], temperature, restriction)

    return chunked_eval(model, input_ids.shape[0], batch_size, forward)


def sampler_agreement(
    logp: torch.Tensor, sampler_logp: torch.Tensor, completion_mask: torch.Tensor
) -> dict[str, torch.Tensor]:
    """max and mean |sampler - trainer| log-prob over counted tokens: ~0 in fp32 when the engine is in sync."""
    diff = (sampler_logp - logp).abs()[completion_mask]
    if diff.numel() == 0:
        return {}
    return {"logp_diff_max": diff.max(), "logp_diff_mean": diff.mean()}
