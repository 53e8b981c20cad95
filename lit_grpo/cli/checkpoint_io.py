"""Lightning checkpoint files written beside their target and renamed into place, in the background.

Every checkpoint is what ``Trainer.save_checkpoint`` builds, saved with ``torch.save``: ``torch.load(path,
weights_only=True)`` gives Lightning's dict (``state_dict``, ``optimizer_states``, ``epoch``, ``global_step``,
``loops``, ``callbacks``, ``pytorch-lightning_version``, ...), and ``Trainer.fit(ckpt_path=path)`` resumes it.

``BesideTargetCheckpointIO`` is ``TorchCheckpointIO`` with one change for local paths: Lightning's writes go through
an fsspec transaction whose temporary file lives in the system temp directory (a kill during the write left a
partial file there, outside the run, and the rename across file systems is a copy). Here the bytes go to
``.<name>.partial-<pid>`` in the checkpoint's own directory, are flushed to disk and then replace the target in one
``os.replace``: the target is the old checkpoint or the new one, never a part; a failed write removes its partial
file, and a killed one leaves it beside the checkpoints, where it is seen. Remote paths are Lightning's.

``BackgroundCheckpointIO`` (the command's) is Lightning's ``AsyncCheckpointIO`` around it: the checkpoint's tensors
are cloned on the training thread (the state at that moment, whatever the next step updates in place) and pickled,
written and renamed on a worker thread. Added: each save, load and removal first waits for the write in flight (at
most one clone of the state is held; a load never reads a file being replaced), and a failed write is raised at
the next of them, and at teardown (the end of ``fit``), as ``AsyncCheckpointIO`` does.

Test-only: ``LIT_GRPO_TEST_CHECKPOINT_WRITE_DELAY=<seconds>`` sleeps after a checkpoint's bytes are written and
before its rename, so that a test can kill a run while its partial file is beside the target.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

import torch
from fsspec.implementations.local import LocalFileSystem
from lightning.fabric.plugins import CheckpointIO
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
from lightning.fabric.utilities.cloud_io import get_filesystem
from lightning.fabric.utilities.types import _PATH
from lightning.pytorch.plugins.io import AsyncCheckpointIO

WRITE_DELAY_ENV = "LIT_GRPO_TEST_CHECKPOINT_WRITE_DELAY"


def partial_path(target: Path) -> Path:
    """Where the bytes of ``target`` are written before they replace it."""
    return target.with_name(f".{target.name}.partial-{os.getpid()}")


def is_local(path: _PATH) -> bool:
    return isinstance(get_filesystem(path), LocalFileSystem)


def fsync_directory(directory: Path) -> None:
    """Make a rename in ``directory`` durable (where the platform can open a directory)."""
    try:
        handle = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(handle)
    except OSError:
        pass
    finally:
        os.close(handle)


def write_beside(target: Path, write: Callable[[BinaryIO], Any]) -> None:
    """``write`` the bytes of ``target`` into its partial file, fsync them and rename them into place."""
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = partial_path(target)
    try:
        with open(partial, "wb") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        delay = float(os.environ.get(WRITE_DELAY_ENV) or 0)
        if delay > 0:
            time.sleep(delay)
        os.replace(partial, target)
        fsync_directory(target.parent)
    finally:
        partial.unlink(missing_ok=True)


class BesideTargetCheckpointIO(TorchCheckpointIO):
    """``TorchCheckpointIO`` whose local writes are atomic in the checkpoint's own directory (remote paths
    unchanged)."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path: _PATH, storage_options: Any | None = None) -> None:
        if storage_options is not None or not is_local(path):
            return super().save_checkpoint(checkpoint, path, storage_options)
        write_beside(Path(path), lambda handle: torch.save(checkpoint, handle))
        return None


class BackgroundCheckpointIO(AsyncCheckpointIO):
    """Lightning's ``AsyncCheckpointIO`` over ``BesideTargetCheckpointIO`` (by default) that waits for the write in
    flight before the next save, a load or a removal (module docstring)."""

    def __init__(self, checkpoint_io: CheckpointIO | None = None) -> None:
        super().__init__(checkpoint_io if checkpoint_io is not None else BesideTargetCheckpointIO())

    def save_checkpoint(self, checkpoint: dict[str, Any], path: _PATH, storage_options: Any | None = None) -> None:
        self.wait()
        if storage_options is None and is_local(path):  # the folder exists once this returns, as after a save in
            # the foreground: Lightning links last.ckpt to the file just queued (ModelCheckpoint(save_last="link"))
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        super().save_checkpoint(checkpoint, path, storage_options)

    def load_checkpoint(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        self.wait()
        return super().load_checkpoint(*args, **kwargs)

    def remove_checkpoint(self, *args: Any, **kwargs: Any) -> None:
        self.wait()
        super().remove_checkpoint(*args, **kwargs)

    def wait(self) -> None:
        """Block until the write in flight is done; raise a write's error. ``teardown`` joins the worker (the next
        save starts another) and raises what a write raised."""
        self.teardown()
