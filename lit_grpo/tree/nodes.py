"""The rollout tree itself (docs/guide.md#multi-round-tasks-and-tree-rollouts): its nodes, the node that carries
tokens, its walks, its checks and its picture.

A tree per prompt: the root is the prompt, every other node is one segment the policy generated in one round. A
terminal node is an answer (or a malformed segment, or the environment's no-answer closing); a continuing node is a
question the environment answered, and its children are the next round's segments. Every node has an immediate
reward ``r``.

A continuing node cut off at ``max_depth`` is closed with ``close_with_no_answer``: one terminal child, with no policy
tokens, scored with the task's no-answer reward. Being an only child its advantage is exactly 0 and it carries no
loss; its parent's value follows from it like from any other child.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from lit_grpo.errors import InputError
from lit_grpo.tasks.base import PromptRecord


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
