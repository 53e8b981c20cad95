"""Trainer values that Lightning takes at construction but that crash after the first rollouts (a division by zero)
or silently corrupt training, and Lightning's own refusals at construction (a traceback before): each is refused by
the command before any weights load, with one message naming the value and exit code 2 (issue 34)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from reliability_doc import documented

from lit_grpo.cli.config_check import config_problems

# the command, with any read of model weights reported and refused: the evidence that a refusal came first
RUNNER = """
import sys
from lit_grpo.policy import model_loading

def read(*args, **kwargs):
    print("WEIGHTS READ", file=sys.stderr, flush=True)
    raise SystemExit(99)

model_loading.AutoModelForCausalLM.from_pretrained = staticmethod(read)
sys.argv = ["lit-grpo", *sys.argv[1:]]
from lit_grpo.cli import main
main()
"""

SMALL = ["--data.prompts_per_epoch", "2", "--data.group_size", "2", "--data.minibatch_size", "4",
         "--data.max_new_tokens", "3", "--trainer.max_epochs", "2", "--trainer.enable_progress_bar", "false"]

# Lightning takes these at construction: the first three end in a ZeroDivisionError after the first epoch's rollouts,
# a negative clipping bound reverses every gradient (torch scales them by bound / norm)
LATE = {"accumulate_grad_batches": ("0", "must be >= 1 (one optimizer step every N minibatches), got 0"),
        "check_val_every_n_epoch": ("0", "must be >= 1 (validate every N epochs), or null, got 0"),
        "val_check_interval": ("0", "must be > 0 (a fraction of an epoch, or a number of minibatches), got 0"),
        "gradient_clip_val": ("-1.0", ("must be >= 0 (0 or null: no clipping; a negative bound would reverse every "
                                       "gradient), got -1.0"))}
# refused by Lightning's Trainer itself before any work, but with a traceback and exit code 1 until now
AT_CONSTRUCTION = [
    ("max_steps", "-5", ("lit-grpo: trainer: `max_steps` must be a non-negative integer or -1 (infinite steps). "
                         "You passed in -5.")),
    ("limit_val_batches", "-1", ("lit-grpo: trainer: You have passed invalid value -1 for limit_val_batches, it has "
                                 "to be in [0.0, 1.0] or an int.")),
]


def command(model: Path, tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", RUNNER, "fit", "--model.model_name_or_path", str(model),
                           "--trainer.default_root_dir", str(tmp_path / "runs"), *SMALL, *args],
                          cwd=tmp_path, check=False, capture_output=True, text=True, timeout=900)


@pytest.mark.slow
def test_trainer_values_that_fail_after_the_first_rollouts_are_refused_first(tiny_llama_dir, tmp_path):
    result = command(tiny_llama_dir, tmp_path, *(a for knob, (value, _) in LATE.items()
                                                 for a in (f"--trainer.{knob}", value)))
    err = result.stderr
    assert result.returncode == 2, err[-3000:]
    assert f"lit-grpo: the configuration has {len(LATE)} problem(s):" in err
    assert "Traceback" not in err and "WEIGHTS READ" not in err
    for knob, (value, rule) in LATE.items():
        assert f"  - trainer.{knob}: {rule}" in err
        documented(f"`trainer.{knob}: {value}`", f"exit {result.returncode} before any weights load, with every "
                   f"other problem of the configuration: trainer.{knob}: {rule}", "test_trainer_values.py")


@pytest.mark.slow
@pytest.mark.parametrize("knob, value, message", AT_CONSTRUCTION, ids=[k for k, _, _ in AT_CONSTRUCTION])
def test_a_trainer_value_lightning_refuses_gets_one_message(knob, value, message, tiny_llama_dir, tmp_path):
    result = command(tiny_llama_dir, tmp_path, f"--trainer.{knob}", value)
    err = result.stderr
    assert result.returncode == 2, err[-3000:]
    assert message in err.splitlines() and "Traceback" not in err and "WEIGHTS READ" not in err
    documented(f"`trainer.{knob}: {value}`", f"exit {result.returncode} before any weights load: {message}",
               "test_trainer_values.py")


def test_the_check_refuses_each_late_failing_value_and_passes_sound_ones():
    assert config_problems({"trainer": {"accumulate_grad_batches": -1}}) == [
        "trainer.accumulate_grad_batches: must be >= 1 (one optimizer step every N minibatches), got -1"]
    assert config_problems({"trainer": {"val_check_interval": -0.5}}) == [
        "trainer.val_check_interval: must be > 0 (a fraction of an epoch, or a number of minibatches), got -0.5"]
    assert config_problems({"trainer": {"accumulate_grad_batches": 2, "check_val_every_n_epoch": None,
                                        "val_check_interval": 0.5, "gradient_clip_val": 0.0}}) == []
