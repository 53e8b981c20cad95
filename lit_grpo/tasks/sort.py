"""The old path of the sort task and its rewards, kept for configs and code written before ``tasks/`` was grouped by
kind (one line per name); the code is in ``lit_grpo.tasks.single_turn.sort``."""

from lit_grpo.tasks.single_turn.sort import InclusionOrderingReward as InclusionOrderingReward
from lit_grpo.tasks.single_turn.sort import SortDistanceReward as SortDistanceReward
from lit_grpo.tasks.single_turn.sort import SortTask as SortTask
