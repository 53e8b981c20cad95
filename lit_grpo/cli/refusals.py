"""Whose fault an exception is, for the command: a refusal of the user's input (one line, exit code 2) or a bug in
lit-grpo (its traceback and a request to report it, exit code 1).

lit-grpo refuses input with ``InputError`` only, so any other exception raised by lit-grpo's own code is a bug. The
command builds every class its configuration names through ``build`` (jsonargparse's instantiator while
``building_classes`` is on; the ``Trainer`` directly), which knows the class it builds: an exception raised while
building a class that is not lit-grpo's (a user's reward or task, a Lightning logger, the ``Trainer``) is that class
refusing the arguments the user's configuration gave it, the user's to fix, named by its class. Lightning's
``MisconfigurationException`` is its refusal of a setting, whoever raised it; an error of jsonargparse's own types
is its refusal of a value.
"""

from __future__ import annotations

import argparse
import contextlib
import contextvars
import functools
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import jsonargparse
from lightning.pytorch.utilities.exceptions import MisconfigurationException

from lit_grpo.errors import InputError

REPORT_BUG = "lit-grpo: this is a bug in lit-grpo, please report it with the traceback above"
OWN_MODULES = ("lit_grpo",)  # lit-grpo's package (its callbacks are lit_grpo.callbacks)
BUILDER_MODULES = ("jsonargparse", "lightning.pytorch.cli")  # they call the constructors; they refuse nothing here

Built = TypeVar("Built")

# on while the command builds its classes: jsonargparse's instantiators are process-wide, and another parser in
# the same process keeps its own behaviour
building = contextvars.ContextVar("lit_grpo_building_classes", default=False)


def is_within(module: str, packages: tuple[str, ...]) -> bool:
    return any(module == package or module.startswith(f"{package}.") for package in packages)


def named_class(class_type: type) -> type:
    """The class the configuration named: a ``lazy_instance`` is a subclass jsonargparse made of it."""
    return next(c for c in class_type.__mro__ if not is_within(c.__module__, BUILDER_MODULES))


def build(class_type: Callable[..., Built], *args: Any, **kwargs: Any) -> Built:
    """``class_type(*args, **kwargs)``, with a class that is not lit-grpo's refusing its arguments (any
    ``Exception`` but an ``InputError`` or ``MisconfigurationException``, which say so themselves) turned into the
    ``InputError`` that names it. lit-grpo's own classes raise on unchanged: anything but an ``InputError`` from them
    is a bug."""
    return built_as(class_type, functools.partial(class_type, *args, **kwargs))


def built_as(named: Any, make: Callable[[], Built]) -> Built:
    """``make()``, which builds ``named`` (a class, or what a builder such as ``LightningCLI.instantiate_trainer``
    builds): its refusal of its arguments turned into the ``InputError`` that names it, as ``build`` does."""
    try:
        return make()
    except (InputError, MisconfigurationException):
        raise
    except Exception as error:
        refusal = refused_arguments(named, error)
        if refusal is None:
            raise
        raise refusal from error


def refused_arguments(class_type: Any, error: Exception) -> InputError | None:
    """``error``, raised by ``class_type``'s constructor, as the class's refusal of its arguments; None for
    lit-grpo's own classes (a bug)."""
    named = named_class(class_type) if isinstance(class_type, type) else class_type
    if is_within(getattr(named, "__module__", ""), OWN_MODULES):
        return None
    return InputError(f"{named.__module__}.{named.__qualname__} refused its arguments: {error}")


def instantiate(class_type: type[Built], *args: Any, **kwargs: Any) -> Built:
    """jsonargparse's instantiator of every class (``install_builder``): ``build`` while the command builds."""
    if building.get():
        return build(class_type, *args, **kwargs)
    return class_type(*args, **kwargs)


def install_builder() -> None:
    """Every class jsonargparse builds goes through ``instantiate`` (after LightningCLI's own instantiators of the
    model and data classes, which are lit-grpo's: registered on the parser, they are asked first)."""
    jsonargparse.add_instantiator(instantiate, object, subclasses=True)


@contextlib.contextmanager
def building_classes() -> Iterator[None]:
    token = building.set(True)
    try:
        yield
    finally:
        building.reset(token)


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


def lightning_refusal(error: MisconfigurationException) -> InputError:
    """Lightning's refusal of a setting, while the classes are built or once the run starts (a
    ``LearningRateMonitor`` without a logger): the user's to change, worded once."""
    return InputError(f"Lightning refused the configuration: {error}")


def input_refusal(error: BaseException) -> InputError | None:
    """The ``InputError`` to show for ``error`` raised while the configuration's classes were built; None when it
    is a bug in lit-grpo. jsonargparse wraps a class's refusal in its report of a union type's members, so the
    exceptions it was raised from are read too."""
    for each in chain(error):
        if isinstance(each, InputError):
            return each
        if isinstance(each, MisconfigurationException):
            return lightning_refusal(each)
    root = error
    while root.__cause__ is not None:  # the union reports' "from": the refusal they wrap
        root = root.__cause__
    if isinstance(root, argparse.ArgumentError) or is_within(type(root).__module__, ("jsonargparse",)):  # its own
        # check of a value against a type
        return InputError(f"the configuration could not be built: {root}")
    return None
