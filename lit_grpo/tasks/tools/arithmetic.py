"""The shipped tool task (configs/tools.yaml) and its variants, written as a TRL 1.16 user writes them (type hints,
Google-style docstrings, TRL's reward signature, TRL's ``environment_factory`` contract), named by import path in
YAML: arithmetic over three operands.

- ``Registers`` (the shipped configs): an environment that holds the operands in registers ``a``, ``b``, ``c``; its
  ``add`` and ``multiply`` tools combine registers into new ones (``r1``, ``r2``), and ``register_answer`` scores the
  final "The answer is X." by the register (or number) it names. The model writes register names, never numbers:
  a tiny model learns the plan (which tool, which registers) but not to copy multi-digit numbers (BUILD.md of
  ``data/tiny-qwen2-tools`` says what was tried).
- ``add``/``multiply`` tool functions with ``exact_answer``, and ``ArithmeticEnvironment`` (an environment that
  owns its reward through ``get_reward``): the same problems with numbers as arguments.
"""

from __future__ import annotations

import random
import re
from typing import Any

from lit_grpo.tasks.tools.calls import call_parts


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
    its answer, the operands in the order the question writes them: ``{"prompt": "What is 23*4+12?", "answer": "104",
    "steps": [["multiply", 23, 4], ["add", 92, 12]], "operands": [23, 4, 12]}``."""
    rng = random.Random(seed)
    rows: dict[str, dict[str, Any]] = {}
    while len(rows) < count:
        a, b, c = rng.randint(10, 99), rng.randint(10, 99), rng.randint(2, 9)
        if rng.random() < 0.5:
            question, steps, operands = f"{a}+{b}+{c}", [["add", a, b], ["add", a + b, c]], [a, b, c]
            result = a + b + c
        else:
            question, steps, operands = f"{a}*{c}+{b}", [["multiply", a, c], ["add", a * c, b]], [a, c, b]
            result = a * c + b
        rows.setdefault(question, {"prompt": f"What is {question}?", "answer": str(result), "steps": steps,
                                   "operands": operands})
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


REGISTERS_NOTE = " The numbers are in registers a, b and c, in the order written."


class Registers:
    """The problems as an environment written to TRL 1.16's ``environment_factory`` contract: ``reset(**row)``
    loads the row's operands into registers ``a``, ``b``, ``c`` and tells the model so (its text is added to the
    question); the public methods are the tools, each storing its result in the next register ``r1``, ``r2``, ...
    ``register_answer`` reads the registers to score the answer."""

    def reset(self, operands: list[int], **row: Any) -> str:
        self.values = dict(zip("abc", (int(x) for x in operands)))
        self.results = 0
        return REGISTERS_NOTE

    def add(self, x: str, y: str) -> str:
        """Add two registers and store the sum in a new register.

        Args:
            x: The name of the first register.
            y: The name of the second register.
        """
        return self._store(self._read(x) + self._read(y))

    def multiply(self, x: str, y: str) -> str:
        """Multiply two registers and store the product in a new register.

        Args:
            x: The name of the first register.
            y: The name of the second register.
        """
        return self._store(self._read(x) * self._read(y))

    def _read(self, name: str) -> int:
        if name not in self.values:
            raise KeyError(f"no register {name!r}; the registers are {', '.join(self.values)}")
        return self.values[name]

    def _store(self, value: int) -> str:
        self.results += 1
        name = f"r{self.results}"
        self.values[name] = value
        return f"{name} = {value}"


def answer_value(text: str, registers: dict[str, int]) -> int | None:
    """The value a final message "The answer is X." gives: register X's, or the number X; None for anything else."""
    match = re.fullmatch(r"\s*The answer is (\S+?)\.?\s*", text)
    if match is None:
        return None
    named = match.group(1)
    if named in registers:
        return registers[named]
    return int(named) if re.fullmatch(r"-?\d+", named) else None


def register_answer(prompts: list[Any], completions: list[list[dict[str, Any]]], answer: list[str],
                    environments: list[Registers], **columns: Any) -> list[float]:
    """1.0 where the last assistant message, "The answer is X.", names a register (or a number) holding the row's
    answer, else 0.0 (TRL's conversational reward signature, with the episodes' ``environments``)."""
    return [float(answer_value(str(completion[-1].get("content") or ""), environment.values) == int(expected))
            for completion, expected, environment in zip(completions, answer, environments)]


class RegisterNote:
    """``Registers``' note without its tools (TRL's ``environment_factory`` contract, ``reset`` only), for the MCP
    config (configs/tools_mcp.yaml), whose ``add``/``multiply`` come from an MCP server that keeps no registers."""

    def reset(self, **row: Any) -> str:
        return REGISTERS_NOTE


def replayed_answer(prompts: list[Any], completions: list[list[dict[str, Any]]], answer: list[str],
                    operands: list[list[int]], **columns: Any) -> list[float]:
    """``register_answer`` for tools that keep no registers (the MCP config's server,
    ``lit_grpo/mcp_tools/registers_server.py``): each episode's ``add`` and ``multiply`` calls are replayed in order
    on the row's operands by that server's rule (a result goes one past the highest result register among its
    operands; a call naming a register not yet held stores nothing), and the last message's register is read."""
    scores = []
    for completion, expected, numbers in zip(completions, answer, operands):
        values = dict(zip("abc", (int(x) for x in numbers)))
        for message in completion:
            for call in message.get("tool_calls") or []:
                try:
                    name, arguments = call_parts(call)
                    x, y = values[arguments["x"]], values[arguments["y"]]
                except (ValueError, KeyError, TypeError):  # malformed, or a register it does not hold
                    continue
                if name in ("add", "multiply"):
                    index = max((int(r[1:]) for r in (arguments["x"], arguments["y"]) if r.startswith("r")), default=0)
                    values[f"r{index + 1}"] = x + y if name == "add" else x * y
        final = str(completion[-1].get("content") or "") if completion else ""
        scores.append(float(answer_value(final, values) == int(expected)))
    return scores
