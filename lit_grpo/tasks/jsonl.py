"""The old path of the JSON-lines task, kept for configs and code written before ``tasks/`` was grouped by kind (one
line per name); the code is in ``lit_grpo.tasks.single_turn.jsonl``."""

from lit_grpo.tasks.single_turn.jsonl import JsonlTask as JsonlTask
