"""Grouped rollouts (docs/guide.md#layout): ``group_size`` scored completions per prompt; with DAPO's dynamic
sampling, groups whose rewards are all equal are dropped and fresh prompts drawn for them; DAPO's overlong penalty and
overlong filtering."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from lit_grpo.buffers.buffer import RolloutBuffer, build_buffer, concat_buffers, informative_groups, select_groups
from lit_grpo.engines import RolloutEngine, SamplingSpec
from lit_grpo.losses import overlong_penalty
from lit_grpo.rollout.cursor import PromptCursor
from lit_grpo.run.seeds import derived_seed
from lit_grpo.tasks import PromptRecord, Task

Scorer = Callable[[RolloutBuffer, Sequence[PromptRecord], Any], None]  # scores a buffer in place
MorePrompts = Callable[[int], list[PromptRecord]]  # this rank's share of the next n prompts


@dataclass(frozen=True)
class GroupedDraw:
    """The grouped draw's knobs (``RolloutDataModule``'s arguments of the same names)."""

    group_size: int
    prompts_per_epoch: int
    temperature: float
    max_new_tokens: int
    dynamic_sampling: bool = False
    max_sampling_rounds: int = 4
    overlong_cache: int | None = None
    mask_truncated: bool = False

    def draw(self, task: Task, engine: RolloutEngine, tokenizer: Any, records: list[PromptRecord],
             sampling: SamplingSpec, prompts: PromptCursor, score: Scorer, more: MorePrompts) -> RolloutBuffer:
        """``records``' scored groups; a cut-off completion carries no loss with ``mask_truncated``."""
        buffer = self.groups(task, engine, tokenizer, records, sampling, prompts, score, more)
        if self.mask_truncated:  # DAPO's overlong filtering: a cut-off completion is no evidence either way
            buffer.completion_mask[buffer.truncated] = False
        return buffer

    def groups(self, task: Task, engine: RolloutEngine, tokenizer: Any, records: list[PromptRecord],
               sampling: SamplingSpec, prompts: PromptCursor, score: Scorer, more: MorePrompts) -> RolloutBuffer:
        """``group_size`` scored completions per prompt. With ``dynamic_sampling`` (DAPO), groups whose rewards
        are all equal are dropped and fresh prompts drawn for them (``more``, cut to what the budget pays for), up
        to ``max_sampling_rounds`` draws. Each draw's request seeds derive from ``sampling.seed`` and the draw's
        index, offset by this rank's first prompt (``prompts.share_start``)."""
        kept: list[RolloutBuffer] = []
        rounds = self.max_sampling_rounds if self.dynamic_sampling else 1
        for draw in range(rounds):
            prompt_ids = [task.prompt_ids(r, tokenizer) for r in records]
            seed = None if sampling.seed is None else derived_seed(sampling.seed, "draw", draw) + prompts.share_start
            completions = engine.generate(prompt_ids, self.group_size, replace(sampling, seed=seed))
            part = build_buffer(prompt_ids, completions, tokenizer.pad_token_id, self.temperature, self.max_new_tokens)
            prompts.count(part.input_ids.shape[0])
            score(part, records, tokenizer)
            if self.overlong_cache is not None:
                part.rewards += overlong_penalty(part.completion_lengths, self.max_new_tokens, self.overlong_cache)
            part.sampling_draws = draw + 1
            if not self.dynamic_sampling:
                return part
            kept.append(select_groups(part, informative_groups(part)))
            missing = self.prompts_per_epoch - sum(b.num_groups for b in kept)
            if missing == 0:
                break
            records = more(prompts.affordable_groups(missing))
            if not records:
                break
        buffer = concat_buffers([b for b in kept if b.num_groups]) if any(b.num_groups for b in kept) else part
        buffer.sampling_draws = part.sampling_draws
        return buffer
