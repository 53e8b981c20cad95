"""The rollout side's per-epoch report (docs/guide.md#layout): what the DataModule drew, how long each phase took and
where the run's budget stands, published as one typed record that logging, callbacks and the LightningModule read
(``RolloutDataModule.epoch_report``, and the ``EpochBatches`` the module prepares)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from lit_grpo.buffers.buffer import RolloutBuffer


def frozen(values: Mapping[str, float]) -> Mapping[str, float]:
    """A read-only copy of ``values``: a report does not change after it is published."""
    return MappingProxyType(dict(values))


@dataclass(frozen=True)
class RolloutReport:
    """One epoch's rollouts as the DataModule reports them.

    ``buffer``: the scored rollouts handed over (the module adds π_old, π_ref and advantages to it in place).
    ``timings``: seconds per phase (``push``, ``generate``, ``score``; ``wait`` when drawn ahead; ``risk_probes``).
    ``engine_metrics``: the engine's own figures right after the draw (e.g. ``servers_alive``).
    ``sampling_draws``: draws made for the epoch with dynamic sampling, None without it.
    ``staleness``: adapter versions between the one that drew and the one that trains, None without drawing ahead.
    ``can_draw_ahead``: whether ``data.max_staleness`` could run with this rollout kind and engine.
    ``completions_generated``: completions (or tree segments) drawn over the run so far, every draw counted.
    ``budget_spent``: the completion budget pays for no further group: this epoch is the run's last (the one place
    that decides it: ``rollout.cursor.PromptCursor.budget_spent``).
    ``tool_names``: every tool a tool task's episodes may call (each is logged by name on every rank, called or not).
    ``logged_metrics``: what the rewards logged with ``log_metric`` over the epoch's draw, each name's (sum, count).
    """

    buffer: RolloutBuffer
    timings: Mapping[str, float] = field(default_factory=dict)
    engine_metrics: Mapping[str, float] = field(default_factory=dict)
    sampling_draws: int | None = None
    staleness: int | None = None
    can_draw_ahead: bool = False
    completions_generated: int = 0
    budget_spent: bool = False
    tool_names: tuple[str, ...] = ()
    logged_metrics: Mapping[str, tuple[float, int]] = field(default_factory=dict)
