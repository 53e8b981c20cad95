"""Built-in tasks and the reward interface."""

from lit_grpo.tasks.arithmetic import ArithmeticTask
from lit_grpo.tasks.base import (
    ExactMatchReward,
    PromptRecord,
    Reward,
    ScoredCompletion,
    Task,
    WeightedRewards,
)
from lit_grpo.tasks.dataset import DatasetTask
from lit_grpo.tasks.jsonl import JsonlTask
from lit_grpo.tasks.math_answers import MathVerify
from lit_grpo.tasks.multiround import ClarifyTask, EnvStep, MultiRoundTask
from lit_grpo.tasks.reward_functions import BatchedReward, Completions
from lit_grpo.tasks.reward_model import RewardModel
from lit_grpo.tasks.sort import InclusionOrderingReward, SortDistanceReward, SortTask

__all__ = [
    "ArithmeticTask",
    "BatchedReward",
    "ClarifyTask",
    "Completions",
    "DatasetTask",
    "EnvStep",
    "ExactMatchReward",
    "InclusionOrderingReward",
    "JsonlTask",
    "MathVerify",
    "MultiRoundTask",
    "PromptRecord",
    "Reward",
    "RewardModel",
    "ScoredCompletion",
    "SortDistanceReward",
    "SortTask",
    "Task",
    "WeightedRewards",
]
