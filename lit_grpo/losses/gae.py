"""Per-token rewards with the KL folded in, and generalised advantage estimation (docs/guide.md#the-math, PPO row)."""

from __future__ import annotations

import torch


def kl_shaped_rewards(
    sequence_rewards: torch.Tensor, k1: torch.Tensor, completion_mask: torch.Tensor, kl_coef: float
) -> torch.Tensor:
    """Per-token rewards r_t = -beta * k1_t, plus the sequence's reward on its last counted token.

    Args:
        sequence_rewards: ``[N]`` task rewards.
        k1: ``[N, T]`` per-token k1 = logp - ref_logp of the sampled tokens.
        completion_mask: ``[N, T]`` bool.
        kl_coef: beta.

    Returns:
        ``[N, T]``, 0 where the mask is False (a row with no counted token gets nothing, its reward included).

    Example: reward 2, k1 [0.03, 0.02, 0.04, 0.01], beta 1 -> [-0.03, -0.02, -0.04, 1.99].
    """
    mask = completion_mask.bool()
    positions = torch.arange(mask.shape[1], device=mask.device).expand_as(mask)  # [N, T]
    last = torch.where(mask, positions, torch.full_like(positions, -1)).amax(dim=1)  # [N], -1 for empty rows
    is_last = mask & (positions == last[:, None])  # [N, T]
    shaped = -kl_coef * k1 + is_last.to(k1.dtype) * sequence_rewards[:, None]
    return torch.where(mask, shaped, torch.zeros_like(shaped))


def gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    completion_mask: torch.Tensor,
    gamma: float = 1.0,
    lam: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimates and returns over the counted tokens of each row.

    delta_t = r_t + gamma * V_next - V_t, A_t = delta_t + gamma * lam * A_next, G_t = A_t + V_t, where "next" is the
    row's next counted token (tokens the mask excludes, such as environment tokens, are skipped) and V after the
    last counted token is 0. No whitening here.

    Args:
        rewards: ``[N, T]`` per-token rewards.
        values: ``[N, T]`` value estimates aligned with the tokens.
        completion_mask: ``[N, T]`` bool.
        gamma: discount.
        lam: GAE lambda.

    Returns:
        ``(advantages [N, T], returns [N, T])``, both 0 where the mask is False.

    Example: rewards [0, 0, 1], V [0.5, 0.6, 0.7], gamma 0.9, lam 0.8 -> A [0.21712, 0.246, 0.3],
    returns [0.71712, 0.846, 1.0].
    """
    mask = completion_mask.bool()
    advantages = torch.zeros_like(rewards)  # [N, T]
    next_value = rewards.new_zeros(rewards.shape[0])  # [N]
    next_advantage = rewards.new_zeros(rewards.shape[0])  # [N]
    for t in reversed(range(rewards.shape[1])):  # vectorised over rows; the recursion runs along time
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        advantage = delta + gamma * lam * next_advantage
        counted = mask[:, t]
        advantages[:, t] = torch.where(counted, advantage, torch.zeros_like(advantage))
        next_value = torch.where(counted, values[:, t], next_value)
        next_advantage = torch.where(counted, advantage, next_advantage)
    returns = torch.where(mask, advantages + values, torch.zeros_like(values))
    return advantages, returns


def episode_gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    completion_mask: torch.Tensor,
    episode: torch.Tensor,
    gamma: float = 1.0,
    lam: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``gae`` over episodes laid out as several rows (a multi-round chain: one row per round's segment).

    The counted tokens of the rows sharing an ``episode`` id, taken row by row in row order, are one trajectory:
    the value after a row's last counted token is the next row's first counted token's, and only the episode's
    last row ends with V = 0. Rows of one episode need not be adjacent.

    Args:
        rewards, values, completion_mask: ``[N, T]`` as for ``gae``.
        episode: ``[N]`` integer episode id of each row.
        gamma, lam: as for ``gae``.

    Returns:
        ``(advantages [N, T], returns [N, T])``, 0 where the mask is False.

    Example, gamma 0.9, lam 0.5: rows 0 and 1 of one episode with counted rewards [0, -0.1] and [0, 1] and values
    [0.5, 0.4] and [0.6, 0.7] run as one trajectory: A = [-0.0885875, 0.11425] and [0.165, 0.3].
    """
    mask = completion_mask.bool()
    rows, cols = mask.nonzero(as_tuple=True)  # counted tokens, row-major: each row's in time order
    _, rank = torch.unique(episode[rows], return_inverse=True)  # [K] each token's episode, 0..E-1
    order = torch.argsort(rank, stable=True)  # tokens grouped by episode, row order kept inside each
    rows, cols, rank = rows[order], cols[order], rank[order]
    counts = torch.bincount(rank)  # [E] counted tokens per episode
    starts = torch.cumsum(counts, 0) - counts  # [E]
    position = torch.arange(rank.numel(), device=rank.device) - starts[rank]  # [K] time step inside the episode
    shape = (counts.numel(), int(counts.max()) if counts.numel() else 0)
    flat_rewards = rewards.new_zeros(shape)  # [E, T_episode]
    flat_values = values.new_zeros(shape)
    flat_mask = torch.zeros(shape, dtype=torch.bool, device=mask.device)
    flat_rewards[rank, position] = rewards[rows, cols]
    flat_values[rank, position] = values[rows, cols]
    flat_mask[rank, position] = True
    flat_advantages, flat_returns = gae(flat_rewards, flat_values, flat_mask, gamma, lam)
    advantages, returns = torch.zeros_like(rewards), torch.zeros_like(values)
    advantages[rows, cols] = flat_advantages[rank, position]
    returns[rows, cols] = flat_returns[rank, position]
    return advantages, returns
