"""The value modes as estimators: exact expectations over every outcome of small sibling groups, by hand.

Each child's Q is drawn independently from a small distribution; ``expectation`` enumerates every outcome
(itertools.product over the children) and sums probability x ``bellman_value`` in exact fractions (every number
here is a binary fraction, so the floats convert exactly). The expected numbers are worked out by hand in comments.
"""

import itertools
import math
from fractions import Fraction

import pytest

from lit_grpo.tree import (
    VALUE_MODES,
    Node,
    alternate_halves,
    assign_advantages,
    bellman_value,
    cross_fitted_max,
    depth_first,
    flat_sibling_nodes,
    node_values,
    split_by_kind,
    split_stopping_value,
    tree_advantages,
)

COIN = [(1.0, Fraction(1, 2)), (-1.0, Fraction(1, 2))]  # +1 or -1 with probability 1/2: mean 0
LIKELY = [(1.0, Fraction(3, 4)), (-1.0, Fraction(1, 4))]  # +1 w.p. 3/4, else -1: mean 3/4 - 1/4 = 0.5


def leaf(reward: float) -> Node:
    return Node(reward=reward, terminal=True)


def ask(reward: float, *children: Node) -> Node:
    return Node(reward=reward, children=list(children))


def expectation(mode: str, children: list[tuple[list[tuple[float, Fraction]], bool]]) -> Fraction:
    """E[bellman_value] over every outcome; ``children`` is one (distribution of Q, terminal) per child."""
    kinds = [terminal for _, terminal in children]
    total, mass = Fraction(0), Fraction(0)
    for outcome in itertools.product(*(distribution for distribution, _ in children)):
        probability = math.prod((p for _, p in outcome), start=Fraction(1))
        total += probability * Fraction(bellman_value([q for q, _ in outcome], kinds, mode))
        mass += probability
    assert mass == 1
    return total


# (a) two answers and two questions, every Q +1 or -1 with probability 1/2. True value: max(E[answer], E[question])
# = max(0, 0) = 0.
# optimal_stopping: each kind's mean of two coins is 1 (1/4), 0 (1/2) or -1 (1/4); the max of two such is 1 unless
# both are below 1, P(max = 1) = 1 - (3/4)^2 = 7/16, and -1 only if both are, P(max = -1) = (1/4)^2 = 1/16:
# E = 7/16 - 1/16 = 6/16 = 0.375.
# optimal_stopping_split: each cross estimate chooses with one half and reads the other half's value of the chosen
# kind, a coin independent of the choice: E = 0 exactly. mean: (0 + 0 + 0 + 0) / 4 = 0.
TWO_BY_TWO_COINS = [(COIN, True), (COIN, True), (COIN, False), (COIN, False)]


@pytest.mark.parametrize("mode, expected", [
    ("mean", Fraction(0)),
    ("optimal_stopping", Fraction(6, 16)),
    ("optimal_stopping_split", Fraction(0)),
])
def test_two_answers_two_questions_fair_coins(mode, expected):
    assert expectation(mode, TWO_BY_TWO_COINS) == expected


# (b) answers +1 w.p. 3/4 else -1 (mean 0.5), questions +1/-1 w.p. 1/2 (mean 0); two of each. True max 0.5.
# optimal_stopping: the answers' mean is 1 (9/16), 0 (2 * 3/4 * 1/4 = 6/16) or -1 (1/16); the questions' 1 (1/4),
# 0 (1/2) or -1 (1/4). P(max = 1) = 1 - P(answers < 1) P(questions < 1) = 1 - 7/16 * 3/4 = 43/64;
# P(max = -1) = 1/16 * 1/4 = 1/64; E = 42/64 = 21/32 = 0.65625 (bias +0.15625).
# optimal_stopping_split: half 0 holds a1 and q1; it chooses the question only when q1 > a1, i.e. a1 = -1 and
# q1 = +1 (a tie goes to the answer), P = 1/4 * 1/2 = 1/8; it then reads a2 (E 0.5) or q2 (E 0), independent of
# the choice: 7/8 * 0.5 + 1/8 * 0 = 7/16. The swapped estimate (choose with a2, q2; read a1 or q1) is 7/16 too:
# E = (7/16 + 7/16) / 2 = 7/16 = 0.4375 (bias -0.0625). Were ties to go to the question, it would choose the
# question w.p. P(q1 = 1) + P(q1 = a1 = -1) = 1/2 + 1/8 = 5/8 and E would be 3/8 * 0.5 = 3/16.
# mean: (0.5 + 0.5 + 0 + 0) / 4 = 0.25.
TWO_BY_TWO_UNEVEN = [(LIKELY, True), (LIKELY, True), (COIN, False), (COIN, False)]


@pytest.mark.parametrize("mode, expected", [
    ("mean", Fraction(1, 4)),
    ("optimal_stopping", Fraction(21, 32)),
    ("optimal_stopping_split", Fraction(7, 16)),
])
def test_two_answers_two_questions_answers_better(mode, expected):
    assert expectation(mode, TWO_BY_TWO_UNEVEN) == expected


def test_order_of_kinds_among_the_children_does_not_matter():
    # the same children interleaved (question, answer, question, answer): the halves are taken within each kind
    interleaved = [(COIN, False), (LIKELY, True), (COIN, False), (LIKELY, True)]
    assert expectation("optimal_stopping_split", interleaved) == Fraction(7, 16)


# Three answers (3/4 chance of +1) and two questions (coins), children in that order. True max 0.5.
# Answer halves: (a1, a3) and (a2); question halves: (q1) and (q2).
# Estimate 1 chooses with mean(a1, a3) (1 w.p. 9/16, 0 w.p. 6/16, -1 w.p. 1/16) against q1: the question only when
# q1 = 1 and mean(a1, a3) < 1, P = 1/2 * 7/16 = 7/32; it reads a2 (E 0.5) or q2 (E 0): 25/32 * 0.5 = 25/64.
# Estimate 2 chooses with a2 against q2 (the question w.p. 1/4 * 1/2 = 1/8) and reads mean(a1, a3) (E 0.5) or q1
# (E 0): 7/8 * 0.5 = 7/16 = 28/64. E = (25/64 + 28/64) / 2 = 53/128 = 0.4140625. mean: (3 * 0.5 + 0) / 5 = 0.3.
def test_three_answers_two_questions():
    children = [(LIKELY, True), (LIKELY, True), (LIKELY, True), (COIN, False), (COIN, False)]
    assert expectation("optimal_stopping_split", children) == Fraction(53, 128)
    assert float(expectation("mean", children)) == pytest.approx(0.3, rel=0, abs=1e-15)  # fifths: not binary


# (c) a group of two, one answer (3/4 chance of +1) and one question (coin): no half can be held out, so the split
# mode is the mean of the two, E = (0.5 + 0) / 2 = 0.25, as mean mode. optimal_stopping: max(a, q) is -1 only if
# both are, P = 1/4 * 1/2 = 1/8, else 1: E = 7/8 - 1/8 = 3/4.
@pytest.mark.parametrize("mode, expected", [
    ("mean", Fraction(1, 4)),
    ("optimal_stopping", Fraction(3, 4)),
    ("optimal_stopping_split", Fraction(1, 4)),
])
def test_group_of_two_falls_back_to_the_mean(mode, expected):
    assert expectation(mode, [(LIKELY, True), (COIN, False)]) == expected


def test_group_of_two_is_the_mean_on_every_outcome():
    for a, q in itertools.product([1.0, -1.0], [1.0, -1.0]):
        assert bellman_value([a, q], [True, False], "optimal_stopping_split") == (a + q) / 2


@pytest.mark.parametrize("child_q, kinds, expected", [
    # one answer and three questions: the answer cannot be split; mean (1 - 1 + 0 + 0.5) / 4 = 0.125
    # (optimal_stopping would give max(1, -0.5 / 3) = 1)
    ([1.0, -1.0, 0.0, 0.5], [True, False, False, False], 0.125),
    # three answers and one question: mean (1 + 0 - 1 + 0.5) / 4 = 0.125
    ([1.0, 0.0, -1.0, 0.5], [True, True, True, False], 0.125),
    # one kind only: its mean, (1 - 1 + 0.5 + 0.5) / 4 = 0.25 and (-0.5 - 1.5) / 2 = -1
    ([1.0, -1.0, 0.5, 0.5], [True, True, True, True], 0.25),
    ([-0.5, -1.5], [False, False], -1.0),
    # an only child: its Q
    ([0.75], [False], 0.75),
])
def test_split_falls_back_to_the_mean_without_two_of_each_kind(child_q, kinds, expected):
    assert bellman_value(child_q, kinds, "optimal_stopping_split") == expected
    assert split_stopping_value(child_q, kinds) == expected


@pytest.mark.parametrize("child_q, kinds, expected", [
    # answers [1, -1], questions [0, 0], interleaved as question, answer, question, answer. Half 0 (1 vs 0) chooses
    # the answer and reads -1; half 1 (-1 vs 0) chooses the question and reads 0: (-1 + 0) / 2 = -0.5.
    # (Without the swap: -1; reading the choosing half: (1 + 0) / 2 = 0.5.)
    ([0.0, 1.0, 0.0, -1.0], [False, True, False, True], -0.5),
    # answers [0, 1], questions [0, -1]. Half 0 ties (0 vs 0): the answer, read 1; half 1 (1 vs -1): the answer,
    # read 0: (1 + 0) / 2 = 0.5. (Ties to the question: (-1 + 0) / 2 = -0.5.)
    ([0.0, 0.0, 1.0, -1.0], [True, False, True, False], 0.5),
    # kinds T, C, T, C, T: answers [1, -1, 1] -> halves [1, 1] and [-1]; questions [0.5, -0.5] -> [0.5], [-0.5].
    # Half 0 (1 vs 0.5): the answer, read -1; half 1 (-1 vs -0.5): the question, read 0.5: (-1 + 0.5) / 2 = -0.25.
    ([1.0, 0.5, -1.0, -0.5, 1.0], [True, False, True, False, True], -0.25),
    # answers [1, 0, 1, 0] -> [1, 1], [0, 0]; questions all 0.5. Half 0 (1 vs 0.5): the answer, read 0; half 1
    # (0 vs 0.5): the question, read 0.5: (0 + 0.5) / 2 = 0.25.
    ([1.0, 0.0, 1.0, 0.0, 0.5, 0.5, 0.5, 0.5], [True] * 4 + [False] * 4, 0.25),
])
def test_cross_fitted_max_by_hand(child_q, kinds, expected):
    assert bellman_value(child_q, kinds, "optimal_stopping_split") == expected


def test_split_helpers():
    assert split_by_kind([1.0, 0.5, -1.0], [True, False, True]) == ([1.0, -1.0], [0.5])
    assert alternate_halves([1.0, 2.0, 3.0, 4.0, 5.0]) == ([1.0, 3.0, 5.0], [2.0, 4.0])
    assert cross_fitted_max([1.0, -1.0], [0.0, 0.0]) == -0.5
    with pytest.raises(ValueError, match="at least 2 values of each kind, got 1 and 2"):
        cross_fitted_max([1.0], [0.0, 0.0])


def test_unknown_value_mode_lists_all_three():
    assert VALUE_MODES == ("mean", "optimal_stopping", "optimal_stopping_split")
    message = "unknown value mode 'max'; valid choices: mean, optimal_stopping, optimal_stopping_split$"
    with pytest.raises(ValueError, match=message):
        bellman_value([1.0], [True], "max")
    with pytest.raises(ValueError, match=message):
        assign_advantages(ask(0.0, leaf(1.0), leaf(0.0)), "max")


def split_tree() -> dict[str, Node]:
    """root
    ├─ a  terminal    0.5
    └─ q  continuing -0.25
       ├─ x  terminal    1
       ├─ u  continuing -0.25 -> [s terminal 1, t terminal 0]
       ├─ y  terminal   -1
       └─ w  continuing -0.25 -> [k terminal -1, m continuing -0.25 -> [n terminal 1]]
    """
    nodes = {name: leaf(r) for name, r in [("a", 0.5), ("x", 1.0), ("y", -1.0), ("s", 1.0), ("t", 0.0)]}
    nodes |= {"k": leaf(-1.0), "n": leaf(1.0)}
    nodes["m"] = ask(-0.25, nodes["n"])
    nodes["w"] = ask(-0.25, nodes["k"], nodes["m"])
    nodes["u"] = ask(-0.25, nodes["s"], nodes["t"])
    nodes["q"] = ask(-0.25, nodes["x"], nodes["u"], nodes["y"], nodes["w"])
    nodes["root"] = ask(0.0, nodes["a"], nodes["q"])
    return nodes


# (d) optimal_stopping_split, std_scope="none": name -> (V, Q, A).
# V(m) = 1 (one child), Q(m) = 0.75. V(w): one answer (Q -1) and one question (Q 0.75): the mean, -0.125;
# Q(w) = -0.375. V(u) = mean(1, 0) = 0.5 (answers only), Q(u) = 0.25.
# V(q): answers [x 1, y -1], questions [u 0.25, w -0.375]; half 0 (1 vs 0.25) chooses the answer and reads y = -1,
# half 1 (-1 vs -0.375) chooses the question and reads u = 0.25: V = (-1 + 0.25) / 2 = -0.375, Q(q) = -0.625.
# V(root): one answer (0.5) and one question (-0.625): the mean, -0.0625.
# A = Q - sibling mean: root's children 0.5, -0.625 (mean -0.0625) -> 0.5625, -0.5625; q's children 1, 0.25, -1,
# -0.375 (mean -0.125 / 4 = -0.03125) -> 1.03125, 0.28125, -0.96875, -0.34375; u's 1, 0 (mean 0.5) -> 0.5, -0.5;
# w's -1, 0.75 (mean -0.125) -> -0.875, 0.875; n is an only child: 0.
SPLIT_EXPECTED = {
    "root": (-0.0625, -0.0625, None),
    "a": (0.0, 0.5, 0.5625),
    "q": (-0.375, -0.625, -0.5625),
    "x": (0.0, 1.0, 1.03125),
    "u": (0.5, 0.25, 0.28125),
    "s": (0.0, 1.0, 0.5),
    "t": (0.0, 0.0, -0.5),
    "y": (0.0, -1.0, -0.96875),
    "w": (-0.125, -0.375, -0.34375),
    "k": (0.0, -1.0, -0.875),
    "m": (1.0, 0.75, 0.875),
    "n": (0.0, 1.0, 0.0),
}


def test_assign_advantages_split_mode_by_hand():
    tree = split_tree()
    assign_advantages(tree["root"], "optimal_stopping_split", std_scope="none")
    got = {name: (node.value, node.q, node.advantage) for name, node in tree.items()}
    assert got == SPLIT_EXPECTED  # binary fractions, no divisor: exact


def test_split_mode_differs_from_optimal_stopping_where_the_max_was_taken():
    # optimal_stopping on the same tree: V(w) = max(-1, 0.75) = 0.75, Q(w) = 0.5; V(q) = max(mean(1, -1) = 0,
    # mean(0.25, 0.5) = 0.375) = 0.375, Q(q) = 0.125; root's children 0.5, 0.125 (mean 0.3125) -> A(q) = -0.1875
    tree = split_tree()
    assign_advantages(tree["root"], "optimal_stopping", std_scope="none")
    assert (tree["w"].value, tree["q"].value, tree["q"].advantage) == (0.75, 0.375, -0.1875)


def flat_tree() -> dict[str, Node]:
    """root -> [g -> [0.5, 0.5] (flat), h -> [0.3] (an only child), k -> [1, 0, -1] (not flat; 0 is its mean)]."""
    nodes = {"g1": leaf(0.5), "g2": leaf(0.5), "h1": leaf(0.3), "k1": leaf(1.0), "k2": leaf(0.0), "k3": leaf(-1.0)}
    nodes["g"] = ask(0.0, nodes["g1"], nodes["g2"])
    nodes["h"] = ask(0.0, nodes["h1"])
    nodes["k"] = ask(0.0, nodes["k1"], nodes["k2"], nodes["k3"])
    nodes["root"] = ask(0.0, nodes["g"], nodes["h"], nodes["k"])
    return nodes


@pytest.mark.parametrize("mode", VALUE_MODES)
def test_flat_sibling_nodes_by_hand(mode):
    # root's children have Q 0.5, 0.3, 0 (every group has one kind: the same in every mode): not flat.
    # k's children Q 1, 0, -1 (mean 0): k2's advantage is 0 / scale = 0.0, but the group is not flat.
    tree = flat_tree()
    values = node_values(tree["root"], mode)
    flat = flat_sibling_nodes(tree["root"], values)
    assert {name for name, node in tree.items() if node in flat} == {"g1", "g2", "h1"}
    for scope in ("tree", "siblings", "none"):
        advantages = tree_advantages(tree["root"], values, std_scope=scope)
        assert advantages[tree["k2"]] == 0.0
        assert all(advantages[node] == 0.0 for node in flat)


def test_flat_sibling_nodes_uses_the_rounding_tolerance():
    # inner's children: Q 0.7 and -0.1 + 0.8 = 0.7000000000000001, flat within the tolerance (as tree_advantages
    # zeroes them); the leaf below the question is an only child. The root's children (Q 0 and 0.7) are not flat.
    question = ask(-0.1, leaf(0.8))
    inner = ask(0.0, leaf(0.7), question)
    root = ask(0.0, leaf(0.0), inner)
    flat = flat_sibling_nodes(root, node_values(root))
    assert flat == {inner.children[0], question, question.children[0]}


def test_flat_tree_has_every_non_root_node_flat():
    # every path returns 0.7 (up to one ulp): 0.7; 0.2 + 0.5; -0.1 + 0.8; -0.1 + 0.3 + 0.5
    root = ask(0.0, leaf(0.7), ask(0.2, leaf(0.5)), ask(-0.1, leaf(0.8), ask(0.3, leaf(0.5))))
    flat = flat_sibling_nodes(root, node_values(root, "optimal_stopping_split"))
    assert flat == set(depth_first(root)[1:]) and len(flat) == 7


def test_a_flat_tree_is_flat_whatever_the_values():
    # The tree's leaf returns decide first: 0.7 and -0.1 + 0.8 are flat, so every non-root node is, even with node
    # values under which the root's children would have Q 0.7 and 4.9 (as tree_advantages, which zeroes them all).
    question = ask(-0.1, leaf(0.8))
    root = ask(0.0, leaf(0.7), question)
    values = {root: 0.0, root.children[0]: 0.0, question: 5.0, question.children[0]: 0.0}
    assert flat_sibling_nodes(root, values) == set(depth_first(root)[1:])
    assert set(tree_advantages(root, values, std_scope="none").values()) == {0.0}


def test_below_a_root_of_any_width_pairs_make_the_split_value_the_mean():
    # a [4, 2, 2] tree: every node below the root has two children, so the split value has nothing to split and
    # takes the mean; the root's value enters no advantage, so the two modes give the same advantages everywhere
    # (the decision-hard game's [4, 2, 2, 2] trees train exactly alike under both)
    def question(reward: float, *children: Node) -> Node:
        return ask(reward, *children)

    def build() -> Node:
        return Node(children=[
            leaf(1.0), question(-0.1, leaf(-1.0), question(-0.1, leaf(1.0), leaf(0.5))),
            question(-0.1, question(-0.1, leaf(1.0), leaf(-1.0)), leaf(1.0)), leaf(-1.0)])

    mean_tree, split_tree, stopping_tree = build(), build(), build()
    assign_advantages(mean_tree, "mean", std_scope="none")
    assign_advantages(split_tree, "optimal_stopping_split", std_scope="none")
    assign_advantages(stopping_tree, "optimal_stopping", std_scope="none")
    advantages = {name: [n.advantage for n in depth_first(tree)[1:]]
                  for name, tree in (("mean", mean_tree), ("split", split_tree), ("stopping", stopping_tree))}
    assert advantages["split"] == advantages["mean"]
    assert advantages["stopping"] != advantages["mean"]  # the max of single samples is what the split removes
