"""Three of TRL's behaviours the guide says lit-grpo follows, each checked against TRL 1.16's own code on the same
rows (not against a reading of it): ``reset``'s text goes to the last message, whatever its role; a row's
``environment`` column routes it, stays out of ``reset`` and reaches the rewards; a turn cut by the budget still runs
its whole calls. TRL's side runs ``GRPOTrainer._generate_and_score_completions`` up to its ``_generate`` call (where
the stand-in ``self`` stops it and keeps the prompts), ``_calculate_rewards`` and ``_tool_call_loop``."""

from __future__ import annotations

import copy
import functools
import sys
import types
from collections import defaultdict

import pytest
import torch
from test_tool_trl_defects import CALL, QWEN, Counter, grow

from lit_grpo.tasks.tools.task import ToolTask

pytestmark = pytest.mark.filterwarnings("ignore:TRL currently supports vLLM versions:UserWarning")


class Stopped(Exception):
    """Raised by the stand-in ``_generate``: TRL's preparation of the batch is done."""


class Tally(Counter):
    """``Counter``, recording what ``reset`` was given."""

    def reset(self, **row) -> str:
        self.row = dict(row)
        return super().reset(**row)


class Other(Tally):
    def reset(self, **row) -> str:
        super().reset(**row)
        return " Other."


ROWS = [  # a prompt ending on an assistant message (a prefill), and one ending on the user's
    {"prompt": [{"role": "system", "content": "s"}, {"role": "user", "content": "q"},
                {"role": "assistant", "content": "Sure:"}], "answer": "7", "environment": "tally"},
    {"prompt": [{"role": "user", "content": "q"}], "answer": "7", "environment": "other"},
]
FACTORIES = {"tally": Tally, "other": Other}


def trl_prepared(rows: list[dict]) -> tuple[list[list[dict]], list]:
    """The prompts TRL hands its ``_generate`` after routing and ``reset``, and the environments it drew."""
    from trl import GRPOTrainer

    def generate(prompts):
        raise Stopped(prompts)

    stand_in = types.SimpleNamespace(
        accelerator=types.SimpleNamespace(device=torch.device("cpu")), model=types.SimpleNamespace(training=True),
        environment_factories=FACTORIES, _multi_environment=True, _environment_pool=defaultdict(list), tools=[],
        _standalone_tools=[], _generate=generate)
    with pytest.raises(Stopped) as stopped:
        GRPOTrainer._generate_and_score_completions(stand_in, copy.deepcopy(rows))
    return stopped.value.args[0], stand_in.environments


def trl_reward_inputs(rows: list[dict], prompts, completions) -> dict:
    """What TRL's ``_calculate_rewards`` passes a reward function for ``rows``."""
    from transformers import TrainerState
    from trl import GRPOTrainer

    seen = {}

    def recorder(prompts, completions, completion_ids, **kwargs):
        seen.update(kwargs)
        return [0.0] * len(prompts)

    stand_in = types.SimpleNamespace(
        accelerator=types.SimpleNamespace(device=torch.device("cpu"), is_main_process=True),
        args=types.SimpleNamespace(report_to=[]), reward_funcs=[recorder],
        reward_processing_classes=[None], reward_func_names=["recorder"], state=TrainerState(), environments=None,
        _log_completion_extra=lambda *a, **k: None, _log_metric=lambda *a, **k: None)
    stand_in.accelerator.gather = lambda tensor: tensor
    GRPOTrainer._calculate_rewards(stand_in, rows, prompts, completions, [[1]] * len(rows))
    return seen


@pytest.mark.slow
def test_reset_text_goes_to_the_last_message_and_routing_stays_out_of_reset_as_in_trls_code():
    trl_prompts, trl_environments = trl_prepared(ROWS)
    seen = []

    def recorder(completions, environment, answer, **kwargs):
        seen.append((list(environment), list(answer)))
        return [0.0] * len(completions)

    task = ToolTask(records=ROWS * 2, environment=FACTORIES, rewards=[recorder], max_turns=1, tool_timeout=None)
    roots = grow(task, lambda turn, text: ["7"], [1], records=copy.deepcopy(ROWS))
    ours = [root.children[0].episode for root in roots]
    assert [episode.messages[:episode.prompt_messages] for episode in ours] == trl_prompts
    assert trl_prompts[0][-1]["content"] == "Sure: Count."  # the assistant's message, not the user's
    # each row's own instance of its routed class, reset with the row less its routing column, on both sides
    assert [type(e).__name__ for e in trl_environments] == ["Tally", "Other"]
    assert [e.row for e in trl_environments] == [{k: v for k, v in row.items() if k != "environment"} for row in ROWS]
    assert [episode.environment.row for episode in ours] == [e.row for e in trl_environments]
    # the rewards get the routing column (TRL's _calculate_rewards, on the same rows)
    trl_kwargs = trl_reward_inputs(copy.deepcopy(ROWS), trl_prompts, [[{"role": "assistant", "content": "7"}]] * 2)
    assert trl_kwargs["environment"] == ["tally", "other"] and trl_kwargs["answer"] == ["7", "7"]
    assert seen == [(trl_kwargs["environment"], trl_kwargs["answer"])]


@pytest.mark.slow
def test_a_turn_cut_by_the_budget_still_runs_its_whole_calls_as_in_trls_code():
    """The turn's ids hold a whole call but not its end token (the budget cut it): TRL's ``_tool_call_loop`` runs the
    call (then drops its answer, past the budget); so do we."""
    from trl import GRPOTrainer
    from trl_families import trl_event_loop

    call = CALL % ("bump", "{}")
    call_ids = QWEN(call, add_special_tokens=False)["input_ids"]
    environment = Tally()
    environment.reset(prompt="q")
    completions = [[{"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "bump", "arguments": {}}}]}]]
    stand_in = types.SimpleNamespace(
        _sync_tool_dicts=[{"bump": environment.bump}], _async_tool_dicts=[{}], max_tool_calling_iterations=sys.maxsize,
        max_completion_length=len(call_ids), model=types.SimpleNamespace(config=types.SimpleNamespace(
            max_position_embeddings=1 << 20)), use_vllm=False, async_loop=trl_event_loop(),
        processing_class=QWEN, _tokenizer=QWEN, chat_template=QWEN.chat_template, chat_template_kwargs={},
        _is_vlm=False, tools=[Tally.bump])
    stand_in._get_tool_suffix_ids = functools.partial(GRPOTrainer._get_tool_suffix_ids, stand_in)
    stand_in._generate_single_turn = lambda *args, **kwargs: pytest.fail("the answer past the budget was kept")
    prompt = [{"role": "user", "content": "q"}]
    prompt_ids = QWEN.apply_chat_template(prompt, tools=[Tally.bump], add_generation_prompt=True, tokenize=True)
    prompt_ids = list(prompt_ids["input_ids"] if isinstance(prompt_ids, dict) else prompt_ids)
    GRPOTrainer._tool_call_loop(stand_in, [prompt], [prompt_ids], [list(call_ids)], completions, [[0.0] *
                                len(call_ids)], None, None)
    assert environment.count == 1  # TRL ran the cut turn's call

    task = ToolTask(records=[{"prompt": "q", "answer": "7"}] * 4, environment=Tally, max_turns=3,
                    max_completion_length=len(call_ids), tool_timeout=None)
    (root,) = grow(task, lambda turn, text: [call], [1, 1, 1])
    (cut,) = root.children
    assert cut.truncated and cut.episode.environment.count == environment.count and cut.reply == ()
