"""The command's exit codes, decided here only: ``exit_code(outcome)``. ``cli/outcome.py`` names how the command
ended (an ``Outcome``) and asks; ``end_process`` ends the process with the code. Imports nothing heavy: the command
asks while its libraries are still loading (a Ctrl-C then)."""

from __future__ import annotations

import contextlib
import enum
import gc
import signal
import sys


class Outcome(enum.Enum):
    FINISHED = "the run finished"
    REFUSED_INPUT = "a bad input or configuration, refused before any work"
    BUG = "a bug in lit-grpo (its traceback shown)"
    FAILED = "the run stopped on a failure it explained (generation servers gone, a non-finite loss)"
    INTERRUPTED = "Ctrl-C during the run (the adapter as it was saved)"
    INTERRUPTED_BEFORE_TRAINING = "Ctrl-C before training began (nothing written)"
    TERMINATED = "SIGTERM, before or during the run"


EXIT_CODES: dict[Outcome, int] = {
    Outcome.FINISHED: 0,
    Outcome.REFUSED_INPUT: 2,
    Outcome.BUG: 1,  # as Python's own for an uncaught exception: the command lets a bug's traceback through
    Outcome.FAILED: 1,
    Outcome.INTERRUPTED: 1,  # Lightning's own after its Ctrl-C path
    Outcome.INTERRUPTED_BEFORE_TRAINING: 128 + signal.SIGINT,  # 130, the shell's convention
    Outcome.TERMINATED: 128 + signal.SIGTERM,  # 143: a scheduler reads "did not finish" (0 would be a finished job)
}


def exit_code(outcome: Outcome) -> int:
    return EXIT_CODES[outcome]


SIGTERM_EXIT = exit_code(Outcome.TERMINATED)


def end_process(code: int) -> None:
    """End the process with ``code`` as the interpreter does (the non-daemon threads joined, the exit hooks run: a
    vLLM server stopped, a temporary directory removed, the logs flushed), less its last full garbage collection:
    the objects alive now (torch, transformers, the model) are frozen out of it (``gc.freeze``), since walking them
    would spend seconds of the grace period a scheduler gives between SIGTERM and SIGKILL."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    gc.freeze()
    raise SystemExit(code)
