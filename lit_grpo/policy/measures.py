"""How the policy is measured on held-out prompts (docs/guide.md#validation-and-test-prompts): in Lightning's
validation and test loops, before training, and after the epoch that spent the completion budget, which also ends
the run. Outside Lightning's loops it reads the data module's ``ServesHeldOutScores`` (``buffers/protocols.py``),
never another part's attributes."""

from __future__ import annotations

import lightning.pytorch as pl
import torch
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn

from lit_grpo.buffers.epoch import EpochBatches
from lit_grpo.buffers.protocols import ServesHeldOutScores
from lit_grpo.policy.evaluation import GreedyEvaluation


class HeldOutMeasures(pl.LightningModule):
    """Mixed into ``PolicyModule``: its greedy evaluation (``evaluation``, built by the module) fed by Lightning's
    validation and test loops and, outside them, by the data module's held-out scores; and the run's end when the
    epoch's ``RolloutReport`` says the completion budget is spent (the one place that acts on
    ``PromptCursor.budget_spent``)."""

    evaluation: GreedyEvaluation

    def setup(self, stage: str) -> None:
        if stage == "fit" and self.trainer.enable_validation and self.held_out() is None:
            rank_zero_warn(f"PolicyModule: the trainer's data module ({type(self.trainer.datamodule).__name__}) does "
                           "not serve held_out_scores() (lit_grpo.buffers.protocols.ServesHeldOutScores; "
                           "RolloutDataModule does): Lightning's validation loop measures the policy, but not before "
                           "training, nor after a completion budget's last epoch when the loop would not validate")

    def held_out(self) -> ServesHeldOutScores | None:
        """The trainer's data module as a source of held-out scores; None when it serves none."""
        data = self.trainer.datamodule
        return data if isinstance(data, ServesHeldOutScores) else None

    def on_train_start(self) -> None:
        # a resumed run is not before training; and the extra validation would draw from the global RNG (a
        # DataLoader's seed) that the checkpoint just restored, so the run would not continue as it was
        resumed, held_out = self.trainer.global_step > 0, self.held_out()
        if self.trainer.enable_validation and held_out is not None and not resumed:
            metrics = self.evaluation.run_standalone(held_out.held_out_scores())
            if self.logger is not None:
                self.logger.log_metrics({f"val/{k}": v for k, v in metrics.items()}, step=0)
            rank_zero_info("before training: " + ", ".join(f"val/{k} {v:.4f}" for k, v in metrics.items()))

    def on_train_epoch_end(self) -> None:
        """End the run after the epoch whose rollouts spent the completion budget (the DataModule's report says so),
        with a last validation if the loop would not run one now: the run's last policy is always measured."""
        epoch = getattr(self.trainer.train_dataloader, "dataset", None)
        report = epoch.report if isinstance(epoch, EpochBatches) else None
        if report is None or not report.budget_spent:
            return
        self.trainer.should_stop = True
        rank_zero_info(f"completion budget spent ({report.completions_generated} generated): stopping after "
                       f"epoch {self.current_epoch}")
        every, held_out = self.trainer.check_val_every_n_epoch, self.held_out()
        validated = every is not None and (self.current_epoch + 1) % every == 0
        if self.trainer.enable_validation and not validated and held_out is not None:
            for batch in held_out.held_out_scores():
                self.evaluation.update(batch)
            self.evaluation.log_to(self, "val")

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        self.evaluation.update(batch)

    def on_validation_epoch_end(self) -> None:
        self.evaluation.log_to(self, "val")

    def test_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        self.evaluation.update(batch)

    def on_test_epoch_end(self) -> None:
        self.evaluation.log_to(self, "test")
