"""The old path of the stale-digits game, kept for configs and code written before ``tasks/`` was grouped by kind (one
line per name); the code is in ``lit_grpo.tasks.games.stale_digits``."""

from lit_grpo.tasks.games.stale_digits import StaleDigitsTask as StaleDigitsTask
