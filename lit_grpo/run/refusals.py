"""Whose fault an exception is, for the command: a refusal of the user's input (one line, exit code 2) or a bug in
lit-grpo (its traceback and a request to report it, exit code 1).

lit-grpo refuses input with ``InputError`` only, so any other exception raised by lit-grpo's own code is a bug. An
exception raised while the command builds a class that is not lit-grpo's (a user's reward or task, a Lightning
logger, the ``Trainer``) is that class refusing the arguments the user's configuration gave it: the user's to fix,
named by its class. Lightning's ``MisconfigurationException`` is its refusal of a setting, whoever raised it.
"""

from __future__ import annotations

import types
from collections.abc import Iterator

from lightning.pytorch.utilities.exceptions import MisconfigurationException

from lit_grpo.errors import InputError

REPORT_BUG = "lit-grpo: this is a bug in lit-grpo, please report it with the traceback above"
OWN_MODULES = ("lit_grpo",)  # lit-grpo's package (its callbacks are lit_grpo.callbacks)
BUILDER_MODULES = ("jsonargparse", "lightning.pytorch.cli")  # they call the constructors; they refuse nothing here


def chain(error: BaseException) -> Iterator[BaseException]:
    """``error`` and every exception it was raised from or while handling, outermost first, each once."""
    seen: set[int] = set()
    pending: list[BaseException | None] = [error]
    while pending:
        current = pending.pop(0)
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        pending += [current.__cause__, current.__context__]


def module_of(frame: types.FrameType) -> str:
    return str(frame.f_globals.get("__name__", ""))


def is_within(module: str, packages: tuple[str, ...]) -> bool:
    return any(module == package or module.startswith(f"{package}.") for package in packages)


def class_being_built(error: BaseException) -> type | None:
    """The class whose constructor was running, outermost, when ``error`` was raised (None: no constructor was):
    the class the configuration named, since the builders' own frames are skipped."""
    traceback = error.__traceback__
    while traceback is not None:
        frame = traceback.tb_frame
        target = frame.f_locals.get("self") if frame.f_code.co_name == "__init__" else None
        if target is not None and not is_within(module_of(frame), BUILDER_MODULES):
            # a lazy_instance is a subclass jsonargparse made of the class the configuration named
            return next(c for c in type(target).__mro__ if not is_within(c.__module__, BUILDER_MODULES))
        traceback = traceback.tb_next
    return None


def raised_by_builder(error: BaseException) -> bool:
    """Whether ``error`` was raised in jsonargparse's own code: its check of a value against a type."""
    traceback = error.__traceback__
    while traceback is not None and traceback.tb_next is not None:
        traceback = traceback.tb_next
    return traceback is not None and is_within(module_of(traceback.tb_frame), ("jsonargparse",))


def lightning_refusal(error: MisconfigurationException) -> InputError:
    """Lightning's refusal of a setting, while the classes are built or once the run starts (a
    ``LearningRateMonitor`` without a logger): the user's to change, worded once."""
    return InputError(f"Lightning refused the configuration: {error}")


def input_refusal(error: BaseException) -> InputError | None:
    """The ``InputError`` to show for ``error`` raised while the configuration's classes were built; None when it
    is a bug in lit-grpo. jsonargparse wraps a class's refusal in its report of a union type's members, so the
    exceptions it was raised from are read too (the innermost is the refusal itself)."""
    for each in chain(error):
        if isinstance(each, InputError):
            return each
        if isinstance(each, MisconfigurationException):
            return lightning_refusal(each)
    root = error
    while root.__cause__ is not None:  # the union reports' "from": the refusal they wrap
        root = root.__cause__
    built = class_being_built(root)
    if built is None:
        return InputError(f"the configuration could not be built: {root}") if raised_by_builder(root) else None
    if is_within(built.__module__, OWN_MODULES):
        return None  # lit-grpo's classes refuse input with InputError: anything else they raise is a bug
    return InputError(f"{built.__module__}.{built.__qualname__} refused its arguments: {root}")
