"""``--ckpt_path last`` across runs: the newest ``last.ckpt`` of any earlier version of the run's log directory."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lightning.pytorch.callbacks import ModelCheckpoint


def find_last_checkpoint(trainer: Any) -> str | None:
    """The newest ``last*.ckpt`` under ``<save_dir>/<name>/*/checkpoints`` of the trainer's first logger.

    Lightning looks for ``last`` in the checkpoint directory of the run being started, and a resumed run gets a new
    logger version, hence a new, empty directory: it would warn and silently train from scratch. None when the
    user fixed the checkpoint directory (Lightning then finds the file itself) or nothing is found.
    """
    callbacks = [c for c in trainer.callbacks if isinstance(c, ModelCheckpoint)]
    if not callbacks or any(c.dirpath is not None for c in callbacks) or not trainer.loggers:
        return None
    logger = trainer.loggers[0]
    save_dir = getattr(logger, "save_dir", None)
    if save_dir is None:
        return None
    found = list((Path(save_dir) / (logger.name or "")).glob("*/checkpoints/last*.ckpt"))
    return str(max(found, key=lambda path: path.stat().st_mtime)) if found else None
