"""What a reward's answer may be, what each part of it means, and what reward code is given (copies).

A batched reward (a TRL-style function, a ``BatchedReward``) answers one value per completion, as a list, a tuple, a
1-D numpy array or a 1-D tensor; a per-completion ``Reward`` answers one value. A value is

- a real number (``int``, ``float``, numpy scalars, 0-d arrays and tensors; ``bool`` counts 1 or 0, as TRL's
  ``torch.tensor(..., dtype=float32)`` counts it): the reward, which must lie within ``±REWARD_LIMIT``;
- ``None`` or NaN: the reward does not apply to that completion; the weighted sum leaves it out (TRL's NaN-aware
  sum), and a completion no reward applies to is a reward error;
- anything else (±inf, a number beyond ``±REWARD_LIMIT``, a string, a dict, a list): an error of that reward for
  that completion alone. That completion scores the task's ``failure_reward`` and counts in
  ``rollout/reward_errors``; the reward's values for the other completions and the other rewards' values stand.

An answer that is not one value per completion (a string, a dict, one number, ``None``, another length, a 2-D array)
is a failure of the whole call, like a raise: each completion of the call scores ``failure_reward``, and the
message names the reward and what it returned.
"""

from __future__ import annotations

import copy
import math
import numbers
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch

REWARD_LIMIT = 1e6  # larger rewards are taken for bugs: squared in the group statistics they overflow
Column = tuple[list[float | None], list[str | None]]  # one reward's value ([N], None: does not apply) and error [N]


class AnswerError(ValueError):
    """A reward's answer, or one value of it, that is not a reward; the message says what it is."""


def shown(value: Any) -> str:
    """A value as a message shows it: its type and a short repr."""
    return f"{type(value).__name__} {value!r:.60}"


def reward_number(value: Any) -> float | None:
    """``value`` as a reward: a float, or ``None`` where the reward does not apply (``None``, NaN). Raises
    ``AnswerError`` saying what it is when it is no real number, not finite, or beyond ``±REWARD_LIMIT``."""
    if value is None:
        return None
    if isinstance(value, (torch.Tensor, np.ndarray)):
        if value.ndim != 0:
            raise AnswerError(f"{type(value).__name__} of shape {tuple(value.shape)} is not one number")
        value = value.item()
    if not isinstance(value, (numbers.Real, np.bool_)):  # bool and numpy scalars included; str, complex, dict not
        raise AnswerError(f"{shown(value)} is not a number")
    try:
        number = float(value)
    except (OverflowError, ValueError, TypeError):  # an int beyond float's range, an odd Real
        raise AnswerError(f"{shown(value)} is not a finite number within ±{REWARD_LIMIT:g}") from None
    if math.isnan(number):
        return None
    if not math.isfinite(number) or abs(number) > REWARD_LIMIT:
        raise AnswerError(f"{number!r} is not a finite number within ±{REWARD_LIMIT:g}")
    return number


def answer_values(answer: Any, count: int) -> list[Any]:
    """A batched reward's answer as its ``count`` values; ``AnswerError`` when it is not one value per completion."""
    if isinstance(answer, (torch.Tensor, np.ndarray)):
        if answer.ndim != 1:
            raise AnswerError(f"returned a {type(answer).__name__} of shape {tuple(answer.shape)}, not one value per "
                              f"completion ({count})")
        answer = answer.tolist()
    elif isinstance(answer, Iterator):  # a generator: TRL takes it too
        answer = list(answer)
    if isinstance(answer, (str, bytes, bytearray)) or not isinstance(answer, Sequence):
        raise AnswerError(f"returned {shown(answer)}, not a list of {count} rewards")
    if len(answer) != count:
        raise AnswerError(f"returned {len(answer)} values for {count} completions")
    return list(answer)


def checked_answer(answer: Any, count: int, name: str) -> Column:
    """Each completion's value (``None``: does not apply) and error (``None``: none) from reward ``name``'s answer
    for ``count`` completions. Raises ``AnswerError`` when the answer as a whole is not one value per completion."""
    values: list[float | None] = []
    errors: list[str | None] = []
    for value in answer_values(answer, count):
        try:
            values.append(reward_number(value))
            errors.append(None)
        except AnswerError as error:
            values.append(None)
            errors.append(f"{name}: {error}")
    return values, errors


def weights_problem(weights: Sequence[Any] | None, count: int) -> str | None:
    """Why ``reward_weights`` cannot weigh ``count`` rewards: another length, a weight that is not a finite number,
    or all of them 0 (every completion would score 0: nothing to learn)."""
    if weights is None:
        return None
    if len(weights) != count:
        return f"reward_weights has {len(weights)} entries for {count} rewards"
    for index, weight in enumerate(weights):
        if isinstance(weight, bool) or not isinstance(weight, numbers.Real) or not math.isfinite(float(weight)):
            return f"reward_weights[{index}] is {weight!r}; each weight must be a finite number"
    if all(float(w) == 0 for w in weights):
        return "reward_weights are all 0: every completion would score 0 and nothing would be learned"
    return None


def plain_copy(value: Any) -> Any:
    """A deep copy of ``value``, fast for what records hold (dicts, lists, strings, numbers): what reward code is
    given, so that it never changes the task's own records."""
    if value is None or isinstance(value, (str, int, float)):
        return value
    if type(value) is dict:
        return {key: plain_copy(item) for key, item in value.items()}
    if type(value) is list:
        return [plain_copy(item) for item in value]
    return copy.deepcopy(value)
