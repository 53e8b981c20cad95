"""A tool task's figures (``callbacks/metrics.py``'s ``tool_stats``): each call counted once on trees, and the same
names on every rank (every declared tool, one key for the rest) with values that add up to one process's. The
hand-built trees here carry real ``Episode`` objects; ``test_tool_metrics_ddp.py`` runs the same logging on two
DDP ranks."""

from __future__ import annotations

import dataclasses
from collections import Counter
from types import SimpleNamespace

import pytest

from lit_grpo.callbacks.episode_metrics import UNKNOWN_TOOL, global_tool_stats, tool_counts, tool_figures, tool_stats
from lit_grpo.tasks.tools.episode import Episode
from lit_grpo.tree import Node, SegmentNode

TOOLS = ("add", "mul", "sub")


def schema(name: str) -> dict:
    """A transformers JSON schema of a tool named ``name``, as ``ToolBox.schemas`` gives one."""
    return {"type": "function", "function": {"name": name, "description": name,
                                             "parameters": {"type": "object", "properties": {}}}}


def episode(calls: dict | None = None, failures: dict | None = None, tools: tuple[str, ...] = TOOLS) -> Episode:
    """An Episode with these cumulative counts along its path (its other fields empty, whatever they are)."""
    given = {"messages": [], "prompt_messages": 0, "schemas": tuple(schema(n) for n in tools),
             "calls": dict(calls or {}), "failures": dict(failures or {})}
    return Episode(**{f.name: given.get(f.name) for f in dataclasses.fields(Episode)
                      if f.name in given or f.default is dataclasses.MISSING
                      and f.default_factory is dataclasses.MISSING})


def turn(state: Episode, children: list | None = None, kind: str = "call", **counts) -> SegmentNode:
    """A policy node whose turn left ``state``; a leaf (an answer by default) without children."""
    leaf = not children
    return SegmentNode(segment=(1,), terminal=leaf, kind="answer" if leaf and kind == "call" else kind,
                       children=children or [], episode=state, **counts)


def failing_root_call_tree(tool: str = "add") -> SegmentNode:
    """Turn 1 calls ``tool``, which fails; 4 branches then each call it once (it works) and answer: 5 calls, 1
    failed. Every leaf's path holds 2 calls, 1 failed."""
    branches = [turn(episode({tool: 2}, {tool: 1}), [turn(episode({tool: 2}, {tool: 1}))]) for _ in range(4)]
    return SegmentNode(episode=episode(), children=[turn(episode({tool: 1}, {tool: 1}), branches)])


def test_a_call_high_in_a_tree_counts_once_not_once_per_leaf():
    stats = tool_stats([failing_root_call_tree()])
    assert stats["tools/failure_frequency"] == pytest.approx(1 / 5, abs=1e-12)  # counted per leaf: 4 / 8 = 0.5
    # per-episode figures stay averages over the 4 episodes, each its whole path: 2 calls, 1 failure, 3 turns
    assert stats["tools/call_frequency"] == 2.0 and stats["tools/calls/add"] == 2.0
    assert stats["tools/failures/add"] == 1.0 and stats["tools/turns_per_episode"] == 3.0


def test_chains_count_as_before_each_chain_its_own_path():
    chains = SegmentNode(episode=episode(), children=[
        turn(episode({"add": 1}, {"add": 1}), [turn(episode({"add": 2}, {"add": 1}))]),
        turn(episode({"mul": 1}), [turn(episode({"mul": 1}))]),
        turn(episode())])
    stats = tool_stats([chains])
    assert stats["tools/failure_frequency"] == 1 / 3 and stats["tools/call_frequency"] == 1.0
    assert stats["tools/calls/add"] == 2 / 3 and stats["tools/calls/mul"] == 1 / 3


def test_every_declared_tool_is_named_and_undeclared_calls_share_one_key():
    made_up = turn(episode({"ad d": 1, "": 1, "add": 1}, {"ad d": 1, "": 1}), kind="cut")
    stats = tool_stats([SegmentNode(episode=episode(), children=[made_up, turn(episode())])])
    assert stats == {"tools/call_frequency": 3 / 2, "tools/failure_frequency": 2 / 3,
                     "tools/turns_per_episode": 1.0, "tools/cut_episodes": 1 / 2, "tools/malformed_episodes": 0.0,
                     "tools/calls/add": 1 / 2, "tools/failures/add": 0.0,
                     "tools/calls/mul": 0.0, "tools/failures/mul": 0.0,  # declared, never called: still named
                     "tools/calls/sub": 0.0, "tools/failures/sub": 0.0,
                     f"tools/calls/{UNKNOWN_TOOL}": 2 / 2, f"tools/failures/{UNKNOWN_TOOL}": 2 / 2}


def test_no_figures_where_no_node_holds_an_episode():
    games = SegmentNode(children=[SegmentNode(terminal=True, segment=(1,)), Node(terminal=True)])
    assert tool_stats([games]) == {} and tool_counts([games]) is None


def test_a_tool_task_with_no_episode_left_still_names_every_tool():
    # a root whose every turn the environment closed (plain Nodes): zeros, under the same names
    stats = tool_stats([SegmentNode(episode=episode(), children=[Node(terminal=True)])])
    assert sorted(stats) == sorted(tool_stats([failing_root_call_tree()]))
    assert set(stats.values()) == {0.0}


class GatheringStrategy:
    """Stands in for a DDP strategy whose ranks hold ``objects``: ``broadcast(obj, src)`` returns rank src's."""

    def __init__(self, objects: list) -> None:
        self.objects, self.sources = objects, []

    def broadcast(self, obj, src: int = 0):
        self.sources.append(src)
        return self.objects[src]


def rank_trees() -> list[list[SegmentNode]]:
    """Three ranks' trees: rank 0 calls add (one fails) and a made-up name over 3 episodes; rank 1 a tree of 4
    episodes with a failing root-level mul call; rank 2 only a closed root (no episode)."""
    rank0 = [SegmentNode(episode=episode(), children=[
        turn(episode({"add": 1}, {"add": 1}), [turn(episode({"add": 1}, {"add": 1}))]),
        turn(episode({"add": 1, "made_up": 1}, {"made_up": 1}), kind="cut"), turn(episode())])]
    return [rank0, [failing_root_call_tree("mul")], [SegmentNode(episode=episode(), children=[Node(terminal=True)])]]


def test_every_rank_logs_one_processs_figures_on_the_union_of_the_trees():
    trees = rank_trees()
    one_process = tool_stats([root for share in trees for root in share])
    strategy = GatheringStrategy([tool_counts(share) for share in trees])
    for rank in range(3):
        strategy.sources.clear()
        assert global_tool_stats(trees[rank], strategy, 3) == one_process
        assert strategy.sources == [0, 1, 2]  # every rank gathers from every rank, whatever it drew
    # 7 episodes; distinct calls: add 2 (1 failed) + made_up 1 (failed) + mul 5 (1 failed) = 8, 3 failed
    assert one_process["tools/failure_frequency"] == 3 / 8
    assert one_process[f"tools/calls/{UNKNOWN_TOOL}"] == 1 / 7 and one_process["tools/calls/mul"] == 8 / 7
    means = [tool_stats(share)["tools/failure_frequency"] for share in trees]
    assert sum(means) / 3 != pytest.approx(3 / 8)  # a mean of the ranks' ratios is not the global ratio


def test_the_gathered_counts_sum_to_the_one_process_counts():
    trees = rank_trees()
    parts = [tool_counts(share) for share in trees]
    names, union = tool_counts([root for share in trees for root in share])
    assert sum((counts for _, counts in parts), Counter()) == +union
    assert names == frozenset().union(*(n for n, _ in parts)) == frozenset(TOOLS)
    assert tool_figures(names, union) == tool_stats([root for share in trees for root in share])


def test_one_process_gathers_nothing():
    strategy = SimpleNamespace(broadcast=lambda obj, src=0: pytest.fail("no collective with one process"))
    assert global_tool_stats([failing_root_call_tree()], strategy, 1) == tool_stats([failing_root_call_tree()])
    assert global_tool_stats([SegmentNode()], strategy, 1) == {}


def test_the_tasks_declared_names_are_logged_even_where_no_rank_holds_an_episode():
    strategy = GatheringStrategy([None, None])
    stats = global_tool_stats([SegmentNode()], strategy, 2, declared=["add", "lookup"])
    assert sorted(stats) == sorted(["tools/call_frequency", "tools/failure_frequency", "tools/turns_per_episode",
                                    "tools/cut_episodes", "tools/malformed_episodes",
                                    *(f"tools/{kind}/{name}" for kind in ("calls", "failures")
                                      for name in ("add", "lookup", UNKNOWN_TOOL))])
    assert set(stats.values()) == {0.0}
    # declared names join the schemas' (a tool of an environment no rank drew this epoch is still named)
    assert "tools/calls/lookup" in global_tool_stats([failing_root_call_tree()], strategy, 1, declared=["lookup"])


class TwoRanks:
    """A stand-in strategy whose ``broadcast`` gives each rank's object, as DDP's does (the same on every rank)."""

    def __init__(self, objects: list) -> None:
        self.objects = objects

    def broadcast(self, obj, src):
        return self.objects[src]


def scored(parts: dict) -> SegmentNode:
    state = episode()
    state.parts = parts
    return SegmentNode(segment=(1,), terminal=True, kind="answer", episode=state)


def test_each_rewards_mean_and_std_and_what_rewards_logged_are_combined_over_ranks():
    from lit_grpo.callbacks.episode_metrics import global_reward_stats, reward_counts

    rank0 = [SegmentNode(episode=episode(), children=[scored({"exact": 1.0, "judge": None}),
                                                      scored({"exact": 0.0, "judge": 0.5})])]
    rank1 = [SegmentNode(episode=episode(), children=[scored({"exact": 1.0, "judge": None})])]
    counts = [reward_counts(rank0, {"custom/length": (6.0, 2)}), reward_counts(rank1, {})]
    stats = global_reward_stats(rank0, {"custom/length": (6.0, 2)}, TwoRanks(counts), 2)
    # exact scored 1, 0, 1: mean 2/3, population std sqrt(2/9); judge scored one episode (0.5): std 0; custom/length 3
    assert stats == pytest.approx({"rewards/exact/mean": 2 / 3, "rewards/exact/std": (2 / 9) ** 0.5,
                                   "rewards/judge/mean": 0.5, "rewards/judge/std": 0.0, "logged/custom/length": 3.0},
                                  abs=1e-12)
    assert set(global_reward_stats(rank1, {}, TwoRanks(counts), 2)) == set(stats)  # the same names on every rank
