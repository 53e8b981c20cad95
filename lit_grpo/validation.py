"""Greedy evaluation on the task's held-out split: ``val/reward`` (``val/return`` for a multi-round task) and
``val/accuracy``."""

from __future__ import annotations

from typing import Any

import torch
from lightning.pytorch.utilities import rank_zero_info
from torchmetrics import MeanMetric

from lit_grpo.tasks import MultiRoundTask


class GreedyEvaluation:
    """Accumulates greedy rewards and exact-answer accuracy over held-out prompts, for any loop or hook."""

    def __init__(self) -> None:
        self.reward = MeanMetric()
        self.accuracy = MeanMetric()
        self.reward_name = "reward"

    def update(self, module: Any, datamodule: Any, records: list[dict[str, Any]]) -> None:
        # a multi-round task's greedy "reward" is the episode's return: name it so in the logs
        self.reward_name = "return" if isinstance(datamodule.task, MultiRoundTask) else "reward"
        rewards, correct = datamodule.greedy_scores(module, records)
        self.reward.update(rewards)
        self.accuracy.update(correct.float())

    def compute(self) -> dict[str, float]:
        metrics = {self.reward_name: float(self.reward.compute()), "accuracy": float(self.accuracy.compute())}
        self.reward.reset()
        self.accuracy.reset()
        return metrics

    def log_to(self, module: Any, prefix: str) -> None:
        """Log the epoch's means through Lightning (reduced across ranks), then start afresh."""
        metrics = self.compute()
        for name, value in metrics.items():
            module.log(f"{prefix}/{name}", torch.tensor(value), prog_bar=name == "accuracy", sync_dist=True)
        summary = ", ".join(f"{prefix}/{name} {value:.4f}" for name, value in metrics.items())
        fn = module.trainer.state.fn
        when = f"after epoch {module.current_epoch}" if fn == "fit" else getattr(fn, "value", str(fn))
        rank_zero_info(f"{when}: {summary}")

    def run_standalone(self, module: Any, datamodule: Any) -> dict[str, float]:
        """The whole held-out split outside Lightning's loops (before training, where Lightning's sanity check
        would discard what is logged)."""
        for records in datamodule.val_dataloader():
            self.update(module, datamodule, records)
        return self.compute()
