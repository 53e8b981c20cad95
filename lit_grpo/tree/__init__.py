"""Tree-relative advantages for multi-round rollouts (docs/guide.md#multi-round-tasks-and-tree-rollouts).

A tree per prompt: the root is the prompt, every other node is one segment the policy generated in one round. A
terminal node is an answer (or a malformed segment, or the environment's no-answer closing); a continuing node is a
question the environment answered, and its children are the next round's segments. Every node has an immediate
reward ``r``.

The arithmetic lives in pure helpers that read a tree and return numbers; ``assign_advantages`` only writes them
back into the tree it is given:

- ``node_values``: ``V`` of every node. ``V(terminal) = 0``; ``Q(c) = r(c) + V(c)``. ``mean``: ``V(x)`` is the mean of
  ``Q`` over ``x``'s children. ``optimal_stopping``: ``V(x)`` is the larger of the mean ``Q`` of the terminal children
  and the mean ``Q`` of the continuing children, over the options that exist at ``x``; with few children per kind
  this max of noisy means is biased upward (E[max] >= max of E). ``optimal_stopping_split``: a cross-fitted double
  estimate of that max, which chooses the kind on one half of each kind's children and reads its value off the
  other half, and falls back to ``mean`` where a kind has a single child (``split_stopping_value``).
- ``leaf_returns``: the return of each terminal leaf, the sum of ``r`` along its path. The root's own reward is left
  out: it is the same constant on every path, so it changes no spread, and leaving it out keeps a large prompt-level
  reward from rounding the returns.
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

A continuing node cut off at ``max_depth`` is closed with ``close_with_no_answer``: one terminal child, with no policy
tokens, scored with the task's no-answer reward. Being an only child its advantage is exactly 0 and it carries no
loss; its parent's value follows from it like from any other child.

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
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal, NamedTuple, get_args

from lit_grpo.errors import InputError
from lit_grpo.losses.advantages import check_choice
from lit_grpo.losses.stopping import exact_mean, split_by_kind, split_stopping_value

ValueMode = Literal["mean", "optimal_stopping", "optimal_stopping_split"]
VALUE_MODES: tuple[str, ...] = get_args(ValueMode)
StdScope = Literal["tree", "siblings", "none"]
STD_SCOPES: tuple[str, ...] = get_args(StdScope)

FLAT_RTOL = 1e-12
"""Spreads up to this fraction of the largest path sum of ``|r|`` count as flat (float rounding of path sums)."""


@dataclass(eq=False)
class Node:
    """One node of a rollout tree; compared and hashed by identity, so nodes can key dicts.

    ``reward`` is the node's immediate reward r; ``terminal`` marks an answer (or a malformed segment, or a
    no-answer closing); ``children`` are the next round's segments of a continuing node. ``value``, ``q`` and
    ``advantage`` are outputs, written by ``assign_advantages``.
    """

    reward: float = 0.0
    terminal: bool = False
    children: list[Node] = field(default_factory=list)
    value: float | None = None  # V, set by assign_advantages
    q: float | None = None  # Q = reward + V, set by assign_advantages
    advantage: float | None = None  # set on every node but the root


def walk(root: Node) -> list[tuple[tuple[int, ...], Node]]:
    """Every node with its path of child indices from the root (``()`` for the root), in depth-first pre-order.

    Raises ``ValueError`` if a node is reached twice (a node shared by two parents, or a cycle): each node is one
    segment and is packed once.
    """
    order: list[tuple[tuple[int, ...], Node]] = []
    seen: set[int] = set()
    stack: list[tuple[tuple[int, ...], Node]] = [((), root)]
    while stack:
        path, node = stack.pop()
        if id(node) in seen:
            raise ValueError(f"node at {_where(path)} appears twice in the tree (shared by two parents, or a cycle)")
        seen.add(id(node))
        order.append((path, node))
        stack.extend((path + (i,), child) for i, child in reversed(list(enumerate(node.children))))
    return order


def depth_first(root: Node) -> list[Node]:
    """The nodes in depth-first pre-order: a node, then its first child's subtree, then its second child's, ...

    This is the order a tree is packed into one row: every node comes after all of its ancestors. For
    root -> [a -> [c, d], b] it is [root, a, c, d, b].
    """
    return [node for _, node in walk(root)]


def _where(path: tuple[int, ...]) -> str:
    """A node's location for error messages: ``root`` or ``root.children[2].children[0]``."""
    return "root" + "".join(f".children[{i}]" for i in path)


def validate_tree(root: Node) -> None:
    """Raise ``ValueError`` naming the first malformed node, else return.

    Malformed: a terminal root (the root is the prompt, not a segment); a non-terminal node without children (a
    branch cut off at ``max_depth`` must be closed with ``close_with_no_answer``); a terminal node with children
    (nothing follows an answer); a reward that is not a finite number; a node reached twice.
    """
    if root.terminal:
        raise ValueError("the root is the prompt and cannot be terminal")
    for path, node in walk(root):
        if not math.isfinite(node.reward):
            raise InputError(f"node at {_where(path)} has a non-finite reward {node.reward!r}")
        if node.terminal and node.children:
            raise ValueError(
                f"terminal node at {_where(path)} has {len(node.children)} children; nothing follows an answer"
            )
        if not node.terminal and not node.children:
            raise ValueError(
                f"non-terminal node without children at {_where(path)}: a continuing node needs at least one child "
                "(close a branch cut off at max_depth with close_with_no_answer)"
            )


def leaf_paths(root: Node) -> list[list[float]]:
    """For each terminal leaf, in depth-first order, the rewards along its path from depth 1 down to the leaf.

    The root's own reward is not included (see the module docstring). Validates the tree.
    """
    validate_tree(root)
    path_rewards: dict[int, list[float]] = {id(root): []}
    paths: list[list[float]] = []
    for node in depth_first(root):
        for child in node.children:
            path_rewards[id(child)] = path_rewards[id(node)] + [float(child.reward)]
        if node.terminal:
            paths.append(path_rewards[id(node)])
    return paths


def leaf_returns(root: Node) -> list[float]:
    """The return of every terminal leaf (sum of r from depth 1 to the leaf), in depth-first order.

    For root -> [terminal 1, continuing -0.25 -> [terminal 1, terminal 0]] it is [1.0, 0.75, -0.25].
    """
    return [math.fsum(path) for path in leaf_paths(root)]


def flat_tolerance(paths: Sequence[Sequence[float]]) -> float:
    """``FLAT_RTOL`` times the largest sum of ``|r|`` along a path (``leaf_paths``): smaller spreads are rounding."""
    return FLAT_RTOL * max(math.fsum(abs(r) for r in path) for path in paths)


def is_flat(values: Sequence[float], tol: float = 0.0) -> bool:
    """Whether ``max(values) - min(values) <= tol`` (a flat group: its advantages are exactly 0); True if empty."""
    return not values or max(values) - min(values) <= tol


def bellman_value(child_q: Sequence[float], child_terminal: Sequence[bool], value_mode: str = "mean") -> float:
    """V of a continuing node from its children's Q values and kinds (one entry per child, at least one).

    ``mean``: the mean of all ``child_q``. ``optimal_stopping``: the larger of the mean Q of the terminal children
    and the mean Q of the continuing children, over the kinds present. ``optimal_stopping_split``:
    ``split_stopping_value``. Example: Q [1, -1, 0.75] with kinds [terminal, terminal, continuing] gives 0.25
    (mean), max(0, 0.75) = 0.75 (optimal_stopping) and 0.25 (optimal_stopping_split: one continuing child, so
    the mean).
    """
    check_choice("value mode", value_mode, VALUE_MODES)
    if value_mode == "mean":
        return exact_mean(child_q)
    if value_mode == "optimal_stopping_split":
        return split_stopping_value(child_q, child_terminal)
    stop, go_on = split_by_kind(child_q, child_terminal)
    return max(exact_mean(option) for option in (stop, go_on) if option)


def node_values(root: Node, value_mode: str = "mean") -> dict[Node, float]:
    """V of every node (0 for terminal nodes), keyed by node; reads only ``reward``, ``terminal`` and ``children``.

    Validates the tree and the mode (``ValueError`` naming the valid modes).
    """
    check_choice("value mode", value_mode, VALUE_MODES)
    validate_tree(root)
    values: dict[Node, float] = {}
    for node in reversed(depth_first(root)):  # every child before its parent
        if node.terminal:
            values[node] = 0.0
        else:
            child_q = [child.reward + values[child] for child in node.children]
            values[node] = bellman_value(child_q, [child.terminal for child in node.children], value_mode)
    return values


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


def close_with_no_answer(node: Node, no_answer_reward: float) -> Node:
    """Close a continuing node cut off at ``max_depth``: append and return one terminal child with the reward
    ``no_answer_reward`` (the task's no-answer reward).

    The child has no policy tokens. As an only child its advantage is exactly 0, and ``V(node)`` becomes
    ``no_answer_reward`` in every value mode. Raises ``ValueError`` if ``node`` is terminal or already has children.
    """
    if node.terminal:
        raise ValueError("cannot close a terminal node: only a continuing node cut off at max_depth is closed")
    if node.children:
        raise ValueError(f"cannot close a node that already has {len(node.children)} children; only an open one")
    child = Node(reward=float(no_answer_reward), terminal=True)
    node.children.append(child)
    return child


def _format(x: float | None) -> str:
    """``-`` for a value not set yet, else four decimals (without a ``-0.0000``)."""
    if x is None:
        return "-"
    text = f"{x:.4f}"
    return "0.0000" if text == "-0.0000" else text


def render_tree(root: Node, label: Callable[[Node], str] | None = None) -> str:
    """The tree as indented text, one node a line: kind, r, V, Q, A (``-`` where not set), two spaces per depth,
    then ``label(node)`` if given (e.g. the node's segment text).

    Plain text; TensorBoard's text plugin reads markdown, so wrap it in a fenced code block there. Example, after
    ``assign_advantages`` on root -> [terminal 1, terminal 0]::

        root r=0.0000 V=0.5000 Q=0.5000 A=-
          terminal r=1.0000 V=0.0000 Q=1.0000 A=1.0000
          terminal r=0.0000 V=0.0000 Q=0.0000 A=-1.0000
    """
    lines = []
    for path, node in walk(root):
        kind = "root" if not path else "terminal" if node.terminal else "continuing"
        text = f" {label(node)}" if label is not None else ""
        lines.append(
            f"{'  ' * len(path)}{kind} r={_format(node.reward)} V={_format(node.value)} "
            f"Q={_format(node.q)} A={_format(node.advantage)}{text}"
        )
    return "\n".join(lines)


def leaf_counts(root: Node) -> dict[Node, int]:
    """The number of terminal leaves below every node (1 for a leaf): the sampled futures behind each node's Q.
    For root -> [terminal, continuing -> [terminal, terminal]] it is 3 for the root, 1, 2, 1, 1."""
    counts: dict[Node, int] = {}
    for node in reversed(depth_first(root)):
        counts[node] = 1 if node.terminal else sum(counts[child] for child in node.children)
    return counts
