"""What a checkpoint may decide when a run resumes from it: weights and loop state, never the configuration.

A crafted checkpoint cannot switch remote code on (issue 17 S1); a knob that changes the trainable shapes is
refused by name, any other difference is reported and this run's value is used (D4); ``--ckpt_path last`` with
nothing to resume, or a file that is no checkpoint, is an error naming it (D1, clear errors).
"""

from __future__ import annotations

import os
import shutil
import time
import zipfile
from pathlib import Path

import pytest
import torch
from reliability_doc import documented
from support import load_checkpoint, remote_code_copy

from lit_grpo.cli import main


def fit_args(model: Path, root: Path, epochs: int, *extra: str) -> list[str]:
    return ["fit", "--model.model_name_or_path", str(model), "--trainer.logger", "false",
            "--trainer.max_epochs", str(epochs), "--trainer.default_root_dir", str(root),
            "--trainer.enable_progress_bar", "false", "--trainer.limit_val_batches", "0",
            "--data.prompts_per_epoch", "2", "--data.group_size", "2", "--data.minibatch_size", "4",
            "--data.max_new_tokens", "3", *extra]


@pytest.fixture(scope="module")
def trained(tiny_llama_dir, tmp_path_factory) -> Path:
    """The checkpoint of one epoch of a small run (rank 16, kl.coef 0.04)."""
    root = tmp_path_factory.mktemp("first-run")
    main(fit_args(tiny_llama_dir, root, 1))
    checkpoint = root / "checkpoints" / "last.ckpt"
    assert checkpoint.is_file()
    return checkpoint




@pytest.mark.slow
@pytest.mark.parametrize("command_line", [[], ["--model.trust_remote_code", "false"]])
def test_a_checkpoint_cannot_switch_remote_code_on(tiny_llama_dir, trained, tmp_path, capsys, command_line):
    marker = tmp_path / "pwned.txt"
    evil = remote_code_copy(Path(tiny_llama_dir), tmp_path / "evil-model", marker)
    checkpoint = load_checkpoint(trained)
    checkpoint["hyper_parameters"].update(trust_remote_code=True, model_name_or_path=str(evil))
    torch.save(checkpoint, tmp_path / "crafted.ckpt")  # plain tensors and containers: weights-only safe
    main(fit_args(tiny_llama_dir, tmp_path, 2, "--ckpt_path", str(tmp_path / "crafted.ckpt"), *command_line))
    assert not marker.exists()
    err = capsys.readouterr().err
    assert "model.trust_remote_code: True in the checkpoint, False now (this run's value is used)" in err
    assert f"model.model_name_or_path: {str(evil)!r} in the checkpoint" in err
    if command_line:
        documented("a weights-only checkpoint saying `trust_remote_code: True` and naming a model with an "
                   "`auto_map`, resumed", "its code never ran (the marker file it writes never appeared), with or "
                   "without `--model.trust_remote_code false`; both differences reported, this run's values used",
                   "test_resume_policy.py")


@pytest.mark.slow
def test_a_changed_kl_coef_is_reported_and_this_runs_value_used(tiny_llama_dir, trained, tmp_path, capsys):
    shutil.copy(trained, tmp_path / "start.ckpt")
    main(fit_args(tiny_llama_dir, tmp_path, 2, "--ckpt_path", str(tmp_path / "start.ckpt"), "--model.kl.coef", "0.5"))
    err = capsys.readouterr().err
    assert "model.kl.coef: 0.04 in the checkpoint, 0.5 now (this run's value is used)" in err
    saved = load_checkpoint(tmp_path / "checkpoints" / "last.ckpt")
    assert saved["hyper_parameters"]["kl"]["coef"] == 0.5 and saved["epoch"] == 1
    documented("resume with another `kl.coef`", "trained on with the new value, saved in the next checkpoint; "
               "reported: " + next(line for line in err.splitlines() if "kl.coef" in line).strip().replace(
                   str(tmp_path), "<tmp>"),
               "test_resume_policy.py")


@pytest.mark.slow
def test_a_users_own_checkpoint_plugin_resumes_the_commands_checkpoint(tiny_llama_dir, trained, tmp_path):
    shutil.copy(trained, tmp_path / "start.ckpt")  # by the command's default writer
    main(fit_args(tiny_llama_dir, tmp_path, 2, "--ckpt_path", str(tmp_path / "start.ckpt"), "--trainer.plugins",
                  '{"class_path": "lightning.pytorch.plugins.io.AsyncCheckpointIO"}'))
    saved = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=True)  # written by the user's plugin
    assert (saved["epoch"], saved["global_step"]) == (1, 2)
    assert saved["RolloutDataModule"]["cursor"] == 4  # epoch 0's two prompts came from the command's checkpoint


@pytest.mark.parametrize("knob, value, old", [("lora.rank", "4", "16"), ("advantage_mode", "gae", "'grpo'")])
def test_a_shape_changing_knob_is_refused_by_name(tiny_llama_dir, trained, tmp_path, capsys, knob, value, old):
    shutil.copy(trained, tmp_path / "start.ckpt")
    with pytest.raises(SystemExit) as info:
        main(fit_args(tiny_llama_dir, tmp_path, 2, "--ckpt_path", str(tmp_path / "start.ckpt"), f"--model.{knob}",
                      value))
    assert info.value.code == 2
    err = capsys.readouterr().err
    shown = value if knob == "lora.rank" else repr(value)
    assert f"model.{knob}: the checkpoint was trained with {old}, this run asks for {shown}" in err
    assert "Traceback" not in err
    documented(f"resume with another `{knob}`", f"exit {info.value.code} before training: "
               + next(line for line in err.splitlines() if knob in line).strip().replace(str(tmp_path), "<tmp>"),
               "test_resume_policy.py")


def test_ckpt_path_last_with_nothing_to_resume_is_an_error(tiny_llama_dir, tmp_path, capsys):
    with pytest.raises(SystemExit) as info:
        main(fit_args(tiny_llama_dir, tmp_path, 1, "--ckpt_path", "last"))
    assert info.value.code == 2
    assert f"ckpt_path: 'last' found no last.ckpt in {tmp_path / 'checkpoints'}" in capsys.readouterr().err


@pytest.mark.parametrize("content", [b"", b"not a checkpoint at all", "truncated"])
def test_a_file_that_is_no_checkpoint_is_named(tiny_llama_dir, trained, tmp_path, capsys, content):
    bad = tmp_path / "bad.ckpt"
    bad.write_bytes(trained.read_bytes()[:2000] if content == "truncated" else content)
    with pytest.raises(SystemExit) as info:
        main(fit_args(tiny_llama_dir, tmp_path, 1, "--ckpt_path", str(bad)))
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert f"lit-grpo: ckpt_path: {str(bad)!r} is not a readable checkpoint" in err and "Traceback" not in err


def test_a_checkpoint_whose_tensor_has_fewer_bytes_than_its_shape_is_named(tiny_llama_dir, trained, tmp_path,
                                                                          capsys):
    damaged = tmp_path / "damaged.ckpt"
    with zipfile.ZipFile(trained) as source, zipfile.ZipFile(damaged, "w") as target:
        for entry in source.infolist():  # torch.save's zip archive: the pickle, then each storage's bytes
            data = source.read(entry)
            target.writestr(entry, data[:8] if entry.filename.endswith("/data/0") else data)
    with pytest.raises(SystemExit) as info:
        main(fit_args(tiny_llama_dir, tmp_path, 1, "--ckpt_path", str(damaged)))
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert f"lit-grpo: ckpt_path: {str(damaged)!r} is not a readable checkpoint (RuntimeError: " in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    documented("a checkpoint whose first tensor has 8 bytes where its shape needs more", f"exit {info.value.code}: "
               + err.strip().replace(str(tmp_path), "<tmp>"), "test_resume_policy.py")


def test_a_packed_checkpoint_of_an_earlier_lit_grpo_is_named(tiny_llama_dir, tmp_path, capsys):
    packed = tmp_path / "packed.ckpt"  # what lit-grpo wrote between issues 34 and 40
    torch.save({"lit_grpo_packed_checkpoint": 1, "tree": {}, "data": torch.zeros(8, dtype=torch.uint8)}, packed)
    with pytest.raises(SystemExit) as info:
        main(fit_args(tiny_llama_dir, tmp_path, 1, "--ckpt_path", str(packed)))
    assert info.value.code == 2
    assert "is in the packed format of lit-grpo before issue 40, which is no longer read" in capsys.readouterr().err


def test_a_truncated_last_checkpoint_names_the_readable_one_beside_it(tiny_llama_dir, trained, tmp_path, capsys):
    good, bad = tmp_path / "epoch=0-step=2.ckpt", tmp_path / "last.ckpt"
    good.write_bytes(trained.read_bytes())
    bad.write_bytes(trained.read_bytes()[:2000])  # newer than the good one
    (tmp_path / "junk.ckpt").write_bytes(b"")
    os.utime(tmp_path / "junk.ckpt", (time.time() + 5, time.time() + 5))  # the newest neighbour, unreadable
    with pytest.raises(SystemExit) as info:
        main(fit_args(tiny_llama_dir, tmp_path, 1, "--ckpt_path", str(bad)))
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert f"resume from {str(good)!r} (the newest readable checkpoint beside it)" in err
    documented("a truncated last.ckpt beside a good checkpoint", f"exit {info.value.code}: "
               + err.strip().replace(str(tmp_path), "<tmp>"), "test_resume_policy.py")
