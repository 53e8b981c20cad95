"""A reward's exception is the reward's, whatever its class: one that raises ``KeyboardInterrupt`` or ``SystemExit``
fails its completions like one raising ``ValueError`` (named in the run's reward-error warning), while the user's
own Ctrl-C, arriving while a reward runs, still stops the run (and SIGTERM's ``Terminated`` too).

Both kinds of ``KeyboardInterrupt`` look alike once raised; what tells them apart is whether the SIGINT signal
arrived during the call. Python delivers signals to the main thread only, so there the call runs with SIGINT's
handler wrapped to note an arrival before it does what it did (raise ``KeyboardInterrupt``); in any other thread, and
in a reward worker (which ignores SIGINT: Ctrl-C is its parent's), no signal can raise one, so a
``KeyboardInterrupt`` there is always the reward's own.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

from lit_grpo.run.signals import Terminated

Answer = TypeVar("Answer")


@dataclass
class SigintWatch:
    arrived: bool = False  # a real SIGINT (Ctrl-C) reached this process while the watch was on


@contextmanager
def watching_sigint() -> Iterator[SigintWatch]:
    """Note whether SIGINT arrives while the block runs (main thread, with a Python handler installed: it is run as
    before, after the note); elsewhere the watch stays off, as no signal can raise there."""
    watch = SigintWatch()
    previous = signal.getsignal(signal.SIGINT)
    if threading.current_thread() is not threading.main_thread() or not callable(previous):
        yield watch
        return

    def noted(signum: int, frame: Any) -> Any:
        watch.arrived = True
        return previous(signum, frame)

    signal.signal(signal.SIGINT, noted)
    try:
        yield watch
    finally:
        if signal.getsignal(signal.SIGINT) is noted:  # one installed meanwhile by the block is left in place
            signal.signal(signal.SIGINT, previous)


def reward_outcome(call: Callable[[], Answer]) -> tuple[Answer | None, BaseException | None]:
    """``(answer, None)`` from reward code ``call``, or ``(None, error)`` for whatever it raised, ``SystemExit`` and
    its own ``KeyboardInterrupt`` included. The user's Ctrl-C during the call is raised on as a
    ``KeyboardInterrupt``, even when the reward caught it and raised something else or returned; SIGTERM's
    ``Terminated`` is raised on."""
    with watching_sigint() as watch:
        try:
            answer = call()
        except (Exception, SystemExit, KeyboardInterrupt) as error:  # noqa: BLE001 - user code fails alone
            if isinstance(error, Terminated) or (watch.arrived and isinstance(error, KeyboardInterrupt)):
                raise
            if watch.arrived:
                raise KeyboardInterrupt("Ctrl-C while a reward ran") from error
            return None, error
    if watch.arrived:  # the reward swallowed the user's Ctrl-C
        raise KeyboardInterrupt("Ctrl-C while a reward ran")
    return answer, None
