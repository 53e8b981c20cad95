"""Checkpoints written beside their target and renamed into place.

Lightning's ``TorchCheckpointIO`` writes through an fsspec transaction whose temporary file lives in the system
temp directory: a kill during the write left a partial file there, outside the run, and the rename across file
systems is a copy. Here the bytes go to ``.<name>.partial-<pid>`` in the checkpoint's own directory, are flushed to
disk and then replace the target in one ``os.replace``: the target is the old checkpoint or the new one, never a
part; a failed write removes its partial file, and a killed one leaves it beside the checkpoints, where it is seen.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from fsspec.implementations.local import LocalFileSystem
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
from lightning.fabric.utilities.cloud_io import get_filesystem
from lightning.fabric.utilities.types import _PATH


def partial_path(target: Path) -> Path:
    """Where the bytes of ``target`` are written before they replace it."""
    return target.with_name(f".{target.name}.partial-{os.getpid()}")


class BesideTargetCheckpointIO(TorchCheckpointIO):
    """``TorchCheckpointIO`` whose local writes are atomic in the checkpoint's directory (remote paths unchanged)."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path: _PATH, storage_options: Any | None = None) -> None:
        if storage_options is not None or not isinstance(get_filesystem(path), LocalFileSystem):
            return super().save_checkpoint(checkpoint, path, storage_options)
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = partial_path(target)
        try:
            with open(partial, "wb") as handle:
                torch.save(checkpoint, handle)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(partial, target)
        finally:
            partial.unlink(missing_ok=True)
        return None
