"""One MCP server's client, through the ``mcp`` SDK 2.x's ``Client``, in a daemon thread of its own with its own
asyncio loop: the trainer is synchronous, and what the SDK opens (a server process and its pipes, an HTTP session)
stays bound to that one loop (docs/guide.md#tools-from-mcp-servers).

The connection is held by one task on the loop (the SDK's ``async with Client(...)``, entered and left in that task);
calls run beside it, each bounded by the tool timeout. A call that times out, or whose connection closed under it,
fails, and the connection is taken for broken: the next call first restarts a server lit-grpo started (once per
run: a command that breaks a second time, or does not start again, is down, and its tools answer errors to the
end) or reconnects to a URL (at every next call, for as long as it fails). A server's own error result
(``isError``) or a protocol error fails the call and leaves the connection as it is.
"""

from __future__ import annotations

import asyncio
import json
import sys
import threading
from dataclasses import dataclass
from typing import Any

from lit_grpo.errors import InputError
from lit_grpo.mcp_tools.servers import McpServer, McpToolError

START_SECONDS = 30.0  # a server's start (a Python server imports the SDK: seconds) and its tool listing, at most
CLOSE_SECONDS = 10.0  # the SDK's own shutdown is bounded (it closes stdin, then terminates, then kills)


def sdk() -> Any:
    """The ``mcp`` package; ``InputError`` naming the install where it is not there."""
    try:
        import mcp
        import mcp.types  # noqa: F401 - the error codes
    except ImportError:
        raise InputError("MCP servers need the mcp SDK 2.x: pip install 'lit-grpo[mcp]' (mcp>=2,<3)") from None
    return mcp


@dataclass
class Connection:
    """A live connection: the SDK's client, the event that ends it, and the task holding it."""

    client: Any
    closing: asyncio.Event
    task: asyncio.Task


class ServerClient:
    """One server's client for a run: ``start()`` connects and lists the tools, ``call()`` runs one, ``close()``
    ends it (idempotent). ``starts`` counts the connections made (a command: its processes started); ``down`` is
    why its tools answer errors for the rest of the run (None while it may still answer)."""

    def __init__(self, server: McpServer, timeout: float) -> None:
        self.mcp = sdk()
        self.server, self.timeout = server, timeout
        self.starts, self.down = 0, None
        self.connection: Connection | None = None
        self.ending: list[Connection] = []  # broken connections whose server may still be shutting down
        self.lock = threading.Lock()  # one restart at a time; calls themselves run side by side
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name=f"lit-grpo-mcp-{server.label}"[:60],
                                       daemon=True)
        self.thread.start()

    def run(self, coroutine: Any, seconds: float) -> Any:
        """``coroutine``'s value, run on this client's loop and bounded by ``seconds`` (``TimeoutError``)."""
        future = asyncio.run_coroutine_threadsafe(asyncio.wait_for(coroutine, seconds), self.loop)
        return future.result(seconds + CLOSE_SECONDS)

    def start(self) -> list[tuple[str, str | None, dict[str, Any], dict[str, Any] | None]]:
        """Connect and list the tools, as ``(name, description, inputSchema, outputSchema)``; ``InputError`` naming
        the server
        where it does not start or answer."""
        try:
            self.connection, tools = self.run(self.connect(), START_SECONDS)
        except Exception as error:  # noqa: BLE001 - whatever stops a server at setup is the configuration's to fix
            self.close()
            raise InputError(f"MCP server {self.server.label}: did not start and list its tools within "
                             f"{START_SECONDS:g} s ({type(error).__name__}: {error})") from None
        return [(tool.name, tool.description, dict(tool.input_schema), tool.output_schema) for tool in tools]

    def call(self, name: str, arguments: dict[str, Any]) -> str:
        """The text of ``name``'s result; ``McpToolError`` where the call failed (its text names why)."""
        connection = self.connected()
        try:
            result = self.run(connection.client.call_tool(name, arguments), self.timeout)
        except (TimeoutError, asyncio.TimeoutError):
            self.broken(connection)
            raise McpToolError(f"{name} timed out after {self.timeout:g} s (MCP server {self.server.label})") from None
        except self.mcp.MCPError as error:
            if error.code not in (self.mcp.types.CONNECTION_CLOSED, self.mcp.types.REQUEST_TIMEOUT):
                raise McpToolError(f"{name}: {error.error.message}") from None  # the server answered: it is fine
            self.broken(connection)
            raise McpToolError(f"{name}: MCP server {self.server.label} is gone ({error.error.message})") from None
        except Exception as error:  # noqa: BLE001 - a transport's failure: the connection is broken
            self.broken(connection)
            raise McpToolError(f"{name}: MCP server {self.server.label} failed ({type(error).__name__}: "
                               f"{error})") from None
        text = result_text(result)
        if result.is_error:
            raise McpToolError(text)
        return text

    def connected(self) -> Connection:
        """The live connection, restarting or reconnecting a broken one; ``McpToolError`` where there is none."""
        with self.lock:
            if self.down is not None:
                raise McpToolError(self.down)
            if self.connection is None:
                if self.server.started_here and self.starts >= 2:
                    self.down = f"MCP server {self.server.label} is down (it failed again after its restart)"
                    raise McpToolError(self.down)
                try:
                    self.connection, _ = self.run(self.connect(), START_SECONDS)
                except Exception as error:  # noqa: BLE001 - any failure to come back
                    why = f"MCP server {self.server.label} did not come back ({type(error).__name__}: {error})"
                    if self.server.started_here:
                        self.down = why
                    raise McpToolError(why) from None
            return self.connection

    def broken(self, connection: Connection) -> None:
        """Take ``connection`` for broken: it is ended (a hung server process is stopped with it) and the next
        call makes a new one."""
        with self.lock:
            if self.connection is connection:
                self.connection = None
            self.ending = [c for c in self.ending if not c.task.done()] + [connection]
        self.loop.call_soon_threadsafe(connection.closing.set)

    async def connect(self) -> tuple[Connection, list[Any]]:
        """A new connection and the server's tools (every page)."""
        self.starts += 1
        opened: asyncio.Future = self.loop.create_future()
        closing = asyncio.Event()
        task = asyncio.ensure_future(self.hold(opened, closing))
        try:
            client, tools = await asyncio.shield(opened)
        except BaseException:
            task.cancel()
            raise
        return Connection(client, closing, task), tools

    async def hold(self, opened: asyncio.Future, closing: asyncio.Event) -> None:
        """Open the SDK's client, hand it and the tools to ``opened``, and hold it until ``closing`` is set."""
        try:
            async with self.transport() as target, self.mcp.Client(target) as client:
                tools, cursor = [], None
                while True:
                    page = await client.list_tools(cursor=cursor)
                    tools.extend(page.tools)
                    cursor = page.next_cursor
                    if cursor is None:
                        break
                opened.set_result((client, tools))
                await closing.wait()
        except Exception as error:  # noqa: BLE001 - a failure while held shows in the calls themselves
            if not opened.done():
                opened.set_exception(error)
        finally:
            if not opened.done():
                opened.set_exception(ConnectionError("the connection ended before it opened"))

    def transport(self) -> Any:
        """An async context giving what ``Client`` connects to: a stdio transport (the server started here, its
        stderr on the trainer's) or a streamable-HTTP one with the headers."""
        from contextlib import asynccontextmanager

        server = self.server

        @asynccontextmanager
        async def opened() -> Any:
            if server.command is not None:
                from mcp.client.stdio import stdio_client

                parameters = self.mcp.StdioServerParameters(command=server.program(), args=list(server.args),
                                                            env=dict(server.env) if server.env else None)
                yield stdio_client(parameters, errlog=sys.__stderr__ or sys.stderr)
                return
            import httpx2
            from mcp.client.streamable_http import streamable_http_client

            async with httpx2.AsyncClient(headers=dict(server.headers or {}),
                                          timeout=httpx2.Timeout(30.0, read=300.0)) as http:
                yield streamable_http_client(server.url, http_client=http)

        return opened()

    def close(self) -> None:
        """End the connection (a server started here ends with it) and the loop's thread (idempotent)."""
        with self.lock:
            connections = [c for c in [self.connection, *self.ending] if c is not None]
            self.connection, self.ending = None, []
            self.down = self.down or f"MCP server {self.server.label} was closed"
        if connections and self.loop.is_running():
            async def ended() -> None:  # every connection, a broken one still stopping its server included
                for connection in connections:
                    connection.closing.set()
                await asyncio.wait_for(asyncio.gather(*(asyncio.shield(c.task) for c in connections),
                                                      return_exceptions=True), CLOSE_SECONDS)

            try:
                asyncio.run_coroutine_threadsafe(ended(), self.loop).result(CLOSE_SECONDS + 5)
            except Exception:  # noqa: BLE001 - it is being dropped either way
                for connection in connections:
                    connection.task.cancel()
        if self.loop.is_running():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(timeout=5)


def result_text(result: Any) -> str:
    """What the model reads of a ``CallToolResult``: its text blocks joined by newlines; other blocks (an image, a
    resource) as their JSON; no block at all: the structured content as JSON."""
    parts = [block.text if getattr(block, "type", "") == "text" else block.model_dump_json(exclude_none=True)
             for block in result.content]
    if not parts and result.structured_content is not None:
        return json.dumps(result.structured_content)
    return "\n".join(parts)
