"""Checkpoints written beside their target and renamed into place, in the background.

Lightning's ``TorchCheckpointIO`` writes through an fsspec transaction whose temporary file lives in the system
temp directory: a kill during the write left a partial file there, outside the run, and the rename across file
systems is a copy. Here the bytes go to ``.<name>.partial-<pid>`` in the checkpoint's own directory, are flushed to
disk and then replace the target in one ``os.replace``: the target is the old checkpoint or the new one, never a
part; a failed write removes its partial file, and a killed one leaves it beside the checkpoints, where it is seen.

Local files are written packed (``checkpoint_file.pack``: the tensors in one byte buffer, read back by
``load_checkpoint`` here or ``checkpoint_file.load_checkpoint`` anywhere), remote paths by Lightning, unpacked.

``BackgroundCheckpointIO`` (the command's) takes the serialization and the write off the training thread:
``save_checkpoint`` packs the checkpoint (its containers rebuilt, each tensor storage copied once into the buffer: the
state at that moment, whatever the next step updates in place) and returns; one worker thread pickles it beside the
target, fsyncs and renames it into place, then does the links (``link_checkpoint``) and removals asked for after
it, in order, skipping the rest once one has failed (a failed write is never linked to). Each save first waits for
everything asked before it, so at most one write is in flight, and an error is raised on the training thread at the
next save, load or teardown (the end of ``fit``); the worker is also joined when the interpreter exits. Packing the
quickstart's checkpoint costs ~2.5 ms (a few microseconds per tensor and container, and the memory copy); pickling
the packed dict ~1.5 ms, on the worker.

Test-only: ``LIT_GRPO_TEST_CHECKPOINT_WRITE_DELAY=<seconds>`` sleeps after a checkpoint's bytes are written and
before its rename, so that a test can kill a run while its partial file is beside the target.
"""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, BinaryIO

import torch
from fsspec.implementations.local import LocalFileSystem
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
from lightning.fabric.utilities.cloud_io import get_filesystem
from lightning.fabric.utilities.types import _PATH

from lit_grpo.run.checkpoint_file import pack, unpack

WRITE_DELAY_ENV = "LIT_GRPO_TEST_CHECKPOINT_WRITE_DELAY"
KEEP_PACK_BUFFER_BYTES = 16 * 2**20  # the quickstart's checkpoint is 3.8 MB; a 0.5B model's adapter and Adam ~100 MB


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
    """``TorchCheckpointIO`` whose local writes are packed and atomic in the checkpoint's directory (remote paths
    unchanged)."""

    def __init__(self) -> None:
        super().__init__()
        self._spare: torch.Tensor | None = None  # the last pack's bytes, reused once written  # [bytes]

    def save_checkpoint(self, checkpoint: dict[str, Any], path: _PATH, storage_options: Any | None = None) -> None:
        if storage_options is not None or not is_local(path):
            return super().save_checkpoint(checkpoint, path, storage_options)
        packed = self.pack(checkpoint)
        write_beside(Path(path), lambda handle: torch.save(packed, handle))
        return None

    def pack(self, checkpoint: dict[str, Any]) -> dict[str, Any]:
        """``checkpoint_file.pack`` into the last pack's buffer when it is small and free (its write done: the
        caller's to ensure). Under the process's mmap threshold (run/host_memory.py) a new buffer is a fresh
        mapping whose page faults cost the quickstart's 3.8 MB ~1.5 ms a save; a large one is not kept, where held
        between saves it would add its size to every step's peak memory."""
        packed = pack(checkpoint, out=self._spare)
        self._spare = packed["data"] if packed["data"].numel() <= KEEP_PACK_BUFFER_BYTES else None
        return packed

    def load_checkpoint(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """A packed file or one written before packing, as the checkpoint it holds (checkpoint_file.py)."""
        return unpack(super().load_checkpoint(*args, **kwargs))


def reads_packed_files(writer: Any) -> None:
    """Make a user's checkpoint plugin read the packed files this program writes (``unpack`` after its own
    ``load_checkpoint``; a file it wrote itself passes unchanged), so that it can resume a run the default writer
    checkpointed."""
    load = writer.load_checkpoint
    writer.load_checkpoint = lambda *args, **kwargs: unpack(load(*args, **kwargs))


def link_atomically(target: _PATH, link: _PATH) -> None:
    """Make ``link`` a relative symlink to ``target`` in one ``os.replace`` of a link made beside it: ``link`` is
    the old one or the new one at every moment. Where symlinks are refused (Windows without the right), a copy
    renamed into place."""
    target, link = Path(target), Path(link)
    temporary = link.with_name(f".{link.name}.link-{os.getpid()}")
    temporary.unlink(missing_ok=True)
    try:
        os.symlink(os.path.relpath(target, link.parent), temporary)
    except OSError:
        if target.is_dir():
            raise
        shutil.copyfile(target, temporary)
        with open(temporary, "rb+") as handle:
            os.fsync(handle.fileno())
    if link.is_dir() and not link.is_symlink():  # a checkpoint directory (DeepSpeed) saved there before
        shutil.rmtree(link)
    try:
        os.replace(temporary, link)
    finally:
        temporary.unlink(missing_ok=True)
    fsync_directory(link.parent)


class BackgroundCheckpointIO(BesideTargetCheckpointIO):
    """``BesideTargetCheckpointIO`` whose writes, links and removals run in order on one worker thread (module
    docstring)."""

    def __init__(self) -> None:
        super().__init__()
        self._executor: ThreadPoolExecutor | None = None
        self._pending: list[Future] = []
        self._error: BaseException | None = None

    def save_checkpoint(self, checkpoint: dict[str, Any], path: _PATH, storage_options: Any | None = None) -> None:
        self.wait()  # the previous write (and its link and removals) is finished before the next begins
        if storage_options is not None or not is_local(path):
            return super().save_checkpoint(checkpoint, path, storage_options)
        packed = self.pack(checkpoint)  # the state now: the next step may update any of its tensors in place
        self._submit(write_beside, Path(path), lambda handle: torch.save(packed, handle))
        return None

    def link_checkpoint(self, target: _PATH, link: _PATH) -> None:
        """Point ``link`` at ``target`` once ``target`` is written."""
        self._submit(link_atomically, target, link)

    def remove_checkpoint(self, path: _PATH) -> None:
        self._submit(super().remove_checkpoint, path)

    def load_checkpoint(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        self.wait()
        return super().load_checkpoint(*args, **kwargs)

    def wait(self) -> None:
        """Block until every write, link and removal asked for is done; raise the first error among them."""
        for future in list(self._pending):  # kept until all are done: a wait cut short by a signal is resumed
            future.result()
        self._pending.clear()
        error, self._error = self._error, None
        if error is not None:
            raise error

    def teardown(self) -> None:
        try:
            self.wait()
        finally:
            if self._executor is not None:
                self._executor.shutdown(wait=True)  # also when the wait above was cut short
                self._executor = None
                atexit.unregister(self._report_at_exit)

    def _submit(self, work: Callable[..., None], *args: Any) -> None:
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="lit-grpo-checkpoint")
            atexit.register(self._report_at_exit)  # runs after the interpreter has joined the worker

        def run() -> None:
            if self._error is not None:
                return  # a failed write is neither linked to nor followed by the removal of its predecessor
            try:
                work(*args)
            except BaseException as error:  # noqa: BLE001 - raised on the training thread by wait()
                self._error = error

        self._pending.append(self._executor.submit(run))

    def _report_at_exit(self) -> None:
        if self._error is not None:  # the process ended without a teardown that would have raised it
            print(f"lit-grpo: a checkpoint write failed: {type(self._error).__name__}: {self._error}",
                  file=sys.stderr, flush=True)
