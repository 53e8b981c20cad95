"""``lit_grpo/epoch/one_epoch.py`` is the epoch a fit runs (issue 51, item 6): called from ``on_fit_start`` of a fit
that trains no batch itself, it trains the adapter ``Trainer.fit`` trains in one epoch, to the bit; so the overview
cannot drift from the hooks it describes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from support import DigitShareTask

from lit_grpo.epoch import one_epoch
from lit_grpo.policy.module import PolicyModule
from lit_grpo.rollout.datamodule import RolloutDataModule


class OneEpochAtFitStart(pl.Callback):
    """Runs ``one_epoch`` where Lightning has set everything up and before its loop draws anything."""

    def __init__(self) -> None:
        self.before: dict[str, torch.Tensor] = {}
        self.after: dict[str, torch.Tensor] = {}
        self.buffer: Any = None

    def on_fit_start(self, trainer: pl.Trainer, pl_module: Any) -> None:
        self.before = pl_module.adapter_copy()
        self.buffer = one_epoch(trainer, pl_module, trainer.datamodule).buffer
        self.after = pl_module.adapter_copy()


def fit(model_dir: Path, root: Path, callbacks: list[pl.Callback], train_batches: int | None) -> RolloutDataModule:
    pl.seed_everything(0)
    module = PolicyModule(model_name_or_path=str(model_dir), lora={"rank": 4}, kl={"coef": 0.04},
                          optimizer=lambda params: torch.optim.AdamW(params, lr=2e-2, weight_decay=0.0))
    # two passes over two minibatches, two minibatches per optimizer step: the accumulation path is walked
    data = RolloutDataModule(task=DigitShareTask(), group_size=4, prompts_per_epoch=4, minibatch_size=8,
                             ppo_epochs=2, max_new_tokens=4)
    trainer = pl.Trainer(max_epochs=1, limit_train_batches=train_batches, limit_val_batches=0, num_sanity_val_steps=0,
                         accumulate_grad_batches=2, reload_dataloaders_every_n_epochs=1, callbacks=callbacks,
                         default_root_dir=root, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False)
    trainer.fit(module, data)
    return data


def test_one_epoch_trains_what_a_fit_epoch_trains(tiny_llama_dir, tmp_path):
    lightning_data = fit(tiny_llama_dir, tmp_path / "fit", [], None)
    lightning_adapter = lightning_data.trainer.lightning_module.adapter_copy()
    overview = OneEpochAtFitStart()
    fit(tiny_llama_dir, tmp_path / "overview", [overview], 0)  # Lightning's loop trains no batch
    lightning_buffer = lightning_data.epoch_report.buffer
    assert torch.equal(overview.buffer.input_ids, lightning_buffer.input_ids)  # the same rollouts
    assert torch.equal(overview.buffer.advantages, lightning_buffer.advantages)
    assert any(not torch.equal(overview.before[k], overview.after[k]) for k in overview.before)  # it trained
    assert overview.after.keys() == lightning_adapter.keys()
    assert [k for k in lightning_adapter if not torch.equal(overview.after[k], lightning_adapter[k])] == []
