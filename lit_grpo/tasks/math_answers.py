"""The old path of the math-verify reward, kept for configs and code written before ``tasks/`` was grouped by kind (one
line per name); the code is in ``lit_grpo.tasks.rewards.math_answers``."""

from lit_grpo.tasks.rewards.math_answers import MathVerify as MathVerify
