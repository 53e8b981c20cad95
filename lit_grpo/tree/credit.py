"""Each policy row's credit in an epoch of trees or chains (docs/guide.md#multi-round-tasks-and-tree-rollouts): the
advantage the module trains every row with, and which rows count in the loss. Rows are the ``policy_nodes`` of
the trees, trees in order (``buffers/tree_layout.py`` lays them out in that order)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal, Protocol, get_args

import torch

from lit_grpo.losses.advantages import check_choice
from lit_grpo.tree.advantages import assign_advantages, flat_sibling_nodes
from lit_grpo.tree.chains import carries_tokens, chain_advantages, chain_turn_advantages
from lit_grpo.tree.nodes import Node, depth_first, policy_nodes

FlatGroups = Literal["count", "drop"]
FLAT_GROUPS: tuple[str, ...] = get_args(FlatGroups)


class TreeRollouts(Protocol):
    """An epoch's trees as the rollout buffer holds them: ``trees`` (one root per prompt) and ``tree_mode``
    (``tree`` or ``chains``)."""

    @property
    def trees(self) -> Sequence[Any] | None: ...
    @property
    def tree_mode(self) -> str | None: ...


def tree_row_advantages(buffer: TreeRollouts, advantage_mode: str, value_mode: str,
                        std_scope: str = "tree", turn_credit: str = "episode") -> torch.Tensor:
    """One advantage per policy node (row), also written into each node's ``advantage``: tree-relative for
    ``tree`` rollouts (``assign_advantages``); for ``chains``, the group advantage of each chain's return on every
    segment of that chain (``turn_credit`` ``episode``), or each turn's own (``chain_turn_advantages``), a
    token-less closing taking the advantage of the turn before it.  -> ``[N]``."""
    trees = list(buffer.trees or ())
    if buffer.tree_mode == "tree":
        for root in trees:
            assign_advantages(root, value_mode, std_scope=std_scope)
    elif turn_credit == "episode":
        for root in trees:
            for chain, advantage in zip(root.children, chain_advantages(root, advantage_mode)):
                for node in depth_first(chain):
                    node.advantage = advantage
    else:
        for root in trees:
            for chain, advantages in zip(root.children, chain_turn_advantages(root, turn_credit, advantage_mode)):
                turns, advantage = iter(advantages), 0.0
                for node in depth_first(chain):  # a token-less closing takes the advantage of the turn before it
                    advantage = next(turns) if carries_tokens(node) else advantage
                    node.advantage = advantage
    return torch.tensor([node.advantage for root in trees for node in policy_nodes(root)])  # [N]


def loss_rows(roots: Sequence[Node], flat_groups: str) -> torch.Tensor | None:
    """Which policy rows count in the loss, in row order ``[N]`` bool: with ``drop``, every row but those of a flat
    sibling group (all its Q equal, an only child included, or the whole tree flat: ``flat_sibling_nodes``),
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
