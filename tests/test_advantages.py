"""Group advantages (design §4) against hand-computed numbers and a slow per-group loop."""

import math
import statistics

import pytest
import torch

from lit_grpo.losses import ADVANTAGE_MODES, batch_std_advantages, group_advantages


def test_grpo_worked_example():
    # rewards [0, 1, 2]: mean 1, population std sqrt(2/3) = 0.8164966; A = +-1 / (0.8164966 + 1e-6) = +-1.2247434
    adv = group_advantages(torch.tensor([[0.0, 1.0, 2.0]]), mode="grpo")
    assert torch.allclose(adv, torch.tensor([[-1.2247434, 0.0, 1.2247434]]), rtol=0, atol=1e-6)


def test_grpo_uses_population_std_and_eps():
    # rewards [1, 2, 6]: mean 3, population variance (4 + 1 + 9) / 3 = 14/3, std 2.1602469 (sample std would be
    # 2.6457513); with eps = 0.5: A = [-2, -1, 3] / 2.6602469 = [-0.7518097, -0.3759049, 1.1277146]
    rewards = torch.tensor([[1.0, 2.0, 6.0]])
    assert torch.allclose(
        group_advantages(rewards, mode="grpo"), torch.tensor([[-0.9258196, -0.4629098, 1.3887294]]), rtol=0, atol=1e-6
    )
    assert torch.allclose(
        group_advantages(rewards, mode="grpo", eps=0.5),
        torch.tensor([[-0.7518097, -0.3759049, 1.1277146]]),
        rtol=0,
        atol=1e-6,
    )


@pytest.mark.parametrize(
    "mode, expected",
    [
        ("raw", [[1.0, 2.0, 6.0], [4.0, 0.0, 2.0]]),
        # mean 3 and mean 2
        ("centered", [[-2.0, -1.0, 3.0], [2.0, -2.0, 0.0]]),
        ("drgrpo", [[-2.0, -1.0, 3.0], [2.0, -2.0, 0.0]]),
        # r_i - mean of the others: 1 - 8/2 = -3, 2 - 7/2 = -1.5, 6 - 3/2 = 4.5; 4 - 1 = 3, 0 - 3 = -3, 2 - 2 = 0
        ("rloo", [[-3.0, -1.5, 4.5], [3.0, -3.0, 0.0]]),
        # only the best completion keeps its centred reward
        ("max", [[0.0, 0.0, 3.0], [2.0, 0.0, 0.0]]),
    ],
)
def test_modes_by_hand(mode, expected):
    rewards = torch.tensor([[1.0, 2.0, 6.0], [4.0, 0.0, 2.0]])
    assert torch.equal(group_advantages(rewards, mode=mode), torch.tensor(expected))


def test_max_mode_keeps_every_tied_best():
    # mean 3.75; the two 6s are both best: 6 - 3.75 = 2.25
    adv = group_advantages(torch.tensor([[1.0, 6.0, 2.0, 6.0]]), mode="max")
    assert torch.equal(adv, torch.tensor([[0.0, 2.25, 0.0, 2.25]]))


@pytest.mark.parametrize("mode", ADVANTAGE_MODES)
def test_flat_group_is_exactly_zero(mode):
    # eight rewards of 0.7 in float32: the bare formula gives ~0.056 from rounding noise; the contract says 0
    rewards = torch.full((1, 8), 0.7, dtype=torch.float32)
    adv = group_advantages(rewards, mode=mode)
    if mode == "raw":
        assert torch.equal(adv, rewards)
    else:
        assert torch.equal(adv, torch.zeros(1, 8))


def test_flat_group_zeroed_but_other_groups_kept():
    rewards = torch.tensor([[0.7] * 4, [0.0, 0.0, 1.0, 1.0]])
    adv = group_advantages(rewards, mode="grpo")
    # second group: mean 0.5, std 0.5 -> +-1 / (0.5 + 1e-6) = +-0.999998
    assert torch.equal(adv[0], torch.zeros(4))
    assert torch.allclose(adv[1], torch.tensor([-0.999998, -0.999998, 0.999998, 0.999998]), rtol=0, atol=1e-6)


@pytest.mark.parametrize("mode", ADVANTAGE_MODES)
def test_group_of_one(mode):
    rewards = torch.tensor([[3.0], [-1.0]])
    expected = rewards if mode == "raw" else torch.zeros(2, 1)
    assert torch.equal(group_advantages(rewards, mode=mode), expected)


def slow_advantages(group: list[float], mode: str, eps: float = 1e-6) -> list[float]:
    """One group at a time in plain Python: the reference the vectorised code must match."""
    if mode == "raw":
        return list(group)
    if max(group) == min(group):
        return [0.0] * len(group)
    mean = sum(group) / len(group)
    if mode == "grpo":
        std = statistics.pstdev(group)
        return [(r - mean) / (std + eps) for r in group]
    if mode == "rloo":
        total = sum(group)
        return [r - (total - r) / (len(group) - 1) for r in group]
    if mode == "max":
        best = max(group)
        return [r - mean if r == best else 0.0 for r in group]
    return [r - mean for r in group]


@pytest.mark.parametrize("mode", ADVANTAGE_MODES)
def test_vectorised_matches_per_group_loop(mode):
    gen = torch.Generator().manual_seed(0)
    rewards = torch.randint(0, 4, (16, 6), generator=gen).to(torch.float64)  # ties and flat groups both occur
    rewards[3] = 2.0
    rewards[5] += torch.rand(6, generator=gen, dtype=torch.float64)
    expected = torch.tensor([slow_advantages(row.tolist(), mode) for row in rewards], dtype=torch.float64)
    assert torch.allclose(group_advantages(rewards, mode=mode), expected, rtol=0, atol=1e-12)


def test_batch_std_option():
    # groups [0, 2] and [1, 1]: centred [-1, 1] and [0, 0]; batch population std of [0, 2, 1, 1] = sqrt(0.5)
    adv = batch_std_advantages(torch.tensor([[0.0, 2.0], [1.0, 1.0]]))
    scale = 1 / (math.sqrt(0.5) + 1e-6)
    assert torch.allclose(adv, torch.tensor([[-scale, scale], [0.0, 0.0]]), rtol=0, atol=1e-6)


def test_bad_mode_and_shape():
    with pytest.raises(ValueError, match="raw, centered, grpo, drgrpo, rloo, max"):
        group_advantages(torch.zeros(2, 3), mode="zscore")
    with pytest.raises(ValueError, match=r"\[B, G\]"):
        group_advantages(torch.zeros(6), mode="grpo")
