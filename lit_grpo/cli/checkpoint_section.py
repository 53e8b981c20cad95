"""The command's ``checkpoint:`` section and its files: the one ``last.ckpt`` by default, what the section's files
become when the user asks for more, and the file ``--ckpt_path last`` names."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lightning.pytorch.callbacks import ModelCheckpoint

from lit_grpo.errors import InputError

# The command's checkpoint callback (section ``checkpoint:``): Lightning's ModelCheckpoint writing one file,
# last.ckpt, at every epoch's end, validated or not (the shipped configs validate every 10 epochs, and a kill before
# the first validation lost the run), replaced in one rename by the checkpoint IO. It is the top-k file rather than
# save_last because Lightning 2.6 writes save_last at an epoch's end only after a top-k save at that step (with
# save_top_k 0, only at the end of fit), and save_top_k 1 with save_last would write every epoch's state twice.
CHECKPOINT_DEFAULTS: dict[str, Any] = {
    "checkpoint.filename": ModelCheckpoint.CHECKPOINT_NAME_LAST,
    "checkpoint.save_top_k": 1,
    "checkpoint.save_on_train_epoch_end": True,
}


def settle_checkpoint_files(checkpoint: Any) -> str | None:
    """The ``checkpoint:`` section's files when the user asks for more than the command's one ``last.ckpt`` (its
    ``filename`` left at ``last``): ``save_top_k: -1`` keeps every epoch's checkpoint under Lightning's own name
    (``epoch=N-step=M.ckpt``) with ``last.ckpt`` a link to the newest (nothing written twice); a top k by a monitored
    metric is named the same, with ``last.ckpt`` written beside whenever one of them is (Lightning's ``save_last``;
    a link would name the best, not the newest). Returns the line that tells the user, None when nothing changed
    (``checkpoint`` is changed in place)."""
    keep = checkpoint.save_top_k
    if checkpoint.filename != ModelCheckpoint.CHECKPOINT_NAME_LAST or keep == 0:
        return None  # the user's own names, or no top-k file at all
    if keep == 1 and checkpoint.monitor is None:
        return None  # the command's one file; Lightning itself refuses k > 1 without a monitor
    checkpoint.filename = None
    if checkpoint.save_last is None:
        checkpoint.save_last = "link" if keep == -1 and checkpoint.monitor is None else True
    kept = "every epoch's checkpoint" if keep == -1 else f"the best {keep} checkpoint(s) by {checkpoint.monitor}"
    last = {"link": "a link to the newest", True: "written beside whenever one of them is"}.get(
        checkpoint.save_last, "not written (checkpoint.save_last: false)")
    return (f"checkpoint: keeping {kept} as epoch=N-step=M.ckpt (Lightning's name; set checkpoint.filename for "
            f"another); last.ckpt is {last}")


def fixed_dir_last(trainer: Any) -> str:
    """The newest ``last*.ckpt`` when a fixed checkpoint directory holds a ``last.ckpt`` (the file Lightning would
    pick for ``last``, named so that ``check_resume`` sees it); else an error: ``--ckpt_path last`` with nothing to
    resume must not quietly train from scratch."""
    dirs = [c.dirpath for c in trainer.callbacks if isinstance(c, ModelCheckpoint) and c.dirpath is not None]
    if not dirs and not trainer.loggers:  # Lightning's own default without a logger
        dirs = [str(Path(trainer.default_root_dir) / "checkpoints")]
    if any((Path(d) / "last.ckpt").is_file() for d in dirs):
        return str(max((p for d in dirs for p in Path(d).glob("last*.ckpt")), key=lambda p: p.stat().st_mtime))
    where = ", ".join(map(str, dirs)) or "the run's log directory (<save_dir>/<name>/version_*/checkpoints)"
    raise InputError(f"ckpt_path: 'last' found no last.ckpt in {where}; start without --ckpt_path, or pass a "
                     "checkpoint file")
