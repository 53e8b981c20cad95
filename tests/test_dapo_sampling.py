"""DAPO's sampling fixes in the DataModule, on the shipped tiny model: dynamic sampling, overlong filtering."""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
import pytest
import torch

from lit_grpo.callbacks import RolloutMetrics
from lit_grpo.rollout.datamodule import RolloutDataModule
from lit_grpo.policy.module import PolicyModule
from lit_grpo.tasks import ArithmeticTask


class Buffers(pl.Callback):
    def __init__(self) -> None:
        self.seen: list[Any] = []

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: Any) -> None:
        self.seen.append((trainer.datamodule.epoch_report.buffer, trainer.datamodule.epoch_report.sampling_draws, trainer.datamodule.prompts.cursor))


def fit(tmp_path, **data_kwargs: Any) -> tuple[Buffers, pl.Trainer]:
    pl.seed_everything(0)
    module = PolicyModule(kl={"coef": 0.0}, optimizer=lambda p: torch.optim.AdamW(p, lr=1e-4, weight_decay=0.0))
    datamodule = RolloutDataModule(task=ArithmeticTask(), group_size=4, prompts_per_epoch=8, minibatch_size=16,
                                   **data_kwargs)
    buffers = Buffers()
    trainer = pl.Trainer(max_epochs=2, reload_dataloaders_every_n_epochs=1, num_sanity_val_steps=0,
                         limit_val_batches=0, callbacks=[buffers, RolloutMetrics(table_every_n_epochs=0)],
                         default_root_dir=tmp_path, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(module, datamodule)
    return buffers, trainer


@pytest.mark.slow
def test_dynamic_sampling_keeps_only_informative_groups(tmp_path):
    buffers, trainer = fit(tmp_path, dynamic_sampling=True, max_sampling_rounds=12)
    previous_cursor = 0
    for buffer, draws, cursor in buffers.seen:
        groups = buffer.rewards.split(buffer.sizes)
        assert all(g.amax() > g.amin() for g in groups)  # no flat group is trained on
        assert buffer.num_groups == 8
        # the model gets ~28% right: many groups are all wrong, so more prompts were drawn than the 8 trained on
        assert draws >= 2 and cursor - previous_cursor > 8
        previous_cursor = cursor
    assert trainer.callback_metrics["rollout/sampling_draws"] >= 2
    assert trainer.callback_metrics["rollout/zero_std_frac"] == 0.0


def test_truncated_completions_carry_no_loss(tmp_path):
    buffers, _ = fit(tmp_path, max_new_tokens=2, mask_truncated=True)  # answers need 3-4 tokens: most are cut off
    buffer = buffers.seen[0][0]
    assert buffer.truncated.any()
    assert not buffer.completion_mask[buffer.truncated].any()
    assert buffer.completion_mask[~buffer.truncated].any(dim=1).all()


@pytest.mark.slow
def test_completion_budget_cuts_draws_and_ends_the_run_with_a_validation(tmp_path, caplog):
    # 8 prompts x 4 = 32 completions per draw; 52 pays for 13 groups: epoch 0 spends 32 on its first draw and
    # its replacement draws are cut to the 5 groups (20 completions) left, so the run ends after epoch 0
    pl.seed_everything(0)
    module = PolicyModule(kl={"coef": 0.0}, optimizer=lambda p: torch.optim.AdamW(p, lr=1e-4, weight_decay=0.0))
    datamodule = RolloutDataModule(task=ArithmeticTask(), group_size=4, prompts_per_epoch=8, minibatch_size=16,
                                   dynamic_sampling=True, max_sampling_rounds=6, completion_budget=52,
                                   val_max_prompts=16)
    buffers = Buffers()
    trainer = pl.Trainer(max_epochs=5, reload_dataloaders_every_n_epochs=1, num_sanity_val_steps=0,
                         check_val_every_n_epoch=3, callbacks=[buffers, RolloutMetrics(table_every_n_epochs=0)],
                         default_root_dir=tmp_path, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False)
    with caplog.at_level("INFO"):
        trainer.fit(module, datamodule)
    assert datamodule.prompts.completions_generated == 52
    assert len(buffers.seen) == 1 and trainer.current_epoch == 1
    assert datamodule.prompts.cursor == 13  # 8 prompts, then 5: no prompt drawn that the budget could not pay for
    assert "after epoch 0: val/reward" in caplog.text  # epoch 0 is no validation epoch: the stop measured it
    assert datamodule.state_dict()["completions_generated"] == 52


def test_completion_budget_is_validated():
    try:
        RolloutDataModule(group_size=8, completion_budget=4)
    except ValueError as error:
        assert "completion_budget: must be >= group_size (8) or None, got 4" in str(error)
    else:
        raise AssertionError("a budget smaller than one group was accepted")


def test_a_budget_overshot_by_a_tree_epoch_is_spent_not_owed():
    # tree epochs are not cut to the budget: 300 segments allowed, 331 generated. The budget is spent (the run
    # stops after this epoch), and no draw is owed a negative number of groups (the bug ran a tree run forever)
    datamodule = RolloutDataModule(group_size=8, completion_budget=300)
    datamodule.prompts.completions_generated = 292
    assert not datamodule.budget_spent and datamodule.prompts.affordable_groups(3) == 1  # 8 left: one group
    datamodule.prompts.completions_generated = 296
    assert datamodule.budget_spent and datamodule.prompts.affordable_groups(3) == 0  # 4 left: less than one group
    datamodule.prompts.completions_generated = 331
    assert datamodule.budget_spent and datamodule.prompts.affordable_groups(3) == 0


class StopFlags(pl.Callback):
    """``trainer.should_stop`` as each epoch starts (after its ``train_dataloader()``)."""

    def __init__(self) -> None:
        self.seen: list[tuple[int, bool]] = []

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: Any) -> None:
        self.seen.append((trainer.current_epoch, trainer.should_stop))


@pytest.mark.slow
def test_a_run_resumed_after_its_budget_was_spent_draws_nothing_and_the_data_module_stops_no_trainer(tmp_path):
    # one draw of 8 prompts x 4 = 32 completions spends the budget: the module stops the run after epoch 0 (the one
    # place that acts on PromptCursor.budget_spent); resumed from that epoch's checkpoint with epochs to spare, the
    # data module has nothing to draw and serves no batches (Lightning ends the fit), setting no trainer flag itself
    from lightning.pytorch.callbacks import ModelCheckpoint

    def run(ckpt_path: str | None) -> tuple[RolloutDataModule, StopFlags, pl.Trainer]:
        pl.seed_everything(0)
        module = PolicyModule(kl={"coef": 0.0})
        data = RolloutDataModule(task=ArithmeticTask(), group_size=4, prompts_per_epoch=8, minibatch_size=16,
                                 completion_budget=32)
        flags = StopFlags()
        checkpoint = ModelCheckpoint(dirpath=tmp_path, filename="last", save_top_k=1, save_on_train_epoch_end=True)
        trainer = pl.Trainer(max_epochs=4, reload_dataloaders_every_n_epochs=1, num_sanity_val_steps=0,
                             limit_val_batches=0, callbacks=[flags, checkpoint], default_root_dir=tmp_path,
                             logger=False, enable_progress_bar=False, enable_model_summary=False)
        trainer.fit(module, data, ckpt_path=ckpt_path)
        return data, flags, trainer

    data, flags, trainer = run(None)
    assert flags.seen == [(0, False)] and data.prompts.completions_generated == 32
    assert trainer.global_step == 2  # 32 sequences in minibatches of 16
    data, flags, trainer = run(str(tmp_path / "last.ckpt"))
    assert data.prompts.completions_generated == 32 and data.prompts.cursor == 8  # restored, nothing drawn
    assert all(not stop for _, stop in flags.seen), flags.seen
    assert trainer.global_step == 2  # epoch 0's two optimizer steps, none after them
