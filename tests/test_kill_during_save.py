"""A run SIGKILLed while a checkpoint is being written in the background (issue 34): ``last.ckpt`` is still the
previous epoch's, whole, and ``--ckpt_path last`` resumes from it to the uninterrupted run's adapter.

The write is made slow with the test-only ``LIT_GRPO_TEST_CHECKPOINT_WRITE_DELAY`` (seconds slept between writing a
checkpoint's bytes to ``.<name>.partial-<pid>`` and renaming it into place, ``lit_grpo/cli/checkpoint_io.py``); the
test kills the run once epoch 1's partial file is beside the checkpoints."""

from __future__ import annotations

import os
import signal
import time

import pytest
from reliability_doc import documented
from support import load_checkpoint
from test_kill_resume import (
    EPOCHS,
    assert_same_adapter,
    config,
    epochs_logged,
    finish,
    launch,
)

from lit_grpo.cli.checkpoint_io import WRITE_DELAY_ENV


@pytest.mark.slow
def test_sigkill_during_a_background_write_keeps_the_previous_checkpoint(tiny_llama_dir, tmp_path, monkeypatch):
    straight_dir, split_dir = tmp_path / "straight", tmp_path / "split"
    straight_dir.mkdir()
    split_dir.mkdir()
    checkpoints = split_dir / "lightning_logs" / "version_0" / "checkpoints"
    processes = []
    try:
        straight = launch(straight_dir, config(tiny_llama_dir, straight_dir, None), "fit.log")
        processes.append(straight)
        monkeypatch.setenv(WRITE_DELAY_ENV, "3")  # the killed run only
        killed = launch(split_dir, config(tiny_llama_dir, split_dir, None), "killed.log")
        monkeypatch.delenv(WRITE_DELAY_ENV)
        processes.append(killed)
        deadline, last = time.monotonic() + 300, checkpoints / "last.ckpt"
        # epoch 1's partial file: one seen once epoch 0's is renamed into place (one write in flight at a time)
        while not (last.exists() and (partial := sorted(checkpoints.glob(".last.ckpt.partial-*")))):
            assert killed.poll() is None, killed.log_path.read_text()[-3000:]
            assert time.monotonic() < deadline, "epoch 1's checkpoint was never written"
            time.sleep(0.02)
        os.kill(killed.pid, signal.SIGKILL)
        killed.wait(timeout=60)
        assert killed.returncode == -signal.SIGKILL

        checkpoint = load_checkpoint(last)  # whole: epoch 0's, never replaced by the file being written
        assert checkpoint["epoch"] == 0 and checkpoint["global_step"] == 2
        left = sorted(p.name for p in checkpoints.iterdir())
        assert left == [partial[0].name, "last.ckpt"]

        resumed = launch(split_dir, split_dir / "config.yaml", "resumed.log", "--ckpt_path", "last")
        processes.append(resumed)
        assert f"Restoring states from the checkpoint path at {last}" in finish(resumed)
        finish(straight)
        assert_same_adapter(straight_dir, split_dir)
        resumed_epochs = epochs_logged(split_dir)[-(EPOCHS - 1):]
        assert [e["epoch"] for e in resumed_epochs] == list(range(1, EPOCHS))
        assert resumed_epochs == epochs_logged(straight_dir)[1:]  # same prompts, same order
        version_1 = split_dir / "lightning_logs" / "version_1" / "checkpoints"
        assert sorted(p.name for p in version_1.iterdir()) == ["last.ckpt"]
        assert load_checkpoint(version_1 / "last.ckpt")["global_step"] == 2 * EPOCHS
        documented("kill -9 while epoch 1's checkpoint is written in the background, then `--ckpt_path last`",
                   f"exit {killed.returncode} (killed) with `{partial[0].name.rsplit('-', 1)[0]}-<pid>` beside the "
                   f"checkpoints; last.ckpt still the whole checkpoint of epoch "
                   f"{checkpoint['epoch']} (step {checkpoint['global_step']}, loaded weights-only); the resumed run "
                   f"trained epochs {[e['epoch'] for e in resumed_epochs]} and ended with the uninterrupted run's "
                   "adapter (every tensor within 1e-6)", "test_kill_during_save.py")
    finally:  # a failed assertion must not leave a run behind
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
