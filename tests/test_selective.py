"""Selective-prediction metrics on hand-computed examples."""

from __future__ import annotations

import pytest
import torch

from lit_grpo.risk.selective import auroc, aurc, brier, excess_aurc, risk_coverage, selective_risk_at

F, T = False, True


def test_risk_coverage_averages_over_the_orders_of_a_tie():
    curve = risk_coverage(torch.tensor([0.5, 0.1, 0.9, 0.5]), torch.tensor([F, F, T, T]))
    # sorted: 0.1 (F), tie 0.5 of (F, T) -> each counts 0.5 error, 0.9 (T): covered errors 0, 0.5, 1, 2
    assert curve.tolist() == pytest.approx([0.0, 0.25, 1 / 3, 0.5], abs=1e-12)
    assert aurc(torch.tensor([0.5, 0.1, 0.9, 0.5]), torch.tensor([F, F, T, T])) == pytest.approx(
        (0 + 0.25 + 1 / 3 + 0.5) / 4, abs=1e-12)


def test_excess_aurc_is_zero_for_a_perfect_ranking_and_positive_otherwise():
    errors = torch.tensor([F, F, F, T])
    assert excess_aurc(torch.tensor([0.1, 0.2, 0.3, 0.9]), errors) == pytest.approx(0.0, abs=1e-12)
    # the error ranked first: risks 1, 1/2, 1/3, 1/4; the perfect ranking's mean is 1/16
    worst = excess_aurc(torch.tensor([0.9, 0.2, 0.3, 0.1]), errors)
    assert worst == pytest.approx((1 + 1 / 2 + 1 / 3 + 1 / 4) / 4 - 1 / 16, abs=1e-12)


def test_selective_risk_at_a_coverage_and_auroc_and_brier():
    scores, errors = torch.tensor([0.1, 0.2, 0.3, 0.4, 0.9]), torch.tensor([F, T, F, F, T])
    assert selective_risk_at(scores, errors, 0.8) == pytest.approx(0.25, abs=1e-12)  # 4 covered, 1 wrong
    assert selective_risk_at(scores, errors, 0.5) == pytest.approx(1 / 3, abs=1e-12)  # ceil(2.5) = 3 covered
    # pairs (error, right) ranked correctly: 0.9 beats all three; 0.2 beats 0.1 only -> 4 of 6
    assert auroc(scores, errors) == pytest.approx(4 / 6, abs=1e-6)
    assert auroc(torch.tensor([0.5, 0.5]), torch.tensor([T, F])) == pytest.approx(0.5, abs=1e-6)  # a tie: half
    assert auroc(scores, torch.zeros(5, dtype=torch.bool)) != auroc(scores, torch.zeros(5, dtype=torch.bool))
    assert brier(torch.tensor([0.2, 0.6], dtype=torch.float64), torch.tensor([F, T])) == pytest.approx((0.04 + 0.16) / 2, abs=1e-12)
