"""Chain rollouts' returns and credit (docs/guide.md#multi-round-tasks-and-tree-rollouts, #rewards-per-turn).

Under ``rollout: chains`` each child of a root is one episode: a single path of turns (policy rows), possibly closed
by a token-less no-answer child whose reward the turn before it earned. A chain's return is the sum of its rewards;
with ``turn_credit: episode`` every turn of a chain takes the group advantage of that return over the root's chains
(``chain_advantages``), otherwise each turn takes its own (``chain_turn_advantages``, the tensor maths of
``losses/turn_credit.py`` over the group). A chain whose episode no reward scored (``scorable`` False on a node) gets
0 and stays out of its group's statistics.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from lit_grpo.losses import group_advantages
from lit_grpo.losses.turn_credit import turn_advantages
from lit_grpo.tree.nodes import Node, SegmentNode, depth_first


def carries_tokens(node: Node) -> bool:
    """Whether ``node`` is a policy row: a segment with tokens (the root and a no-answer closing carry none)."""
    return isinstance(node, SegmentNode) and bool(node.segment)


def chain_returns(root: Node) -> list[float]:
    """The return (sum of rewards) of each chain under the root; every chain is a single path.

    Example: root -> [1.0 -> [0.5], -1.0] gives [1.5, -1.0]."""
    returns = []
    for child in root.children:
        total, node = 0.0, child
        while True:
            total += node.reward
            if not node.children:
                break
            (node,) = node.children
        returns.append(total)
    return returns


def chain_rows(roots: Sequence[Node]) -> tuple[torch.Tensor, torch.Tensor]:
    """For chain rollouts, each policy row's episode (chain) id ``[N]`` and its reward ``[N]``: the segment's own
    reward plus that of a token-less child (the no-answer closing of a question cut off at ``max_depth``), which
    has no row of its own. Rows in ``policy_nodes`` order, chain ids counted over all roots."""
    episodes: list[int] = []
    rewards: list[float] = []
    chain = -1
    for root in roots:
        for first in root.children:
            chain += 1
            for node in depth_first(first):
                if carries_tokens(node):
                    episodes.append(chain)
                    rewards.append(node.reward)
                else:  # no tokens: a closing, whose reward the question before it earned
                    rewards[-1] += node.reward
    return torch.tensor(episodes), torch.tensor(rewards)


def scorable_chains(root: Node) -> list[bool]:
    """For each chain under ``root``, whether a reward scored its episode (no ``SegmentNode`` in it unscorable)."""
    return [all(node.scorable for node in depth_first(chain) if isinstance(node, SegmentNode))
            for chain in root.children]


def chain_advantages(root: Node, advantage_mode: str) -> list[float]:
    """The group advantage of each chain's return under ``root``; a chain whose episode no reward scored
    (``scorable`` False on a node) gets 0 and stays out of its group's statistics."""
    returns = chain_returns(root)
    scorable = scorable_chains(root)
    kept = [r for r, s in zip(returns, scorable) if s]
    if not kept:
        return [0.0] * len(returns)
    advantages = iter(group_advantages(torch.tensor([kept], dtype=torch.float64), advantage_mode)[0].tolist())
    return [next(advantages) if s else 0.0 for s in scorable]


def chain_turn_rewards(chain: Node) -> list[float]:
    """The reward of each turn (policy row) of one chain, in order: the segment's own reward plus that of a
    token-less child (the no-answer closing), as ``chain_rows`` gives them."""
    rewards: list[float] = []
    for node in depth_first(chain):
        if carries_tokens(node):
            rewards.append(node.reward)
        elif rewards:
            rewards[-1] += node.reward
    return rewards


def chain_turn_advantages(root: Node, turn_credit: str, advantage_mode: str) -> list[list[float]]:
    """Each chain's per-turn advantages under ``root`` (``losses.turn_credit.turn_advantages`` over the group of
    chains, ``grpo`` dividing ``per_turn_index``'s by the std); a chain whose episode no reward scored gets 0 on
    every turn and stays out of the group. Example: chains with turn rewards [1, 2], [3], [0], reward_to_go:
    [[1.5, 2.0], [1.5], [-3.0]]."""
    chains = [chain_turn_rewards(chain) for chain in root.children]
    scorable = scorable_chains(root)
    kept = [rewards for rewards, s in zip(chains, scorable) if s]
    if not kept:
        return [[0.0] * len(rewards) for rewards in chains]
    width = max(len(rewards) for rewards in kept)
    table = torch.tensor([rewards + [0.0] * (width - len(rewards)) for rewards in kept], dtype=torch.float64)
    running = torch.tensor([[t < len(rewards) for t in range(width)] for rewards in kept])
    rows = iter(turn_advantages(table, running, turn_credit, normalise=advantage_mode == "grpo").tolist())
    return [next(rows)[:len(rewards)] if s else [0.0] * len(rewards) for rewards, s in zip(chains, scorable)]
