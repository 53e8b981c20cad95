"""SIGTERM stops a run as Ctrl-C does: now, wherever it is (generating, scoring, waiting for a draw ahead,
training), keeping what is finished, and with an exit code a scheduler reads as "did not finish".

A scheduler sends SIGTERM some seconds before SIGKILL (SLURM, Kubernetes: 30 s by default). Lightning's own SIGTERM
handler only sets a flag that its loops read between training batches, so a run in the middle of a generation went
on until it was killed, and one that reached the check ended with exit code 0, which reads as success. Here the
handler raises ``Terminated`` (a ``KeyboardInterrupt``) in the main thread at once: Lightning then runs the same path
as for Ctrl-C (the callbacks' ``on_exception``: the adapter as it was is saved, the resume command printed; a draw
ahead is abandoned on its daemon thread), and the command exits with ``SIGTERM_EXIT``.

Exit codes of an interrupted run: 143 (128 + SIGTERM, the shell's convention) after SIGTERM, 1 after Ctrl-C. Either
way the last epoch's checkpoint is the resume point (``--ckpt_path last``), so a scheduler may requeue the job with
the same command plus ``--ckpt_path last``.

Under DDP each rank stops on its own signal (a launcher or scheduler signals every rank; rank 0 also forwards the
signal to the ranks it launched), and no collective runs on the way out, so none waits at a barrier for a rank that
has stopped.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

SIGTERM_EXIT = 128 + signal.SIGTERM  # 143


class Terminated(KeyboardInterrupt):
    """Raised in the main thread by SIGTERM. A ``KeyboardInterrupt``: Lightning handles it as Ctrl-C, and user code
    that catches ``Exception`` (a reward function, say) does not swallow it."""


class _State:
    terminated = False  # a SIGTERM arrived
    stopping = False  # the run is already on its way out (a Ctrl-C or a SIGTERM is being handled)
    deferring = 0  # inside ``deferred()``: a checkpoint is being written
    pending = False  # a SIGTERM arrived while deferring: raised when the block ends


state = _State()


def stop_now(trainer: Any = None) -> Callable[[int, Any], None]:
    """The SIGTERM handler: the first signal raises ``Terminated`` where the main thread stands (and is forwarded to
    the processes ``trainer``'s launcher started); one arriving while the run stops is noted, not raised, so it cannot
    cut the adapter's save short."""

    def handler(signum: int, frame: Any) -> None:
        if state.terminated:
            return
        state.terminated = True
        launcher = getattr(getattr(trainer, "strategy", None), "launcher", None)
        if launcher is not None:
            # the ranks it launched stop too (a scheduler may have signalled rank 0 only); one already gone needs none
            with contextlib.suppress(Exception):
                launcher.kill(signum)
        if state.stopping:
            return
        if state.deferring:
            state.pending = True
            return
        state.stopping = True
        raise Terminated(f"received signal {signum} (SIGTERM)")

    return handler


@contextmanager
def deferred() -> Iterator[None]:
    """A SIGTERM arriving inside the block stops the run when the block ends: a checkpoint being written is
    finished first (its temporary file would otherwise be dropped, and with it the epoch just trained)."""
    state.deferring += 1
    try:
        yield
    finally:
        state.deferring -= 1
    if state.pending and not state.deferring and not state.stopping:
        state.pending, state.stopping = False, True
        raise Terminated("received SIGTERM while a checkpoint was written")


def deferring(hook: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(hook)
    def run(*args: Any, **kwargs: Any) -> Any:
        with deferred():
            return hook(*args, **kwargs)
    run.__lit_grpo_deferring__ = True  # type: ignore[attr-defined]
    return run


CHECKPOINT_HOOKS = ("on_train_epoch_end", "on_validation_end", "on_train_batch_end")


def checkpoints_finish_first(trainer: Any) -> None:
    """The hooks in which the trainer's checkpoint callbacks write (``CHECKPOINT_HOOKS``) run to their end before
    a SIGTERM stops the run: an epoch that ended keeps its checkpoint (``last_model_path`` names a file that is
    there)."""
    from lightning.pytorch.callbacks import Checkpoint

    for callback in trainer.callbacks:
        if not isinstance(callback, Checkpoint):
            continue
        for name in CHECKPOINT_HOOKS:
            hook = getattr(callback, name, None)
            if callable(hook) and not getattr(hook, "__lit_grpo_deferring__", False):
                setattr(callback, name, deferring(hook))


def hold() -> None:
    """The run is stopping (its ``on_exception`` hooks run): a later SIGTERM is noted but raises nothing."""
    state.stopping = True


def install(trainer: Any = None) -> Any:
    """Point SIGTERM at ``stop_now``; returns the handler it replaced (None off the main thread, where Python cannot
    set handlers)."""
    if threading.current_thread() is not threading.main_thread():
        return None
    return signal.signal(signal.SIGTERM, stop_now(trainer))


def forward_while_blocked(trainer: Any) -> None:
    """On the process that launched the other ranks, a thread forwards SIGTERM to them as soon as it arrives.
    Python runs a signal handler in the main thread only, between two bytecodes: one waiting inside a collective
    for a rank still generating would not run it before SIGKILL, if only this process was signalled (a container
    runtime signals its first process). Stopped, the other ranks close their connections, the collective fails,
    and this process stops as well."""
    launcher = getattr(trainer.strategy, "launcher", None)
    if not getattr(launcher, "procs", None) or threading.current_thread() is not threading.main_thread():
        return
    read, write = os.pipe()
    os.set_blocking(write, False)
    try:
        previous = signal.set_wakeup_fd(write, warn_on_full_buffer=False)
    except ValueError:
        previous = None
    if previous != -1:  # someone else reads the wakeup file descriptor: leave it to them
        if previous is not None:
            signal.set_wakeup_fd(previous)
        os.close(read)
        os.close(write)
        return

    def watch() -> None:
        while signal.SIGTERM not in os.read(read, 512):
            pass
        with contextlib.suppress(Exception):
            launcher.kill(signal.SIGTERM)

    threading.Thread(target=watch, name="lit-grpo-sigterm", daemon=True).start()


def take_over_from_lightning(trainer: Any) -> None:
    """Lightning registers its own SIGTERM handler at the start of every ``fit`` (after ``on_fit_start``, before
    the first epoch's rollouts), composing it with the one in place; its part only sets a flag for its loops and,
    under DDP, broadcasts from inside the handler. Right after it registers, SIGTERM is ours alone; Lightning's
    teardown restores the handler it found (``install``'s, from ``main``)."""
    connector = getattr(trainer, "_signal_connector", None)
    register = getattr(connector, "register_signal_handlers", None)
    if register is None:  # another Lightning: its handler calls ours after its own, which still stops the run
        return

    @functools.wraps(register)
    def register_then_take_sigterm() -> None:
        register()
        install(trainer)
        checkpoints_finish_first(trainer)
        forward_while_blocked(trainer)

    connector.register_signal_handlers = register_then_take_sigterm


def quick_exit(code: int) -> None:
    """End the process as the interpreter would, less its last garbage collection and module teardown: those walk
    every object (torch, transformers, the model), seconds on a loaded machine out of a grace period of some
    seconds. What an exit must still do runs first: the non-daemon threads are joined (a checkpoint being written)
    and the exit hooks run (a vLLM server stopped, a temporary directory removed, the logs flushed)."""
    try:
        threading._shutdown()  # type: ignore[attr-defined]  # what Py_FinalizeEx runs first
        atexit._run_exitfuncs()
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
    except Exception:  # noqa: BLE001 - another Python: the ordinary exit, slower
        return
    os._exit(code)


def exits_on_sigterm(main: Callable[..., Any]) -> Callable[..., Any]:
    """``main`` with SIGTERM handled by ``stop_now`` from its first line, and the process's exit code
    ``SIGTERM_EXIT`` whenever a SIGTERM stopped it (Lightning ends an interrupted fit with exit code 1; the run's
    callbacks have said what was kept and how to resume). Called without arguments, ``main`` is the process (its
    command line is ``sys.argv``), which then ends at once (``quick_exit``); called with arguments (from Python), it
    raises ``SystemExit`` as usual. The previous handler is restored on return."""

    @functools.wraps(main)
    def run(*args: Any, **kwargs: Any) -> Any:
        state.terminated = state.stopping = state.pending = False
        state.deferring = 0
        the_process = not args and not kwargs
        previous = install()
        try:
            return main(*args, **kwargs)
        except Terminated:  # outside the trainer's own handling: before its fit started, or after it ended
            print("lit-grpo: stopped by SIGTERM before training began; nothing was written to resume from",
                  file=sys.stderr, flush=True)
            code: Any = SIGTERM_EXIT
        except SystemExit as exit:
            if not (state.terminated and exit.code not in (0, None)):
                raise
            code = SIGTERM_EXIT
        finally:
            if previous is not None:
                signal.signal(signal.SIGTERM, previous)
        if the_process:
            quick_exit(code)
        raise SystemExit(code)
    return run
