"""lit-grpo's tool episodes side by side with TRL 1.16's own code, for every chat template TRL's
``add_response_schema`` recognises (issue 57, "What to build" 1; the table: docs/trl_families.md).

Each family is the tiny BPE tokenizer of ``data/tiny-qwen2-chat`` with the family's special tokens and TRL's shipped
``.jinja`` (``tests/trl_families.py``). Each case is a scripted model (the same token ids on both sides): a call,
several calls, async and sync calls in one turn, reasoning, a malformed call, a call turn ending on a second
end-of-sequence id, a tool result that overflows ``max_completion_length``, an environment whose ``reset`` adds text,
a final answer at once. TRL's side runs ``GRPOTrainer._generate`` (``_tokenize_prompts``, ``parse_response`` with the
prompt as prefix, ``_tool_call_loop``, ``_get_tool_suffix_ids``) and ``_calculate_rewards`` on a stand-in ``self``;
lit-grpo's runs ``expand_trees`` with a ``ToolTask`` (a chain of width 1). Each aspect is its own test, so a table of
what holds reads off the test ids: ``test_episode_matches_trl[<family>-<case>-<aspect>]``."""

from __future__ import annotations

import pytest

import trl_families as F

ASPECTS = {
    "prompt": "prompt_messages",  # the prompt conversation after reset
    "prompt_ids": "prompt_ids",  # what the engine is first given
    "messages": "completion",  # the completion conversation (parsed turns, tool messages)
    "completion_ids": "completion_ids",  # TRL's completion_ids vs our segments and replies concatenated
    "tool_mask": "tool_mask",  # TRL's tool_mask vs our segment (1) / reply (0) split
    "contexts": "contexts",  # what the engine is given at each turn
    "reward": "reward",  # the weighted reward sum
    "reward_inputs": "reward_inputs",  # what a reward function receives
    "tool_counts": ("tool_calls", "tool_failures"),  # calls run and failed
}

# Where the tool reply's ids differ from TRL's, named (docs/trl_families.md). Strict: a fix makes them fail, so the
# entry is removed with the fix.
REPLY_IDS = ("completion_ids", "tool_mask", "contexts", "reward_inputs")
KNOWN = {
    # Gemma 4 v2: our reply is the template's rendering ("<turn|>\n"); TRL's suffix loses the newline because it
    # trims its dummy prefix at eos_token only. Ours kept (the tokens the model sees at inference).
    "Gemma-4-v2": ("call", "calls", "async_sync", "reasoning", "reset"),
}


def marks(name: str, case: str, aspect: str) -> tuple:
    if aspect in REPLY_IDS and case in KNOWN.get(name, ()):
        return (pytest.mark.xfail(strict=True, reason=f"{name}: the tool reply's ids differ from TRL's "
                                                      "(docs/trl_families.md)"),)
    return ()


PARAMS = [pytest.param(name, case, aspect, id=f"{name}-{case}-{aspect}", marks=marks(name, case, aspect))
          for name, family in F.FAMILIES.items() if not family.parse_only
          for case in F.CASE_NAMES if F.case_applies(family, case)
          for aspect in ASPECTS]


def first_difference(trl, lit) -> str:
    """Where two values first differ, shortly."""
    if isinstance(trl, list) and isinstance(lit, list):
        i = next((i for i, (a, b) in enumerate(zip(trl, lit)) if a != b), min(len(trl), len(lit)))
        return (f"lengths {len(trl)} (TRL) vs {len(lit)} (lit-grpo); first difference at [{i}]: "
                f"TRL {trl[i:i + 8]!r:.600} vs lit-grpo {lit[i:i + 8]!r:.600}")
    return f"TRL {trl!r:.800} vs lit-grpo {lit!r:.800}"


@pytest.mark.parametrize(("name", "case", "aspect"), PARAMS)
def test_episode_matches_trl(name, case, aspect):
    trl, lit = F.episodes(name, case)
    if isinstance(lit, BaseException):
        pytest.fail(f"lit-grpo raised where TRL played the episode: {type(lit).__name__}: {lit}")
    fields = ASPECTS[aspect]
    fields = fields if isinstance(fields, tuple) else (fields,)
    for f in fields:
        want, got = getattr(trl, f), getattr(lit, f)
        if f == "reward" and want != want:  # nan: unscorable on both sides
            assert got != got, f"TRL finds the episode unscorable (nan); lit-grpo scores {got}"
            continue
        assert got == want, f"{f}: {first_difference(want, got)}"


def test_every_template_add_response_schema_knows_is_here():
    """The families are exactly TRL 1.16's list (matched by template text): a new TRL template fails this."""
    import inspect

    import trl.chat_template_utils as u

    source = inspect.getsource(u.add_response_schema)
    known = {name.removesuffix("_chat_template") for name in dir(u)
             if name.endswith("_chat_template") and name in source}
    assert known == {f.jinja for f in F.FAMILIES.values()}


def test_deepseek_r1_distill_is_parse_only():
    """TRL refuses DeepSeek-R1-Distill's template for tools; its parser still splits reasoning from content."""
    from trl.chat_template_utils import parse_response, supports_tool_calling

    tokenizer, _ = F.family_tokenizer("DeepSeek-R1-Distill")
    assert not supports_tool_calling(tokenizer)
    prompt = tokenizer.apply_chat_template(F.RECORD["prompt"], add_generation_prompt=True, tokenize=True,
                                           return_dict=False)
    ids = F.ids_of("DeepSeek-R1-Distill", "3+4 is 7.\n</think>\n\n7<｜end▁of▁sentence｜>")
    assert parse_response(tokenizer, ids, prefix=prompt) == {"role": "assistant", "reasoning_content": "3+4 is 7.",
                                                             "content": "7"}


def test_lit_grpo_refuses_deepseek_r1_distill_for_tools_as_trl_does():
    """TRL raises at init (``supports_tool_calling``); lit-grpo refuses it by name (an InputError) before a turn."""
    from lit_grpo.errors import InputError

    with pytest.raises(InputError):
        F.lit_episode("DeepSeek-R1-Distill", F.RECORD,
                      [F.ids_of("DeepSeek-R1-Distill", "7<｜end▁of▁sentence｜>")])
