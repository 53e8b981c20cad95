"""Multi-turn tool episodes (issue 48) through the tree expansion with a scripted engine (the unit under test is the
turn logic; engines are tested for real elsewhere), on Qwen2.5's released chat template as TRL 1.16 ships it: the
tokens trained are the tokens sampled, each tool reply is the template's own rendering, a template that rewrites
earlier turns is refused, and a branching environment gives each child its own state."""

from __future__ import annotations

from importlib.resources import files

import pytest
import scripted_engine
from transformers import AutoTokenizer

from lit_grpo.engines import SamplingSpec
from lit_grpo.errors import InputError
from lit_grpo.rollout.trees import expand_trees
from lit_grpo.rollout.turn_tokens import reply_ids
from lit_grpo.tasks.tools.task import ToolTask
from lit_grpo.tree import depth_first, policy_nodes


def qwen_tokenizer():
    """The tiny chat model's BPE tokenizer with Qwen2.5's template and TRL's response parsing for it."""
    from trl.chat_template_utils import add_response_schema

    tokenizer = AutoTokenizer.from_pretrained("data/tiny-qwen2-chat")
    tokenizer.chat_template = (files("trl") / "chat_templates" / "qwen2_5.jinja").read_text()
    return add_response_schema(tokenizer)


TOKENIZER = qwen_tokenizer()
END = TOKENIZER.convert_tokens_to_ids("<|im_end|>")


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first number.
        b: The second number.
    """
    return a + b


def exact_answer(prompts, completions, answer, **columns):
    """TRL's conversational reward: the last assistant message's text against the row's answer."""
    return [float(c[-1]["content"].strip() == a) for c, a in zip(completions, answer)]


RECORDS = [{"prompt": f"What is {i}+4?", "answer": str(i + 4)} for i in range(10)]
CALL = '<tool_call>\n{"name": "add", "arguments": {"a": 3, "b": 4}}\n</tool_call>'


class ScriptedEngine(scripted_engine.ScriptedEngine):
    def __init__(self, script):
        super().__init__(script, TOKENIZER, END)


def grow(task, script, branching):
    record = {"prompt": [{"role": "user", "content": "What is 3+4?"}], "answer": "7"}
    engine = ScriptedEngine(script)
    (root,) = expand_trees(task, engine, TOKENIZER, [record], branching,
                           SamplingSpec(max_new_tokens=64, stop_token_ids=(END,)))
    return root, engine


def test_a_tool_reply_is_the_templates_rendering_after_the_turns_end():
    conversation = [{"role": "user", "content": "What is 3+4?"},
                    {"role": "assistant", "content": "", "tool_calls": [
                        {"type": "function", "function": {"name": "add", "arguments": {"a": 3, "b": 4}}}]}]
    reply = [{"role": "tool", "name": "add", "content": "7"}]
    ids = reply_ids(TOKENIZER, conversation, reply, None, END, turn=1)
    # the newline Qwen's template writes after <|im_end|> is the reply's first token: the model sampled up to
    # <|im_end|> and stopped
    assert TOKENIZER.decode(ids) == ("\n<|im_start|>user\n<tool_response>\n7\n</tool_response><|im_end|>\n"
                                     "<|im_start|>assistant\n")


def test_an_episode_trains_exactly_the_sampled_tokens_and_scores_the_conversation():
    task = ToolTask(records=RECORDS, tools=[add], rewards=[exact_answer], max_turns=3)
    root, engine = grow(task, lambda turn, text: [CALL] if turn == 1 else ["7"], [1, 1, 1])
    first, second = policy_nodes(root)
    assert (first.kind, first.terminal, second.kind, second.terminal) == ("call", False, "answer", True)
    assert second.reward == 1.0 and second.correct
    # the second turn's context: the prompt, the first turn's sampled ids, the template's reply; nothing retokenized
    assert second.context == first.context + first.segment + first.reply
    assert engine.contexts[1] == list(second.context)
    assert TOKENIZER.decode(first.reply).startswith("\n<|im_start|>user\n<tool_response>\n7\n</tool_response>")
    assert [m["role"] for m in second.episode.completion] == ["assistant", "tool", "assistant"]
    assert second.episode.calls == {"add": 1} and second.episode.failures == {}
    # the prompt: Qwen's tool system prompt with add's schema, then the user's question
    prompt_text = TOKENIZER.decode(root.context)
    assert '"name": "add"' in prompt_text and prompt_text.endswith("What is 3+4?<|im_end|>\n<|im_start|>assistant\n")


def test_a_failed_call_is_the_models_to_read_and_a_malformed_one_ends_the_episode():
    # TRL's ways: an unknown tool answers TRL's error text; a malformed call is kept as text and scored by the rewards
    task = ToolTask(records=RECORDS, tools=[add], rewards=[exact_answer], max_turns=2)
    wrong = '<tool_call>\n{"name": "sub", "arguments": {"a": 3, "b": 4}}\n</tool_call>'
    broken = '<tool_call>\n{"name": "add", "arguments": {"a": 3, "b": }\n</tool_call>'
    root, _ = grow(task, lambda turn, text: [wrong, broken] if turn == 1 else ["8"], [2, 1])
    asked, malformed = root.children
    assert asked.episode.failures == {"sub": 1}
    assert "<tool_response>\n{'error': 'Tool sub not found.'}\n</tool_response>" in TOKENIZER.decode(asked.reply)
    assert (asked.children[0].kind, asked.children[0].reward) == ("answer", 0.0)
    assert (malformed.kind, malformed.terminal, malformed.reward) == ("malformed", True, 0.0)  # exact_answer's 0
    assert malformed.episode.completion == [{"role": "assistant", "content": broken}]
    penalized = ToolTask(records=RECORDS, tools=[add], rewards=[exact_answer], max_turns=2, malformed_turns="penalty")
    root, _ = grow(penalized, lambda turn, text: [broken], [1, 1])
    assert (root.children[0].kind, root.children[0].reward) == ("malformed", -1.0)


def test_a_call_at_the_last_turn_ends_the_episode_scored_as_it_stands():
    task = ToolTask(records=RECORDS, tools=[add], rewards=[exact_answer], max_turns=2)
    root, _ = grow(task, lambda turn, text: [CALL], [1, 1])
    last = policy_nodes(root)[-1]
    assert (last.kind, last.terminal, last.reward) == ("cut", True, 0.0)


class Tally:
    """An environment: its state is one episode's, copied where the tree branches."""

    def reset(self, **row):
        self.total = 0
        return " Use the tally."

    def bump(self, by: int) -> int:
        """Add to the tally.

        Args:
            by: How much.
        """
        self.total += by
        return self.total

    def get_reward(self) -> float:
        return float(self.total)


def test_branching_gives_each_child_its_own_environment_state():
    task = ToolTask(records=RECORDS, environment=Tally, max_turns=3)
    bump = '<tool_call>\n{"name": "bump", "arguments": {"by": %d}}\n</tool_call>'
    root, _ = grow(task, lambda turn, text: [bump % 1, bump % 10] if turn == 1 else ["done"] * 2 if turn == 3
                   else [bump % 100, "done"], [2, 2, 2])
    leaves = [n for n in depth_first(root) if n.terminal]
    # 1 then (100 then done | done) and 10 then (100 then done | done): no child sees a sibling's calls
    assert sorted(leaf.reward for leaf in leaves) == [1.0, 10.0, 101.0, 101.0, 110.0, 110.0]
    assert TOKENIZER.decode(root.context).count("What is 3+4? Use the tally.") == 1  # reset's text, added once


def test_a_template_that_rewrites_earlier_turns_is_refused():
    rewriting = ("{% for m in messages %}<|im_start|>{{ m.role }}\n"
                 "{% if m.role == 'assistant' and not loop.last %}[earlier]{% else %}{{ m.content }}{% endif %}"
                 "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    conversation = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "call"}]
    with pytest.raises(InputError, match=r"not append-only: adding the reply to assistant turn 1 rewrites the "
                                         r"conversation before it from token 11 on \('call<\|im_end\|>\\n' becomes "
                                         r"'\[earlier\]<\|im_end\|>"):
        reply_ids(with_template(rewriting), conversation, [{"role": "tool", "content": "7"}], None, END, turn=1)


def with_template(template):
    tokenizer = AutoTokenizer.from_pretrained("data/tiny-qwen2-chat")
    tokenizer.chat_template = template
    return tokenizer


def test_the_tool_figures_of_an_epoch_are_trls_and_per_tool():
    from lit_grpo.callbacks.episode_metrics import tool_stats

    task = ToolTask(records=RECORDS, tools=[add], rewards=[exact_answer], max_turns=2)
    wrong = '<tool_call>\n{"name": "sub", "arguments": {"a": 3, "b": 4}}\n</tool_call>'
    broken = '<tool_call>\n{"name": "add", "arguments": {"a": 3, "b": }\n</tool_call>'
    root, _ = grow(task, lambda turn, text: [CALL, wrong, broken, "7"] if turn == 1 else [CALL], [4, 1])
    # episodes: add then a call at the limit (cut, 2 turns; the call at the limit is not run, as in TRL); sub
    # (failed) then cut; malformed (1 turn); "7" (1 turn): 2 calls run, 1 failed
    stats = tool_stats([root])
    assert stats == {"tools/call_frequency": 2 / 4, "tools/failure_frequency": 1 / 2,
                     "tools/turns_per_episode": 6 / 4, "tools/cut_episodes": 2 / 4, "tools/malformed_episodes": 1 / 4,
                     "tools/calls/add": 1 / 4, "tools/failures/add": 0.0,
                     "tools/calls/unknown": 1 / 4, "tools/failures/unknown": 1 / 4}  # sub: no tool of the task


def test_the_rules_ask_a_tool_task_for_turns_one_width_each_and_no_risk_head():
    from lit_grpo.cli.config_check import signature_defaults
    from lit_grpo.rollout.datamodule import RolloutDataModule
    from lit_grpo.run.rules import multi_round_problems

    task = ToolTask(records=RECORDS, tools=[add], rewards=[exact_answer], max_turns=3)
    data = signature_defaults(RolloutDataModule)
    assert multi_round_problems({**data, "rollout": "grouped"}, ToolTask) == [
        "data.task ToolTask runs episodes over turns: use data.rollout 'chains' (group-relative on each episode's "
        "return, TRL's multi-turn GRPO) or 'tree' (branching at every turn)"]
    assert multi_round_problems({**data, "rollout": "chains"}, task) == []
    assert multi_round_problems({**data, "rollout": "chains", "branching": [8, 1, 1]}, task) == [
        "data.branching [8, 1, 1] with data.rollout 'chains': branching is a tree's widths; chains draw "
        "data.group_size episodes a prompt and take their turns from data.task (max_turns): remove data.branching"]
    assert multi_round_problems({**data, "rollout": "tree", "branching": [4, 2]}, task) == [
        "data.branching [4, 2] names 2 round(s), data.task ToolTask runs max_turns 3: give one width per round, or "
        "set data.task.init_args.max_turns"]
    assert multi_round_problems({**data, "rollout": "tree", "branching": [4, 2, 2]}, task, {"risk": {"atoms": 5}}) == [
        "model.risk with data.task ToolTask: the risk head needs a task that names the first tokens that defer (a "
        "defer_token_ids(tokenizer) method); a tool task's turns are read by its template's parser"]


def test_an_environment_class_written_for_trl_owns_the_reward():
    from lit_grpo.tasks.tools.arithmetic import ArithmeticEnvironment

    task = ToolTask(records=RECORDS, environment="lit_grpo.tasks.tools.arithmetic.ArithmeticEnvironment", max_turns=3)
    submit = '<tool_call>\n{"name": "submit", "arguments": {"result": %d}}\n</tool_call>'
    root, _ = grow(task, lambda turn, text: [submit % 7, submit % 8] if turn == 1 else ["done"], [2, 1, 1])
    right, wrong = root.children
    assert (right.children[0].reward, wrong.children[0].reward) == (1.0, 0.0)  # get_reward, per leaf
    assert isinstance(right.children[0].episode.toolbox.environment, ArithmeticEnvironment)
    assert "Submit the result with the submit tool." in TOKENIZER.decode(root.context)  # what reset returned


def test_the_tool_figures_skip_what_is_not_a_tool_episode():
    # the games' trees: segments without an episode, and the plain Node the environment closes a tree with
    from lit_grpo.callbacks.episode_metrics import tool_stats
    from lit_grpo.tree import Node, SegmentNode

    root = SegmentNode(children=[SegmentNode(terminal=True, segment=(1,)), Node(terminal=True)])
    assert tool_stats([root]) == {}


def test_a_call_without_arguments_is_answered_an_error_not_a_crash():
    # the template renders a call's arguments with tojson: a call the model wrote without them must still render
    task = ToolTask(records=RECORDS, tools=[add], rewards=[exact_answer], max_turns=2)
    bare = '<tool_call>\n{"name": "add"}\n</tool_call>'
    root, _ = grow(task, lambda turn, text: [bare] if turn == 1 else ["7"], [1, 1])
    (asked,) = root.children
    assert asked.episode.failures == {"add": 1}
    assert "add() missing 2 required positional arguments: 'a' and 'b'" in TOKENIZER.decode(asked.reply)
    assert asked.children[0].reward == 1.0


def test_a_model_without_response_parsing_gets_trls_and_an_unknown_one_or_rows_too_few_are_refused_by_name():
    task = ToolTask(records=RECORDS, tools=[add], rewards=[exact_answer], max_turns=2)
    plain = with_template(TOKENIZER.chat_template)  # Qwen2.5's template, no response_template: TRL's is added
    grow_with(task, plain)
    assert plain.response_template is not None
    unknown = with_template(TOKENIZER.chat_template.replace("You are Qwen", "You are Q"))  # no family TRL knows
    with pytest.raises(InputError, match=r"tiny-qwen2-chat' cannot be read: its tokenizer has no response_template "
                                         r"and TRL's add_response_schema does not know its chat template"):
        grow_with(ToolTask(records=RECORDS, tools=[add], rewards=[exact_answer], max_turns=2), unknown)
    with pytest.raises(InputError, match=r"heldout_size must be in \[2, 9\] for 10 rows, got 10"):
        ToolTask(records=RECORDS, rewards=[exact_answer], heldout_size=10).split()


def test_a_template_that_does_not_render_tools_is_refused_by_name():
    task = ToolTask(records=RECORDS, tools=[add], rewards=[exact_answer], max_turns=2)
    blind = with_template("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
                          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    with pytest.raises(InputError, match=r"the chat template of .*tiny-qwen2-chat' does not render tools: a "
                                         r"conversation with tool calls and tool messages loses them"):
        grow_with(task, blind)


def grow_with(task, tokenizer):
    record = {"prompt": "What is 3+4?", "answer": "7"}
    engine = ScriptedEngine(lambda turn, text: [CALL])
    expand_trees(task, engine, tokenizer, [record], [1, 1], SamplingSpec(max_new_tokens=64, stop_token_ids=(END,)))


class PickyEnvironment:
    """Refuses to start for one row (a row whose data the environment cannot use), as a user's reset may."""

    def reset(self, answer: str, **row) -> None:
        if answer == "6":
            raise ValueError("no such record")

    def get_reward(self) -> float:
        return 1.0


def test_a_row_whose_reset_raises_is_skipped_with_one_warning_and_every_row_failing_is_refused():
    task = ToolTask(records=RECORDS, environment=PickyEnvironment, max_turns=1)
    engine = ScriptedEngine(lambda turn, text: ["7"])
    spec = SamplingSpec(max_new_tokens=64, stop_token_ids=(END,))
    with pytest.warns(UserWarning, match=r"skipped 1 of 3 rows whose environment reset raised \(first: ValueError: "
                                         r"no such record\); the run goes on without them"):
        roots = expand_trees(task, engine, TOKENIZER, RECORDS[1:4], [1], spec)
    assert [root.record["answer"] for root in roots] == ["5", "7"]  # the rows either side, each played
    assert all(len(root.children) == 1 for root in roots)
    with pytest.raises(InputError, match=r"every one of 1 rows failed to start its episode \(the environment's reset "
                                         r"raised; first: ValueError: no such record\)"):
        expand_trees(task, engine, TOKENIZER, RECORDS[2:3], [1], spec)


def test_the_sample_table_shows_whole_conversations_with_the_tool_messages():
    from lit_grpo.callbacks.episode_metrics import conversations_table

    task = ToolTask(records=RECORDS, tools=[add], rewards=[exact_answer], max_turns=2)
    root, _ = grow(task, lambda turn, text: [CALL] if turn == 1 else ["7"], [1, 1])
    assert conversations_table([root], 4).splitlines() == [
        "| prompt | conversation | return |", "|---|---|---|",
        '| **user**: What is 3+4? | **assistant**: add({"a": 3, "b": 4})<br>**tool(add)**: 7<br>**assistant**: 7 '
        "| 1.000 |"]
    assert conversations_table([game_tree()], 4) == ""  # not a tool task's tree: no table


def test_what_rewards_log_with_log_extra_is_a_column_of_the_sample_table():
    from lit_grpo.callbacks.episode_metrics import conversations_table

    def judged(completions, log_extra, **kwargs):
        log_extra("verdict", ["right" if c[-1]["content"] == "7" else "wrong" for c in completions])
        log_extra("ignored", ["of", "another length"])  # not one value per episode (1 here): not a column
        return [1.0] * len(completions)

    task = ToolTask(records=RECORDS, rewards=[judged], max_turns=1)
    root, _ = grow(task, lambda turn, text: ["7"], [1])
    assert conversations_table([root], 4).splitlines() == [
        "| prompt | conversation | return | verdict |", "|---|---|---|---|",
        "| **user**: What is 3+4? | **assistant**: 7 | 1.000 | right |"]


def game_tree():
    from lit_grpo.tree import SegmentNode

    return SegmentNode(children=[SegmentNode(terminal=True, segment=(1,))])


def test_a_branching_that_does_not_match_the_turns_is_refused_before_anything_loads():
    import yaml

    from lit_grpo.cli.config_check import config_problems

    config = yaml.safe_load(open("configs/tools.yaml"))
    assert config_problems(config) == []
    config["data"]["rollout"], config["data"]["branching"] = "tree", [8, 1]  # the YAML's max_turns is 3
    assert config_problems(config) == [
        "data.branching [8, 1] names 2 round(s), data.task ToolTask runs max_turns 3: give one width per round, or "
        "set data.task.init_args.max_turns"]
    del config["data"]["task"]["init_args"]["max_turns"]  # ToolTask's default, null: TRL's, no limit
    config["data"]["rollout"] = "chains"
    del config["data"]["branching"]
    assert config_problems(config) == []  # chains: the token budget ends each episode
    config["data"]["rollout"], config["data"]["branching"] = "tree", [8, 1, 1]
    assert config_problems(config) == [
        "data.rollout 'tree' with data.task ToolTask max_turns null: a tree names one width per turn "
        "(data.branching); set data.task.init_args.max_turns, or use data.rollout 'chains' (no limit: the task's "
        "token budget ends each episode)"]


def test_each_turn_but_the_last_tells_the_engine_another_follows():
    task = ToolTask(records=RECORDS, tools=[add], rewards=[exact_answer], max_turns=3)
    _, engine = grow(task, lambda turn, text: [CALL], [1, 1, 1])
    assert [spec.next_turn for spec in engine.specs] == [True, True, False]
    assert engine.ended == 1
    _, answered_at_once = grow(task, lambda turn, text: ["7"], [1, 1, 1])  # every episode over after turn 1
    assert [spec.next_turn for spec in answered_at_once.specs] == [True] and answered_at_once.ended == 1
