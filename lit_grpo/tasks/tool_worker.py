"""Tool calls with a timeout, in a worker process (docs/guide.md#tools-and-environments).

A hung pure-Python call cannot be stopped from its own thread, and one left running would keep a core busy for the
rest of the run; so with a timeout a task's tool calls run in a forked child, as rewards with a timeout do
(``rollout/reward_worker.py``): the parent waits for each call at most ``timeout`` seconds (from the moment the
child is ready), then kills the child and answers the call an error; the next call starts a fresh child. The tool
functions are the child's from the fork (nothing of them is pickled; once CUDA is in use the child is spawned and
they are pickled by reference, so they must be module-level functions); an environment's state travels with each
call to one of its methods and comes back with what the method did to it, so it must pickle (plain state does; a
tree's branching already needs it to deep-copy).
"""

from __future__ import annotations

import asyncio
import inspect
import json
import pickle
from collections.abc import Callable, Mapping
from multiprocessing.connection import Connection
from typing import Any

from lit_grpo.errors import InputError
from lit_grpo.run.worker_process import (
    ChildProcess,
    WorkerDied,
    WorkerTimedOut,
)

Outcome = tuple[Any, "str | None"]  # (result, None) or (None, error text)


def run_call(tool: Callable, arguments: Mapping[str, Any]) -> Outcome:
    """One call in this process: its result (a coroutine run to its end), or its error as text."""
    try:
        result = tool(**arguments)
        return (asyncio.run(result) if inspect.iscoroutine(result) else result), None
    except (Exception, SystemExit) as error:  # noqa: BLE001 - a tool's exit is its failure, not the run's
        return None, f"{type(error).__name__}: {error}"


def result_text(result: Any) -> str | Unreadable:
    """A tool's result as the text the model sees: text as it is, anything else as JSON; a stand-in naming its
    type where it is neither (such an object may not even pickle; ``ToolBox.answer`` makes it an error). The child
    sends this, so a result is serialised once, where it was made."""
    if isinstance(result, (str, Unreadable)):  # text, or a worker's text already
        return result
    try:
        return json.dumps(result)
    except (TypeError, ValueError):
        return Unreadable(type(result).__name__)


class Unreadable:
    """A result that is neither text nor JSON, by its type's name (``ToolBox.answer`` makes it an error)."""

    def __init__(self, type_name: str) -> None:
        self.type_name = type_name


def serve_calls(connection: Connection, functions: Mapping[str, Callable]) -> None:
    """The child's loop until it receives None: ``(name, arguments, environment)`` is answered with
    ``(result, error, environment)``, the environment (None for a function) as the call left it."""
    while True:
        request = connection.recv()
        if request is None:
            return
        name, arguments, environment = request
        tool = functions[name] if environment is None else getattr(environment, name)
        result, error = run_call(tool, arguments)
        connection.send((result_text(result), error, environment))


class ToolWorker:
    """A task's tool calls in a child process, each bounded by ``timeout`` seconds. Shared by every episode of the
    task (a deep copy of an episode shares it too)."""

    def __init__(self, functions: Mapping[str, Callable], timeout: float) -> None:
        if timeout <= 0:
            raise InputError(f"tool_timeout must be positive (or null: no worker), got {timeout}")
        self.timeout = timeout
        self.child = ChildProcess(serve_calls, (dict(functions),), "lit-grpo-tools")

    def __deepcopy__(self, memo: dict[int, Any]) -> ToolWorker:
        return self  # one child for the task, whatever copies of its episodes hold it

    def call(self, name: str, arguments: Mapping[str, Any], environment: Any = None) -> tuple[Any, str | None, Any]:
        """``(result, error, environment)`` of calling tool ``name`` (an ``environment`` method when one is given),
        the environment as the call left it (as it was when the call did not come back)."""
        try:
            result, error, after = self.child.ask((name, dict(arguments), environment), self.timeout)
        except WorkerTimedOut:
            return None, f"timed out after {self.timeout:g} s", environment
        except WorkerDied as died:
            return None, f"the tool's worker process died ({died})", environment
        except (pickle.PicklingError, TypeError, AttributeError) as error:
            what = ("the tool functions" if environment is None else
                    f"the environment {type(environment).__name__}")
            raise InputError(f"{what} cannot be sent to the tools' worker process ({error}): keep an environment's "
                             "state plain and tools module-level functions (picklable), or set tool_timeout null to "
                             "run the tools in the training process without a timeout") from None
        return result, error, after

    def close(self) -> None:
        """End the child process (idempotent)."""
        self.child.close()
