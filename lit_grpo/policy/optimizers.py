"""How the module's optimizer and scheduler arguments become what Lightning's ``configure_optimizers`` returns."""

from __future__ import annotations

from typing import Any

import torch

from lit_grpo.errors import InputError


def lr_scheduler_entry(scheduler: Any) -> dict[str, Any]:
    """Lightning's scheduler entry: stepped every optimizer step; a ``ReduceLROnPlateau`` once an epoch on the metric
    it monitors (``lightning.pytorch.cli.ReduceLROnPlateau(optimizer, monitor, ...)``, as Lightning's own CLI
    configures it); torch's own plateau names no metric and is refused."""
    if not isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau):
        return {"scheduler": scheduler, "interval": "step"}
    monitor = getattr(scheduler, "monitor", None)
    if not isinstance(monitor, str):
        raise InputError("model.lr_scheduler: a ReduceLROnPlateau needs the metric it watches: use "
                         "lightning.pytorch.cli.ReduceLROnPlateau with monitor set to a metric logged every epoch "
                         "(rollout/reward_mean, say)")
    return {"scheduler": scheduler, "interval": "epoch", "monitor": monitor}


def module_optimizers(module: Any, heads: list[Any], head_lr: float | None, optimizer_factory: Any,
                      scheduler_factory: Any) -> Any:
    """What ``configure_optimizers`` returns: the optimizer over the module's trainable parameters (AdamW(lr=5e-4,
    weight_decay=0) unless ``optimizer_factory``), the ``heads``' in their own group at ``head_lr`` when given (they
    start from zero and need larger steps than the adapter), and the scheduler entry when a factory is given."""
    params: list[Any] = [p for p in module.parameters() if p.requires_grad]
    if head_lr is not None:
        head_params = [p for head in heads for p in head.parameters()]
        head_ids = {id(p) for p in head_params}
        params = [{"params": [p for p in params if id(p) not in head_ids]}, {"params": head_params, "lr": head_lr}]
    optimizer = optimizer_factory(params) if optimizer_factory else torch.optim.AdamW(params, lr=5e-4, weight_decay=0.0)
    if scheduler_factory is None:
        return optimizer
    return {"optimizer": optimizer, "lr_scheduler": lr_scheduler_entry(scheduler_factory(optimizer))}
