"""The command's checkpoint callback: one file per epoch, ``last.ckpt`` a link to it.

``ModelCheckpoint(save_last="link")`` writes ``epoch=N-step=M.ckpt`` and makes ``last.ckpt`` a symlink to it, but it
removes the previous epoch's file before the link moves off it, removes the old link before making the new one (a
kill in between leaves no ``last.ckpt``, or one naming nothing), and links at once, while ``BackgroundCheckpointIO``
may still be writing the file. Here the link is replaced in one rename, through the background writer when there is
one (after the file it names is whole), and the file it named is removed after that. Where links cannot be used (a
remote ``dirpath``) ``last.ckpt`` is written as a copy, as with ``save_last: true``.
"""

from __future__ import annotations

import os
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from lit_grpo.run.checkpoint_io import BackgroundCheckpointIO, is_local, link_atomically


class EpochCheckpoint(ModelCheckpoint):
    """``ModelCheckpoint`` whose ``save_last="link"`` is atomic, waits for the background write it names, and
    removes a superseded checkpoint only once ``last.ckpt`` no longer names it."""

    @property
    def state_key(self) -> str:
        # ModelCheckpoint's key: the state of a checkpoint written before this class existed is restored into it
        return super().state_key.replace(type(self).__qualname__, ModelCheckpoint.__qualname__, 1)

    def setup(self, trainer: pl.Trainer, pl_module: Any, stage: str) -> None:
        link = self.save_last == "link"
        if link:
            self.save_last = True  # Lightning refuses a link into a remote directory: decide once it is known
        super().setup(trainer, pl_module, stage)
        if link:
            self.save_last = "link" if is_local(self.dirpath or "") else True

    def _monitor_candidates(self, trainer: pl.Trainer) -> dict[str, Any]:
        if self.monitor is not None:
            return super()._monitor_candidates(trainer)
        # without a monitor no metric value is kept, only formatted into a file name: Lightning's deep copy of every
        # logged tensor (~1 ms a save) is not needed; its epoch and step as Lightning sets them
        candidates = dict(trainer.callback_metrics)
        for key, value in (("epoch", trainer.current_epoch), ("step", trainer.global_step)):
            logged = candidates.get(key)
            candidates[key] = logged.int() if isinstance(logged, torch.Tensor) else torch.tensor(value)
        return candidates

    def _link_checkpoint(self, trainer: pl.Trainer, filepath: str, linkpath: str) -> None:  # type: ignore[override]
        if trainer.is_global_zero and os.path.abspath(filepath) != os.path.abspath(linkpath):
            writer = trainer.strategy.checkpoint_io
            if isinstance(writer, BackgroundCheckpointIO):
                writer.link_checkpoint(filepath, linkpath)
            else:
                link_atomically(filepath, linkpath)
        trainer.strategy.barrier()

    def _remove_checkpoint(self, trainer: pl.Trainer, filepath: str) -> None:
        if self.save_last == "link":  # the top-k file last.ckpt may still name: after the link has moved
            vars(self).setdefault("_superseded", []).append(filepath)
        else:
            super()._remove_checkpoint(trainer, filepath)

    def _save_last_checkpoint(self, trainer: pl.Trainer, monitor_candidates: dict[str, Any]) -> None:
        super()._save_last_checkpoint(trainer, monitor_candidates)
        superseded = vars(self).pop("_superseded", [])
        for path in superseded:
            super()._remove_checkpoint(trainer, path)
