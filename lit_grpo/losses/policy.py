"""The policy-gradient surrogate and its variants (docs/guide.md#the-math): the ratio (per token or per sequence),
the variant's per-token surrogate (``surrogates.py``), its weights (sampler correction, masks) and aggregation."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from lit_grpo.losses.aggregation import (
    Sequences,
    check_aggregation,
    masked_aggregate,
    masked_mean,
    per_sequence_mean,
    sequence_log_mean,
)
from lit_grpo.losses.variants import (
    POLICY_VARIANTS,
    VARIANTS,
    PolicyVariant,
    RatioLevel,
    SurrogateInputs,
    detached,
    variant_row,
)

__all__ = ["POLICY_VARIANTS", "PolicyVariant", "RatioLevel", "SurrogateOptions", "importance_ratio", "policy_loss"]
# |log ratio| beyond this is clamped before exp (as verl does): exp(88.7) overflows float32, and with A = 0 (a flat
# group) 0 * inf is NaN. Inside the bound the loss is exact; beyond it the ratio is e^20 and passes no gradient.
LOG_RATIO_LIMIT = 20.0


@dataclass(frozen=True)
class SurrogateOptions:
    """The knobs of the surrogates beyond the clip epsilons (``PolicyModule`` documents each)."""

    ratio_level: str | None = None  # "token" or "sequence"; None: the variant's row's
    delta: float | None = None  # two-sided clipping's cap on the unclipped ratio (clip variants)
    knobs: Any = None  # the variant's knobs (its row's ``knobs`` type); None: that type's defaults

    def level(self, variant: str) -> str:
        return self.ratio_level if self.ratio_level is not None else variant_row(variant).ratio_level

    def variant_knobs(self, variant: str) -> Any:
        knob_type = variant_row(variant).knobs
        return self.knobs if self.knobs is not None or knob_type is None else knob_type()


def importance_ratio(logp: torch.Tensor, old_logp: torch.Tensor, completion_mask: torch.Tensor,
                     level: str, sequences: Sequences | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(ratio [N, T], log ratio [N, T])``: pi_theta / pi_old per token, the log clamped to ±``LOG_RATIO_LIMIT``; at
    ``sequence`` level each row's ratio is exp of the mean log ratio over its sequence's counted tokens (1 with
    none), spread over its tokens: a row's, or its episode's over all its rows (``sequences``), as TRL takes GSPO's
    ratio over a whole multi-turn completion. The ratio carries logp's gradient."""
    log_ratio = (logp - old_logp).clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)  # [N, T]
    if level == "sequence":
        mean_log = sequence_log_mean(log_ratio, completion_mask.bool(), sequences)  # [N]
        return torch.exp(mean_log).unsqueeze(-1).expand_as(logp), log_ratio
    return torch.exp(log_ratio), log_ratio


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
    options: SurrogateOptions = SurrogateOptions(),
    token_weights: torch.Tensor | None = None,
    sampler_ratio: torch.Tensor | None = None,
    sequences: Sequences | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Policy-gradient surrogate to minimise, aggregated over counted tokens, and its stats.

    The per-token surrogate is ``variant``'s row's formula (``variants.py``) with the ratio r of
    ``importance_ratio`` at ``options.level(variant)`` (``clip``: -min(A * r, A * clip(r, 1 - clip_eps,
    1 + clip_eps_high)), r capped at ``options.delta`` in the first term when set). It is then multiplied by
    ``token_weights`` (``[N, T]`` or ``[N, 1]``: masks) and ``sampler_ratio`` (``[N, T]``, pi_old / pi_sampler:
    ``importance.sampler_importance_ratio``), which a row that ``weighs_sampler_ratio`` takes into its formula instead.

    Args:
        logp: ``[N, T]`` sampled tokens' log-probs under the current policy (carries the gradient).
        old_logp: ``[N, T]`` the same under the policy that sampled them.
        advantages: ``[N]`` one per sequence, or ``[N, T]`` per token (not for a row with ``per_sequence_advantage``).
        completion_mask: ``[N, T]`` bool, True where a token counts in the loss.
        clip_eps, clip_eps_high: the clip epsilons (``None`` high means ``clip_eps``); used by every variant's
            stats; cispo caps its ratio at 1 + clip_eps_high.
        aggregation: see ``masked_aggregate``; a row with ``aggregation_required`` takes its own only.
        max_new_tokens: required by ``constant``.
        sequences: where a sequence spans several rows (a tool task's chain), each row's episode (``Sequences``):
            the aggregation weighs it as one sequence, and everything taken per sequence is taken over the episode
            (the sequence ratio, vespo's weight, the sequence-level figures), as TRL takes them over its multi-turn
            completion.

    Returns:
        ``(loss [], stats)``; stats are detached, over the counted tokens, named as TRL logs them:
        ``clip_ratio/low_mean`` (A < 0 and r < 1 - clip_eps), ``clip_ratio/high_mean`` (A > 0 and r > 1 +
        clip_eps_high), ``clip_ratio/region_mean`` (either; at ``sequence`` level these three are fractions of
        sequences, every sequence counting, as TRL's), ``ratio_mean``, ``approx_kl`` (mean of (r - 1) - log r
        per token, k3 of KL(pi_old || pi_theta)); then the row's ``statistics``.

    Example: logp = log 0.6, old_logp = log 0.5 (ratio 1.2), A = 1, clip_eps 0.1: ``clip`` gives -1.1 with
    clip_ratio/high_mean 1; ``unclipped`` gives -1.2; ``reinforce`` gives -log 0.6 = 0.5108.
    """
    row = variant_row(variant)
    check_aggregation(aggregation, max_new_tokens)
    check_shapes(logp, old_logp, advantages, completion_mask)
    check_variant(variant, advantages, aggregation)
    eps_high = clip_eps if clip_eps_high is None else clip_eps_high
    mask = completion_mask.bool()
    adv = advantages.unsqueeze(-1) if advantages.dim() == 1 else advantages  # [N, 1] or [N, T]
    level = options.level(variant)
    ratio, log_ratio = importance_ratio(logp, old_logp, mask, level, sequences)  # [N, T]
    inputs = SurrogateInputs(logp, ratio, log_ratio, adv, mask, clip_eps, eps_high, options.delta,
                             options.variant_knobs(variant), level, sampler_ratio, sequences)
    surrogate = row.surrogate(inputs)  # [N, T]
    if sampler_ratio is not None and not row.weighs_sampler_ratio:
        surrogate = surrogate * sampler_ratio
    if token_weights is not None:
        surrogate = surrogate * token_weights
    loss = masked_aggregate(surrogate, mask, aggregation, max_new_tokens, sequences)
    stats = policy_stats(ratio.detach(), log_ratio.detach(), adv.detach().expand_as(logp), mask, clip_eps, eps_high)
    if level == "sequence":  # one ratio per sequence: its figures count sequences, as TRL's do
        stats.update(sequence_clip_stats(ratio.detach(), adv.detach(), mask, clip_eps, eps_high, sequences))
    if row.statistics is not None:
        stats.update(row.statistics(detached(inputs)))
    return loss, stats


def policy_stats(
    ratio: torch.Tensor,
    log_ratio: torch.Tensor,
    advantages: torch.Tensor,
    completion_mask: torch.Tensor,
    eps_low: float,
    eps_high: float,
) -> dict[str, torch.Tensor]:
    """Clip ratios per region, mean ratio and approximate KL over the counted tokens; all inputs ``[N, T]``."""
    low, high = clip_regions(ratio, advantages, eps_low, eps_high)  # [N, T] each
    token_kl = torch.expm1(log_ratio) - log_ratio  # [N, T], (ratio - 1) - log ratio
    return {
        "clip_ratio/low_mean": masked_mean(low.to(ratio.dtype), completion_mask),
        "clip_ratio/high_mean": masked_mean(high.to(ratio.dtype), completion_mask),
        "clip_ratio/region_mean": masked_mean((low | high).to(ratio.dtype), completion_mask),
        "ratio_mean": masked_mean(ratio, completion_mask),
        "approx_kl": masked_mean(token_kl, completion_mask),
    }


def clip_regions(ratio: torch.Tensor, adv: torch.Tensor, eps_low: float,
                 eps_high: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Where the clip binds, ``(low, high)`` bool, shaped as ``ratio`` and ``adv`` broadcast: low where A < 0 and
    r < 1 - eps_low, high where A > 0 and r > 1 + eps_high."""
    return (adv < 0) & (ratio < 1.0 - eps_low), (adv > 0) & (ratio > 1.0 + eps_high)


def sequence_clip_stats(ratio: torch.Tensor, adv: torch.Tensor, completion_mask: torch.Tensor, eps_low: float,
                        eps_high: float, sequences: Sequences | None) -> dict[str, torch.Tensor]:
    """The three ``clip_ratio`` figures of a sequence-level ratio (``ratio [N, T]``, equal over a sequence's
    tokens; ``adv [N, 1]``) as fractions of sequences, every sequence counting (TRL's ``global_masked_mean`` of a
    ``[B, 1]`` ratio). Example: ratios 1.5 and 0.5 on two one-row sequences, advantages +1 and +1, eps 0.2: high
    1/2, low 0, region 1/2."""
    row_ratio = ratio[:, :1] if ratio.shape[1] else torch.ones_like(adv[:, :1])  # [N, 1]
    # [N] each: one advantage per sequence (check_variant)
    low, high = (region[:, 0].to(ratio.dtype) for region in clip_regions(row_ratio, adv[:, :1], eps_low, eps_high))
    return {"clip_ratio/low_mean": per_sequence_mean(low, sequences),
            "clip_ratio/high_mean": per_sequence_mean(high, sequences),
            "clip_ratio/region_mean": per_sequence_mean(torch.maximum(low, high), sequences)}


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


def check_variant(variant: str, advantages: torch.Tensor, aggregation: str) -> None:
    """A variant whose row requires its aggregation takes no other (GSPO averages one clipped sequence ratio per
    sequence, LUSPO sums it over the sequence's tokens); one that weighs a sequence by one advantage takes ``[N]``."""
    row = VARIANTS[variant]
    if row.aggregation_required and aggregation != row.aggregation:
        wanted = row.aggregation
        raise ValueError(f"loss variant {variant!r} takes aggregation {wanted!r} only (valid choices: {wanted}), "
                         f"got {aggregation!r}")
    if row.per_sequence_advantage and advantages.dim() != 1:
        raise ValueError(f"loss variant {variant!r} takes one advantage per sequence ([N]), not per-token advantages")
