"""The held-out prompts of ``RolloutDataModule`` (docs/guide.md#validation-and-test-prompts): the validation prompts
(what every validation and calibration reads) and the test prompts (what ``lit-grpo test`` reads, nobody selects
on), in batches scored with the current policy when the loop reaches them (``HeldOutScores``): greedily, or with
``n`` samples per prompt under a ``SampledEvaluation`` (``sampled.py``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import DataLoader

from lit_grpo.engines import RolloutEngine, SamplingSpec
from lit_grpo.risk.rule import RiskRule
from lit_grpo.rollout.evaluation import HeldOutScores, greedy_completion_scores
from lit_grpo.rollout.reward_worker import RewardWorker
from lit_grpo.rollout.sampled import (SampledEvaluation, as_evaluation, sampled_completion_scores,
                                      sampled_episode_scores, sampling_of)
from lit_grpo.rollout.trees import greedy_episodes
from lit_grpo.tasks import MultiRoundTask, PromptRecord, Task

# greedy: (rewards or returns [B], correct [B] bool); sampled: each per-prompt figure's [B] (sampled.py)
Scores = tuple[torch.Tensor, torch.Tensor] | dict[str, torch.Tensor]


@dataclass
class HeldOutPrompts:
    """Which held-out prompts a validation or test reads, in what batches, and how a batch is scored (greedily, or
    sampled under ``evaluation``): the task's, the engine's and the scorer's (the data module's, which pushes the
    policy first)."""

    task: Task
    engine: RolloutEngine
    scorer: Task | RewardWorker
    rounds: int | None  # of a multi-round task's episodes (None: until each ends)
    max_prompts: int | None
    batch_size: int
    evaluation: SampledEvaluation | None = None  # None: greedy, today's val/* exactly
    name: str | None = None  # a named evaluation set's (eval_sets.py): its batches carry it; None: the task's val/*
    every_n_epochs: int = 1  # a named set's interval (eval_sets.due_sets)
    source: Callable[[], Sequence[PromptRecord]] | None = None  # a named set's prompts; None: the validation split

    def __post_init__(self) -> None:
        self.evaluation = as_evaluation(self.evaluation)  # a config's (or a checkpoint's) mapping
        self.sampled: set[int] = set()  # the records of the loader in use that are sampled (by id)

    def validation(self) -> list[PromptRecord]:
        """The first ``max_prompts`` of the task's validation split, never its test split (of a named set: of its
        ``source``)."""
        return list((self.source or self.task.validation_records)())[: self.max_prompts]

    def test(self) -> list[PromptRecord]:
        """The task's whole test split (``Trainer(limit_test_batches=...)`` takes fewer); the task refuses when it has
        none (``Task.test_records``)."""
        return list(self.task.test_records())

    def loader(self, records: list[PromptRecord], scores: Callable[[list[PromptRecord]], Scores]) -> DataLoader:
        """``records`` in batches of ``batch_size``, each scored by ``scores`` when the loop reaches it."""
        batches = [records[i : i + self.batch_size] for i in range(0, len(records), self.batch_size)]
        count = None if self.evaluation is None else self.evaluation.prompts
        self.sampled = {id(record) for record in records[:count]}
        name = "return" if isinstance(self.task, MultiRoundTask) else "reward"
        return DataLoader(HeldOutScores(batches, scores, name, self.name), batch_size=None)

    def scores(self, tokenizer: Any, records: list[PromptRecord], sampling: SamplingSpec,
               rule: RiskRule | None) -> Scores:
        """Greedy completions of ``records`` (``sampling``: the greedy spec) and their rewards; for a multi-round
        task, greedy episodes of up to ``rounds`` rounds (under ``rule``, if any) and their returns. Under a
        ``SampledEvaluation``, the same and beside them each prompt's figures over its samples."""
        if isinstance(self.task, MultiRoundTask):
            greedy = greedy_episodes(self.task, self.engine, tokenizer, records, self.rounds, sampling, rule)
        else:
            greedy = greedy_completion_scores(self.task, self.engine, self.scorer, tokenizer, records, sampling)
        if self.evaluation is None:
            return greedy
        if self.evaluation.prompts is not None:  # the first evaluation.prompts of the loader's
            records = [record for record in records if id(record) in self.sampled]
            if not records:
                return greedy
        drawn = sampling_of(self.evaluation, sampling, records)
        if isinstance(self.task, MultiRoundTask):
            figures = sampled_episode_scores(self.task, self.engine, tokenizer, records, self.rounds, drawn,
                                             self.evaluation, rule)
        else:
            figures = sampled_completion_scores(self.task, self.engine, self.scorer, tokenizer, records, drawn,
                                                self.evaluation)
        rewards, correct = greedy
        return {"return" if isinstance(self.task, MultiRoundTask) else "reward": rewards, "correct": correct, **figures}
