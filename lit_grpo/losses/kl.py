"""Per-token KL estimators against the reference policy (docs/guide.md#the-math)."""

from __future__ import annotations

from typing import Literal, get_args

import torch

from lit_grpo.losses.advantages import check_choice

KLEstimator = Literal["k1", "k2", "k3"]
KL_ESTIMATORS: tuple[str, ...] = get_args(KLEstimator)


def kl_divergence(logp: torch.Tensor, ref_logp: torch.Tensor, estimator: str = "k3") -> torch.Tensor:
    """Per-token estimate of KL(pi_theta || pi_ref) from the sampled tokens' log-probs.

    With delta = ref_logp - logp: ``k1`` = -delta (unbiased, can be negative), ``k2`` = delta^2 / 2,
    ``k3`` = exp(delta) - delta - 1 (unbiased and non-negative; GRPO's choice).

    Args:
        logp: ``[N, T]`` log-probs under the current policy.
        ref_logp: ``[N, T]`` log-probs under the reference policy.

    Returns:
        ``[N, T]`` per-token values; masking and aggregation are the caller's (``masked_aggregate``).

    Example: logp = log 0.5, ref_logp = log 0.25 gives delta = -log 2 = -0.6931, so k1 = 0.6931, k2 = 0.2402,
    k3 = 0.5 + 0.6931 - 1 = 0.1931.
    """
    check_choice("KL estimator", estimator, KL_ESTIMATORS)
    delta = ref_logp - logp  # [N, T]
    if estimator == "k1":
        return -delta
    if estimator == "k2":
        return delta.square() / 2
    return torch.exp(delta) - delta - 1
