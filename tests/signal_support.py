"""Test-only: a callback that holds one DDP rank in epoch 1 while the others go on into the epoch's first update, where
they wait for it inside a collective (the state of a rank still generating while the others are done)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import lightning.pytorch as pl


class HoldRank(pl.Callback):
    """At the first batch of epoch ``epoch``, rank ``rank`` writes ``marker`` and sleeps."""

    def __init__(self, marker: str, rank: int, epoch: int = 1) -> None:
        self.marker, self.rank, self.epoch = marker, rank, epoch

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: Any, batch: Any, batch_idx: int) -> None:
        if (trainer.current_epoch, batch_idx, trainer.global_rank) == (self.epoch, 0, self.rank):
            Path(self.marker).write_text(f"{trainer.global_rank}\n")
            time.sleep(600)
