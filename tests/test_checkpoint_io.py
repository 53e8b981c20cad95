"""Checkpoints are written beside their target and renamed into place (issue 17 D3): nothing goes through the
system temp directory, a failed write keeps the previous checkpoint and leaves no partial file. The command writes
them in the background through Lightning's AsyncCheckpointIO (issues 34, 40): the file holds the state at save time,
``last.ckpt`` is a whole Lightning checkpoint at every moment, and a background error reaches the training thread."""

from __future__ import annotations

import os
import tempfile
import threading

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.demos.boring_classes import BoringModel
from lightning.pytorch.plugins.io import AsyncCheckpointIO
from reliability_doc import documented

from lit_grpo.cli import CHECKPOINT_DEFAULTS, LitGRPOCLI
from lit_grpo.cli import checkpoint_io
from lit_grpo.cli.checkpoint_io import (
    WRITE_DELAY_ENV,
    BackgroundCheckpointIO,
    BesideTargetCheckpointIO,
)


def load_checkpoint(path):
    return torch.load(path, weights_only=True)


@pytest.fixture
def empty_system_temp(tmp_path, monkeypatch):
    temp = tmp_path / "system-temp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    return temp


def test_a_checkpoint_is_renamed_into_place_from_its_own_directory(tmp_path, empty_system_temp, monkeypatch):
    target = tmp_path / "ckpts" / "last.ckpt"
    renames = []
    real_replace = os.replace
    monkeypatch.setattr(checkpoint_io.os, "replace", lambda a, b: (renames.append((a, b)), real_replace(a, b)))
    BesideTargetCheckpointIO().save_checkpoint({"epoch": 3, "w": torch.arange(4.0)}, target)
    assert renames == [(target.parent / f".last.ckpt.partial-{os.getpid()}", target)]
    assert torch.equal(load_checkpoint(target)["w"], torch.tensor([0.0, 1.0, 2.0, 3.0]))
    assert [p.name for p in target.parent.iterdir()] == ["last.ckpt"]
    assert list(empty_system_temp.iterdir()) == []


def test_a_failed_write_keeps_the_previous_checkpoint_and_no_partial_file(tmp_path, empty_system_temp, monkeypatch):
    target = tmp_path / "last.ckpt"
    BesideTargetCheckpointIO().save_checkpoint({"epoch": 1}, target)

    def half_written(obj, handle):
        handle.write(b"PK\x03\x04 half a checkpoint")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(checkpoint_io.torch, "save", half_written)
    with pytest.raises(OSError, match="No space left"):
        BesideTargetCheckpointIO().save_checkpoint({"epoch": 2}, target)
    assert load_checkpoint(target) == {"epoch": 1}
    assert [p.name for p in tmp_path.iterdir() if p.name != "system-temp"] == ["last.ckpt"]
    assert list(empty_system_temp.iterdir()) == []
    documented("a checkpoint write that fails half-way (disk full)", "the error raised; the previous last.ckpt "
               "intact; no partial file beside it or in the system temp directory (a kill -9 mid-write leaves "
               "`.<name>.partial-<pid>` beside it, never a torn checkpoint)", "test_checkpoint_io.py")


def test_the_command_saves_through_it(tiny_llama_dir, tmp_path):
    cli = LitGRPOCLI(args=["--model.model_name_or_path", str(tiny_llama_dir), "--trainer.default_root_dir",
                           str(tmp_path)], run=False)
    writer = cli.trainer.strategy.checkpoint_io
    assert isinstance(writer, AsyncCheckpointIO) and type(writer.checkpoint_io) is BesideTargetCheckpointIO
    callbacks = [c for c in cli.trainer.callbacks if isinstance(c, ModelCheckpoint)]
    assert [(type(c), c.filename, c.save_top_k, c.save_last) for c in callbacks] == [(ModelCheckpoint, "last", 1, None)]


def test_a_background_save_returns_before_its_write_and_writes_the_state_at_save_time(tmp_path, monkeypatch):
    monkeypatch.setenv(WRITE_DELAY_ENV, "1")  # the write sleeps before its rename, far longer than a return takes
    weight, moment = torch.arange(4.0), torch.zeros(4)
    checkpoint = {"epoch": 3, "state_dict": {"weight": weight},
                  "optimizer_states": [{"state": {0: {"exp_avg": moment}}, "param_groups": [{"lr": 0.1, "params": [0]}]}],
                  "callbacks": {"Seen": {"prompts": [1, 2]}}}
    target = tmp_path / "epoch=3.ckpt"
    writer = BackgroundCheckpointIO()
    writer.save_checkpoint(checkpoint, target)
    assert not target.exists()  # returned while the worker still sleeps before the rename
    # the next step updates the tensors in place, as an optimizer does
    weight.add_(100), moment.fill_(7)
    writer.teardown()
    saved = load_checkpoint(target)
    assert saved["epoch"] == 3 and saved["callbacks"] == {"Seen": {"prompts": [1, 2]}}
    assert torch.equal(saved["state_dict"]["weight"], torch.arange(4.0))
    assert torch.equal(saved["optimizer_states"][0]["state"][0]["exp_avg"], torch.zeros(4))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["epoch=3.ckpt"]


def whole(path) -> bool:
    try:
        return isinstance(load_checkpoint(path), dict)
    except Exception:  # noqa: BLE001 - missing, partial
        return False


def test_last_is_a_whole_checkpoint_at_every_moment(tmp_path, monkeypatch):
    writer, last = BackgroundCheckpointIO(), tmp_path / "last.ckpt"
    writer.save_checkpoint({"epoch": 0, "w": torch.zeros(1000)}, last)
    writer.wait()
    monkeypatch.setenv(WRITE_DELAY_ENV, "0.3")
    seen, done = [], threading.Event()

    def watch() -> None:
        while not done.is_set():
            seen.append(load_checkpoint(last)["epoch"] if whole(last) else None)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        for epoch in (1, 2):  # what the command's ModelCheckpoint asks for at an epoch's end
            writer.save_checkpoint({"epoch": epoch, "w": torch.full((1000,), float(epoch))}, last)
        writer.teardown()
    finally:
        done.set()
        watcher.join()
    seen.append(load_checkpoint(last)["epoch"] if whole(last) else None)  # the watcher's last look may predate the end
    assert None not in seen and seen == sorted(seen) and seen[0] == 0 and seen[-1] == 2  # never missing or partial
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt"]


def test_a_failed_background_write_is_raised_on_the_training_thread(tmp_path, monkeypatch):
    writer, last = BackgroundCheckpointIO(), tmp_path / "last.ckpt"
    writer.save_checkpoint({"epoch": 0}, last)
    writer.wait()

    returned = threading.Event()

    def disk_full(descriptor):
        returned.wait(timeout=60)  # fail once the save has returned, however the two threads are scheduled
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(checkpoint_io.os, "fsync", disk_full)
    writer.save_checkpoint({"epoch": 1}, last)  # returns: the write fails in the background
    returned.set()
    with pytest.raises(OSError, match="No space left"):
        writer.save_checkpoint({"epoch": 2}, last)  # the next save raises it, writes nothing
    assert load_checkpoint(last) == {"epoch": 0}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt"]
    with pytest.raises(OSError, match="No space left"):
        writer.teardown()  # and the end of fit, as Lightning's AsyncCheckpointIO does


def test_a_load_or_removal_waits_for_the_write_in_flight(tmp_path, monkeypatch):
    writer, target = BackgroundCheckpointIO(), tmp_path / "last.ckpt"
    monkeypatch.setenv(WRITE_DELAY_ENV, "0.3")
    writer.save_checkpoint({"epoch": 4}, target)
    assert writer.load_checkpoint(target) == {"epoch": 4}
    writer.save_checkpoint({"epoch": 5}, target)
    writer.remove_checkpoint(target)
    assert list(tmp_path.iterdir()) == []
    writer.teardown()


@pytest.mark.parametrize("writer", [BackgroundCheckpointIO, BesideTargetCheckpointIO])
def test_the_commands_callback_writes_one_lightning_file_every_epoch(tmp_path, writer):
    # Lightning's ModelCheckpoint as the command configures it (CHECKPOINT_DEFAULTS); under either writer
    arguments = {key.split(".", 1)[1]: value for key, value in CHECKPOINT_DEFAULTS.items()}
    saved: list[tuple[int, list[str]]] = []

    class Look(pl.Callback):
        def on_train_epoch_start(self, trainer, pl_module):
            trainer.strategy.barrier()
            if trainer.current_epoch:
                getattr(trainer.strategy.checkpoint_io, "wait", lambda: None)()
                saved.append((load_checkpoint(tmp_path / "ckpt" / "last.ckpt")["epoch"],
                              sorted(p.name for p in (tmp_path / "ckpt").iterdir())))

    callback = ModelCheckpoint(dirpath=tmp_path / "ckpt", **arguments)
    trainer = pl.Trainer(max_epochs=3, limit_train_batches=1, limit_val_batches=0, callbacks=[callback, Look()],
                         plugins=[writer()], logger=False, enable_progress_bar=False, enable_model_summary=False,
                         default_root_dir=tmp_path)
    trainer.fit(BoringModel())
    assert saved == [(0, ["last.ckpt"]), (1, ["last.ckpt"])]  # every epoch's end, before the next epoch
    checkpoint = load_checkpoint(tmp_path / "ckpt" / "last.ckpt")
    assert (checkpoint["epoch"], checkpoint["global_step"]) == (2, 3)
    assert callback.best_model_path == str(tmp_path / "ckpt" / "last.ckpt")
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["last.ckpt"]


def test_the_commands_callback_keeps_the_state_key_of_earlier_checkpoints(tmp_path):
    # the command's EpochCheckpoint (issue 34) wrote its state under ModelCheckpoint's key: a resume restores it
    arguments = {key.split(".", 1)[1]: value for key, value in CHECKPOINT_DEFAULTS.items()}
    assert ModelCheckpoint(dirpath=tmp_path, **arguments).state_key == (
        "ModelCheckpoint{'monitor': None, 'mode': 'min', 'every_n_train_steps': 0, 'every_n_epochs': 1, "
        "'train_time_interval': None}")
