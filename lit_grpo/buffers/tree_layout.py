"""Trees as training rows (docs/guide.md#multi-round-tasks-and-tree-rollouts): one right-padded row per policy node
(``tree.policy_nodes``), the epoch's rollout buffer of them, and each row's episode for chains. Only layout: the
values, advantages and chain credit of those rows are ``lit_grpo.tree``'s."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from lit_grpo.buffers.buffer import RolloutBuffer
from lit_grpo.tasks.base import prompt_text
from lit_grpo.tree import Node, SegmentNode, chain_rows, policy_nodes


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
