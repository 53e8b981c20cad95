"""Selective prediction: how well a score ranks the decisions that will be wrong (risk-coverage, AURC, AUROC).

A ``score`` is higher where an error is likelier (a predicted P(error), a negated confidence); covering the
``k`` lowest-scored decisions gives the selective risk (error rate among them) at coverage ``k / N``. Tied scores
cannot be ordered, so within a tie the expected risk over its orders is used: errors accrue at the tie's rate.
"""

from __future__ import annotations

import torch
from torchmetrics.functional.classification import binary_auroc


def risk_coverage(scores: torch.Tensor, errors: torch.Tensor) -> torch.Tensor:
    """Selective risk at coverage 1/N, 2/N, ..., 1 ``[N]`` of ``scores [N]`` against ``errors [N]`` (bool).

    Example: scores [0.1, 0.5, 0.5, 0.9], errors [F, T, F, T] -> covered errors 0, 0.5, 1, 2 -> [0, 0.25, 1/3, 0.5].
    """
    order = scores.argsort(stable=True)
    ranked, wrong = scores[order], errors[order].double()  # [N]
    _, inverse, counts = ranked.unique_consecutive(return_inverse=True, return_counts=True)
    tie_rate = torch.zeros(len(counts), dtype=torch.float64).index_add_(0, inverse, wrong) / counts  # [G]
    smoothed = tie_rate[inverse]  # [N] each position's expected error over the tie's orders
    covered = torch.arange(1, len(scores) + 1, dtype=torch.float64)
    return smoothed.cumsum(0) / covered


def aurc(scores: torch.Tensor, errors: torch.Tensor) -> float:
    """Area under the risk-coverage curve: the mean selective risk over the N coverages (lower is better)."""
    return float(risk_coverage(scores, errors).mean())


def excess_aurc(scores: torch.Tensor, errors: torch.Tensor) -> float:
    """E-AURC: AURC minus that of the perfect ranking (every error last), so 0 is a perfect score.

    Example: 4 decisions, 1 error: perfect risks [0, 0, 0, 1/4], AURC 1/16.
    """
    count, wrong = len(errors), int(errors.sum())
    covered = torch.arange(1, count + 1, dtype=torch.float64)
    best = float(((covered - (count - wrong)).clamp(min=0) / covered).mean())
    return aurc(scores, errors) - best


def selective_risk_at(scores: torch.Tensor, errors: torch.Tensor, coverage: float) -> float:
    """Selective risk when the ``ceil(coverage * N)`` lowest-scored decisions are covered."""
    count = max(1, int(torch.ceil(torch.tensor(coverage * len(scores))).item()))
    return float(risk_coverage(scores, errors)[count - 1])


def auroc(scores: torch.Tensor, errors: torch.Tensor) -> float:
    """AUROC of ``scores`` as a detector of errors (ties count one half); NaN if only one class is present."""
    if errors.all() or not errors.any():
        return float("nan")
    return float(binary_auroc(scores.double(), errors.long()))


def brier(p_error: torch.Tensor, errors: torch.Tensor) -> float:
    """Mean squared gap between the predicted error probability and the outcome."""
    return float(((p_error.double() - errors.double()) ** 2).mean())
