"""Per-turn credit of chain rollouts whose environment rewards each turn (docs/guide.md#rewards-per-turn): one
advantage per turn of each episode of a prompt's group, from the turns' rewards.

``episode`` (the default, not computed here: ``group_advantages`` of each episode's return, the same advantage on
every turn) stays what it was. The two others:

- ``reward_to_go``: turn t's advantage is its reward-to-go R_i(t) = sum of episode i's rewards from turn t on, minus
  the leave-one-out mean of the other episodes' reward-to-go at the same turn index, an episode that already ended
  counting 0. The baseline of episode i uses only the other episodes, whose rewards do not depend on episode i's
  actions given the prompt, so it is unbiased also when the policy decides when to stop; counting ended episodes as
  0 keeps it from depending on which episodes are still running. At the first turn it is ``rloo`` of the returns.
- ``per_turn_index`` (MT-GRPO's, as verl issue #7244 describes it; kept to compare): each turn's reward centred (and
  with ``grpo`` divided by the std) over the episodes still running at that turn index, then summed from turn t on.
  Its baseline has as many terms as the episode has turns left, which the episode's own actions decide: biased
  whenever the policy ends episodes (tests/test_turn_credit.py measures it on an enumerated toy).
"""

from __future__ import annotations

from typing import Literal, get_args

import torch

from lit_grpo.losses.advantages import check_choice

TurnCredit = Literal["episode", "reward_to_go", "per_turn_index"]
TURN_CREDITS: tuple[str, ...] = get_args(TurnCredit)


def rewards_to_go(turn_rewards: torch.Tensor) -> torch.Tensor:
    """Each turn's reward-to-go: the sum of the rewards from that turn to the last.  ``[G, T]`` -> ``[G, T]``.

    Example: ``[[1., 2., 3.]]`` -> ``[[6., 5., 3.]]``."""
    return turn_rewards.flip(-1).cumsum(-1).flip(-1)


def turn_advantages(turn_rewards: torch.Tensor, running: torch.Tensor, credit: str = "reward_to_go",
                    normalise: bool = False, eps: float = 1e-6) -> torch.Tensor:
    """The advantage of every turn of a group of episodes of one prompt.

    Args:
        turn_rewards: ``[G, T]`` float, episode i's reward at turn t (its turn index, 0-based); 0 past its end.
        running: ``[G, T]`` bool, whether episode i has a turn t (each row True up to its length, then False).
        credit: ``reward_to_go`` (leave-one-out baseline over the group, an ended episode counting 0) or
            ``per_turn_index`` (each turn's reward centred over the episodes running at that index, summed to go).
        normalise: ``per_turn_index`` only: divide each centred reward by its index's population std (+ ``eps``),
            as GRPO divides; ``reward_to_go`` takes none (it is RLOO's per-turn form).
        eps: added to the std.

    Returns:
        ``[G, T]`` advantages, 0 where ``running`` is False. A column (turn index) whose values are all equal gets
        exactly 0 (with ``per_turn_index``: over its running episodes; one running episode is such a column), as
        ``group_advantages`` zeroes a flat group; a group of one gets 0.

    Example (``reward_to_go``): rewards ``[[1, 2], [3, 0], [0, 0]]``, running ``[[T, T], [T, F], [T, F]]``: reward-to-go
    ``[[3, 2], [3, 0], [0, 0]]``; turn 0: 3 - (3 + 0) / 2 = 1.5, 3 - 1.5 = 1.5, 0 - 3 = -3; turn 1: 2 - 0 = 2.
    """
    check_choice("turn credit", credit, TURN_CREDITS[1:])
    if turn_rewards.dim() != 2 or running.shape != turn_rewards.shape:
        raise ValueError(f"turn_rewards and running must be [G, T] alike, got {tuple(turn_rewards.shape)} and "
                         f"{tuple(running.shape)}")
    rewards = torch.where(running, turn_rewards.double(), 0.0)  # [G, T], ended turns count 0
    count = rewards.shape[0]
    if credit == "reward_to_go":
        to_go = rewards_to_go(rewards)  # [G, T]
        others = (to_go.sum(dim=0, keepdim=True) - to_go) / max(count - 1, 1)  # [G, T] leave-one-out means
        flat = to_go.amax(dim=0, keepdim=True) == to_go.amin(dim=0, keepdim=True)  # [1, T]
        advantages = torch.where(flat | (count < 2), 0.0, to_go - others)
    else:
        alive = running.double()  # [G, T]
        size = alive.sum(dim=0, keepdim=True)  # [1, T] episodes running at each index
        mean = rewards.sum(dim=0, keepdim=True) / size.clamp(min=1)  # [1, T]
        centred = torch.where(running, rewards - mean, 0.0)  # [G, T]
        if normalise:
            std = ((centred ** 2).sum(dim=0, keepdim=True) / size.clamp(min=1)).sqrt()  # [1, T] population
            centred = centred / (std + eps)
        high = torch.where(running, rewards, -torch.inf).amax(dim=0, keepdim=True)  # [1, T]
        low = torch.where(running, rewards, torch.inf).amin(dim=0, keepdim=True)
        centred = torch.where(high == low, 0.0, centred)  # a flat index (one running episode included): 0
        advantages = rewards_to_go(centred)
    return torch.where(running, advantages, 0.0).to(turn_rewards.dtype)
