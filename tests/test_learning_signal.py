"""A run that cannot learn says so (issue 42 §3): every group flat for several epochs gets one warning naming the
cause, and sampling so cold that no group can ever differ stops the run with one message."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from reliability_doc import documented
import torch

from lit_grpo.buffers.buffer import RolloutBuffer
from lit_grpo.cli import main
from lit_grpo.policy.learning_signal import EpochSignal, epoch_signal, flat_means_no_signal, no_signal_verdict

ROOT = Path(__file__).resolve().parents[1]
FLAT = EpochSignal(groups=2, flat_groups=2, identical_groups=0, completions=4, failed_completions=0)
ALIKE = EpochSignal(groups=2, flat_groups=2, identical_groups=2, completions=4, failed_completions=0)
FAILED = EpochSignal(groups=2, flat_groups=2, identical_groups=0, completions=4, failed_completions=4)
SPREAD = EpochSignal(groups=2, flat_groups=1, identical_groups=1, completions=4, failed_completions=0)


def test_the_verdict_waits_for_patience_epochs_all_flat():
    assert no_signal_verdict([FLAT, FLAT], 1.0) is None  # two epochs: not yet
    assert no_signal_verdict([FLAT, SPREAD, FLAT], 1.0) is None  # one group had a spread in the window
    assert no_signal_verdict([SPREAD, FLAT, FLAT, FLAT], 1.0).cause == "flat"  # only the last 3 count
    assert no_signal_verdict([FLAT, FLAT], 1.0, patience=2).cause == "flat"
    empty = EpochSignal(0, 0, 0, 0, 0)
    assert no_signal_verdict([empty] * 3, 1.0) is None  # nothing drawn is no evidence


def test_the_verdict_names_the_cause_and_stops_only_where_nothing_can_change_it():
    cold = no_signal_verdict([ALIKE] * 3, 1e-9)
    assert cold.stop and cold.cause == "cold"
    assert cold.message.startswith("every group's completions were one completion repeated for 3 epochs in a row at "
                                   "data.temperature 1e-09: ")
    assert cold.message.endswith("raise data.temperature (1.0 samples the policy as it is)")
    assert no_signal_verdict([ALIKE] * 3, 0.01).stop  # the bound is inclusive
    warm = no_signal_verdict([ALIKE] * 3, 0.7)
    assert not warm.stop and warm.cause == "identical" and "(data.temperature 0.7)" in warm.message
    failed = no_signal_verdict([FAILED] * 3, 1.0)
    assert not failed.stop and failed.cause == "reward-failed"
    assert failed.message.startswith("the reward failed on every completion for 3 epochs in a row")
    assert no_signal_verdict([FAILED, FAILED, FLAT], 1.0).cause == "flat"  # one epoch's rewards did not fail
    mixed = EpochSignal(groups=2, flat_groups=2, identical_groups=1, completions=4, failed_completions=0)
    assert no_signal_verdict([ALIKE, mixed, ALIKE], 1e-9).cause == "flat"  # one group differed: not the cold cause


def test_only_group_relative_advantages_make_a_flat_group_signal_free():
    assert flat_means_no_signal("grpo", "loss", 0.04) and flat_means_no_signal("rloo", "reward", 0.0)
    assert not flat_means_no_signal("raw", "loss", 0.0)  # A = r: a flat group still pushes
    assert not flat_means_no_signal("gae", "loss", 0.0)  # a value baseline's residual
    assert not flat_means_no_signal("grpo", "reward", 0.1)  # each sequence's own KL makes the rewards differ
    assert not flat_means_no_signal(None, None, None)  # a module of the user's: nothing is assumed


def test_epoch_signal_counts_flat_and_identical_groups_and_failures():
    # three groups of two: [same tokens, same reward], [other tokens, same reward], [same tokens, other rewards]
    ids = torch.tensor([[1, 5, 6], [1, 5, 6], [1, 5, 7], [1, 5, 6], [2, 8, 0], [2, 8, 0]])
    mask = torch.tensor([[0, 1, 1]] * 4 + [[0, 1, 0]] * 2, dtype=torch.bool)
    buffer = RolloutBuffer(input_ids=ids, attention_mask=torch.ones_like(mask), completion_mask=mask,
                           rewards=torch.tensor([0.5, 0.5, 1.0, 1.0, 0.0, 1.0]), correct=torch.zeros(6, dtype=torch.bool),
                           truncated=torch.zeros(6, dtype=torch.bool), group_size=2, temperature=1.0, max_new_tokens=2,
                           reward_errors=1)
    assert epoch_signal(buffer) == EpochSignal(groups=3, flat_groups=2, identical_groups=2, completions=6,
                                               failed_completions=1)


def prompts_file(tmp_path: Path) -> Path:
    path = tmp_path / "p.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"{i}+1=", "answer": str(i + 1)}) + "\n" for i in range(20)))
    return path


def command(tmp_path: Path, *extra: str) -> list[str]:
    return ["fit", "--model.model_name_or_path", str(ROOT / "data" / "tiny-llama"), "--trainer.logger", "false",
            "--trainer.default_root_dir", str(tmp_path), "--trainer.enable_progress_bar", "false",
            "--data.prompts_per_epoch", "2", "--data.group_size", "2", "--data.minibatch_size", "4",
            "--data.max_new_tokens", "3", "--data.task", "lit_grpo.tasks.JsonlTask", "--data.task.path",
            str(prompts_file(tmp_path)), *extra]


@pytest.mark.slow  # a fit of three epochs
def test_sampling_too_cold_to_differ_stops_the_run_with_one_message(tmp_path, capsys):
    with pytest.raises(SystemExit) as info:
        main(command(tmp_path, "--data.temperature", "1e-9", "--trainer.max_epochs", "5"))
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert ("lit-grpo: every group's completions were one completion repeated for 3 epochs in a row at "
            "data.temperature 1e-09: sampling this cold draws the most likely completion every time") in err
    assert "Traceback" not in err
    last = torch.load(next(tmp_path.rglob("last.ckpt")), weights_only=True)
    assert last["epoch"] == 1  # stopped before training the third epoch's rollouts; epoch 1's checkpoint kept
    line = next(line for line in err.splitlines() if line.startswith("lit-grpo: every group"))
    documented("`data.temperature: 1e-9` (0 is refused)", f"exit 2 before training a third flat epoch, no traceback, "
               f"epoch 1's last.ckpt kept: {line}", "test_learning_signal.py")


@pytest.mark.slow  # a fit of four epochs
def test_a_reward_failing_on_every_completion_is_said_once(tmp_path, recwarn):
    main(command(tmp_path, "--data.task.reward", "tests.helpers_rewards.InterruptingReward", "--trainer.max_epochs",
                 "4", "--trainer.enable_checkpointing", "false"))
    said = [str(w.message) for w in recwarn if "the reward failed on every completion" in str(w.message)]
    assert said == ["the reward failed on every completion for 3 epochs in a row (rollout/reward_errors; the "
                    "reward-error warnings name what it raised): every completion scores the task's failure_reward, "
                    "so the run trains on nothing; fix the reward"]
    documented("a reward failing on every completion, 4 epochs", f"exit 0; one warning, after the third epoch: {said[0]}",
               "test_learning_signal.py")
