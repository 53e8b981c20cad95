"""The old path of the tool task, kept for configs and code written before ``tasks/`` was grouped by kind (one line per
name); the code is in ``lit_grpo.tasks.tools.task``."""

from lit_grpo.tasks.tools.task import ToolTask as ToolTask
