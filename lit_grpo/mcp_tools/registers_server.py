"""The MCP server of the shipped MCP config (configs/tools_mcp.yaml), written with the ``mcp`` SDK's low-level
``Server``: ``add`` and ``multiply`` over named registers, with the very schemas ``lit_grpo.tasks.tools.arithmetic
.Registers`` gives them (the prompt the tiny tool model data/tiny-qwen2-tools learnt to call them from). One server
serves every rollout of a run, so it keeps no registers: it checks the names and answers where the result goes and
what it holds (``r2 = r1 + c``, by ``result_register``'s rule); the reward (``tools.arithmetic.replayed_answer``)
replays the episode's calls by the same rule on the row's numbers. lit-grpo runs it over stdio:
``python -m lit_grpo.mcp_tools.registers_server``."""

from __future__ import annotations

import re
from typing import Any

import anyio
import mcp.types as types
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server

REGISTER = re.compile(r"[abc]|r[1-9][0-9]*")
OPERATIONS = {"add": ("+", "Add two registers and store the sum in a new register."),
              "multiply": ("*", "Multiply two registers and store the product in a new register.")}
PARAMETERS = {"type": "object", "properties": {"x": {"type": "string", "description": "The name of the first register."},
                                               "y": {"type": "string", "description": "The name of the second register."}},
              "required": ["x", "y"]}


async def list_tools(context: Any, params: Any) -> types.ListToolsResult:
    return types.ListToolsResult(tools=[types.Tool(name=name, description=text, input_schema=PARAMETERS,
                                                   output_schema={"type": "string"})
                                        for name, (_, text) in OPERATIONS.items()])


def answer(text: str, error: bool = False) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)], is_error=error,
                                structured_content=None if error else text)


async def call_tool(context: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
    arguments = params.arguments or {}
    if params.name not in OPERATIONS:
        return answer(f"there is no tool {params.name!r}; the tools are add and multiply", error=True)
    if sorted(arguments) != ["x", "y"]:
        return answer(f"{params.name} takes x and y (register names), got {sorted(arguments)}", error=True)
    for name in (arguments["x"], arguments["y"]):
        if not isinstance(name, str) or not REGISTER.fullmatch(name):
            return answer(f"no register {name!r}; the registers are a, b, c and the results r1, r2, ...", error=True)
    x, y = arguments["x"], arguments["y"]
    return answer(f"{result_register(x, y)} = {x} {OPERATIONS[params.name][0]} {y}")


def result_register(x: str, y: str) -> str:
    """Where a result goes without state: one past the highest result register among the operands (``add(a, b)``:
    ``r1``; ``add(r1, c)``: ``r2``), as ``Registers`` numbers the two calls of every planned solution."""
    return f"r{1 + max((int(name[1:]) for name in (x, y) if name.startswith('r')), default=0)}"


server = Server("lit-grpo-registers", on_list_tools=list_tools, on_call_tool=call_tool)


async def main() -> None:
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


if __name__ == "__main__":
    anyio.run(main)
