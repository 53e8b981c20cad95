"""The stopping value of a tree node without reusing its samples (``tree_value_mode: optimal_stopping_split``).

``optimal_stopping`` values a node by the larger of its answer children's mean Q and its question children's mean
Q. With small sibling groups that max of two noisy means is biased upward (E[max] >= max of E: with two answers and
two questions, each +1 or -1 at even odds, it is 0.375 in expectation where both kinds are worth 0), and since
advantages are centred on the sibling mean, the excess lands on the questions. The functions here choose the better
kind with one half of the children and value it with the other (a cross-fitted double estimator), which is never
biased upward. ``lit_grpo.tree.bellman_value`` dispatches to them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence


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
