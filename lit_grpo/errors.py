"""The one error type for a bad input or configuration (a leaf: every part may raise it, none is imported here)."""

from __future__ import annotations

from collections.abc import Sequence


class InputError(ValueError):
    """A bad input found before training starts: the message says which input and how to fix it. The ``lit-grpo``
    command prints it without a traceback and exits with code 2."""


def refuse(heading: str, problems: Sequence[str]) -> None:
    """Raise one ``InputError`` listing every problem under ``heading``; nothing when there is none."""
    if problems:
        raise InputError(f"{heading}:\n  - " + "\n  - ".join(problems))
