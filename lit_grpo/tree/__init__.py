"""The tree maths of multi-round rollouts, in one place (docs/guide.md#multi-round-tasks-and-tree-rollouts).

Read in the order an epoch's trees are credited:

- ``nodes.py``: the tree (``Node``; ``SegmentNode``, a node with its tokens; ``policy_nodes``, the nodes that are
  training rows), its walks, its checks (``validate_tree``), leaf returns, the no-answer closing and its picture.
- ``values.py``: node values ``V`` and ``Q = r + V`` in the three value modes (``mean``, ``optimal_stopping``,
  ``optimal_stopping_split`` and its cross-fitted stopping value).
- ``advantages.py``: sibling advantages (``Q`` against the siblings' mean, over the tree's, the group's or no std),
  the flat-group rule, and ``assign_advantages``, which writes ``value``, ``q`` and ``advantage`` into a tree.
- ``chains.py``: chain rollouts' returns, per-row rewards and episode ids, and per-chain or per-turn credit.
- ``credit.py``: each row's advantage for an epoch of trees or chains (``tree_row_advantages``) and which rows
  count in the loss (``loss_rows``), the two things the module takes from here.

``buffers/tree_layout.py`` only lays the nodes out as rows; the tensor maths of per-turn credit
(``turn_advantages``) and of group advantages stays in ``losses/``, which this package uses.
"""

from lit_grpo.tree.advantages import (
    FLAT_RTOL,
    STD_SCOPES,
    SiblingGroup,
    StdScope,
    assign_advantages,
    flat_sibling_nodes,
    flat_tolerance,
    is_flat,
    sibling_advantages,
    sibling_groups,
    sibling_scale,
    tree_advantages,
)
from lit_grpo.tree.chains import (
    carries_tokens,
    chain_advantages,
    chain_returns,
    chain_rows,
    chain_turn_advantages,
    chain_turn_rewards,
    scorable_chains,
)
from lit_grpo.tree.credit import FLAT_GROUPS, FlatGroups, TreeRollouts, loss_rows, tree_row_advantages
from lit_grpo.tree.nodes import (
    Node,
    SegmentNode,
    close_with_no_answer,
    depth_first,
    leaf_counts,
    leaf_paths,
    leaf_returns,
    policy_nodes,
    render_tree,
    validate_tree,
    walk,
)
from lit_grpo.tree.values import (
    VALUE_MODES,
    ValueMode,
    alternate_halves,
    bellman_value,
    cross_fitted_max,
    exact_mean,
    node_values,
    split_by_kind,
    split_stopping_value,
)

__all__ = [
    "FLAT_GROUPS", "FLAT_RTOL", "STD_SCOPES", "VALUE_MODES", "FlatGroups", "Node", "SegmentNode", "SiblingGroup",
    "StdScope", "TreeRollouts", "ValueMode", "alternate_halves", "assign_advantages", "bellman_value",
    "carries_tokens", "chain_advantages", "chain_returns", "chain_rows", "chain_turn_advantages", "chain_turn_rewards",
    "close_with_no_answer", "cross_fitted_max", "depth_first", "exact_mean", "flat_sibling_nodes", "flat_tolerance",
    "is_flat", "leaf_counts", "leaf_paths", "leaf_returns", "loss_rows", "node_values", "policy_nodes", "render_tree",
    "scorable_chains", "sibling_advantages", "sibling_groups", "sibling_scale", "split_by_kind",
    "split_stopping_value", "tree_advantages", "tree_row_advantages", "validate_tree", "walk",
]
