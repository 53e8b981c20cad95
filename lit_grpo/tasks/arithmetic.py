"""Two-number addition with a verifiable exact-match reward (docs/guide.md#your-own-task-or-reward)."""

from __future__ import annotations

import random

from lit_grpo.errors import InputError
from lit_grpo.tasks.base import ExactMatchReward, PromptRecord, Task


class ArithmeticTask(Task):
    """Prompts ``"{a}+{b}="`` with a and b in ``[low, high]``; reward 1.0 iff the completion equals ``str(a + b)``.

    All pairs are enumerated once; ``heldout_size`` of them, drawn with ``split_seed``, form the held-out split and
    never appear in training (nor in the tiny model's warm-start, which uses ``train_records``).

    Args:
        low: smallest operand.
        high: largest operand.
        heldout_size: number of held-out pairs (at least 1,000 by default so accuracy moves in steps of 0.1%).
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

    def split(self) -> tuple[list[PromptRecord], list[PromptRecord]]:
        pairs = [(a, b) for a in range(self.low, self.high + 1) for b in range(self.low, self.high + 1)]
        random.Random(self.split_seed).shuffle(pairs)
        records = [self.record(a, b) for a, b in pairs]
        return records[self.heldout_size :], records[: self.heldout_size]

    def record(self, a: int, b: int) -> PromptRecord:
        return {"prompt": self.prompt_template.format(a=a, b=b), "answer": str(a + b), "a": a, "b": b}
