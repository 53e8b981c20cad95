"""Online DPO: pairs from groups, the loss on a minibatch by hand, and a real training run."""

from __future__ import annotations

import math

import lightning.pytorch as pl
import pytest
import torch

from lit_grpo.buffers.buffer import RolloutBuffer
from lit_grpo.callbacks import RolloutMetrics
from lit_grpo.rollout.datamodule import RolloutDataModule
from lit_grpo.policy.module import PolicyModule
from lit_grpo.policy.online_dpo import assign_pairs, online_dpo_loss
from lit_grpo.tasks import ArithmeticTask


def test_pairs_and_loss_by_hand():
    buffer = RolloutBuffer(
        input_ids=torch.zeros(6, 2, dtype=torch.long), attention_mask=torch.ones(6, 2, dtype=torch.bool),
        completion_mask=torch.ones(6, 2, dtype=torch.bool), rewards=torch.tensor([0.0, 1.0, 0.5, 1.0, 1.0, 1.0]),
        correct=torch.zeros(6, dtype=torch.bool), truncated=torch.zeros(6, dtype=torch.bool), group_size=3,
        temperature=1.0, max_new_tokens=2,
    )
    assign_pairs(buffer)
    assert buffer.pair_role.tolist() == [-1, 1, 0, 0, 0, 0]  # the second group ties: no pair
    assert buffer.pair_id.tolist() == [0, 0, -1, -1, -1, -1]
    # sequence log-probs (sums): chosen row 1: -1 (ref -2), rejected row 0: -3 (ref -2); margin 0.1 * (1 + 1) = 0.2
    logp = torch.tensor([[-1.0, -2.0], [-0.5, -0.5], [9.0, 9.0], [9.0, 9.0], [9.0, 9.0], [9.0, 9.0]])
    ref = torch.tensor([[-1.0, -1.0], [-1.0, -1.0], [0.0, 0.0], [0.0, 0.0], [0.0, 0.0], [0.0, 0.0]])
    loss, stats = online_dpo_loss(logp, ref, buffer.completion_mask, buffer.pair_role, buffer.pair_id, beta=0.1)
    assert loss.item() == pytest.approx(math.log1p(math.exp(-0.2)), abs=1e-6)  # -log sigmoid(0.2) = 0.5981389
    assert stats["accuracy"].item() == 1.0


def test_online_dpo_trains(tmp_path):
    pl.seed_everything(0)
    module = PolicyModule(loss_variant="dpo", kl={"coef": 0.0}, dpo_beta=0.1,
                          optimizer=lambda p: torch.optim.AdamW(p, lr=1e-3, weight_decay=0.0))
    datamodule = RolloutDataModule(task=ArithmeticTask(), group_size=4, prompts_per_epoch=8, minibatch_size=16)
    trainer = pl.Trainer(max_epochs=2, reload_dataloaders_every_n_epochs=1, num_sanity_val_steps=0,
                         limit_val_batches=0, default_root_dir=tmp_path, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False,
                         callbacks=[RolloutMetrics(table_every_n_epochs=0)])
    trainer.fit(module, datamodule)
    assert datamodule.epoch_report.buffer.ref_logp is not None  # DPO needs pi_ref even with kl_coef 0
    buffer = datamodule.epoch_report.buffer
    # the pairs of the last epoch's real rollouts: in each group of 4, the best row chosen and the worst rejected,
    # no pair where every reward ties
    for group, (rewards, roles) in enumerate(zip(buffer.rewards.view(-1, 4), buffer.pair_role.view(-1, 4))):
        if rewards.max() == rewards.min():
            assert roles.tolist() == [0, 0, 0, 0]
            continue
        assert sorted(roles.tolist()) == [-1, 0, 0, 1]
        assert rewards[roles == 1].item() == rewards.max() and rewards[roles == -1].item() == rewards.min()
        assert buffer.pair_id.view(-1, 4)[group][roles != 0].tolist() == [group, group]
    assert buffer.pair_role.abs().sum() > 0  # the seed gives groups with a pair
    assert math.isfinite(float(trainer.callback_metrics["train/dpo_reward_margin"]))
    lora_b = [p for n, p in module.policy.named_parameters() if "lora_B" in n and p.requires_grad]
    assert any(p.abs().sum() > 0 for p in lora_b)  # B starts at zero: the adapter moved
