"""An epoch's rollouts drawn now, in turn with training (``max_staleness`` 0; ``ahead.py`` draws them in the
background): this rank's prompts, the policy pushed, the grouped draw (``grouped.py``) or the epoch's trees
(``trees.py``) laid out as rows, and each phase's seconds."""

from __future__ import annotations

import time
from typing import Any, Protocol

from lit_grpo.buffers.buffer import RolloutBuffer
from lit_grpo.buffers.protocols import SamplingPolicy
from lit_grpo.buffers.tree_layout import tree_buffer
from lit_grpo.engines.base import SamplingSpec, engine_metrics
from lit_grpo.rollout.ahead import DrawingData, EpochRollouts
from lit_grpo.rollout.trees import epoch_widths, grown_rounds


class DrawingNow(DrawingData, Protocol):
    """What drawing now uses of the DataModule (``RolloutDataModule``) beyond what drawing ahead does: the task,
    the rollout kind and its widths, the generation budget, the timed scoring, and the trees' growth and seeds."""

    task: Any
    rollout: str
    branching: list[int]
    group_size: int
    temperature: float
    max_new_tokens: int
    scoring: Any  # TimedScoring: the seconds the grouped draw spent in the rewards

    def grow_trees(self, module: SamplingPolicy, records: list, widths: Any, sampling: SamplingSpec) -> list: ...
    def sampling_spec(self, module: SamplingPolicy, greedy: bool, seed: int | None) -> SamplingSpec: ...
    def epoch_seed(self, epoch: int, stream: str = "rollout") -> int: ...


def rollouts_now(data: DrawingNow, module: SamplingPolicy, epoch: int) -> EpochRollouts:
    """The epoch's rollouts drawn now from the current policy, with their phase seconds and the engine's figures
    as they stood after this draw."""
    # a tree's size is known only once grown, so only grouped draws are cut to the budget
    grouped = data.rollout == "grouped"
    records = data.next_prompts(data.prompts.affordable_groups(data.prompts_per_epoch) if grouped else None)
    clock = time.perf_counter()
    data.sync_policy(module)
    pushed = time.perf_counter()
    if grouped:
        buffer: RolloutBuffer = data.draw_grouped(module, records, epoch)
        generated = time.perf_counter()
    else:  # trees: the environment scores each round as it is generated
        widths = epoch_widths(data.rollout, data.branching, data.group_size, data.task)
        # each stream's seed is derived from the epoch's, then offset by this rank's first prompt (share_start)
        roots = data.grow_trees(module, records, widths, data.sampling_spec(module, False, data.epoch_seed(epoch)))
        generated = time.perf_counter()
        buffer = tree_buffer(roots, module.tokenizer, data.temperature, data.max_new_tokens, data.rollout,
                             grown_rounds(widths), data.task.sequence_budget())
        data.prompts.count(buffer.input_ids.shape[0])
    scored = time.perf_counter()
    phases = {"push": pushed - clock, "generate": generated - pushed - data.scoring.seconds,
              "score": scored - generated + data.scoring.seconds}
    return EpochRollouts(buffer, records, phases, engine_metrics(data.engine))
