"""The one error type for a bad input or configuration (a leaf: every part may raise it, none is imported here)."""


class InputError(ValueError):
    """A bad input found before training starts: the message says which input and how to fix it. The ``lit-grpo``
    command prints it without a traceback and exits with code 2."""
