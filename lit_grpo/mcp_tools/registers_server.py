"""The MCP server of the shipped MCP config (configs/tools_mcp.yaml), written with the ``mcp`` SDK's ``MCPServer``:
``add`` and ``multiply`` over named registers, as ``lit_grpo.tasks.tool_arithmetic.Registers`` offers them, for the
tiny tool model (data/tiny-qwen2-tools) that learnt to call them. One server serves every rollout of a run, so it
keeps no registers: it checks the names and says what it stored; the reward (``tool_arithmetic.replayed_answer``)
replays the episode's calls on the row's numbers. Run by lit-grpo over stdio: ``python -m
lit_grpo.mcp_tools.registers_server`` (``--http PORT`` serves streamable HTTP on 127.0.0.1 instead)."""

from __future__ import annotations

import re
import sys

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

server = MCPServer("lit-grpo-registers", log_level="WARNING")
REGISTER = re.compile(r"[abc]|r[1-9][0-9]*")


def checked(*names: str) -> None:
    for name in names:
        if not REGISTER.fullmatch(name):
            raise ToolError(f"no register {name!r}; the registers are a, b, c and the results r1, r2, ...")


@server.tool()
def add(x: str, y: str) -> str:
    """Add two registers and store the sum in a new register.

    Args:
        x: The name of the first register.
        y: The name of the second register.
    """
    checked(x, y)
    return f"stored {x} + {y} in the next register"


@server.tool()
def multiply(x: str, y: str) -> str:
    """Multiply two registers and store the product in a new register.

    Args:
        x: The name of the first register.
        y: The name of the second register.
    """
    checked(x, y)
    return f"stored {x} * {y} in the next register"


if __name__ == "__main__":
    if sys.argv[1:2] == ["--http"]:
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        server.run("stdio")
