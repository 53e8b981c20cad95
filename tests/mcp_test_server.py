"""A real MCP server written with the SDK (``MCPServer``), started by the MCP tests over stdio (``python
tests/mcp_test_server.py stdio``) or streamable HTTP (``... http PORT``). Tools: ``add``, ``shout``, ``fail`` (an
error result), ``hang`` (never answers), ``crash`` (the process exits mid-call). ``MCP_TEST_LOG``: a file where each
process appends ``start <pid>`` and ``call <tool>``; ``MCP_TEST_CRASH_AT``: every tool call after that many in one
process ends the process mid-call (the scripted kill); ``MCP_TEST_TOOLS``: offer only these (comma-separated); ``MCP_TEST_KIT=registers``: ``add`` and ``multiply`` over
register names instead (the tool model's), logging ``ok <tool>`` or ``error <tool>`` per call."""

from __future__ import annotations

import os
import sys
import time

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

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
    raise ToolError(reason)


def hang() -> str:
    """Never answers."""
    counted("hang")
    time.sleep(3600)
    return "late"


def crash() -> str:
    """Ends the server's process mid-call."""
    counted("crash")
    os._exit(4)


def registers(x: str, y: str, name: str) -> str:
    counted(name)
    if x not in ("a", "b", "c", "r1", "r2", "r3"):
        log(f"error {name}")
        raise ToolError(f"no register {x!r}")
    log(f"ok {name}")
    return f"stored {x} and {y}"


def add_registers(x: str, y: str) -> str:
    """Add two registers and store the sum in a new register."""
    return registers(x, y, "add")


def multiply(x: str, y: str) -> str:
    """Multiply two registers and store the product in a new register."""
    return registers(x, y, "multiply")


if __name__ == "__main__":
    server = MCPServer("lit-grpo-test", log_level="CRITICAL")
    kit = (add_registers, multiply) if os.environ.get("MCP_TEST_KIT") == "registers" else (add, shout, fail, hang,
                                                                                            crash)
    for tool in kit:
        name = "add" if tool is add_registers else tool.__name__
        if not ONLY or name in ONLY:
            server.add_tool(tool, name=name)
    log(f"start {os.getpid()}")
    if sys.argv[1] == "stdio":
        server.run("stdio")
    else:
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
