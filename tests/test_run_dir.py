"""Where a run writes (issue 17 D2, D3): never into the current directory, never into another run's version, only
where it can write (checked before the model loads), and a Ctrl-C keeps the adapter and says how to resume."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from lit_grpo.cli import LitGRPOCLI, main
from lit_grpo.cli.config_check import config_problems
from support import weight_reads
from reliability_doc import documented

TESTS = Path(__file__).resolve().parent
SMALL = ["--data.prompts_per_epoch", "2", "--data.group_size", "2", "--data.minibatch_size", "4",
         "--data.max_new_tokens", "3", "--trainer.enable_progress_bar", "false", "--trainer.limit_val_batches", "0"]


@pytest.mark.slow
def test_without_a_logger_the_run_gets_its_own_directory(tiny_llama_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    main(["fit", "--model.model_name_or_path", str(tiny_llama_dir), "--trainer.logger", "false",
          "--trainer.max_epochs", "1", *SMALL])
    assert [p.name for p in tmp_path.iterdir()] == ["lightning_logs"]  # nothing else in the current directory
    (run,) = (tmp_path / "lightning_logs").iterdir()
    assert run.name.startswith("run-")
    assert (run / "config.yaml").is_file() and (run / "adapter" / "adapter_model.safetensors").is_file()
    assert (run / "checkpoints" / "last.ckpt").is_file()
    # the saved config.yaml is what the resume command passes back (Lightning adds weights_only to it)
    assert config_problems(yaml.safe_load((run / "config.yaml").read_text())) == []
    assert f"lit-grpo: no logger; this run writes to lightning_logs/{run.name}" in capsys.readouterr().err
    documented("a run with `trainer.logger: false`", "config.yaml, adapter/ and checkpoints/ written under "
               "lightning_logs/run-<time>-<pid>; nothing else in the current directory", "test_run_dir.py")


@pytest.mark.parametrize("knob", ["--trainer.default_root_dir", "--checkpoint.dirpath"])
def test_a_directory_the_run_cannot_write_is_refused_before_the_model_loads(tiny_llama_dir, tmp_path, capsys, knob,
                                                                           monkeypatch):
    reads = weight_reads(monkeypatch)
    blocker = tmp_path / "a-file"
    blocker.write_text("")  # a directory below a file cannot exist (chmod would not stop root)
    with pytest.raises(SystemExit) as info:
        main(["fit", "--model.model_name_or_path", str(tiny_llama_dir), "--trainer.logger", "false",
              "--trainer.default_root_dir", str(tmp_path / "ok"), knob, str(blocker / "runs"), *SMALL])
    assert info.value.code == 2
    err = capsys.readouterr().err
    what = knob.removeprefix("--")
    assert f"lit-grpo: {what}: cannot write into {str(blocker / 'runs')!r} (Not a directory)" in err
    assert not reads and "Traceback" not in err
    documented(f"`{what}` below a file (not writable)", f"exit {info.value.code} before any weights load: "
               f"{err.strip().replace(str(tmp_path), '<tmp>')}", "test_run_dir.py")


def test_two_runs_in_one_directory_get_their_own_versions(tiny_llama_dir, tmp_path):
    args = ["--model.model_name_or_path", str(tiny_llama_dir), "--trainer.default_root_dir", str(tmp_path)]
    first, second = LitGRPOCLI(args=args, run=False), LitGRPOCLI(args=args, run=False)  # neither has logged yet
    assert (first.trainer.logger.version, second.trainer.logger.version) == (0, 1)
    assert sorted(p.name for p in (tmp_path / "lightning_logs").iterdir()) == ["version_0", "version_1"]
    documented("two runs started together in one log directory", "each claimed its own version directory "
               f"(versions {first.trainer.logger.version} and {second.trainer.logger.version}) before training",
               "test_run_dir.py")


@pytest.mark.parametrize("kind", ["TensorBoardLogger", "CSVLogger"])
def test_the_private_logger_members_claim_version_relies_on_are_still_there(kind, tmp_path):
    # run_dir.claim_version sets a built logger's version through ``_version`` (None until first asked) and
    # ``_get_next_version()`` (Lightning has no public setter); an upgrade that renames either fails here, not by
    # two runs quietly sharing a version directory
    from lightning.pytorch import loggers

    logger = getattr(loggers, kind)(save_dir=tmp_path)
    (tmp_path / "lightning_logs" / "version_0").mkdir(parents=True)
    assert logger._version is None
    assert logger._get_next_version() == 1
    logger._version = 7
    assert logger.version == 7 and Path(logger.log_dir).name == "version_7"


@pytest.mark.slow
def test_ctrl_c_keeps_the_adapter_and_prints_the_resume_command(tiny_llama_dir, tmp_path):
    marker = tmp_path / "paused"
    pause = f'{{"class_path": "support.PauseAt", "init_args": {{"marker": "{marker}", "epoch": 1, "batch_idx": 0}}}}'
    # faulthandler: a run that hangs after Ctrl-C is aborted below and prints where each thread stood
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]),
           "PYTHONFAULTHANDLER": "1"}
    command = [sys.executable, "-m", "lit_grpo.cli", "fit", "--model.model_name_or_path", str(tiny_llama_dir),
               "--trainer.max_epochs", "3", "--trainer.default_root_dir", str(tmp_path), "--trainer.callbacks+",
               pause, *SMALL]
    run = subprocess.Popen(command, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 300
        while not marker.exists():
            assert run.poll() is None and time.monotonic() < deadline, "the run never reached the pause point"
            time.sleep(0.1)
        run.send_signal(signal.SIGINT)
        try:
            _, err = run.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            run.send_signal(signal.SIGABRT)
            pytest.fail("the run did not exit within 120 s of Ctrl-C; where it stood:\n"
                        + run.communicate(timeout=60)[1][-6000:])
    finally:
        if run.poll() is None:
            run.kill()
    version = tmp_path / "lightning_logs" / "version_0"
    assert run.returncode == 1, err[-3000:]
    assert (version / "adapter-interrupted" / "adapter_model.safetensors").is_file()
    assert (f"lit-grpo: interrupted; the adapter as it was is in {version / 'adapter-interrupted'}; resume from the "
            f"last epoch's checkpoint with: lit-grpo fit --config {version / 'config.yaml'} --ckpt_path "
            f"{version / 'checkpoints' / 'last.ckpt'}") in err
    documented("Ctrl-C (SIGINT) in epoch 1", f"exit {run.returncode}; the adapter as it was saved in "
               "adapter-interrupted/; the resume command printed with the last epoch's checkpoint", "test_run_dir.py")
