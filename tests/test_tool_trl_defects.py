"""Issue 57's defects of a TRL user's agent, each through the tree expansion with a scripted engine (the unit under test
is the turn logic; engines are tested for real elsewhere), on TRL 1.16's shipped Qwen templates. Each test failed on
the code before the issue: reasoning leaked into ``content``, an environment holding a lock crashed the run, chains
shared one ``reset``, a second end-of-sequence id stopped the fit, rewards taking ``completion_ids`` (or async, or
returning None) scored -1 silently, and a megabyte tool answer grew the context past the model."""

from __future__ import annotations

import asyncio
import os
import tempfile
import threading
from importlib.resources import files

import pytest
from scripted_engine import ScriptedEngine
from transformers import AutoTokenizer

from lit_grpo.engines import SamplingSpec
from lit_grpo.rollout.trees import expand_trees
from lit_grpo.tasks.tools.task import ToolTask
from lit_grpo.tree import chain_advantages, depth_first, policy_nodes


def tokenizer_with(template: str):
    tokenizer = AutoTokenizer.from_pretrained("data/tiny-qwen2-chat")
    tokenizer.chat_template = (files("trl") / "chat_templates" / f"{template}.jinja").read_text()
    return tokenizer


QWEN = tokenizer_with("qwen2_5")
END = QWEN.convert_tokens_to_ids("<|im_end|>")
TEXT_END = QWEN.convert_tokens_to_ids("<|endoftext|>")
CALL = '<tool_call>\n{"name": "%s", "arguments": %s}\n</tool_call>'


def grow(task, script, branching, tokenizer=QWEN, end=END, records=None, limit=None):
    records = records or [{"prompt": [{"role": "user", "content": "What is 3+4?"}], "answer": "7"}]
    engine = ScriptedEngine(script, tokenizer, end)
    return expand_trees(task, engine, tokenizer, records, branching,
                        SamplingSpec(max_new_tokens=64, stop_token_ids=(END,), context_limit=limit))


def answer_reward(prompts, completions, answer, **kwargs):
    return [float(c[-1]["content"].strip() == a) for c, a in zip(completions, answer)]


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first number.
        b: The second number.
    """
    return a + b


def test_reasoning_stays_out_of_the_content_a_reward_reads():
    task = ToolTask(records=[{"prompt": "q", "answer": "7"}] * 4, tools=[add], rewards=[answer_reward], max_turns=2)
    qwen3 = tokenizer_with("qwen3")
    (root,) = grow(task, lambda turn, text: ["<think>\n3 and 4 make 7.\n</think>\n\n7"], [1, 1], tokenizer=qwen3)
    (leaf,) = root.children
    assert leaf.episode.completion == [{"role": "assistant", "reasoning_content": "3 and 4 make 7.", "content": "7"}]
    assert leaf.reward == 1.0 and leaf.correct


class LockedClient:
    """A TRL user's environment: it holds a lock (no pickle, no deepcopy), opens its client on first use and reads
    the row's prompt in reset."""

    def __init__(self):
        self.lock, self.client = threading.Lock(), None

    def reset(self, prompt, answer, **row):
        self.question, self.total = prompt[-1]["content"], 0
        return None

    def bump(self, by: int) -> int:
        """Add to the total through the client.

        Args:
            by: How much.
        """
        with self.lock:
            if self.client is None:
                self.client = threading.Event()  # opened lazily, as a network client would be
            self.total += by
            return self.total

    def get_reward(self) -> float:
        return float(self.total) if self.question == "What is 3+4?" else -5.0


@pytest.mark.parametrize("timeout", [10.0, None], ids=["hosted", "in-process"])
def test_an_environment_holding_a_lock_and_a_lazy_client_runs_as_chains_and_as_a_tree(timeout):
    task = ToolTask(records=[{"prompt": "q", "answer": "7"}] * 4, environment=LockedClient, max_turns=3,
                    tool_timeout=timeout)
    bump = CALL % ("bump", '{"by": %d}')
    try:
        (chains,) = grow(task, lambda turn, text: [bump % 1, bump % 10] if turn == 1 else ["done"], [2, 1, 1])
        assert sorted(n.reward for n in depth_first(chains) if n.terminal) == [1.0, 10.0]
        # a tree: the first turn's two children each continue their own state (a replay of the path on a new one)
        (tree,) = grow(task, lambda turn, text: [bump % 1, bump % 10] if turn == 1 else
                       [bump % 100, "done"] if turn == 2 else ["done", "done"], [2, 2, 2])
        assert sorted(n.reward for n in depth_first(tree) if n.terminal) == [1.0, 10.0, 101.0, 101.0, 110.0, 110.0]
    finally:
        task.close()


class Scratch:
    """Each rollout's own scratch directory, made in reset (outside Python: a copy of the instance would share it)."""

    def reset(self, **row):
        self.directory = tempfile.mkdtemp(prefix="lit-grpo-scratch-")

    def write(self, name: str) -> str:
        """Write a file and list the directory.

        Args:
            name: The file's name.
        """
        open(os.path.join(self.directory, name), "w").close()
        return ",".join(sorted(os.listdir(self.directory)))

    def get_reward(self) -> float:
        return float(len(os.listdir(self.directory)))


def test_each_chain_has_its_own_reset():
    task = ToolTask(records=[{"prompt": "q", "answer": "7"}] * 4, environment=Scratch, max_turns=2, tool_timeout=None)
    write = CALL % ("write", '{"name": "%s"}')
    (root,) = grow(task, lambda turn, text: [write % "a", write % "b"] if turn == 1 else ["done"], [2, 1])
    first, second = root.children
    assert first.episode.completion[1]["content"] == "a" and second.episode.completion[1]["content"] == "b"
    assert [n.reward for n in depth_first(root) if n.terminal] == [1.0, 1.0]


def test_a_call_turn_ending_on_a_second_end_of_sequence_id_goes_on():
    task = ToolTask(records=[{"prompt": "q", "answer": "7"}] * 4, tools=[add], rewards=[answer_reward], max_turns=2)
    (root,) = grow(task, lambda turn, text: [CALL % ("add", '{"a": 3, "b": 4}')] if turn == 1 else ["7"], [1, 1],
                   end=TEXT_END)
    (call,) = root.children
    assert call.segment[-1] == TEXT_END and call.kind == "call"
    # TRL's cut: after the template's own end (<|im_end|>), so the reply follows the sampled <|endoftext|>
    assert QWEN.decode(call.reply).startswith("\n<|im_start|>user\n<tool_response>\n7\n</tool_response>")
    assert call.children[0].kind == "answer" and call.children[0].context == call.context + call.segment + call.reply


def test_rewards_get_what_trl_gives_them_once_per_batch():
    calls = []

    def with_ids(prompts, completions, completion_ids, trainer_state, log_metric, log_extra, answer, **kwargs):
        calls.append(len(completions))
        log_metric("custom/length", float(len(completion_ids[0])))
        return [float(len(ids) > 0) for ids in completion_ids]

    async def slow(completions, **kwargs):
        await asyncio.sleep(0.01)
        return [0.5] * len(completions)

    def abstains(completions, **kwargs):
        return [None] * len(completions)

    task = ToolTask(records=[{"prompt": "q", "answer": "7"}] * 4, tools=[add], rewards=[with_ids, slow, abstains],
                    reward_weights=[1.0, 2.0, 1.0], max_turns=1)
    (root,) = grow(task, lambda turn, text: ["7", "8", "9"], [3])
    assert calls == [3]  # one call for the batch's three episodes
    assert [c.reward for c in root.children] == [2.0, 2.0, 2.0]  # 1 + 2 * 0.5, the None left out
    assert root.children[0].episode.parts == {"with_ids": 1.0, "slow": 0.5, "abstains": None}


def test_unscorable_episodes_carry_advantage_0_and_failing_rewards_are_counted():
    def sometimes(completions, **kwargs):
        return [None if c[-1]["content"] == "8" else float(c[-1]["content"] == "7") for c in completions]

    def broken(completions, **kwargs):
        raise RuntimeError("the judge is down")

    task = ToolTask(records=[{"prompt": "q", "answer": "7"}] * 4, tools=[add], rewards=[sometimes], max_turns=1)
    with pytest.warns(UserWarning, match=r"1 of 3 episode\(s\) were scored by no reward"):
        (root,) = grow(task, lambda turn, text: ["7", "8", "9"], [3])
    assert [c.scorable for c in root.children] == [True, False, True]
    assert chain_advantages(root, "grpo") == pytest.approx([1.0, 0.0, -1.0], abs=1e-5)  # [1, 0] centred; 8 out
    failing = ToolTask(records=[{"prompt": "q", "answer": "7"}] * 4, tools=[add], rewards=[broken], max_turns=1)
    with pytest.warns(UserWarning, match=r"reward error on 2 of 2 episode\(s\), scored -1.0 \(rollout/reward_errors\): "
                                         r"broken: RuntimeError: the judge is down"):
        (root,) = grow(failing, lambda turn, text: ["7", "8"], [2])
    assert [c.reward_error for c in root.children] == ["broken: RuntimeError: the judge is down"] * 2


def huge() -> str:
    """Return five megabytes."""
    return "x" * 5_000_000


def test_a_tool_answer_past_the_budget_is_dropped_and_the_episode_ends_scored():
    task = ToolTask(records=[{"prompt": "q", "answer": "7"}] * 4, tools=[huge], rewards=[answer_reward], max_turns=3,
                    max_completion_length=256, tool_timeout=None)
    (root,) = grow(task, lambda turn, text: [CALL % ("huge", "{}")], [1, 1, 1])
    (cut,) = root.children
    assert (cut.kind, cut.terminal, cut.reply) == ("cut", True, ())
    assert [m["role"] for m in cut.episode.completion] == ["assistant"]  # TRL drops the tool message too
    assert len(policy_nodes(root)) == 1


def test_the_prompt_counts_the_schemas_the_engine_receives():
    task = ToolTask(records=[{"prompt": "What is 3+4?", "answer": "7"}] * 4, tools=[add], rewards=[answer_reward])
    bare = QWEN.apply_chat_template([{"role": "user", "content": "What is 3+4?"}], add_generation_prompt=True,
                                    tokenize=True, return_dict=False)
    ids = task.prompt_ids({"prompt": "What is 3+4?", "answer": "7"}, QWEN)
    assert len(ids) > len(bare) + 50 and '"name": "add"' in QWEN.decode(ids)


def test_chains_without_a_turn_limit_run_until_the_budget_ends_them():
    from lit_grpo.rollout.trees import chain_widths, grown_rounds

    task = ToolTask(records=[{"prompt": "q", "answer": "7"}] * 4, tools=[add], rewards=[answer_reward],
                    max_completion_length=300, tool_timeout=None)  # max_turns: TRL's default, no limit
    assert task.max_rounds is None
    widths = chain_widths(2, task.max_rounds)
    roots = grow(task, lambda turn, text: [CALL % ("add", '{"a": 3, "b": 4}')] * (2 if turn == 1 else 1), widths)
    depths = [len(policy_nodes_of_chain(chain)) for chain in roots[0].children]
    assert depths[0] == depths[1] > 4  # past any default limit, ended by the budget
    last = policy_nodes_of_chain(roots[0].children[0])[-1]
    assert last.kind == "cut" and len(last.context) + len(last.segment) - roots[0].context.__len__() <= 300
    assert grown_rounds(widths) is None and grown_rounds([2, 1, 1]) == 3  # no per-round figures without a limit
    with pytest.raises(Exception, match="max_turns and max_completion_length are both null"):
        ToolTask(records=[{"prompt": "q", "answer": "7"}] * 4, tools=[add], rewards=[answer_reward],
                 max_completion_length=None)


def policy_nodes_of_chain(chain):
    """A chain's nodes from its first turn down."""
    nodes = [chain]
    while nodes[-1].children:
        nodes.append(nodes[-1].children[0])
    return [n for n in nodes if n.segment]


class Dice:
    """TRL's dataset-free mode: the environment makes each prompt in reset (seeded on the row's number, so the
    episodes of a group share their problem)."""

    def reset(self, row, **kwargs):
        import random

        self.a, self.b = random.Random(row).randint(1, 9), random.Random(row + 100).randint(1, 9)
        return f"What is {self.a}+{self.b}?"

    def get_reward(self) -> float:
        return 1.0


def test_without_a_dataset_the_environment_makes_the_prompts():
    task = ToolTask(environment=Dice, generated_rows=12, heldout_size=4, tool_timeout=None)
    train, validation, test = task.split()
    assert (len(train), len(validation) + len(test)) == (8, 4)
    (root,) = grow(task, lambda turn, text: ["7", "8"], [2], records=[train[0]])
    text = QWEN.decode(root.context)
    assert f"What is {root.children[0].episode.environment.a}+" in text and len(root.children) == 2
    with pytest.raises(Exception, match="without a dataset"):
        ToolTask(environment=Dice)


class Counter:
    def reset(self, **row):
        self.count = 0
        return " Count."

    def bump(self) -> int:
        """Count one."""
        self.count += 1
        return self.count

    def get_reward(self) -> float:
        return float(self.count)


def test_routed_environments_leave_the_column_to_the_rewards_and_reset_text_goes_to_the_last_message():
    seen = []

    def routed(completions, environment, **kwargs):
        seen.extend(environment)
        return [0.0] * len(completions)

    task = ToolTask(records=[{"prompt": "q", "answer": "7", "environment": "b"}] * 4,
                    environment={"a": Scratch, "b": Counter}, rewards=[routed], max_turns=1, tool_timeout=None)
    prompt = [{"role": "system", "content": "s"}, {"role": "user", "content": "q"},
              {"role": "assistant", "content": "Sure:"}]
    (root,) = grow(task, lambda turn, text: ["7"], [1], records=[{"prompt": prompt, "answer": "7", "environment": "b"}])
    assert seen == ["b"]  # TRL: the routing column is not reset's, but the rewards get it
    assert root.children[0].episode.messages[2]["content"] == "Sure: Count."  # TRL appends to the last message


def test_a_turn_cut_by_the_budget_still_runs_its_whole_calls_and_an_empty_turn_adds_no_message():
    call = CALL % ("bump", "{}")
    call_ids = len(QWEN(call, add_special_tokens=False)["input_ids"])
    # room for the call but not its end token: the turn is cut, its call is whole, TRL runs it (then drops its answer)
    task = ToolTask(records=[{"prompt": "q", "answer": "7"}] * 4, environment=Counter, max_turns=3,
                    max_completion_length=call_ids, tool_timeout=None)
    (root,) = grow(task, lambda turn, text: [call], [1, 1, 1])
    (cut,) = root.children
    assert (cut.kind, cut.truncated, len(cut.segment), cut.reward) == ("cut", True, call_ids, 1.0)  # count 1
    assert cut.episode.calls == {"bump": 1} and cut.reply == ()
    # a turn the budget leaves no token: no assistant message is added (TRL appends none), the episode ends
    start = cut.episode
    step = task.turn({"prompt": "q"}, start, 2, "", QWEN, True, segment_ids=[], context_ids=[1, 2])
    assert (step.kind, step.terminal, step.scored_later) == ("cut", True, True)
    assert step.episode.messages == start.messages
