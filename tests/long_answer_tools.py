"""A tool that answers a megabyte (tests/test_tool_faults.py), named and documented as the shipped ``add``."""

from __future__ import annotations


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first number.
        b: The second number.
    """
    return str(a + b) * 1_000_000
