"""A real MCP server written with the SDK (``MCPServer``), started by the MCP tests over stdio (``python
tests/mcp_test_server.py stdio``) or streamable HTTP (``... http PORT``). Tools: ``add``, ``shout``, ``fail`` (an
error result), ``hang`` (never answers), ``crash`` (the process exits mid-call). ``MCP_TEST_LOG``: a file where each
process appends ``start <pid>`` and ``call <tool>``; ``MCP_TEST_CRASH_AT``: every tool call after that many in one
process ends the process mid-call (the scripted kill); ``MCP_TEST_TOOLS``: offer only these (comma-separated)."""

from __future__ import annotations

import os
import sys
import time

from mcp.server.mcpserver import MCPServer

LOG = os.environ.get("MCP_TEST_LOG")
CRASH_AT = int(os.environ.get("MCP_TEST_CRASH_AT", "0"))
ONLY = [name for name in os.environ.get("MCP_TEST_TOOLS", "").split(",") if name]
calls = 0


def log(line: str) -> None:
    if LOG:
        with open(LOG, "a") as handle:
            handle.write(f"{line}\n")


def counted(name: str) -> None:
    global calls
    calls += 1
    log(f"call {name}")
    if CRASH_AT and calls > CRASH_AT:
        log(f"crash {os.getpid()}")
        os._exit(3)


def add(a: int, b: int) -> int:
    """Add two integers."""
    counted("add")
    return a + b


def shout(text: str) -> str:
    """The text in capitals."""
    counted("shout")
    return text.upper()


def fail(reason: str) -> str:
    """Always fails, with the reason."""
    counted("fail")
    raise ValueError(reason)


def hang() -> str:
    """Never answers."""
    counted("hang")
    time.sleep(3600)
    return "late"


def crash() -> str:
    """Ends the server's process mid-call."""
    counted("crash")
    os._exit(4)


def multiply(x: str, y: str) -> str:
    """Multiply two registers (a stand-in: answers the product's name).

    Args:
        x: The name of the first register.
        y: The name of the second register.
    """
    counted("multiply")
    return f"{x}*{y}"


if __name__ == "__main__":
    server = MCPServer("lit-grpo-test", log_level="WARNING")
    for tool in (add, shout, fail, hang, crash, multiply):
        if not ONLY or tool.__name__ in ONLY:
            server.tool()(tool)
    log(f"start {os.getpid()}")
    if sys.argv[1] == "stdio":
        server.run("stdio")
    else:
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
