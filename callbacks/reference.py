"""The reference policy pi_ref for the KL term: the base model (adapter off) or a frozen copy of the adapter."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Literal

import lightning.pytorch as pl
import torch
from lightning.pytorch.utilities import rank_zero_info

from lit_grpo.errors import InputError

REFERENCE_ADAPTER = "reference"


class ReferencePolicy(pl.Callback):
    """Owns what pi_ref is: inside ``active(policy)`` the policy model runs as pi_ref, which is how the module
    computes the buffer's ``ref_logp`` (with whichever forward it trains with, packed or padded).

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
        self._frozen: dict[str, torch.Tensor] | None = None  # adapter weights of pi_ref, once frozen

    def setup(self, trainer: pl.Trainer, pl_module: Any, stage: str) -> None:
        pl_module.use_reference(self)  # the module computes ref_logp inside self.active(...)

    def on_fit_start(self, trainer: pl.Trainer, pl_module: Any) -> None:
        if self.reference == "initial" and self._frozen is None:
            self._freeze(pl_module.policy)
        elif self._frozen is not None:  # restored from a checkpoint
            self._install(pl_module.policy)

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: Any) -> None:
        every = self.refresh_every_n_epochs
        if every is not None and (trainer.current_epoch + 1) % every == 0:
            self._freeze(pl_module.policy)
            rank_zero_info(f"reference policy refreshed from the adapter after epoch {trainer.current_epoch}")

    @contextmanager
    def active(self, policy: Any) -> Iterator[None]:
        """Run the policy model as pi_ref inside the block."""
        if self._frozen is None:
            with policy.disable_adapter():
                yield
            return
        active = policy.active_adapter
        policy.set_adapter(REFERENCE_ADAPTER)
        try:
            yield
        finally:
            policy.set_adapter(active)  # also makes only the active adapter trainable again

    def _freeze(self, policy: Any) -> None:
        active = policy.active_adapter
        self._frozen = {
            name.replace(f".{active}.", f".{REFERENCE_ADAPTER}."): param.detach().clone()
            for name, param in policy.named_parameters()
            if f".{active}." in name and "lora_" in name
        }
        self._install(policy)

    def _install(self, policy: Any) -> None:
        """Create the frozen adapter if needed and load the reference weights into it."""
        if REFERENCE_ADAPTER not in policy.peft_config:
            # its initial weights are overwritten below; drawing them from the global RNG would shift every later
            # draw (LoRA dropout, sampling) of a resumed run against an uninterrupted one
            device = next(policy.parameters()).device
            with torch.random.fork_rng(devices=[device] if device.type == "cuda" else [], device_type=device.type):
                policy.add_adapter(REFERENCE_ADAPTER, policy.peft_config[policy.active_adapter])
        params = dict(policy.named_parameters())
        with torch.no_grad():
            for name, value in self._frozen.items():
                params[name].copy_(value)
                params[name].requires_grad_(False)

    def state_dict(self) -> dict[str, Any]:
        return {"frozen": self._frozen}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._frozen = state_dict.get("frozen")
