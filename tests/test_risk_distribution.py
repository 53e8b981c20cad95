"""The scoring and loss of benchmarks/research/risk/risk_distribution.py (atoms against quantiles), worked out by
hand."""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout, for benchmarks.*

from benchmarks.research.risk.risk_distribution import crps, pinball_loss, quantile_levels  # noqa: E402


def test_crps_of_discrete_distributions_by_hand():
    values = torch.tensor([[-1.0, 1.0], [-1.0, 1.0], [0.0, 0.5]])
    probs = torch.tensor([[0.5, 0.5], [0.25, 0.75], [1.0, 0.0]])
    outcomes = torch.tensor([1.0, -1.0, 0.25])
    # row 0: E|X-y| = 0.5*2 = 1, E|X-X'| = 2 * 0.5*0.5*2 = 1 -> 0.5
    # row 1: E|X-y| = 0.75*2 = 1.5, E|X-X'| = 2 * 0.25*0.75*2 = 0.75 -> 1.125
    # row 2: a point mass at 0 against 0.25 -> 0.25
    assert torch.allclose(crps(values, probs, outcomes), torch.tensor([0.5, 1.125, 0.25]), atol=1e-7, rtol=0)


def test_crps_is_zero_for_a_point_mass_on_the_outcome_and_equal_for_equal_distributions():
    assert crps(torch.tensor([[0.3, 0.9]]), torch.tensor([[1.0, 0.0]]), torch.tensor([0.3])).item() == 0.0
    atoms = crps(torch.tensor([[-1.0, 0.0, 1.0]]), torch.tensor([[0.5, 0.0, 0.5]]), torch.tensor([0.0]))
    quantiles = crps(torch.tensor([[-1.0, 1.0]]), torch.tensor([[0.5, 0.5]]), torch.tensor([0.0]))
    assert atoms.item() == quantiles.item() == 0.5  # E|X-0| = 1, E|X-X'| = 1


def test_quantile_levels_and_pinball_loss_by_hand():
    assert torch.equal(quantile_levels(4), torch.tensor([0.125, 0.375, 0.625, 0.875]))
    quantiles = torch.tensor([[0.0, 0.0], [0.0, 2.0]])  # levels 1/4, 3/4
    # row 0, y = 1: gaps [1, 1] -> [1/4, 3/4]; row 1, y = 1: gaps [1, -1] -> [1/4, (3/4 - 1) * -1 = 1/4]
    assert pinball_loss(quantiles, torch.tensor([1.0, 1.0])).item() == (0.25 + 0.75 + 0.25 + 0.25) / 4
