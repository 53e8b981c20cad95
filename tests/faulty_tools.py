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
    time.sleep(30)  # past any tool_timeout the test sets
    return object()  # and then not JSON
