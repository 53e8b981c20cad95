"""The seed's toy: sort a short list of digits, with partial-credit rewards (docs/guide.md#your-own-task-or-reward)."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Literal

from lit_grpo.errors import InputError
from lit_grpo.tasks.base import PromptRecord, Reward, Task, WeightedRewards


def parse_items(text: str) -> list[int | None]:
    """``"0,1,x,3"`` -> ``[0, 1, None, 3]``: an item that is not an integer matches nothing."""
    items: list[int | None] = []
    for part in text.strip().split(","):
        try:
            items.append(int(part))
        except ValueError:
            items.append(None)
    return items


def sort_distance(prompt_items: Sequence[int], response_items: Sequence[int | None]) -> int:
    """Number of positions where the response equals the sorted prompt, over the shorter of the two."""
    return sum(1 for want, got in zip(sorted(prompt_items), response_items) if want == got)


def inclusion_ordering(prompt_items: Sequence[int], response_items: Sequence[int | None]) -> int:
    """Prompt items present in the response, plus adjacent response pairs in non-decreasing order.

    Pairs are counted within the first ``min(len(prompt), len(response))`` positions, so padding an answer with
    more ascending items earns nothing.
    """
    present = set(response_items)
    inclusion = sum(1 for item in prompt_items if item in present)
    scored = response_items[: len(prompt_items)]
    pairs = zip(scored, scored[1:])
    ordering = sum(1 for x, y in pairs if x is not None and y is not None and x <= y)
    return inclusion + ordering


class SortDistanceReward(Reward):
    """``sort_distance`` of the record's ``items`` and the parsed completion."""

    def __call__(self, prompt_record: PromptRecord, completion_text: str, completion_ids: Sequence[int]) -> float:
        return float(sort_distance(prompt_record["items"], parse_items(completion_text)))


class InclusionOrderingReward(Reward):
    """``inclusion_ordering`` of the record's ``items`` and the parsed completion."""

    def __call__(self, prompt_record: PromptRecord, completion_text: str, completion_ids: Sequence[int]) -> float:
        return float(inclusion_ordering(prompt_record["items"], parse_items(completion_text)))


SORT_REWARDS = {"sort_distance": SortDistanceReward, "inclusion_ordering": InclusionOrderingReward}


class SortTask(Task):
    """Prompts ``"sort:3,1,0,2="``, answer ``"0,1,2,3"``: distinct digits, ``min_len`` to ``max_len`` of them.

    Args:
        min_len: shortest list.
        max_len: longest list (at most 10 distinct digits).
        num_train: number of training lists.
        heldout_size: number of validation lists, disjoint from the training ones.
        test_size: number of test lists, disjoint from both: drawn after the others, so the training and validation
            lists are those of a task without them.
        split_seed: seed of the lists.
        rewards: which partial-credit rewards to use (summed with ``reward_weights``).
        reward_weights: one weight per reward; 1 each by default.
        use_chat_template: see ``Task``.
    """

    def __init__(
        self,
        min_len: int = 3,
        max_len: int = 5,
        num_train: int = 10000,
        heldout_size: int = 500,
        split_seed: int = 0,
        rewards: list[Literal["sort_distance", "inclusion_ordering"]] = ["sort_distance"],  # noqa: B006
        reward_weights: list[float] | None = None,
        use_chat_template: bool = False,
        test_size: int = 500,
    ) -> None:
        super().__init__(use_chat_template)
        if not 1 <= min_len <= max_len <= 10:
            raise InputError(f"SortTask: need 1 <= min_len <= max_len <= 10, got {min_len}, {max_len}")
        unknown = [name for name in rewards if name not in SORT_REWARDS]
        if unknown:
            raise InputError(f"SortTask: unknown sort rewards {unknown}; valid choices: {', '.join(SORT_REWARDS)}")
        self.min_len, self.max_len, self.split_seed = min_len, max_len, split_seed
        if test_size < 1:
            raise InputError(f"SortTask: test_size must be at least 1, got {test_size}")
        self.num_train, self.heldout_size, self.test_size = num_train, heldout_size, test_size
        self.reward_fn = WeightedRewards([SORT_REWARDS[name]() for name in rewards], reward_weights)

    def split(self) -> tuple[list[PromptRecord], list[PromptRecord], list[PromptRecord]]:
        """Distinct lists in the order drawn: ``heldout_size`` validating, ``num_train`` training, then
        ``test_size`` testing."""
        after_validation, validation = self.drawn_lists()
        return after_validation[: self.num_train], validation, after_validation[self.num_train :]

    def drawn_lists(self) -> tuple[list[PromptRecord], list[PromptRecord]]:
        """``(the lists drawn after the validation ones, the validation lists)``."""
        rng = random.Random(self.split_seed)
        seen: set[tuple[int, ...]] = set()
        records: list[PromptRecord] = []
        wanted = self.num_train + self.heldout_size + self.test_size
        for _ in range(50 * wanted):
            if len(records) == wanted:
                break
            items = tuple(rng.sample(range(10), rng.randint(self.min_len, self.max_len)))
            if items not in seen:
                seen.add(items)
                records.append(self.record(list(items)))
        if len(records) < wanted:
            raise InputError(f"SortTask: only {len(records)} distinct lists exist for these lengths; lower num_train")
        return records[self.heldout_size :], records[: self.heldout_size]

    @staticmethod
    def record(items: list[int]) -> PromptRecord:
        text = ",".join(str(item) for item in items)
        return {"prompt": f"sort:{text}=", "answer": ",".join(str(i) for i in sorted(items)), "items": items}
