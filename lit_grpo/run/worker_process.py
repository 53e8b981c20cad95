"""What a forked worker process (the rewards' and the tools' with a timeout) does first: restore the signal defaults
it inherited from the trainer, die with its parent, and run torch ops on one thread."""

from __future__ import annotations

import ctypes
import signal
import sys
from collections.abc import Callable
from typing import Any

import torch


def die_with_parent() -> None:
    """Linux: have the kernel SIGKILL this process when its parent dies (elsewhere: a no-op)."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass


def become_worker() -> None:
    """The first lines of a forked worker's loop."""
    # a forked child inherits the trainer's signal handlers (Lightning's SIGTERM handler only sets a flag): restore
    # the defaults so terminate() ends it, and let it die with its parent, even one that was SIGKILLed
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle; it then ends this child
    die_with_parent()
    # the parent's OpenMP thread pool does not survive a fork: a torch op using it (a reward model's forward) would
    # wait forever for threads that do not exist in this process; one thread runs it inline
    torch.set_num_threads(1)


def fork_context() -> object:
    """A multiprocessing context that forks where it can (the worker then needs nothing pickled but its requests,
    and starts in milliseconds); a forked child cannot use CUDA once the parent has, so then it spawns."""
    import multiprocessing

    fork = "fork" in multiprocessing.get_all_start_methods() and not torch.cuda.is_initialized()
    return multiprocessing.get_context("fork" if fork else "spawn")


class WorkerTimedOut(Exception):
    """The child did not answer within the timeout (it was killed)."""


class WorkerDied(Exception):
    """The child died before answering (its exit code in ``exitcode``)."""

    def __init__(self, exitcode: int | None) -> None:
        super().__init__(f"exit code {exitcode}")
        self.exitcode = exitcode


READY = "ready"
STARTUP_LIMIT = 300.0  # seconds a child may take to start (a spawned one imports the libraries again)


def run_child(connection: Any, target: Callable[..., None], *args: Any) -> None:
    """A child's body: ``become_worker``, then say it is ready (a request's timeout runs from there, not from a
    spawned child's imports), then ``target``'s loop."""
    become_worker()
    connection.send(READY)
    target(connection, *args)


class ChildProcess:
    """A forked (or, after CUDA, spawned) child running ``target(connection, *args)`` after ``become_worker``, started
    at the first request and again after one that timed out or killed it. ``ask`` sends a request and waits for
    its answer at most ``timeout`` seconds; the child's loop ends when it receives None."""

    def __init__(self, target: Callable[..., None], args: tuple[Any, ...], name: str) -> None:
        self.target, self.args, self.name = target, args, name
        self._process: Any = None
        self._connection: Any = None

    @property
    def process(self) -> Any:
        """The child's ``multiprocessing.Process`` while one is started, else None."""
        return self._process

    def ask(self, request: Any, timeout: float) -> Any:
        """The child's answer to ``request``; ``WorkerTimedOut`` or ``WorkerDied`` (the child then killed). A
        request that cannot be pickled raises as ``Connection.send`` does, the child left as it was."""
        if self._process is None or not self._process.is_alive():
            self._start()
        try:
            self._connection.send(request)
            if self._connection.poll(timeout):
                return self._connection.recv()
            failure: Exception = WorkerTimedOut()
        except (EOFError, OSError):  # BrokenPipeError too: it died before or while answering
            self._process.join(timeout=5)  # reap it, for its exit code
            failure = WorkerDied(self._process.exitcode)
        self._stop(kill=True)
        raise failure

    def _start(self) -> None:
        """A fresh child, once it says it is ready; ``WorkerDied`` if it dies or stays silent for
        ``STARTUP_LIMIT`` seconds."""
        self._stop(kill=True)  # a dead child's pipe is closed, not leaked
        context: Any = fork_context()
        parent, child = context.Pipe()
        self._process = context.Process(target=run_child, args=(child, self.target, *self.args), daemon=True,
                                        name=self.name)
        self._connection = parent
        self._process.start()
        child.close()
        try:
            if self._connection.poll(STARTUP_LIMIT) and self._connection.recv() == READY:
                return
        except (EOFError, OSError):
            pass
        self._process.join(timeout=5)
        exitcode = self._process.exitcode
        self._stop(kill=True)
        raise WorkerDied(exitcode)

    def _stop(self, kill: bool) -> None:
        if self._process is None:
            return
        if not kill and self._process.is_alive():
            try:
                self._connection.send(None)
                self._process.join(timeout=5)
            except (BrokenPipeError, OSError):
                pass
        if self._process.is_alive():
            self._process.kill()
            self._process.join()
        self._connection.close()
        self._process, self._connection = None, None

    def close(self) -> None:
        """End the child (idempotent)."""
        self._stop(kill=False)
