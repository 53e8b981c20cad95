"""Correcting for a sampler whose probabilities differ from the trainer's (a half-precision engine, or rollouts
drawn ahead by an older policy): the sampler's importance ratio and the off-policy sequence mask."""

from __future__ import annotations

import math

import torch

from lit_grpo.losses.aggregation import Sequences, sequence_log_mean, sequence_totals

# the modes run/objective_knobs.SamplerCorrection's Literal spells for the configuration (losses/ imports nothing
# outside itself; tests/test_importance.py holds the two equal)
SAMPLER_CORRECTION_MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")

LOG_RATIO_LIMIT = 20.0  # as losses.policy's: exp(20) is finite in float32, and no weight a clip keeps is near it


def sampler_importance_ratio(old_logp: torch.Tensor, sampler_logp: torch.Tensor, completion_mask: torch.Tensor,
                             mode: str, clip_min: float | None, clip_max: float | None,
                             sequences: Sequences | None = None) -> torch.Tensor:
    """The weight pi_old / pi_sampler on each token's surrogate, ``[N, T]`` (1 where the mask is False).

    The tokens were drawn from the sampler's distribution, while the surrogate's ratio is taken against the
    trainer's pi_old; weighting each token by this ratio makes the gradient an estimate under pi_old. ``token_*``
    modes take each token's ratio, ``sequence_*`` the product over the row's counted tokens (one weight per row,
    spread over its tokens; over every row of its episode where a sequence spans several, ``sequences``). ``*_truncate`` clamps the ratio to [``clip_min``, ``clip_max``] (truncated importance
    sampling, TIS); ``*_mask`` sets it to 0 outside that range (masked importance sampling, MIS). A bound of None
    is no bound; a token whose sampler log-prob is NaN counts as ratio 1; the log of the ratio is clamped to ±20.

    Example: old log 0.5, sampler log 0.25 (ratio 2), clip_max 1.5: token_truncate 1.5, token_mask 0. Two such
    tokens in a row: sequence ratio 4, sequence_truncate 1.5 on both.
    """
    if mode not in SAMPLER_CORRECTION_MODES:
        raise ValueError(f"unknown sampler correction mode {mode!r}; valid choices: "
                         f"{', '.join(SAMPLER_CORRECTION_MODES)}")
    mask = completion_mask.bool()
    log_ratio = torch.nan_to_num(torch.where(mask, old_logp - sampler_logp, 0.0), nan=0.0)  # [N, T]
    if mode.startswith("sequence"):
        log_ratio = sequence_totals(log_ratio.sum(dim=-1), sequences)[:, None].expand_as(old_logp)  # [N, T]
    # clamped as the policy's log ratio is: a long row's product (or a sampler log-prob of -inf) would overflow, and a
    # flat group's 0 advantage times inf is NaN; inside the bound the weight is exact
    ratio = torch.exp(log_ratio.clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT))
    if mode.endswith("truncate") and (clip_min is not None or clip_max is not None):
        ratio = ratio.clamp(min=clip_min, max=clip_max)
    else:
        low = -math.inf if clip_min is None else clip_min
        high = math.inf if clip_max is None else clip_max
        ratio = ratio.masked_fill((ratio < low) | (ratio > high), 0.0)
    return torch.where(mask, ratio, torch.ones_like(ratio))


def off_policy_keep(advantages: torch.Tensor, logp: torch.Tensor, behaviour_logp: torch.Tensor,
                    completion_mask: torch.Tensor, threshold: float,
                    sequences: Sequences | None = None) -> torch.Tensor:
    """DeepSeek-V3.2's off-policy sequence mask: ``[N, 1]`` (or ``[N, T]`` for per-token advantages) float, 0 for a
    sequence whose advantage is negative and whose mean KL(pi_behaviour || pi_theta) estimate over its counted
    tokens (over every row of its episode where a sequence spans several, ``sequences``), mean of
    (behaviour_logp - logp), exceeds ``threshold``; 1 otherwise. Learning from a negative sample the
    policy has moved far from mostly pushes down tokens it no longer produces.

    Example: A = -1, per-token log-probs behaviour (-1, -1), current (-1.5, -2.5): mean KL 1.0; kept with threshold
    1.0 (<=), dropped with 0.5.
    """
    kl = torch.nan_to_num(behaviour_logp - logp.detach(), nan=0.0)  # [N, T]
    mean_kl = sequence_log_mean(kl, completion_mask, sequences)[:, None]  # [N, 1]
    adv = advantages.unsqueeze(-1) if advantages.dim() == 1 else advantages
    return ((adv >= 0) | (mean_kl <= threshold)).to(logp.dtype)
