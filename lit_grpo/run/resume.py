"""Resuming: ``--ckpt_path last`` across runs (the newest ``last.ckpt`` of any earlier version of the run's log
directory), and what a checkpoint may and may not decide about the run it continues."""

from __future__ import annotations

import zipfile
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from lit_grpo.errors import InputError
from lit_grpo.run.objective_knobs import dotted


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
    found = [newest_whole(path) for path in (Path(save_dir) / (logger.name or "")).glob("*/checkpoints/last*.ckpt")]
    found = [path for path in found if path is not None]
    return str(max(found, key=lambda path: path.stat().st_mtime)) if found else None


def newest_whole(last: Path) -> Path | None:
    """``last`` where it names a file; where it is a link to a file not yet written (``save_last: link``, the run
    killed while the background write was in flight), the newest other checkpoint beside it, each written whole."""
    if last.exists():
        return last
    beside = [path for path in last.parent.glob("*.ckpt") if path.is_file() and not path.is_symlink()]
    return max(beside, key=lambda path: path.stat().st_mtime) if beside else None


def resume_point(trainer: Any) -> str:
    """The checkpoint a stopped run resumes from: this run's newest (the command's one file is ModelCheckpoint's
    top-k file, ``best_model_path``; a ``save_last`` file is ``last_model_path``), else the one it resumed from
    (a resumed run that stops before its first epoch ends); "" when there is none."""
    callback = trainer.checkpoint_callback
    return (getattr(callback, "last_model_path", "") or getattr(callback, "best_model_path", "")
            or trainer.ckpt_path or "")


# A checkpoint's trainable state fits only a run that builds the same trainable shapes: these knobs must match.
STATE_SHAPING = ("lora.rank", "lora.target_modules", "risk")


def load_checkpoint_file(path: str | Path) -> Any:
    """What the checkpoint file at ``path`` holds, unpickled weights-only (tensors and plain containers, nothing that
    runs code), read as Lightning will read it. Not memory-mapped: ``mmap=True`` does not compare a storage's record
    with the bytes its pickle claims (a truncated record maps the bytes after it), which a read refuses; a
    checkpoint holds the trained weights and their optimizer state only, and the resume reads it next anyway."""
    if not zipfile.is_zipfile(path):  # torch.save's archive; else torch would unpickle the bytes as its legacy format
        raise ValueError("not the zip archive torch.save writes: empty, truncated or another kind of file")
    return torch.load(path, map_location="cpu", weights_only=True)


def readable_neighbour(path: str) -> Path | None:
    """The newest other ``.ckpt`` beside ``path`` that loads, to offer when ``path`` does not."""
    target = Path(path).resolve()
    others = sorted((p for p in target.parent.glob("*.ckpt") if p.resolve() != target),
                    key=lambda p: p.stat().st_mtime, reverse=True)
    for other in others:
        try:
            if isinstance(load_checkpoint_file(other), dict):
                return other
        except Exception:  # noqa: BLE001 - any unreadable neighbour is simply not offered
            continue
    return None


# The key of the packed files lit-grpo wrote between issues 34 and 40 (tensors in one byte buffer), no longer read.
PACKED_MARKER = "lit_grpo_packed_checkpoint"


def read_checkpoint(path: str) -> dict[str, Any]:
    """What the Lightning checkpoint at ``path`` holds (tensors and plain containers only), or an ``InputError``
    naming what it is instead."""
    import pickle

    try:
        checkpoint = load_checkpoint_file(path)
    except pickle.UnpicklingError:
        raise  # the CLI names what the weights-only loader refused
    except Exception as error:  # truncated, empty, a tensor beyond its storage, not a checkpoint at all
        detail = str(error).splitlines()[0].split(". ")[0] if str(error) else "no detail"
        neighbour = readable_neighbour(path)
        instead = f"resume from {str(neighbour)!r} (the newest readable checkpoint beside it)" if neighbour else (
            "pass another file")
        raise InputError(f"ckpt_path: {path!r} is not a readable checkpoint ({type(error).__name__}: {detail}); "
                         f"{instead}, or start without --ckpt_path") from None
    if isinstance(checkpoint, dict) and PACKED_MARKER in checkpoint:
        raise InputError(f"ckpt_path: {path!r} is in the packed format of lit-grpo before issue 40, which is no "
                         "longer read; resume it with that version, or start a new run (model.init_adapter can "
                         "start it from the run's saved adapter/)")
    if not isinstance(checkpoint, dict) or "state_dict" not in checkpoint:
        raise InputError(f"ckpt_path: {path!r} is not a Lightning checkpoint (no state_dict); pass a .ckpt this "
                         "program wrote")
    return checkpoint


def resume_differences(saved: dict[str, Any], current: dict[str, Any]) -> tuple[list[str], list[str]]:
    """``(refusals, notes)`` for resuming a checkpoint written with hyper-parameters ``saved`` under this run's
    ``current`` ones, each compared one knob at a time (``objective_knobs.dotted``: a group's fields apart, a
    checkpoint's flat names before the groups under their new ones). Shape-changing knobs (``STATE_SHAPING``, and
    turning the GAE value head on or off) are refused; every other difference is noted, and this run's value is
    used: a checkpoint restores weights and loop state, never the configuration (nor a switch such as
    ``trust_remote_code``)."""
    refusals, notes = [], []
    saved, current = dotted(saved), dotted(current)
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


def check_resume(path: str, current: dict[str, Any], task: dict[str, Any] | None = None,
                 data_state_key: str = "RolloutDataModule") -> list[str]:
    """Raise ``InputError`` when the checkpoint at ``path`` cannot continue under ``current`` hyper-parameters (a
    shape-changing knob; an adapter of another base model) or, given the ``task`` record of a run that trains on
    (``RolloutDataModule.task_identity()``), under that task (the checkpoint's prompt cursor, saved under
    ``data_state_key``, indexes another task's prompts); otherwise the notes on what differs. Without a ``task``
    (``lit-grpo validate`` / ``test``: the checkpoint is evaluated, not trained on) a checkpoint of another base
    model is refused by its name too (``evaluated_model_problem``). Nothing here loads the model's weights."""
    checkpoint = read_checkpoint(path)
    saved = checkpoint.get("hyper_parameters")
    saved = dict(saved) if isinstance(saved, dict) else {}
    refusals, notes = resume_differences(saved, current)
    if refusals:
        raise InputError(f"cannot resume {path!r}: " + "; ".join(refusals) + ". Resume with the checkpoint's "
                         "values, or start a new run (model.init_adapter can start from a saved adapter)")
    evaluating = task is None
    other_base = (evaluating and evaluated_model_problem(path, saved.get("model_name_or_path"),
                                                         current.get("model_name_or_path"))) or checkpoint_misfit(
        path, checkpoint.get("state_dict"), saved.get("model_name_or_path"), current, evaluating)
    if other_base:
        raise InputError(other_base)
    if task is not None:
        notes += task_notes(path, checkpoint.get(data_state_key), task)
    return notes


# --- another base model: the checkpoint's adapter tensors against this run's model --------------------------------
def same_model(saved: str, model: str) -> bool | None:
    """Whether a checkpoint's ``model_name_or_path`` (``saved``) and this run's (``model``) name one model: the same
    text, or the same directory here (``data/...`` resolved in the checkout, as the model loads); None where it
    cannot be told (the saved one is no directory here: a hub id, or a model moved or on another machine)."""
    from lit_grpo.run.model_files import resolve_model_path

    if saved == model:
        return True
    here, there = Path(resolve_model_path(saved)), Path(resolve_model_path(model))
    if not here.is_dir():
        return None
    return there.is_dir() and here.resolve() == there.resolve()


def evaluated_model_problem(path: Any, saved_model: Any, model: Any) -> str | None:
    """Before any weights load, for ``validate`` / ``test``: the message refusing a checkpoint whose
    hyper-parameters name another base model than this run's ``model.model_name_or_path`` (``same_model`` False:
    both found here, in two places), or None (the same model, or it cannot be told: the shapes then decide)."""
    if not isinstance(saved_model, str) or not isinstance(model, str) or same_model(saved_model, model) is not False:
        return None
    return (f"cannot evaluate {str(path)!r}: it was trained on {saved_model!r} (its hyper_parameters' "
            f"model_name_or_path), this run loads model.model_name_or_path {model!r}, another model: evaluate it "
            f"with --model.model_name_or_path {saved_model}, or pass a checkpoint trained on {model!r}")


def checkpoint_misfit(path: str, state: Any, saved_model: Any, current: dict[str, Any],
                      evaluating: bool = False) -> str | None:
    """Before any weights load: the message refusing a checkpoint whose adapter tensors do not fit the LoRA shapes
    of this run's model (from its config.json, on the meta device), or None (they fit, or it cannot be told; the
    module's ``on_load_checkpoint`` then compares them with the loaded model's)."""
    current = dotted(current)  # the module's arguments one knob each: lora.rank, lora.target_modules
    if not isinstance(state, dict) or not {"model_name_or_path", "lora.rank", "lora.target_modules"} <= set(current):
        return None
    from peft import LoraConfig

    from lit_grpo.run.model_files import expected_adapter_shapes, resolve_model_path

    try:  # the adapter the run builds: init_adapter's own config (a rank_pattern, say), else the configured LoRA
        config = (LoraConfig.from_pretrained(str(Path(current["init_adapter"]).expanduser()))
                  if current.get("init_adapter") else
                  LoraConfig(r=current["lora.rank"], target_modules=current["lora.target_modules"],
                             task_type="CAUSAL_LM"))
    except Exception:  # noqa: BLE001 - an unreadable init_adapter is named by the configuration check
        return None
    expected = expected_adapter_shapes(resolve_model_path(current["model_name_or_path"]), config,
                                       bool(current.get("trust_remote_code")))
    if not expected or not expected[0]:  # cannot be told, or this run's targets are not in its model (refused later)
        return None
    return checkpoint_misfit_message(path, state, {f"policy.{name}": shape for name, shape in expected[0].items()},
                                     saved_model, current["model_name_or_path"], evaluating)


def checkpoint_misfit_message(path: Any, state: dict[str, Any], expected: dict[str, tuple[int, ...]],
                              saved_model: Any, model: str, evaluating: bool = False) -> str | None:
    """Whether a checkpoint's ``state`` fits the trainable tensors a model ``expected`` (``policy.*`` names compared:
    the adapter; the heads are the hyper-parameters' to refuse): the message naming the checkpoint, the model it
    was trained on and this run's, or None; worded for a resume, or for ``validate`` / ``test`` (``evaluating``)."""
    from lit_grpo.run.model_files import misfit

    found = {name: tuple(t.shape) for name, t in state.items() if name.startswith("policy.") and hasattr(t, "shape")}
    detail = misfit(found, {name: s for name, s in expected.items() if name.startswith("policy.")}, "the checkpoint")
    if detail is None:
        return None
    if evaluating:
        trained = f"it was trained on {saved_model!r} and " if saved_model is not None else ""
        instead = f"evaluate it with --model.model_name_or_path {saved_model}" if saved_model is not None else (
            "evaluate it on the model it was trained on")
        return (f"cannot evaluate {str(path)!r}: {trained}its adapter does not fit this run's "
                f"model.model_name_or_path {model!r}: {detail}. {instead[0].upper()}{instead[1:]}, or pass a "
                f"checkpoint trained on {model!r}")
    if saved_model is not None and saved_model != model:
        return (f"cannot resume {str(path)!r}: it was trained on {saved_model!r} and its adapter does not fit this "
                f"run's model.model_name_or_path {model!r}: {detail}. Resume with --model.model_name_or_path "
                f"{saved_model}, or start a new run on {model!r} without --ckpt_path")
    same = " of that name, since changed" if saved_model == model else ""
    return (f"cannot resume {str(path)!r}: its adapter does not fit this run's model.model_name_or_path {model!r} "
            f"(it was trained on another model{same}): {detail}. Resume on the model it was trained on, or start "
            f"a new run on {model!r} without --ckpt_path")


# --- the task: what the prompt cursor indexes (its record: rollout.cursor.task_record) --------------------------
def task_name(record: dict[str, Any]) -> str:
    """A task's record (``task_record``) in words."""
    data = f" from {record['data']!r}" if record.get("data") else ""
    return (f"{class_name(record.get('class'))} ({record.get('class')}{data}: "
            f"{record.get('train_prompts')} training prompts, the first {record.get('first_prompt')!r})")


def class_name(path: Any) -> str:
    """A recorded class path's last part: ``lit_grpo.tasks.arithmetic.ArithmeticTask`` -> ``ArithmeticTask``."""
    return str(path).rsplit(".", 1)[-1]


def task_notes(path: str, state: Any, current: dict[str, Any]) -> list[str]:
    """Refuse a checkpoint whose prompt cursor indexes another task's training split than this run's ``current``
    record (its class, size or first prompts differ); a checkpoint written before tasks were recorded is resumed
    with a note."""
    if not isinstance(state, dict) or "cursor" not in state:
        return []  # no cursor to continue
    saved = state.get("task")
    if not isinstance(saved, dict):
        return [(f"the checkpoint does not record its task (an older lit-grpo wrote it): its prompt cursor "
                 f"({int(state['cursor'])}) continues in this run's task, {task_name(current)}")]
    # the class by its name, not its module: a class that moved (the tasks' old paths, issue 60; a user's own
    # refactor) indexes the same prompts, which its size and the first prompts' hash pin
    if (class_name(saved.get("class")) == class_name(current["class"])
            and all(saved.get(key) == current[key] for key in ("train_prompts", "fingerprint"))):
        return []
    raise InputError(f"cannot resume {path!r}: its prompt cursor ({int(state['cursor'])}) counts the training "
                     f"prompts of {task_name(saved)}; this run's data.task is {task_name(current)}. Resume with the "
                     "checkpoint's task (data.task as the run was started with it), or start a new run without "
                     "--ckpt_path (model.init_adapter can start it from the run's saved adapter)")
