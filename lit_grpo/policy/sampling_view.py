"""What ``PolicyModule`` shows the rollout side (``buffers.protocols.SamplingPolicy``) and what callbacks configure
on it (``use_reference``), as functions of what they read: the module's members are one-line calls of these, so that
no other part reads or writes the module's attributes and nothing here reads the module's."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

import torch
from peft import get_peft_model_state_dict, set_peft_model_state_dict

from lit_grpo.buffers.protocols import ReferenceSource
from lit_grpo.policy.reference import running_as_reference

CONTEXT_LENGTH_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length")


def context_length(config: Any) -> int | None:
    """The model's maximum sequence length from its config (``max_position_embeddings`` or GPT-2's ``n_positions``)."""
    for name in CONTEXT_LENGTH_KEYS:
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def weights_version(trainer: Any) -> int:
    """Optimizer steps ``trainer`` has taken (-1 without one): the weights change only when it does."""
    return trainer.global_step if trainer is not None else -1


def adapter_weights(policy: Any) -> dict[str, torch.Tensor]:
    """A CPU copy of the policy's active LoRA weights."""
    return {name: tensor.detach().to("cpu", copy=True) for name, tensor in get_peft_model_state_dict(policy).items()}


@contextmanager
def adapter_swapped(policy: Any, adapter: dict[str, torch.Tensor] | None) -> Iterator[None]:
    """Within the block ``policy`` carries ``adapter``'s LoRA weights (``None``: its own); its own come back."""
    if adapter is None:
        yield
        return
    saved = adapter_weights(policy)
    set_peft_model_state_dict(policy, adapter)
    try:
        yield
    finally:
        set_peft_model_state_dict(policy, saved)


def reference_active(policy: Any, source: ReferenceSource | None) -> AbstractContextManager[None]:
    """A context in which ``policy`` runs as π_ref (``policy/reference.py``): with ``source``'s adapter weights (a
    frozen or refreshed copy, ``ReferencePolicy``); ``None``: the base model with the adapter switched off."""
    return running_as_reference(policy, None if source is None else source.reference_adapter())
