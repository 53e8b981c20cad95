"""SIGTERM stops a run as Ctrl-C does: now, wherever it is (generating, scoring, waiting for a draw ahead,
training), keeping what is finished, and with an exit code a scheduler reads as "did not finish".

A scheduler sends SIGTERM some seconds before SIGKILL (SLURM, Kubernetes: 30 s by default). Lightning's own SIGTERM
handler, registered at the start of every ``fit``/``validate``/``test``, kills the processes its launcher started,
sets ``trainer.received_sigterm``, and leaves the stop to its loops, which raise ``SIGTERMException`` between two
batches. That reaches neither a generation (drawn inside ``train_dataloader()``, before the epoch's first batch) nor
a scoring that hangs nor a hook that waits. So ``StopOnSigterm`` adds the smallest thing, with public APIs only:

* in its ``setup`` hook it installs ``stop_now`` with ``signal.signal``; Lightning, registering its handler after
  ``setup``, composes the two (its own first, then the one it found: ``tests/test_sigterm.py`` pins this).
  ``stop_now`` raises ``Terminated`` (a ``KeyboardInterrupt``) in the main thread at once, so Lightning runs its
  Ctrl-C path: the callbacks' ``on_exception`` (the adapter as it was is saved, the resume command printed), its
  teardown (a checkpoint still being written in the background is finished), exit code 1, which ``exits_on_sigterm``
  turns into ``SIGTERM_EXIT``;
* except while a checkpoint is being written (a ``Checkpoint`` callback's method or ``Trainer.save_checkpoint`` on
  the stack: cut short, the epoch just trained would lose its checkpoint, or ``last.ckpt`` its link): then the stop
  waits for the write to end (Lightning's own check after the hook, or ``stop_now``'s retry every ``RETRY_SECONDS``);
* under DDP Lightning's handler also broadcasts from inside the signal handler. On gloo the source of that broadcast
  waits until every rank has run the same handler, and a rank already waiting inside another collective never does
  (measured: both ranks hang until gloo's 30-minute timeout). So from the first hook after Lightning registered
  (``on_train_start``, ``on_validation_start``, ``on_test_start``, ``on_predict_start``) SIGTERM goes to
  ``stop_now`` alone; no collective runs on the way out, and no rank waits at a barrier for one that has stopped.
  Before that hook (the first epoch's generation of a DDP fit) Lightning's handler is in place;
* once the run is over the handler found at ``setup`` is SIGTERM's again: ``teardown`` puts it back, and after a
  run that raised (Lightning runs no teardown hook then, and its own teardown puts ``stop_now``'s handler back last)
  the first SIGTERM that finds the run over goes to it (``stop_during_run``), so a Python script's own handler, or
  the default action, is never swallowed by a run long over.

Exit codes of an interrupted run: 143 (128 + SIGTERM, the shell's convention) after SIGTERM, 1 after Ctrl-C. Either
way the last epoch's checkpoint is the resume point (``--ckpt_path last``), so a scheduler may requeue the job with
the same command plus ``--ckpt_path last``. Under DDP each rank stops on its own signal (a launcher or scheduler
signals every rank; rank 0 also forwards the signal to the ranks it launched, from a thread when its main thread
waits inside a collective).
"""

from __future__ import annotations

import contextlib
import functools
import gc
import os
import signal
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from types import FrameType
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Checkpoint
from lightning.pytorch.utilities.exceptions import SIGTERMException

SIGTERM_EXIT = 128 + signal.SIGTERM  # 143
RETRY_SECONDS = 0.05  # how often a stop held back by a checkpoint write looks again whether the write has ended

Handler = Callable[[int, Any], Any] | int | None


class Terminated(KeyboardInterrupt):
    """Raised in the main thread by SIGTERM. A ``KeyboardInterrupt``: Lightning handles it as Ctrl-C, and user code
    that catches ``Exception`` (or ``SystemExit``, as a reward function's guard does) does not swallow it."""


def stopped_by_sigterm(exception: BaseException) -> bool:
    """Whether ``exception`` is a SIGTERM's stop: ``stop_now``'s or Lightning's (its loops' ``SIGTERMException``)."""
    return isinstance(exception, (Terminated, SIGTERMException))


@dataclass
class StopState:
    terminated: bool = False  # a SIGTERM arrived
    stopping: bool = False  # the run is already on its way out (a Ctrl-C or a SIGTERM is being handled)
    pending: bool = False  # a SIGTERM arrived during a checkpoint write: raised when the write has ended
    alarm_handler: Handler = None  # SIGALRM's handler before a retry borrowed it


state = StopState()


def reset() -> None:
    stop_retrying()
    state.terminated = state.stopping = False


def writing_a_checkpoint(frame: FrameType | None) -> bool:
    """Whether the main thread's stack, from ``frame`` (where a signal found it), holds a checkpoint being written:
    a ``Checkpoint`` callback's method (its save and its ``last.ckpt`` link) or ``Trainer.save_checkpoint``."""
    save = pl.Trainer.save_checkpoint.__code__
    while frame is not None:
        if frame.f_code is save or isinstance(frame.f_locals.get("self"), Checkpoint):
            return True
        frame = frame.f_back
    return False


def forward(trainer: pl.Trainer | None, signum: int) -> None:
    """The ranks ``trainer``'s launcher started stop too (a scheduler may have signalled this process only)."""
    launcher = getattr(getattr(trainer, "strategy", None), "launcher", None)
    if launcher is not None:
        with contextlib.suppress(Exception):  # one already gone needs no signal
            launcher.kill(signum)


def stop_now(trainer: pl.Trainer | None = None) -> Callable[[int, Any], None]:
    """The SIGTERM handler: the first signal raises ``Terminated`` where the main thread stands (after a checkpoint
    write, if one is under way) and is forwarded to the ranks ``trainer``'s launcher started; one arriving while the
    run stops is noted, not raised, so it cannot cut the adapter's save short."""

    def handler(signum: int, frame: FrameType | None) -> None:
        if not state.terminated:
            state.terminated = True
            forward(trainer, signum)
        raise_unless_writing(frame)

    return handler


def stop_during_run(trainer: pl.Trainer, previous: Handler) -> Callable[[int, Any], None]:
    """``StopOnSigterm``'s handler: ``stop_now(trainer)`` while ``trainer`` runs (one of its methods on the main
    thread's stack: a fit, validate, test or predict, its way out included); once that run is over, however it
    ended, a SIGTERM gives the signal ``previous`` back and goes to it (``pass_on``). ``StopOnSigterm.teardown`` puts
    ``previous`` back when the run ends normally; after a run that raised, no hook of ours runs after Lightning's own
    teardown, which puts back the handler it found at its registration (this one), so this one retires itself."""
    stop = stop_now(trainer)

    def handler(signum: int, frame: FrameType | None) -> None:
        if frame is not None and not running(trainer, frame):
            pass_on(signum, frame, previous)
            return
        stop(signum, frame)

    return handler


def running(trainer: pl.Trainer, frame: FrameType | None) -> bool:
    """Whether the main thread's stack, from ``frame``, is inside one of ``trainer``'s own methods."""
    while frame is not None:
        if frame.f_locals.get("self") is trainer:
            return True
        frame = frame.f_back
    return False


def pass_on(signum: int, frame: FrameType | None, handler: Handler) -> None:
    """Give ``signum`` its ``handler`` back and deliver this signal to it as if it had been there all along: a Python
    handler is called, ``SIG_IGN`` ignores it, ``SIG_DFL`` (or None: not set from Python) takes the default action
    (for SIGTERM: the process ends)."""
    signal.signal(signum, handler if handler is not None else signal.SIG_DFL)
    if callable(handler):
        handler(signum, frame)
    elif handler != signal.SIG_IGN:
        signal.raise_signal(signum)


def raise_unless_writing(frame: FrameType | None) -> None:
    """Raise ``Terminated`` now, or, during a checkpoint write, look again in ``RETRY_SECONDS`` (``SIGALRM``)."""
    if state.stopping:
        return
    # a retry that finds an exception being handled finds the run on its way out already (Lightning's own SIGTERM
    # check stopped it after the write, and its on_exception hooks are running): raising now would replace that stop
    if writing_a_checkpoint(frame) or (state.pending and sys.exc_info()[1] is not None):
        if not state.pending:
            state.pending = True
            state.alarm_handler = signal.signal(signal.SIGALRM, lambda signum, later: raise_unless_writing(later))
        signal.setitimer(signal.ITIMER_REAL, RETRY_SECONDS)
        return
    stop_retrying()
    state.stopping = True
    raise Terminated(f"received signal {signal.SIGTERM} (SIGTERM)")


def stop_retrying() -> None:
    """Cancel a pending retry and give SIGALRM its handler back."""
    if state.pending:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, state.alarm_handler if state.alarm_handler is not None else signal.SIG_DFL)
        state.pending, state.alarm_handler = False, None


def hold() -> None:
    """The run is stopping (its ``on_exception`` hooks run): a later SIGTERM is noted but raises nothing."""
    state.stopping = True
    stop_retrying()  # Lightning's own check stopped the run first


def on_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def forward_while_blocked(trainer: pl.Trainer) -> None:
    """On rank 0, which launched the other ranks (when they were not launched by ``torchrun`` or a scheduler: then
    its launcher has none to signal), a thread forwards SIGTERM to them as soon as it arrives.
    Python runs a signal handler in the main thread only, between two bytecodes: one waiting inside a collective
    for a rank still generating would not run it before SIGKILL, if only this process was signalled (a container
    runtime signals its first process). Stopped, the other ranks close their connections, the collective fails,
    and this process stops as well."""
    if trainer.strategy.launcher is None or trainer.world_size == 1 or trainer.global_rank != 0 or not on_main_thread():
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
        forward(trainer, signal.SIGTERM)

    threading.Thread(target=watch, name="lit-grpo-sigterm", daemon=True).start()


class StopOnSigterm(pl.Callback):
    """SIGTERM stops the run at once wherever it stands (see this module's docstring); the handler found at ``setup``
    is put back at ``teardown``, or, after a run that raised (``teardown`` does not run then), by the first SIGTERM
    that finds the run over (``stop_during_run``), which goes to it."""

    def __init__(self) -> None:
        self.previous: Handler = None
        self.handler: Callable[[int, Any], None] | None = None

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if not on_main_thread():  # Python sets handlers on the main thread only
            return
        reset()  # a fit earlier in this process may have been stopped: this one starts unsignalled
        self.handler = stop_during_run(trainer, signal.getsignal(signal.SIGTERM))
        self.previous = signal.signal(signal.SIGTERM, self.handler)  # Lightning composes it with its own
        forward_while_blocked(trainer)

    def take_sigterm_under_ddp(self, trainer: pl.Trainer) -> None:
        """Under DDP, SIGTERM goes to ``stop_now`` alone from here: Lightning's handler broadcasts (see above)."""
        if self.handler is not None and trainer.world_size > 1 and on_main_thread():
            signal.signal(signal.SIGTERM, self.handler)

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.take_sigterm_under_ddp(trainer)

    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.take_sigterm_under_ddp(trainer)

    def on_test_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.take_sigterm_under_ddp(trainer)

    def on_predict_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.take_sigterm_under_ddp(trainer)

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        hold()  # the run is stopping (Lightning's own SIGTERM check may have come first): no retry may raise later

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        stop_retrying()  # a stop held back by a save after the last epoch (a user's save at the end of fit)
        if self.handler is not None and on_main_thread() and self.previous is not None:
            signal.signal(signal.SIGTERM, self.previous)
        self.handler = None


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


def exits_on_sigterm(main: Callable[..., Any]) -> Callable[..., Any]:
    """``main`` with SIGTERM handled by ``stop_now`` from its first line (``StopOnSigterm`` takes over during a
    run), and the process's exit code ``SIGTERM_EXIT`` whenever a SIGTERM stopped it (Lightning ends an interrupted
    fit with exit code 1, or none after its own ``SIGTERMException``; the run's callbacks have said what was kept and
    how to resume). Called without arguments, ``main`` is the process (its command line is ``sys.argv``), which then
    ends without the interpreter's last garbage collection (``end_process``); called with arguments (from Python),
    it raises ``SystemExit`` as usual. The previous handler is restored on return."""

    @functools.wraps(main)
    def run(*args: Any, **kwargs: Any) -> Any:
        reset()
        the_process = not args and not kwargs
        previous = signal.signal(signal.SIGTERM, stop_now()) if on_main_thread() else None
        try:
            return main(*args, **kwargs)
        except Terminated:  # outside the trainer's own handling: before its fit started, or after it ended
            print("lit-grpo: stopped by SIGTERM before training began; nothing was written to resume from",
                  file=sys.stderr, flush=True)
            code = SIGTERM_EXIT
        except SystemExit as exit:  # Lightning's: 1 after a Terminated, None after its own SIGTERMException
            if not state.terminated or exit.code == 0:
                raise
            code = SIGTERM_EXIT
        finally:
            stop_retrying()
            if previous is not None:
                signal.signal(signal.SIGTERM, previous)
        if the_process:
            end_process(code)
        raise SystemExit(code)
    return run
