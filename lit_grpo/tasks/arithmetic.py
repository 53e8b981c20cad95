"""The old path of the addition task, kept for configs and code written before ``tasks/`` was grouped by kind (one line
per name); the code is in ``lit_grpo.tasks.single_turn.arithmetic``."""

from lit_grpo.tasks.single_turn.arithmetic import ArithmeticTask as ArithmeticTask
