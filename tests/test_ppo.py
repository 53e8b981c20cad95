"""PPO (advantage_mode='gae'): the value head trains with the adapter, is checkpointed, and its stats are logged."""

from __future__ import annotations

import math

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from lit_grpo.callbacks import RolloutMetrics
from lit_grpo.datamodule import RolloutDataModule
from lit_grpo.module import PolicyModule
from lit_grpo.tasks import ArithmeticTask


def test_ppo_trains_value_head_and_adapter(tmp_path):
    pl.seed_everything(0)
    module = PolicyModule(advantage_mode="gae", kl_coef=0.04, kl_in="reward", aggregation="token-mean",
                          optimizer=lambda p: torch.optim.AdamW(p, lr=1e-3, weight_decay=0.0))
    datamodule = RolloutDataModule(task=ArithmeticTask(), group_size=4, prompts_per_epoch=8, minibatch_size=16)
    trainer = pl.Trainer(max_epochs=2, reload_dataloaders_every_n_epochs=1, num_sanity_val_steps=0,
                         limit_val_batches=0, default_root_dir=tmp_path, logger=False, enable_progress_bar=False,
                         enable_model_summary=False,
                         callbacks=[RolloutMetrics(table_every_n_epochs=0),
                                    ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last=True)])
    trainer.fit(module, datamodule)
    head = module.value_head.linear
    assert head.weight.abs().sum() > 0  # zero-initialised, so any non-zero weight was learnt
    buffer = datamodule.buffer
    assert buffer.advantages.shape == buffer.input_ids.shape  # per-token GAE advantages
    assert torch.equal(buffer.advantages[~buffer.completion_mask], torch.zeros_like(buffer.advantages[~buffer.completion_mask]))
    for key in ("train/value_loss", "train/explained_variance", "train/value_mean"):
        assert math.isfinite(float(trainer.callback_metrics[key]))
    checkpoint = torch.load(tmp_path / "ckpt" / "last.ckpt", weights_only=True)
    assert {"value_head.linear.weight", "value_head.linear.bias"} <= set(checkpoint["state_dict"])
