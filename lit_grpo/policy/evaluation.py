"""Evaluation metrics on the held-out split: ``val/reward`` (``val/return`` for a multi-round task) and
``val/accuracy``, accumulated from the scored batches the DataModule's validation loader yields
(``lit_grpo.rollout.evaluation``); a sampled evaluation's batches carry more per-prompt figures (``pass@k``,
``mean@n``, ..., ``lit_grpo.rollout.sample_metrics``), each averaged over the prompts, ``mean@n`` with its standard
error (docs/guide.md#sampled-evaluation). A named evaluation set's batches (``"set": name``, data.eval_sets) are
accumulated apart and logged as ``val/<set>/<figure>`` (docs/guide.md#named-evaluation-sets)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from lightning.pytorch.utilities import rank_zero_info
from torchmetrics import CatMetric, MeanMetric


def mean_and_stderr(values: torch.Tensor) -> tuple[float, float]:
    """The mean of ``values [P]`` (one figure per prompt) and its standard error across the prompts,
    ``std / sqrt(P)`` with the sample standard deviation (divisor P - 1); NaN with a single prompt (no spread to
    measure). Example: [1, 0, 0.5, 0.5]: mean 0.5, std sqrt(0.5 / 3), stderr sqrt(0.5 / 3) / 2."""
    values = values.double()
    count = values.numel()
    stderr = float(values.std(correction=1) / count**0.5) if count > 1 else float("nan")
    return float(values.mean()), stderr


class GreedyEvaluation(torch.nn.Module):
    """Accumulates greedy rewards and exact-answer accuracy over held-out prompts, for any loop or hook; a sampled
    evaluation's batches hold beside them each prompt's figures over its samples, each averaged over the prompts
    (``mean@n`` also gives ``mean@n_stderr``); a named set's batches go to a ``GreedyEvaluation`` of the set's own
    (``sets``), whose figures ``compute`` gives as ``<set>/<figure>``. A module, so that its
    metrics' states move with the policy's (on a GPU, Lightning's validation batches are there, and DDP gathers the
    states with the GPU's backend); they are not saved (torchmetrics' states are not persistent)."""

    def __init__(self) -> None:
        super().__init__()
        self.reward = MeanMetric()
        self.accuracy = MeanMetric()
        self.reward_name = "reward"
        self.figures = torch.nn.ModuleDict()  # a sampled evaluation's other figures, one value per prompt each
        self.logged: dict[str, float] = {}  # the figures last logged through Lightning, unrounded
        self.sets = torch.nn.ModuleDict()  # each named evaluation set's own accumulators, by the set's name

    def update(self, batch: dict[str, Any]) -> None:
        if "set" in batch:  # a named set's batch: its own figures
            name = batch["set"]
            if name not in self.sets:  # beside the others, on their device
                self.sets[name] = GreedyEvaluation().to(self.reward.device)
            self.sets[name].update({key: value for key, value in batch.items() if key != "set"})
            return
        # a multi-round task's greedy "reward" is the episode's return: the batch names it so for the logs
        self.reward_name = "return" if "return" in batch else "reward"
        # the batch may be on another device: Lightning's loops move it to the module's, a loader read outside
        # them (validation before training) leaves it where the rollout side made it
        self.reward.update(batch[self.reward_name].to(self.reward.device))
        self.accuracy.update(batch["correct"].float().to(self.accuracy.device))
        for name in batch.keys() - {self.reward_name, "correct"}:
            if name not in self.figures:  # float64: a per-prompt figure such as 1/3 keeps its digits
                self.figures[name] = CatMetric().to(self.reward.device).set_dtype(torch.float64)
            self.figures[name].update(batch[name].double().to(self.reward.device))

    def compute(self) -> dict[str, float]:
        """The figures accumulated since the last call, then reset: the unnamed batches' by name (always, when no
        named set's batch came), each named set's as ``<set>/<figure>`` (the sets that had batches, by name)."""
        named = {f"{name}/{figure}": value for name in sorted(self.sets) if self.sets[name].reward.update_count
                 for figure, value in self.sets[name].compute().items()}
        if named and not self.reward.update_count:
            return named
        metrics = {self.reward_name: float(self.reward.compute()), "accuracy": float(self.accuracy.compute())}
        self.reward.reset()
        self.accuracy.reset()
        for name in sorted(self.figures):
            mean, stderr = mean_and_stderr(self.figures[name].compute().reshape(-1))
            metrics[name] = mean
            if name.startswith("mean@"):
                metrics[f"{name}_stderr"] = stderr
            self.figures[name].reset()
        return {**metrics, **named}

    def log_to(self, module: Any, prefix: str) -> None:
        """Log the epoch's means through Lightning (reduced across ranks), then start afresh."""
        metrics = self.compute()
        self.logged = {} if module.trainer.sanity_checking else metrics  # for the evaluations file, in float64
        for name, value in metrics.items():
            shown = name.rsplit("/", 1)[-1] == "accuracy"  # each set's accuracy, named sets' too
            module.log(f"{prefix}/{name}", torch.tensor(value), prog_bar=shown, sync_dist=True)
        summary = ", ".join(f"{prefix}/{name} {value:.4f}" for name, value in metrics.items())
        fn = module.trainer.state.fn
        when = f"after epoch {module.current_epoch}" if fn == "fit" else getattr(fn, "value", str(fn))
        when = "sanity check (not logged)" if module.trainer.sanity_checking else when  # Lightning drops its logs
        rank_zero_info(f"{when}: {summary}")

    def run_standalone(self, batches: Iterable[dict[str, torch.Tensor]]) -> dict[str, float]:
        """A whole validation loader outside Lightning's loops (before training, where Lightning's sanity check
        would discard what is logged); kept as the last logged figures (the evaluations file's step 0)."""
        for batch in batches:
            self.update(batch)
        self.logged = self.compute()
        return dict(self.logged)
