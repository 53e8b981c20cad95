"""Tools as TRL 1.16 users write them, and the ``tool`` messages their calls answer
(docs/guide.md#tools-and-environments).

A tool is a plain Python function with type hints and a Google-style docstring (transformers' ``get_json_schema``
reads both); an environment is a class whose public methods are its tools, with ``reset(**row) -> str | None`` and an
optional ``get_reward() -> float`` (TRL's ``environment_factory`` contract). This module holds the pure parts: the
schemas, an environment's tools read off its class, a parsed call checked before it runs, and the message each
outcome answers, in one of two styles:

- ``"trl"`` (the default): exactly TRL's ``_tool_call_loop``: a result's content is ``str(result)`` (a list passes
  through as is, for multimodal answers), a failure's is ``str({"error": str(error)})`` (a Python dict's text),
  an unknown name answers ``Tool {name} not found.``, wrong arguments answer the ``TypeError`` of calling the tool.
- ``"json"``: results as JSON text (``true`` for ``True``), ``{"error": ...}`` as JSON, and richer error texts
  (the exception's type, the tools there are, the argument a call lacks), a result neither text nor JSON failed.

``ToolKit`` (``tasks/tools/kit.py``) runs the calls; where they run is ``tasks/tools/worker.py``'s and
``tasks/tools/environment_host.py``'s.
"""

from __future__ import annotations

import copy
import inspect
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from lit_grpo.errors import InputError
from lit_grpo.mcp_tools import McpTool

ENVIRONMENT_HOOKS = ("reset", "get_reward")  # an environment's methods that are not tools
Style = Literal["trl", "json"]
FAILURES = ("unknown", "raised", "timeout", "arguments", "malformed", "unreadable", "lost")


@dataclass(frozen=True)
class ToolOutcome:
    """One call's ``tool`` message; ``name`` is the name the model wrote (``""`` where it wrote none), ``failure``
    None or how the call failed (one of ``FAILURES``, for the counts)."""

    message: dict[str, Any]
    name: str = ""
    failure: str | None = None


def tool_schema(function: Callable) -> dict[str, Any]:
    """The JSON schema a chat template renders for ``function`` (transformers' ``get_json_schema``); ``InputError``
    naming the function where its docstring or type hints cannot give one. An MCP server's tool: the server's own
    ``inputSchema``, as listed."""
    from transformers.utils import get_json_schema

    if isinstance(function, McpTool):
        return copy.deepcopy(function.schema)

    try:
        return get_json_schema(function)
    except Exception as error:  # noqa: BLE001 - transformers' own words name what is missing
        name = getattr(function, "__qualname__", repr(function))
        raise InputError(f"tool {name}: {error} (a tool needs type hints and a Google-style docstring with an "
                         "Args: section, as transformers' get_json_schema and TRL's tools= read them)") from None


def environment_tools(environment: Any) -> list[Callable]:
    """An environment's tools, as TRL's probe reads them: its class's public functions other than ``reset`` and
    ``get_reward``, bound to it (read on the class: the instance's properties are not evaluated); ``InputError``
    naming the class where it has no ``reset``."""
    members = inspect.getmembers(type(environment), inspect.isfunction)
    if "reset" not in dict(members):
        raise InputError(f"environment {type(environment).__qualname__}: needs a reset(**row) method (TRL's "
                         "environment_factory contract)")
    return [getattr(environment, name) for name, _ in members if not name.startswith("_") and name not in
            ENVIRONMENT_HOOKS]


def bounds_own_calls(environment_type: type) -> bool:
    """Whether an environment class declares ``bounds_own_calls = True``: each of its calls is bounded by the
    environment itself (a sandbox's limits), so it runs in the training process, the tool timeout not applied."""
    return getattr(environment_type, "bounds_own_calls", False) is True


def tools_by_name(tools: list[Callable]) -> dict[str, Callable]:
    """``tools`` by name; ``InputError`` where two share one (the model could not tell them apart)."""
    named: dict[str, Callable] = {}
    for tool in tools:
        if tool.__name__ in named:
            raise InputError(f"tool {tool.__name__!r} is given twice (a function and an environment method, or two "
                             "functions); tool names must be unique")
        named[tool.__name__] = tool
    return named


def call_parts(call: Any) -> tuple[str, Any]:
    """``(name, arguments)`` of a parsed function call (``{"type": "function", "function": {"name", "arguments"}}``);
    arguments given as JSON text are read. ``ValueError`` naming what is wrong where the call cannot be run."""
    if not isinstance(call, dict):
        raise ValueError(f"a tool call is not an object: {call!r}")
    function = call.get("function")
    name = function.get("name") if isinstance(function, dict) else None
    if not isinstance(name, str) or not name:
        raise ValueError(f"a tool call names no function: {call!r}")
    arguments = function.get("arguments")
    arguments = {} if arguments is None else arguments
    if isinstance(arguments, str):  # some templates carry the arguments as JSON text
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            raise ValueError(f"the arguments of {name} are not JSON: {arguments!r}") from None
    if not isinstance(arguments, dict):
        raise ValueError(f"the arguments of {name} are not an object: {arguments!r}")
    return name, arguments


def binding_problem(tool: Callable, arguments: Mapping[str, Any]) -> str | None:
    """Why ``tool`` cannot take ``arguments`` (a missing or unexpected one), or None."""
    try:
        inspect.signature(tool).bind(**arguments)
    except TypeError as error:
        return str(error)
    except ValueError:  # no signature to read (a builtin): the call itself will say
        return None
    return None


def argument_problem(name: str, parameters: Mapping[str, Any], arguments: Mapping[str, Any]) -> str | None:
    """The first argument whose value is not of its schema's JSON type (``"x": "a"`` for an integer), or None; an
    argument without a declared type takes anything (``check_argument_types``: not TRL's, which calls as given)."""
    properties = parameters.get("properties", {})
    for argument, value in arguments.items():
        schema = properties.get(argument, {})
        declared = schema.get("type")
        types = [] if declared is None else declared if isinstance(declared, list) else [declared]
        if value is None and schema.get("nullable"):  # get_json_schema's Optional[...]
            continue
        if types and not any(json_type_holds(kind, value) for kind in types):
            return f"{name}: argument {argument!r} must be {' or '.join(types)}, got {json.dumps(value)}"
    return None


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


def result_content(result: Any, style: Style) -> tuple[Any, str | None]:
    """``(content, None)``: a result as the model sees it (``"trl"``: ``str(result)``, a list as it is; ``"json"``:
    text as it is, anything else as JSON), or ``(None, why)`` where it cannot be (neither text nor JSON, or its
    ``__str__`` raised). Run where the result was made, so only text travels between processes."""
    if style == "trl":
        if isinstance(result, list):
            return result, None
        try:
            return str(result), None
        except BaseException as error:  # noqa: BLE001 - a result's __str__ is the tool's code
            return None, f"its result's str() raised {type(error).__name__}: {error}"
    if isinstance(result, str):
        return result, None
    try:
        return json.dumps(result), None
    except (TypeError, ValueError, RecursionError):
        return None, f"returned a {type(result).__name__}, which is neither text nor JSON"


def cut(content: Any, max_chars: int | None) -> Any:
    """Text longer than ``max_chars`` cut, with a note the model sees (None: as TRL, never cut)."""
    if max_chars is None or not isinstance(content, str) or len(content) <= max_chars:
        return content
    more = len(content) - max_chars
    return f"{content[:max_chars]}\n[... {more} more characters cut: answers are kept to {max_chars}]"


def answered(name: str, content: Any) -> ToolOutcome:
    """A call's message where it returned."""
    return ToolOutcome({"role": "tool", "name": name, "content": content}, name)


def failed(name: str, kind: str, text: str, style: Style, message_name: str | None = None) -> ToolOutcome:
    """A failed call's message: ``{"error": text}`` as the content, a Python dict's text (``"trl"``, as TRL builds
    it) or JSON (``"json"``)."""
    error = {"error": text}
    content = str(error) if style == "trl" else json.dumps(error)
    return ToolOutcome({"role": "tool", "name": name if message_name is None else message_name, "content": content},
                       name, kind)
