"""The old path of the batched reward, kept for configs and code written before ``tasks/`` was grouped by kind (one line
per name); the code is in ``lit_grpo.tasks.rewards.functions``."""

from lit_grpo.tasks.rewards.functions import BatchedReward as BatchedReward
from lit_grpo.tasks.rewards.functions import Completions as Completions
