"""Tasks and the reward interface, by kind: the framework here (``base``: tasks and rewards; ``episodes``: the one
episode interface of multi-round tasks; ``splits``, ``rows``, ``data_files``, ``file_problems``: splits and data
files), ``rewards/``, ``single_turn/`` (data-file and toy tasks), ``games/`` and ``tools/``. The other modules at this
level are old paths, kept for configs written before (one line per name)."""

from lit_grpo.tasks.base import (
    ExactMatchReward,
    PromptRecord,
    Reward,
    ScoredCompletion,
    Task,
    WeightedRewards,
)
from lit_grpo.tasks.episodes import EnvStep, GameTask, MultiRoundTask
from lit_grpo.tasks.games.operands import ClarifyTask
from lit_grpo.tasks.rewards.functions import BatchedReward, Completions
from lit_grpo.tasks.rewards.math_answers import MathVerify
from lit_grpo.tasks.rewards.model import RewardModel
from lit_grpo.tasks.single_turn.arithmetic import ArithmeticTask
from lit_grpo.tasks.single_turn.dataset import DatasetTask
from lit_grpo.tasks.single_turn.jsonl import JsonlTask
from lit_grpo.tasks.single_turn.sort import InclusionOrderingReward, SortDistanceReward, SortTask

__all__ = [
    "ArithmeticTask",
    "BatchedReward",
    "ClarifyTask",
    "Completions",
    "DatasetTask",
    "EnvStep",
    "ExactMatchReward",
    "GameTask",
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
