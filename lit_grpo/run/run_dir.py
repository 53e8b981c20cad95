"""Where a run writes, settled before any weights load: a run directory of its own (never the current directory,
never another run's version), writable, and a Ctrl-C that keeps the adapter."""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import ModelCheckpoint

from lit_grpo.errors import InputError

NO_LOGGER_ROOT = "lightning_logs"


def default_run_dir() -> str:
    """A fresh directory for a run without a logger (which would otherwise write into the current directory)."""
    return str(Path(NO_LOGGER_ROOT) / f"run-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}")


def writable_problem(directory: str | Path, what: str) -> str | None:
    """Why a run could not write into ``directory`` (created if missing), or None; probed with a real file."""
    path = Path(directory).expanduser()
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".lit-grpo-probe-"):
            pass
    except OSError as error:
        return f"{what}: cannot write into {str(path)!r} ({error.strerror or error}); choose a writable directory"
    return None


def run_directories(trainer: pl.Trainer) -> list[tuple[str, str]]:
    """``(directory, what sets it)`` for everything the run will write into."""
    found = [(trainer.default_root_dir, "trainer.default_root_dir")]
    found += [(logger.save_dir, "trainer.logger save_dir") for logger in trainer.loggers
              if getattr(logger, "save_dir", None)]
    found += [(c.dirpath, "checkpoint.dirpath") for c in trainer.callbacks
              if isinstance(c, ModelCheckpoint) and c.dirpath is not None]
    return found


def check_writable(trainer: pl.Trainer) -> None:
    problems = [p for directory, what in run_directories(trainer) if (p := writable_problem(directory, what))]
    if problems:
        raise InputError("; ".join(problems))


def claim_version(trainer: pl.Trainer) -> None:
    """Give each versioned logger (TensorBoard, CSV) of rank 0 the next free ``version_N`` by creating it:
    ``mkdir`` is atomic, so two runs started together in one directory cannot both pick the same version."""
    if trainer.global_rank != 0:
        return
    for logger in trainer.loggers:
        if getattr(logger, "_version", "set") is not None or not hasattr(logger, "_get_next_version"):
            continue
        root = Path(logger.root_dir)
        root.mkdir(parents=True, exist_ok=True)
        version = logger._get_next_version()
        while True:
            try:
                (root / f"version_{version}").mkdir()
                break
            except FileExistsError:
                version += 1
        logger._version = version


class SaveOnInterrupt(pl.Callback):
    """On Ctrl-C, save the adapter as it is (``adapter-interrupted`` in the run directory) and print how to resume
    from the last epoch's checkpoint."""

    def on_exception(self, trainer: pl.Trainer, pl_module: Any, exception: BaseException) -> None:
        if not isinstance(exception, KeyboardInterrupt) or pl_module.policy is None:
            return
        run_dir = Path(trainer.log_dir or trainer.default_root_dir)
        pl_module.save_adapter(run_dir / "adapter-interrupted")
        if trainer.global_rank != 0:
            return
        last = getattr(trainer.checkpoint_callback, "last_model_path", "")
        resume = (f"resume from the last epoch's checkpoint with: lit-grpo fit --config {run_dir / 'config.yaml'} "
                  f"--ckpt_path {last}" if last else "no epoch had ended, so there is no checkpoint to resume")
        print(f"lit-grpo: interrupted; the adapter as it was is in {run_dir / 'adapter-interrupted'}; {resume}",
              file=sys.stderr, flush=True)
