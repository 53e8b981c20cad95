"""Scoring a rollout buffer's completions with the task's rewards (the reward worker, or the task in-process)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import torch
from lightning.pytorch.utilities import rank_zero_warn

from lit_grpo.buffers.buffer import RolloutBuffer, reward_parts
from lit_grpo.rollout.reward_worker import RewardWorker
from lit_grpo.tasks import PromptRecord, Task
from lit_grpo.tasks.base import ScoredCompletion, prompt_text


def score_buffer(scorer: Task | RewardWorker, buffer: RolloutBuffer, records: Sequence[PromptRecord],
                 tokenizer: Any) -> None:
    """Rewards and correctness of every completion of ``buffer`` (``records``: one per group), in place; a failing
    reward scores the task's failure, and the call's reward errors are printed in one warning."""
    rows = range(buffer.input_ids.shape[0])
    row_records = [records[row // buffer.group_size] for row in rows]
    ids = [buffer.input_ids[row][buffer.completion_mask[row]].tolist() for row in rows]
    texts = [tokenizer.decode(row_ids, skip_special_tokens=True).strip() for row_ids in ids]
    scored = scorer.score_group(row_records, texts, ids)
    buffer.rewards[:] = torch.tensor([s.reward for s in scored])
    buffer.correct[:] = torch.tensor([s.correct for s in scored])
    warning = reward_error_warning(scored, row_records)
    if warning:
        rank_zero_warn(warning)
    buffer.reward_errors = sum(s.error is not None for s in scored)
    buffer.reward_failed = torch.tensor([s.error is not None for s in scored])
    buffer.reward_parts = reward_parts(scored)
    buffer.reward_weights = scorer.reward_weights()
    buffer.completion_texts = texts
    buffer.prompt_texts = [prompt_text(record) for record in row_records]




def reward_error_warning(scored: Sequence[ScoredCompletion], records: Sequence[PromptRecord],
                         shown: int = 3) -> str | None:
    """One message for a call's reward errors: how many completions failed and what they scored, then each
    distinct error (the reward's name, what it raised or returned) with the prompt of its first completion, the
    first ``shown`` of them."""
    failed: dict[str, tuple[int, PromptRecord]] = {}
    for s, record in zip(scored, records):
        if s.error is not None:
            count, first = failed.get(s.error, (0, record))
            failed[s.error] = (count + 1, first)
    if not failed:
        return None
    total = sum(count for count, _ in failed.values())
    reward = next(s.reward for s in scored if s.error is not None)
    lines = [f"reward error on {total} of {len(scored)} completion(s), scored {reward} (rollout/reward_errors):"]
    lines += [f"  {error} (on {count} completion(s), the first of prompt {prompt_text(record)!r:.60})"
              for error, (count, record) in list(failed.items())[:shown]]
    if len(failed) > shown:
        lines.append(f"  ... and {len(failed) - shown} other error(s)")
    return "\n".join(lines)


class TimedScoring:
    """``score_buffer`` with ``scorer``, its seconds summed in ``seconds``: rewards scored while generating (grouped
    draws) are counted as scoring, not as generation time."""

    def __init__(self, scorer: Task | RewardWorker) -> None:
        self.scorer, self.seconds = scorer, 0.0

    def __call__(self, buffer: RolloutBuffer, records: Sequence[PromptRecord], tokenizer: Any) -> None:
        started = time.perf_counter()
        score_buffer(self.scorer, buffer, records, tokenizer)
        self.seconds += time.perf_counter() - started
