"""The rules between a task's rewards and the data module's knobs (the registry, ``rules.cross_knob_problems``, runs
them): what a reward declares of itself, as a Protocol, since run/ imports no task."""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class NeedsRewardTimeout(Protocol):
    """A reward (instance or class) that says whether only ``data.reward_timeout`` bounds its calls (``MathVerify``:
    math-verify's own signal timeouts are off, and a hostile answer parses for minutes or never compares)."""

    needs_reward_timeout: bool


@runtime_checkable
class ScoresWithRewards(Protocol):
    """A task scoring with a list of rewards (``DatasetTask``, ``JsonlTask``)."""

    rewards: list[Any]


def reward_timeout_problems(data_args: dict[str, Any], task: Any, rewards: list[Any] | None = None) -> list[str]:
    """A reward that needs ``data.reward_timeout`` (``NeedsRewardTimeout``) is refused without one: ``rewards`` the
    configured rewards' classes (before the task is built), else a built ``task``'s own (``ScoresWithRewards``)."""
    if data_args.get("reward_timeout") is not None:
        return []
    if rewards is None:
        rewards = list(task.rewards) if isinstance(task, ScoresWithRewards) and not isinstance(task, type) else []
    named = [reward if isinstance(reward, type) else type(reward) for reward in rewards
             if isinstance(reward, NeedsRewardTimeout) and reward.needs_reward_timeout]
    return [f"data.reward_timeout: the {cls.__name__} reward is bounded by it alone (a hostile answer parses for "
            "minutes or never finishes comparing, in the trainer's process without it); set data.reward_timeout, "
            "e.g. 5.0 seconds per completion" for cls in dict.fromkeys(named)]
