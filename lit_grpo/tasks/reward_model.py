"""The old path of the reward model, kept for configs and code written before ``tasks/`` was grouped by kind (one line
per name); the code is in ``lit_grpo.tasks.rewards.model``."""

from lit_grpo.tasks.rewards.model import RewardModel as RewardModel
