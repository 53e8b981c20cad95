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
