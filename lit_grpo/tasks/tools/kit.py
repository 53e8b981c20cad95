"""A tool task's tools and environments: the standalone functions, the environment factories, and the pools of
instances (docs/guide.md#tools-and-environments). TRL 1.16's behaviour is the default; ours are named options.

As TRL's ``GRPOTrainer`` does, each factory is probed once (one instance, made here at first need: its class's
public methods are the tools, ``get_reward`` makes a reward), and every rollout gets an instance of its own from a
pool, ``reset(**row)`` with the whole row: "construct once, reset often", a new instance only when every one is in
use. An environment is never pickled or copied unless it asks (``fork``: ``__deepcopy__`` or ``fork_environment``).

Where the calls run: with ``timeout=None`` the instances live in this process and the calls run here, unbounded; with
a timeout (10 s by default) each rollout's instance lives in its own long-lived host process
(``tasks/tools/environment_host.py``: the factory and ``reset`` run there, and the standalone functions too, so module
state they change lives there), each call is bounded by the timeout, and one past it kills the host and loses the
rollout's ``ToolBox`` (``box.py``; the episode must end). The turn's order is TRL's (``tasks/tools/worker.py``); the
messages are TRL's (``messages="trl"``) or JSON (``"json"``), ``tasks/tools/calls.py``.
"""

from __future__ import annotations

import copy
import inspect
import pkgutil
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

from lit_grpo.errors import InputError
from lit_grpo.mcp_tools import McpServers, McpTool
from lit_grpo.run.worker_process import STARTUP_LIMIT, WorkerDied, WorkerTimedOut, fork_context
from lit_grpo.tasks.episodes import RowUnavailable
from lit_grpo.tasks.tools.box import ToolBox
from lit_grpo.tasks.tools.calls import bounds_own_calls, environment_tools, tool_schema, tools_by_name
from lit_grpo.tasks.tools.environment_host import Host
from lit_grpo.tasks.tools.worker import EventLoop, guarded


def named(factory: Callable) -> str:
    return getattr(factory, "__qualname__", None) or repr(factory)


def factories(environment: Any) -> dict[str | None, Callable[[], Any]]:
    """TRL's ``environment_factory`` as a mapping: none, one unnamed factory, or each named one, import paths
    resolved; InputError naming one that is not callable."""
    if environment is None:
        return {}
    given = dict(environment) if isinstance(environment, Mapping) else {None: environment}
    resolved = {}
    for name, factory in given.items():
        factory = imported(factory) if isinstance(factory, str) else factory
        if not callable(factory):
            raise InputError(f"ToolTask: environment {name!r}: the factory must be callable (a class or a function "
                             f"that returns an instance), got {type(factory).__name__}")
        resolved[name] = factory
    return resolved


def imported(path: str) -> Any:
    """The object at an import path (``package.module.name``), named in the error where it does not import."""
    try:
        return pkgutil.resolve_name(path)
    except (ImportError, AttributeError, ValueError) as error:
        raise InputError(f"ToolTask: {path!r} does not import ({error})") from None


class ToolKit:
    """A tool task's tools and environments.

    Args:
        functions: standalone tools (type hints and a Google-style docstring each), shared by every rollout.
        environments: factories (any callable: a class, a lambda; or its import path) by name, routed by a row's
            environment column; ``{None: factory}`` for TRL's single ``environment_factory``; None for no
            environment.
        timeout: seconds a call may run (each rollout's environment then lives in its own host process, killed by
            a call past it); None: in this process, unbounded.
        messages: ``"trl"`` (TRL's ``str(result)`` / ``str({"error": ...})``) or ``"json"`` (JSON text).
        check_argument_types: refuse a call whose arguments are not of its schema's types (not TRL's).
        parallel_sync: a turn's standalone sync function calls run side by side in threads (not TRL's).
        max_chars: the longest text answer the model sees, a longer one cut with a note; None: never cut (TRL).
        servers: MCP servers whose tools every rollout gets too, called in this process through their clients
            (each call bounded by the client with the timeout), never in a host.
    """

    def __init__(self, functions: Sequence[Callable], environments: Mapping[str | None, Callable[[], Any]] | None,
                 timeout: float | None = 10.0, messages: Literal["trl", "json"] = "trl",
                 check_argument_types: bool = False, parallel_sync: bool = False,
                 max_chars: int | None = None, servers: McpServers | None = None) -> None:
        if timeout is not None and not timeout > 0:
            raise InputError(f"tool timeout must be positive (seconds), or null to run calls unbounded in the "
                             f"training process; got {timeout}")
        if messages not in ("trl", "json"):
            raise InputError(f"tool messages must be 'trl' (TRL's text) or 'json', got {messages!r}")
        if max_chars is not None and max_chars < 1:
            raise InputError(f"max tool chars must be a positive number of characters, or null; got {max_chars}")
        self.functions = list(functions)
        tools_by_name(self.functions)
        self.factories = factories(environments)
        self.timeout, self.style, self.check_types = timeout, messages, check_argument_types
        self.parallel_sync, self.max_chars, self.servers = parallel_sync, max_chars, servers
        self.probes: dict[str | None, Any] = {}
        self.idle: dict[str | None, list[Any]] = {}  # instances (in-process) or hosts, by environment
        self.hosts: list[Host] = []  # every live host, in use or idle
        self._loop: EventLoop | None = None
        self._schemas: dict[str | None, list[dict[str, Any]]] = {}
        self._loop_lock = threading.Lock()

    def environment_of(self, environment: str | None) -> str | None:
        """The key of ``environment`` among the factories (InputError naming them where it is not one); None where
        the kit has no environment."""
        if not self.factories:
            if environment is not None:
                raise InputError(f"a row names environment {environment!r}, but no environment is configured")
            return None
        if environment not in self.factories:
            raise InputError(f"a row names environment {environment!r}, which is not among the environments "
                             f"configured: {list(self.factories)}")
        return environment

    def probe(self, environment: str | None) -> Any:
        """The probe instance of ``environment``, made here at first need (and pooled, in-process)."""
        if environment not in self.probes:
            factory = self.factories[environment]
            instance, error = guarded(factory)
            if error is not None:
                raise InputError(f"environment factory {named(factory)}: {type(error).__name__}: {error} (it is "
                                 "called once at setup to read its tools)") from None
            environment_tools(instance)  # it has a reset
            self.probes[environment] = instance
            if not self.hosted(environment):
                self.idle.setdefault(environment, []).append(instance)
        return self.probes[environment]

    def hosted(self, environment: str | None) -> bool:
        """Whether ``environment``'s instances live in host processes: with a timeout, unless its class declares
        ``bounds_own_calls = True`` (it bounds each call itself, as ``lit_grpo.sandbox.PythonSandbox`` does: it then
        lives here, its calls not bounded by the timeout, nor the standalone functions' calls of its rollouts)."""
        if self.timeout is None:
            return False
        return not (environment in self.factories and bounds_own_calls(type(self.probe(environment))))

    def tools(self, environment: str | None = None) -> list[Callable]:
        """The standalone functions and that environment's methods (read from its probe instance)."""
        key = self.environment_of(environment)
        methods = [] if key is None and not self.factories else environment_tools(self.probe(key))
        return list(tools_by_name([*self.functions, *methods, *self.served()]).values())

    def served(self) -> list[McpTool]:
        """The MCP servers' tools (the servers start at first need)."""
        return self.servers.tools() if self.servers is not None else []

    def schemas(self, environment: str | None = None) -> list[dict[str, Any]]:
        """The tools' JSON schemas (the chat template's ``tools=``), in order (read once per environment)."""
        if environment not in self._schemas:
            self._schemas[environment] = [tool_schema(tool) for tool in self.tools(environment)]
        return copy.deepcopy(self._schemas[environment])  # the caller's to change

    def tool_names(self) -> list[str]:
        """Every tool name over all environments, in order (the metrics' names, equal on every rank)."""
        names: dict[str, None] = {}
        for key in self.factories or [None]:
            names.update({tool.__name__: None for tool in self.tools(key)})
        return list(names)

    def reward_environment_types(self) -> list[type]:
        """The probed classes that define ``get_reward`` (TRL adds one reward for each), in order, once each."""
        types: list[type] = []
        for key in self.factories:
            kind = type(self.probe(key))
            if "get_reward" in dict(inspect.getmembers(kind, inspect.isfunction)) and kind not in types:
                types.append(kind)
        return types

    def loop(self) -> EventLoop:
        """This process's event loop for async tools (TRL's daemon loop), started at first need."""
        with self._loop_lock:
            if self._loop is None:
                self._loop = EventLoop()
            return self._loop

    def open(self, row: dict[str, Any], environment: str | None = None) -> tuple[ToolBox, Any]:
        """One rollout's box and the text its ``reset(**row)`` returned (None, text, or a list, as TRL takes it);
        ``RowUnavailable`` where the factory or ``reset`` raised (or, hosted, timed out or ended its process).
        ``reset`` gets the whole row, less its ``environment`` column where environments are routed by name (TRL's
        dict ``environment_factory``: the column is a control field there)."""
        key = self.environment_of(environment)
        tools = self.tools(key)
        if any(name is not None for name in self.factories):
            row = {column: value for column, value in row.items() if column != "environment"}
        if self.hosted(key):
            return self.open_hosted(row, key, tools)
        if not self.factories:
            return ToolBox(self, key, None, tools), None
        pool = self.idle.setdefault(key, [])
        if pool:
            instance = pool.pop(0)
        else:
            factory = self.factories[key]
            instance, error = guarded(factory)
            if error is not None:
                raise RowUnavailable(f"environment factory {named(factory)}: {type(error).__name__}: {error}")
        text, error = guarded(lambda: instance.reset(**row))
        if error is not None:
            pool.append(instance)
            raise RowUnavailable(f"{type(error).__name__}: {error}")
        return ToolBox(self, key, instance, [*self.functions, *environment_tools(instance), *self.served()]), text

    def new_host(self, key: str | None) -> Host:
        """A fresh host for ``key``'s environment (or for the functions alone)."""
        factory = self.factories.get(key) if self.factories else None
        context: Any = fork_context()
        if context.get_start_method() == "spawn":  # CUDA is in use: what the host runs must pickle by reference
            import pickle

            for thing in [*([factory] if factory is not None else []), *self.functions]:
                try:
                    pickle.dumps(thing)
                except Exception as error:  # noqa: BLE001 - any pickling failure names the same fix
                    raise InputError(f"{named(thing)} cannot be sent to its host process ({error}): with CUDA in use "
                                     "hosts are spawned, so environment factories and tool functions must be "
                                     "module-level (importable by name); or set the tool timeout to null") from None
        host = Host(factory, self.functions, self.style)
        host.users = 0  # type: ignore[attr-defined]
        self.hosts.append(host)
        return host

    def open_hosted(self, row: dict[str, Any], key: str | None, tools: list[Callable]) -> tuple[ToolBox, Any]:
        """``open`` with the rollout's environment in a host (a pooled one, or a new one)."""
        pool = self.idle.setdefault(key, [])
        while pool and not pool[0].alive:
            self.drop(pool.pop(0))
        try:
            host = pool.pop(0) if pool else self.new_host(key)
        except (WorkerTimedOut, WorkerDied, OSError) as error:  # OSError: the system refused a process (EAGAIN)
            raise RowUnavailable(f"the environment's host process did not start ({type(error).__name__}: "
                                 f"{error}); every open rollout has a host of its own: fewer at once "
                                 "(data.prompts_per_epoch x group_size), or tool_timeout: null") from None
        host.users = 1  # type: ignore[attr-defined]
        if not self.factories:
            return ToolBox(self, key, None, tools, host), None
        factory = self.factories[key]
        try:
            host.send(("open", 0, row))
            if not host.made:
                kind, error = host.receive(STARTUP_LIMIT)
                if kind == "error":
                    self.drop(host)
                    raise RowUnavailable(f"environment factory {named(factory)}: {type(error).__name__}: {error}")
                host.made = True
            kind, answer = host.receive(self.timeout)
        except (WorkerTimedOut, WorkerDied) as error:
            self.drop(host)
            what = f"timed out after {self.timeout:g} s" if isinstance(error, WorkerTimedOut) else \
                f"ended its process ({error})"
            raise RowUnavailable(f"environment {named(factory)}: reset {what}") from None
        if kind == "error":
            host.users = 0  # type: ignore[attr-defined]
            pool.append(host)
            raise RowUnavailable(f"{type(answer).__name__}: {answer}")
        return ToolBox(self, key, None, tools, host), answer

    def drop(self, host: Host) -> None:
        """A host that is no longer used: ended, forgotten."""
        host.close()
        if host in self.hosts:
            self.hosts.remove(host)

    def close(self) -> None:
        """End every host process and the event loop (idempotent)."""
        for host in list(self.hosts):
            self.drop(host)
        self.idle = {key: ([] if self.hosted(key) else pool) for key, pool in self.idle.items()}
        if self._loop is not None:
            self._loop.close()
            self._loop = None
        if self.servers is not None:
            self.servers.close()

