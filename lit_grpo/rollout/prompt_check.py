"""The checks of the prompts that need the loaded tokenizer and model, made before any rollout is drawn: every prompt
of both splits fits the context with its generation budget, and conversations meet a chat template. Each failure
raises ``InputError`` naming the input and what to change."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from lightning.pytorch.loggers import Logger
from lightning.pytorch.utilities import rank_zero_info

from lit_grpo.buffers.protocols import SamplingPolicy
from lit_grpo.engines.base import RolloutEngine, context_limit
from lit_grpo.errors import InputError
from lit_grpo.tasks.base import Task, prompt_text
from lit_grpo.tasks.rows import check_rendering

LongPrompts = Literal["refuse", "drop"]  # data.long_prompts: what a prompt too long for the context gets


def prompt_length_problem(
    prompts: Sequence[str], lengths: Sequence[int], context: int, new_tokens: int, split: str
) -> str | None:
    """Why some prompts cannot be trained on: prompt tokens plus ``new_tokens`` exceed the model's ``context``."""
    too_long = [i for i, length in enumerate(lengths) if length + new_tokens > context]
    if not too_long:
        return None
    longest = max(too_long, key=lambda i: lengths[i])
    return (
        f"{len(too_long)} {split} prompt(s) do not fit the context of {context} tokens (the model's, or the engine's "
        f"shorter max_model_len) with {new_tokens} generated tokens (the longest has {lengths[longest]} tokens: {prompts[longest][:40]!r}...): shorten the "
        "prompts or lower data.max_new_tokens"
    )


def check_inputs(module: SamplingPolicy, task: Task, budget: int, long_prompts: LongPrompts,
                 engine: RolloutEngine | None = None, loggers: Sequence[Logger] = ()) -> None:
    """The checks that need the loaded model: every prompt that goes through the chat template renders
    (``check_rendering``), and every prompt of both splits fits the context (the model's, or the ``engine``'s
    where it is set shorter: ``engines.base.context_limit``) with its generation ``budget`` (tokens:
    ``max_new_tokens``, times the rounds of a multi-round rollout), refused or dropped as ``long_prompts`` says; the
    count dropped goes to ``loggers``. Raises ``InputError``."""
    tokenizer = module.tokenizer
    check_rendering(task, tokenizer, module.model_name)  # each prompt through its chat template
    limit = module.context_length if engine is None else context_limit(engine, module.context_length)
    if limit is not None:
        fit_prompts_to_context(task, tokenizer, limit, budget, long_prompts, loggers)


def fit_prompts_to_context(task: Task, tokenizer: Any, limit: int, budget: int, long_prompts: LongPrompts,
                           loggers: Sequence[Logger] = ()) -> None:
    """Refuse, or drop (``long_prompts``: ``data.long_prompts``), the prompts whose tokens plus the generation
    ``budget`` exceed the model's context of ``limit`` tokens; a drop is counted in ``loggers``
    (``data/dropped_prompts``)."""
    kept, dropped = {}, {}
    for split, records in (("training", task.train_records()), ("held-out", task.heldout_records())):
        candidates = possibly_too_long(task, tokenizer, records, limit - budget)
        lengths = [len(task.prompt_ids(r, tokenizer)) for r in candidates]
        too_long = {id(r) for r, n in zip(candidates, lengths) if n + budget > limit}
        kept[split] = [r for r in records if id(r) not in too_long]
        dropped[split] = len(too_long)
        if long_prompts == "refuse":
            problem = prompt_length_problem([prompt_text(r) for r in candidates], lengths, limit, budget, split)
            if problem:
                raise InputError(problem + " (or set data.long_prompts: drop)")
        elif not kept[split]:
            raise InputError(f"data.long_prompts drop: none of the {len(records)} {split} prompts fits the "
                             f"context of {limit} tokens with {budget} generated tokens")
    if any(dropped.values()):
        task.keep_records(kept["training"], kept["held-out"])
        for logger in loggers:
            logger.log_metrics({"data/dropped_prompts": float(sum(dropped.values()))}, step=0)
        rank_zero_info(f"data.long_prompts: dropped {dropped['training']} training and {dropped['held-out']} "
                       f"held-out prompt(s) longer than {limit - budget} tokens (the context of {limit} minus "
                       f"{budget} generated tokens)")


def possibly_too_long(task: Task, tokenizer: Any, records: Sequence[Any], room: int) -> list[Any]:
    """The records whose prompt may take more than ``room`` tokens; only these are tokenised, since tokenising a
    whole split can take seconds. Assumes at most one token per UTF-8 byte of the text (true of byte-level BPE,
    character and SentencePiece byte-fallback vocabularies) plus the fixed overhead measured on the first record
    (special tokens, chat template), with a margin of 8."""

    if not records:
        return []
    probe = records[0]
    overhead = max(len(task.prompt_ids(probe, tokenizer)) - len(prompt_text(probe).encode()), 0) + 8
    return [r for r in records if len(prompt_text(r).encode()) + overhead > room]
