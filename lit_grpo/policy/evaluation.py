"""Greedy evaluation metrics on the held-out split: ``val/reward`` (``val/return`` for a multi-round task) and
``val/accuracy``, accumulated from the scored batches the DataModule's validation loader yields
(``lit_grpo.rollout.evaluation``)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from lightning.pytorch.utilities import rank_zero_info
from torchmetrics import MeanMetric


class GreedyEvaluation(torch.nn.Module):
    """Accumulates greedy rewards and exact-answer accuracy over held-out prompts, for any loop or hook. A module, so
    that its metrics' states move with the policy's (on a GPU, Lightning's validation batches are there, and DDP
    reduces the states with the GPU's backend); they are not saved (torchmetrics' states are not persistent)."""

    def __init__(self) -> None:
        super().__init__()
        self.reward = MeanMetric()
        self.accuracy = MeanMetric()
        self.reward_name = "reward"

    def update(self, batch: dict[str, torch.Tensor]) -> None:
        # a multi-round task's greedy "reward" is the episode's return: the batch names it so for the logs
        self.reward_name = "return" if "return" in batch else "reward"
        # the batch may be on another device: Lightning's loops move it to the module's, a loader read outside
        # them (validation before training) leaves it where the rollout side made it
        self.reward.update(batch[self.reward_name].to(self.reward.device))
        self.accuracy.update(batch["correct"].float().to(self.accuracy.device))

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
        when = "sanity check (not logged)" if module.trainer.sanity_checking else when  # Lightning drops its logs
        rank_zero_info(f"{when}: {summary}")

    def run_standalone(self, batches: Iterable[dict[str, torch.Tensor]]) -> dict[str, float]:
        """A whole validation loader outside Lightning's loops (before training, where Lightning's sanity check
        would discard what is logged)."""
        for batch in batches:
            self.update(batch)
        return self.compute()
