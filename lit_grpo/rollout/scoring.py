"""Scoring a rollout buffer's completions with the task's rewards (the reward worker, or the task in-process)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from lightning.pytorch.utilities import rank_zero_warn

from lit_grpo.buffers.buffer import RolloutBuffer, reward_parts
from lit_grpo.tasks import PromptRecord
from lit_grpo.tasks.base import prompt_text


def score_buffer(scorer: Any, buffer: RolloutBuffer, records: Sequence[PromptRecord], tokenizer: Any) -> None:
    """Rewards and correctness of every completion of ``buffer`` (``records``: one per group), in place; a raising
    reward scores the task's failure, and the first error of the call is printed with its message."""
    rows = range(buffer.input_ids.shape[0])
    row_records = [records[row // buffer.group_size] for row in rows]
    ids = [buffer.input_ids[row][buffer.completion_mask[row]].tolist() for row in rows]
    texts = [tokenizer.decode(row_ids, skip_special_tokens=True).strip() for row_ids in ids]
    scored = scorer.score_group(row_records, texts, ids)
    buffer.rewards[:] = torch.tensor([s.reward for s in scored])
    buffer.correct[:] = torch.tensor([s.correct for s in scored])
    failed = [(s, r) for s, r in zip(scored, row_records) if s.error is not None]
    if failed:
        rank_zero_warn(f"reward error (scored {failed[0][0].reward}) on a completion of "
                       f"{prompt_text(failed[0][1])!r}: {failed[0][0].error}")
    buffer.reward_errors = len(failed)
    buffer.reward_parts = reward_parts(scored)
    buffer.completion_texts = texts
    buffer.prompt_texts = [prompt_text(record) for record in row_records]
