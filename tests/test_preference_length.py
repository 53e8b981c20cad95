"""Online-DPO pairs and loss, and DAPO's overlong penalty, by hand."""

import math

import pytest
import torch

from lit_grpo.losses import best_worst_pairs, dpo_loss, overlong_penalty


def test_best_worst_pairs():
    chosen, rejected, valid = best_worst_pairs(torch.tensor([[0.0, 2.0, 1.0], [1.0, 1.0, 1.0], [3.0, -1.0, 3.0]]))
    assert chosen.tolist() == [1, 0, 0] and rejected.tolist() == [0, 0, 1]
    assert valid.tolist() == [True, False, True]  # a tied group gives no pair


def test_dpo_loss_by_hand():
    # pair 1: (0.5) - (-0.5) = 1, beta 0.1 -> -log sigmoid(0.1) = 0.6443967;
    # pair 2: (-1 - 0) - (0 - 0) = -1 -> -log sigmoid(-0.1) = 0.7443967; mean 0.6943967
    policy_c = torch.tensor([-1.5, -3.0], requires_grad=True)
    loss, stats = dpo_loss(policy_c, torch.tensor([-2.5, -2.0]), torch.tensor([-2.0, -2.0]),
                           torch.tensor([-2.0, -2.0]), beta=0.1)
    assert loss.item() == pytest.approx((0.6443967 + 0.7443967) / 2, abs=1e-6)
    assert stats["accuracy"].item() == 0.5 and stats["reward_margin"].item() == pytest.approx(0.0, abs=1e-7)
    loss.backward()
    # d/d pi_c of -log sigmoid(m) / 2 = -(1 - sigmoid(m)) * beta / 2
    expected = [-(1 - 1 / (1 + math.exp(-0.1))) * 0.05, -(1 - 1 / (1 + math.exp(0.1))) * 0.05]
    torch.testing.assert_close(policy_c.grad, torch.tensor(expected), rtol=0, atol=1e-7)


def test_dpo_loss_without_pairs_is_zero():
    empty = torch.zeros(0)
    loss, stats = dpo_loss(empty, empty, empty, empty, beta=0.1)
    assert loss.item() == 0.0 and stats["accuracy"].item() == 0.0


def test_overlong_penalty_by_hand():
    # L_max 20, cache 5: soft zone 15..20; 17 -> (15 - 17) / 5 = -0.4
    penalty = overlong_penalty(torch.tensor([10, 15, 17, 20, 21]), max_new_tokens=20, cache=5)
    torch.testing.assert_close(penalty, torch.tensor([0.0, 0.0, -0.4, -1.0, -1.0]), rtol=0, atol=1e-7)
    with pytest.raises(ValueError, match="cache"):
        overlong_penalty(torch.tensor([1]), max_new_tokens=4, cache=0)
