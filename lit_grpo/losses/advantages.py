"""Group-relative advantages (docs/guide.md#the-math): one scalar per completion from the rewards of its group."""

from __future__ import annotations

from typing import Literal, get_args

import torch

AdvantageMode = Literal["raw", "centered", "grpo", "drgrpo", "rloo", "max"]  # gdpo: gdpo_group_sums
ADVANTAGE_MODES: tuple[str, ...] = get_args(AdvantageMode)


def check_choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    """Raise a ``ValueError`` that names every valid choice when ``value`` is not one of them."""
    if value not in choices:
        raise ValueError(f"unknown {name} {value!r}; valid choices: {', '.join(choices)}")


def group_advantages(rewards: torch.Tensor, mode: str = "grpo", eps: float = 1e-6) -> torch.Tensor:
    """Advantages of ``G`` completions per prompt, relative to their own group.

    Args:
        rewards: ``[B, G]`` scalar rewards, row ``b`` holding the group of prompt ``b``.
        mode: ``raw`` r_i; ``centered`` and ``drgrpo`` r_i - mean(r); ``grpo`` (r_i - mean(r)) / (std(r) + eps)
            with the population std (divide by G); ``rloo`` r_i - mean of the other G - 1 rewards; ``max``
            r_i - mean(r) for the group's best completions (ties included) and 0 for the rest.
        eps: added to the std in ``grpo`` mode.

    Returns:
        ``[B, G]`` advantages. A group whose rewards are all equal (G = 1 included) gets exactly 0 in every mode
        but ``raw``: in float32 the formula alone would turn rounding noise into advantages of order 0.05.

    Example: ``group_advantages(torch.tensor([[0., 1., 2.]]))`` is ``[[-1.2247, 0.0, 1.2247]]`` (std 0.8165).
    """
    check_choice("advantage mode", mode, ADVANTAGE_MODES)
    if rewards.dim() != 2:
        raise ValueError(f"rewards must be [B, G], got shape {tuple(rewards.shape)}")
    if mode == "raw":
        return rewards.clone()
    group_size = rewards.shape[1]
    mean = rewards.mean(dim=1, keepdim=True)  # [B, 1]
    centered = rewards - mean  # [B, G]
    if mode == "grpo":
        std = rewards.std(dim=1, correction=0, keepdim=True)  # [B, 1]
        advantages = centered / (std + eps)
    elif mode == "rloo":
        # r_i - (sum - r_i) / (G - 1) = G / (G - 1) * (r_i - mean); G = 1 is a flat group, zeroed below.
        advantages = centered * (group_size / max(group_size - 1, 1))
    elif mode == "max":
        best = rewards == rewards.max(dim=1, keepdim=True).values  # [B, G]
        advantages = torch.where(best, centered, torch.zeros_like(centered))
    else:  # centered, drgrpo
        advantages = centered
    return zero_flat_groups(advantages, rewards)


def zero_flat_groups(advantages: torch.Tensor, rewards: torch.Tensor) -> torch.Tensor:
    """Set exactly 0 on every group (row) whose rewards have max == min.  ``[B, G]`` -> ``[B, G]``."""
    flat = rewards.amax(dim=1, keepdim=True) == rewards.amin(dim=1, keepdim=True)  # [B, 1]
    return torch.where(flat, torch.zeros_like(advantages), advantages)


def batch_std_advantages(rewards: torch.Tensor, eps: float = 1e-6, std: torch.Tensor | None = None) -> torch.Tensor:
    """GRPO advantages with the population std taken over the whole batch instead of each group.

    ``(r_i - mean(group)) / (std(all rewards in the batch) + eps)``, ``[B, G]`` -> ``[B, G]``; flat groups stay
    exactly 0. Less noisy than the per-group std on small groups and does not up-weight near-flat groups. ``std``:
    the batch's std when ``rewards`` is only this rank's share of it.
    """
    centered = group_advantages(rewards, mode="centered")  # [B, G], flat groups already 0
    return centered / ((rewards.std(correction=0) if std is None else std) + eps)


GDPO_EPS = 1e-4  # GDPO's (and TRL's) epsilon under each std


def nan_std(values: torch.Tensor, dim: int | None = None, keepdim: bool = False) -> torch.Tensor:
    """The sample std (Bessel's n - 1) over the values that are not NaN; NaN where fewer than two are."""
    dims = tuple(range(values.dim())) if dim is None else dim
    mean = torch.nanmean(values, dim=dims, keepdim=True)
    count = (~values.isnan()).sum(dim=dims, keepdim=True)
    variance = torch.nanmean((values - mean) ** 2, dim=dims, keepdim=True) * count / (count - 1)
    std = torch.where(count > 1, variance, torch.full_like(variance, float("nan"))).sqrt()
    return std if keepdim else std.squeeze(dims)


def gdpo_group_sums(parts: torch.Tensor, weights: torch.Tensor, eps: float = GDPO_EPS) -> torch.Tensor:
    """GDPO's first stage: each reward normalised within its group, (r_k - mean_k) / (std_k + eps) with the sample
    std over the completions it applied to, then the weighted sum over rewards.  ``parts [B, G, K]`` (NaN where a
    reward did not apply), ``weights [K]`` -> ``[B, G]``, NaN for a completion no reward applied to.

    Normalising each reward before summing keeps a reward with a wide range from drowning the others' signal (a
    sum first, as GRPO does, gives the distinct combinations of K binary rewards fewer advantage values).

    Example: one group of two, rewards (1, 0) and (0, 0), weights (1, 1): the first reward normalises to
    (0.5 / (0.7071 + 1e-4), -0.5 / (0.7071 + 1e-4)) = (0.70701, -0.70701), the flat second to (0, 0).
    """
    mean = torch.nanmean(parts, dim=1, keepdim=True)  # [B, 1, K]
    std = nan_std(parts, dim=1, keepdim=True)  # [B, 1, K]
    normalised = (parts - mean) / (std + eps)  # [B, G, K]
    sums = (normalised * weights.to(parts.dtype)).nansum(dim=-1)  # [B, G]
    return torch.where(parts.isnan().all(dim=-1), torch.full_like(sums, float("nan")), sums)


def gdpo_advantages(sums: torch.Tensor, mean: torch.Tensor, std: torch.Tensor, eps: float = GDPO_EPS) -> torch.Tensor:
    """GDPO's second stage: ``(sums - mean) / (std + eps)`` with the batch's mean and sample std of the group sums
    (over every rank), 0 for a completion no reward applied to.  ``[B, G]`` -> ``[B, G]``.

    Example: sums (0.70701, -0.70701, 0, 0), mean 0, std 0.57728: (1.22454, -1.22454, 0, 0)."""
    return torch.nan_to_num((sums - mean) / (std + eps), nan=0.0)
