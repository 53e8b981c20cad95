"""Faults a long run must survive: a reward that raises or hangs, a NaN loss; and the point where it must stop."""

from __future__ import annotations

import csv
import os
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger
from lit_grpo.callbacks import NonFiniteGuard, RolloutMetrics
from lit_grpo.run.nonfinite import NonFiniteTrainingError, agreed_skip, refuse_nonfinite
from reliability_doc import documented
from safetensors.torch import load_file
from support import FaultyDigitTask, load_checkpoint, PoisonAdvantages

from lit_grpo.engines import HFEngine
from lit_grpo.policy.module import PolicyModule
from lit_grpo.rollout.datamodule import RolloutDataModule
from lit_grpo.rollout.reward_worker import RewardWorker
from lit_grpo.tasks import ArithmeticTask


class Flaky(ArithmeticTask):
    """Rewards keyed by the completion text: "raise", "hang", "die" (the worker exits), else exact match."""

    def reward(self, prompt_record: Any, completion_text: str, completion_ids: Any) -> float:
        if completion_text == "raise":
            raise ValueError("bad reward")
        if completion_text == "hang":
            time.sleep(3600)
        if completion_text == "die":
            os._exit(3)
        return super().reward(prompt_record, completion_text, completion_ids)


RECORD = {"prompt": "1+2=", "answer": "3"}


def test_reward_worker_scores_raise_hang_and_death_as_failures():
    worker = RewardWorker(Flaky(), timeout=1.0)
    try:
        assert worker.score(RECORD, "3", [1]).reward == 1.0
        raised = worker.score(RECORD, "raise", [1])
        assert (raised.reward, raised.error) == (0.0, "ValueError: bad reward")
        hung = worker.score(RECORD, "hang", [1])
        assert (hung.reward, hung.correct, hung.error) == (0.0, False, "TimeoutError: the reward took longer than 1.0s per completion")
        assert worker.score(RECORD, "3", [1]).reward == 1.0  # a fresh worker took over
        died = worker.score(RECORD, "die", [1])
        assert (died.reward, died.error) == (0.0, "RuntimeError: the reward's worker process died (exit code 3)")
        assert worker.score(RECORD, "4", [1]).reward == 0.0 and worker.score(RECORD, "3", [1]).reward == 1.0
        process = worker.child.process
        process.terminate()  # the child must not inherit a handler that ignores SIGTERM (Lightning installs one)
        process.join(timeout=10)
        assert process.exitcode == -15
    finally:
        worker.close()
    assert worker.child.process is None


class AlwaysHangs(ArithmeticTask):
    def reward(self, prompt_record: Any, completion_text: str, completion_ids: Any) -> float:
        time.sleep(3600)
        return 0.0


def test_a_reward_call_the_worker_gives_up_on_keeps_the_completions_correctness():
    # accuracy is the task's own check, not the reward's: a hung reward must not turn a right answer into a wrong one
    worker = RewardWorker(AlwaysHangs(), timeout=0.5)
    try:
        right, wrong = worker.score(RECORD, "3", [1]), worker.score(RECORD, "4", [1])
    finally:
        worker.close()
    assert (right.reward, right.correct) == (0.0, True) and (wrong.reward, wrong.correct) == (0.0, False)
    assert right.error == "TimeoutError: the reward took longer than 0.5s per completion"


def test_no_timeout_scores_in_process():
    datamodule = RolloutDataModule(task=Flaky())
    assert datamodule.scorer is datamodule.task  # the default path is the plain call, no worker
    timed = RolloutDataModule(task=Flaky(), reward_timeout=1.5)
    assert isinstance(timed.scorer, RewardWorker) and timed.scorer.timeout == 1.5
    with pytest.raises(ValueError, match=r"reward_timeout: must be > 0 seconds or None, got 0"):
        RolloutDataModule(reward_timeout=0)


def test_skip_decision_is_agreed_across_ranks():
    calls = []

    def reduce_boolean_decision(decision: bool, all: bool = True) -> bool:  # noqa: A002 - Lightning's name
        calls.append((decision, all))
        return True  # another rank saw a NaN

    trainer = SimpleNamespace(strategy=SimpleNamespace(reduce_boolean_decision=reduce_boolean_decision))
    assert agreed_skip(trainer, False) is True  # this rank's finite step is skipped with the others
    assert calls == [(False, False)]  # reduced with "any", not "all"


class StepRecorder(pl.Callback):
    """The adapter before and after every optimizer step."""

    def __init__(self) -> None:
        self.before: list[dict[str, torch.Tensor]] = []
        self.after: list[dict[str, torch.Tensor]] = []

    @staticmethod
    def adapter(module: Any) -> dict[str, torch.Tensor]:
        return {n: p.detach().clone() for n, p in module.named_parameters() if p.requires_grad}

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: Any, batch: Any, batch_idx: int) -> None:
        self.before.append(self.adapter(pl_module))

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.after.append(self.adapter(pl_module))


def fit_with_faults(model_dir: Path, root: Path, poison_steps: list[int], epochs: int = 2) -> tuple[Any, ...]:
    pl.seed_everything(0)
    module = PolicyModule(model_name_or_path=str(model_dir), lora={"rank": 4}, kl={"coef": 0.04},
                          optimizer=lambda params: torch.optim.AdamW(params, lr=1e-2, weight_decay=0.0))
    task = FaultyDigitTask(calls_file=str(root / "calls.txt"), raise_on_call=3, hang_on_call=6)
    datamodule = RolloutDataModule(task=task, group_size=4, prompts_per_epoch=4, minibatch_size=8, max_new_tokens=4,
                                   reward_timeout=1.0)
    recorder = StepRecorder()
    trainer = pl.Trainer(
        max_epochs=epochs, reload_dataloaders_every_n_epochs=1, num_sanity_val_steps=0, limit_val_batches=0,
        callbacks=[PoisonAdvantages(poison_steps), recorder, RolloutMetrics(table_every_n_epochs=0), NonFiniteGuard()],
        default_root_dir=root, enable_checkpointing=False,
        logger=CSVLogger(root, name="logs"), enable_progress_bar=False, enable_model_summary=False,
        log_every_n_steps=1,
    )
    trainer.fit(module, datamodule)
    return module, trainer, recorder


def logged(trainer: pl.Trainer, key: str) -> list[float]:
    with open(Path(trainer.logger.log_dir) / "metrics.csv") as file:
        return [float(row[key]) for row in csv.DictReader(file) if row.get(key)]


@pytest.mark.slow
def test_a_nonfinite_weight_is_refused_by_name_among_mixed_dtypes():
    finite = [("a", torch.ones(3)), ("half", torch.tensor([2.0], dtype=torch.bfloat16)), ("step", torch.tensor([7]))]
    refuse_nonfinite(finite, "checkpoint")  # float32, bfloat16 and an integer tensor: nothing to refuse
    refuse_nonfinite([], "checkpoint")
    refuse_nonfinite([("large", torch.full((4,), 3e38))], "checkpoint")  # finite, though its sum overflows
    poisoned = [*finite, ("b", torch.tensor([1.0, float("nan")])), ("c", torch.tensor([float("-inf")], dtype=torch.bfloat16))]
    with pytest.raises(NonFiniteTrainingError, match=r"refusing to write the checkpoint: 2 tensors are not finite \(e\.g\. b\)"):
        refuse_nonfinite(poisoned, "checkpoint")


@pytest.mark.slow
def test_run_survives_a_raising_reward_a_hanging_reward_and_a_nan_loss(tiny_llama_dir, tmp_path):
    module, trainer, recorder = fit_with_faults(tiny_llama_dir, tmp_path, poison_steps=[1])
    # 2 epochs x 16 completions, 2 optimizer steps per epoch
    assert len((tmp_path / "calls.txt").read_text().splitlines()) == 32
    assert trainer.global_step == 4
    assert logged(trainer, "rollout/reward_errors") == [2.0, 0.0]  # the raise and the hang, both in epoch 0
    assert logged(trainer, "train/skipped_steps") == [0.0, 1.0, 1.0, 1.0]
    guard = next(c for c in trainer.callbacks if isinstance(c, NonFiniteGuard))
    assert guard.skipped_steps == 1 and guard.consecutive == 0
    for step, (before, after) in enumerate(zip(recorder.before, recorder.after)):
        unchanged = all(torch.equal(before[name], after[name]) for name in before)
        assert unchanged == (step == 1), f"step {step}: skipped steps alone leave the adapter as it was"
    optimizer = trainer.optimizers[0]
    assert {int(state["step"]) for state in optimizer.state.values()} == {3}  # 4 steps, 1 never applied
    saved = load_file(Path(trainer.log_dir) / "adapter" / "adapter_model.safetensors")
    assert len(saved) == len(StepRecorder.adapter(module)) and all(torch.isfinite(v).all() for v in saved.values())
    documented("a reward that raises, one that hangs, and a NaN loss in one step",
               f"the run finished all {trainer.global_step} steps; the two rewards counted as reward errors and "
               "scored failure_reward; the NaN step skipped with the adapter and optimizer untouched; the saved "
               "adapter finite", "test_faults.py")


@pytest.mark.slow
def test_too_many_consecutive_skips_stop_the_run(tiny_llama_dir, tmp_path):
    with pytest.raises(NonFiniteTrainingError) as info:
        fit_with_faults(tiny_llama_dir, tmp_path, poison_steps=[0, 1, 2, 3])
    assert str(info.value) == (
        "3 optimizer steps in a row had a non-finite loss or gradient (epoch 1, global step 2); the loss itself was "
        "not finite: look for NaN or inf in the rewards or advantages, or a -inf log-prob of a sampled token "
        "(sampler and trainer temperatures or weights out of sync). The run stops; the last epoch-boundary "
        "checkpoint is untouched."
    )
    assert not list(tmp_path.rglob("adapter_model.safetensors"))  # nothing written after the run went bad
    documented("a non-finite loss in 3 steps in a row", "the run stops with one message naming the likely "
               "causes; nothing written after it went bad; the last epoch's checkpoint untouched", "test_faults.py")


class DyingEngine(HFEngine):
    """An HF engine whose process "dies" (raises) on its ``die_on_call``-th generate."""

    def __init__(self, die_on_call: int) -> None:
        super().__init__()
        self.calls, self.die_on_call = 0, die_on_call

    def generate(self, prompts: Any, n: int, sampling: Any) -> Any:
        self.calls += 1
        if self.calls == self.die_on_call:
            raise ConnectionError("engine process exited with code -9")
        return super().generate(prompts, n, sampling)


def test_engine_death_fails_the_run_with_its_cause_and_keeps_the_last_checkpoint(tiny_llama_dir, tmp_path):
    pl.seed_everything(0)
    module = PolicyModule(model_name_or_path=str(tiny_llama_dir), lora={"rank": 4}, kl={"coef": 0.0})
    datamodule = RolloutDataModule(task=ArithmeticTask(), engine=DyingEngine(die_on_call=3), group_size=4,
                                   prompts_per_epoch=4, minibatch_size=8, max_new_tokens=4)
    trainer = pl.Trainer(
        max_epochs=4, reload_dataloaders_every_n_epochs=1, num_sanity_val_steps=0, limit_val_batches=0,
        callbacks=[ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last=True)], default_root_dir=tmp_path,
        logger=False, enable_progress_bar=False, enable_model_summary=False,
    )
    with pytest.raises(ConnectionError, match="engine process exited with code -9"):
        trainer.fit(module, datamodule)
    checkpoint = load_checkpoint(tmp_path / "ckpt" / "last.ckpt")
    assert checkpoint["epoch"] == 1 and checkpoint["RolloutDataModule"]["cursor"] == 8  # epochs 0 and 1, intact
    assert not list(tmp_path.rglob("adapter_model.safetensors"))
    documented("the generation engine dies in epoch 2", "the run fails with the engine's own error; last.ckpt of "
               "epoch 1 intact for `--ckpt_path last`", "test_faults.py")
