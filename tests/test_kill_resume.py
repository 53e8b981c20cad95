"""A run SIGKILLed in the middle of an epoch resumes with ``--ckpt_path last`` and ends exactly where an
uninterrupted run ends: same final adapter (1e-6), every prompt trained on once, in the same order (design §2)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from reliability_doc import documented
from safetensors.torch import load_file
from support import load_checkpoint

TESTS = Path(__file__).resolve().parent
EPOCHS, PROMPTS_PER_EPOCH = 4, 4


def config(model_dir: Path, run_dir: Path, pause_marker: Path | None, **data: object) -> Path:
    """The run's YAML; ``data`` overrides the data settings (``test_async_rollouts`` draws ahead)."""
    callbacks = [{"class_path": "support.PromptLog", "init_args": {"path": str(run_dir / "prompts.jsonl")}}]
    if pause_marker is not None:  # pause at the 2nd minibatch of epoch 2, after that epoch's first update
        callbacks.append({"class_path": "support.PauseAt",
                          "init_args": {"marker": str(pause_marker), "epoch": 2, "batch_idx": 1}})
    settings = {
        "seed_everything": 0,
        # validation as the shipped configs have it (every 10 epochs: never in these 4): checkpoints must not wait
        # for it
        "trainer": {"max_epochs": EPOCHS, "check_val_every_n_epoch": 10, "enable_progress_bar": False,
                    "enable_model_summary": False, "callbacks": callbacks},
        # LoRA dropout draws from the global RNG in every training forward: the resumed run matches only if the
        # checkpoint restores that RNG (RngState)
        "model": {"model_name_or_path": str(model_dir), "lora": {"rank": 4, "dropout": 0.1}, "kl": {"coef": 0.04},
                  "optimizer": {"class_path": "torch.optim.AdamW", "init_args": {"lr": 0.01, "weight_decay": 0.0}}},
        "data": {"task": {"class_path": "support.DigitShareTask"}, "engine": {"class_path": "lit_grpo.engines.HFEngine"},
                 "group_size": 4, "prompts_per_epoch": PROMPTS_PER_EPOCH, "minibatch_size": 8, "max_new_tokens": 4,
                 **data},
    }
    path = run_dir / "config.yaml"
    path.write_text(yaml.safe_dump(settings))
    return path


def launch(run_dir: Path, config_path: Path, log_name: str, *extra: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    command = [sys.executable, "-m", "lit_grpo.cli", "fit", "--config", str(config_path), *extra]
    with open(run_dir / log_name, "w") as log:  # a file, not a pipe nobody reads while waiting on the other run
        process = subprocess.Popen(command, cwd=run_dir, env=env, stdout=log, stderr=subprocess.STDOUT)
    process.log_path = run_dir / log_name
    return process


def finish(process: subprocess.Popen) -> str:
    process.wait(timeout=300)
    output = process.log_path.read_text()
    assert process.returncode == 0, output[-3000:]
    return output


def kill_at_pause(process: subprocess.Popen, marker: Path) -> None:
    """SIGKILL ``process`` once it pauses at ``marker`` (``support.PauseAt``: epoch 2, after its first update)."""
    deadline = time.monotonic() + 300
    while not marker.exists():
        assert process.poll() is None, process.log_path.read_text()[-3000:]
        assert time.monotonic() < deadline, "the run never reached the pause point"
        time.sleep(0.1)
    assert marker.read_text() == "5\n"  # 2 updates per epoch: epochs 0-1 done, and one update of epoch 2
    os.kill(process.pid, signal.SIGKILL)
    process.wait(timeout=60)
    assert process.returncode == -signal.SIGKILL


def epochs_logged(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "prompts.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_sigkill_mid_epoch_then_resume_last_equals_an_uninterrupted_run(tiny_llama_dir, tmp_path):
    straight_dir, split_dir = tmp_path / "straight", tmp_path / "split"
    straight_dir.mkdir()
    split_dir.mkdir()
    marker = split_dir / "paused"
    processes = []
    try:
        straight = launch(straight_dir, config(tiny_llama_dir, straight_dir, None), "fit.log")
        killed = launch(split_dir, config(tiny_llama_dir, split_dir, marker), "killed.log")
        processes += [straight, killed]
        kill_at_pause(killed, marker)
        last = split_dir / "lightning_logs" / "version_0" / "checkpoints" / "last.ckpt"
        checkpoint = load_checkpoint(last)  # tensors, ints and plain containers only
        assert checkpoint["epoch"] == 1 and checkpoint["global_step"] == 4  # the last epoch boundary
        assert checkpoint["RolloutDataModule"]["cursor"] == 2 * PROMPTS_PER_EPOCH
        rng = checkpoint["callbacks"]["RngState"]
        assert isinstance(rng["torch"], torch.Tensor) and isinstance(rng["python"]["words"], torch.Tensor)

        # the resumed run gets a new logger version; `last` must still find version_0's checkpoint
        resumed = launch(split_dir, split_dir / "config.yaml", "resumed.log", "--ckpt_path", "last")
        processes.append(resumed)
        resumed_output = finish(resumed)
        assert f"Restoring states from the checkpoint path at {last}" in resumed_output
        finish(straight)

        got = assert_same_adapter(straight_dir, split_dir)
        assert any(not torch.equal(v, torch.zeros_like(v)) for v in got.values())

        straight_epochs, split_epochs = epochs_logged(straight_dir), epochs_logged(split_dir)
        assert [e["epoch"] for e in split_epochs] == [0, 1, 2, 3]  # epoch 2 finished once, in the resumed run
        assert split_epochs == straight_epochs  # same prompts, same order
        trained = [prompt for epoch in split_epochs for prompt in epoch["prompts"]]
        assert len(trained) == len(set(trained)) == EPOCHS * PROMPTS_PER_EPOCH  # none skipped, none repeated
        documented("kill -9 in epoch 2 of 4, before any validation, then `--ckpt_path last`",
                   f"exit {killed.returncode} (killed); last.ckpt held epoch {checkpoint['epoch']} (step "
                   f"{checkpoint['global_step']}); the resumed run trained epochs {[e['epoch'] for e in split_epochs][2:]}"
                   f", each of its {len(trained)} prompts once in the uninterrupted run's order, and ended with that "
                   "run's adapter (every tensor within 1e-6)", "test_kill_resume.py")
    finally:  # a failed assertion must not leave a paused or running fit behind
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()


def assert_same_adapter(straight_dir: Path, split_dir: Path) -> dict[str, torch.Tensor]:
    """The split run's final adapter (its second version) equals the straight run's, every tensor within 1e-6."""
    expected = load_file(straight_dir / "lightning_logs" / "version_0" / "adapter" / "adapter_model.safetensors")
    got = load_file(split_dir / "lightning_logs" / "version_1" / "adapter" / "adapter_model.safetensors")
    assert got.keys() == expected.keys() and len(got) > 0
    for name, value in expected.items():
        torch.testing.assert_close(got[name], value, rtol=0, atol=1e-6)
    return got


def test_rng_state_round_trips_through_a_weights_only_checkpoint(tmp_path):
    import random

    import numpy as np
    from lit_grpo.callbacks import RngState

    random.seed(1), np.random.seed(2), torch.manual_seed(3)
    random.gauss(0, 1)  # leaves a cached Gaussian in Python's state
    torch.save({"rng": RngState().state_dict()}, tmp_path / "rng.ckpt")
    drawn = (random.random(), random.gauss(0, 1), np.random.rand(3).tolist(), torch.rand(3))
    random.seed(9), np.random.seed(9), torch.manual_seed(9)
    RngState().load_state_dict(torch.load(tmp_path / "rng.ckpt", weights_only=True)["rng"])
    again = (random.random(), random.gauss(0, 1), np.random.rand(3).tolist(), torch.rand(3))
    assert drawn[:3] == again[:3] and torch.equal(drawn[3], again[3])
