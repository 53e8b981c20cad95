"""What ``PolicyModule`` shows the rollout side (``buffers.protocols.SamplingPolicy``) and what callbacks configure
on it (``use_reference``): declared methods, so that no other part reads or writes the module's attributes."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
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


def adapter_weights(policy: Any) -> dict[str, torch.Tensor]:
    """A CPU copy of the policy's active LoRA weights."""
    return {name: tensor.detach().to("cpu", copy=True) for name, tensor in get_peft_model_state_dict(policy).items()}


class SamplingView:
    """The ``SamplingPolicy`` members of ``PolicyModule`` beyond its plain attributes (``policy``, ``tokenizer``,
    ``stop_token_ids``), and ``use_reference``. Mixed into the LightningModule, whose ``hparams`` and trainer it
    reads."""

    policy: Any
    hparams: Any
    _trainer: Any
    reference_source: ReferenceSource | None = None

    @property
    def model_arguments(self) -> Mapping[str, Any]:
        return dict(self.hparams)

    @property
    def model_name(self) -> str:
        return str(self.hparams.model_name_or_path)

    @property
    def context_length(self) -> int | None:
        return context_length(self.policy.config)

    def weights_version(self) -> int:
        return self._trainer.global_step if self._trainer is not None else -1

    def adapter_copy(self) -> dict[str, torch.Tensor]:
        return adapter_weights(self.policy)

    @contextmanager
    def adapter_swapped(self, adapter: dict[str, torch.Tensor] | None) -> Iterator[None]:
        if adapter is None:
            yield
            return
        saved = adapter_weights(self.policy)
        set_peft_model_state_dict(self.policy, adapter)
        try:
            yield
        finally:
            set_peft_model_state_dict(self.policy, saved)

    def use_reference(self, source: ReferenceSource | None) -> None:
        """Compute π_ref with ``source``'s adapter weights (a frozen or refreshed copy, ``ReferencePolicy``);
        ``None``: the base model with the adapter switched off."""
        self.reference_source = source

    def reference_active(self) -> Any:
        """A context in which the policy model runs as π_ref (``policy/reference.py``)."""
        adapter = None if self.reference_source is None else self.reference_source.reference_adapter()
        return running_as_reference(self.policy, adapter)
