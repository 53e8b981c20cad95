"""Built-in tasks and the reward interface."""

from lit_grpo.tasks.arithmetic import ArithmeticTask
from lit_grpo.tasks.base import ExactMatchReward, PromptRecord, Reward, ScoredCompletion, Task, WeightedRewards
from lit_grpo.tasks.jsonl import JsonlTask
from lit_grpo.tasks.sort import InclusionOrderingReward, SortDistanceReward, SortTask

__all__ = [
    "ArithmeticTask",
    "ExactMatchReward",
    "InclusionOrderingReward",
    "JsonlTask",
    "PromptRecord",
    "Reward",
    "ScoredCompletion",
    "SortDistanceReward",
    "SortTask",
    "Task",
    "WeightedRewards",
]
