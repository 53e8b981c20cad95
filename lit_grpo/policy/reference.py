"""The policy run as pi_ref: the base model (the adapter switched off) or a second, frozen LoRA adapter carrying the
weights a ``ReferenceSource`` holds (``callbacks.ReferencePolicy``). The module owns its policy's adapters; the
source owns only the weights."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import torch
from peft import set_peft_model_state_dict

from lit_grpo.errors import InputError

REFERENCE_ADAPTER = "reference"


@contextmanager
def running_as_reference(policy: Any, adapter: Mapping[str, torch.Tensor] | None) -> Iterator[None]:
    """Within the block the PEFT ``policy`` runs as pi_ref: with ``adapter``'s LoRA weights (``adapter_copy``'s
    format) in a frozen adapter of its own, or without any adapter when it is None."""
    if adapter is None:
        with policy.disable_adapter():
            yield
        return
    install_reference(policy, adapter)
    active = policy.active_adapter
    policy.set_adapter(REFERENCE_ADAPTER)
    try:
        yield
    finally:
        policy.set_adapter(active)  # also makes only the active adapter trainable again


def install_reference(policy: Any, adapter: Mapping[str, torch.Tensor]) -> None:
    """The frozen reference adapter, created on first use, loaded with ``adapter``'s weights."""
    if REFERENCE_ADAPTER not in policy.peft_config:
        # its initial weights are overwritten below; drawing them from the global RNG would shift every later draw
        # (LoRA dropout, sampling) of a resumed run against an uninterrupted one
        device = next(policy.parameters()).device
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else [], device_type=device.type):
            policy.add_adapter(REFERENCE_ADAPTER, policy.peft_config[policy.active_adapter])
    with torch.no_grad():
        loaded = set_peft_model_state_dict(policy, dict(adapter), adapter_name=REFERENCE_ADAPTER)
    if loaded.unexpected_keys:  # PEFT loads what matches and skips the rest: weights of another adapter shape
        raise InputError(f"the reference adapter's weights do not fit the policy's adapter (e.g. "
                         f"{loaded.unexpected_keys[0]}): a checkpoint of another model or LoRA configuration")
    for name, parameter in policy.named_parameters():
        if f".{REFERENCE_ADAPTER}." in name:
            parameter.requires_grad_(False)
