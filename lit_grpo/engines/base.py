"""The one interface between the algorithm and whatever generates rollouts (docs/guide.md#rollout-engines).

Nothing outside ``lit_grpo.engines`` imports an inference library: the DataModule speaks only this Protocol.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from lit_grpo.buffers.completion import Completion, FinishReason  # noqa: F401 - what engines return, for their authors


@dataclass(frozen=True)
class SamplingSpec:
    """How to sample one engine call.

    Training rollouts sample from the full distribution (no top-k, top-p 1): truncation would bias the importance
    ratio; ``top_p`` < 1 (nucleus sampling: the fewest most likely tokens whose probability reaches it,
    renormalised) is for a sampled evaluation only (``data.evaluation.top_p``). ``allowed_token_ids`` holds one list
    per prompt (or ``None``) and restricts the first token of the completion, e.g. the risk rule forcing a defer.
    ``next_turn``: the next call's prompts will be these prompts, their completions and more (a multi-turn episode's
    next turn); the hf engine then keeps the rows' cache for it (``engines/hf_turns.py``); other engines may ignore
    it.
    """

    max_new_tokens: int
    temperature: float = 1.0
    greedy: bool = False
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    allowed_token_ids: tuple[tuple[int, ...] | None, ...] | None = None
    next_turn: bool = False  # the caller's next call continues these rows (an engine may keep their cache for it)
    context_limit: int | None = None  # the model's context in tokens, where the caller knows it (a turn's checks)
    top_p: float = 1.0  # nucleus sampling: < 1 for a sampled evaluation only (data.evaluation.top_p)


@runtime_checkable
class RolloutEngine(Protocol):
    """Generates completions from the current policy."""

    shared: bool
    """When True, a fit does not close this engine: it belongs to whoever injected it (e.g. a test session)."""

    # Optional: ``samples_from_copy = True`` says push_policy copies the weights (or saves the adapter), so the engine
    # may draw the next rollouts while the model trains (``data.max_staleness``); engines without it are refused there.
    # Optional: ``metrics``, a ``dict[str, float]`` of the engine's own counters, logged as ``rollout/<name>`` after
    # each draw (read through ``engine_metrics``).
    # Optional: ``end_turns()``, called when a multi-turn expansion ends (through ``end_turns``): an engine that kept
    # something for a next turn (``SamplingSpec.next_turn``) lets it go.

    def generate(self, prompts: list[list[int]], n: int, sampling: SamplingSpec) -> list[list[Completion]]:
        """``n`` completions for each prompt (given as token ids), in prompt order."""

    def push_policy(self, model: Any) -> None:
        """Make the engine sample from ``model``'s current weights (its LoRA adapter included)."""

    def close(self) -> None:
        """Release the engine's resources; generating afterwards is an error."""


@runtime_checkable
class ReportsEngineMetrics(Protocol):
    """An engine with figures of its own (``RolloutEngine``'s optional ``metrics``)."""

    metrics: dict[str, float]


@runtime_checkable
class EndsTurns(Protocol):
    """An engine that keeps something for a next turn and lets it go (``RolloutEngine``'s optional ``end_turns``)."""

    def end_turns(self) -> None: ...


@runtime_checkable
class LimitsContext(Protocol):
    """An engine that may be set to a shorter context than the model's (``RolloutEngine``'s optional
    ``max_model_len``: vLLM's; None where it is not set)."""

    max_model_len: int | None


def context_limit(engine: RolloutEngine, model_context: int | None) -> int | None:
    """The tokens a prompt and its completion may hold together: the model's context, or the engine's where it is
    set shorter (vLLM's ``max_model_len``: a longer prompt would be refused there); None where neither is known."""
    engine_context = engine.max_model_len if isinstance(engine, LimitsContext) else None
    known = [limit for limit in (model_context, engine_context) if limit is not None]
    return min(known) if known else None


def engine_metrics(engine: RolloutEngine) -> dict[str, float]:
    """A copy of the engine's optional ``metrics`` (``ReportsEngineMetrics``), empty for an engine without them."""
    return dict(engine.metrics or {}) if isinstance(engine, ReportsEngineMetrics) else {}


def end_turns(engine: RolloutEngine) -> None:
    """Tell ``engine`` that no further turn follows, where it takes the hint (``EndsTurns``)."""
    if isinstance(engine, EndsTurns):
        engine.end_turns()


def engine_dtype(configured: str, model: Any) -> str:
    """The dtype an engine that loads its own copy of the weights uses: ``configured``, or for ``auto`` the dtype
    of ``model``'s frozen base weights, so that one decision (``model.dtype``, ``lit_grpo.run.dtype_choice``) holds
    for every copy: the sampler's log-probs stay the trainer's, and the memory rule counted this copy at that size."""
    if configured != "auto":
        return configured
    frozen = next((p for p in model.parameters() if not p.requires_grad and p.is_floating_point()), None)
    return "float32" if frozen is None else str(frozen.dtype).removeprefix("torch.")
