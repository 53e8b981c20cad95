"""The token rule of multi-turn episodes (docs/guide.md#tools-and-environments): what is trained is what was
sampled. An assistant turn's ids are the engine's, never re-tokenized; what comes between two turns (the tool
messages and the next assistant header) is the chat template's rendering of the conversation with those messages
minus its rendering without them, cut where the sampled turn ended (its end-of-turn token): the ids the template puts
after that token (Qwen's newline after ``<|im_end|>``) belong to the reply, as in TRL.

A template that is not append-only (it rewrites an earlier turn once a later message is added, as some drop past
reasoning) would make the trained context differ from what the model saw: the first episode that shows it is
refused with the turn and the tokens where the two renderings part.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from lit_grpo.errors import InputError


def rendered_ids(tokenizer: Any, messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]] | None,
                 generation_prompt: bool, chat_template: str | None = None,
                 template_kwargs: Mapping[str, Any] | None = None) -> list[int]:
    """The chat template's ids of ``messages`` (with the tools' schemas), as the model's family renders them
    (``chat_template``: the one the task uses, None: the tokenizer's own; ``template_kwargs``: passed through)."""
    ids = tokenizer.apply_chat_template(list(messages), tools=list(tools) if tools else None, tokenize=True,
                                        chat_template=chat_template, add_generation_prompt=generation_prompt,
                                        return_dict=False, **dict(template_kwargs or {}))
    return list(ids)


def reply_ids(tokenizer: Any, conversation: Sequence[dict[str, Any]], reply: Sequence[dict[str, Any]],
              tools: Sequence[dict[str, Any]] | None, end_of_turn: int, turn: int, chat_template: str | None = None,
              template_kwargs: Mapping[str, Any] | None = None) -> list[int]:
    """The ids between assistant turn ``turn`` (the last message of ``conversation``, which the engine ended with
    ``end_of_turn``) and the next one: ``reply``'s messages and the next assistant header.

    The cut is after the rendering's last ``end_of_turn`` or end-of-sequence token where only whitespace follows it
    (``end_cut``): a turn that stopped on another stop id (Qwen's ``<|endoftext|>`` where the template writes
    ``<|im_end|>``) is cut after the template's own end, as TRL's ``_get_tool_suffix_ids`` cuts (the reply then
    follows the sampled stop id), and a template that ends the turn with neither is not cut (the reply is what the
    rendering adds).

    ``InputError`` where the rendering with ``reply`` does not begin with the rendering without it up to that turn's
    end (a template that is not append-only), naming the turn and the first tokens that differ.
    """
    before = rendered_ids(tokenizer, conversation, tools, False, chat_template, template_kwargs)
    after = rendered_ids(tokenizer, [*conversation, *reply], tools, True, chat_template, template_kwargs)
    cut = end_cut(before, end_of_turn, tokenizer.eos_token_id, tokenizer)
    if after[:cut] != before[:cut]:
        at = next(i for i, (a, b) in enumerate(zip(after, before)) if a != b) if len(after) >= cut else len(after)
        raise InputError(
            f"the chat template is not append-only: adding the reply to assistant turn {turn} rewrites the "
            f"conversation before it from token {at} on ({shown(tokenizer, before[at:at + 8])} becomes "
            f"{shown(tokenizer, after[at:at + 8])}), so the tokens trained would not be the tokens the model saw; "
            "use a template that renders earlier turns the same whatever follows (e.g. a family's *_training "
            "template)")
    return after[cut:]


def end_cut(before: Sequence[int], end_of_turn: int, eos_token_id: int | None, tokenizer: Any) -> int:
    """Where the rendering of a conversation ending in an assistant turn is cut: after the last ``end_of_turn`` (the
    token the turn stopped on) or end-of-sequence token it holds, whichever comes later, when only whitespace follows
    it (Qwen's newline after ``<|im_end|>``); else at its end. A stop id inside the turn's text is no end: a turn that
    stopped on ``<|endoftext|>`` keeps it in its parsed text, which the template renders before the calls; GLM-4's
    call turn stops on ``<|observation|>``, which its template writes only as the tool message's header."""
    ends = [index for index, token in enumerate(before) if token in (end_of_turn, eos_token_id)]
    if ends and not tokenizer.decode(list(before[ends[-1] + 1:])).strip():
        return ends[-1] + 1
    return len(before)


def shown(tokenizer: Any, ids: Sequence[int]) -> str:
    return repr(tokenizer.decode(list(ids)))
