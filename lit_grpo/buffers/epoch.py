"""One epoch's handover from the DataModule to the LightningModule (docs/guide.md#layout): the scored buffer and the
order its minibatches will be served in. The DataModule draws and scores; the module prepares the buffer (π_old,
π_ref, values, advantages, the risk head's fit) in its own hook and then cuts the minibatches (``serve``), which are
what the train loader yields. The epoch's ``RolloutReport`` travels with them: the module reads there whether the
completion budget is spent."""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.data import Dataset

from lit_grpo.buffers.buffer import RolloutBuffer, serve_plan
from lit_grpo.buffers.report import RolloutReport


class EpochBatches(Dataset):
    """The train loader's dataset: ``len(plan)`` minibatches of ``buffer`` and ``padding`` empty ones (a DDP rank
    whose tree rollouts make fewer minibatches than another's), available once ``serve`` has run.

    ``plan`` holds each minibatch's rows (``minibatch_plan``), drawn by the DataModule at the epoch's start; the
    minibatches are cut only after the module has prepared the buffer, so they carry its π_old and advantages.
    """

    def __init__(self, buffer: RolloutBuffer, plan: list[torch.Tensor], report: RolloutReport | None = None,
                 padding: int = 0) -> None:
        self.buffer, self.plan, self.report, self.padding = buffer, plan, report, padding
        self.batches: list[dict[str, torch.Tensor]] | None = None

    def serve(self, accumulate: int, aggregation: str) -> list[dict[str, torch.Tensor]]:
        """Cut the minibatches from the prepared buffer, each with its optimizer step's counts, then ``padding``
        empty ones (``serve_plan``)."""
        self.batches = serve_plan(self.buffer, self.plan, accumulate, aggregation, self.padding)
        return self.batches

    def __len__(self) -> int:
        return len(self.plan) + self.padding

    def __getitem__(self, index: int) -> dict[str, Any]:
        if self.batches is None:
            raise RuntimeError("the epoch's rollouts were not prepared: the LightningModule must prepare the buffer "
                               "and call EpochBatches.serve in its on_train_epoch_start (PolicyModule does)")
        return self.batches[index]
