"""An environment's reward per turn and its end of the episode (issue 58 §3), through the tree expansion with a scripted
engine (tests/test_tool_trl_defects.py's): a tree's node rewards are the environment's and back up as Q = r + V; an
environment that sets ``finished`` ends its chain; TRL's own OpenReward adapter class runs unchanged, its per-step
rewards counted; and with ``turn_rewards`` off (the default) the same environment runs as TRL runs it."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest

from lit_grpo.errors import InputError
from lit_grpo.tasks.tools.task import ToolTask
from lit_grpo.tree import assign_advantages, chain_turn_advantages
from tests.test_tool_trl_defects import CALL, answer_reward, grow

RECORDS = [{"prompt": "q", "answer": "7"}] * 4


class Steps:
    """An environment with a reward per step (its ``rewards`` list) that ends the episode at ``probe(3)``."""

    def reset(self, **row):
        self.rewards, self.finished = [], False

    def probe(self, x: int) -> str:
        """Look at a number.

        Args:
            x: The number.
        """
        self.rewards.append(0.5 * x if x != 0 else None)  # probe(0): a step without a reward
        self.finished = self.finished or x == 3
        return f"seen {x}"


def probe(*xs):
    return "\n".join(CALL % ("probe", '{"x": %d}' % x) for x in xs)


def children_rewards(node):
    return [child.reward for child in node.children]


@pytest.mark.parametrize("timeout", [10.0, None], ids=["hosted", "in-process"])
def test_a_tree_nodes_rewards_are_the_environments_and_back_up(timeout):
    task = ToolTask(records=RECORDS, environment=Steps, rewards=[answer_reward], max_turns=3, tool_timeout=timeout,
                    turn_rewards="environment")

    def script(turn, text):
        return [probe(1, 2, 0), probe(-1)] if turn == 1 else ["7", probe(3)]

    try:
        (root,) = grow(task, script, [2, 2, 1])  # the second child at turn 2 replays its path on a fresh instance
    finally:
        task.close()
    first, second = root.children
    # turn 1: 0.5 * 1 + 0.5 * 2 + (None: 0) = 1.5 and 0.5 * -1 = -0.5; turn 2: the answer "7" scores 1 (no step);
    # probe(3) earns 1.5 and ends the episode (its last message a tool's, which answer_reward scores 0)
    assert children_rewards(root) == [1.5, -0.5]
    assert children_rewards(first) == [1.0, 1.5] and children_rewards(second) == [1.0, 1.5]
    assert [child.kind for child in first.children] == ["answer", "finished"]
    assert all(leaf.terminal and not leaf.children for leaf in first.children + second.children)
    assign_advantages(root, "mean")
    # Q = r + V: 1.5 + mean(1.0, 1.5) = 2.75 and -0.5 + 1.25 = 0.75
    assert [first.q, second.q] == [2.75, 0.75]


def test_an_environment_that_sets_finished_ends_its_chain_and_turns_take_their_reward_to_go():
    task = ToolTask(records=RECORDS, environment=Steps, rewards=[answer_reward], max_turns=3, tool_timeout=None,
                    turn_rewards="environment")
    contexts = []

    def script(turn, text):
        contexts.append(turn)
        return [probe(3), probe(1), "7"] if turn == 1 else ["7"]

    try:
        (root,) = grow(task, script, [3, 1, 1])
    finally:
        task.close()
    ended, asked, answered = root.children
    assert ended.kind == "finished" and ended.terminal and not ended.children  # no second turn for it
    assert ended.episode.completion[-1] == {"role": "tool", "name": "probe", "content": "seen 3"}
    assert contexts == [1, 2]  # one call of turn 2, for the chain that asked
    # turn rewards: ended [1.5 + 0], asked [0.5, 1.0 (its answer)], answered [1.0]. Reward-to-go [1.5], [1.5, 1.0],
    # [1.0]; t=0: 1.5 - (1.5 + 1.0)/2 = 0.25, 0.25, 1.0 - 1.5 = -0.5; t=1: 1.0 - (0 + 0)/2 = 1.0
    assert [children_rewards(root), children_rewards(asked)] == [[1.5, 0.5, 1.0], [1.0]]
    assert chain_turn_advantages(root, "reward_to_go", "rloo") == [[0.25], [0.25, 1.0], [-0.5]]


def test_with_turn_rewards_off_the_same_environment_runs_as_trl_runs_it():
    task = ToolTask(records=RECORDS, environment=Steps, rewards=[answer_reward], max_turns=3, tool_timeout=None)
    try:
        (root,) = grow(task, lambda turn, text: [probe(3)] if turn == 1 else ["7"], [1, 1, 1])
    finally:
        task.close()
    (call,) = root.children
    assert (call.kind, call.reward, children_rewards(call)) == ("call", 0.0, [1.0])  # finished ignored, turn 0


def test_turn_rewards_need_an_environment_and_its_steps_must_be_numbers():
    with pytest.raises(InputError, match="turn_rewards 'environment' reads each turn's reward off the environment"):
        ToolTask(records=RECORDS, tools=[len], rewards=[answer_reward], turn_rewards="environment")

    class Broken(Steps):
        def probe(self, x: int) -> str:
            """Look.

            Args:
                x: The number.
            """
            self.rewards.append(float("nan"))
            return "seen"

    task = ToolTask(records=RECORDS, environment=Broken, max_turns=2, tool_timeout=None, turn_rewards="environment")
    try:
        with pytest.raises(InputError, match="environment Broken: a step reward in its `rewards` list is nan"):
            grow(task, lambda turn, text: [probe(1)] if turn == 1 else ["7"], [1, 1])
    finally:
        task.close()


class FakeOpenRewardServer:
    """An ORS environment as the ``openreward`` SDK presents one to TRL's adapter: ``session(...)`` is a context
    manager whose session gives the prompt and answers ``call_tool`` with a ToolOutput (blocks, reward, metadata,
    finished). ``look`` earns 0.25; ``submit`` earns 1 for "7", else -1, and finishes the episode."""

    def session(self, **_):
        server = SimpleNamespace(get_prompt=lambda: [{"type": "text", "text": "Find the number."}],
                                 call_tool=self.call_tool)
        return SimpleNamespace(__enter__=lambda: server, __exit__=lambda *a: None)

    @staticmethod
    def call_tool(name, arguments):
        if name == "look":
            return SimpleNamespace(blocks=[{"type": "text", "text": "it is 7"}], reward=0.25, metadata=None,
                                   finished=False)
        right = arguments.get("answer") == "7"
        return SimpleNamespace(blocks=[{"type": "text", "text": "done"}], reward=1.0 if right else -1.0,
                               metadata={}, finished=True)


TOOL_SPECS = [{"name": "look", "description": "Look around.", "input_schema": {"properties": {}}},
              {"name": "submit", "description": "Submit the answer.",
               "input_schema": {"properties": {"answer": {"type": "string", "description": "The answer."}},
                                "required": ["answer"]}}]


def open_reward_environment():
    """TRL's own adapter class, unchanged (a subclass only so that its tools bind to a class of this test)."""
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # TRL warns that experimental APIs may change
    from trl.experimental.openreward.environment import _RolloutEnvironment

    class ORS(_RolloutEnvironment):
        pass

    # the SDK context manager is entered through the class's dunder methods: give it a class that has them
    def session(**kwargs):
        server = FakeOpenRewardServer().session(**kwargs).__enter__()
        return type("Session", (), {"__enter__": lambda self: server, "__exit__": lambda self, *a: None})()

    return ORS(base_url="http://127.0.0.1:1", _client=object(), _env=SimpleNamespace(session=session),
               _tool_specs=TOOL_SPECS)


def test_trls_openreward_adapter_runs_unchanged_its_steps_rewarded_and_finished_read():
    task = ToolTask(records=RECORDS, environment=open_reward_environment, max_turns=3, tool_timeout=None,
                    turn_rewards="environment")  # no reward function: the return is the sum of the steps' rewards

    def script(turn, text):
        if turn == 1:
            return [CALL % ("submit", '{"answer": "7"}'), CALL % ("look", "{}")]
        return [CALL % ("submit", '{"answer": "5"}')]

    try:
        (root,) = grow(task, script, [2, 1, 1])
    finally:
        task.close()
    right, looked = root.children
    assert (right.kind, right.reward, right.children) == ("finished", 1.0, [])
    assert "Find the number." in str(right.episode.messages[0]["content"])  # reset's prompt, appended by TRL's rule
    assert (looked.reward, children_rewards(looked), looked.children[0].kind) == (0.25, [-1.0], "finished")
    assert looked.children[0].episode.environment.rewards == [0.25, -1.0]
