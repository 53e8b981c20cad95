"""The per-token surrogates beyond PPO's clip: two-sided clipping (INTELLECT-2's delta), CISPO, SAPO and VESPO
(docs/guide.md#the-math), and the knobs of those that have some (``SapoTemperatures``, ``VespoShape``: a row's
``knobs`` in ``variants.py``). Each maps ratios and advantages to the per-token loss to minimise; ``variants.py``
names each variant's, ``policy.py`` weights and aggregates it. Every function takes ``[N, T]`` ratios (a
sequence-level ratio expanded over its tokens) and advantages ``[N, 1]`` or ``[N, T]``.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch

from lit_grpo.losses.aggregation import Sequences, sequence_totals



@dataclass(frozen=True)
class SapoTemperatures:
    """SAPO's gate temperatures (``loss_variant: sapo``): a higher temperature narrows the gate around ratio 1.

    Args:
        pos: tau for tokens of positive advantage (TRL's ``sapo_temperature_pos``).
        neg: tau for the others (TRL's ``sapo_temperature_neg``); the paper makes it the larger, so that
            negative updates, which spread over the vocabulary, are damped sooner.
    """

    pos: float = 1.0
    neg: float = 1.05

    def problems(self) -> list[str]:
        return [f"{name}: must be positive, got {value}" for name, value in (("pos", self.pos), ("neg", self.neg))
                if not value > 0]


@dataclass(frozen=True)
class VespoShape:
    """VESPO's sequence weight phi(w) = e^lambda w^k e^(-lambda w) (``loss_variant: vespo``), one (k, lambda) pair per
    advantage sign.

    Args:
        k_pos: k for advantages >= 0: how hard a low weight w < 1 is damped (TRL's ``vespo_k_pos``).
        lambda_pos: lambda for advantages >= 0: how hard a high weight is damped (``vespo_lambda_pos``).
        k_neg: k for negative advantages (``vespo_k_neg``).
        lambda_neg: lambda for negative advantages (``vespo_lambda_neg``).
    """

    k_pos: float = 2.0
    lambda_pos: float = 3.0
    k_neg: float = 3.0
    lambda_neg: float = 2.0

    def problems(self) -> list[str]:
        return [f"{name}: must be positive, got {value}" for name, value in dataclasses.asdict(self).items()
                if not value > 0]


# VESPO's bounds on the log of the sequence weight w, as its authors' code (and TRL) clamp it: w in [1e-8, e^20]
VESPO_LOG_W_MIN = math.log(1e-8)
VESPO_LOG_W_MAX = 20.0


def clip_surrogate(ratio: torch.Tensor, adv: torch.Tensor, eps_low: float, eps_high: float,
                   delta: float | None = None) -> torch.Tensor:
    """PPO's -min(A r, A clip(r, 1 - eps_low, 1 + eps_high)); with ``delta`` (two-sided clipping) the unclipped
    branch's r is capped at delta first, so a negative-advantage token whose ratio ran away stops pushing.

    Example: r = 3, A = -1, eps 0.2: -min(-3, -1.2) = 3; with delta 2: -min(-2, -1.2) = 2 (its gradient is 0)."""
    clipped = torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high)
    capped = ratio if delta is None else ratio.clamp(max=delta)
    return -torch.minimum(adv * capped, adv * clipped)


def cispo_surrogate(logp: torch.Tensor, ratio: torch.Tensor, adv: torch.Tensor, cap: float) -> torch.Tensor:
    """CISPO (MiniMax-M1): -sg(min(r, cap)) * A * log pi. The ratio is clipped and detached, so no token's
    gradient is cut off: each is REINFORCE's, weighted by its capped ratio.

    Example: r = 6, cap 5, A = 1, log pi = log 0.5: -5 * 1 * (-0.6931) = 3.4657, gradient in log pi -5."""
    return -ratio.clamp(max=cap).detach() * adv * logp


def sapo_surrogate(ratio: torch.Tensor, adv: torch.Tensor, temperature_pos: float,
                   temperature_neg: float) -> torch.Tensor:
    """SAPO (Qwen): -(4 / tau) sigmoid(tau (r - 1)) * A with tau = ``temperature_pos`` where A > 0, else
    ``temperature_neg``: a soft gate in place of the clip, whose weight on the gradient in r, 4 s (1 - s) with
    s = sigmoid(tau (r - 1)), is 1 at r = 1 and decays smoothly as r leaves it (``sapo_gate``).

    Example: r = 1, A = 1, tau 1: -(4 / 1) * 0.5 = -2."""
    tau = torch.where(adv > 0, torch.full_like(adv, temperature_pos), torch.full_like(adv, temperature_neg))
    return -torch.sigmoid(tau * (ratio - 1.0)) * 4.0 / tau * adv


def sapo_gate(ratio: torch.Tensor, adv: torch.Tensor, temperature_pos: float, temperature_neg: float) -> torch.Tensor:
    """SAPO's weight on each token's gradient in r, relative to the unclipped surrogate's: 4 s (1 - s),
    s = sigmoid(tau (r - 1)); 1 on-policy, below 1 off it.  ``[N, T]``.

    Example: r = 1 gives 1; r = 3 with tau 1: s = 0.8808, 4 * 0.8808 * 0.1192 = 0.4200."""
    tau = torch.where(adv > 0, torch.full_like(adv, temperature_pos), torch.full_like(adv, temperature_neg))
    gate = torch.sigmoid(tau * (ratio - 1.0))
    return (4.0 * gate * (1.0 - gate)).expand_as(ratio)


@torch.no_grad()
def vespo_weights(log_ratio: torch.Tensor, adv: torch.Tensor, completion_mask: torch.Tensor,
                  sampler_log_ratio: torch.Tensor | None, k_pos: float, lambda_pos: float, k_neg: float,
                  lambda_neg: float, sequences: Sequences | None = None) -> torch.Tensor:
    """VESPO's per-sequence weight phi(w) = e^lambda w^k e^(-lambda w) (so phi(1) = 1), detached: ``[N, 1]``.

    w is the sequence's importance weight, exp of the sum of its counted tokens' log ratios (each clamped to
    ±20), times pi_old / pi_sampler when a sampler correction is given (``sampler_log_ratio [N, T]``, log of the
    corrected per-token ratio, summed over the row); a sequence spanning several rows (``sequences``: a tool
    task's episode) sums over all its rows, as TRL's w spans a multi-turn completion. log w is clamped to
    [log 1e-8, 20]. (k, lambda) are
    (``k_pos``, ``lambda_pos``) where the advantage is >= 0, else the ``_neg`` pair. ``adv``: ``[N, 1]``.

    Example: w = 1 gives 1; log w = log 2, k 2, lambda 3: e^3 * 4 * e^-6 = 4 e^-3 = 0.1991.
    """
    seq_log_ratio = (log_ratio.clamp(-20.0, 20.0) * completion_mask).sum(dim=-1, keepdim=True)  # [N, 1]
    if sampler_log_ratio is not None:
        seq_log_ratio = seq_log_ratio + sampler_log_ratio.clamp(VESPO_LOG_W_MIN, VESPO_LOG_W_MAX).sum(-1, keepdim=True)
    seq_log_ratio = sequence_totals(seq_log_ratio[:, 0], sequences)[:, None]  # [N, 1] over the episode's rows
    log_w = seq_log_ratio.clamp(VESPO_LOG_W_MIN, VESPO_LOG_W_MAX)  # [N, 1]
    nonneg = adv >= 0
    k = torch.where(nonneg, torch.full_like(log_w, k_pos), torch.full_like(log_w, k_neg))
    lam = torch.where(nonneg, torch.full_like(log_w, lambda_pos), torch.full_like(log_w, lambda_neg)).clamp(min=1e-4)
    return torch.exp(lam + k * log_w - lam * torch.exp(log_w)).nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)
