"""Trees as training rows (docs/guide.md#multi-round-tasks-and-tree-rollouts): the node that carries tokens, one row per
policy node, chain returns, and the per-row advantages of tree and chain rollouts."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

import torch

from lit_grpo.buffers.buffer import RolloutBuffer
from lit_grpo.losses import group_advantages
from lit_grpo.losses.advantages import check_choice
from lit_grpo.losses.turn_credit import turn_advantages
from lit_grpo.tasks.base import PromptRecord, prompt_text
from lit_grpo.tree import Node, assign_advantages, depth_first, flat_sibling_nodes

FlatGroups = Literal["count", "drop"]
FLAT_GROUPS: tuple[str, ...] = get_args(FlatGroups)


@dataclass(eq=False)
class SegmentNode(Node):
    """A tree node with its tokens: ``context`` (everything before the segment: prompt, ancestors' segments and the
    environment's replies), the policy's ``segment`` with the sampler's ``logprobs``, and the environment's
    ``reply`` to it (for a question), and ``allowed``, the first tokens the sampler was restricted to (the risk
    rule's forced defer; None: unrestricted). Only ``segment`` tokens carry loss."""

    context: tuple[int, ...] = ()
    segment: tuple[int, ...] = ()
    logprobs: tuple[float, ...] = ()
    reply: tuple[int, ...] = ()
    kind: str = "root"
    correct: bool = False
    truncated: bool = False
    record: PromptRecord = field(default_factory=dict)
    allowed: tuple[int, ...] | None = None
    episode: Any = None  # the task's state after this node's turn (a tool task's conversation and environment)
    scorable: bool = True  # False: no reward applied to the episode ending here (its chain's advantage is 0)
    reward_error: str | None = None  # the first error of a reward that failed on the episode ending here


def policy_nodes(root: SegmentNode) -> list[SegmentNode]:
    """The nodes that carry policy tokens, in depth-first order (the root and no-answer closings carry none)."""
    return [n for n in depth_first(root) if isinstance(n, SegmentNode) and n.segment]


def tree_rows(roots: Sequence[SegmentNode], pad_id: int) -> dict[str, torch.Tensor]:
    """One right-padded row per policy node: its context (masked out) then its segment (counted).

    Returns ``input_ids``, ``attention_mask``, ``completion_mask`` and ``sampler_logp`` ``[N, L]`` (None unless
    the engine reported every segment's log-probs), ``rewards``
    ``[N]`` (each node's immediate reward), ``group_sizes`` (rows per tree, trees in order), ``decision_index``
    ``[N]`` (each row's first segment column), ``allowed_ids`` ``[N, C]`` (the first-token restriction, -1
    padding) and ``inferred`` ``[N]`` (the policy chose, unrestricted, to commit: its reward is a return of
    inferring).
    """
    nodes = [node for root in roots for node in policy_nodes(root)]
    width = max(len(n.context) + len(n.segment) for n in nodes)
    input_ids = torch.full((len(nodes), width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(nodes), width), dtype=torch.bool)
    completion_mask = torch.zeros((len(nodes), width), dtype=torch.bool)
    # an engine that reports no log-probs leaves pi_old to the trainer's pass (zeros would be taken for pi_old)
    reported = all(len(n.logprobs) == len(n.segment) for n in nodes)
    sampler_logp = torch.zeros((len(nodes), width)) if reported else None
    for row, node in enumerate(nodes):
        start, end = len(node.context), len(node.context) + len(node.segment)
        input_ids[row, :end] = torch.tensor(node.context + node.segment)
        attention_mask[row, :end] = True
        completion_mask[row, start:end] = True
        if sampler_logp is not None:
            sampler_logp[row, start:end] = torch.tensor(node.logprobs)
    return {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "completion_mask": completion_mask,
        "sampler_logp": sampler_logp,
        "rewards": torch.tensor([n.reward for n in nodes]),
        "group_sizes": torch.tensor([len(policy_nodes(root)) for root in roots]),
        "decision_index": torch.tensor([len(n.context) for n in nodes]),
        "allowed_ids": allowed_table([n.allowed for n in nodes]),
        # a forced defer that went astray (e.g. "?5", malformed) is not an outcome of choosing to infer
        "inferred": torch.tensor([n.terminal and n.allowed is None for n in nodes]),
    }


def allowed_table(allowed: Sequence[tuple[int, ...] | None]) -> torch.Tensor:
    """Per-row allowed first tokens as ``[N, C]`` ids, -1 padding (``C >= 1``; an all -1 row is unrestricted)."""
    width = max([len(a) for a in allowed if a is not None], default=1)
    table = torch.full((len(allowed), width), -1, dtype=torch.long)
    for row, ids in enumerate(allowed):
        if ids is not None:
            table[row, : len(ids)] = torch.tensor(ids)
    return table


def tree_buffer(
    roots: Sequence[SegmentNode], tokenizer: Any, temperature: float, max_new_tokens: int, mode: str,
    rounds: int | None, sequence_budget: int | None = None
) -> RolloutBuffer:
    """The rollout buffer of a batch of trees, ``rounds`` deep at most: one row per policy node, one group per
    tree. A tool task's chains (``mode`` chains, nodes with an ``episode``) also carry each row's episode
    (``chain_sequences``) and the tokens an episode may hold (``sequence_budget``, the task's), so that the loss
    weighs an episode as TRL weighs its multi-turn completion."""
    rows = tree_rows(roots, tokenizer.pad_token_id)
    nodes = [node for root in roots for node in policy_nodes(root)]
    tool_chains = mode == "chains" and any(node.episode is not None for node in nodes)
    sequences = chain_sequences(roots, rows["completion_mask"]) if tool_chains else (None, None, None)
    return RolloutBuffer(
        input_ids=rows["input_ids"],
        attention_mask=rows["attention_mask"],
        completion_mask=rows["completion_mask"],
        rewards=rows["rewards"],
        correct=torch.tensor([n.correct for n in nodes]),
        truncated=torch.tensor([n.truncated for n in nodes]),
        group_size=max(rows["group_sizes"].tolist()),
        temperature=temperature,
        max_new_tokens=max_new_tokens,
        sampler_logp=rows["sampler_logp"],
        prompt_texts=[prompt_text(n.record) for n in nodes],
        completion_texts=[tokenizer.decode(list(n.segment), skip_special_tokens=True) for n in nodes],
        group_sizes=rows["group_sizes"].tolist(),
        trees=list(roots),
        tree_mode=mode,
        decision_index=rows["decision_index"],
        first_token_allowed=rows["allowed_ids"],
        inferred=rows["inferred"],
        tree_rounds=rounds,
        reward_errors=sum(n.reward_error is not None for n in nodes),
        sequence_tokens=sequences[0],
        sequence_rows=sequences[1],
        sequence_ids=sequences[2],
        sequence_budget=sequence_budget if tool_chains else None,
    )


def chain_sequences(roots: Sequence[Node],
                    completion_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Each row's episode as one sequence (``losses.Sequences``): ``(tokens [N], rows [N], ids [N])``, the counted
    tokens (``completion_mask [N, L]``) summed over the rows of the row's chain and that chain's number of rows
    (float), and the chain's number (long). The rows of one chain (a root's child and its descendants) are one
    episode, as TRL's whole multi-turn completion is one sequence. Example: chains of 3 rows (2, 3, 1 tokens) and
    1 row (4): [6, 6, 6, 4], [3, 3, 3, 1], [0, 0, 0, 1]."""
    episodes = chain_rows(roots)[0]  # [N] chain id of each row
    if episodes.shape[0] != completion_mask.shape[0]:
        raise ValueError(f"{episodes.shape[0]} chain rows for a completion mask of {completion_mask.shape[0]} rows")
    count = int(episodes.max()) + 1 if episodes.numel() else 0
    tokens = torch.zeros(count).index_add_(0, episodes, completion_mask.sum(dim=1).float())  # [episodes]
    rows = torch.zeros(count).index_add_(0, episodes, torch.ones(episodes.shape[0]))  # [episodes]
    return tokens[episodes], rows[episodes], episodes


def chain_returns(root: Node) -> list[float]:
    """The return (sum of rewards) of each chain under the root; every chain is a single path."""
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
                if getattr(node, "segment", ()):
                    episodes.append(chain)
                    rewards.append(node.reward)
                else:  # no tokens: a closing, whose reward the question before it earned
                    rewards[-1] += node.reward
    return torch.tensor(episodes), torch.tensor(rewards)


def tree_row_advantages(buffer: RolloutBuffer, advantage_mode: str, value_mode: str,
                        std_scope: str = "tree", turn_credit: str = "episode") -> torch.Tensor:
    """One advantage per policy node (row): tree-relative for ``tree`` rollouts; for ``chains``, the group
    advantage of each chain's return on every segment of that chain (``turn_credit`` ``episode``), or each turn's
    own (``chain_turn_advantages``).  -> ``[N]``."""
    if buffer.tree_mode == "tree":
        for root in buffer.trees:
            assign_advantages(root, value_mode, std_scope=std_scope)
    elif turn_credit == "episode":
        for root in buffer.trees:
            for chain, advantage in zip(root.children, chain_advantages(root, advantage_mode)):
                for node in depth_first(chain):
                    node.advantage = advantage
    else:
        for root in buffer.trees:
            for chain, advantages in zip(root.children, chain_turn_advantages(root, turn_credit, advantage_mode)):
                turns, advantage = iter(advantages), 0.0
                for node in depth_first(chain):  # a token-less closing takes the advantage of the turn before it
                    advantage = next(turns) if getattr(node, "segment", ()) else advantage
                    node.advantage = advantage
    return torch.tensor([node.advantage for root in buffer.trees for node in policy_nodes(root)])  # [N]


def chain_advantages(root: Node, advantage_mode: str) -> list[float]:
    """The group advantage of each chain's return under ``root``; a chain whose episode no reward scored
    (``scorable`` False on a node) gets 0 and stays out of its group's statistics."""
    returns = chain_returns(root)
    scorable = [all(node.scorable for node in depth_first(chain) if isinstance(node, SegmentNode))
                for chain in root.children]
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
        if getattr(node, "segment", ()):
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
    scorable = [all(node.scorable for node in depth_first(chain) if isinstance(node, SegmentNode))
                for chain in root.children]
    kept = [rewards for rewards, s in zip(chains, scorable) if s]
    if not kept:
        return [[0.0] * len(rewards) for rewards in chains]
    width = max(len(rewards) for rewards in kept)
    table = torch.tensor([rewards + [0.0] * (width - len(rewards)) for rewards in kept], dtype=torch.float64)
    running = torch.tensor([[t < len(rewards) for t in range(width)] for rewards in kept])
    rows = iter(turn_advantages(table, running, turn_credit, normalise=advantage_mode == "grpo").tolist())
    return [next(rows)[:len(rewards)] if s else [0.0] * len(rewards) for rewards, s in zip(chains, scorable)]


def loss_rows(roots: Sequence[Node], flat_groups: str) -> torch.Tensor | None:
    """Which policy rows count in the loss, in row order ``[N]`` bool: with ``drop``, every row but those of a flat
    sibling group (all its Q equal, an only child included, or the whole tree flat: ``tree.flat_sibling_nodes``),
    as DAPO leaves flat prompt groups out; with ``count``, None (every row counts, a flat group's with advantage
    0). Reads the values ``assign_advantages`` wrote. Example: root -> [answer 1, question -0.1 -> [answer 1]]: the
    question's only child is flat, so ``drop`` keeps [True, True, False]."""
    check_choice("tree flat groups", flat_groups, FLAT_GROUPS)
    if flat_groups == "count":
        return None
    kept: list[bool] = []
    for root in roots:
        flat = flat_sibling_nodes(root, {node: node.value for node in depth_first(root)})
        kept += [node not in flat for node in policy_nodes(root)]
    return torch.tensor(kept, dtype=torch.bool)
