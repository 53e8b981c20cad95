"""What each side sees of the other while running (docs/guide.md#layout): small Protocols, so that the rollout side
never imports the policy and the policy never imports the rollout side.

- An engine samples with the policy's weights: the rollout side reads ``SamplingPolicy`` off the LightningModule.
- The infer/defer rule needs P(error) at open contexts while a tree grows: it gets a ``ContextRisk``.
- The module prepares the epoch's buffer (π_old, π_ref, values, advantages, the risk head's fit) in a hook of its
  own, from the ``EpochBatches`` the DataModule hands over through the train loader, with the epoch's
  ``RolloutReport``; logging and callbacks read the same report through ``ReportsRollouts``.
- The module measures the policy outside Lightning's validation loop (before training; after the epoch that spent
  the completion budget) on the held-out scores a DataModule serves through ``ServesHeldOutScores``.
- Callbacks configure the parts through public methods typed here, never by setting attributes on them: a
  ``RiskThresholdSource`` is given to ``RolloutDataModule.use_risk_threshold``, a ``ReferenceSource`` to
  ``PolicyModule.use_reference``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol, runtime_checkable

import torch

from lit_grpo.buffers.report import RolloutReport


class ContextRisk(Protocol):
    """The risk head read at open contexts (token ids): the rule's only view of the policy and its head."""

    def p_error(self, contexts: Sequence[Sequence[int]]) -> torch.Tensor:
        """P(return of inferring now < the success threshold) at each context ``[B]`` (float32, CPU)."""

    def branch_probs(self, contexts: Sequence[Sequence[int]]) -> torch.Tensor:
        """The head's return distributions of inferring and of deferring at each context ``[B, 2, K]``."""

    @property
    def atoms(self) -> torch.Tensor:
        """The return atoms ``[K]`` of ``branch_probs``."""

    @property
    def success_threshold(self) -> float:
        """A return below it is an error."""


@runtime_checkable
class SamplingPolicy(Protocol):
    """What the rollout side needs of the LightningModule: the weights an engine samples with, the tokenizer that
    turns prompts into ids and back, the ids that end a completion, the risk head at contexts (None without one),
    how many prompts to probe greedily each epoch for a detached risk head (0: none), the module's own arguments
    (for the cross-knob rules), the model's name and context (for the prompt checks), which weights it holds now,
    and its adapter as a copy or swapped for another (for rollouts drawn ahead)."""

    policy: Any
    tokenizer: Any
    stop_token_ids: tuple[int, ...]
    risk_probe_prompts: int

    def context_risk(self) -> ContextRisk | None: ...

    @property
    def model_arguments(self) -> Mapping[str, Any]:
        """The module's own arguments (its hyper-parameters), as the cross-knob rules read them: its knob groups
        (``kl``, ``tree``, ...) each a mapping of its fields."""

    @property
    def model_name(self) -> str:
        """The model as the user named it (``model_name_or_path``), for messages."""

    @property
    def context_length(self) -> int | None:
        """The model's maximum sequence length, None when its config does not say."""

    def weights_version(self) -> int:
        """Optimizer steps taken so far (-1 outside a trainer): the weights change only when it does."""

    def adapter_copy(self) -> dict[str, torch.Tensor]:
        """A CPU copy of the active LoRA adapter's weights."""

    def adapter_swapped(self, adapter: dict[str, torch.Tensor] | None) -> AbstractContextManager[None]:
        """Within the block the policy carries ``adapter``'s LoRA weights (``None``: its own); its own come back."""


class RiskThresholdSource(Protocol):
    """What decides the infer/defer rule's threshold (``callbacks.RiskThreshold``): tau per epoch, how the rule
    decides, and the share of training prompts that grow without it."""

    decision: str
    cvar_level: float
    explore_fraction: float

    def training_tau(self, epoch: int) -> float | None: ...
    def current_tau(self, epoch: int) -> float | None: ...


@runtime_checkable
class TakesRiskThreshold(Protocol):
    """A DataModule that applies the infer/defer rule at a ``RiskThresholdSource``'s tau (``RolloutDataModule``)."""

    def use_risk_threshold(self, source: RiskThresholdSource | None) -> None: ...


class ReferenceSource(Protocol):
    """What π_ref is (``callbacks.ReferencePolicy``): the LoRA weights the policy runs with as π_ref (a frozen or
    refreshed copy of its adapter, in ``adapter_copy``'s format), or None for the base model (the adapter off)."""

    def reference_adapter(self) -> Mapping[str, torch.Tensor] | None: ...


@runtime_checkable
class TakesReference(Protocol):
    """A LightningModule that computes π_ref as a ``ReferenceSource`` says (``PolicyModule``), and whose adapter a
    source copies to freeze it."""

    def use_reference(self, source: ReferenceSource | None) -> None: ...

    def adapter_copy(self) -> dict[str, torch.Tensor]: ...


@runtime_checkable
class ReportsRollouts(Protocol):
    """A DataModule that publishes its per-epoch ``RolloutReport`` (None before the first epoch's rollouts)."""

    @property
    def epoch_report(self) -> RolloutReport | None: ...


@runtime_checkable
class ServesHeldOutScores(Protocol):
    """A DataModule whose validation prompts the module can score outside Lightning's validation loop: before
    training (Lightning discards what its sanity check logs) and after the epoch that spent the completion budget
    (when the loop would not validate then). ``held_out_scores()`` gives what its ``val_dataloader()`` gives:
    batches ``{"reward" (a multi-round task: "return"): [B], "correct": [B] bool}``, each scored greedily with the
    current policy when it is read (``RolloutDataModule``)."""

    def held_out_scores(self) -> Iterable[Mapping[str, torch.Tensor]]: ...


@runtime_checkable
class PreparesEpochs(Protocol):
    """A LightningModule that prepares each epoch's buffer (``PolicyModule``): the seconds its no-grad passes and the
    risk head's fit took in the last epoch, that fit's statistics, and the tokenizer that reads the rollouts' ids, for
    logging."""

    preparation_timings: Mapping[str, float]
    risk_fit_stats: Mapping[str, float]
    tokenizer: Any
