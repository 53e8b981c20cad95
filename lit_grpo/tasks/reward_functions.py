"""Rewards as users write them: a ``Reward`` subclass called per completion, or a plain function with TRL's
batched signature ``f(prompts, completions, completion_ids, **columns) -> list[float | None]``, several of them with
weights. ``None`` means "does not apply to this sample": the weighted sum skips it (TRL's NaN-aware sum); a sample
no reward applies to is a reward error."""

from __future__ import annotations

import importlib
import importlib.util
import math
import types
from abc import abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lit_grpo.errors import InputError
from lit_grpo.run.model_files import shipped_path
from lit_grpo.tasks.base import REWARD_LIMIT, PromptRecord, Reward, is_conversation

RewardLike = Reward | Callable[..., Sequence[float | None]]


def import_reward(spec: Reward | str) -> RewardLike:
    """A ``Reward`` as given, or the function named by ``spec``: ``package.module.function`` on the Python path, or
    ``path/to/file.py:function`` (a reward file written for TRL, loaded from where the command runs)."""
    if isinstance(spec, Reward):
        return spec
    text = str(spec)
    if ":" in text and text.split(":", 1)[0].endswith(".py"):
        file, name = text.split(":", 1)
        module = module_from_file(shipped_path(file), text)
    else:
        module_name, _, name = text.rpartition(".")
        try:
            module = importlib.import_module(module_name) if module_name else None
        except ImportError as error:
            raise InputError(f"reward {text!r}: module {module_name!r} does not import ({error})") from None
    function = getattr(module, name, None)
    if not callable(function):
        raise InputError(f"reward {text!r}: not a Reward class path nor a function (package.module.function or "
                         "path/to/file.py:function)")
    return function


def module_from_file(path: Path, spec: str) -> types.ModuleType:
    """The Python file at ``path`` imported as a module of its own (its name is the file's stem)."""
    if not path.is_file():
        raise InputError(f"reward {spec!r}: {str(path)!r} is not a file")
    loader_spec = importlib.util.spec_from_file_location(f"lit_grpo_rewards_{path.stem}", path)
    module = importlib.util.module_from_spec(loader_spec)
    try:
        loader_spec.loader.exec_module(module)
    except Exception as error:  # noqa: BLE001 - a user file failing to import is a bad input, named
        raise InputError(f"reward {spec!r}: {str(path)!r} does not import ({type(error).__name__}: {error})") from None
    return module


def reward_name(reward: RewardLike) -> str:
    """The name a reward's metrics carry: its function's or class's."""
    return getattr(reward, "__name__", None) or type(reward).__name__


@dataclass(frozen=True)
class Completions:
    """A batch of completions as reward functions see them: each one's prompt record, text and token ids, and
    whether the prompts are conversations (then a completion is passed as one assistant message)."""

    records: Sequence[PromptRecord]
    texts: Sequence[str]
    ids: Sequence[Sequence[int]]
    conversational: bool

    def one(self, index: int) -> Completions:
        """The batch of completion ``index`` alone."""
        return Completions([self.records[index]], [self.texts[index]], [self.ids[index]], self.conversational)

    def trl_arguments(self) -> dict[str, Any]:
        """TRL's keyword arguments: prompts, completions, completion ids, and every other column as a list."""
        completions: list[Any] = list(self.texts)
        if self.conversational:
            completions = [[{"role": "assistant", "content": text}] for text in self.texts]
        columns = {key for record in self.records for key in record} - {"prompt", "completion", "completion_ids"}
        arguments = {key: [record.get(key) for record in self.records] for key in sorted(columns)}
        return {**arguments, "prompts": [r["prompt"] for r in self.records], "completions": completions,
                "completion_ids": [list(ids) for ids in self.ids]}


class BatchedReward(Reward):
    """A reward that scores a whole batch in one call (a reward model's forward pass): override ``score_batch``.
    It is given in a task's ``rewards`` by class path like any ``Reward``; a failure fails the whole batch."""

    @abstractmethod
    def score_batch(self, batch: Completions) -> list[float | None]:
        """One value per completion of ``batch`` (``None``: does not apply)."""

    def __call__(self, prompt_record: PromptRecord, completion_text: str, completion_ids: Sequence[int]) -> float:
        value = self.score_batch(Completions([prompt_record], [completion_text], [completion_ids],
                                             is_conversation(prompt_record["prompt"])))[0]
        if value is None:
            raise ValueError(f"{reward_name(self)} does not apply to this completion")
        return value


def is_batched(reward: RewardLike) -> bool:
    """Whether a reward scores a batch per call: a ``BatchedReward`` or a plain function (TRL's convention)."""
    return isinstance(reward, BatchedReward) or not isinstance(reward, Reward)


def reward_values(reward: RewardLike, batch: Completions) -> list[float | None]:
    """One reward's value for each completion (``None`` where it does not apply); raises what the reward raises,
    and on a result that is not one finite number (or None) within ``±REWARD_LIMIT`` per completion."""
    if isinstance(reward, BatchedReward):
        values: Sequence[Any] = reward.score_batch(batch)
    elif isinstance(reward, Reward):
        values = [reward(r, t, i) for r, t, i in zip(batch.records, batch.texts, batch.ids)]
    else:
        values = reward(**batch.trl_arguments())
    if is_batched(reward) and (not isinstance(values, Sequence) or len(values) != len(batch.texts)):
        raise ValueError(f"{reward_name(reward)} returned {type(values).__name__} of length "
                         f"{len(values) if isinstance(values, Sequence) else '?'} for {len(batch.texts)} completions")
    checked = []
    for value in values:
        if value is not None:
            value = float(value)
            if not math.isfinite(value) or abs(value) > REWARD_LIMIT:
                raise ValueError(f"{reward_name(reward)} gave {value!r}, not a finite number within ±{REWARD_LIMIT:g}")
        checked.append(value)
    return checked


def weighted_total(parts: Sequence[float | None], weights: Sequence[float]) -> float | None:
    """The weighted sum of the rewards that apply; ``None`` when none does."""
    applied = [w * v for v, w in zip(parts, weights) if v is not None]
    return sum(applied) if applied else None
