"""How the policy is measured on held-out prompts (docs/guide.md#validation-and-test-prompts): in Lightning's
validation and test loops, before training, and after the epoch that spent the completion budget, which also ends
the run. Outside Lightning's loops it reads the data module's ``ServesHeldOutScores`` (``buffers/protocols.py``),
never another part's attributes."""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn

from lit_grpo.buffers.epoch import EpochBatches
from lit_grpo.buffers.protocols import ServesHeldOutScores
from lit_grpo.policy.evaluation import GreedyEvaluation


def held_out_source(trainer: pl.Trainer) -> ServesHeldOutScores | None:
    """The trainer's data module as a source of held-out scores; None when it serves none."""
    data = trainer.datamodule
    return data if isinstance(data, ServesHeldOutScores) else None


class HeldOutMeasures:
    """``PolicyModule``'s measures outside Lightning's loops, with the module's ``GreedyEvaluation`` (a submodule of
    the module, so its metric states move with the policy; Lightning's validation and test steps feed it directly):
    before training, and the run's end when the epoch's ``RolloutReport`` says the completion budget is spent (the
    one place that acts on ``PromptCursor.budget_spent``). Each method takes the trainer it reads."""

    def __init__(self, evaluation: GreedyEvaluation) -> None:
        self.evaluation = evaluation

    def warn_without_source(self, trainer: pl.Trainer) -> None:
        """At fit's setup: say what is not measured when validation runs but the data module serves no scores."""
        if trainer.enable_validation and held_out_source(trainer) is None:
            rank_zero_warn(f"PolicyModule: the trainer's data module ({type(trainer.datamodule).__name__}) does "
                           "not serve held_out_scores() (lit_grpo.buffers.protocols.ServesHeldOutScores; "
                           "RolloutDataModule does): Lightning's validation loop measures the policy, but not before "
                           "training, nor after a completion budget's last epoch when the loop would not validate")

    def before_training(self, trainer: pl.Trainer, logger: Any) -> None:
        """The policy measured before its first step, logged at step 0 to ``logger`` (None: printed only)."""
        # a resumed run is not before training; and the extra validation would draw from the global RNG (a
        # DataLoader's seed) that the checkpoint just restored, so the run would not continue as it was
        resumed, held_out = trainer.global_step > 0, held_out_source(trainer)
        if trainer.enable_validation and held_out is not None and not resumed:
            metrics = self.evaluation.run_standalone(held_out.held_out_scores())
            if logger is not None:
                logger.log_metrics({f"val/{k}": v for k, v in metrics.items()}, step=0)
            rank_zero_info("before training: " + ", ".join(f"val/{k} {v:.4f}" for k, v in metrics.items()))

    def end_if_budget_spent(self, trainer: pl.Trainer, epoch: EpochBatches | None,
                            logs_to: pl.LightningModule) -> None:
        """End the run after the epoch whose rollouts spent the completion budget (the ``RolloutReport`` the
        DataModule handed over with ``epoch`` says so), with a last validation logged through ``logs_to`` if the loop
        would not run one now: the run's last policy is always measured."""
        report = None if epoch is None else epoch.report
        if report is None or not report.budget_spent:
            return
        trainer.should_stop = True
        rank_zero_info(f"completion budget spent ({report.completions_generated} generated): stopping after "
                       f"epoch {trainer.current_epoch}")
        every, held_out = trainer.check_val_every_n_epoch, held_out_source(trainer)
        validated = every is not None and (trainer.current_epoch + 1) % every == 0
        if trainer.enable_validation and not validated and held_out is not None:
            for batch in held_out.held_out_scores():
                self.evaluation.update(batch)
            self.evaluation.log_to(logs_to, "val")
