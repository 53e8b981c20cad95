"""Online DPO from groups: one best-versus-worst pair per group, and the DPO loss on it."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def best_worst_pairs(rewards: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per group, the index of the best and of the worst completion, and whether the pair exists.

    Args:
        rewards: ``[B, G]``.

    Returns:
        ``(chosen [B], rejected [B], valid [B] bool)``; a group whose best and worst tie gives no pair (valid
        False). Ties for best or worst take the first index.

    Example: [[0, 2, 1], [1, 1, 1]] -> chosen [1, 0], rejected [0, 0], valid [True, False].
    """
    chosen = rewards.argmax(dim=1)  # [B]
    rejected = rewards.argmin(dim=1)  # [B]
    valid = rewards.amax(dim=1) > rewards.amin(dim=1)  # [B]
    return chosen, rejected, valid


def dpo_loss(
    chosen_logp: torch.Tensor,
    rejected_logp: torch.Tensor,
    ref_chosen_logp: torch.Tensor,
    ref_rejected_logp: torch.Tensor,
    beta: float,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """-log sigmoid(beta * ((pi_c - ref_c) - (pi_r - ref_r))), averaged over pairs; each input is ``[P]``, a
    sequence's summed log-prob of its counted tokens. No pair gives 0.

    Returns ``(loss [], stats)`` with ``reward_margin`` (mean beta-scaled margin) and ``accuracy`` (share of pairs
    whose implicit reward ranks the chosen first), both detached.

    Example: margins (pi - ref) of 0.5 for chosen and -0.5 for rejected, beta 0.1: -log sigmoid(0.1) = 0.6443967.
    """
    if chosen_logp.numel() == 0:
        zero = chosen_logp.sum() * 0.0
        return zero, {"reward_margin": zero.detach(), "accuracy": zero.detach()}
    margin = beta * ((chosen_logp - ref_chosen_logp) - (rejected_logp - ref_rejected_logp))  # [P]
    loss = -F.logsigmoid(margin).mean()
    return loss, {"reward_margin": margin.mean().detach(), "accuracy": (margin > 0).float().mean().detach()}
