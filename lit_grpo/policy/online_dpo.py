"""Online DPO from grouped rollouts: each group's best and worst completion form a preference pair."""

from __future__ import annotations

import torch

from lit_grpo.buffers.buffer import RolloutBuffer
from lit_grpo.losses import best_worst_pairs, dpo_loss


def assign_pairs(buffer: RolloutBuffer) -> None:
    """Mark each group's best row ``pair_role`` +1 and worst -1 (0 elsewhere, and in tied groups), with the group
    index as ``pair_id`` (-1 outside a pair). Minibatches hold whole groups, so a pair is never split."""
    grouped = buffer.rewards.view(-1, buffer.group_size)  # [B, G]
    chosen, rejected, valid = best_worst_pairs(grouped)
    role = torch.zeros(grouped.shape, dtype=torch.long)  # [B, G]
    groups = torch.arange(grouped.shape[0])[valid]
    role[groups, chosen[valid]] = 1
    role[groups, rejected[valid]] = -1
    pair_id = torch.where(role != 0, torch.arange(grouped.shape[0])[:, None].expand_as(role), -1)
    buffer.pair_role, buffer.pair_id = role.flatten(), pair_id.flatten()
    buffer.advantages = role.flatten().float()  # +1 / -1 / 0: what the table of samples shows


def online_dpo_loss(
    logp: torch.Tensor,
    ref_logp: torch.Tensor,
    completion_mask: torch.Tensor,
    pair_role: torch.Tensor,
    pair_id: torch.Tensor,
    beta: float,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """DPO on the pairs of a minibatch; ``logp``/``ref_logp``/``completion_mask`` ``[N, T]``, roles and ids ``[N]``.

    Each sequence's log-prob is the sum over its counted tokens; chosen and rejected rows are matched by pair id.
    """
    mask = completion_mask.to(logp.dtype)
    seq_logp, seq_ref = (logp * mask).sum(dim=1), (ref_logp * mask).sum(dim=1)  # [N]
    chosen = torch.nonzero(pair_role == 1).flatten()
    rejected = torch.nonzero(pair_role == -1).flatten()
    chosen = chosen[torch.argsort(pair_id[chosen])]
    rejected = rejected[torch.argsort(pair_id[rejected])]
    return dpo_loss(seq_logp[chosen], seq_logp[rejected], seq_ref[chosen], seq_ref[rejected], beta)
