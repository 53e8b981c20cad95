"""The shipped registers server (lit_grpo/mcp_tools/registers_server.py) with the command test's hooks, over stdio
(``stdio``) or streamable HTTP (``http PORT``): ``MCP_TEST_TOOLS`` offers only these (comma-separated);
``MCP_TEST_LOG`` gets ``start <pid>``, ``call <tool>`` and ``ok <tool>``/``error <tool>`` lines; with
``MCP_TEST_CRASH_AT=N`` every call after the N-th of a process ends that process mid-call (the scripted kill)."""

from __future__ import annotations

import os
import sys

import anyio
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server

from lit_grpo.mcp_tools import registers_server as shipped

LOG = os.environ.get("MCP_TEST_LOG")
CRASH_AT = int(os.environ.get("MCP_TEST_CRASH_AT", "0"))
ONLY = os.environ.get("MCP_TEST_TOOLS", "add,multiply").split(",")
calls = 0


def log(line: str) -> None:
    if LOG:
        with open(LOG, "a") as handle:
            handle.write(f"{line}\n")


async def list_tools(context, params):
    listed = await shipped.list_tools(context, params)
    return type(listed)(tools=[tool for tool in listed.tools if tool.name in ONLY])


async def call_tool(context, params):
    global calls
    calls += 1
    log(f"call {params.name}")
    if CRASH_AT and calls > CRASH_AT:
        log("crash")
        os._exit(3)
    result = await shipped.call_tool(context, params)
    log(f"{'error' if result.is_error else 'ok'} {params.name}")
    return result


server = Server("lit-grpo-test-registers", on_list_tools=list_tools, on_call_tool=call_tool)


async def main() -> None:
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


if __name__ == "__main__":
    log(f"start {os.getpid()}")
    if sys.argv[1] == "stdio":
        anyio.run(main)
    else:
        import uvicorn

        uvicorn.run(server.streamable_http_app(), host="127.0.0.1", port=int(sys.argv[2]), log_level="warning")
