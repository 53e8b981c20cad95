"""Two-number addition with a verifiable exact-match reward (docs/guide.md#your-own-task-or-reward)."""

from __future__ import annotations

import random

from lit_grpo.errors import InputError
from lit_grpo.tasks.base import ExactMatchReward, PromptRecord, Task
from lit_grpo.tasks.splits import halves


class ArithmeticTask(Task):
    """Prompts ``"{a}+{b}="`` with a and b in ``[low, high]``; reward 1.0 iff the completion equals ``str(a + b)``.

    All pairs are enumerated once; ``heldout_size`` of them, drawn with ``split_seed``, are held out and never appear
    in training (nor in the tiny model's warm-start, which uses ``train_records``): the first half validates, the
    second half is the test split (``halves``). Every pair is in one of the three, so a test split could only be
    taken from training, which would change it.

    Args:
        low: smallest operand.
        high: largest operand.
        heldout_size: number of held-out pairs, validation and test together (1,000 by default: 500 each, so
            accuracy moves in steps of 0.2%).
        split_seed: seed of the split and of the training order.
        prompt_template: format string with ``{a}`` and ``{b}``.
        use_chat_template: see ``Task``.
    """

    def __init__(
        self,
        low: int = 10,
        high: int = 99,
        heldout_size: int = 1000,
        split_seed: int = 0,
        prompt_template: str = "{a}+{b}=",
        use_chat_template: bool = False,
    ) -> None:
        super().__init__(use_chat_template)
        if high < low:
            raise InputError(f"ArithmeticTask: low ({low}) must not exceed high ({high})")
        num_pairs = (high - low + 1) ** 2
        if not 0 < heldout_size < num_pairs:
            raise InputError(f"ArithmeticTask: heldout_size must be in (0, {num_pairs}) for operands {low}..{high}, "
                             f"got {heldout_size}")
        self.low, self.high, self.heldout_size = low, high, heldout_size
        self.split_seed, self.prompt_template = split_seed, prompt_template
        self.reward_fn = ExactMatchReward()

    def split(self) -> tuple[list[PromptRecord], list[PromptRecord], list[PromptRecord]]:
        pairs = [(a, b) for a in range(self.low, self.high + 1) for b in range(self.low, self.high + 1)]
        random.Random(self.split_seed).shuffle(pairs)
        records = [self.record(a, b) for a, b in pairs]
        return (records[self.heldout_size :], *halves(records[: self.heldout_size]))

    def record(self, a: int, b: int) -> PromptRecord:
        return {"prompt": self.prompt_template.format(a=a, b=b), "answer": str(a + b), "a": a, "b": b}
