"""The shipped tool task's tools and reward (configs/tools.yaml): arithmetic over three operands with ``add`` and
``multiply`` tools, written as a TRL 1.16 user writes them (type hints, Google-style docstrings, TRL's reward
signature), named by import path in YAML."""

from __future__ import annotations

import random
from typing import Any


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first number.
        b: The second number.
    """
    return a + b


def multiply(a: int, b: int) -> int:
    """Multiply two integers.

    Args:
        a: The first number.
        b: The second number.
    """
    return a * b


def exact_answer(prompts: list[Any], completions: list[list[dict[str, Any]]], answer: list[str],
                 **columns: Any) -> list[float]:
    """1.0 where the conversation's last assistant message is exactly the row's answer, else 0.0 (TRL's
    conversational reward signature)."""
    return [float(str(completion[-1].get("content", "")).strip() == str(expected))
            for completion, expected in zip(completions, answer)]


def arithmetic_rows(count: int, seed: int) -> list[dict[str, Any]]:
    """``count`` distinct problems ``a+b+c`` or ``a*c+b`` (a, b in [10, 99], c in [2, 9]), each two tool calls from
    its answer: ``{"prompt": "What is 23*4+12?", "answer": "104", "steps": [["multiply", 23, 4], ["add", 92, 12]]}``."""
    rng = random.Random(seed)
    rows: dict[str, dict[str, Any]] = {}
    while len(rows) < count:
        a, b, c = rng.randint(10, 99), rng.randint(10, 99), rng.randint(2, 9)
        if rng.random() < 0.5:
            question, steps = f"{a}+{b}+{c}", [["add", a, b], ["add", a + b, c]]
            result = a + b + c
        else:
            question, steps = f"{a}*{c}+{b}", [["multiply", a, c], ["add", a * c, b]]
            result = a * c + b
        rows.setdefault(question, {"prompt": f"What is {question}?", "answer": str(result), "steps": steps})
    return list(rows.values())


class ArithmeticEnvironment:
    """The same problems as an environment written to TRL 1.16's ``environment_factory`` contract: ``reset(**row)``
    keeps the row's answer, the public methods are the tools, and the environment owns the reward: ``get_reward()``
    is 1.0 once ``submit`` was given the right answer."""

    def reset(self, answer: str, **row: Any) -> str | None:
        self.answer, self.submitted = int(answer), None
        return " Submit the result with the submit tool."

    def add(self, a: int, b: int) -> int:
        """Add two integers.

        Args:
            a: The first number.
            b: The second number.
        """
        return a + b

    def multiply(self, a: int, b: int) -> int:
        """Multiply two integers.

        Args:
            a: The first number.
            b: The second number.
        """
        return a * b

    def submit(self, result: int) -> str:
        """Submit the final result.

        Args:
            result: The value of the expression.
        """
        self.submitted = result
        return "submitted"

    def get_reward(self) -> float:
        return float(self.submitted == self.answer)
