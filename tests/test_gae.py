"""GAE and KL-shaped per-token rewards (design §5): both worked examples and a plain loop."""

import pytest
import torch

from lit_grpo.losses import episode_gae, gae, kl_shaped_rewards


def test_worked_example_kl_in_rewards():
    # R = 2, k1 = 0.03, 0.02, 0.04, 0.01, beta 1: r = [-0.03, -0.02, -0.04, 1.99]; gamma = lam = 1, V = 0, so the
    # returns are suffix sums: 1.90, 1.93, 1.95, 1.99
    mask = torch.ones(1, 4, dtype=torch.bool)
    rewards = kl_shaped_rewards(torch.tensor([2.0]), torch.tensor([[0.03, 0.02, 0.04, 0.01]]), mask, kl_coef=1.0)
    torch.testing.assert_close(rewards, torch.tensor([[-0.03, -0.02, -0.04, 1.99]]), rtol=0, atol=1e-6)
    advantages, returns = gae(rewards, torch.zeros(1, 4), mask, gamma=1.0, lam=1.0)
    torch.testing.assert_close(returns, torch.tensor([[1.90, 1.93, 1.95, 1.99]]), rtol=0, atol=1e-6)
    torch.testing.assert_close(advantages, returns, rtol=0, atol=0)  # V = 0


def test_worked_example_with_values():
    # t2: delta = 1 - 0.7 = 0.3; t1: 0.9 * 0.7 - 0.6 = 0.03, A = 0.03 + 0.72 * 0.3 = 0.246;
    # t0: 0.9 * 0.6 - 0.5 = 0.04, A = 0.04 + 0.72 * 0.246 = 0.21712; returns A + V
    advantages, returns = gae(torch.tensor([[0.0, 0.0, 1.0]]), torch.tensor([[0.5, 0.6, 0.7]]),
                              torch.ones(1, 3, dtype=torch.bool), gamma=0.9, lam=0.8)
    torch.testing.assert_close(advantages, torch.tensor([[0.21712, 0.246, 0.3]]), rtol=0, atol=1e-6)
    torch.testing.assert_close(returns, torch.tensor([[0.71712, 0.846, 1.0]]), rtol=0, atol=1e-6)


def test_masked_tokens_are_skipped_and_zero():
    # the same example with a prompt token before and an environment token between t0 and t1: same numbers on the
    # counted tokens, 0 elsewhere (the value 9.0 under the masked tokens must not leak in)
    mask = torch.tensor([[False, True, False, True, True]])
    advantages, returns = gae(torch.tensor([[5.0, 0.0, 5.0, 0.0, 1.0]]), torch.tensor([[9.0, 0.5, 9.0, 0.6, 0.7]]),
                              mask, gamma=0.9, lam=0.8)
    torch.testing.assert_close(advantages, torch.tensor([[0.0, 0.21712, 0.0, 0.246, 0.3]]), rtol=0, atol=1e-6)
    torch.testing.assert_close(returns, torch.tensor([[0.0, 0.71712, 0.0, 0.846, 1.0]]), rtol=0, atol=1e-6)


def test_kl_shaped_rewards_last_token_and_empty_row():
    mask = torch.tensor([[True, True, False], [False, False, False]])
    rewards = kl_shaped_rewards(torch.tensor([1.0, 3.0]), torch.tensor([[0.1, 0.2, 0.3], [0.1, 0.1, 0.1]]), mask, 0.5)
    # row 0: -0.05, 1 - 0.1 = 0.9 on its last counted token (column 1), 0 on the padding; row 1 counts nothing
    torch.testing.assert_close(rewards, torch.tensor([[-0.05, 0.9, 0.0], [0.0, 0.0, 0.0]]), rtol=0, atol=1e-7)


def slow_gae(rewards, values, mask, gamma, lam):
    n, t = len(rewards), len(rewards[0])
    adv = [[0.0] * t for _ in range(n)]
    ret = [[0.0] * t for _ in range(n)]
    for i in range(n):
        counted = [j for j in range(t) if mask[i][j]]
        running, next_v = 0.0, 0.0
        for j in reversed(counted):
            delta = rewards[i][j] + gamma * next_v - values[i][j]
            running = delta + gamma * lam * running
            adv[i][j], ret[i][j] = running, running + values[i][j]
            next_v = values[i][j]
    return torch.tensor(adv, dtype=torch.float64), torch.tensor(ret, dtype=torch.float64)


@pytest.mark.parametrize("gamma, lam", [(1.0, 1.0), (0.9, 0.8), (0.99, 0.0)])
def test_matches_plain_loop_on_random_masked_inputs(gamma, lam):
    gen = torch.Generator().manual_seed(0)
    rewards = torch.randn(6, 9, generator=gen, dtype=torch.float64)
    values = torch.randn(6, 9, generator=gen, dtype=torch.float64)
    mask = torch.rand(6, 9, generator=gen) > 0.3
    mask[2] = False  # an empty row
    advantages, returns = gae(rewards, values, mask, gamma, lam)
    expected_adv, expected_ret = slow_gae(rewards.tolist(), values.tolist(), mask.tolist(), gamma, lam)
    torch.testing.assert_close(advantages, expected_adv, rtol=0, atol=1e-12)
    torch.testing.assert_close(returns, expected_ret, rtol=0, atol=1e-12)


def test_episode_gae_runs_the_rows_of_one_episode_as_one_trajectory():
    # episode 7: row 0 (counted rewards [0, -0.1], V [0.5, 0.4]) then row 2 (a context token, then [0, 1] with
    # V [0.6, 0.7]); episode 3: row 1 alone ([0, -1], V [0.2, 0.1]). gamma 0.9, lam 0.5 (gamma * lam 0.45):
    # episode 7, backwards: 1 - 0.7 = 0.3; 0.9 * 0.7 - 0.6 = 0.03 + 0.45 * 0.3 = 0.165;
    # -0.1 + 0.9 * 0.6 - 0.4 = 0.04 + 0.45 * 0.165 = 0.11425; 0.9 * 0.4 - 0.5 = -0.14 + 0.45 * 0.11425 = -0.0885875
    # episode 3: -1 - 0.1 = -1.1; 0.9 * 0.1 - 0.2 = -0.11 + 0.45 * -1.1 = -0.605
    rewards = torch.tensor([[0.0, -0.1, 0.0], [0.0, -1.0, 0.0], [5.0, 0.0, 1.0]])
    values = torch.tensor([[0.5, 0.4, 0.0], [0.2, 0.1, 0.0], [9.0, 0.6, 0.7]])
    mask = torch.tensor([[True, True, False], [True, True, False], [False, True, True]])
    advantages, returns = episode_gae(rewards, values, mask, torch.tensor([7, 3, 7]), gamma=0.9, lam=0.5)
    expected = torch.tensor([[-0.0885875, 0.11425, 0.0], [-0.605, -1.1, 0.0], [0.0, 0.165, 0.3]])
    torch.testing.assert_close(advantages, expected, rtol=0, atol=1e-7)
    torch.testing.assert_close(returns, torch.where(mask, expected + values, 0.0), rtol=0, atol=1e-7)
    # one row per episode is plain gae
    alone, _ = episode_gae(rewards, values, mask, torch.tensor([0, 1, 2]), gamma=0.9, lam=0.5)
    torch.testing.assert_close(alone, gae(rewards, values, mask, 0.9, 0.5)[0], rtol=0, atol=0)
