"""The shipped multi-step tool task with a reward per turn (configs/tools_stock.yaml; issue 58): a stockroom whose
kinds of item are counted one call at a time into a register, then submitted.

``Stockroom`` is an environment written to TRL 1.16's ``environment_factory`` contract plus the per-turn shape
``ToolTask(turn_rewards="environment")`` reads (``rewards``, one entry per call, and ``finished``;
docs/guide.md#rewards-per-turn). A row names how many kinds the shop stocks (2 to 4, numbered from 1) and holds each
kind's stock, which only ``count`` reveals: the model must call ``count`` once per kind (at least two calls), then
``submit`` (at least three calls in all). Each call's reward:

- ``count(item)`` of a kind on the list not yet counted: ``USEFUL`` (+0.2); of a kind counted already or not on the
  list: ``WASTED`` (-0.2);
- ``look(item)`` (the distractor: where a kind is shelved, which the task never needs): ``WASTED``;
- ``submit()``: ``SOLVED`` (+1) when every kind was counted, else 0; it ends the episode.

An episode's return is the sum of its calls' rewards: 1 + 0.2 * kinds for the plan with no wasted call, at most
0.2 * 4 = 0.8 for an episode that does not solve (so ``success_reward: 1.0`` tells them apart while at most one call
is wasted per kind). The model names kinds by number and never copies a number from the conversation (a tiny model
cannot: data/tiny-qwen2-tools/BUILD.md).
"""

from __future__ import annotations

import random
from typing import Any

USEFUL, WASTED, SOLVED = 0.2, -0.2, 1.0
KINDS = (2, 3, 4)  # kinds of item a shop stocks
SYLLABLES = ("ka", "lo", "mi", "ren", "sa", "to", "vi", "dor", "pel", "nu", "bra", "fin", "gal", "hu", "jo", "qua")


def stock_rows(count: int, seed: int) -> list[dict[str, Any]]:
    """``count`` rows with distinct prompts: a shop's name (two or three syllables), how many kinds it stocks and
    each kind's stock (1 to 60): ``{"prompt": "Shop Kalo stocks 3 kinds of item, numbered 1 to 3. Count each kind
    into the register once, then submit.", "kinds": 3, "stock": [12, 40, 7]}``."""
    rng = random.Random(seed)
    rows: dict[str, dict[str, Any]] = {}
    while len(rows) < count:
        name = "".join(rng.choice(SYLLABLES) for _ in range(rng.choice((2, 3)))).capitalize()
        kinds = rng.choice(KINDS)
        prompt = (f"Shop {name} stocks {kinds} kinds of item, numbered 1 to {kinds}. Count each kind into the "
                  "register once, then submit.")
        rows.setdefault(prompt, {"prompt": prompt, "kinds": kinds, "stock": [rng.randint(1, 60) for _ in
                                                                                 range(kinds)]})
    return list(rows.values())


class Stockroom:
    """A shop's stockroom (TRL 1.16's ``environment_factory`` contract): ``reset(**row)`` takes the row's ``kinds``
    and ``stock``; its public methods are the tools; each call appends its reward to ``rewards`` and ``submit``
    sets ``finished`` (the shape ``ToolTask(turn_rewards="environment")`` reads)."""

    def reset(self, kinds: int, stock: list[int], **row: Any) -> None:
        self.kinds, self.stock = int(kinds), [int(s) for s in stock]
        self.counted: list[int] = []  # kinds counted, in call order (each once)
        self.register = 0
        self.rewards: list[float | None] = []
        self.finished = False

    def count(self, item: int) -> str:
        """Count one kind of item into the register.

        Args:
            item: The number of the kind to count.
        """
        if not isinstance(item, int) or not 1 <= item <= self.kinds:
            self.rewards.append(WASTED)
            return f"item {item} is not stocked here"
        if item in self.counted:
            self.rewards.append(WASTED)
            return f"item {item} was counted already"
        self.counted.append(item)
        self.register += self.stock[item - 1]
        self.rewards.append(USEFUL)
        return f"item {item}: {self.stock[item - 1]} counted, register {self.register}"

    def look(self, item: int) -> str:
        """Say on which shelf a kind of item is kept.

        Args:
            item: The number of the kind to look for.
        """
        self.rewards.append(WASTED)
        if not isinstance(item, int) or not 1 <= item <= self.kinds:
            return f"item {item} is not stocked here"
        return f"item {item} is on shelf {item * 3 % 7 + 1}"

    def submit(self) -> str:
        """Submit the register's total; this ends the task."""
        solved = sorted(self.counted) == list(range(1, self.kinds + 1))
        self.rewards.append(SOLVED if solved else 0.0)
        self.finished = True
        return f"submitted {self.register}"
