"""The distributional risk head and the infer/defer rules built on it
(docs/guide.md#multi-round-tasks-and-tree-rollouts, last part).

At a decision point (a context the policy is about to extend in some round) the head predicts two distributions:
the return of inferring now (the reward of the answer the policy would commit to) and the return of deferring now
(the question's cost plus what the policy then earns). The threshold rule lets the policy infer only when
P(error) = P(return of inferring < success threshold) <= tau, and otherwise forces a defer; the value rule infers
where the (risk-adjusted) value of inferring is at least that of deferring, and defers otherwise.

Why a categorical over fixed return atoms (C51-style) and not quantiles: the return of inferring takes a few
discrete values (right, wrong, malformed), so a categorical represents it exactly; P(error) is then a plain sum of
atom probabilities below the threshold, with no interpolation between quantiles (which would need many quantiles to
resolve a two-point distribution), and its cross-entropy loss is a proper scoring rule, so the P(error) it learns
is calibrated in the limit. CVaR follows in closed form from the same probabilities. The return of deferring
takes more values (each question's cost, then right, wrong or cut off), which the atoms hold as well when their
spacing divides the costs. Measured (``benchmarks/research/risk/risk_distribution.py``, docs/benchmarks.md): on the same
features and labels, 11-51 quantiles with the pinball loss had three times the atoms' CRPS on the answering branch and
twice their value-rule regret, with the same Brier score and AUROC of P(error).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class RiskHeadSpec:
    """The risk head's support and loss.

    Args:
        v_min: the lowest return atom (returns below are clipped onto it).
        v_max: the highest return atom.
        num_atoms: atoms evenly spaced over ``[v_min, v_max]``.
        success_threshold: an inferred answer whose return is below this is an error.
        coef: weight of the head's cross-entropy in the loss (only with ``detach: false``).
        detach: fit the head on the frozen policy's hidden states (true), from greedy probe episodes of each epoch's
            prompts kept in a replay, so its loss never moves the policy; false trains it jointly with the policy
            from the sampled trees' answers, through the hidden state.
        replay_size: the most recent labelled decision states the detached head is fitted on.
        fit_steps: full-batch Adam steps of each epoch's fit of the detached head (warm-started).
        fit_lr: the learning rate of that fit.
        probe_prompts: training prompts whose greedy episodes label decision states each epoch (the epoch's own,
            then the ones after them in the split; they add episodes, not policy updates).
    """

    v_min: float = -1.0
    v_max: float = 1.0
    num_atoms: int = 11
    success_threshold: float = 0.0
    coef: float = 1.0
    detach: bool = True
    replay_size: int = 2048
    fit_steps: int = 200
    fit_lr: float = 0.05
    probe_prompts: int = 64

    def problems(self) -> list[str]:
        found = []
        if not self.v_min < self.v_max:
            found.append(f"risk: v_min ({self.v_min}) must be below v_max ({self.v_max})")
        if self.num_atoms < 2:
            found.append(f"risk: num_atoms must be >= 2, got {self.num_atoms}")
        if not self.v_min < self.success_threshold <= self.v_max:
            found.append(f"risk: success_threshold must be in (v_min, v_max], got {self.success_threshold}")
        if self.coef < 0:
            found.append(f"risk: coef must be >= 0, got {self.coef}")
        for name in ("replay_size", "fit_steps", "probe_prompts"):
            if getattr(self, name) < 1:
                found.append(f"risk: {name} must be >= 1, got {getattr(self, name)}")
        if not self.fit_lr > 0:
            found.append(f"risk: fit_lr must be > 0, got {self.fit_lr}")
        return found

    def atoms(self) -> torch.Tensor:
        return torch.linspace(self.v_min, self.v_max, self.num_atoms)  # [K]


INFER, DEFER = 0, 1  # the head's two branches: the return of inferring now, and of deferring now
CONFIDENCE_FEATURES = 2  # appended to the hidden state: the policy's confidence in its next token


def confidence_features(logits: torch.Tensor) -> torch.Tensor:
    """The policy's confidence in its next token from its logits ``[..., V]``: ``[..., 2]`` = (largest log-prob,
    entropy). A linear head on the hidden state alone cannot form these (they are non-linear in it), and they carry
    what the hidden state's linear read-out misses: how sure the policy is of what it will write.

    Example: logits [0, log 3] -> probabilities [1/4, 3/4] -> (log 3/4, -(1/4 log 1/4 + 3/4 log 3/4)).
    """
    logp = logits.float().log_softmax(-1)  # [..., V]
    return torch.stack([logp.max(-1).values, -(logp.exp() * logp).sum(-1)], dim=-1)


class RiskHead(nn.Module):
    """Logits over the return atoms of inferring and of deferring from a decision point's features (the hidden
    state then ``confidence_features``) ``[..., H + 2] -> [..., 2, K]``; zero-initialised (uniform)."""

    def __init__(self, hidden_size: int, spec: RiskHeadSpec) -> None:
        super().__init__()
        self.spec = spec
        self.linear = nn.Linear(hidden_size + CONFIDENCE_FEATURES, 2 * spec.num_atoms)
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)
        self.register_buffer("atoms", spec.atoms(), persistent=False)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.linear(features.float()).unflatten(-1, (2, self.spec.num_atoms))  # [..., 2, K]

    def error_probability(self, features: torch.Tensor) -> torch.Tensor:
        """P(return of inferring < success threshold) ``[...]``."""
        return error_probability(self(features)[..., INFER, :].softmax(-1), self.atoms, self.spec.success_threshold)


def two_hot(returns: torch.Tensor, atoms: torch.Tensor) -> torch.Tensor:
    """Project returns ``[M]`` onto evenly spaced ``atoms`` ``[K]``: ``[M, K]``, mass split between the two nearest
    atoms so the expectation is kept (returns outside the support are clipped to it).

    Example: atoms [-1, 0, 1]: 0.5 -> [0, 0.5, 0.5]; -1 -> [1, 0, 0]; 3 -> [0, 0, 1]; -0.25 -> [0.25, 0.75, 0].
    """
    spacing = atoms[1] - atoms[0]
    position = ((returns.clamp(atoms[0], atoms[-1]) - atoms[0]) / spacing).clamp(0, len(atoms) - 1)  # [M]
    lower = position.floor().long().clamp(max=len(atoms) - 2)  # [M]
    upper_weight = position - lower  # [M] in [0, 1]
    target = torch.zeros(len(returns), len(atoms), dtype=atoms.dtype, device=atoms.device)
    target.scatter_(1, lower.unsqueeze(1), (1 - upper_weight).unsqueeze(1))
    target.scatter_add_(1, (lower + 1).unsqueeze(1), upper_weight.unsqueeze(1))
    return target


def risk_loss(logits: torch.Tensor, returns: torch.Tensor, atoms: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of the predicted categorical ``logits [M, K]`` against the two-hot projection of the
    observed returns of inferring ``[M]``; 0 when ``M == 0``.

    Example: atoms [-1, 0, 1], logits [0, 0, 0], return 0.5: target [0, 0.5, 0.5], loss log 3 = 1.0986.
    """
    if logits.shape[0] == 0:
        return logits.sum() * 0.0
    target = two_hot(returns.to(atoms.dtype), atoms)  # [M, K]
    return -(target * logits.log_softmax(-1)).sum(-1).mean()


def error_probability(probs: torch.Tensor, atoms: torch.Tensor, success_threshold: float) -> torch.Tensor:
    """P(return < success_threshold) from categorical ``probs [..., K]`` over ``atoms [K]``: ``[...]``."""
    return (probs * (atoms < success_threshold).to(probs.dtype)).sum(-1)


def forced_defer(p_error: torch.Tensor, tau: float | None) -> torch.Tensor:
    """The rule: infer only if P(error) <= tau, so a defer is forced where P(error) > tau; ``tau=None`` is the
    always-defer state (no tau was feasible). ``[B]`` bool."""
    if tau is None:
        return torch.ones_like(p_error, dtype=torch.bool)
    return p_error > tau


def cvar(probs: torch.Tensor, atoms: torch.Tensor, level: float) -> torch.Tensor:
    """Lower-tail CVaR of categorical ``probs [..., K]`` over ascending ``atoms [K]``: the mean of the worst
    ``1 - level`` of the probability mass ``[...]``; ``level`` 0 is the expectation, larger is more risk-averse.

    Example: atoms [-1, 0, 1], probs [0.2, 0.3, 0.5]: level 0 -> 0.3; level 0.5 (worst half: 0.2 at -1, 0.3 at 0)
    -> -0.2 / 0.5 = -0.4; level 0.9 (worst 0.1, all at -1) -> -1.
    """
    if not 0 <= level < 1:
        raise ValueError(f"CVaR level must be in [0, 1), got {level}")
    tail = 1.0 - level
    below = probs.cumsum(-1) - probs  # [..., K] mass of the atoms before each
    taken = (tail - below).clamp(min=0).minimum(probs)  # [..., K] each atom's mass inside the tail
    return (taken * atoms).sum(-1) / tail


def value_rule_defers(probs: torch.Tensor, atoms: torch.Tensor, level: float) -> torch.Tensor:
    """The value rule: defer where the CVaR at ``level`` of the return of inferring is below that of deferring.
    ``probs [B, 2, K]`` (inferring, deferring) -> ``[B]`` bool (ties infer)."""
    values = cvar(probs, atoms, level)  # [B, 2]
    return values[:, INFER] < values[:, DEFER]


def first_token_constraints(
    forced: torch.Tensor, defer_token_ids: Sequence[int]
) -> tuple[tuple[int, ...] | None, ...]:
    """Per request, the allowed first tokens for the engine: the defer tokens where a defer is forced, else None."""
    allowed = tuple(defer_token_ids)
    return tuple(allowed if flag else None for flag in forced.tolist())


def selective_error(errors: torch.Tensor, covered: torch.Tensor) -> float | None:
    """Errors among the covered (inferred) episodes; None when nothing was covered (undefined)."""
    count = int(covered.sum())
    return None if count == 0 else float((errors & covered).sum()) / count


def binomial_cdf(k: int, n: int, p: float) -> float:
    """P(Binomial(n, p) <= k), summed exactly (``math.comb``); 1 for k >= n, 0 for k < 0.

    Example: k 1, n 3, p 0.5 -> (1 + 3) / 8 = 0.5.
    """
    if k < 0:
        return 0.0
    return min(1.0, math.fsum(math.comb(n, i) * p**i * (1 - p) ** (n - i) for i in range(min(k, n) + 1)))


def learn_then_test(
    curve: Sequence[tuple[float, int, int]], alpha: float, delta: float
) -> tuple[float | None, list[float]]:
    """Learn-then-Test (Angelopoulos et al., 2021) over a tau grid by fixed-sequence testing.

    ``curve`` holds ``(tau, errors, covered)`` for each candidate: the wrong answers among the ``covered`` episodes
    the rule let answer at that tau, on calibration episodes. The null hypothesis at tau is "selective error >
    alpha"; its p-value is ``binomial_cdf(errors, covered, alpha)`` (how likely so few errors would be at error rate
    alpha; 1 when nothing is covered). Candidates are tested from the smallest tau (the most cautious) up, each at
    level ``delta``, stopping at the first that fails; the largest rejected tau is returned. With probability at
    least 1 - delta over the calibration episodes, its selective error on new episodes is at most alpha.

    Returns ``(tau, or None when the first candidate already fails: always defer, p-value of every candidate in
    tau order)``.

    Example, alpha 0.1, delta 0.1: (0.1, 0 errors of 30), (0.2, 1 of 40), (0.3, 6 of 50) -> p-values
    0.9**30 = 0.0424, 0.9**40 + 40 * 0.1 * 0.9**39 = 0.0805, 0.770 -> tau 0.2.
    """
    ordered = sorted(curve)
    p_values = [binomial_cdf(errors, covered, alpha) if covered else 1.0 for _, errors, covered in ordered]
    chosen = None
    for (tau, _, _), p_value in zip(ordered, p_values):
        if p_value > delta:
            break
        chosen = tau
    return chosen, p_values


def reliability_bins(p_error: torch.Tensor, errors: torch.Tensor, num_bins: int = 15) -> list[tuple[float, float, int]]:
    """Equal-mass bins of predicted error probabilities ``[M]`` (sorted, cut into ``num_bins`` runs of sizes that
    differ by at most one): ``(mean predicted, observed error rate, size)`` per non-empty bin."""
    order = p_error.argsort(stable=True)
    bins = []
    for members in torch.tensor_split(order, min(num_bins, len(order))) if len(order) else []:
        bins.append((float(p_error[members].mean()), float(errors[members].float().mean()), len(members)))
    return bins


def expected_calibration_error(p_error: torch.Tensor, errors: torch.Tensor, num_bins: int = 15) -> float:
    """ECE of predicted error probabilities ``[M]`` against observed errors ``[M]`` (bool) over ``num_bins``
    equal-mass bins (``reliability_bins``): sum of (bin share) * |mean predicted - observed error rate|.

    Example: predictions [0.1, 0.2, 0.8, 0.9], errors [F, T, T, T], 2 bins: |0.15 - 0.5| * 0.5 + |0.85 - 1| * 0.5
    = 0.25.
    """
    total = len(p_error)
    return float(sum(size / total * abs(predicted - observed)
               for predicted, observed, size in reliability_bins(p_error, errors, num_bins)))
