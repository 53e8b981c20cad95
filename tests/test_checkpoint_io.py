"""Checkpoints are written beside their target and renamed into place (issue 17 D3): nothing goes through the
system temp directory, a failed write keeps the previous checkpoint and leaves no partial file."""

from __future__ import annotations

import os
import tempfile

import pytest
import torch

from lit_grpo.run import checkpoint_io
from lit_grpo.run.checkpoint_io import BesideTargetCheckpointIO
from lit_grpo.cli import LitGRPOCLI
from reliability_doc import documented


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
    assert torch.equal(torch.load(target, weights_only=True)["w"], torch.tensor([0.0, 1.0, 2.0, 3.0]))
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
    assert torch.load(target, weights_only=True) == {"epoch": 1}
    assert [p.name for p in tmp_path.iterdir() if p.name != "system-temp"] == ["last.ckpt"]
    assert list(empty_system_temp.iterdir()) == []
    documented("a checkpoint write that fails half-way (disk full)", "the error raised; the previous last.ckpt "
               "intact; no partial file beside it or in the system temp directory (a kill -9 mid-write leaves "
               "`.last.ckpt.partial-<pid>` beside it, never a torn last.ckpt)", "test_checkpoint_io.py")


def test_the_command_saves_through_it(tiny_llama_dir, tmp_path):
    cli = LitGRPOCLI(args=["--model.model_name_or_path", str(tiny_llama_dir), "--trainer.default_root_dir",
                           str(tmp_path)], run=False)
    assert type(cli.trainer.strategy.checkpoint_io) is BesideTargetCheckpointIO
