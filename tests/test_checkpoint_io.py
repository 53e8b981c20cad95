"""Checkpoints are written beside their target and renamed into place (issue 17 D3): nothing goes through the
system temp directory, a failed write keeps the previous checkpoint and leaves no partial file. The command writes
them in the background (issue 34): the file holds the state at save time, ``last.ckpt`` links to a whole file at
every moment, and a background error reaches the training thread."""

from __future__ import annotations

import os
import tempfile
import threading
import time
from collections import OrderedDict

import lightning.pytorch as pl
import pytest
import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
from lightning.pytorch.demos.boring_classes import BoringModel
from reliability_doc import documented

from lit_grpo.cli import LitGRPOCLI
from lit_grpo.run import checkpoint_io
from lit_grpo.run.checkpoint_file import load_checkpoint
from lit_grpo.run.checkpoint_io import (
    WRITE_DELAY_ENV,
    BackgroundCheckpointIO,
    BesideTargetCheckpointIO,
)
from lit_grpo.run.epoch_checkpoint import EpochCheckpoint


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
    assert type(cli.trainer.strategy.checkpoint_io) is BackgroundCheckpointIO
    assert [(type(c), c.save_last) for c in cli.trainer.callbacks if isinstance(c, pl.callbacks.ModelCheckpoint)] == [
        (EpochCheckpoint, "link")]


def test_a_background_save_returns_at_once_and_writes_the_state_at_save_time(tmp_path, monkeypatch):
    monkeypatch.setenv(WRITE_DELAY_ENV, "0.5")  # the write sleeps before its rename
    weight, moment = torch.arange(4.0), torch.zeros(4)
    state_dict = OrderedDict(weight=weight, tied=weight[1:3])
    state_dict._metadata = {"": {"version": 1}}  # what nn.Module.state_dict carries
    checkpoint = {"epoch": 3, "state_dict": state_dict,
                  "optimizer_states": [{"state": {0: {"exp_avg": moment}}, "param_groups": [{"lr": 0.1, "params": [0]}]}],
                  "callbacks": {"Seen": {"prompts": [1, 2]}}}
    target = tmp_path / "epoch=3.ckpt"
    writer = BackgroundCheckpointIO()
    started = time.monotonic()
    writer.save_checkpoint(checkpoint, target)
    assert time.monotonic() - started < 0.4 and not target.exists()
    # the next step updates everything in place, as an optimizer and the callbacks do
    weight.add_(100), moment.fill_(7)
    checkpoint["epoch"] = 4
    checkpoint["optimizer_states"][0]["param_groups"][0]["lr"] = 9.0
    checkpoint["callbacks"]["Seen"]["prompts"].append(3)
    writer.teardown()
    saved = load_checkpoint(target)
    assert saved["epoch"] == 3 and saved["callbacks"] == {"Seen": {"prompts": [1, 2]}}
    assert torch.equal(saved["state_dict"]["weight"], torch.arange(4.0))
    assert torch.equal(saved["state_dict"]["tied"], torch.tensor([1.0, 2.0]))
    # one storage for the tensor and its view, as a synchronous torch.save keeps them
    assert saved["state_dict"]["tied"].untyped_storage().data_ptr() == saved["state_dict"]["weight"].untyped_storage().data_ptr()
    assert saved["state_dict"]._metadata == {"": {"version": 1}}
    assert torch.equal(saved["optimizer_states"][0]["state"][0]["exp_avg"], torch.zeros(4))
    assert saved["optimizer_states"][0]["param_groups"][0]["lr"] == 0.1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["epoch=3.ckpt"]


def whole(path) -> bool:
    try:
        return isinstance(load_checkpoint(path), dict)
    except Exception:  # noqa: BLE001 - missing, dangling, partial
        return False


def test_last_names_a_whole_checkpoint_at_every_moment(tmp_path, monkeypatch):
    writer, last = BackgroundCheckpointIO(), tmp_path / "last.ckpt"
    writer.save_checkpoint({"epoch": 0, "w": torch.zeros(1000)}, tmp_path / "epoch=0.ckpt")
    writer.link_checkpoint(tmp_path / "epoch=0.ckpt", last)
    writer.wait()
    monkeypatch.setenv(WRITE_DELAY_ENV, "0.3")
    seen, done = [], threading.Event()

    def watch() -> None:
        while not done.is_set():
            seen.append(load_checkpoint(last)["epoch"] if whole(last) else None)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        for epoch in (1, 2):  # what EpochCheckpoint asks for at an epoch's end
            writer.save_checkpoint({"epoch": epoch, "w": torch.full((1000,), float(epoch))}, tmp_path / f"epoch={epoch}.ckpt")
            writer.link_checkpoint(tmp_path / f"epoch={epoch}.ckpt", last)
            writer.remove_checkpoint(tmp_path / f"epoch={epoch - 1}.ckpt")
        writer.teardown()
    finally:
        done.set()
        watcher.join()
    assert None not in seen and seen == sorted(seen) and seen[0] == 0  # never missing, dangling or partial
    assert os.readlink(last) == "epoch=2.ckpt"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["epoch=2.ckpt", "last.ckpt"]


def test_a_failed_background_write_is_raised_on_the_training_thread_and_never_linked(tmp_path, monkeypatch):
    writer, last = BackgroundCheckpointIO(), tmp_path / "last.ckpt"
    writer.save_checkpoint({"epoch": 0}, tmp_path / "epoch=0.ckpt")
    writer.link_checkpoint(tmp_path / "epoch=0.ckpt", last)
    writer.wait()

    def disk_full(descriptor):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(checkpoint_io.os, "fsync", disk_full)
    writer.save_checkpoint({"epoch": 1}, tmp_path / "epoch=1.ckpt")  # returns: the write fails in the background
    writer.link_checkpoint(tmp_path / "epoch=1.ckpt", last)
    writer.remove_checkpoint(tmp_path / "epoch=0.ckpt")
    with pytest.raises(OSError, match="No space left"):
        writer.save_checkpoint({"epoch": 2}, tmp_path / "epoch=2.ckpt")  # the next save raises it, writes nothing
    assert load_checkpoint(last) == {"epoch": 0} and os.readlink(last) == "epoch=0.ckpt"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["epoch=0.ckpt", "last.ckpt"]
    writer.teardown()  # raised once

    writer.save_checkpoint({"epoch": 3}, tmp_path / "epoch=3.ckpt")  # the run's last write fails: the end of fit raises
    with pytest.raises(OSError, match="No space left"):
        writer.teardown()


@pytest.mark.parametrize("writer", [BackgroundCheckpointIO, TorchCheckpointIO])
def test_the_callback_removes_an_epoch_file_only_after_last_links_past_it(tmp_path, monkeypatch, writer):
    events = []
    real_link, real_remove = checkpoint_io.link_atomically, TorchCheckpointIO.remove_checkpoint

    def link(target, path):
        events.append(("link", os.path.basename(target)))
        real_link(target, path)

    def remove(self, path):
        events.append(("remove", os.path.basename(path)))
        real_remove(self, path)

    monkeypatch.setattr(checkpoint_io, "link_atomically", link)
    monkeypatch.setattr("lit_grpo.run.epoch_checkpoint.link_atomically", link)
    monkeypatch.setattr(TorchCheckpointIO, "remove_checkpoint", remove)
    callback = EpochCheckpoint(dirpath=tmp_path / "ckpt", save_last="link", save_on_train_epoch_end=True)
    trainer = pl.Trainer(max_epochs=3, limit_train_batches=1, limit_val_batches=0, callbacks=[callback],
                         plugins=[writer()], logger=False, enable_progress_bar=False, enable_model_summary=False,
                         default_root_dir=tmp_path)
    trainer.fit(BoringModel())
    assert events == [("link", "epoch=0-step=1.ckpt"),
                      ("link", "epoch=1-step=2.ckpt"), ("remove", "epoch=0-step=1.ckpt"),
                      ("link", "epoch=2-step=3.ckpt"), ("remove", "epoch=1-step=2.ckpt")]
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["epoch=2-step=3.ckpt", "last.ckpt"]
    assert os.readlink(tmp_path / "ckpt" / "last.ckpt") == "epoch=2-step=3.ckpt"
    assert load_checkpoint(tmp_path / "ckpt" / "last.ckpt")["epoch"] == 2


def test_the_callback_keeps_the_state_key_of_checkpoints_written_by_model_checkpoint(tmp_path):
    # a run checkpointed by ModelCheckpoint (before EpochCheckpoint) restores its best/last paths on resume
    kwargs = {"dirpath": tmp_path, "save_last": True, "save_on_train_epoch_end": True, "every_n_epochs": 2}
    assert EpochCheckpoint(**kwargs).state_key == pl.callbacks.ModelCheckpoint(**kwargs).state_key
    assert EpochCheckpoint(**kwargs).state_key.startswith("ModelCheckpoint{")


@pytest.mark.parametrize("logged", [{}, {"epoch": torch.tensor(4.0), "step": torch.tensor(9.0)}])
def test_without_a_monitor_the_file_name_candidates_are_lightnings_without_the_deep_copy(logged):
    from types import SimpleNamespace

    metrics = {"train/loss": torch.tensor(0.25), **logged}
    trainer = SimpleNamespace(callback_metrics=metrics, current_epoch=2, global_step=7)
    ours = EpochCheckpoint()._monitor_candidates(trainer)
    lightnings = pl.callbacks.ModelCheckpoint._monitor_candidates(EpochCheckpoint(), trainer)
    assert {k: v.item() for k, v in ours.items()} == {k: v.item() for k, v in lightnings.items()} == {
        "train/loss": 0.25, "epoch": 4 if logged else 2, "step": 9 if logged else 7}
    assert ours["train/loss"] is metrics["train/loss"]  # not copied
    assert set(metrics) == {"train/loss", *logged}  # not changed
    assert EpochCheckpoint(filename="{epoch}-{train/loss:.2f}").format_checkpoint_name(ours) == (
        "epoch=4-train/loss=0.25.ckpt" if logged else "epoch=2-train/loss=0.25.ckpt")


@pytest.mark.parametrize("writer_class", [BesideTargetCheckpointIO, BackgroundCheckpointIO])
def test_a_small_pack_buffer_is_reused_once_written_and_a_large_one_not_kept(tmp_path, monkeypatch, writer_class):
    writer, weight = writer_class(), torch.arange(4.0)
    writer.save_checkpoint({"w": weight}, tmp_path / "a.ckpt")
    first = writer._spare.data_ptr()
    weight.add_(10)
    writer.save_checkpoint({"w": weight}, tmp_path / "b.ckpt")  # waits for a.ckpt's write, then packs into its bytes
    assert writer._spare.data_ptr() == first
    monkeypatch.setattr(checkpoint_io, "KEEP_PACK_BUFFER_BYTES", 15)  # the 16 bytes of four float32 are too many
    writer.save_checkpoint({"w": weight}, tmp_path / "c.ckpt")
    assert writer._spare is None
    getattr(writer, "teardown", lambda: None)()
    assert [load_checkpoint(tmp_path / f"{name}.ckpt")["w"].tolist() for name in "abc"] == [
        [0.0, 1.0, 2.0, 3.0], [10.0, 11.0, 12.0, 13.0], [10.0, 11.0, 12.0, 13.0]]
