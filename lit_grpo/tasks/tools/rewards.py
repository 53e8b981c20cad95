"""A tool task's rewards called as TRL 1.16's ``GRPOTrainer._calculate_rewards`` calls them: once per batch with every
episode that ended, each reward given ``prompts``, ``completions`` (the messages after the prompt), ``completion_ids``,
``trainer_state``, ``log_extra``, ``log_metric``, ``environments`` and every other column of the rows; async rewards
(and an async ``get_reward``) awaited together; the total is the ``reward_weights``-weighted sum of the rewards that
apply. Where TRL and lit-grpo differ, on purpose:

- a reward that raises is counted in ``rollout/reward_errors`` and its episodes score the task's ``failure_reward``
  (TRL stops the run): one bad batch does not end a long run, and crashing never pays more than a wrong answer;
- an episode no reward applies to (every one returned ``None``) is unscorable: it is counted, warned about once per
  call, and carries advantage 0 (TRL's NaN-aware sum makes it 0 and warns).
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from lit_grpo.tasks.rewards.answers import plain_copy
from lit_grpo.tasks.rewards.functions import answer_column, called_column
from lit_grpo.tasks.rewards.guard import reward_outcome


@dataclass
class TrainerState:
    """What a reward reads of the run's progress, with the fields (and the meaning) of transformers'
    ``TrainerState`` that TRL passes as ``trainer_state``: filled from Lightning's trainer by the data module."""

    epoch: float = 0.0
    global_step: int = 0
    max_steps: int = 0
    num_train_epochs: int = 0
    is_world_process_zero: bool = True
    is_local_process_zero: bool = True


def trainer_state(trainer: Any) -> TrainerState:
    """A Lightning trainer's progress as TRL's ``trainer_state`` gives it (a trainer not attached yet: zeros)."""
    if trainer is None:
        return TrainerState()
    return TrainerState(epoch=float(trainer.current_epoch), global_step=int(trainer.global_step),
                        max_steps=int(trainer.max_steps), num_train_epochs=int(trainer.max_epochs or 0),
                        is_world_process_zero=bool(trainer.is_global_zero),
                        is_local_process_zero=int(trainer.local_rank) == 0)


def draw_context(task: Any, trainer: Any) -> RewardContext:
    """A rollout draw's reward context: for a multi-round task, the trainer's state (what rewards called as TRL calls
    them are given: a tool task's) and the task's tools; an empty one for a single-turn task."""
    from lit_grpo.tasks.episodes import MultiRoundTask

    if not isinstance(task, MultiRoundTask):
        return RewardContext()
    return RewardContext(trainer_state(trainer), tool_names=tuple(task.tool_names()))


@dataclass
class RewardContext:
    """What one rollout batch's reward calls share: the run's ``trainer_state``, and what rewards logged through
    ``log_metric`` (scalars, averaged per name) and ``log_extra`` (columns for the samples table); ``tool_names``:
    the task's tools, for the report."""

    trainer_state: TrainerState = field(default_factory=TrainerState)
    metrics: dict[str, list[float]] = field(default_factory=dict)
    extra: dict[str, list[Any]] = field(default_factory=dict)
    tool_names: tuple[str, ...] = ()  # every tool the draw's episodes may call (the metrics log each by name)

    def report_fields(self) -> dict[str, Any]:
        """What the rollout side's report carries of the draw: the task's tool names and what rewards logged."""
        return {"tool_names": self.tool_names, "logged_metrics": self.logged()}

    def log_metric(self, name: str, value: float) -> None:
        """TRL's ``log_metric(name, value)``."""
        self.metrics.setdefault(str(name), []).append(float(value))

    def logged(self) -> dict[str, tuple[float, int]]:
        """Each ``log_metric`` name's (sum, count) so far."""
        return {name: (sum(values), len(values)) for name, values in self.metrics.items()}

    def log_extra(self, column: str, values: list[Any]) -> None:
        """TRL's ``log_extra(column, values)``."""
        self.extra.setdefault(str(column), []).extend(values)


@dataclass(frozen=True)
class EpisodeScore:
    """An episode's reward: ``reward`` (None: unscorable, no reward applied), each reward's value by name, the
    errors of the rewards that failed on it (then ``reward`` is the task's ``failure_reward``), and whether it
    counts as correct (the task's ``success_reward`` reached)."""

    reward: float | None
    parts: Mapping[str, float | None]
    errors: tuple[str, ...] = ()
    correct: bool = False
    extra: Mapping[str, Any] = field(default_factory=dict)  # what the rewards logged for it with ``log_extra``


def is_async(function: Any) -> bool:
    """Whether calling ``function`` gives a coroutine (an ``async def``, or an object whose ``__call__`` is one)."""
    return inspect.iscoroutinefunction(function) or inspect.iscoroutinefunction(getattr(function, "__call__", None))


def environment_reward(environment_type: type) -> Callable[..., Any]:
    """TRL's reward for an environment class that owns its reward: its ``get_reward()`` on each episode whose
    environment is exactly that class, None on the others; async where ``get_reward`` is."""
    if inspect.iscoroutinefunction(getattr(environment_type, "get_reward", None)):
        async def get_reward(environments: Sequence[Any], **_: Any) -> list[float | None]:
            return [await e.get_reward() if environment_class(e) is environment_type else None for e in environments]
    else:
        def get_reward(environments: Sequence[Any], **_: Any) -> list[float | None]:
            return [e.get_reward() if environment_class(e) is environment_type else None for e in environments]
    get_reward.__name__ = environment_type.__name__
    return get_reward


def environment_class(environment: Any) -> type:
    """The class of an environment, or of the one a proxy stands for (``__class__``, which a proxy gives as its
    environment's: TRL compares ``type(environment)``, the same for a live instance)."""
    return environment.__class__


def score_batch(rewards: Sequence[Callable[..., Any]], names: Sequence[str], weights: Sequence[float],
                arguments: Mapping[str, Any], count: int, failure_reward: float,
                context: RewardContext) -> list[EpisodeScore]:
    """Each of ``count`` episodes' score from one call of every reward with TRL's keyword ``arguments`` (copies of
    the columns go to each reward, so one reward cannot change what the next sees)."""
    columns: dict[str, tuple[list[float | None], list[str | None]]] = {}
    extra: dict[str, list[Any]] = {}  # this call's log_extra columns, one value per episode

    def log_extra(column: str, values: list[Any]) -> None:
        context.log_extra(column, values)
        if len(values) == count:
            extra[str(column)] = list(values)

    shared = {"trainer_state": context.trainer_state, "log_extra": log_extra, "log_metric": context.log_metric}
    pending = []
    for reward, name in zip(rewards, names):
        given = {**{k: (v if k == "environments" else plain_copy(v)) for k, v in arguments.items()}, **shared}
        if is_async(reward):
            pending.append((name, reward, given))
        else:
            columns[name] = called_column(lambda r=reward, g=given: r(**g), name, count)
    if pending:
        for name, column in zip([p[0] for p in pending], awaited_together(pending, count)):
            columns[name] = column
    scores = []
    for index in range(count):
        parts = {name: columns[name][0][index] for name in names}
        errors = tuple(e for name in names if (e := columns[name][1][index]) is not None)
        applied = [w * v for name, w in zip(names, weights) if (v := parts[name]) is not None]
        reward = failure_reward if errors else (sum(applied) if applied else None)
        scores.append(EpisodeScore(reward, parts, errors, extra={k: v[index] for k, v in extra.items()}))
    return scores


def awaited_together(pending: Sequence[tuple[str, Callable[..., Any], dict[str, Any]]],
                     count: int) -> list[tuple[list[float | None], list[str | None]]]:
    """The async rewards' columns, awaited together in one event loop (TRL gathers them)."""
    async def both() -> list[Any]:
        return await asyncio.gather(*(reward(**given) for _, reward, given in pending), return_exceptions=True)

    answers, error = reward_outcome(lambda: asyncio.run(both()))
    if error is not None:
        return [([None] * count, [f"{name}: {type(error).__name__}: {error}"] * count) for name, _, _ in pending]
    columns = []
    for (name, _, _), answer in zip(pending, answers):
        if isinstance(answer, BaseException):
            columns.append(([None] * count, [f"{name}: {type(answer).__name__}: {answer}"] * count))
        else:
            columns.append(answer_column(answer, name, count))
    return columns
