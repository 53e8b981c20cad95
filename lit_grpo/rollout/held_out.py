"""The held-out prompts of ``RolloutDataModule`` (docs/guide.md#validation-and-test-prompts): the validation prompts
(what every validation and calibration reads) and the test prompts (what ``lit-grpo test`` reads, nobody selects
on), in batches scored greedily with the current policy when the loop reaches them (``HeldOutScores``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import DataLoader

from lit_grpo.engines import RolloutEngine, SamplingSpec
from lit_grpo.risk.rule import RiskRule
from lit_grpo.rollout.evaluation import HeldOutScores, greedy_completion_scores
from lit_grpo.rollout.reward_worker import RewardWorker
from lit_grpo.rollout.trees import greedy_episodes
from lit_grpo.tasks import MultiRoundTask, PromptRecord, Task

Scores = tuple[torch.Tensor, torch.Tensor]  # (rewards or returns [B], correct [B] bool)


@dataclass
class HeldOutPrompts:
    """Which held-out prompts a validation or test reads, in what batches, and how a batch is scored greedily: the
    task's, the engine's and the scorer's (the data module's, which pushes the policy first)."""

    task: Task
    engine: RolloutEngine
    scorer: Task | RewardWorker
    rounds: int | None  # of a multi-round task's episodes (None: until each ends)
    max_prompts: int | None
    batch_size: int

    def validation(self) -> list[PromptRecord]:
        """The first ``max_prompts`` of the task's validation split, never its test split."""
        return list(self.task.validation_records())[: self.max_prompts]

    def test(self) -> list[PromptRecord]:
        """The task's whole test split (``Trainer(limit_test_batches=...)`` takes fewer); the task refuses when it has
        none (``Task.test_records``)."""
        return list(self.task.test_records())

    def loader(self, records: list[PromptRecord], scores: Callable[[list[PromptRecord]], Scores]) -> DataLoader:
        """``records`` in batches of ``batch_size``, each scored by ``scores`` when the loop reaches it."""
        batches = [records[i : i + self.batch_size] for i in range(0, len(records), self.batch_size)]
        name = "return" if isinstance(self.task, MultiRoundTask) else "reward"
        return DataLoader(HeldOutScores(batches, scores, name), batch_size=None)

    def greedy_scores(self, tokenizer: Any, records: list[PromptRecord], sampling: SamplingSpec,
                      rule: RiskRule | None) -> Scores:
        """Greedy completions of ``records`` and their rewards; for a multi-round task, greedy episodes of up to
        ``rounds`` rounds (under ``rule``, if any) and their returns."""
        if isinstance(self.task, MultiRoundTask):
            return greedy_episodes(self.task, self.engine, tokenizer, records, self.rounds, sampling, rule)
        return greedy_completion_scores(self.task, self.engine, self.scorer, tokenizer, records, sampling)
