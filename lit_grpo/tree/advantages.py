"""Tree-relative advantages (docs/guide.md#multi-round-tasks-and-tree-rollouts): each node's Q against its
siblings', from the node values of ``tree/values.py``.

The arithmetic lives in pure helpers that read a tree and return numbers; ``assign_advantages`` only writes them
back into the tree it is given:

- ``leaf_returns`` (``tree/nodes.py``): the return of each terminal leaf, the sum of ``r`` along its path. The root's
  own reward is left out: it is the same constant on every path, so it changes no spread, and leaving it out keeps a
  large prompt-level reward from rounding the returns.
- ``sibling_advantages``: ``A(c) = (Q(c) - mean of Q over c's siblings, c included) / (sigma_tree + eps)``, with
  ``sigma_tree`` the population std of all the leaf returns. The ablation ``std_scope="siblings"`` divides by the
  population std of the sibling group's Q instead (each decision normalised on its own, as GRPO normalises a group).
  ``std_scope="none"`` divides by nothing: ``A(c) = Q(c) - mean of Q over c's siblings``, in the reward's own units
  (as Dr. GRPO's ``drgrpo``/``centered`` leave a chain group's returns). A decision whose alternatives rarely differ
  is then not magnified: with a std, the one sibling that asked at a cue where the rest answered gets about the
  same large advantage whether its return was good or bad (issue 41).

Exact zeros (the flat-group rule of docs/guide.md#the-math, carried over): a tree whose leaf returns are all equal
gets 0.0 on every node, and so does every sibling group whose ``Q`` values are all equal. "Equal" allows a spread of
``FLAT_RTOL`` times the largest sum of ``|r|`` along a path: returns are float sums along different paths, so
``-0.1 + 0.8`` and ``0.7`` differ by one ulp and would otherwise give advantages of rounding noise. Zeroing such a spread
changes no advantage by more than ``FLAT_RTOL * scale / eps``, far below anything a reward can express. The rule
is decided in one place, ``sibling_groups``; ``flat_sibling_nodes`` lists the nodes it zeroes.

Worked example (``eps`` = 1e-6), root -> [terminal r=1, terminal r=-1, continuing r=-0.25 -> [terminal r=1]]:
leaf returns 1, -1, 0.75 (mean 0.25, sigma_tree = sqrt(0.7916667) = 0.8897565). ``mean``: V(continuing) = 1, so
Q = 0.75; V(root) = (1 - 1 + 0.75) / 3 = 0.25; advantages (1 - 0.25, -1 - 0.25, 0.75 - 0.25) / 0.8897575 =
0.8429263, -1.4048771, 0.5619509, and 0 for the only child. ``optimal_stopping``: V(root) = max(mean(1, -1),
0.75) = 0.75; the advantages are the same, since every Q is. ``optimal_stopping_split``: the root has a single
continuing child, so V(root) falls back to the mean, 0.25. ``std_scope="none"``: 0.75, -1.25, 0.5 and 0.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Literal, NamedTuple, get_args

from lit_grpo.losses.advantages import check_choice
from lit_grpo.tree.nodes import Node, depth_first, leaf_paths
from lit_grpo.tree.values import exact_mean, node_values

StdScope = Literal["tree", "siblings", "none"]
STD_SCOPES: tuple[str, ...] = get_args(StdScope)

FLAT_RTOL = 1e-12
"""Spreads up to this fraction of the largest path sum of ``|r|`` count as flat (float rounding of path sums)."""


def flat_tolerance(paths: Sequence[Sequence[float]]) -> float:
    """``FLAT_RTOL`` times the largest sum of ``|r|`` along a path (``leaf_paths``): smaller spreads are rounding."""
    return FLAT_RTOL * max(math.fsum(abs(r) for r in path) for path in paths)


def is_flat(values: Sequence[float], tol: float = 0.0) -> bool:
    """Whether ``max(values) - min(values) <= tol`` (a flat group: its advantages are exactly 0); True if empty."""
    return not values or max(values) - min(values) <= tol


def sibling_advantages(child_q: Sequence[float], scale: float, flat_tol: float = 0.0) -> list[float]:
    """``(Q(c) - mean of child_q) / scale`` for each child; exactly 0 for all if the group is flat within ``flat_tol``.

    ``scale`` is ``sigma_tree + eps``. An only child always gets 0: Q(c) minus its own mean. Example: Q [1, 0.5]
    with scale 0.5 gives [0.5, -0.5].
    """
    if is_flat(child_q, flat_tol):
        return [0.0] * len(child_q)
    center = exact_mean(child_q)
    return [(q - center) / scale for q in child_q]


class SiblingGroup(NamedTuple):
    """The children of one continuing node, their Q values, and whether the flat rule zeroes their advantages."""

    children: list[Node]
    q: list[float]
    flat: bool


def sibling_groups(root: Node, values: dict[Node, float],
                   paths: list[list[float]] | None = None) -> list[SiblingGroup]:
    """Every sibling group (the children of each continuing node, parents in depth-first order) with its flat flag.

    The one place the flat rule is decided: a group is flat if the whole tree's leaf returns are flat or the
    group's Q values are, each within ``flat_tolerance`` of the tree's paths; a flat group's advantages are exactly
    0. ``values`` are the node values (as ``node_values`` gives them); ``paths``: ``leaf_paths(root)`` when the
    caller has them (otherwise read here, which validates the tree).
    """
    paths = leaf_paths(root) if paths is None else paths
    tol = flat_tolerance(paths)
    tree_flat = is_flat([math.fsum(path) for path in paths], tol)
    groups = []
    for node in (n for n in depth_first(root) if n.children):
        child_q = [child.reward + values[child] for child in node.children]
        groups.append(SiblingGroup(list(node.children), child_q, tree_flat or is_flat(child_q, tol)))
    return groups


def flat_sibling_nodes(root: Node, values: dict[Node, float]) -> set[Node]:
    """The non-root nodes whose advantage the flat rule sets to exactly 0 (``sibling_groups``' flat groups).

    Every non-root node when the tree's leaf returns are flat; else every child of a group whose Q values are flat,
    only children included. A node of a non-flat group whose Q happens to equal the group's mean is not in the set.
    Example, ``mean`` values, root -> [continuing -> [terminal 0.5, terminal 0.5], continuing -> [terminal 0.3],
    continuing -> [terminal 1, terminal 0, terminal -1]]: the two 0.5 answers and the 0.3 answer.
    """
    return {child for group in sibling_groups(root, values) if group.flat for child in group.children}


def tree_advantages(root: Node, values: dict[Node, float], eps: float = 1e-6,
                    std_scope: str = "tree") -> dict[Node, float]:
    """The advantage of every node but the root, from the node values ``values`` (as ``node_values`` gives them).

    A(c) = (Q(c) - mean over c's siblings s, c included, of Q(s)) / (sigma + eps), with sigma the population std of
    ``leaf_returns(root)`` (``std_scope="tree"``) or of the siblings' Q (``"siblings"``); ``"none"`` divides by
    nothing (not even eps). A flat sibling group (``sibling_groups``; every group of a tree whose leaf returns are
    flat, see ``FLAT_RTOL``) gets exactly 0.

    Example, ``mean`` values, root -> [continuing r=-0.1 -> [terminal 1, terminal -1], terminal 0.5]: leaf returns
    0.9, -1.1, 0.5 (sigma_tree 0.8640988); the root's children have Q -0.1 and 0.5, the question's children 1 and
    -1. In depth-first order (question, 1, -1, 0.5), ``tree``: -0.3471821, 1.1572738, -1.1572738, 0.3471821;
    ``siblings``: -0.9999967, 0.9999990, -0.9999990, 0.9999967; ``none``: -0.3, 1.0, -1.0, 0.3.
    """
    check_choice("std scope", std_scope, STD_SCOPES)
    paths = leaf_paths(root)  # read once: the flat rule and the tree's spread both need them
    groups = sibling_groups(root, values, paths)
    tree_scale = statistics.pstdev([math.fsum(path) for path in paths]) + eps
    advantages: dict[Node, float] = {}
    for group in groups:
        if group.flat:
            advantages.update((child, 0.0) for child in group.children)
        else:
            scale = sibling_scale(std_scope, tree_scale, group.q, eps)
            advantages.update(zip(group.children, sibling_advantages(group.q, scale)))
    return advantages


def sibling_scale(std_scope: str, tree_scale: float, child_q: Sequence[float], eps: float) -> float:
    """What one sibling group's centred Q values are divided by: ``tree_scale`` (sigma_tree + eps) for ``tree``,
    the population std of ``child_q`` plus ``eps`` for ``siblings``, exactly 1.0 for ``none``."""
    if std_scope == "tree":
        return tree_scale
    if std_scope == "siblings":
        return statistics.pstdev(child_q) + eps
    return 1.0


def assign_advantages(root: Node, value_mode: str = "mean", eps: float = 1e-6, std_scope: str = "tree") -> None:
    """Write ``value``, ``q`` (= reward + value) and ``advantage`` into every node of the tree, in place.

    Every node gets ``value`` and ``q`` (a terminal node: value 0, q = its reward; the root: q = root.reward +
    V(root)); every node but the root gets ``advantage``, and the root's is set to None. ``value_mode`` is
    ``mean``, ``optimal_stopping`` or ``optimal_stopping_split`` and ``std_scope`` ``tree``, ``siblings`` or ``none``
    (see the module docstring). Raises
    ``ValueError`` on an unknown mode or a malformed tree (``validate_tree``) before writing anything.
    """
    values = node_values(root, value_mode)
    advantages = tree_advantages(root, values, eps, std_scope)
    for node in depth_first(root):
        node.value = values[node]
        node.q = node.reward + values[node]
        node.advantage = advantages.get(node)

