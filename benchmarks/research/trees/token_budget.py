"""A benchmark's budget of policy tokens: the run stops once it has generated ``budget`` of them, its last epoch
cut to the prompts the rest pays for (benchmarks/research/trees/tree_vs_chains.py, protocol 2).

The library's ``data.completion_budget`` counts segments (a ``?`` costs two tokens and an answer four on the games),
and lets a tree's last epoch overshoot; a comparison of rollout shapes needs the same generated tokens for all.
Before each epoch the callback sets the prompts it draws to ``min(prompts_per_epoch, round(rest / t))``, with
``t`` the policy tokens per prompt measured so far, and stops the run when that is 0 or nothing is left: the run
ends within about half a prompt's tokens of the budget (the actual count is what the benchmark reports).

Used as ``--trainer.callbacks+='{"class_path": "benchmarks.research.trees.token_budget.PolicyTokenBudget",
"init_args": {"budget": N}}'`` with the checkout on ``PYTHONPATH``; it drives the DataModule's public
``prompts_per_epoch`` (and its cursor's).
"""

from __future__ import annotations

from typing import Any

from lightning.pytorch import Callback, LightningModule, Trainer


def prompts_paid_for(rest: float, spent: float, prompts: int, prompts_per_epoch: int) -> int:
    """Prompts the next epoch draws: all ``prompts_per_epoch`` while ``rest`` tokens pay for them at the measured
    ``spent / prompts`` tokens a prompt, else ``round(rest / (spent / prompts))`` (0: stop). Before any epoch
    (``prompts`` 0): all. Example: 100 tokens left at 400 tokens over 16 prompts (25 a prompt) pays for 4."""
    if rest <= 0:
        return 0
    if prompts == 0:
        return prompts_per_epoch
    return min(prompts_per_epoch, round(rest * prompts / spent))


class PolicyTokenBudget(Callback):
    """Stop at ``budget`` policy tokens generated (``completion_mask`` summed over every epoch's buffer)."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.spent = 0.0
        self.prompts = 0
        self.full_epoch: int | None = None

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        data: Any = trainer.datamodule
        report = data.epoch_report
        if report is None:
            return
        self.full_epoch = self.full_epoch or data.prompts_per_epoch
        self.spent += float(report.buffer.completion_mask.sum())
        self.prompts += data.prompts.prompts_per_epoch
        count = prompts_paid_for(self.budget - self.spent, self.spent, self.prompts, self.full_epoch)
        if count == 0:
            trainer.should_stop = True
            return
        data.prompts_per_epoch = count
        data.prompts.prompts_per_epoch = count
