"""What each side sees of the other while running (docs/guide.md#layout): small Protocols, so that the rollout side
never imports the policy and the policy never imports the rollout side.

- An engine samples with the policy's weights: the rollout side reads ``SamplingPolicy`` off the LightningModule.
- The infer/defer rule needs P(error) at open contexts while a tree grows: it gets a ``ContextRisk``.
- The module prepares the epoch's buffer (π_old, π_ref, values, advantages, the risk head's fit) in a hook of its
  own, from the ``EpochData`` the DataModule hands over through the train loader.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import torch


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
    turns prompts into ids and back, the ids that end a completion, the risk head at contexts (None without one)
    and how many prompts to probe greedily each epoch for a detached risk head (0: none)."""

    policy: Any
    tokenizer: Any
    stop_token_ids: tuple[int, ...]
    risk_probe_prompts: int

    def context_risk(self) -> ContextRisk | None: ...
