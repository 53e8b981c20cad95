"""Tools and environments as TRL 1.16 users write them (docs/guide.md#tools-and-environments).

A tool is a plain Python function with type hints and a Google-style docstring (transformers' ``get_json_schema``
reads both); an environment is a class whose public methods are its tools, with ``reset(**row) -> str | None`` and an
optional ``get_reward() -> float`` (TRL's ``environment_factory`` contract: one instance per episode). A ``ToolBox``
holds one episode's tools; ``ToolBox.call`` runs one parsed call and always returns a ``tool`` message: a tool that
raises, is unknown, gets arguments it does not take, returns what is neither text nor JSON, or runs past its timeout
answers ``{"error": ...}`` as TRL's does, counted as a failure; an answer longer than ``max_chars`` is cut, with a
note the model sees.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from lit_grpo.errors import InputError
from lit_grpo.tasks.tool_worker import ToolWorker, Unreadable, result_text, run_call

ENVIRONMENT_HOOKS = ("reset", "get_reward")  # an environment's methods that are not tools


@dataclass(frozen=True)
class ToolOutcome:
    """One call's ``tool`` message and whether the call failed (``failure`` names how, for the counts)."""

    message: dict[str, Any]
    failure: str | None = None


def tool_schema(function: Callable) -> dict[str, Any]:
    """The JSON schema a chat template renders for ``function`` (transformers' ``get_json_schema``); ``InputError``
    naming the function where its docstring or type hints cannot give one."""
    from transformers.utils import get_json_schema

    try:
        return get_json_schema(function)
    except Exception as error:  # noqa: BLE001 - transformers' own words name what is missing
        name = getattr(function, "__qualname__", repr(function))
        raise InputError(f"tool {name}: {error} (a tool needs type hints and a Google-style docstring with an "
                         "Args: section, as transformers' get_json_schema and TRL's tools= read them)") from None


def environment_tools(environment: Any) -> list[Callable]:
    """An environment's tools: its class's public functions other than ``reset`` and ``get_reward``, bound to it
    (read on the class, as TRL reads them: the instance's properties are not evaluated)."""
    if not callable(getattr(environment, "reset", None)):
        raise InputError(f"environment {type(environment).__qualname__}: needs a reset(**row) method (TRL's "
                         "environment_factory contract)")
    return [getattr(environment, name) for name, _ in inspect.getmembers(type(environment), inspect.isfunction)
            if not name.startswith("_") and name not in ENVIRONMENT_HOOKS]


class ToolBox:
    """The tools of one episode, by name: plain functions and, with an environment, its methods.

    Args:
        functions: the tool functions (shared by every episode: TRL's tools are stateless).
        environment: the episode's environment instance, or None.
        worker: the task's ``ToolWorker`` (calls in a child process, each bounded by its timeout: a call past it
            answers an error and its child is killed); None: calls run here, unbounded.
        max_chars: the longest answer the model sees; a longer one is cut, with a note.
    """

    def __init__(self, functions: Sequence[Callable], environment: Any = None, worker: ToolWorker | None = None,
                 max_chars: int = 4000) -> None:
        tools = [*functions, *(environment_tools(environment) if environment is not None else [])]
        self.tools: dict[str, Callable] = {}
        for tool in tools:
            name = tool.__name__
            if name in self.tools:
                raise InputError(f"tool {name!r} is given twice (a function and an environment method, or two "
                                 "functions); tool names must be unique")
            self.tools[name] = tool
        self.parameters = {name: tool_schema(tool)["function"]["parameters"] for name, tool in self.tools.items()}
        self.environment, self.worker, self.max_chars = environment, worker, max_chars
        self.functions = {function.__name__ for function in functions}  # the rest are the environment's

    def schemas(self) -> list[dict[str, Any]]:
        """The tools' JSON schemas, in the order given (the chat template's ``tools=``)."""
        return [tool_schema(tool) for tool in self.tools.values()]

    def argument_problem(self, name: str, arguments: dict[str, Any]) -> str | None:
        """The first argument whose value is not of its schema's JSON type (``"x": "a"`` for an integer), or None;
        an argument without a declared type takes anything."""
        properties = self.parameters[name].get("properties", {})
        for argument, value in arguments.items():
            schema = properties.get(argument, {})
            declared = schema.get("type")
            types = [] if declared is None else declared if isinstance(declared, list) else [declared]
            if value is None and schema.get("nullable"):  # get_json_schema's Optional[...]
                continue
            if types and not any(json_type_holds(kind, value) for kind in types):
                return f"{name}: argument {argument!r} must be {' or '.join(types)}, got {json.dumps(value)}"
        return None

    def call(self, call: dict[str, Any]) -> ToolOutcome:
        """Run one parsed tool call (``{"type": "function", "function": {"name": ..., "arguments": {...}}}``, as
        transformers' response parsing gives it) and return the ``tool`` message it answers."""
        function = call.get("function") if isinstance(call, dict) else None
        name = function.get("name") if isinstance(function, dict) else None
        if not isinstance(name, str):
            return failed("unknown", "malformed", f"a tool call names no function: {call!r}")
        arguments = function.get("arguments") or {}
        if isinstance(arguments, str):  # some templates carry the arguments as JSON text
            try:
                arguments = json.loads(arguments)
            except json.JSONDecodeError:
                return failed(name, "malformed", f"the arguments of {name} are not JSON: {arguments!r}")
        if not isinstance(arguments, dict):
            return failed(name, "malformed", f"the arguments of {name} are not an object: {arguments!r}")
        tool = self.tools.get(name)
        if tool is None:
            return failed(name, "unknown", f"there is no tool {name!r}; the tools are {', '.join(self.tools)}")
        try:
            inspect.signature(tool).bind(**arguments)
        except TypeError as error:
            return failed(name, "arguments", f"{name}: {error}")
        problem = self.argument_problem(name, arguments)
        if problem is not None:  # the wrong type: the model's error to read, not the tool's to trip on
            return failed(name, "arguments", problem)
        if self.worker is None:
            return self.answer(name, *run_call(tool, arguments))
        method = name not in self.functions
        result, error, environment = self.worker.call(name, arguments, self.environment if method else None)
        if method:
            self.use_environment(environment)  # what the call did to the environment's state, done here too
        return self.answer(name, result, error)

    def use_environment(self, environment: Any) -> None:
        """Make ``environment`` (the state a call in the worker left) this episode's, its methods the tools."""
        self.environment = environment
        self.tools.update({tool.__name__: tool for tool in environment_tools(environment)})

    def answer(self, name: str, result: Any, error: str | None) -> ToolOutcome:
        """The ``tool`` message of a call that returned ``result`` (or raised: ``error``)."""
        if error is not None:
            return failed(name, "timeout" if error.startswith("timed out") else "raised", error)
        content = result_text(result)  # a worker's result is its text already: unchanged
        if isinstance(content, Unreadable):
            return failed(name, "unreadable", f"{name} returned a {content.type_name}, which is neither text nor JSON")
        if len(content) > self.max_chars:
            cut = len(content) - self.max_chars
            content = f"{content[:self.max_chars]}\n[... {cut} more characters cut: answers are kept to {self.max_chars}]"
        return ToolOutcome({"role": "tool", "name": name, "content": content})


JSON_TYPES: dict[str, type | tuple[type, ...]] = {"integer": int, "number": (int, float), "string": str,
                                                   "boolean": bool, "array": list, "object": dict, "null": type(None)}


def json_type_holds(kind: str, value: Any) -> bool:
    """Whether ``value`` (as JSON parsing gives it) is of JSON schema type ``kind``; a boolean is not a number, a
    float with an integral value (``2.0``) is an integer, as JSON Schema has it."""
    if kind in ("integer", "number") and isinstance(value, bool):
        return False
    if kind == "integer" and isinstance(value, float):
        return value.is_integer()
    expected = JSON_TYPES.get(kind)
    return expected is None or isinstance(value, expected)


def failed(name: str, kind: str, text: str) -> ToolOutcome:
    """A failed call's message, as TRL's: ``{"error": ...}`` as the tool's content."""
    return ToolOutcome({"role": "tool", "name": name, "content": json.dumps({"error": text})}, failure=kind)
