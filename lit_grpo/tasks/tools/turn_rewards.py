"""What an environment says after each turn of a tool episode, with ``ToolTask(turn_rewards="environment")``
(docs/guide.md#rewards-per-turn): the turn's reward and whether the episode is over (gym's ``terminated``).

TRL 1.16's ``GRPOTrainer`` has neither: it scores the whole conversation once, and an episode ends only where the
model stops calling tools (or the budget ends it). The contract read here is the shape TRL's experimental OpenReward
adapter (``trl/experimental/openreward/environment.py``) already records on its environments and its trainer
ignores, so such an environment runs unchanged:

- ``rewards``: a list the environment appends one entry to per step (a tool call); ``None`` is a step without a
  reward. A turn's reward is the sum of the entries its calls appended (``None`` counting 0).
- ``finished``: truthy once the episode is over; the episode then ends after this turn's calls.

Its ``reward`` attribute (the last non-null step reward: OpenReward's outcome-only convention, which its default
reward function returns) is not a turn's reward and is not read here.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Any

from lit_grpo.errors import InputError

STEPS, FINISHED = "rewards", "finished"  # the attributes read


@dataclass(frozen=True)
class TurnResult:
    """A turn's reward (the sum of its steps' rewards) and whether the environment ended the episode."""

    reward: float = 0.0
    finished: bool = False


def steps_taken(environment: Any) -> int:
    """How many step rewards the environment has recorded so far (``len(environment.rewards)``; 0 without)."""
    steps = getattr(environment, STEPS, None)
    return len(steps) if isinstance(steps, (list, tuple)) else 0


def turn_result(environment: Any, before: int, label: str) -> TurnResult:
    """The turn's result once its calls ran, ``before`` being ``steps_taken`` at the turn's start. An entry that is
    neither None nor a finite real number is the environment's error, named (``label``: its class)."""
    steps = getattr(environment, STEPS, None)
    new = list(steps[before:]) if isinstance(steps, (list, tuple)) else []
    for value in new:
        finite = isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)
        if value is not None and not finite:
            raise InputError(f"environment {label}: a step reward in its `{STEPS}` list is {value!r}; each entry must "
                             "be a finite number, or None for a step without a reward")
    return TurnResult(float(sum(v for v in new if v is not None)), bool(getattr(environment, FINISHED, False)))


def after_turn(toolbox: Any, before: int | None, label: str) -> TurnResult:
    """``turn_result`` of the toolbox's environment, or nothing (``TurnResult()``) where no step was counted at the
    turn's start (``before`` None: turn rewards off, or no call) or the environment is gone (its box lost)."""
    if before is None or toolbox is None or toolbox.lost:
        return TurnResult()
    return turn_result(toolbox.environment, before, label)
