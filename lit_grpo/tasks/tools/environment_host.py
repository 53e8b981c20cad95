"""An episode's environment in its own long-lived process, its host, so each tool call can be bounded by a timeout
without the environment's state ever travelling (docs/guide.md#tools-and-environments).

A hung pure-Python call cannot be stopped from its own thread, so with a timeout the environment lives where its
calls run: the factory is called in the host (forked from the trainer: a lambda, a class holding a lock or a client
it opens on first use all work; once CUDA is in use the host is spawned, and then the factory and the tool
functions must pickle by reference: module-level), ``reset`` runs there, every call runs there, and only the calls'
arguments and their answers (text) cross the pipe. A call past its timeout kills the host: the episode's
environment is gone with it, so its box is lost (later calls answer an error) and the episode ends. Hosts are pooled
like TRL's instances ("construct once, reset often"); a killed one is replaced by a fresh one at the next episode.

The standalone function tools run in the episode's host too: module state they change lives in that process (a
fork of the trainer), not in the trainer; a reward reading such state reads the trainer's copy, unchanged.

``EnvironmentProxy`` stands for the hosted instance in the trainer (rewards' ``environments``): reading an attribute
returns the host's current value (a copy, pickled back: mutating it changes nothing there), calling a method (sync
or async, ``get_reward`` included) runs it in the host with the same timeout, and setting an attribute sets it there.
It cannot: be pickled or deep-copied, be ``type()``-checked (``type(proxy)`` is the proxy; ``proxy.__class__`` and
``isinstance`` see the environment's class), take or return what does not pickle (an error names it), use operators
or other dunder methods (``len``, ``==``, iteration), or be used after its box is released or lost.
"""

from __future__ import annotations

import copy
import inspect
import pickle
import time
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection
from typing import Any

from lit_grpo.run.worker_process import STARTUP_LIMIT, WorkerDied, WorkerTimedOut, fork_context, run_child
from lit_grpo.tasks.tools.worker import Answer, EventLoop, Job, run_phases
from lit_grpo.tasks.tools.calls import Style, environment_tools, tools_by_name

FORK_METHOD = "fork_environment"  # an environment method that returns its own copy (or __deepcopy__): trees fork by it


def environment_copy(environment: Any) -> Any:
    """The environment's own copy: ``fork_environment()`` where it has one, else ``copy.deepcopy`` (which runs its
    ``__deepcopy__``); only called for an environment that defines one of the two."""
    fork = getattr(environment, FORK_METHOD, None)
    return fork() if callable(fork) else copy.deepcopy(environment)


def can_fork(environment_class: type) -> bool:
    """Whether the class asks to be copied: it defines ``__deepcopy__`` or ``fork_environment``."""
    return callable(getattr(environment_class, "__deepcopy__", None)) or callable(
        getattr(environment_class, FORK_METHOD, None))


def sent(connection: Connection, message: tuple[Any, ...]) -> None:
    """Send ``message``; one that does not pickle goes as an error naming why (pickling writes nothing first)."""
    try:
        connection.send(message)
    except (pickle.PicklingError, TypeError, AttributeError, RecursionError) as error:
        connection.send(("error", TypeError(f"cannot be sent from the environment's host process ({error})")))


def answer_sent(connection: Connection, index: int, answer: Answer) -> None:
    """Send a call's answer; content that does not pickle (a list holding a lock) is sent as unreadable."""
    try:
        connection.send(("answer", index, answer))
    except (pickle.PicklingError, TypeError, AttributeError, RecursionError) as error:
        connection.send(("answer", index, Answer(unreadable=f"returned what cannot leave its process ({error})")))


def portable(error: BaseException) -> BaseException:
    """``error`` itself where it pickles, else a ``RuntimeError`` with its text."""
    try:
        pickle.loads(pickle.dumps(error))
        return error
    except Exception:  # noqa: BLE001 - any exception class may refuse
        return RuntimeError(f"{type(error).__name__}: {error}")


def serve(connection: Connection, factory: Callable[[], Any] | None, functions: Sequence[Callable],
          style: Style) -> None:
    """The host's loop until it receives None. Slot 0 holds the pooled instance, other slots its forks."""
    slots: dict[int, Any] = {}
    tools: dict[int, dict[str, Callable]] = {0: tools_by_name(list(functions))}
    loops: list[EventLoop] = []

    def loop() -> EventLoop:
        if not loops:
            loops.append(EventLoop())
        return loops[0]

    def value(call: Callable[[], Any]) -> tuple[Any, ...]:
        try:
            result = call()
            if inspect.iscoroutine(result):
                result = loop().run(result)
            return ("value", result)
        except BaseException as error:  # noqa: BLE001 - the environment's exception is the caller's to read
            return ("error", portable(error))

    while True:
        request = connection.recv()
        if request is None:
            return
        kind, slot, *rest = request
        if kind == "open":
            for other in [s for s in slots if s != 0]:
                del slots[other], tools[other]
            if factory is not None and 0 not in slots:
                made = value(factory)
                if made[0] == "error":
                    sent(connection, made)
                    continue
                read = value(lambda: tools_by_name([*functions, *environment_tools(made[1])]))
                connection.send(("value", None) if read[0] == "value" else read)
                if read[0] == "error":
                    continue
                slots[0], tools[0] = made[1], read[1]
            sent(connection, value(lambda: slots[0].reset(**rest[0])) if factory is not None else ("value", None))
        elif kind == "turn":
            run_phases(rest[0], tools[slot], style, loop, lambda index, answer: answer_sent(connection, index, answer))
        elif kind == "get":
            read = value(lambda: getattr(slots[slot], rest[0]))
            if read[0] == "value" and inspect.ismethod(read[1]):
                connection.send(("method", inspect.iscoroutinefunction(read[1])))
            else:
                sent(connection, read)
        elif kind == "set":
            sent(connection, value(lambda: setattr(slots[slot], *rest)))
        elif kind == "invoke":
            sent(connection, value(lambda: getattr(slots[slot], rest[0])(*rest[1], **rest[2])))
        elif kind == "fork":
            made = value(lambda: (lambda twin: (twin, tools_by_name([*functions, *environment_tools(twin)])))(
                environment_copy(slots[slot])))
            if made[0] == "value":
                slots[rest[0]], tools[rest[0]] = made[1]
                made = ("value", None)
            sent(connection, made)
        elif kind == "drop":
            slots.pop(slot, None)
            tools.pop(slot, None)


class Host:
    """The trainer's side of one host process: requests, answers within a time limit, and its end."""

    def __init__(self, factory: Callable[[], Any] | None, functions: Sequence[Callable], style: Style) -> None:
        context: Any = fork_context()
        parent, child = context.Pipe()
        self.process = context.Process(target=run_child, args=(child, serve, factory, list(functions), style),
                                       daemon=True, name="lit-grpo-environment")
        self.connection = parent
        self.process.start()
        child.close()
        self.made = factory is None  # the factory has run in it (once: its instance is pooled with it)
        self.slots = 1  # the next fork's slot
        self.receive(STARTUP_LIMIT)  # READY

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.is_alive()

    def send(self, message: Any) -> None:
        self.connection.send(message)

    def receive(self, limit: float | None) -> Any:
        """The host's next message within ``limit`` seconds; ``WorkerTimedOut`` or ``WorkerDied`` (the host then
        killed)."""
        try:
            if self.connection.poll(limit):
                return self.connection.recv()
            failure: Exception = WorkerTimedOut()
        except (EOFError, OSError):
            self.process.join(timeout=5)
            failure = WorkerDied(self.process.exitcode)
        self.kill()
        raise failure

    def ask(self, message: Any, limit: float | None) -> Any:
        """The host's answer to ``message``, unwrapped: a value, or the environment's exception raised here."""
        self.send(message)
        kind, answer = self.receive(limit)
        if kind == "error":
            raise answer
        return answer

    def turn(self, turn: Sequence[Sequence[Job]], slot: int, timeout: float) -> dict[int, Answer | str]:
        """Each call's answer, or how it came to none: ``"timeout"`` (past its timeout: the host was killed),
        ``"died"`` (the host ended while it ran) or ``"lost"`` (a call before it killed the host)."""
        self.send(("turn", slot, [list(phase) for phase in turn]))
        answers: dict[int, Answer | str] = {}
        ended = ""
        for phase in turn:
            pending = {job.index for job in phase}
            deadline = time.monotonic() + timeout
            while pending and not ended:
                try:
                    _, index, answer = self.receive(max(0.0, deadline - time.monotonic()))
                except WorkerTimedOut:
                    ended = "timeout"
                except WorkerDied:
                    ended = "died"
                else:
                    answers[index] = answer
                    pending.discard(index)
            answers.update({index: ended for index in pending})
            if ended:
                answers.update({job.index: "lost" for later in turn for job in later if job.index not in answers})
                break
        return answers

    def kill(self) -> None:
        """End the process now (idempotent)."""
        if self.process is None:
            return
        if self.process.is_alive():
            self.process.kill()
        self.process.join()
        self.connection.close()
        self.process = None

    def close(self) -> None:
        """Ask the process to end, kill it if it does not (idempotent)."""
        if self.process is not None and self.process.is_alive():
            try:
                self.connection.send(None)
                self.process.join(timeout=5)
            except OSError:
                pass
        self.kill()


class EnvironmentProxy:
    """A hosted environment seen from the trainer (the module docstring says what it can and cannot do)."""

    def __init__(self, remote: Any, environment_class: type) -> None:
        object.__setattr__(self, "_remote", remote)
        object.__setattr__(self, "_class", environment_class)

    @property  # type: ignore[misc]
    def __class__(self) -> type:  # isinstance(proxy, Env) holds
        return object.__getattribute__(self, "_class")

    def __getattr__(self, name: str) -> Any:
        remote = object.__getattribute__(self, "_remote")
        kind, answer = remote.environment_get(name)
        if kind == "value":
            return answer
        if answer:  # an async method: awaited where the caller awaits it, run in the host
            async def method(*args: Any, **kwargs: Any) -> Any:
                return remote.environment_invoke(name, args, kwargs)
        else:
            def method(*args: Any, **kwargs: Any) -> Any:
                return remote.environment_invoke(name, args, kwargs)
        method.__name__ = name
        return method

    def __setattr__(self, name: str, value: Any) -> None:
        object.__getattribute__(self, "_remote").environment_set(name, value)

    def __repr__(self) -> str:
        return f"<hosted {object.__getattribute__(self, '_class').__qualname__}>"

    def __reduce__(self) -> Any:
        raise TypeError(f"{self!r} lives in its host process and cannot be pickled or copied")
