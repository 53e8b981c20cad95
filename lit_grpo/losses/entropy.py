"""Entropy control (docs/guide.md#the-math): training only on the highest-entropy tokens ("forking tokens", Wang et
al. 2025), and an entropy bonus whose coefficient can adapt to keep the policy's entropy near a target."""

from __future__ import annotations

import torch


def high_entropy_mask(entropies: torch.Tensor, completion_mask: torch.Tensor, top_quantile: float) -> torch.Tensor:
    """``[N, T]`` bool: the counted tokens whose entropy is at least the (1 - ``top_quantile``) quantile of the
    counted tokens' entropies (linear interpolation, as ``torch.quantile``), so about the top ``top_quantile``
    share of them; all False when no token counts.

    Example: entropies (0.1, 0.2, 0.3, 0.4) all counted, top_quantile 0.5: the 0.5 quantile is 0.25, so the
    tokens of 0.3 and 0.4.
    """
    mask = completion_mask.bool()
    counted = entropies.detach()[mask].float()
    if counted.numel() == 0:
        return torch.zeros_like(mask)
    threshold = torch.quantile(counted, 1.0 - top_quantile)
    return (entropies.detach() * mask >= threshold) & mask


def next_entropy_coef(coef: float, entropy: float, target: float, step: float, low: float, high: float) -> float:
    """The adaptive entropy coefficient after an optimizer step whose mean token entropy was ``entropy``: raised by
    ``step`` (to at most ``high``) when the entropy is at or below ``target``, else lowered by ``step`` (to at least
    ``low``).

    Example: coef 0.01, entropy 0.1, target 0.2, step 0.005: 0.015; with entropy 0.3: 0.005."""
    if entropy <= target:
        return min(coef + step, high)
    return max(coef - step, low)
