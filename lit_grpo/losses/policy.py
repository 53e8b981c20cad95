"""The clipped policy-gradient surrogate and its variants (docs/guide.md#the-math)."""

from __future__ import annotations

from typing import Literal, TypedDict, get_args

import torch

from lit_grpo.losses.advantages import check_choice
from lit_grpo.losses.aggregation import (
    check_aggregation,
    masked_aggregate,
    masked_mean,
    sequence_mean,
)

PolicyVariant = Literal["reinforce", "unclipped", "clip", "gspo"]
POLICY_VARIANTS: tuple[str, ...] = get_args(PolicyVariant)
# |log ratio| beyond this is clamped before exp (as verl does): exp(88.7) overflows float32, and with A = 0 (a flat
# group) 0 * inf is NaN. Inside the bound the loss is exact; beyond it the ratio is e^20 and passes no gradient.
LOG_RATIO_LIMIT = 20.0


class PolicyStats(TypedDict):
    """Detached diagnostics over the counted tokens (each 0 when no token counts)."""

    clip_frac_low: torch.Tensor  # share of tokens with A < 0 and ratio < 1 - clip_eps (clipped branch active)
    clip_frac_high: torch.Tensor  # share of tokens with A > 0 and ratio > 1 + clip_eps_high
    ratio_mean: torch.Tensor  # mean importance ratio (the sequence ratio for gspo)
    approx_kl: torch.Tensor  # mean of (ratio - 1) - log ratio per token: k3 estimate of KL(pi_old || pi_theta)


def policy_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    completion_mask: torch.Tensor,
    variant: str = "clip",
    clip_eps: float = 0.2,
    clip_eps_high: float | None = None,
    aggregation: str = "seq-mean",
    max_new_tokens: int | None = None,
) -> tuple[torch.Tensor, PolicyStats]:
    """Policy-gradient surrogate to minimise, aggregated over counted tokens, and its stats.

    Per-token surrogate with ratio = exp(logp - old_logp), the log ratio clamped to ±``LOG_RATIO_LIMIT``:
    ``reinforce`` -A * logp; ``unclipped`` -A * ratio; ``clip`` -min(A * ratio, A * clip(ratio, 1 - clip_eps,
    1 + clip_eps_high)); ``gspo`` the clip surrogate on the sequence ratio exp(mean over the sequence's counted
    tokens of (logp - old_logp)), which is 1 for a sequence with no counted token.

    Args:
        logp: ``[N, T]`` sampled tokens' log-probs under the current policy (carries the gradient).
        old_logp: ``[N, T]`` the same under the policy that sampled them.
        advantages: ``[N]`` one per sequence, or ``[N, T]`` per token (not for gspo).
        completion_mask: ``[N, T]`` bool, True where a token counts in the loss.
        variant: one of ``reinforce``, ``unclipped``, ``clip``, ``gspo``.
        clip_eps: lower clip epsilon (epsilon_low); used by every variant's stats.
        clip_eps_high: upper clip epsilon (DAPO's clip-higher); ``None`` means ``clip_eps``.
        aggregation: ``seq-mean``, ``token-mean`` or ``constant`` (see ``masked_aggregate``); gspo takes only
            ``seq-mean``.
        max_new_tokens: required by ``constant``.

    Returns:
        ``(loss [], stats)``; stats are detached and use the ratio the variant clips (the sequence ratio for gspo).
        For ``reinforce`` and ``unclipped`` the clip fractions report what the clip would have cut.

    Example: logp = log 0.6, old_logp = log 0.5 (ratio 1.2), A = 1, clip_eps 0.1: ``clip`` gives -1.1 with
    clip_frac_high 1; ``unclipped`` gives -1.2; ``reinforce`` gives -log 0.6 = 0.5108.
    """
    check_choice("loss variant", variant, POLICY_VARIANTS)
    check_aggregation(aggregation, max_new_tokens)
    check_shapes(logp, old_logp, advantages, completion_mask)
    if variant == "gspo":
        check_gspo(advantages, aggregation)
    eps_high = clip_eps if clip_eps_high is None else clip_eps_high
    mask = completion_mask.bool()
    adv = advantages.unsqueeze(-1) if advantages.dim() == 1 else advantages  # [N, 1] or [N, T]
    log_ratio = (logp - old_logp).clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)  # [N, T]
    if variant == "gspo":
        ratio = torch.exp(sequence_mean(log_ratio, mask)).unsqueeze(-1).expand_as(logp)  # [N, T], one per sequence
    else:
        ratio = torch.exp(log_ratio)  # [N, T]
    surrogate = token_surrogate(variant, logp, ratio, adv, clip_eps, eps_high)  # [N, T]
    loss = masked_aggregate(surrogate, mask, aggregation, max_new_tokens)
    stats = policy_stats(ratio.detach(), log_ratio.detach(), adv.detach().expand_as(logp), mask, clip_eps, eps_high)
    return loss, stats


def token_surrogate(variant: str, logp: torch.Tensor, ratio: torch.Tensor, adv: torch.Tensor, eps_low: float,
                    eps_high: float) -> torch.Tensor:
    """The per-token surrogate ``[N, T]`` of ``variant`` (see ``policy_loss``); ``adv`` is ``[N, 1]`` or ``[N, T]``."""
    if variant == "reinforce":
        return -adv * logp
    if variant == "unclipped":
        return -adv * ratio
    clipped = torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high)
    return -torch.minimum(adv * ratio, adv * clipped)


def policy_stats(
    ratio: torch.Tensor,
    log_ratio: torch.Tensor,
    advantages: torch.Tensor,
    completion_mask: torch.Tensor,
    eps_low: float,
    eps_high: float,
) -> PolicyStats:
    """Clip fractions, mean ratio and approximate KL over the counted tokens; all inputs ``[N, T]``."""
    low = (advantages < 0) & (ratio < 1.0 - eps_low)  # [N, T]
    high = (advantages > 0) & (ratio > 1.0 + eps_high)  # [N, T]
    token_kl = torch.expm1(log_ratio) - log_ratio  # [N, T], (ratio - 1) - log ratio
    return PolicyStats(
        clip_frac_low=masked_mean(low.to(ratio.dtype), completion_mask),
        clip_frac_high=masked_mean(high.to(ratio.dtype), completion_mask),
        ratio_mean=masked_mean(ratio, completion_mask),
        approx_kl=masked_mean(token_kl, completion_mask),
    )


def check_shapes(
    logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, completion_mask: torch.Tensor
) -> None:
    """Raise ``ValueError`` unless the inputs are ``[N, T]`` with advantages ``[N]`` or ``[N, T]``."""
    if logp.dim() != 2 or logp.shape != old_logp.shape or logp.shape != completion_mask.shape:
        raise ValueError(
            "logp, old_logp and completion_mask must share one [N, T] shape, got "
            f"{tuple(logp.shape)}, {tuple(old_logp.shape)}, {tuple(completion_mask.shape)}"
        )
    if advantages.shape not in (logp.shape[:1], logp.shape):
        raise ValueError(f"advantages must be [N] or [N, T] for logp {tuple(logp.shape)}, got {tuple(advantages.shape)}")


def check_gspo(advantages: torch.Tensor, aggregation: str) -> None:
    """GSPO clips one ratio per sequence, so it needs one advantage per sequence and per-sequence averaging."""
    if aggregation != "seq-mean":
        raise ValueError(f"loss variant 'gspo' takes aggregation 'seq-mean' only (valid choices: seq-mean), got {aggregation!r}")
    if advantages.dim() != 1:
        raise ValueError("loss variant 'gspo' takes one advantage per sequence ([N]), not per-token advantages")
