"""PPO (advantage_mode='gae'): the value head trains with the adapter, is checkpointed, and its stats are logged."""

from __future__ import annotations

import math
from types import SimpleNamespace

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lit_grpo.callbacks import RolloutMetrics

from lit_grpo.policy.advantages import AdvantageKnobs, gae_advantages
from lit_grpo.policy.module import PolicyModule
from lit_grpo.rollout.datamodule import RolloutDataModule
from support import load_checkpoint
from lit_grpo.tasks import ArithmeticTask


@pytest.mark.slow
def test_ppo_trains_value_head_and_adapter(tmp_path):
    pl.seed_everything(0)
    module = PolicyModule(advantage_mode="gae", kl={"coef": 0.04, "applied_to": "reward"}, aggregation="token-mean",
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
    buffer = datamodule.epoch_report.buffer
    assert buffer.advantages.shape == buffer.input_ids.shape  # per-token GAE advantages
    assert torch.equal(buffer.advantages[~buffer.completion_mask], torch.zeros_like(buffer.advantages[~buffer.completion_mask]))
    for key in ("train/value_loss", "train/explained_variance", "train/value_mean"):
        assert math.isfinite(float(trainer.callback_metrics[key]))
    checkpoint = load_checkpoint(tmp_path / "ckpt" / "last.ckpt")
    assert {"value_head.linear.weight", "value_head.linear.bias"} <= set(checkpoint["state_dict"])


def test_gae_wiring_kl_shaped_rewards_and_whitening_by_hand():
    # two rows; row 0 counts tokens 1-2, row 1 token 1. k1 = old - ref = 0.5 at row 0 token 1, beta 0.5: token
    # rewards row 0 [0, -0.25, 0 + 1 (its reward, on its last counted token)], row 1 [0, 0 + 0, 0]
    objective = PolicyModule(advantage_mode="gae", kl={"coef": 0.5, "applied_to": "reward"}).objective
    buffer = SimpleNamespace(
        completion_mask=torch.tensor([[False, True, True], [False, True, False]]),
        rewards=torch.tensor([1.0, 0.0]),
        old_logp=torch.tensor([[0.0, -1.0, -2.0], [0.0, -0.5, 0.0]]),
        ref_logp=torch.tensor([[0.0, -1.5, -2.0], [0.0, -0.5, 0.0]]),
        values=torch.tensor([[0.0, 0.5, 0.25], [0.0, 0.1, 0.0]]),
    )
    advantages, returns = gae_advantages(buffer, objective, AdvantageKnobs(gamma=1.0, gae_lambda=1.0))
    # row 0: delta_2 = 1 - 0.25 = 0.75 = A_2; delta_1 = -0.25 + 0.25 - 0.5 = -0.5, A_1 = -0.5 + 0.75 = 0.25;
    # returns A + V: 0.75, 1.0. Row 1: A_1 = 0 - 0.1 = -0.1, return 0.
    assert returns.flatten().tolist() == pytest.approx([0.0, 0.75, 1.0, 0.0, 0.0, 0.0], abs=1e-7)
    # whitened over the three counted tokens [0.25, 0.75, -0.1]: mean 0.3, population std sqrt(0.365 / 3)
    std = math.sqrt(0.365 / 3) + 1e-6
    expected = [0.0, -0.05 / std, 0.45 / std, 0.0, -0.4 / std, 0.0]
    assert advantages.flatten().tolist() == pytest.approx(expected, abs=1e-6)


def test_kl_in_the_loss_leaves_the_rewards_unshaped():
    objective = PolicyModule(advantage_mode="gae", kl={"coef": 0.5, "applied_to": "loss"}).objective
    buffer = SimpleNamespace(completion_mask=torch.tensor([[True, True]]), rewards=torch.tensor([1.0]),
                             old_logp=torch.tensor([[-1.0, -1.0]]), ref_logp=torch.tensor([[-3.0, -3.0]]),
                             values=torch.zeros(1, 2))
    _, returns = gae_advantages(buffer, objective, AdvantageKnobs(gamma=1.0, gae_lambda=1.0))
    assert returns.tolist() == [[1.0, 1.0]]  # the reward alone, no -beta * k1 = -1 per token


def test_ppo_on_chains_runs_gae_along_each_episode_with_a_closing_reward_on_the_question_before_it():
    from lit_grpo.policy.advantages import assign_advantages
    from lit_grpo.rollout.trees import SegmentNode
    from lit_grpo.tree import Node, chain_rows

    def seg(reward, *children, terminal=False):
        return SegmentNode(reward=reward, terminal=terminal, segment=(5,), children=list(children))

    # prompt 1: a question cut off at max_depth (closing -0.5, no tokens), and a right answer; prompt 2: ask, answer
    roots = [Node(children=[seg(-0.1, Node(reward=-0.5, terminal=True)), seg(1.0, terminal=True)]),
             Node(children=[seg(-0.1, seg(1.0, terminal=True))])]
    episode, rewards = chain_rows(roots)
    assert episode.tolist() == [0, 1, 2, 2]
    assert rewards.tolist() == pytest.approx([-0.6, 1.0, -0.1, 1.0], abs=1e-7)
    buffer = SimpleNamespace(  # one counted token per row (column 1), values 0.2, 0.5, 0.4, 0.3
        trees=roots, completion_mask=torch.tensor([[False, True]] * 4), rewards=torch.tensor([-0.1, 1.0, -0.1, 1.0]),
        old_logp=torch.zeros(4, 2), ref_logp=torch.zeros(4, 2), values=torch.tensor([[0, 0.2], [0, 0.5], [0, 0.4],
                                                                                     [0, 0.3]]))
    objective = PolicyModule(advantage_mode="gae", kl={"coef": 0.0}).objective
    assign_advantages(buffer, objective, AdvantageKnobs(gamma=1.0, gae_lambda=1.0, value_head=True))
    # gamma = lam = 1: A = return-to-go - V: -0.6 - 0.2 = -0.8; 1 - 0.5 = 0.5; (-0.1 + 1) - 0.4 = 0.5; 1 - 0.3 = 0.7
    assert buffer.returns[:, 1].tolist() == pytest.approx([-0.6, 1.0, 0.9, 1.0], abs=1e-7)
    std = math.sqrt(1.4275 / 4) + 1e-6  # whitened: mean 0.225, squared deviations sum 1.4275
    expected = [(a - 0.225) / std for a in (-0.8, 0.5, 0.5, 0.7)]
    assert buffer.advantages[:, 1].tolist() == pytest.approx(expected, abs=1e-6)
    assert buffer.advantages[:, 0].tolist() == [0.0] * 4
