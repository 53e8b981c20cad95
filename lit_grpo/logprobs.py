"""Per-token log-probs of given sequences under a causal LM."""

from __future__ import annotations

from typing import Any

import torch


def gather_logprobs(logits: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
    """log softmax(logits)[token] without materialising the full log-softmax.  ``[N, T, V]``, ``[N, T]`` -> ``[N, T]``."""
    picked = logits.gather(-1, token_ids.unsqueeze(-1)).squeeze(-1)  # [N, T]
    return picked - torch.logsumexp(logits, dim=-1)


def sequence_logprobs(
    model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, temperature: float = 1.0
) -> torch.Tensor:
    """Log-prob of every token given the tokens before it, from ``logits / temperature``.

    Args:
        model: a causal LM returning ``.logits`` ``[N, L, V]``.
        input_ids: ``[N, L]`` right-padded prompt + completion rows.
        attention_mask: ``[N, L]`` 1 on real tokens.
        temperature: the sampler's temperature, so the trainer scores the distribution that was sampled.

    Returns:
        ``[N, L]``; column 0 (no context) is 0, and so is every padded position.
    """
    mask = attention_mask.long()
    position_ids = (mask.cumsum(dim=1) - 1).clamp(min=0)  # [N, L]: every row starts at 0, as in generation
    logits = model(input_ids=input_ids, attention_mask=mask, position_ids=position_ids).logits  # [N, L, V]
    logits = logits[:, :-1].float() / temperature  # [N, L-1]: position t predicts token t+1
    logp = gather_logprobs(logits, input_ids[:, 1:])  # [N, L-1]
    logp = torch.cat([logp.new_zeros(logp.shape[0], 1), logp], dim=1)  # [N, L]
    return logp * attention_mask.to(logp.dtype)


@torch.no_grad()
def batched_sequence_logprobs(
    model: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    temperature: float,
    batch_size: int = 256,
) -> torch.Tensor:
    """``sequence_logprobs`` in chunks, in eval mode (dropout off, as the sampler ran), without gradients."""
    was_training = model.training
    model.eval()
    try:
        chunks = [
            sequence_logprobs(model, input_ids[i : i + batch_size], attention_mask[i : i + batch_size], temperature)
            for i in range(0, input_ids.shape[0], batch_size)
        ]
    finally:
        model.train(was_training)
    return torch.cat(chunks, dim=0)  # [N, L]
