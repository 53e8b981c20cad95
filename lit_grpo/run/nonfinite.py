"""NonFiniteGuard: an optimizer step whose loss or gradient is not finite is skipped, counted, and never applied."""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.utilities import rank_zero_warn

from lit_grpo.errors import InputError


class NonFiniteTrainingError(RuntimeError):
    """Raised when ``max_consecutive_skips`` optimizer steps in a row had a non-finite loss or gradient."""


def grads_finite(parameters: list[torch.nn.Parameter]) -> bool:
    """True when every existing gradient is finite (one reduction per tensor, one sync for all)."""
    flags = [torch.isfinite(p.grad).all() for p in parameters if p.grad is not None]
    return bool(torch.stack(flags).all()) if flags else True


def refuse_nonfinite(named_tensors: Any, what: str) -> None:
    """Raise rather than write a NaN or inf weight to disk. First one sum per floating-point tensor, checked at
    once (a NaN or inf element makes its tensor's sum NaN or inf; ~0.15 ms a checkpoint of the quickstart, where an
    ``isfinite`` per tensor, a few kernels each, cost ~1 ms); only if a sum is not finite (or overflowed), the exact
    check by name."""
    named = [(name, tensor.detach()) for name, tensor in named_tensors if tensor.is_floating_point()]
    device = named[0][1].device if named else None
    if not named or bool(torch.stack([t.sum(dtype=torch.float32).to(device) for _, t in named]).isfinite().all()):
        return
    bad = [name for name, tensor in named if not torch.isfinite(tensor).all()]
    if bad:
        raise NonFiniteTrainingError(f"refusing to write the {what}: {len(bad)} tensors are not finite (e.g. {bad[0]})")


def agreed_skip(trainer: pl.Trainer, local_nonfinite: bool) -> bool:
    """Skip the step when any rank saw a non-finite value, so every rank skips the same steps (one process: the
    local flag itself). Gradients are all-reduced in backward, but a loss that is NaN on one rank only is local."""
    return bool(trainer.strategy.reduce_boolean_decision(local_nonfinite, all=False))


def likely_cause(loss_nonfinite: bool) -> str:
    if loss_nonfinite:
        return ("the loss itself was not finite: look for NaN or inf in the rewards or advantages, or a -inf "
                "log-prob of a sampled token (sampler and trainer temperatures or weights out of sync)")
    return ("the loss was finite but its gradient was not: the update overflowed; lower the learning rate or set "
            "trainer.gradient_clip_val")


class NonFiniteGuard(pl.Callback):
    """Skips an optimizer step whose loss (any micro-batch accumulated into it) or gradient is NaN or inf: the
    gradients are dropped before the optimizer sees them, so the adapter and the optimizer's moments stay as they
    were (a learning-rate scheduler still advances). Logs the running count as ``train/skipped_steps``.

    ``PolicyModule.configure_callbacks`` adds one with the defaults to any ``Trainer`` whose callbacks hold none (the
    command's and yours alike); put your own in ``trainer.callbacks`` to change its setting.

    Args:
        max_consecutive_skips: stop the run (``NonFiniteTrainingError``, naming the epoch and the likely cause) after
            this many skipped steps in a row: something is broken, not unlucky. The last epoch-boundary
            checkpoint is left as it was.
    """

    def __init__(self, max_consecutive_skips: int = 3) -> None:
        if max_consecutive_skips < 1:
            raise InputError(f"max_consecutive_skips must be >= 1, got {max_consecutive_skips}")
        self.max_consecutive_skips = max_consecutive_skips
        self.skipped_steps = 0  # over the run; carried by checkpoints
        self.consecutive = 0
        self._loss_nonfinite = False  # any micro-batch of the step being accumulated

    @property
    def state_key(self) -> str:
        return "NonFiniteGuard"

    def on_before_backward(self, trainer: pl.Trainer, pl_module: Any, loss: torch.Tensor) -> None:
        self._loss_nonfinite |= not bool(torch.isfinite(loss.detach()).all())

    def on_before_optimizer_step(self, trainer: pl.Trainer, pl_module: Any, optimizer: Any) -> None:
        parameters = [p for group in optimizer.param_groups for p in group["params"]]
        loss_nonfinite, self._loss_nonfinite = self._loss_nonfinite, False
        if not agreed_skip(trainer, loss_nonfinite or not grads_finite(parameters)):
            self.consecutive = 0
            self.log_count(pl_module)
            return
        for p in parameters:  # optimizers leave a parameter without a gradient untouched (moments included)
            p.grad = None
        self.skipped_steps += 1
        self.consecutive += 1
        self.log_count(pl_module)
        cause = likely_cause(loss_nonfinite)
        if self.consecutive >= self.max_consecutive_skips:
            raise NonFiniteTrainingError(
                f"{self.consecutive} optimizer steps in a row had a non-finite loss or gradient (epoch "
                f"{trainer.current_epoch}, global step {trainer.global_step}); {cause}. The run stops; the last "
                "epoch-boundary checkpoint is untouched."
            )
        rank_zero_warn(f"skipped optimizer step {trainer.global_step} of epoch {trainer.current_epoch}: {cause}")

    def on_save_checkpoint(self, trainer: pl.Trainer, pl_module: Any, checkpoint: dict[str, Any]) -> None:
        refuse_nonfinite(checkpoint["state_dict"].items(), "checkpoint")

    def on_fit_end(self, trainer: pl.Trainer, pl_module: Any) -> None:  # runs before the module saves the adapter
        refuse_nonfinite(((n, p) for n, p in pl_module.named_parameters() if p.requires_grad), "final adapter")

    def log_count(self, pl_module: Any) -> None:
        pl_module.log("train/skipped_steps", float(self.skipped_steps), on_step=True, on_epoch=False, batch_size=1)

    def state_dict(self) -> dict[str, Any]:
        return {"skipped_steps": self.skipped_steps, "consecutive": self.consecutive}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.skipped_steps = int(state_dict["skipped_steps"])
        self.consecutive = int(state_dict["consecutive"])
