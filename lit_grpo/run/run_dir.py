"""Where a run writes, settled before any weights load: a run directory of its own (never the current directory,
never another run's version), writable, an adapter directory never written over."""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

import lightning.pytorch as pl
from lightning.pytorch.callbacks import ModelCheckpoint

from lit_grpo.errors import InputError

NO_LOGGER_ROOT = "lightning_logs"


def default_run_dir() -> str:
    """A fresh directory for a run without a logger (which would otherwise write into the current directory)."""
    return str(Path(NO_LOGGER_ROOT) / f"run-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}")


def unused_directory(target: str | Path) -> Path:
    """``target`` if it does not exist yet, else the first of ``<target>-1``, ``<target>-2``, ... that does not;
    claimed by creating it (``mkdir`` is atomic), so a run never writes into a directory holding another run's files
    (or a user's), and two runs cannot pick the same name."""
    target = Path(target)
    candidate, number = target, 0
    while True:
        try:
            candidate.mkdir(parents=True)
            return candidate
        except FileExistsError:
            pass
        number += 1
        candidate = target.with_name(f"{target.name}-{number}")


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
    ``mkdir`` is atomic, so two runs started together in one directory cannot both pick the same version.

    Lightning offers no public way to set a built logger's version (only its constructor's ``version``, and the
    default logger is built by the trainer), so this uses the two private members its loggers read the version
    from: ``_version`` (None until first asked) and ``_get_next_version()``. ``tests/test_run_dir.py`` pins both for
    ``TensorBoardLogger`` and ``CSVLogger``; a logger without them keeps its own choice."""
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
