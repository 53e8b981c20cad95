"""DAPO's soft overlong punishment: a length-dependent reward term for completions near the budget."""

from __future__ import annotations

import torch


def overlong_penalty(lengths: torch.Tensor, max_new_tokens: int, cache: int) -> torch.Tensor:
    """0 up to ``max_new_tokens - cache`` tokens, then falling linearly to -1 at ``max_new_tokens``; -1 beyond.

    Args:
        lengths: ``[N]`` completion lengths in tokens.
        max_new_tokens: the budget L_max.
        cache: the soft zone L_cache (0 < cache <= max_new_tokens).

    Returns:
        ``[N]`` penalties to add to the rewards.

    Example: L_max 20, cache 5: lengths 15, 17, 20, 21 -> 0, -0.4, -1, -1.
    """
    if not 0 < cache <= max_new_tokens:
        raise ValueError(f"need 0 < cache <= max_new_tokens, got cache {cache}, max_new_tokens {max_new_tokens}")
    soft_start = max_new_tokens - cache
    lengths = lengths.to(torch.float32)
    penalty = (soft_start - lengths) / cache  # [N], negative inside the soft zone
    return penalty.clamp(min=-1.0, max=0.0)
