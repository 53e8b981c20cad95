"""Resuming: ``--ckpt_path last`` across runs (the newest ``last.ckpt`` of any earlier version of the run's log
directory), and what a checkpoint may and may not decide about the run it continues."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lightning.pytorch.callbacks import ModelCheckpoint

from lit_grpo.errors import InputError


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


# A checkpoint's trainable state fits only a run that builds the same trainable shapes: these knobs must match.
STATE_SHAPING = ("lora_rank", "lora_target_modules", "risk")


def load_checkpoint(path: str | Path) -> Any:
    """A checkpoint file read as tensors and plain containers only (memory-mapped: nothing is copied yet)."""
    import torch

    return torch.load(path, weights_only=True, map_location="cpu", mmap=True)


def readable_neighbour(path: str) -> Path | None:
    """The newest other ``.ckpt`` beside ``path`` that loads, to offer when ``path`` does not."""
    target = Path(path).resolve()
    others = sorted((p for p in target.parent.glob("*.ckpt") if p.resolve() != target),
                    key=lambda p: p.stat().st_mtime, reverse=True)
    for other in others:
        try:
            if isinstance(load_checkpoint(other), dict):
                return other
        except Exception:  # noqa: BLE001 - any unreadable neighbour is simply not offered
            continue
    return None


def checkpoint_hyperparameters(path: str) -> dict[str, Any]:
    """The module hyper-parameters a checkpoint recorded (read as tensors and plain containers only)."""
    import pickle

    try:
        checkpoint = load_checkpoint(path)
    except pickle.UnpicklingError:
        raise  # the CLI names what the weights-only loader refused
    except Exception as error:  # truncated, empty, not a checkpoint at all
        detail = str(error).splitlines()[0].split(". ")[0] if str(error) else "no detail"
        neighbour = readable_neighbour(path)
        instead = f"resume from {str(neighbour)!r} (the newest readable checkpoint beside it)" if neighbour else (
            "pass another file")
        raise InputError(f"ckpt_path: {path!r} is not a readable checkpoint ({type(error).__name__}: {detail}); "
                         f"{instead}, or start without --ckpt_path") from None
    if not isinstance(checkpoint, dict) or "state_dict" not in checkpoint:
        raise InputError(f"ckpt_path: {path!r} is not a Lightning checkpoint (no state_dict); pass a .ckpt this "
                         "program wrote")
    saved = checkpoint.get("hyper_parameters") or {}
    return dict(saved) if isinstance(saved, dict) else {}


def resume_differences(saved: dict[str, Any], current: dict[str, Any]) -> tuple[list[str], list[str]]:
    """``(refusals, notes)`` for resuming a checkpoint written with hyper-parameters ``saved`` under this run's
    ``current`` ones. Shape-changing knobs (``STATE_SHAPING``, and turning the GAE value head on or off) are
    refused; every other difference is noted, and this run's value is used: a checkpoint restores weights and loop
    state, never the configuration (nor a switch such as ``trust_remote_code``)."""
    refusals, notes = [], []
    for knob in sorted(set(saved) & set(current)):
        old, new = saved[knob], current[knob]
        if old == new:
            continue
        value_head = knob == "advantage_mode" and (old == "gae") != (new == "gae")
        if knob in STATE_SHAPING or value_head:
            refusals.append(f"model.{knob}: the checkpoint was trained with {old!r}, this run asks for {new!r}")
        else:
            notes.append(f"model.{knob}: {old!r} in the checkpoint, {new!r} now (this run's value is used)")
    return refusals, notes


def check_resume(path: str, current: dict[str, Any]) -> list[str]:
    """Raise ``InputError`` when the checkpoint at ``path`` cannot continue under ``current`` hyper-parameters;
    otherwise the notes on what differs."""
    refusals, notes = resume_differences(checkpoint_hyperparameters(path), current)
    if refusals:
        raise InputError(f"cannot resume {path!r}: " + "; ".join(refusals) + ". Resume with the checkpoint's "
                         "values, or start a new run (model.init_adapter can start from a saved adapter)")
    return notes
