"""The old path of the data-file task, kept for configs and code written before ``tasks/`` was grouped by kind (one line
per name); the code is in ``lit_grpo.tasks.single_turn.dataset``."""

from lit_grpo.tasks.single_turn.dataset import DatasetTask as DatasetTask
