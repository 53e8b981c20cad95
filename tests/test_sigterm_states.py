"""SIGTERM's state machine (run/signals.py's ``SigtermStop``) one transition at a time with a stand-in trainer; the
command's exit-code table (run/exit_codes.py) and how cli/outcome.py names a run's end; refusals told where a class is
built (cli/refusals.py); and no frame walking anywhere in the package."""

from __future__ import annotations

import re
import signal
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from lightning.pytorch.utilities.exceptions import SIGTERMException

from lit_grpo.cli import refusals
from lit_grpo.errors import InputError
from lit_grpo.run import signals
from lit_grpo.run.exit_codes import EXIT_CODES, Outcome, exit_code
from lit_grpo.run.signals import (
    Phase,
    SigtermStop,
    StopOnSigterm,
    Terminated,
    outcome_of_exit,
)

ROOT = Path(__file__).resolve().parents[1]


def stand_in_trainer(epoch: int = 0) -> Any:
    """What ``SigtermStop`` reads of a trainer: its epoch, its stage (None once a run that raised is over), and a
    strategy without a launcher (nothing to forward the signal to)."""
    return SimpleNamespace(current_epoch=epoch, state=SimpleNamespace(stage="train"),
                           strategy=SimpleNamespace(launcher=None))


def running_stop(trainer: Any = None, previous: Any = None) -> SigtermStop:
    stop = SigtermStop(trainer if trainer is not None else stand_in_trainer(), previous)
    assert stop.phase is Phase.IDLE
    stop.start()
    return stop


@pytest.fixture
def installed():
    """Puts back SIGTERM's handler after a test that installs one (a watcher re-signals through it)."""
    previous = signal.getsignal(signal.SIGTERM)
    yield
    signal.signal(signal.SIGTERM, previous)


def test_running_a_sigterm_raises_at_once_and_a_second_one_while_stopping_raises_nothing():
    stop = running_stop()
    with pytest.raises(Terminated):
        stop.handle(signal.SIGTERM, None)
    assert (stop.phase, stop.terminated) == (Phase.STOPPING, True)
    stop.handle(signal.SIGTERM, None)  # the stop under way goes on
    assert stop.phase is Phase.STOPPING


def test_during_a_write_the_stop_is_held_back_and_raised_by_the_next_hook():
    stop = running_stop()
    stop.begin_write()
    assert stop.phase is Phase.WRITING_CHECKPOINT
    stop.handle(signal.SIGTERM, None)  # held back: nothing raised
    assert stop.pending and stop.terminated
    with pytest.raises(Terminated):
        stop.end_write()
    assert (stop.phase, stop.pending) == (Phase.STOPPING, False)


def test_a_stop_is_held_back_no_longer_than_the_limit(installed, monkeypatch):
    # the window spans every epoch-end hook (a spent budget's last validation scores rewards, which may hang): the
    # watcher raises the stop once it has been held HOLD_LIMIT_SECONDS, whatever the hooks do
    monkeypatch.setattr(signals, "HOLD_LIMIT_SECONDS", 0.3)
    stop = running_stop()
    signal.signal(signal.SIGTERM, stop.handle)
    stop.begin_write()
    stop.handle(signal.SIGTERM, None)
    assert stop.pending  # held back at first
    with pytest.raises(Terminated):
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            time.sleep(0.01)
    assert time.monotonic() - stop.write_opened >= 0.3 and stop.phase is Phase.STOPPING


def test_a_write_window_without_a_stop_closes_quietly():
    stop = running_stop()
    stop.begin_write()
    stop.end_write()
    assert stop.phase is Phase.RUNNING and not stop.terminated


def test_a_held_stop_is_raised_once_the_epoch_end_hooks_are_over(installed):
    # no hook of ours follows an epoch's end (the next epoch's generation comes first): trainer.current_epoch moving
    # on closes the window, and the watcher re-signals the main thread
    trainer = stand_in_trainer(epoch=0)
    stop = running_stop(trainer)
    signal.signal(signal.SIGTERM, stop.handle)
    stop.begin_write()
    stop.handle(signal.SIGTERM, None)
    time.sleep(4 * 0.05)
    assert stop.pending and stop.phase is Phase.WRITING_CHECKPOINT  # still writing: still held
    events = []
    with pytest.raises(Terminated):
        trainer.current_epoch = 1  # Lightning's "updated after the epoch end hooks are run"
        deadline = time.monotonic() + 60  # generous: the watcher looks every 0.05 s
        while time.monotonic() < deadline:
            time.sleep(0.01)
        events.append("not stopped")
    assert events == [] and stop.phase is Phase.STOPPING
    assert signal.getsignal(signal.SIGALRM) is signal.SIG_DFL  # no other signal borrowed


def test_a_held_stop_that_finds_the_run_stopping_on_an_exception_does_not_raise_over_it(installed):
    # Lightning's own check stopped the run after the write; a re-signal while its exception is being handled (before
    # the on_exception hooks) must not replace that stop, and once they ran nothing is raised any more
    trainer = stand_in_trainer()
    stop = running_stop(trainer)
    signal.signal(signal.SIGTERM, stop.handle)
    stop.begin_write()
    stop.handle(signal.SIGTERM, None)
    trainer.current_epoch = 1
    try:
        raise SIGTERMException
    except SIGTERMException:
        stop.handle(signal.SIGTERM, None)  # the re-signal, inside the handling: not raised
        assert stop.pending
        stop.stopping()  # StopOnSigterm.on_exception
    assert (stop.phase, stop.pending) == (Phase.STOPPING, False)
    time.sleep(4 * 0.05)  # the watcher has ended without a signal
    assert stop.watcher is not None and not stop.watcher.is_alive()


def test_over_a_sigterm_goes_to_the_handler_found_at_setup():
    received = []

    def scripts_own(signum: int, frame: Any) -> None:
        received.append(signum)

    before = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        stop = running_stop(previous=scripts_own)
        signal.signal(signal.SIGTERM, stop.handle)
        stop.finish()  # teardown
        stop.handle(signal.SIGTERM, None)
        assert received == [signal.SIGTERM] and signal.getsignal(signal.SIGTERM) is scripts_own
    finally:
        signal.signal(signal.SIGTERM, before)


def test_a_run_that_raised_is_over_once_the_exception_has_left_the_trainer():
    received = []
    before = signal.getsignal(signal.SIGTERM)
    try:
        trainer = stand_in_trainer()
        stop = running_stop(trainer, previous=lambda signum, frame: received.append(signum))
        stop.stopping()  # on_exception: the adapter's save runs; a SIGTERM now is noted
        stop.handle(signal.SIGTERM, None)
        assert received == [] and not stop.over()
        trainer.state.stage = None  # what Lightning sets after its teardown, before it raises on
        assert stop.over()
        stop.handle(signal.SIGTERM, None)
        assert received == [signal.SIGTERM] and stop.phase is Phase.OVER
    finally:
        signal.signal(signal.SIGTERM, before)


def test_a_sigterm_during_a_run_is_known_to_the_commands_stop_around_it():
    command = SigtermStop()  # no trainer: the command's own, always running
    assert command.phase is Phase.RUNNING
    stop = running_stop(previous=command.handle)
    stop.stopping()  # a Ctrl-C's stop under way
    stop.handle(signal.SIGTERM, None)
    assert command.terminated and command.phase is Phase.RUNNING


def test_the_callbacks_hooks_open_and_close_the_write_window():
    callback = StopOnSigterm()
    callback.stop = running_stop()
    trainer, module = stand_in_trainer(), None
    for opens in (callback.on_train_epoch_end, callback.on_validation_end, callback.on_train_end):
        opens(trainer, module)
        assert callback.stop.phase is Phase.WRITING_CHECKPOINT
        callback.on_train_batch_start(trainer, module, None, 0)
        assert callback.stop.phase is Phase.RUNNING
    callback.on_save_checkpoint(trainer, module, {})
    callback.on_train_epoch_start(trainer, module)
    assert callback.stop.phase is Phase.RUNNING
    callback.on_exception(trainer, module, KeyboardInterrupt())
    assert callback.stop.phase is Phase.STOPPING


def test_the_exit_code_table():
    assert {outcome.name: code for outcome, code in EXIT_CODES.items()} == {
        "FINISHED": 0, "REFUSED_INPUT": 2, "BUG": 1, "FAILED": 1, "INTERRUPTED": 1,
        "INTERRUPTED_BEFORE_TRAINING": 130, "TERMINATED": 143}
    assert exit_code(Outcome.TERMINATED) == 128 + signal.SIGTERM


def lightnings_exit_after(interrupt: KeyboardInterrupt) -> SystemExit:
    """The ``sys.exit(1)`` Lightning raises while it handles ``interrupt`` (its Ctrl-C path)."""
    try:
        try:
            raise interrupt
        except KeyboardInterrupt:
            raise SystemExit(1)  # as Lightning does: chained implicitly to the interrupt
    except SystemExit as stopped:
        return stopped


def test_how_the_command_names_a_run_that_lightning_ended():
    assert outcome_of_exit(SIGTERMException(), terminated=True) is Outcome.TERMINATED
    assert outcome_of_exit(lightnings_exit_after(Terminated()), terminated=True) is Outcome.TERMINATED
    assert outcome_of_exit(lightnings_exit_after(KeyboardInterrupt()), terminated=False) is Outcome.INTERRUPTED
    # a Ctrl-C's stop during which a SIGTERM arrived: the scheduler's reading wins
    assert outcome_of_exit(lightnings_exit_after(KeyboardInterrupt()), terminated=True) is Outcome.TERMINATED
    assert outcome_of_exit(SystemExit(2), terminated=False) is None  # jsonargparse's own refusal: its code stands
    assert outcome_of_exit(SystemExit(0), terminated=True) is None  # --help


class UsersReward:
    def __init__(self, scale: float) -> None:
        if scale <= 0:
            raise ValueError(f"scale must be positive, got {scale}")


def test_a_class_refusing_its_arguments_is_named_where_it_is_built(monkeypatch):
    monkeypatch.setattr(UsersReward, "__module__", "my_pkg.rewards")
    with pytest.raises(InputError, match=r"^my_pkg\.rewards\.UsersReward refused its arguments: scale must be "
                                         r"positive, got -1$") as info:
        refusals.build(UsersReward, scale=-1)
    assert isinstance(info.value.__cause__, ValueError)
    assert isinstance(refusals.build(UsersReward, scale=1), UsersReward)


def test_lit_grpos_own_class_raising_anything_but_an_input_error_is_a_bug():
    from lit_grpo.tasks import JsonlTask

    with pytest.raises(TypeError) as info:  # not turned into a refusal
        refusals.build(JsonlTask, not_an_argument=1)
    assert not isinstance(info.value, InputError)
    with pytest.raises(InputError):  # its own refusal stays its own
        refusals.build(lambda: (_ for _ in ()).throw(InputError("bad")))


def test_the_builder_changes_nothing_outside_the_commands_build():
    with pytest.raises(ValueError) as info:
        refusals.instantiate(UsersReward, scale=-1)
    assert type(info.value) is ValueError
    with refusals.building_classes(), pytest.raises(InputError):
        refusals.instantiate(UsersReward, scale=-1)


FRAME_WALKING = re.compile(r"\btb_frame\b|\bf_locals\b|\bf_back\b|sys\._getframe|inspect\.stack|\bcurrentframe\b|"
                           r"_current_frames")


def test_no_code_in_the_package_walks_stack_frames():
    # who raised an error and where the main thread stands are told by state and by where a class is built
    sources = [*sorted((ROOT / "lit_grpo").rglob("*.py")), *sorted((ROOT / "callbacks").rglob("*.py"))]
    assert len(sources) > 20
    found = [f"{path.relative_to(ROOT)}:{number}: {line.strip()}" for path in sources
             for number, line in enumerate(path.read_text().splitlines(), 1) if FRAME_WALKING.search(line)]
    assert found == []


def test_the_frame_walking_check_finds_a_planted_walk():
    assert FRAME_WALKING.search("frame = error.__traceback__.tb_frame")
    assert FRAME_WALKING.search("while frame is not None: frame = frame.f_back")
    assert not FRAME_WALKING.search("def handle(self, signum: int, frame: FrameType | None) -> None:")


def test_a_sigterm_while_the_command_lets_go_of_its_process_group_is_noted_not_raised(monkeypatch):
    # the run's outcome is known by then: a late SIGTERM (a scheduler's, after rank 0 forwarded one) must not escape
    # the command as a traceback
    import os

    from lit_grpo.cli import outcome as cli  # where main calls them

    monkeypatch.setattr(cli, "run_command", lambda args: Outcome.FINISHED)
    monkeypatch.setattr(cli, "release_process_group", lambda: os.kill(os.getpid(), signal.SIGTERM))
    previous = signal.getsignal(signal.SIGTERM)
    cli.main(["fit"])  # returns: the run had finished before the signal came
    assert signal.getsignal(signal.SIGTERM) == previous
