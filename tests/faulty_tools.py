"""Tools that fail (tests/test_tool_faults.py names them by import path, as a user would). Their names and
docstrings are the shipped tools' (``lit_grpo.tasks.tool_arithmetic``), so the model sees the very prompt it was
taught on and calls them as it calls those."""

from __future__ import annotations

import time


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first number.
        b: The second number.
    """
    raise RuntimeError("the adder is broken")


def multiply(a: int, b: int) -> int:
    """Multiply two integers.

    Args:
        a: The first number.
        b: The second number.
    """
    time.sleep(3600)  # past any tool_timeout, and past the test's own limit: waited for, the test fails
    return object()  # and then not JSON


class PickyArithmetic:
    """The shipped arithmetic environment's tools, with a reset that raises for a third of the rows (answers divisible
    by 3), as a user's environment may for rows it cannot use."""

    def reset(self, answer: str, **row: object) -> None:
        if int(answer) % 3 == 0:
            raise LookupError(f"no record for {answer}")
        self.answer = int(answer)

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
