"""Greedy evaluation on the task's held-out split, as the validation loader's batches: each batch of held-out prompts
is scored with the current policy's greedy completions (a multi-round task: greedy episodes and their returns) when
the loop reaches it. The module only accumulates what the batches carry (``lit_grpo.policy.evaluation``)."""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.data import Dataset

from lit_grpo.engines import RolloutEngine, SamplingSpec
from lit_grpo.rollout.reward_worker import RewardWorker
from lit_grpo.tasks import PromptRecord, Task


class HeldOutScores(Dataset):
    """Batches of held-out prompts, each scored on access by ``score(records) -> (rewards [B], correct [B])``:
    ``{"reward" (or "return" for a multi-round task): [B], "correct": [B] bool}``; or, sampled, by ``score(records)
    -> {figure: [B]}``, served as it is. A named evaluation set's batches also carry ``"set": name``
    (``rollout/eval_sets.py``), for the module to log each set apart."""

    def __init__(self, batches: list[list[PromptRecord]], score: Any, reward_name: str = "reward",
                 set_name: str | None = None) -> None:
        self.batches, self.score, self.reward_name, self.set_name = batches, score, reward_name, set_name

    def __len__(self) -> int:
        return len(self.batches)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        scores = self.score(self.batches[index])
        named = {} if self.set_name is None else {"set": self.set_name}
        if isinstance(scores, dict):  # a sampled evaluation's figures, named already (rollout/sampled.py)
            return {**scores, **named}
        rewards, correct = scores
        return {self.reward_name: rewards, "correct": correct, **named}


def greedy_completion_scores(task: Task, engine: RolloutEngine, scorer: Task | RewardWorker, tokenizer: Any,
                             records: list[PromptRecord], sampling: SamplingSpec) -> tuple[torch.Tensor, torch.Tensor]:
    """One greedy completion per prompt, scored by ``scorer`` (the task, or its reward worker): ``(rewards [B],
    correct [B])``."""
    prompt_ids = [task.prompt_ids(r, tokenizer) for r in records]
    completions = engine.generate(prompt_ids, 1, sampling)
    ids = [list(completion.token_ids) for (completion,) in completions]
    texts = [tokenizer.decode(row, skip_special_tokens=True).strip() for row in ids]
    scored = scorer.score_group(records, texts, ids)
    return torch.tensor([s.reward for s in scored]), torch.tensor([s.correct for s in scored])
