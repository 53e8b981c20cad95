"""MCP servers as a tool task names them, and their tools as callables (docs/guide.md#tools-from-mcp-servers).

``McpServer`` is one entry of a task's ``mcp_servers`` (YAML): a ``command`` lit-grpo starts and talks to over stdio,
or the ``url`` of a streamable-HTTP server someone else runs. ``McpServers`` holds one client per server for the run
(``client.py``: started at first need, which is the task's setup, and stopped by ``close``, at the end of the run,
on SIGTERM through the same teardown, and at the interpreter's exit). Each listed tool becomes an ``McpTool``: a
callable whose ``schema`` is the server's ``inputSchema`` in the chat template's ``{"type": "function", ...}`` form,
and whose call goes through the client, bounded by the tool timeout. A call fails with ``McpToolError`` (the model
reads its text; the task counts it) when the server answers an error result or a protocol error, when the call
times out, or when the server is gone; what happens to the server then is ``client.py``'s.
"""

from __future__ import annotations

import atexit
import dataclasses
import sys
from collections.abc import Sequence
from typing import Any

from lit_grpo.errors import InputError


class McpToolError(RuntimeError):
    """A call to an MCP tool that failed (its text is what the model reads)."""


@dataclasses.dataclass
class McpServer:
    """One MCP server whose tools the task offers, by ``command`` (stdio) or by ``url`` (streamable HTTP).

    Args:
        command: the program lit-grpo starts, serving MCP on its stdin/stdout (``python``: the trainer's own
            interpreter). Started once per run; if it crashes or hangs it is restarted once, and after that its
            tools answer errors to the end of the run.
        args: the command's arguments.
        env: environment variables for the command, over the SDK's short default (``HOME``, ``PATH``, ...): the
            trainer's own environment is not passed on.
        url: the endpoint of a streamable-HTTP server someone else runs (``http://host:port/mcp``); reconnected at
            the next call after it fails.
        headers: HTTP headers sent with every request to ``url`` (an ``Authorization`` token, say).
        name: the server's name in messages (default: the command and its arguments, or the URL).
    """

    command: str | None = None
    args: list[str] = dataclasses.field(default_factory=list)
    env: dict[str, str] | None = None
    url: str | None = None
    headers: dict[str, str] | None = None
    name: str | None = None

    def problems(self) -> list[str]:
        """What is wrong with this entry, each naming the fix (empty: nothing)."""
        if (self.command is None) == (self.url is None):
            return [f"MCP server {self.label}: give command (a server lit-grpo starts over stdio) or url (a "
                    "streamable-HTTP server), exactly one"]
        if self.url is not None and (self.args or self.env):
            return [f"MCP server {self.label}: args and env are for a command; a url server is started elsewhere"]
        if self.command is not None and self.headers:
            return [f"MCP server {self.label}: headers are for a url server; a command's are its env"]
        if self.url is not None and not self.url.startswith(("http://", "https://")):
            return [f"MCP server {self.label}: url must be http:// or https:// (streamable HTTP), got {self.url!r}"]
        return []

    @property
    def label(self) -> str:
        if self.name:
            return self.name
        return self.url if self.command is None else " ".join([self.command, *self.args])

    @property
    def started_here(self) -> bool:
        return self.command is not None

    def program(self) -> str:
        """The command to run: ``python`` is this interpreter."""
        return sys.executable if self.command == "python" else str(self.command)


def server_problems(servers: Sequence[McpServer | dict[str, Any]], timeout: float | None = 1.0) -> list[str]:
    """What is wrong with each server entry (``McpServer`` or its fields as a mapping), every problem at once; with
    servers, a ``timeout`` of None too (an MCP call that hangs must end)."""
    problems = ["mcp_servers need a tool_timeout (seconds): an MCP call that hangs must end"] if servers and \
        timeout is None else []
    for server in servers:
        try:
            entry = server if isinstance(server, McpServer) else McpServer(**server)
        except TypeError as error:
            problems.append(f"an MCP server entry {server!r}: {error}")
            continue
        problems.extend(entry.problems())
    return problems


class McpTool:
    """One tool of an MCP server as the tool tasks call tools: ``tool(**arguments)`` answers the result's text
    (``McpToolError`` where the call failed); ``schema`` is what the chat template renders."""

    def __init__(self, client: Any, name: str, description: str | None, input_schema: dict[str, Any],
                 output_schema: dict[str, Any] | None = None) -> None:
        self.client, self.__name__ = client, name
        function = {"name": name, "description": description or "", "parameters": input_schema}
        if output_schema is not None:  # where transformers' get_json_schema puts a function's return type
            function["return"] = output_schema
        self.schema = {"type": "function", "function": function}

    def __call__(self, **arguments: Any) -> str:
        return self.client.call(self.__name__, arguments)

    def __repr__(self) -> str:
        return f"McpTool({self.__name__!r} of {self.client.server.label})"


class McpServers:
    """One client per server for a run: ``tools()`` starts them at first need (``InputError`` naming a server that
    does not start or list its tools) and gives every server's tools in order; ``close()`` stops them.

    Args:
        servers: the servers (``McpServer`` or its fields as a mapping).
        timeout: seconds each call may take before it fails (the task's tool timeout).
    """

    def __init__(self, servers: Sequence[McpServer | dict[str, Any]], timeout: float) -> None:
        self.servers = [s if isinstance(s, McpServer) else McpServer(**s) for s in servers]
        problems = server_problems(self.servers)
        if problems:
            raise InputError("; ".join(problems))
        self.timeout = timeout
        self.clients: list[Any] = []
        self._tools: list[McpTool] | None = None
        self._exit_hook = False

    def tools(self) -> list[McpTool]:
        if self._tools is None:
            from lit_grpo.mcp_tools.client import ServerClient  # the SDK, at first need

            if not self._exit_hook:
                atexit.register(self.close)
                self._exit_hook = True
            tools = []
            for server in self.servers:
                client = ServerClient(server, self.timeout)
                self.clients.append(client)
                tools.extend(McpTool(client, *listed) for listed in client.start())
            self._tools = tools
        return list(self._tools)

    def close(self) -> None:
        """Stop every client (a server lit-grpo started ends with it); a later ``tools()`` starts them again."""
        for client in self.clients:
            client.close()
        self.clients, self._tools = [], None
