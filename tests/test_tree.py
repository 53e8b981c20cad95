"""Tree-relative advantages (design §6) against hand-computed numbers."""

import math

import pytest
import torch

from lit_grpo.losses import group_advantages
from lit_grpo.tree import (
    Node,
    assign_advantages,
    bellman_value,
    close_with_no_answer,
    depth_first,
    leaf_returns,
    node_values,
    render_tree,
    walk,
)


def leaf(reward: float) -> Node:
    return Node(reward=reward, terminal=True)


def ask(reward: float, *children: Node) -> Node:
    return Node(reward=reward, children=list(children))


def clarification_tree() -> dict[str, Node]:
    """Depth 4, terminal and continuing children mixed; asking costs 0.25, a malformed segment scores -1.

    root (r 0)
    ├─ a  terminal    1     right answer
    ├─ b  terminal    0     wrong answer
    ├─ m  terminal   -1     malformed
    └─ c  continuing -0.25
       ├─ d  terminal    -1     malformed
       └─ e  continuing -0.25
          ├─ f  terminal    1
          └─ h  continuing -0.25
             ├─ i  terminal 1
             └─ j  terminal 0.5
    """
    nodes = {name: leaf(r) for name, r in [("a", 1.0), ("b", 0.0), ("m", -1.0), ("d", -1.0), ("f", 1.0)]}
    nodes |= {"i": leaf(1.0), "j": leaf(0.5)}
    nodes["h"] = ask(-0.25, nodes["i"], nodes["j"])
    nodes["e"] = ask(-0.25, nodes["f"], nodes["h"])
    nodes["c"] = ask(-0.25, nodes["d"], nodes["e"])
    nodes["root"] = ask(0.0, nodes["a"], nodes["b"], nodes["m"], nodes["c"])
    return nodes


# Leaf returns in depth-first order a, b, m, d, f, i, j: 1, 0, -1, -1.25, 0.5, 0.25, -0.25.
# Mean -0.75 / 7 = -3/28; mean of squares (1 + 0 + 1 + 1.5625 + 0.25 + 0.0625 + 0.0625) / 7 = 3.9375 / 7 = 0.5625;
# population variance 0.5625 - 9/784 = 27/49, sigma_tree = 3 sqrt(3) / 7 = 0.7423075; + eps 1e-6 = 0.7423085.
SCALE = 3 * math.sqrt(3) / 7 + 1e-6

# name: (V, Q, Q - mean of the sibling Qs); the advantage is the last entry / SCALE.
MEAN_EXPECTED = {
    # V(h) = mean(1, 0.5) = 0.75, V(e) = mean(Q(f) = 1, Q(h) = -0.25 + 0.75 = 0.5) = 0.75,
    # V(c) = mean(Q(d) = -1, Q(e) = -0.25 + 0.75 = 0.5) = -0.25, V(root) = mean(1, 0, -1, Q(c) = -0.5) = -0.125
    "root": (-0.125, -0.125, None),
    "a": (0.0, 1.0, 1.125),  # root's children: Q 1, 0, -1, -0.5, mean -0.125 -> A(a) = 1.125 / SCALE = 1.5155424
    "b": (0.0, 0.0, 0.125),  # 0.1683936
    "m": (0.0, -1.0, -0.875),  # -1.1787552
    "c": (-0.25, -0.5, -0.375),  # -0.5051808
    "d": (0.0, -1.0, -0.75),  # c's children: Q -1, 0.5, mean -0.25 -> -1.0103616
    "e": (0.75, 0.5, 0.75),  # 1.0103616
    "f": (0.0, 1.0, 0.25),  # e's children: Q 1, 0.5, mean 0.75 -> 0.3367872
    "h": (0.75, 0.5, -0.25),  # -0.3367872
    "i": (0.0, 1.0, 0.25),  # h's children: Q 1, 0.5, mean 0.75 -> 0.3367872
    "j": (0.0, 0.5, -0.25),  # -0.3367872
}
STOPPING_EXPECTED = {
    # V(h) = 0.75 (terminal children only); V(e) = max(stop: Q(f) = 1, go on: Q(h) = 0.5) = 1 (stopping wins);
    # V(c) = max(stop: Q(d) = -1, go on: Q(e) = -0.25 + 1 = 0.75) = 0.75 (going on wins);
    # V(root) = max(stop: mean(1, 0, -1) = 0, go on: Q(c) = -0.25 + 0.75 = 0.5) = 0.5
    "root": (0.5, 0.5, None),
    "a": (0.0, 1.0, 0.875),  # root's children: Q 1, 0, -1, 0.5, mean 0.125 -> 0.875 / SCALE = 1.1787552
    "b": (0.0, 0.0, -0.125),  # -0.1683936
    "m": (0.0, -1.0, -1.125),  # -1.5155424
    "c": (0.75, 0.5, 0.375),  # 0.5051808
    "d": (0.0, -1.0, -0.875),  # c's children: Q -1, 0.75, mean -0.125 -> -1.1787552
    "e": (1.0, 0.75, 0.875),  # 1.1787552
    "f": (0.0, 1.0, 0.25),  # e's children: Q 1, 0.5, mean 0.75 (as in mean mode) -> 0.3367872
    "h": (0.75, 0.5, -0.25),  # -0.3367872
    "i": (0.0, 1.0, 0.25),  # 0.3367872
    "j": (0.0, 0.5, -0.25),  # -0.3367872
}


def test_leaf_returns_leave_out_the_root_reward():
    tree = clarification_tree()
    tree["root"].reward = 3.0  # the same constant on every path: left out
    assert leaf_returns(tree["root"]) == [1.0, 0.0, -1.0, -1.25, 0.5, 0.25, -0.25]


@pytest.mark.parametrize("mode, expected", [("mean", MEAN_EXPECTED), ("optimal_stopping", STOPPING_EXPECTED)])
def test_depth_four_tree_by_hand(mode, expected):
    tree = clarification_tree()
    tree["root"].advantage = 7.0  # the root has no advantage: overwritten with None

    values = node_values(tree["root"], mode)  # pure: reads the tree, writes nothing
    assert all(node.value is None and node.q is None for node in tree.values())
    assert {name: values[node] for name, node in tree.items()} == {name: v for name, (v, _, _) in expected.items()}

    assert assign_advantages(tree["root"], mode) is None
    for name, (value, q, centered) in expected.items():
        node = tree[name]
        assert (node.value, node.q) == (value, q), name  # binary fractions: exact
        if centered is None:
            assert node.advantage is None
        else:
            assert node.advantage == pytest.approx(centered / SCALE, rel=0, abs=1e-12), name


def test_modes_differ_only_where_the_options_differ():
    # Same rewards, two modes: V(root), V(c), V(e) and the advantages of a, b, m, c, d, e differ; h's subtree agrees.
    mean_tree, stopping_tree = clarification_tree(), clarification_tree()
    assign_advantages(mean_tree["root"], "mean")
    assign_advantages(stopping_tree["root"], "optimal_stopping")
    differ = {name for name in mean_tree if mean_tree[name].value != stopping_tree[name].value}
    assert differ == {"root", "c", "e"}
    differ = {name for name in mean_tree if mean_tree[name].advantage != stopping_tree[name].advantage}
    assert differ == {"a", "b", "m", "c", "d", "e"}


def test_bellman_value_one_node():
    # Q 1, -1 (terminal) and 0.75 (continuing): mean 0.75 / 3 = 0.25; optimal stopping max(0, 0.75) = 0.75;
    # terminal children only: max over the one option, mean(1, -1) = 0
    assert bellman_value([1.0, -1.0, 0.75], [True, True, False], "mean") == 0.25
    assert bellman_value([1.0, -1.0, 0.75], [True, True, False], "optimal_stopping") == 0.75
    assert bellman_value([1.0, -1.0], [True, True], "optimal_stopping") == 0.0
    assert bellman_value([-0.5, -1.5], [False, False], "optimal_stopping") == -1.0


@pytest.mark.parametrize("mode", ["mean", "optimal_stopping"])
@pytest.mark.parametrize(
    "rewards, eps, expected",
    [
        # design §4's worked example: mean 1, std 0.8164966, A = +-1 / 0.8164976 = +-1.2247434
        ([0.0, 1.0, 2.0], 1e-6, [-1.2247434, 0.0, 1.2247434]),
        # eps is passed through: +-1 / (0.8164966 + 0.5) = +-0.7595918
        ([0.0, 1.0, 2.0], 0.5, [-0.7595918, 0.0, 0.7595918]),
        # mean 0.2, population variance (0.64 + 0.04 + 0.04 + 0.64 + 1.44) / 5 = 0.56, std 0.7483315;
        # A = (0.8, -0.2, -0.2, 0.8, -1.2) / 0.7483325 = 1.0690435, -0.2672609, ..., -1.6035653
        ([1.0, 0.0, 0.0, 1.0, -1.0], 1e-6, [1.0690435, -0.2672609, -0.2672609, 1.0690435, -1.6035653]),
        # mean 0.45, population variance (0.0225 + 0.2025 + 0.1225 + 0.0025 + 0.0625 + 0.0625) / 6 = 0.0791667,
        # std 0.2813657; A = (-0.15, 0.45, -0.35, 0.05, 0.25, -0.25) / 0.2813667
        ([0.3, 0.9, 0.1, 0.5, 0.7, 0.2], 1e-6, [-0.5331121, 1.5993363, -1.2439282, 0.1777040, 0.8885202, -0.8885202]),
    ],
)
def test_depth_one_tree_is_grpo(mode, rewards, eps, expected):
    root = Node(reward=0.5, children=[leaf(r) for r in rewards])  # a root reward shifts q only
    assign_advantages(root, mode, eps)
    advantages = [child.advantage for child in root.children]
    grpo = group_advantages(torch.tensor([rewards]), "grpo", eps=eps)[0].tolist()
    assert advantages == pytest.approx(grpo, rel=0, abs=1e-6)
    assert advantages == pytest.approx(expected, rel=0, abs=1e-6)
    # V(root) is the mean reward in both modes (every option is terminal); q adds the root's own reward
    assert root.value == pytest.approx(sum(rewards) / len(rewards), rel=0, abs=1e-15)
    assert root.q == root.reward + root.value


@pytest.mark.parametrize("mode", ["mean", "optimal_stopping"])
def test_all_equal_leaves_are_exactly_zero(mode):
    # eight answers of 0.7: grpo gives exactly 0 (design §4), and so does the tree
    root = ask(0.0, *[leaf(0.7) for _ in range(8)])
    assign_advantages(root, mode)
    assert [child.advantage for child in root.children] == [0.0] * 8
    assert group_advantages(torch.full((1, 8), 0.7), "grpo").tolist() == [[0.0] * 8]
    assert root.value == 0.7  # fsum(8 x 0.7) / 8 rounds back to 0.7


@pytest.mark.parametrize("mode", ["mean", "optimal_stopping"])
def test_paths_with_equal_returns_are_exactly_zero(mode):
    # Four paths that all return 0.7: 0.7; 0.2 + 0.5; -0.1 + 0.8; -0.1 + 0.3 + 0.5. In float64 -0.1 + 0.8 is
    # 0.7000000000000001, one ulp off: without the flat rule sigma_tree ~ 5e-17 and the advantages are rounding
    # noise of ~1e-10, not 0.
    root = ask(0.0, leaf(0.7), ask(0.2, leaf(0.5)), ask(-0.1, leaf(0.8), ask(0.3, leaf(0.5))))
    returns = leaf_returns(root)
    assert returns == [0.7, 0.7, 0.7000000000000001, 0.7]
    assign_advantages(root, mode)
    non_root = depth_first(root)[1:]
    assert [node.advantage for node in non_root] == [0.0] * 7
    # every option returns 0.7 from the root, so V(root) = 0.7 in both modes (up to the same ulp)
    assert root.value == pytest.approx(0.7, rel=0, abs=1e-15)


def test_sibling_group_with_equal_q_is_exactly_zero():
    # root -> [terminal 0, continuing 0 -> [terminal 0.7, continuing -0.1 -> [terminal 0.8]]]. The tree is not flat
    # (returns 0, 0.7, 0.7), but the inner siblings' Q are 0.7 and -0.1 + 0.8 = 0.7000000000000001: equal but for
    # one ulp, so their advantages are exactly 0, not 1e-16.
    inner = ask(0.0, leaf(0.7), ask(-0.1, leaf(0.8)))
    root = ask(0.0, leaf(0.0), inner)
    assign_advantages(root)
    assert [child.advantage for child in inner.children] == [0.0, 0.0]
    assert inner.children[1].children[0].advantage == 0.0
    # root's children: Q 0 and 0.7, mean 0.35; sigma_tree = 0.7 sqrt(2) / 3 = 0.3299832 -> -+0.35 / 0.3299842
    assert [child.advantage for child in root.children] == pytest.approx([-1.0606569, 1.0606569], rel=0, abs=1e-6)


def test_small_real_spread_is_not_zeroed():
    # returns 0.7 and 0.700000001: a spread of 1e-9, far above the 7e-13 float-rounding allowance.
    # mean 0.7000000005, sigma 5e-10; A = -+5e-10 / (5e-10 + 1e-6) = -+4.9975012e-4
    root = ask(0.0, leaf(0.7), leaf(0.7 + 1e-9))
    assign_advantages(root)
    assert [child.advantage for child in root.children] == pytest.approx([-4.9975012e-4, 4.9975012e-4], rel=1e-6)


def cut_off_tree() -> dict[str, Node]:
    """max_depth = 2: k asked a second question and is closed by the environment; m is a malformed segment.

    root
    ├─ a  terminal    1
    └─ c  continuing -0.25
       ├─ m  terminal   -1       malformed-output reward
       └─ k  continuing -0.25   cut off at max_depth
          └─ n  terminal -0.5    no-answer reward, no policy tokens
    """
    nodes = {"a": leaf(1.0), "m": leaf(-1.0), "k": ask(-0.25)}  # k is open: no children yet
    nodes["n"] = close_with_no_answer(nodes["k"], -0.5)
    nodes["c"] = ask(-0.25, nodes["m"], nodes["k"])
    nodes["root"] = ask(0.0, nodes["a"], nodes["c"])
    return nodes


# Leaf returns a 1, m -1.25, n -1: mean -5/12, mean of squares 3.5625 / 3 = 1.1875, variance 1.1875 - 25/144 =
# 146/144, sigma_tree = sqrt(146) / 12 = 1.0069205; + eps = 1.0069215.
CUT_SCALE = math.sqrt(146) / 12 + 1e-6


@pytest.mark.parametrize(
    "mode, expected",
    [
        (
            "mean",
            # V(k) = Q(n) = -0.5; V(c) = mean(Q(m) = -1, Q(k) = -0.75) = -0.875; V(root) = mean(1, -1.125) = -0.0625
            {
                "root": (-0.0625, -0.0625, None),
                "a": (0.0, 1.0, 1.0625),  # 1.0625 / CUT_SCALE = 1.0551965
                "c": (-0.875, -1.125, -1.0625),  # -1.0551965
                "m": (0.0, -1.0, -0.125),  # c's children: Q -1, -0.75, mean -0.875 -> -0.1241408
                "k": (-0.5, -0.75, 0.125),  # 0.1241408
                "n": (0.0, -0.5, 0.0),  # an only child: Q(n) - Q(n) = 0
            },
        ),
        (
            "optimal_stopping",
            # V(k) = -0.5 (its one terminal child); V(c) = max(stop: -1, go on: -0.75) = -0.75;
            # V(root) = max(stop: 1, go on: Q(c) = -1) = 1
            {
                "root": (1.0, 1.0, None),
                "a": (0.0, 1.0, 1.0),  # root's children: Q 1, -1, mean 0 -> 1 / CUT_SCALE = 0.9931261
                "c": (-0.75, -1.0, -1.0),  # -0.9931261
                "m": (0.0, -1.0, -0.125),  # -0.1241408
                "k": (-0.5, -0.75, 0.125),  # 0.1241408
                "n": (0.0, -0.5, 0.0),
            },
        ),
    ],
)
def test_cut_off_branch_and_malformed_segment(mode, expected):
    tree = cut_off_tree()
    assert tree["k"].children == [tree["n"]]
    assert (tree["n"].terminal, tree["n"].reward, tree["n"].children) == (True, -0.5, [])
    assign_advantages(tree["root"], mode)
    for name, (value, q, centered) in expected.items():
        node = tree[name]
        assert (node.value, node.q) == (value, q), name
        if centered is None:
            assert node.advantage is None
        elif centered == 0.0:
            assert node.advantage == 0.0  # exactly
        else:
            assert node.advantage == pytest.approx(centered / CUT_SCALE, rel=0, abs=1e-12), name


def test_close_with_no_answer_only_closes_open_continuing_nodes():
    with pytest.raises(ValueError, match="cannot close a terminal node"):
        close_with_no_answer(leaf(1.0), -0.5)
    with pytest.raises(ValueError, match="already has 1 children"):
        close_with_no_answer(ask(0.0, leaf(1.0)), -0.5)


def shared_leaf_tree() -> Node:
    shared = leaf(1.0)
    return ask(0.0, shared, ask(-0.25, shared))


@pytest.mark.parametrize(
    "build, message",
    [
        (lambda: ask(0.0, leaf(1.0), ask(-0.25)), r"non-terminal node without children at root\.children\[1\]"),
        (lambda: ask(0.0), "non-terminal node without children at root:"),
        (lambda: ask(0.0, Node(1.0, True, [leaf(1.0)])), r"terminal node at root\.children\[0\] has 1 children"),
        (lambda: Node(0.0, terminal=True), "root is the prompt and cannot be terminal"),
        (lambda: ask(0.0, leaf(1.0), leaf(float("nan"))), r"root\.children\[1\] has a non-finite reward"),
        (shared_leaf_tree, r"node at root\.children\[1\]\.children\[0\] appears twice"),
    ],
)
def test_malformed_trees_are_rejected_before_anything_is_written(build, message):
    root = build()
    with pytest.raises(ValueError, match=message):
        assign_advantages(root)
    assert root.value is None and all(child.value is None for child in root.children)


def test_unknown_value_mode_names_the_choices():
    root = ask(0.0, leaf(1.0), leaf(0.0))
    choices = "mean, optimal_stopping, optimal_stopping_split"
    with pytest.raises(ValueError, match=f"unknown value mode 'max'; valid choices: {choices}$"):
        assign_advantages(root, "max")
    assert root.value is None


def test_depth_first_order():
    # root -> [a -> [c, d], b]: a node, then its first child's subtree, then the next child's
    c, d, b = leaf(1.0), leaf(0.0), leaf(0.5)
    a = ask(-0.25, c, d)
    root = ask(0.0, a, b)
    order = depth_first(root)
    assert len(order) == 5
    assert all(got is want for got, want in zip(order, [root, a, c, d, b]))
    assert [path for path, _ in walk(root)] == [(), (0,), (0, 0), (0, 1), (1,)]


def test_render_tree():
    root = ask(0.0, leaf(1.0), ask(-0.25, leaf(1.0), leaf(0.0)))
    assert render_tree(root) == (
        "root r=0.0000 V=- Q=- A=-\n"
        "  terminal r=1.0000 V=- Q=- A=-\n"
        "  continuing r=-0.2500 V=- Q=- A=-\n"
        "    terminal r=1.0000 V=- Q=- A=-\n"
        "    terminal r=0.0000 V=- Q=- A=-"
    )
    # returns 1, 0.75, -0.25: mean 0.5, variance (0.25 + 0.0625 + 0.5625) / 3 = 0.2916667, sigma 0.5400617.
    # V(continuing) = 0.5, Q = 0.25; V(root) = mean(1, 0.25) = 0.625.
    # A: +-0.375 / 0.5400627 = +-0.6944 at depth 1, +-0.5 / 0.5400627 = +-0.9258 at depth 2.
    assign_advantages(root)
    assert render_tree(root) == (
        "root r=0.0000 V=0.6250 Q=0.6250 A=-\n"
        "  terminal r=1.0000 V=0.0000 Q=1.0000 A=0.6944\n"
        "  continuing r=-0.2500 V=0.5000 Q=0.2500 A=-0.6944\n"
        "    terminal r=1.0000 V=0.0000 Q=1.0000 A=0.9258\n"
        "    terminal r=0.0000 V=0.0000 Q=0.0000 A=-0.9258"
    )


@pytest.mark.parametrize("scope", ["tree", "siblings"])
def test_std_scope_divides_by_the_whole_tree_or_by_each_sibling_group(scope):
    # root -> [question r=-0.1 -> [1, -1], answer 0.5]; leaf returns 0.9, -1.1, 0.5 (mean 0.1)
    root = ask(0.0, ask(-0.1, leaf(1.0), leaf(-1.0)), leaf(0.5))
    assign_advantages(root, "mean", std_scope=scope)
    sigma_tree = math.sqrt((0.8**2 + 1.2**2 + 0.4**2) / 3) + 1e-6
    # the root's children have Q -0.1 and 0.5 (std 0.3); the question's children 1 and -1 (std 1)
    top, inner = (sigma_tree, sigma_tree) if scope == "tree" else (0.3 + 1e-6, 1.0 + 1e-6)
    expected = [-0.3 / top, 1.0 / inner, -1.0 / inner, 0.3 / top]
    assert [n.advantage for n in depth_first(root)[1:]] == pytest.approx(expected, rel=1e-12, abs=0)


@pytest.mark.parametrize("mode, expected", [
    # root Q: 0.5, -1, -0.1 + V(q); V(q) is mean(1, -1, 0.9) = 0.3 (mean) or max(mean(1, -1), 0.9) = 0.9
    # (optimal_stopping), so Q(q) is 0.2 or 0.8 and the root's sibling mean -0.1 or 0.1.
    # q's children Q 1, -1, 0.9 (V(q2) = 1 in both modes): mean 0.3 -> 0.7, -1.3, 0.6. q2's children: flat -> 0.
    ("mean", [0.6, -0.9, 0.3, 0.7, -1.3, 0.6, 0.0, 0.0]),
    ("optimal_stopping", [0.4, -1.1, 0.7, 0.7, -1.3, 0.6, 0.0, 0.0]),
])
def test_std_scope_none_leaves_advantages_in_reward_units(mode, expected):
    # root -> [answer 0.5, answer -1, q r=-0.1 -> [answer 1, answer -1, q2 r=-0.1 -> [answer 1, answer 1]]]
    root = ask(0.0, leaf(0.5), leaf(-1.0), ask(-0.1, leaf(1.0), leaf(-1.0), ask(-0.1, leaf(1.0), leaf(1.0))))
    assign_advantages(root, mode, std_scope="none")
    advantages = [n.advantage for n in depth_first(root)[1:]]
    assert advantages == pytest.approx(expected, rel=1e-12, abs=1e-15)  # no eps in a divisor: 1e-6 would show
    assert advantages[-2:] == [0.0, 0.0]  # a flat sibling group is exactly zero


def test_std_scope_none_is_the_divided_scopes_times_their_divisor():
    # the tree of test_std_scope_divides_by_the_whole_tree_or_by_each_sibling_group: the same centring, no division
    trees = {scope: ask(0.0, ask(-0.1, leaf(1.0), leaf(-1.0)), leaf(0.5)) for scope in ("none", "tree")}
    for scope, root in trees.items():
        assign_advantages(root, "mean", std_scope=scope)
    sigma_tree = math.sqrt((0.8**2 + 1.2**2 + 0.4**2) / 3) + 1e-6
    undivided = [n.advantage for n in depth_first(trees["none"])[1:]]
    assert undivided == pytest.approx([-0.3, 1.0, -1.0, 0.3], rel=1e-12, abs=0)
    assert [n.advantage * sigma_tree for n in depth_first(trees["tree"])[1:]] == pytest.approx(undivided, rel=1e-12)


def test_std_scope_none_keeps_a_flat_tree_exactly_zero():
    root = ask(0.0, leaf(0.7), ask(-0.1, leaf(0.8)), leaf(0.7))  # every leaf return 0.7 (up to rounding)
    assign_advantages(root, "optimal_stopping", std_scope="none")
    assert [n.advantage for n in depth_first(root)[1:]] == [0.0, 0.0, 0.0, 0.0]


def test_unknown_std_scope_names_the_choices():
    with pytest.raises(ValueError, match="unknown std scope 'batch'; valid choices: tree, siblings, none"):
        assign_advantages(ask(0.0, leaf(1.0), leaf(0.0)), std_scope="batch")


@pytest.mark.parametrize("scope, refused", [("tree", False), ("siblings", True), ("none", True)])
def test_a_tree_std_scope_other_than_the_default_is_refused_with_chains(scope, refused):
    from lit_grpo.run.rules import combination_problems

    problems = combination_problems({"tree": {"std_scope": scope}}, {"rollout": "chains"})
    assert problems == ([f"model.tree.std_scope '{scope}' with data.rollout 'chains': only a tree has sibling groups "
                         "and a tree-wide std to divide by or not (chains choose with model.advantage_mode: grpo "
                         "divides by the group's std, drgrpo and centered do not); it takes data.rollout 'tree'"]
                        if refused else [])
    assert combination_problems({"tree": {"std_scope": scope}}, {"rollout": "tree"}) == []
