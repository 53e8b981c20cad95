"""Node values of a rollout tree (docs/guide.md#multi-round-tasks-and-tree-rollouts): ``V`` of every node, in
three modes, and the stopping value that does not reuse its samples.

``V(terminal) = 0``; ``Q(c) = r(c) + V(c)``. ``mean``: ``V(x)`` is the mean of ``Q`` over ``x``'s children.
``optimal_stopping``: ``V(x)`` is the larger of the mean ``Q`` of the terminal children and the mean ``Q`` of the
continuing children, over the options that exist at ``x``. ``optimal_stopping_split``: a cross-fitted double estimate
of that max, which chooses the kind on one half of each kind's children and reads its value off the other half, and
falls back to ``mean`` where a kind has a single child (``split_stopping_value``).

Why the split: with small sibling groups ``optimal_stopping``'s max of two noisy means is biased upward (E[max] >=
max of E: with two answers and two questions, each +1 or -1 at even odds, it is 0.375 in expectation where both kinds
are worth 0), and since advantages are centred on the sibling mean, the excess lands on the questions. Choosing the
better kind with one half of the children and valuing it with the other is never biased upward.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal, get_args

from lit_grpo.losses.advantages import check_choice
from lit_grpo.tree.nodes import Node, depth_first, validate_tree

ValueMode = Literal["mean", "optimal_stopping", "optimal_stopping_split"]
VALUE_MODES: tuple[str, ...] = get_args(ValueMode)


def exact_mean(values: Sequence[float]) -> float:
    """Arithmetic mean with a correctly rounded sum."""
    return math.fsum(values) / len(values)


def split_by_kind(child_q: Sequence[float], child_terminal: Sequence[bool]) -> tuple[list[float], list[float]]:
    """The children's Q split by kind, each in child order: ``(terminal Q, continuing Q)``.

    Example: Q [1, 0.5, -1] with kinds [terminal, continuing, terminal] gives ([1, -1], [0.5]).
    """
    stop = [q for q, terminal in zip(child_q, child_terminal) if terminal]
    go_on = [q for q, terminal in zip(child_q, child_terminal) if not terminal]
    return stop, go_on


def alternate_halves(values: Sequence[float]) -> tuple[list[float], list[float]]:
    """``values`` split by alternating position: (1st, 3rd, ...) is half 0, (2nd, 4th, ...) half 1.

    Example: [a, b, c, d, e] gives ([a, c, e], [b, d]).
    """
    return list(values[0::2]), list(values[1::2])


def cross_fitted_max(stop: Sequence[float], go_on: Sequence[float]) -> float:
    """A double estimate of max(E[stop], E[go_on]) from two samples of at least 2 values each.

    Each kind is cut by ``alternate_halves``. With half 0 the kind with the larger mean is chosen (a tie goes to
    ``stop``, the terminal kind: the cheaper episode) and the estimate is that kind's half-1 mean; then the halves
    swap roles; the result is the average of the two estimates. The choice never sees the values it is scored on,
    so for i.i.d. samples the estimate is not biased upward (it can be biased downward).

    Example: stop [1, -1], go_on [0, 0]: half 0 (1 vs 0) chooses stop and reads -1; half 1 (-1 vs 0) chooses
    go_on and reads 0; the value is (-1 + 0) / 2 = -0.5.
    """
    if len(stop) < 2 or len(go_on) < 2:
        raise ValueError(f"cross_fitted_max needs at least 2 values of each kind, got {len(stop)} and {len(go_on)}")
    stop_halves, go_on_halves = alternate_halves(stop), alternate_halves(go_on)
    estimates = []
    for choose, score in ((0, 1), (1, 0)):
        stops = exact_mean(stop_halves[choose]) >= exact_mean(go_on_halves[choose])
        estimates.append(exact_mean(stop_halves[score] if stops else go_on_halves[score]))
    return exact_mean(estimates)


def split_stopping_value(child_q: Sequence[float], child_terminal: Sequence[bool]) -> float:
    """V of a continuing node in ``optimal_stopping_split`` mode (one Q and kind per child, at least one child).

    - One kind present: the mean Q of the children (as in the other modes).
    - Both kinds, each with at least 2 children: ``cross_fitted_max`` of the terminal and the continuing Q.
    - Both kinds, one of them with a single child (e.g. a group of two: one answer, one question): no half can be
      held out, so the value falls back to the mean of all the children's Q (the ``mean`` mode's value, unbiased
      for the sampling policy's value).

    Examples: Q [1, 0.25, -1, -0.375] with kinds [terminal, continuing, terminal, continuing]: half 0 (1 vs 0.25)
    chooses terminal and reads -1, half 1 (-1 vs -0.375) chooses continuing and reads 0.25: -0.375. Q [1, -1] with
    kinds [terminal, continuing]: the mean, 0.
    """
    stop, go_on = split_by_kind(child_q, child_terminal)
    if len(stop) >= 2 and len(go_on) >= 2:
        return cross_fitted_max(stop, go_on)
    return exact_mean(child_q)


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

