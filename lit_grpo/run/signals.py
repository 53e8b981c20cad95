"""SIGTERM stops a run as Ctrl-C does: now, wherever it is (generating, scoring, waiting for a draw ahead,
training), keeping what is finished; ``run/exit_codes.py`` turns the stop into exit code 143.

A scheduler sends SIGTERM some seconds before SIGKILL (SLURM, Kubernetes: 30 s by default). Lightning's own handler
only sets ``trainer.received_sigterm`` for its loops to check between two batches, which reaches neither a
generation (inside ``train_dataloader()``) nor a scoring that hangs nor a hook that waits. ``StopOnSigterm`` adds the
smallest thing, with public APIs only: a ``SigtermStop``, one per run, a state machine driven by the callback's hooks

    IDLE --setup--> RUNNING
    RUNNING --on_train_epoch_end, on_validation_end, on_train_end, on_save_checkpoint--> WRITING_CHECKPOINT
    WRITING_CHECKPOINT --our next hook, trainer.current_epoch moved on, or HOLD_LIMIT_SECONDS--> RUNNING (a held stop
        raised then)
    RUNNING --Terminated raised, or on_exception--> STOPPING --the fit raised on (trainer.state.stage None)--> OVER
    any --teardown--> OVER

and its SIGTERM handler, which by state:

* RUNNING: raises ``Terminated`` (a ``KeyboardInterrupt``) in the main thread at once, so Lightning runs its Ctrl-C
  path: the callbacks' ``on_exception`` (the adapter as it was is saved, the resume command printed), its teardown (a
  checkpoint still being written in the background is finished);
* WRITING_CHECKPOINT: holds the stop back (cut short, the epoch just trained would lose its checkpoint, or
  ``last.ckpt`` its link). Lightning runs ``Checkpoint`` callbacks last in a hook, after ours, so the window opens
  in our hook of the same event; it closes at our next hook, which raises the held stop itself, or when
  ``trainer.current_epoch`` moves on ("updated after the epoch end hooks are run"), which a watcher thread sees and
  re-signals the main thread for (``signal.pthread_kill``; no other signal is borrowed);
* STOPPING: notes it and raises nothing (a second SIGTERM must not cut the adapter's save short). After Lightning's
  Ctrl-C path (its ``sys.exit(1)``) nothing marks the run over: a script that catches that ``SystemExit`` and goes
  on keeps this state until it puts its own handler back;
* OVER: gives SIGTERM the handler found at ``setup`` back and delivers the signal to it (a Python script's own
  handler, or the default action, is never swallowed by a run long over).

Lightning registers its handler after the callbacks' ``setup`` and composes it with ours (its own first, then
ours: ``tests/test_sigterm.py`` pins this). Under DDP its handler broadcasts from inside the signal handler; on gloo
the broadcast's source waits for every rank, and a rank inside another collective never comes (measured: both ranks
hang until gloo's 30-minute timeout). So from the first hook after Lightning registered (``on_train_start``,
``on_validation_start``, ``on_test_start``, ``on_predict_start``) SIGTERM goes to ours alone. Under DDP each rank
stops on its own signal; rank 0 also forwards it to the ranks it launched, from a thread when its main thread waits
inside a collective. The command's own handler before and after a run is ``command_stop`` (a ``SigtermStop``
without a trainer, always RUNNING).
"""

from __future__ import annotations

import contextlib
import enum
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.utilities.exceptions import SIGTERMException

from lit_grpo.run.exit_codes import Outcome

RETRY_SECONDS = 0.05  # how often a stop held back by a checkpoint write looks again whether the write has ended
# The longest a stop is held back: the window also spans the other epoch-end hooks (the module's last validation
# of a spent budget scores rewards, which may hang), and a scheduler kills 30 s after SIGTERM. The write itself
# takes well under this: the trained weights only, the file written in the background (cli/checkpoint_io.py).
HOLD_LIMIT_SECONDS = 10.0

Handler = Callable[[int, Any], Any] | int | None


class Terminated(KeyboardInterrupt):
    """Raised in the main thread by SIGTERM. A ``KeyboardInterrupt``: Lightning handles it as Ctrl-C, and user code
    that catches ``Exception`` (or ``SystemExit``, as a reward function's guard does) does not swallow it."""


def stopped_by_sigterm(exception: BaseException) -> bool:
    """Whether ``exception`` is a SIGTERM's stop: ours (``Terminated``), Lightning's (its loops'
    ``SIGTERMException``), or Lightning's ``sys.exit(1)`` raised while it handled our ``Terminated``."""
    if isinstance(exception, (Terminated, SIGTERMException)):
        return True
    return isinstance(exception, SystemExit) and isinstance(exception.__context__, Terminated)


def outcome_of_exit(stopped: SystemExit, terminated: bool) -> Outcome | None:
    """How a run that Lightning ended with ``SystemExit`` ended: its SIGTERM stop (``SIGTERMException``, or
    ``sys.exit(1)`` after ``Terminated`` or after a Ctrl-C during which a SIGTERM arrived too), or its Ctrl-C path
    (``sys.exit(1)`` after a ``KeyboardInterrupt``); None: a code someone else has decided (jsonargparse's refusal,
    ``--help``)."""
    if stopped_by_sigterm(stopped) or (terminated and stopped.code != 0):
        return Outcome.TERMINATED
    if isinstance(stopped.__context__, KeyboardInterrupt):
        return Outcome.INTERRUPTED
    return None


class Phase(enum.Enum):
    IDLE = "idle"  # no run yet: the handler is not installed
    RUNNING = "running"  # a SIGTERM raises Terminated at once
    WRITING_CHECKPOINT = "writing a checkpoint"  # a SIGTERM is held back until the write has ended
    STOPPING = "stopping"  # the run is on its way out: a SIGTERM is noted, nothing raised
    OVER = "over"  # the run has ended: a SIGTERM goes to the handler found at setup


def forward(trainer: pl.Trainer | None, signum: int) -> None:
    """The ranks ``trainer``'s launcher started stop too (a scheduler may have signalled this process only)."""
    launcher = getattr(getattr(trainer, "strategy", None), "launcher", None)
    if launcher is not None:
        with contextlib.suppress(Exception):  # one already gone needs no signal
            launcher.kill(signum)


def pass_on(signum: int, frame: FrameType | None, handler: Handler) -> None:
    """Give ``signum`` its ``handler`` back and deliver this signal to it as if it had been there all along: a Python
    handler is called, ``SIG_IGN`` ignores it, ``SIG_DFL`` (or None: not set from Python) takes the default action
    (for SIGTERM: the process ends)."""
    signal.signal(signum, handler if handler is not None else signal.SIG_DFL)
    if callable(handler):
        handler(signum, frame)
    elif handler != signal.SIG_IGN:
        signal.raise_signal(signum)


def on_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


class SigtermStop:
    """One run's SIGTERM state (module docstring). ``trainer`` None: the command's own stop, outside any run.
    ``handle`` is the signal handler; the other methods are the transitions the hooks drive."""

    def __init__(self, trainer: pl.Trainer | None = None, previous: Handler = None) -> None:
        self.trainer, self.previous = trainer, previous
        self.phase = Phase.IDLE if trainer is not None else Phase.RUNNING
        self.terminated = False  # a SIGTERM arrived
        self.pending = False  # a SIGTERM arrived during a checkpoint write: raised when the write has ended
        self.write_epoch: int | None = None  # trainer.current_epoch when the write window opened
        self.write_opened = 0.0  # time.monotonic() then
        self.watcher: threading.Thread | None = None
        # the command's stop around this run: it learns of a SIGTERM here too, for the exit code
        self.outer: SigtermStop | None = getattr(previous, "__self__", None)
        if not isinstance(self.outer, SigtermStop):
            self.outer = None

    def start(self) -> None:
        self.phase = Phase.RUNNING
        if self.trainer is not None and (self.watcher is None or not self.watcher.is_alive()):
            # started here, not in the handler: a thread's start takes a lock the interrupted code may hold
            self.watcher = threading.Thread(target=self.resignal_when_written, name="lit-grpo-sigterm-retry",
                                            daemon=True)
            self.watcher.start()

    def begin_write(self) -> None:
        """A checkpoint may be written from here (our hook runs before the ``Checkpoint`` callbacks' own)."""
        if self.phase in (Phase.RUNNING, Phase.WRITING_CHECKPOINT):
            self.phase = Phase.WRITING_CHECKPOINT
            self.write_epoch = self.trainer.current_epoch if self.trainer is not None else None
            self.write_opened = time.monotonic()

    def end_write(self) -> None:
        """A later hook: any write has ended; a stop held back by it is raised here, in the main thread (the flag
        cleared before the phase moves: the watcher must not see a held stop outside a write and signal it again)."""
        if self.pending and self.phase in (Phase.WRITING_CHECKPOINT, Phase.RUNNING) and on_main_thread():
            self.raise_stop()
        if self.phase is Phase.WRITING_CHECKPOINT:
            self.phase = Phase.RUNNING

    def stopping(self) -> None:
        """The run is on its way out (its ``on_exception`` hooks run): a later SIGTERM is noted, nothing raised."""
        if self.phase is not Phase.OVER:
            self.phase = Phase.STOPPING
        self.pending = False

    def finish(self) -> None:
        self.phase, self.pending = Phase.OVER, False

    def writing(self) -> bool:
        """Whether a checkpoint write may be in flight: the window is open, for less than ``HOLD_LIMIT_SECONDS``,
        and the epoch-end hooks it opened in have not all run (``trainer.current_epoch`` moves on after them)."""
        if self.phase is not Phase.WRITING_CHECKPOINT or time.monotonic() - self.write_opened > HOLD_LIMIT_SECONDS:
            return False
        return self.trainer is None or self.trainer.current_epoch == self.write_epoch

    def over(self) -> bool:
        """Whether the run has ended: torn down, or stopped on an exception that has left the trainer (Lightning
        sets ``trainer.state.stage`` to None after its teardown, then raises on)."""
        if self.phase is Phase.OVER:
            return True
        return self.phase is Phase.STOPPING and self.trainer is not None and self.trainer.state.stage is None

    def handle(self, signum: int, frame: FrameType | None) -> None:
        """The SIGTERM handler (module docstring: what each state does with it)."""
        if self.over():
            self.finish()
            pass_on(signum, frame, self.previous)
            return
        if not self.terminated:
            self.terminated = True
            forward(self.trainer, signum)
        if self.outer is not None:
            self.outer.terminated = True
        if self.phase is Phase.STOPPING:
            return
        # an exception being handled here is the run already on its way out (Lightning's own check stopped it after
        # the write; its on_exception hooks are about to run): raising now would replace that stop
        if self.writing() or (self.pending and sys.exc_info()[1] is not None):
            self.hold_back()
            return
        self.raise_stop()

    def raise_stop(self) -> None:
        self.pending = False
        self.phase = Phase.STOPPING
        raise Terminated(f"received signal {signal.SIGTERM} (SIGTERM)")

    def hold_back(self) -> None:
        """Keep the stop for when the write has ended (the handler only sets a flag: it may run anywhere)."""
        self.pending = True

    def resignal_when_written(self) -> None:
        """The run's watcher (started with it): a held stop is re-signalled to the main thread once the write has
        ended, in case no hook of ours comes first (the epoch-end hooks are followed by the next epoch's
        generation). Ends with the run."""
        main = threading.main_thread().ident
        while self.phase in (Phase.IDLE, Phase.RUNNING, Phase.WRITING_CHECKPOINT):
            time.sleep(RETRY_SECONDS)
            if self.pending and not self.writing() and main is not None:
                signal.pthread_kill(main, signal.SIGTERM)


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
    """SIGTERM stops the run at once wherever it stands (module docstring); its hooks drive the run's ``SigtermStop``
    (``self.stop``). The handler found at ``setup`` is put back at ``teardown``, or, after a run that raised
    (``teardown`` does not run then), by the first SIGTERM that finds the run over, which goes to it."""

    def __init__(self) -> None:
        self.stop: SigtermStop | None = None

    @property
    def handler(self) -> Callable[[int, Any], None] | None:
        return self.stop.handle if self.stop is not None else None

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if not on_main_thread():  # Python sets handlers on the main thread only
            return
        self.stop = SigtermStop(trainer, signal.getsignal(signal.SIGTERM))  # a fresh one: this run is unsignalled
        self.stop.start()
        signal.signal(signal.SIGTERM, self.stop.handle)  # Lightning composes it with its own
        forward_while_blocked(trainer)

    def take_sigterm_under_ddp(self, trainer: pl.Trainer) -> None:
        """Under DDP, SIGTERM goes to ours alone from here: Lightning's handler broadcasts (see above)."""
        if self.stop is not None and trainer.world_size > 1 and on_main_thread():
            signal.signal(signal.SIGTERM, self.stop.handle)

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.take_sigterm_under_ddp(trainer)

    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.take_sigterm_under_ddp(trainer)
        self.end_write()

    def on_test_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.take_sigterm_under_ddp(trainer)

    def on_predict_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.take_sigterm_under_ddp(trainer)

    # the hooks a Checkpoint callback writes in: Lightning calls Checkpoint callbacks last, after this one
    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.begin_write()

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.begin_write()

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.begin_write()

    def on_save_checkpoint(self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: Any) -> None:
        self.begin_write()  # any save, whoever called trainer.save_checkpoint

    # the hooks that come after a write
    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.end_write()

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any,
                             batch_idx: int) -> None:
        self.end_write()

    def begin_write(self) -> None:
        if self.stop is not None:
            self.stop.begin_write()

    def end_write(self) -> None:
        if self.stop is not None:
            self.stop.end_write()

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        if self.stop is not None:
            self.stop.stopping()  # Lightning's own SIGTERM check may have come first: nothing may raise later

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if self.stop is None:
            return
        self.stop.finish()  # a stop held back by a save after the last epoch is dropped: the run has finished
        if on_main_thread() and self.stop.previous is not None:
            signal.signal(signal.SIGTERM, self.stop.previous)


def hold(trainer: pl.Trainer) -> None:
    """The run is stopping (an ``on_exception`` hook saves what it can): a later SIGTERM is noted, nothing raised.
    For a callback that may run before ``StopOnSigterm``'s own ``on_exception``."""
    for callback in trainer.callbacks:
        if isinstance(callback, StopOnSigterm) and callback.stop is not None:
            callback.stop.stopping()


@contextlib.contextmanager
def command_stop() -> Iterator[SigtermStop]:
    """SIGTERM raises ``Terminated`` from here (``StopOnSigterm`` takes over during a run); the previous handler
    is put back on the way out."""
    stop = SigtermStop()
    previous = signal.signal(signal.SIGTERM, stop.handle) if on_main_thread() else None
    try:
        yield stop
    finally:
        stop.finish()
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
