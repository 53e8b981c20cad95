"""Checks of the run's inputs that need the loaded tokenizer or model, made before any rollout is generated.

Each failure raises ``InputError`` with a message that names the input and what to change; the ``lit-grpo``
command prints it without a traceback (exit code 2), like the up-front config check.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lightning.pytorch.utilities import rank_zero_info

REMOTE_CODE_FLAG = "model.trust_remote_code"


class InputError(ValueError):
    """A bad input found before training starts: the message says which input and how to fix it."""


def remote_code_problem(model_path: str, trust_remote_code: bool) -> str | None:
    """Why a local model directory may not be loaded: its config (or tokenizer config) maps classes to code shipped
    with the model (``auto_map``), which transformers would execute, and the user did not allow it."""
    if trust_remote_code:
        return None
    for name in ("config.json", "tokenizer_config.json"):
        path = Path(model_path) / name
        if not path.is_file():
            continue
        try:
            config = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue  # an unreadable config is reported by the loader itself
        if isinstance(config, dict) and config.get("auto_map"):
            return (
                f"{model_path!r} asks to run its own Python code ({name} has an auto_map); it is refused unless you "
                f"trust that code and set {REMOTE_CODE_FLAG}=true"
            )
    return None


def adaptable_module_names(model: Any) -> list[str]:
    """Sorted last names of the modules LoRA can adapt (linear and GPT-2's Conv1D layers), e.g. ``q_proj``."""
    from torch import nn

    names = set()
    for full_name, module in model.named_modules():
        if full_name and (isinstance(module, nn.Linear) or type(module).__name__ == "Conv1D"):
            names.add(full_name.rsplit(".", 1)[-1])
    return sorted(names)


def lora_target_problem(model: Any, targets: str | Sequence[str]) -> str | None:
    """Why ``lora_target_modules`` does not fit ``model``: the names it lacks, and the names it has."""
    if targets == "all-linear":
        return None
    module_names = [name for name, _ in model.named_modules() if name]
    if isinstance(targets, str):  # PEFT reads a string as a regex over full module names
        if any(re.fullmatch(targets, name) for name in module_names):
            return None
        missing = [targets]
    else:
        missing = [t for t in targets if not any(name == t or name.endswith(f".{t}") for name in module_names)]
    if not missing:
        return None
    return (
        f"lora_target_modules: the model has no module named {', '.join(map(repr, missing))}; "
        f"its adaptable modules are: {', '.join(adaptable_module_names(model))} (or use 'all-linear')"
    )


def prompt_length_problem(
    prompts: Sequence[str], lengths: Sequence[int], context: int, new_tokens: int, split: str
) -> str | None:
    """Why some prompts cannot be trained on: prompt tokens plus ``new_tokens`` exceed the model's ``context``."""
    too_long = [i for i, length in enumerate(lengths) if length + new_tokens > context]
    if not too_long:
        return None
    longest = max(too_long, key=lambda i: lengths[i])
    return (
        f"{len(too_long)} {split} prompt(s) do not fit the model's context of {context} tokens with {new_tokens} "
        f"generated tokens (the longest has {lengths[longest]} tokens: {prompts[longest][:40]!r}...): shorten the "
        "prompts or lower data.max_new_tokens"
    )


def context_length(config: Any) -> int | None:
    """The model's maximum sequence length from its config (``max_position_embeddings`` or GPT-2's ``n_positions``)."""
    for name in ("max_position_embeddings", "n_positions", "max_sequence_length"):
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def check_inputs(module: Any, datamodule: Any) -> None:
    """The checks that need the loaded model: every prompt of both splits fits the context with its generation
    budget (for multi-round rollouts, one budget per round). Raises ``InputError``."""
    from lit_grpo.tasks.base import is_conversation, prompt_text  # the tasks import this module's InputError

    if datamodule is None or not hasattr(datamodule, "task"):
        return
    task, tokenizer = datamodule.task, module.tokenizer
    for split, records in (("training", task.train_records()), ("held-out", task.heldout_records())):
        if records and is_conversation(records[0]["prompt"]) and getattr(tokenizer, "chat_template", None) is None:
            raise InputError(f"data.task: the {split} prompts are conversations (lists of chat messages) but the "
                             f"tokenizer of {module.hparams.model_name_or_path!r} has no chat template; use a model "
                             "whose tokenizer has one, or give the prompts as strings")
    limit = context_length(module.policy.config)
    if limit is not None:
        fit_prompts_to_context(task, tokenizer, datamodule, limit)


def fit_prompts_to_context(task: Any, tokenizer: Any, datamodule: Any, limit: int) -> None:
    """Refuse, or drop (``data.long_prompts``), the prompts whose tokens plus the generation budget (one per round
    for multi-round rollouts) exceed the model's context of ``limit`` tokens."""
    from lit_grpo.tasks.base import prompt_text  # the tasks import this module's InputError

    rounds = len(datamodule.branching) if datamodule.rollout != "grouped" else 1
    budget = datamodule.max_new_tokens * rounds
    kept, dropped = {}, {}
    for split, records in (("training", task.train_records()), ("held-out", task.heldout_records())):
        candidates = possibly_too_long(task, tokenizer, records, limit - budget)
        lengths = [len(task.prompt_ids(r, tokenizer)) for r in candidates]
        too_long = {id(r) for r, n in zip(candidates, lengths) if n + budget > limit}
        kept[split] = [r for r in records if id(r) not in too_long]
        dropped[split] = len(too_long)
        if getattr(datamodule, "long_prompts", "refuse") == "refuse":
            problem = prompt_length_problem([prompt_text(r) for r in candidates], lengths, limit, budget, split)
            if problem:
                raise InputError(problem + " (or set data.long_prompts: drop)")
        elif not kept[split]:
            raise InputError(f"data.long_prompts drop: none of the {len(records)} {split} prompts fits the model's "
                             f"context of {limit} tokens with {budget} generated tokens")
    if any(dropped.values()):
        task.keep_records(kept["training"], kept["held-out"])
        for logger in getattr(getattr(datamodule, "trainer", None), "loggers", []):
            logger.log_metrics({"data/dropped_prompts": float(sum(dropped.values()))}, step=0)
        rank_zero_info(f"data.long_prompts: dropped {dropped['training']} training and {dropped['held-out']} "
                       f"held-out prompt(s) longer than {limit - budget} tokens (the context of {limit} minus "
                       f"{budget} generated tokens)")


def possibly_too_long(task: Any, tokenizer: Any, records: Sequence[Any], room: int) -> list[Any]:
    """The records whose prompt may take more than ``room`` tokens; only these are tokenised, since tokenising a
    whole split can take seconds. Assumes at most one token per UTF-8 byte of the text (true of byte-level BPE,
    character and SentencePiece byte-fallback vocabularies) plus the fixed overhead measured on the first record
    (special tokens, chat template), with a margin of 8."""
    from lit_grpo.tasks.base import prompt_text  # the tasks import this module's InputError

    if not records:
        return []
    probe = records[0]
    overhead = max(len(task.prompt_ids(probe, tokenizer)) - len(prompt_text(probe).encode()), 0) + 8
    return [r for r in records if len(prompt_text(r).encode()) + overhead > room]
