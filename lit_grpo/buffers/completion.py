"""What an engine returns for one completion: the data contract between the engines and the buffers (engines sit
above ``buffers/`` and import it; ``lit_grpo.engines`` exports it for engine authors)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

FinishReason = Literal["stop", "length"]


@dataclass(frozen=True)
class Completion:
    """One generated completion: its token ids as sampled (a stop token included), their log-probs under the
    sampling distribution (temperature applied), and why generation ended."""

    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...] | None
    finish_reason: FinishReason
