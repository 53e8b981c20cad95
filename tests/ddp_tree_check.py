"""Tree rollouts on 2 DDP ranks (gloo, CPU) whose trees make different numbers of minibatches: the rank with fewer
serves empty ones, so both step alike. Run by test_ddp.py as a subprocess (Lightning re-launches this script for
rank 1). Each rank writes, per epoch, its planned and padded minibatch counts, the loss of every padding minibatch
it trained and its adapter after the fit.

Usage: python tests/ddp_tree_check.py OUT_DIR
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch

from lit_grpo.policy.module import PolicyModule
from lit_grpo.rollout.datamodule import RolloutDataModule
from lit_grpo.tasks import ClarifyTask, EnvStep


class SometimesAskingClarifyTask(ClarifyTask):
    """The clarification game with every segment of the first two rounds taken as a question for the rows whose b is
    even (trees of 21 rows), as played for the others (an untrained policy answers at once: trees of 3 rows), so
    that the ranks' trees differ in size."""

    def step(self, prompt_record: dict, round_index: int, segment_text: str) -> EnvStep:
        if round_index < 3 and int(prompt_record["b"]) % 2 == 0:
            return EnvStep("ask", -self.ask_cost, terminal=False, reply=f"b={prompt_record['b']};")
        return super().step(prompt_record, round_index, segment_text)


class RecordPadding(pl.Callback):
    def __init__(self, out: Path) -> None:
        self.out, self.epochs = out, []

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: Any) -> None:
        epoch = trainer.train_dataloader.dataset
        self.epochs.append({"planned": len(epoch.plan), "padding": epoch.padding, "padding_losses": [],
                            "trained": 0})

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        record = self.epochs[-1]
        record["trained"] += 1
        if batch_idx >= record["planned"]:
            record["padding_losses"].append(float(outputs["loss"]))
            assert not batch["completion_mask"].any()

    def on_train_end(self, trainer: pl.Trainer, pl_module: Any) -> None:
        adapter = {n: p.detach().clone() for n, p in pl_module.policy.named_parameters() if p.requires_grad}
        torch.save(adapter, self.out / f"rank{trainer.global_rank}_adapter.pt")
        (self.out / f"rank{trainer.global_rank}.json").write_text(json.dumps(
            {"epochs": self.epochs, "global_step": trainer.global_step}))


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)  # two ranks on two cores
    pl.seed_everything(0)
    module = PolicyModule(kl={"coef": 0.04}, dtype="float32", optimizer=lambda p: torch.optim.AdamW(p, lr=1e-3))
    # 2 prompts a rank, trees of 3 or 21 rows, minibatches of whole trees, 6 rows or more: the counts differ
    datamodule = RolloutDataModule(task=SometimesAskingClarifyTask(), rollout="tree", branching=[3, 2, 2], prompts_per_epoch=4,
                                   group_size=3, minibatch_size=6, max_new_tokens=5)
    trainer = pl.Trainer(strategy="ddp", devices=2, accelerator="cpu", max_epochs=4, reload_dataloaders_every_n_epochs=1,
                         use_distributed_sampler=False, num_sanity_val_steps=0, limit_val_batches=0, logger=False,
                         enable_checkpointing=False, default_root_dir=out, enable_progress_bar=False,
                         enable_model_summary=False, callbacks=[RecordPadding(out)])
    trainer.fit(module, datamodule)


if __name__ == "__main__":
    main()
