"""The prompt cursor and the completion budget (docs/guide.md#layout): which training prompts come next, how many
completions the run has drawn, what the budget still pays for, and what the cursor indexes (the task's record, which
a resume onto another task is refused by). The one place that decides the budget is spent."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from lit_grpo.run.distributed import rank_share
from lit_grpo.tasks.base import PromptRecord, Task, prompt_text

FINGERPRINT_PROMPTS = 16  # the first training prompts hashed into a task's record


def task_record(task: Task) -> dict[str, Any]:
    """What a checkpoint's prompt cursor indexes: the task's class, its training split's size and a hash of its first
    prompts (strings and ints: checkpoints load with ``weights_only=True``), and, to name it, the first prompt and
    the data file, if any. Taken before any prompt is dropped for length (``run.resume.task_notes`` compares them)."""
    train = task.train_records()
    first = [prompt_text(train[i]) for i in range(min(len(train), FINGERPRINT_PROMPTS))]
    # jsonargparse's lazy_instance default (LazyInstance_X, over its own base class): the class X it stands for
    kind = next(c for c in type(task).__mro__ if not c.__name__.startswith("LazyInstance_")
                and not c.__module__.startswith("jsonargparse"))
    record = {"class": f"{kind.__module__}.{kind.__qualname__}", "train_prompts": len(train),
              "fingerprint": hashlib.sha256("\x1e".join(first).encode("utf-8")).hexdigest()[:16],
              "first_prompt": first[0][:60] if first else ""}
    if task.data_source() is not None:
        record["data"] = task.data_source()
    return record


@dataclass
class PromptCursor:
    """The loop state a checkpoint carries (``cursor``: the next training prompt; ``completions_generated``: every
    draw counted), this rank's place in the last draw (``share_start``), and the completion budget's arithmetic."""

    prompts_per_epoch: int
    group_size: int
    completion_budget: int | None = None
    cursor: int = 0
    completions_generated: int = 0
    share_start: int = 0
    task: dict[str, Any] | None = None  # the task's record (``task_record``), once taken

    def task_identity(self, task: Task) -> dict[str, Any]:
        """What the cursor indexes (``task_record``: strings and ints), taken once, before any prompt is dropped for
        length; a resume onto another task is refused by it (``run.resume.check_resume``)."""
        if self.task is None:
            self.task = task_record(task)
        return self.task

    def take(self, train: Sequence[PromptRecord], count: int | None, rank: int, world_size: int) -> list[PromptRecord]:
        """This rank's share of the next ``count`` (default ``prompts_per_epoch``) prompts of ``train``, wrapping
        around it; the cursor moves past all ranks' shares."""
        count = self.prompts_per_epoch if count is None else count
        self.share_start, size = rank_share(count, rank, world_size)
        records = [train[(self.cursor + self.share_start + i) % len(train)] for i in range(size)]
        self.cursor = (self.cursor + count) % len(train)
        return records

    def count(self, completions: int) -> None:
        """Count ``completions`` drawn (each one spends the budget, whatever becomes of it)."""
        self.completions_generated += completions

    def affordable_groups(self, wanted: int) -> int:
        """How many of ``wanted`` groups of ``group_size`` the remaining ``completion_budget`` pays for."""
        if self.completion_budget is None:
            return wanted
        # trees are not cut to the budget: their last epoch may overshoot it, which leaves nothing, not a debt
        return max(0, min(wanted, (self.completion_budget - self.completions_generated) // self.group_size))

    def budget_spent(self, drawing_ahead: bool) -> bool:
        """True once the budget cannot pay for another group: the run ends after this epoch (not while rollouts
        drawn ahead are still to be trained on)."""
        return self.completion_budget is not None and not drawing_ahead and self.affordable_groups(1) == 0

    def loop_state(self) -> dict[str, int]:
        return {"cursor": self.cursor, "completions_generated": self.completions_generated}

    def load_loop_state(self, state: dict[str, Any]) -> None:
        self.cursor = int(state["cursor"])
        self.completions_generated = int(state.get("completions_generated", 0))
