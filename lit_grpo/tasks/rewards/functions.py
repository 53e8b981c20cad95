"""Rewards as users write them: a ``Reward`` subclass called per completion, or a plain function with TRL's
batched signature ``f(prompts, completions, completion_ids, **columns) -> list[float | None]``, several of them with
weights. ``None`` or NaN means "does not apply to this sample": the weighted sum skips it (TRL's NaN-aware sum); a
sample no reward applies to is a reward error. What else an answer may hold, and what it costs whom:
``lit_grpo.tasks.rewards.answers``. Reward code gets copies of the records: it never changes the task's own."""

from __future__ import annotations

import importlib
import importlib.util
import types
from abc import abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lit_grpo.errors import InputError
from lit_grpo.run.model_files import shipped_path
from lit_grpo.tasks.base import PromptRecord, Reward, is_conversation
from lit_grpo.tasks.rewards.answers import (
    AnswerError,
    Column,
    checked_answer,
    plain_copy,
)
from lit_grpo.tasks.rewards.guard import reward_outcome

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

    def copied(self) -> Completions:
        """The batch with copies of its records (one per completion, as TRL's rows are) and of its id lists: what
        reward code is given."""
        return Completions([plain_copy(r) for r in self.records], list(self.texts), [list(i) for i in self.ids],
                           self.conversational)

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


def reward_column(reward: RewardLike, name: str, batch: Completions) -> Column:
    """One call of ``reward`` (named ``name``) on copies of ``batch``: each completion's value (``None``: does not
    apply) and error. A ``Reward`` is called once per completion of the batch; whatever the call raises
    (``sys.exit`` and its own ``KeyboardInterrupt`` included; the user's Ctrl-C is raised on: ``rewards/guard.py``), or an answer that is not one value per completion, is every completion's error."""
    given, count = batch.copied(), len(batch.texts)

    def call() -> Any:
        if isinstance(reward, BatchedReward):
            return reward.score_batch(given)
        if isinstance(reward, Reward):
            return [reward(r, t, i) for r, t, i in zip(given.records, given.texts, given.ids)]
        return reward(**given.trl_arguments())

    return called_column(call, name, count)


def called_column(call: Callable[[], Any], name: str, count: int) -> Column:
    """The column of ``count`` completions that reward ``name``'s ``call`` answers: whatever it raises is every
    completion's error (``reward_outcome``), and so is an answer that is not one value per completion."""
    answer, error = reward_outcome(call)  # any failure of user code fails its completions, not the run
    if error is not None:
        return [None] * count, [f"{name}: {type(error).__name__}: {error}"] * count
    return answer_column(answer, name, count)


def answer_column(answer: Any, name: str, count: int) -> Column:
    """``answer`` checked as reward ``name``'s values for ``count`` completions (``checked_answer``)."""
    try:
        return checked_answer(answer, count, name)
    except AnswerError as error:
        return [None] * count, [f"{name}: {error}"] * count


def weighted_total(parts: Sequence[float | None], weights: Sequence[float]) -> float | None:
    """The weighted sum of the rewards that apply; ``None`` when none does."""
    applied = [w * v for v, w in zip(parts, weights) if v is not None]
    return sum(applied) if applied else None
