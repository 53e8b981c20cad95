"""Per-turn credit of chains (issue 58 §3): each turn's advantage from the turns' rewards, worked by hand; the
default (the whole episode's return) as it was; the rules that pair a credit with its advantage mode; and, exactly
over an enumerated toy, that the leave-one-out reward-to-go is unbiased where the policy decides when to stop and
per-turn-index normalisation is not."""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import pytest
import torch

from lit_grpo.losses.turn_credit import rewards_to_go, turn_advantages
from lit_grpo.policy.knob_rules import module_knob_problems
from lit_grpo.run.rules import combination_problems
from lit_grpo.tree import (
    SegmentNode,
    carries_tokens,
    chain_returns,
    chain_rows,
    chain_turn_advantages,
    chain_turn_rewards,
    scorable_chains,
    tree_row_advantages,
)

# A group of three episodes of one prompt, of 3, 1 and 2 turns, with their turns' rewards:
#   A: [1.0, -0.25, 1.0]   reward-to-go [1.75, 0.75, 1.0]
#   B: [2.0]               reward-to-go [2.0, (0), (0)]
#   C: [0.0, 1.0]          reward-to-go [1.0, 1.0, (0)]       (0): ended, counting 0
REWARDS = torch.tensor([[1.0, -0.25, 1.0], [2.0, 0.0, 0.0], [0.0, 1.0, 0.0]])
RUNNING = torch.tensor([[True, True, True], [True, False, False], [True, True, False]])
# reward_to_go: R_i(t) - (sum of the other two's R(t)) / 2
#   t=0: A 1.75 - (2.0 + 1.0)/2 = 0.25   B 2.0 - (1.75 + 1.0)/2 = 0.625   C 1.0 - (1.75 + 2.0)/2 = -0.875
#   t=1: A 0.75 - (0 + 1.0)/2 = 0.25     C 1.0 - (0.75 + 0)/2 = 0.625
#   t=2: A 1.0 - (0 + 0)/2 = 1.0
TO_GO = [[0.25, 0.25, 1.0], [0.625, 0.0, 0.0], [-0.875, 0.625, 0.0]]
# per_turn_index, centred over the running episodes, then summed from t on:
#   t=0: rewards [1, 2, 0], mean 1 -> [0, 1, -1]; t=1: A, C running, [-0.25, 1], mean 0.375 -> A -0.625, C 0.625;
#   t=2: A alone -> 0.   A: [0 - 0.625, -0.625, 0]; B: [1]; C: [-1 + 0.625, 0.625]
PER_INDEX = [[-0.625, -0.625, 0.0], [1.0, 0.0, 0.0], [-0.375, 0.625, 0.0]]


def test_rewards_to_go_sum_from_each_turn_to_the_last():
    assert rewards_to_go(torch.tensor([[1.0, 2.0, 3.0], [0.5, 0.0, -1.0]])).tolist() == [[6.0, 5.0, 3.0],
                                                                                         [-0.5, -1.0, -1.0]]


def test_reward_to_go_less_the_leave_one_out_mean_an_ended_episode_counting_0():
    assert turn_advantages(REWARDS, RUNNING, "reward_to_go").tolist() == TO_GO
    past_the_end = torch.where(RUNNING, REWARDS, 9.0)  # what lies past an episode's end is not read
    assert turn_advantages(past_the_end, RUNNING, "reward_to_go").tolist() == TO_GO
    assert turn_advantages(past_the_end, RUNNING, "per_turn_index").tolist() == PER_INDEX


def test_per_turn_index_centres_each_turn_over_the_episodes_still_running():
    assert turn_advantages(REWARDS, RUNNING, "per_turn_index").tolist() == PER_INDEX


def test_per_turn_index_with_grpo_divides_each_index_by_its_std():
    # t=0: [0, 1, -1] / (sqrt(2/3) + 1e-6) = [0, 1.2247434, -1.2247434]; t=1: [-0.625, 0.625] / (0.625 + 1e-6)
    s0, s1 = 1 / ((2 / 3) ** 0.5 + 1e-6), 0.625 / (0.625 + 1e-6)
    expected = [[-s1, -s1, 0.0], [s0, 0.0, 0.0], [-s0 + s1, s1, 0.0]]  # float64 throughout
    got = turn_advantages(REWARDS.double(), RUNNING, "per_turn_index", normalise=True)
    assert got.flatten().tolist() == pytest.approx([v for row in expected for v in row], abs=1e-12)


def test_a_flat_turn_index_and_a_group_of_one_give_exactly_0():
    flat = turn_advantages(torch.full((8, 2), 0.7), torch.ones(8, 2, dtype=torch.bool), "reward_to_go")
    assert flat.abs().max().item() == 0.0  # the formula alone leaves rounding noise in float32
    assert turn_advantages(torch.tensor([[1.0, 2.0]]), torch.ones(1, 2, dtype=torch.bool)).tolist() == [[0.0, 0.0]]


def chain(*rewards, closing=None):
    """One episode as a chain of segment nodes (each with a token), rewards in turn order; ``closing``: the reward
    of a token-less closing after the last (a question cut off at the turn limit)."""
    nodes = [SegmentNode(reward=r, segment=(5,), terminal=False) for r in rewards]
    for parent, child in zip(nodes, nodes[1:]):
        parent.children.append(child)
    if closing is None:
        nodes[-1].terminal = True
    else:
        nodes[-1].children.append(SegmentNode(reward=closing, terminal=True))
    return nodes[0]


def group():
    # C's last turn earns 0.75 and its no-answer closing 0.25: the turn's reward is 1.0, as chain_rows adds them
    return SegmentNode(children=[chain(1.0, -0.25, 1.0), chain(2.0), chain(0.0, 0.75, closing=0.25)])


def test_chains_rows_get_their_turns_advantages_in_row_order():
    buffer = SimpleNamespace(tree_mode="chains", trees=[group()])
    rows = tree_row_advantages(buffer, "rloo", "mean", turn_credit="reward_to_go")
    assert rows.tolist() == [0.25, 0.25, 1.0, 0.625, -0.875, 0.625]  # A's three turns, B's, C's two
    assert chain_turn_advantages(group(), "per_turn_index", "centered") == [[-0.625, -0.625, 0.0], [1.0],
                                                                            [-0.375, 0.625]]
    s0, s1 = 1 / ((2 / 3) ** 0.5 + 1e-6), 0.625 / (0.625 + 1e-6)  # grpo divides by each index's std (above)
    divided = chain_turn_advantages(group(), "per_turn_index", "grpo")
    assert [v for row in divided for v in row] == pytest.approx([-s1, -s1, 0.0, s0, -s0 + s1, s1], abs=1e-12)


def test_the_default_gives_every_turn_its_episodes_group_advantage_of_the_summed_return():
    # returns: A 1.75, B 2.0, C 1.0; rloo: A 1.75 - 1.5 = 0.25, B 2.0 - 1.375 = 0.625, C 1.0 - 1.875 = -0.875
    rows = tree_row_advantages(SimpleNamespace(tree_mode="chains", trees=[group()]), "rloo", "mean")
    assert rows.tolist() == [0.25, 0.25, 0.25, 0.625, -0.875, -0.875]


def test_a_chains_return_turn_rewards_and_rows_add_a_closing_to_the_turn_before_it():
    root = group()
    root.children[1].scorable = False
    assert chain_returns(root) == [1.75, 2.0, 1.0]  # C: 0.0 + 0.75 + 0.25
    assert [chain_turn_rewards(chain) for chain in root.children] == [[1.0, -0.25, 1.0], [2.0], [0.0, 1.0]]
    episodes, rewards = chain_rows([root, group()])  # chain ids count on over the second root
    assert episodes.tolist() == [0, 0, 0, 1, 2, 2, 3, 3, 3, 4, 5, 5]
    assert rewards.tolist() == [1.0, -0.25, 1.0, 2.0, 0.0, 1.0] * 2
    closing = root.children[2].children[0].children[0]
    assert [carries_tokens(node) for node in (root, root.children[2], closing)] == [False, True, False]
    assert scorable_chains(root) == [True, False, True]


def test_an_unscored_episode_gets_0_and_stays_out_of_its_group():
    root = group()
    root.children[1].scorable = False  # B: no reward applied; A and C alone: t=0 A 1.75 - 1.0, C 1.0 - 1.75
    assert chain_turn_advantages(root, "reward_to_go", "rloo") == [[0.75, -0.25, 1.0], [0.0], [-0.75, 0.25]]


def test_each_credit_takes_its_advantage_mode_and_chains_only():
    args = {"loss_variant": "clip", "advantage_mode": "grpo", "turn_credit": "reward_to_go"}
    assert any("turn_credit 'reward_to_go' with advantage_mode 'grpo'" in p for p in module_knob_problems(args))
    assert module_knob_problems({**args, "advantage_mode": "rloo"}) == []
    assert module_knob_problems({**args, "turn_credit": "per_turn_index"}) == []
    assert module_knob_problems({**args, "turn_credit": "episode", "advantage_mode": "max"}) == []
    assert "model.turn_credit 'reward_to_go' with data.rollout 'tree'" in \
        combination_problems({"turn_credit": "reward_to_go"}, {"rollout": "tree"})[0]
    assert combination_problems({"turn_credit": "reward_to_go"}, {"rollout": "chains"}) == []


def expected_gradient_of_continuing(credit: str, c: float = 1.0, size: int = 3) -> float:
    """E[A_0(turn 0) * d log pi(a_0) / d theta] for a policy that continues with probability 1/2 (theta its logit:
    the score is 1{continue} - 1/2), computed exactly over every joint outcome of a group of ``size`` episodes.
    Each episode draws an outcome b in {0, 1} (probability 1/2, whatever it does) and either stops (turn rewards
    [b]) or takes an extra turn that earns +c, then -c with its answer (turn rewards [c, b - c]): continuing is
    worth exactly what stopping is, so the true gradient is 0."""
    total = 0.0
    for outcomes in itertools.product([(False, 0), (False, 1), (True, 0), (True, 1)], repeat=size):
        rewards = torch.tensor([[c, b - c] if go else [b, 0.0] for go, b in outcomes], dtype=torch.float64)
        running = torch.tensor([[True, go] for go, _ in outcomes])
        if credit == "episode":  # rloo on the returns, the same on every turn
            returns = rewards.sum(dim=1)
            advantage = returns[0] - (returns.sum() - returns[0]) / (size - 1)
        else:
            advantage = turn_advantages(rewards, running, credit)[0, 0]
        total += float(advantage) * ((1.0 if outcomes[0][0] else 0.0) - 0.5) / 4 ** size
    return total


def test_continuing_for_plus_c_then_minus_c_has_expected_advantage_0_with_leave_one_out_reward_to_go():
    assert expected_gradient_of_continuing("reward_to_go") == 0.0
    assert expected_gradient_of_continuing("episode") == 0.0
    # per turn index: turn 0 centres [c or b] over all three, turn 1 centres [b - c] over the continuers only, so
    # the -c is absorbed by turn 1's mean: E = (2/3) * E[r_0(turn 0) * score] = (2/3) * (1/4) * (c - E[b])
    # = (2/3) * (1/4) * (1 - 1/2) = 1/12, a bonus for continuing
    assert expected_gradient_of_continuing("per_turn_index") == pytest.approx(1 / 12, abs=1e-12)
