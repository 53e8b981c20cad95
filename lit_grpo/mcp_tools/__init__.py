"""Tools served over the Model Context Protocol (docs/guide.md#tools-from-mcp-servers), through the ``mcp`` SDK 2.x
(the ``mcp`` extra): ``McpServer`` names a server (a command lit-grpo starts and talks to over stdio, or the URL of
a streamable-HTTP server someone else runs); ``McpServers`` holds one client per server for a run, each in a thread
of its own with its own asyncio loop, and gives its tools as callables (``McpTool``) whose JSON schema is the
server's ``inputSchema``. The tool tasks (``lit_grpo.tasks``) offer them beside their own tools; this part knows
nothing of tasks. Only ``client.py`` imports the SDK, at first need."""

from lit_grpo.mcp_tools.servers import McpServer, McpServers, McpTool, server_problems

__all__ = ["McpServer", "McpServers", "McpTool", "server_problems"]
