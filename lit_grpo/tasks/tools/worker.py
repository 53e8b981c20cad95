"""How one assistant turn's tool calls run, wherever they run (in the training process, or in an episode's host
process: ``tasks/tools/environment_host.py``): TRL 1.16's order (``GRPOTrainer._tool_call_loop``).

The sync calls run one after another in call order; the async ones are then awaited together (``asyncio.gather``
on one event loop that lives as long as the process, as TRL's daemon loop does, so a client an async tool opened in
one turn still works in the next), their messages after the sync ones'. With ``parallel_sync`` a run of standalone
sync function calls side by side runs in threads; an environment's methods always keep call order (its second call
may read what its first wrote). A turn is a list of phases, each a group of calls that run together; a phase starts
when the one before it has answered, so its calls' timeouts run from there.

A tool's exception of any class (``KeyboardInterrupt``, ``SystemExit``, any ``BaseException``) is its call's failure,
answered and counted, never printed; the user's own Ctrl-C, arriving while a tool runs in the main thread, still
stops the run (``tasks/rewards/guard.py``'s ``watching_sigint`` tells the two apart).
"""

from __future__ import annotations

import asyncio
import inspect
import queue
import threading
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from lit_grpo.run.signals import Terminated
from lit_grpo.tasks.rewards.guard import watching_sigint
from lit_grpo.tasks.tools.calls import (
    Style,
    ToolOutcome,
    answered,
    argument_problem,
    binding_problem,
    call_parts,
    cut,
    failed,
    result_content,
    tool_schema,
)

LOST = "the environment was lost: an earlier call of this episode timed out or ended its process"


@dataclass(frozen=True)
class Job:
    """One call to run: its place in the turn, its tool and arguments, and how it runs (``awaited``: in the turn's
    gather; ``alone``: in call order, not beside another call)."""

    index: int
    name: str
    arguments: dict[str, Any]
    awaited: bool
    alone: bool


@dataclass(frozen=True)
class Answer:
    """What a call came to, as text that can travel between processes: the content the model sees, or the error
    (``str(exception)`` and the exception's class name), or why the result cannot be shown."""

    content: Any = None
    error: str | None = None
    error_type: str = ""
    unreadable: str | None = None


def phases(jobs: Sequence[Job]) -> list[list[Job]]:
    """The turn's phases: the sync calls in call order (a run of calls that may run side by side as one phase,
    each other call alone), then the awaited ones together."""
    out: list[list[Job]] = []
    for job in (j for j in jobs if not j.awaited):
        if not job.alone and out and not out[-1][0].alone:
            out[-1].append(job)
        else:
            out.append([job])
    awaited = [job for job in jobs if job.awaited]
    return out + ([awaited] if awaited else [])


class EventLoop:
    """An event loop in a daemon thread, for a process's lifetime (TRL's ``async_loop``): async tools run on it
    whatever loop the caller may be in, and what they open stays bound to one loop."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="lit-grpo-tool-loop", daemon=True)
        self.thread.start()

    def run(self, coroutine: Coroutine[Any, Any, Any]) -> Any:
        """``coroutine``'s value, run on the loop (the caller waits)."""
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result()

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=5)


def failure(error: BaseException) -> Answer:
    return Answer(error=str(error), error_type=type(error).__name__)


def shown(result: Any, style: Style) -> Answer:
    content, unreadable = result_content(result, style)
    return Answer(content=content, unreadable=unreadable)


def guarded(call: Callable[[], Any]) -> tuple[Any, BaseException | None]:
    """``(value, None)`` of ``call()``, or ``(None, error)`` for whatever it raised; in the main thread the user's
    Ctrl-C meanwhile (or SIGTERM's ``Terminated``) is raised on, never taken for the tool's."""
    with watching_sigint() as watch:
        try:
            value = call()
        except BaseException as error:  # noqa: BLE001 - a tool's exception of any class is its call's failure
            if isinstance(error, Terminated) or watch.arrived:
                if isinstance(error, KeyboardInterrupt):
                    raise
                raise KeyboardInterrupt("Ctrl-C while a tool ran") from error
            return None, error
    if watch.arrived:  # the tool swallowed the user's Ctrl-C
        raise KeyboardInterrupt("Ctrl-C while a tool ran")
    return value, None


async def awaited_answer(coroutine: Any, style: Style) -> Answer:
    """An async call's answer; its exception of any class is caught inside its task, so none reaches the loop."""
    try:
        return shown(await coroutine, style)
    except BaseException as error:  # noqa: BLE001 - CancelledError, KeyboardInterrupt, SystemExit: the tool's
        return failure(error)


def sync_answer(tool: Callable, arguments: Mapping[str, Any], style: Style, loop: Callable[[], EventLoop]) -> Answer:
    """A sync call's answer (a coroutine it returns is awaited on ``loop``, where TRL would show its text)."""
    value, error = guarded(lambda: tool(**arguments))
    if error is not None:
        return failure(error)
    if inspect.iscoroutine(value):
        return loop().run(awaited_answer(value, style))
    return shown(value, style)


def run_phases(turn: Sequence[Sequence[Job]], tools: Mapping[str, Callable], style: Style,
               loop: Callable[[], EventLoop], emit: Callable[[int, Answer], None]) -> None:
    """Run a turn's phases in order, giving each call's answer to ``emit(index, answer)`` as it comes (from this
    thread only). ``loop`` gives the process's event loop (made at first need)."""
    for phase in turn:
        if phase[0].awaited:
            coroutines, early = [], {}
            for job in phase:  # a coroutine's creation runs none of its code, unless a decorator wraps it
                coroutine, error = guarded(lambda job=job: tools[job.name](**job.arguments))
                if error is not None:
                    early[job.index] = failure(error)
                else:
                    coroutines.append(awaited_answer(coroutine, style))

            async def together() -> list[Answer]:
                return list(await asyncio.gather(*coroutines))

            answers = iter(loop().run(together()) if coroutines else [])
            for job in phase:
                emit(job.index, early[job.index] if job.index in early else next(answers))
        elif len(phase) == 1:
            job = phase[0]
            emit(job.index, sync_answer(tools[job.name], job.arguments, style, loop))
        else:
            side_by_side(phase, tools, style, loop, emit)


def side_by_side(phase: Sequence[Job], tools: Mapping[str, Callable], style: Style, loop: Callable[[], EventLoop],
                 emit: Callable[[int, Answer], None]) -> None:
    """``parallel_sync``: the phase's calls each in a thread, their answers emitted here as they come."""
    answers: queue.Queue[tuple[int, Answer]] = queue.Queue()

    def run(job: Job) -> None:
        answers.put((job.index, sync_answer(tools[job.name], job.arguments, style, loop)))

    for job in phase:
        threading.Thread(target=run, args=(job,), name=f"lit-grpo-tool-{job.name}", daemon=True).start()
    for _ in phase:
        emit(*answers.get())


def plan(calls: Sequence[Any], tools: Mapping[str, Callable], functions: Sequence[Callable], style: Style,
         check_types: bool, parallel_sync: bool) -> tuple[list[Job], dict[int, ToolOutcome], set[int]]:
    """A turn's calls as jobs to run, the outcomes of those that cannot run, and the jobs whose arguments do not
    bind (their ``TypeError`` is the ``"arguments"`` failure, in TRL's words)."""
    jobs, ready, unbound = [], {}, set()
    for index, call in enumerate(calls):
        if isinstance(call, dict) and call.get("type", "function") != "function":  # TRL's words and name
            ready[index] = failed("", "malformed", f"Unsupported tool call type: {call.get('type')}", style,
                                  message_name=str(call.get("name", "unknown")))
            continue
        try:
            name, arguments = call_parts(call)
        except ValueError as error:
            function = call.get("function") if isinstance(call, dict) else None
            written = function.get("name") if isinstance(function, dict) else None
            ready[index] = failed(written if isinstance(written, str) else "", "malformed", str(error),
                                  style)
            continue
        tool = tools.get(name)
        if tool is None:
            text = f"Tool {name} not found." if style == "trl" else \
                f"there is no tool {name!r}; the tools are {', '.join(tools)}"
            ready[index] = failed(name, "unknown", text, style)
            continue
        problem = binding_problem(tool, arguments)
        if problem is not None and style == "json":
            ready[index] = failed(name, "arguments", f"{name}: {problem}", style)
            continue
        if problem is None and check_types:
            typed = argument_problem(name, tool_schema(tool)["function"]["parameters"], arguments)
            if typed is not None:  # the wrong type: the model's error to read, not the tool's to trip on
                ready[index] = failed(name, "arguments", typed, style)
                continue
        if problem is not None:
            unbound.add(index)
        function_tool = any(tool is f for f in functions)
        jobs.append(Job(index, name, arguments, awaited=problem is None and inspect.iscoroutinefunction(tool),
                        alone=not (parallel_sync and function_tool)))
    return jobs, ready, unbound

def outcome(job: Job, answer: Answer | str, unbound: set[int], style: Style, timeout: float | None,
            max_chars: int | None) -> ToolOutcome:
    """A job's ``tool`` message from its answer (or from how it came to none)."""
    name = job.name
    if answer == "timeout":
        return failed(name, "timeout", f"timed out after {timeout:g} s", style)
    if answer == "died":
        return failed(name, "raised", f"{name} ended its environment's process", style)
    if answer == "lost" or not isinstance(answer, Answer):
        return failed(name, "lost", LOST, style)
    if answer.error is not None:
        kind = "arguments" if job.index in unbound and answer.error_type == "TypeError" else "raised"
        text = answer.error if style == "trl" else f"{answer.error_type}: {answer.error}"
        return failed(name, kind, text, style)
    if answer.unreadable is not None:
        return failed(name, "unreadable", f"{name} {answer.unreadable}", style)
    return answered(name, cut(answer.content, max_chars))
