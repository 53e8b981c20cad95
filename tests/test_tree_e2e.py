"""Tree and chain rollouts through a real Trainer: environment tokens carry no loss, node tokens carry the node's
advantage, and training runs in every mode."""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
import pytest
import torch

from lit_grpo.policy.module import PolicyModule
from lit_grpo.rollout.datamodule import RolloutDataModule
from lit_grpo.tasks import ClarifyTask, EnvStep
from lit_grpo.tree import policy_nodes


class AskingClarifyTask(ClarifyTask):
    """The game with every segment of the first two rounds taken as a question, so that an untrained policy's trees
    reach depth 3 and contexts carry environment replies (the real game needs a policy that has learnt to ask)."""

    def step(self, prompt_record: dict, round_index: int, segment_text: str) -> EnvStep:
        if round_index < 3:
            return EnvStep("ask", -self.ask_cost, terminal=False, reply=f"b={prompt_record['b']};")
        return super().step(prompt_record, round_index, segment_text)


class InspectTrees(pl.Callback):
    def __init__(self) -> None:
        self.checked_rows = 0
        self.checked_replies = 0
        self.losses: list[float] = []

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: Any, batch: Any, batch_idx: int) -> None:
        if batch_idx:  # once an epoch, once the module has prepared the buffer (its on_train_epoch_start)
            return
        buffer = trainer.datamodule.epoch_report.buffer
        tokenizer = pl_module.tokenizer
        nodes = [node for root in buffer.trees for node in policy_nodes(root)]
        assert len(nodes) == buffer.input_ids.shape[0]
        for row, node in enumerate(nodes):
            counted = buffer.input_ids[row][buffer.completion_mask[row]].tolist()
            assert counted == list(node.segment)  # the node's own tokens and nothing else: no environment token
            context = buffer.input_ids[row][: len(node.context)].tolist()
            assert context == list(node.context) and not buffer.completion_mask[row, : len(node.context)].any()
            assert buffer.advantages[row].item() == pytest.approx(node.advantage, abs=1e-6)
            if node.reply:  # a question: its reply is in its children's context, masked there
                for child in node.children:
                    if getattr(child, "segment", ()):
                        start = len(child.context) - len(node.reply)
                        assert tuple(child.context[start:]) == node.reply
                        self.checked_replies += 1
            self.checked_rows += 1
        assert tokenizer.decode(list(nodes[0].context), skip_special_tokens=True) == nodes[0].record["prompt"]

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.losses.append(float(outputs["loss"]))
        # the minibatch carries the same per-row advantages the buffer holds
        assert batch["advantages"].dim() == 1


@pytest.mark.slow
@pytest.mark.parametrize("rollout, value_mode", [("tree", "mean"), ("tree", "optimal_stopping"), ("chains", "mean")])
@pytest.mark.parametrize("task_class", [ClarifyTask, AskingClarifyTask])
def test_tree_rollouts_train(rollout, value_mode, task_class, tmp_path):
    pl.seed_everything(0)
    module = PolicyModule(kl={"coef": 0.04}, tree={"value_mode": value_mode},
                          optimizer=lambda p: torch.optim.AdamW(p, lr=1e-3, weight_decay=0.0))
    datamodule = RolloutDataModule(task=task_class(), rollout=rollout,
                                   branching=[3, 2, 2] if rollout == "tree" else None, group_size=4,
                                   prompts_per_epoch=4, minibatch_size=16, max_new_tokens=5, val_max_prompts=8)
    inspect = InspectTrees()
    trainer = pl.Trainer(max_epochs=2, reload_dataloaders_every_n_epochs=1, num_sanity_val_steps=0,
                         callbacks=[inspect], default_root_dir=tmp_path, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(module, datamodule)
    assert inspect.checked_rows > 0 and inspect.losses
    if task_class is AskingClarifyTask:  # depth 3 reached: replies checked in the children's contexts
        assert inspect.checked_replies > 0
        assert trainer.datamodule.epoch_report.buffer.completion_mask.sum() < trainer.datamodule.epoch_report.buffer.attention_mask.sum()
    assert all(torch.isfinite(torch.tensor(inspect.losses)))
    assert "val/accuracy" in trainer.callback_metrics and "val/return" in trainer.callback_metrics
