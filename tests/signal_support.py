"""Test-only: a callback that holds one DDP rank in epoch 1 while the others go on into the epoch's first update, where
they wait for it inside a collective (the state of a rank still generating while the others are done), and an engine
that marks when each generation begins."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import lightning.pytorch as pl

from lit_grpo.engines import HFEngine, SamplingSpec
from lit_grpo.engines.base import Completion


class HoldRank(pl.Callback):
    """At the first batch of epoch ``epoch``, rank ``rank`` writes ``marker`` and sleeps."""

    def __init__(self, marker: str, rank: int, epoch: int = 1) -> None:
        self.marker, self.rank, self.epoch = marker, rank, epoch

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: Any, batch: Any, batch_idx: int) -> None:
        if (trainer.current_epoch, batch_idx, trainer.global_rank) == (self.epoch, 0, self.rank):
            Path(self.marker).write_text(f"{trainer.global_rank}\n")
            time.sleep(600)


class MarksDraws(HFEngine):
    """HFEngine appending a line to ``marks`` as each ``generate`` call begins, for a test to signal a run while it
    generates (an event, not a guess of how long the run takes to get there)."""

    def __init__(self, marks: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.marks = marks

    def generate(self, prompts: list[list[int]], n: int, sampling: SamplingSpec) -> list[list[Completion]]:
        with open(self.marks, "a") as marks:
            marks.write("generating\n")
        return super().generate(prompts, n, sampling)
