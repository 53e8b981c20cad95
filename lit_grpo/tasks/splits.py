"""A task's three splits and the rules that divide held-out prompts (docs/guide.md#validation-and-test-prompts)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

Record = dict[str, Any]  # a prompt record (``lit_grpo.tasks.base.PromptRecord``)


@dataclass(frozen=True)
class Splits:
    """A task's prompts: ``train`` in the order epochs consume them; ``validation`` (what ``validate``, every
    validation during ``fit`` and the calibrations read) and ``test`` (what ``test`` reads, the split nobody selects
    on), both disjoint from training and from each other. ``test`` is ``None`` for a task whose ``split()`` gives
    only ``(training, held-out)``."""

    train: Sequence[Record]
    validation: Sequence[Record]
    test: Sequence[Record] | None = None


def halves(records: Sequence[Record]) -> tuple[list[Record], list[Record]]:
    """``(validation, test)`` of a game's held-out records: the first half (rounded up) and the rest. Validation
    keeps the first records, so a validation of at most half of them reads the prompts it read before test
    splits existed."""
    cut = -(-len(records) // 2)
    return list(records[:cut]), list(records[cut:])


def given_splits(task_name: str, splits: Sequence[Sequence[Record]]) -> Splits:
    """``split()``'s answer as ``Splits``: three sequences, or the two of a task that predates test splits."""
    if len(splits) not in (2, 3):
        raise TypeError(f"{task_name}.split() must return (training, validation, test) records, got "
                        f"{len(splits)} sequences")
    return Splits(*splits)


def no_test_split_message(task_name: str, legacy: bool) -> str:
    """Why ``test`` cannot run on a task: it gives no test split, or an empty one."""
    if legacy:
        return (f"data.task: {task_name} gives no test split (its split() returns (training, held-out), and the "
                "held-out prompts are the validation split, which validations select on): return (training, "
                "validation, test) from split() to run lit-grpo test, or use lit-grpo validate")
    return (f"data.task: {task_name}'s test split is empty (too few held-out prompts to divide between validation "
            "and test): give more prompts, or a test split of their own")
