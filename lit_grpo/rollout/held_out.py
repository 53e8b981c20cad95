"""The held-out loaders of ``RolloutDataModule`` (docs/guide.md#validation-and-test-prompts): the validation prompts
(what every validation and calibration reads) and the test prompts (what ``lit-grpo test`` reads, nobody selects
on), in batches scored greedily with the current policy when the loop reaches them (``HeldOutScores``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader

from lit_grpo.buffers.protocols import SamplingPolicy
from lit_grpo.rollout.evaluation import HeldOutScores, greedy_completion_scores
from lit_grpo.rollout.trees import greedy_episodes
from lit_grpo.tasks import MultiRoundTask, PromptRecord, Task


class HeldOutLoaders(pl.LightningDataModule):
    """Mixed into ``RolloutDataModule``, whose members it reads: ``task``, ``engine``, ``scorer``, ``branching``,
    ``val_max_prompts``, ``val_batch_size``, ``prefetch``, and ``checked_module``, ``sync_policy``,
    ``sampling_spec``, ``risk_rule``. Serves ``val_dataloader``, ``test_dataloader`` and ``held_out_scores`` (the
    module's ``ServesHeldOutScores``)."""

    task: Task
    engine: Any
    scorer: Any
    branching: list[int]
    val_max_prompts: int | None
    val_batch_size: int
    prefetch: Any

    def val_records(self) -> list[PromptRecord]:
        """The validation prompts a validation (and a calibration) uses: the first ``val_max_prompts`` of the
        task's validation split, never its test split."""
        return list(self.task.validation_records())[: self.val_max_prompts]

    def val_dataloader(self) -> DataLoader:
        """Batches of validation prompts (``val_records``), each scored greedily with the current policy when the
        loop reaches it."""
        return self.greedy_loader(self.val_records)

    def held_out_scores(self) -> DataLoader:
        """The validation loader, for the module's measures outside Lightning's loop (``ServesHeldOutScores``)."""
        return self.val_dataloader()

    def test_dataloader(self) -> DataLoader:
        """The task's test split, every prompt (``Trainer(limit_test_batches=...)`` takes fewer), scored as
        validation's are; the task refuses when it has none (``Task.test_records``)."""
        return self.greedy_loader(lambda: list(self.task.test_records()))

    def greedy_loader(self, held_out: Callable[[], list[PromptRecord]]) -> DataLoader:
        """``held_out()``'s prompts in batches of ``val_batch_size``, each scored greedily (``HeldOutScores``)."""
        module = self.checked_module()  # first: the prompt check may drop prompts too long for the model
        records = held_out()
        batches = [records[i : i + self.val_batch_size] for i in range(0, len(records), self.val_batch_size)]
        name = "return" if isinstance(self.task, MultiRoundTask) else "reward"
        return DataLoader(HeldOutScores(batches, lambda part: self.greedy_scores(module, part), name), batch_size=None)

    def greedy_scores(self, module: SamplingPolicy, records: list[PromptRecord]) -> tuple[torch.Tensor, torch.Tensor]:
        """Greedy completions of held-out prompts: ``(rewards [B], correct [B])``; for a multi-round task, greedy
        episodes of up to ``len(branching)`` rounds and their returns."""
        self.prefetch.wait()  # the engine serves one caller at a time
        self.sync_policy(module)
        sampling = self.sampling_spec(module, greedy=True, seed=None)
        if isinstance(self.task, MultiRoundTask):
            return greedy_episodes(self.task, self.engine, module.tokenizer, records, len(self.branching), sampling,
                                   self.risk_rule(module))
        return greedy_completion_scores(self.task, self.engine, self.scorer, module.tokenizer, records, sampling)
