"""Correcting for a sampler whose probabilities differ from the trainer's (e.g. a half-precision engine)."""

from __future__ import annotations

import torch


def truncated_importance_weights(
    old_logp: torch.Tensor, sampler_logp: torch.Tensor, completion_mask: torch.Tensor, cap: float
) -> torch.Tensor:
    """Per-token weights min(pi_old / pi_sampler, cap): truncated importance sampling (TIS).

    The tokens were drawn from the sampler's distribution, while the clipped ratio is taken against the trainer's
    pi_old; weighting each token's surrogate by this ratio makes the gradient an estimate under pi_old, and the cap
    bounds its variance. Weights are 0 where the mask is False.

    Args:
        old_logp: ``[N, T]`` pi_old log-probs computed by the trainer.
        sampler_logp: ``[N, T]`` the engine's log-probs of the same tokens.
        completion_mask: ``[N, T]`` bool.
        cap: C > 0.

    Example: old_logp log 0.5, sampler log 0.25 -> ratio 2, cap 1.5 -> 1.5; old log 0.2, sampler log 0.4 -> 0.5.
    """
    if cap <= 0:
        raise ValueError(f"the truncated importance-sampling cap must be positive, got {cap}")
    weights = torch.exp(old_logp - sampler_logp).clamp(max=cap)  # [N, T]
    return torch.where(completion_mask.bool(), weights, torch.zeros_like(weights))
