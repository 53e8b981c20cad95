"""The reference policy pi_ref for the KL term: the base model (adapter off) or a frozen copy of the adapter."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

import lightning.pytorch as pl
import torch
from lightning.pytorch.utilities import rank_zero_info

from lit_grpo.buffers.protocols import TakesReference
from lit_grpo.errors import InputError
from lit_grpo.policy.reference import REFERENCE_ADAPTER

# checkpoints before issue 51 kept the frozen weights under the reference adapter's parameter names
OLD_ADAPTER_KEY = f".{REFERENCE_ADAPTER}."


class ReferencePolicy(pl.Callback):
    """Owns what pi_ref is (``buffers.protocols.ReferenceSource``): the base model, or a frozen copy of the adapter
    that the module runs its policy with when it computes the buffer's ``ref_logp`` (with whichever forward it trains
    with, packed or padded). The copy is this callback's state, checkpointed; the module installs it.

    Args:
        reference: ``base``: the base model with the LoRA adapter disabled (no extra memory); ``initial``: a frozen
            copy of the adapter as it was when the fit started (for a run that continues from ``init_adapter``).
        refresh_every_n_epochs: copy the current adapter into the frozen reference after every N epochs (the
            periodic reference refresh); ``None`` keeps the reference fixed.
    """

    def __init__(self, reference: Literal["base", "initial"] = "base", refresh_every_n_epochs: int | None = None) -> None:
        if reference not in ("base", "initial"):
            raise InputError(f"unknown reference {reference!r}; valid choices: base, initial")
        if refresh_every_n_epochs is not None and refresh_every_n_epochs < 1:
            raise InputError(f"refresh_every_n_epochs must be >= 1 or None, got {refresh_every_n_epochs}")
        self.reference = reference
        self.refresh_every_n_epochs = refresh_every_n_epochs
        self.frozen: dict[str, torch.Tensor] | None = None  # the adapter weights of pi_ref, once frozen

    def reference_adapter(self) -> Mapping[str, torch.Tensor] | None:
        return self.frozen

    def setup(self, trainer: pl.Trainer, pl_module: Any, stage: str) -> None:
        if not isinstance(pl_module, TakesReference):  # the reference would never be used: say so
            raise InputError(f"ReferencePolicy: the module ({type(pl_module).__name__}) takes no reference "
                             "(use_reference, lit_grpo.buffers.protocols.TakesReference): use lit_grpo.PolicyModule, "
                             "or leave the callback out")
        pl_module.use_reference(self)

    def on_fit_start(self, trainer: pl.Trainer, pl_module: Any) -> None:
        if self.reference == "initial" and self.frozen is None and isinstance(pl_module, TakesReference):
            self.frozen = pl_module.adapter_copy()  # a restored copy stays as it was

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: Any) -> None:
        every = self.refresh_every_n_epochs
        if every is not None and (trainer.current_epoch + 1) % every == 0 and isinstance(pl_module, TakesReference):
            self.frozen = pl_module.adapter_copy()
            rank_zero_info(f"reference policy refreshed from the adapter after epoch {trainer.current_epoch}")

    def state_dict(self) -> dict[str, Any]:
        return {"frozen": self.frozen}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        frozen = state_dict.get("frozen")
        self.frozen = None if frozen is None else {key.replace(OLD_ADAPTER_KEY, "."): value
                                                   for key, value in frozen.items()}
