"""The advantages of one epoch's rollout buffer (docs/guide.md#layout): group, batch-std, tree-relative, GAE (PPO) or
the online-DPO pairs. Statistics that span the whole batch are pooled over every rank
(``distributed.global_moments``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from lit_grpo.buffers.buffer import RolloutBuffer, buffer_sequences
from lit_grpo.errors import InputError
from lit_grpo.tree import chain_rows, loss_rows, tree_row_advantages
from lit_grpo.losses import (
    batch_std_advantages,
    episode_gae,
    gae,
    group_advantages,
    kl_divergence,
    kl_shaped_rewards,
    sampler_importance_ratio,
)
from lit_grpo.losses.advantages import gdpo_advantages, gdpo_group_sums
from lit_grpo.policy.knob_groups import group
from lit_grpo.policy.objective import Objective
from lit_grpo.policy.online_dpo import assign_pairs
from lit_grpo.run.distributed import global_moments


@dataclass(frozen=True)
class AdvantageKnobs:
    """The module's knobs that shape advantages beyond its ``Objective`` (see ``PolicyModule``)."""

    std_scope: str = "group"
    tree_value_mode: str = "mean"
    tree_std_scope: str = "tree"
    gamma: float = 1.0
    gae_lambda: float = 0.95
    value_head: bool = False
    tree_flat_groups: str = "count"
    turn_credit: str = "episode"

    @classmethod
    def of(cls, hparams: Any, value_head: bool) -> AdvantageKnobs:
        """The knobs as ``PolicyModule``'s hyper-parameters (its regrouped arguments) set them."""
        tree, value = group(hparams, "tree"), group(hparams, "value")
        return cls(hparams["std_scope"], tree.value_mode, tree.std_scope, value.gamma, value.gae_lambda, value_head,
                   tree.flat_groups, hparams["turn_credit"])


def assign_advantages(buffer: RolloutBuffer, objective: Objective, knobs: AdvantageKnobs,
                      ranks: tuple[Any, int] = (None, 1)) -> None:
    """Set ``buffer.advantages`` (and ``returns`` for PPO): of the trees, by GAE with a value head, as DPO pairs, or
    group advantages of the rewards (less beta * KL when ``kl.applied_to='reward'``). ``ranks``: (strategy, world
    size)."""
    if buffer.trees is not None:
        if knobs.value_head:  # chains only (combinations.py): GAE along each episode's rounds
            buffer.advantages, buffer.returns = gae_advantages(buffer, objective, knobs, ranks,
                                                               chains=chain_rows(buffer.trees))
            return
        buffer.advantages = tree_row_advantages(buffer, objective.advantage_mode, knobs.tree_value_mode,
                                                knobs.tree_std_scope, knobs.turn_credit)
        if buffer.tree_mode == "tree":  # the rows of flat sibling groups out of the loss, with drop
            buffer.loss_rows = loss_rows(buffer.trees, knobs.tree_flat_groups)
        return
    if knobs.value_head:
        buffer.advantages, buffer.returns = gae_advantages(buffer, objective, knobs, ranks)
        return
    if objective.variant == "dpo":
        assign_pairs(buffer)
        return
    rewards = buffer.rewards
    if objective.kl_in == "reward" and objective.kl_coef > 0:
        k1 = kl_divergence(buffer.old_logp, buffer.ref_logp, "k1") * buffer.completion_mask  # [N, L]
        rewards = rewards - objective.kl_coef * k1.sum(dim=1)
    grouped = rewards.view(-1, buffer.group_size)  # [B, G]
    if objective.advantage_mode == "gdpo":
        advantages = gdpo(buffer, ranks)
    elif knobs.std_scope == "batch" and objective.advantage_mode == "grpo":
        advantages = batch_std_advantages(grouped, std=global_moments(rewards, *ranks)[2])
    else:
        advantages = group_advantages(grouped, objective.advantage_mode)
    buffer.advantages = advantages.flatten()  # [N]
    correction = objective.sampler_correction
    if correction is not None and buffer.sampler_logp is None:
        raise InputError("model.sampler_correction: the engine reported no log-probs of the tokens it drew, so there "
                         "is no pi_sampler to correct for; use an engine that reports them (every shipped one does) "
                         "or leave sampler_correction unset")
    if correction is not None:
        buffer.sampler_ratio = sampler_importance_ratio(buffer.old_logp, buffer.sampler_logp, buffer.completion_mask,
                                                        correction.mode, correction.clip_min, correction.clip_max,
                                                        buffer_sequences(buffer))


def gdpo(buffer: RolloutBuffer, ranks: tuple[Any, int]) -> torch.Tensor:
    """GDPO's advantages ``[B, G]``: each of the task's rewards (``reward_parts``, weighted by ``reward_weights``;
    the reward itself when the task names no parts) normalised in its group, summed, then normalised over every
    rank's completions with the sample std. A completion whose scoring failed (``reward_failed``: a reward raised, or
    the sum left its range) carries no signal, as one no reward applied to: advantage 0, out of the batch's moments."""
    names = list(buffer.reward_parts)
    if names:
        parts = torch.stack([buffer.reward_parts[name] for name in names], dim=-1).double()  # [N, K]
        weights = torch.tensor([buffer.reward_weights.get(name, 1.0) for name in names], dtype=torch.float64)
    else:
        parts, weights = buffer.rewards.double()[:, None].clone(), torch.ones(1, dtype=torch.float64)
    if buffer.reward_failed is not None:
        parts[buffer.reward_failed] = float("nan")
    sums = gdpo_group_sums(parts.view(-1, buffer.group_size, parts.shape[-1]), weights)  # [B, G]
    scored = sums[~sums.isnan()]
    count, mean, std = global_moments(scored, *ranks)
    sample_std = std * (count / (count - 1)) ** 0.5 if count > 1 else torch.full_like(std, float("nan"))
    return gdpo_advantages(sums, mean, sample_std).to(buffer.rewards.dtype)


def gae_advantages(buffer: RolloutBuffer, objective: Objective, knobs: AdvantageKnobs, ranks: tuple[Any, int] = (None, 1),
                   chains: tuple[torch.Tensor, torch.Tensor] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO: per-token rewards (the task reward on the last token, less beta * k1 with ``kl.applied_to='reward'``),
    GAE against the old values, advantages whitened over every rank's counted tokens.  -> ``([N, L], [N, L])``.

    ``chains``: ``(episode [N], rewards [N])`` of chain rollouts (``chain_rows``): each row is one round's segment
    with its own reward, and GAE runs along each episode's rows (``episode_gae``)."""
    mask = buffer.completion_mask
    shaped = objective.kl_in == "reward" and objective.kl_coef > 0
    k1 = kl_divergence(buffer.old_logp, buffer.ref_logp, "k1") if shaped else torch.zeros_like(buffer.old_logp)
    rewards = buffer.rewards if chains is None else chains[1]
    token_rewards = kl_shaped_rewards(rewards, k1, mask, objective.kl_coef if shaped else 0.0)
    if chains is None:
        advantages, returns = gae(token_rewards, buffer.values, mask, knobs.gamma, knobs.gae_lambda)
    else:
        advantages, returns = episode_gae(token_rewards, buffer.values, mask, chains[0], knobs.gamma, knobs.gae_lambda)
    count, mean, std = global_moments(advantages[mask], *ranks)
    if count > 1:
        advantages = torch.where(mask, (advantages - mean) / (std + 1e-6), 0.0)
    return advantages, returns
