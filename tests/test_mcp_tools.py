"""Tools from MCP servers (lit_grpo/mcp_tools/), with real servers written with the SDK (tests/mcp_test_server.py)
that the tests start, over stdio and streamable HTTP: the listed tools' schemas, a call, an error result counted, a
crashed stdio server restarted once and then down, a hung call a timeout failure, a URL server reconnected; and
the configuration's mistakes, each one message."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lit_grpo.errors import InputError
from lit_grpo.mcp_tools import McpServer, McpServers
from lit_grpo.mcp_tools.servers import McpToolError
from lit_grpo.tasks.tools.kit import ToolKit
from lit_grpo.tasks.tools.task import ToolTask

TESTS = Path(__file__).resolve().parent
SERVER = str(TESTS / "mcp_test_server.py")


def stdio(log: Path, **env: str) -> McpServer:
    return McpServer(command="python", args=[SERVER, "stdio"], env={"MCP_TEST_LOG": str(log), **env}, name="test")


def call(name: str, **arguments) -> dict:
    return {"type": "function", "function": {"name": name, "arguments": arguments}}


def starts(log: Path) -> int:
    return log.read_text().split().count("start")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def http_server(port: int, log: Path) -> subprocess.Popen:
    """The test server on streamable HTTP at 127.0.0.1:port, once it accepts connections."""
    return http_server_at([sys.executable, SERVER, "http", str(port)], port, {"MCP_TEST_LOG": str(log)})


def http_server_at(command: list[str], port: int, env: dict[str, str]) -> subprocess.Popen:
    """``command`` started, serving HTTP at 127.0.0.1:port, once it accepts connections."""
    process = subprocess.Popen(command, env={**os.environ, **env}, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    for _ in range(300):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.1).close()
            return process
        except OSError:
            time.sleep(0.1)
    process.kill()
    raise RuntimeError("the test's HTTP MCP server did not start")


def stopped(process: subprocess.Popen) -> None:
    process.kill()
    process.wait()


def test_a_bad_entry_and_a_missing_timeout_are_one_message_naming_each():
    with pytest.raises(InputError) as raised:
        ToolTask(records=[{"prompt": "x"}] * 4, rewards=[lambda **k: [0.0]], tool_timeout=None,
                 mcp_servers=[McpServer(command="srv", url="http://x/mcp"), McpServer(url="ftp://x")])
    message = str(raised.value)
    assert "mcp_servers need a tool_timeout" in message
    assert "MCP server srv: give command (a server lit-grpo starts over stdio) or url" in message
    assert "MCP server ftp://x: url must be http:// or https://" in message


def test_without_the_sdk_one_message_names_the_install(monkeypatch):
    from lit_grpo.mcp_tools import client

    monkeypatch.setitem(sys.modules, "mcp", None)
    with pytest.raises(InputError, match=r"pip install 'lit-grpo\[mcp\]'"):
        client.sdk()


@pytest.mark.slow
def test_a_server_that_does_not_start_is_one_message_naming_it():
    servers = McpServers([McpServer(command="python", args=["-c", "pass"], name="broken")], timeout=5)
    with pytest.raises(InputError, match="MCP server broken: did not start and list its tools"):
        servers.tools()


@pytest.mark.slow
def test_stdio_tools_are_listed_as_schemas_called_and_an_error_result_counted(tmp_path):
    def local(text: str) -> str:
        """Echo.

        Args:
            text: The text.
        """
        return text

    log = tmp_path / "log"
    kit = ToolKit([local], None, timeout=5, servers=McpServers([stdio(log, MCP_TEST_TOOLS="add,fail")], 5))
    try:
        schemas = {schema["function"]["name"]: schema for schema in kit.schemas()}
        assert list(schemas) == ["local", "add", "fail"]
        add = schemas["add"]["function"]
        assert add["description"] == "Add two integers."
        assert add["parameters"]["properties"] == {"a": {"title": "A", "type": "integer"},
                                                   "b": {"title": "B", "type": "integer"}}
        assert add["parameters"]["required"] == ["a", "b"]
        box, _ = kit.open({})
        outcomes = box.call_turn([call("add", a=2, b=3), call("local", text="hi"), call("fail", reason="no luck")])
        assert [o.message["content"] for o in outcomes] == ["5", "hi", str({"error": "Error executing tool fail: no luck"})]
        assert [o.failure for o in outcomes] == [None, None, "raised"]
        box.release()
    finally:
        kit.close()
    assert log.read_text().split("\n")[1:3] == ["call add", "call fail"]


@pytest.mark.slow
def test_a_crashed_stdio_server_is_restarted_once_then_its_tools_answer_errors(tmp_path):
    log = tmp_path / "log"
    kit = ToolKit([], None, timeout=5, servers=McpServers([stdio(log)], 5))
    try:
        box, _ = kit.open({})
        turns = [[call("add", a=1, b=1)], [call("crash")], [call("add", a=2, b=2)], [call("crash")],
                 [call("add", a=3, b=3)]]
        outcomes = [box.call_turn(turn)[0] for turn in turns]
        assert [o.failure for o in outcomes] == [None, "raised", None, "raised", "raised"]
        assert outcomes[0].message["content"] == "2" and outcomes[2].message["content"] == "4"  # after the restart
        assert "is gone" in outcomes[1].message["content"]  # the call in flight
        assert "is down (it failed again after its restart)" in outcomes[4].message["content"]
        box.release()
    finally:
        kit.close()
    assert starts(log) == 2  # started, restarted once, never again
    assert log.read_text().split().count("call") == 4  # the last call never reached a server


@pytest.mark.slow
def test_a_hung_call_is_a_timeout_failure_and_the_server_comes_back(tmp_path):
    log = tmp_path / "log"
    servers = McpServers([stdio(log)], timeout=1)
    try:
        tools = {tool.__name__: tool for tool in servers.tools()}
        with pytest.raises(McpToolError, match=r"hang timed out after 1 s \(MCP server test\)"):
            tools["hang"]()
        assert tools["shout"](text="up") == "UP"  # a fresh process: the hung one was stopped
    finally:
        servers.close()
    assert starts(log) == 2
    assert server_processes() == []  # the hung one and the fresh one: both ended by close, none outlives it


def server_processes() -> list[str]:
    """This process's children still serving (an MCP test server it started)."""
    found = subprocess.run(["pgrep", "-P", str(os.getpid()), "-a"], capture_output=True, text=True).stdout
    return [line for line in found.splitlines() if "mcp_test_server" in line]


@pytest.mark.slow
def test_an_http_server_is_reconnected_after_it_went_away(tmp_path):
    log, port = tmp_path / "log", free_port()
    process = http_server(port, log)
    servers = McpServers([McpServer(url=f"http://127.0.0.1:{port}/mcp", headers={"X-Token": "t"})], timeout=5)
    try:
        tools = {tool.__name__: tool for tool in servers.tools()}
        assert tools["add"](a=1, b=2) == "3"
        stopped(process)
        with pytest.raises(McpToolError):
            tools["add"](a=1, b=2)
        with pytest.raises(McpToolError, match="did not come back"):  # still away: this call fails, not the run
            tools["add"](a=1, b=2)
        process = http_server(port, log)
        assert tools["add"](a=2, b=5) == "7"  # reconnected
    finally:
        servers.close()
        stopped(process)


def test_replayed_answer_numbers_results_as_the_stateless_server_does():
    from lit_grpo.tasks.tools.arithmetic import replayed_answer

    def calls(*named):
        return {"role": "assistant", "tool_calls": [call(name, x=x, y=y) for name, x, y in named]}

    plan = [calls(("multiply", "a", "b")), {"role": "tool", "content": "r1 = a * b"}, calls(("add", "r1", "c")),
            {"role": "tool", "content": "r2 = r1 + c"}]
    episodes = [plan + [{"role": "assistant", "content": "The answer is r2."}],  # 75*8 + 72 = 672
                plan + [{"role": "assistant", "content": "The answer is r1."}],  # 600
                [calls(("add", "r1", "a")), {"role": "assistant", "content": "The answer is r2."}]]  # r1 not held
    assert replayed_answer([None] * 3, episodes, ["672"] * 3, [[75, 8, 72]] * 3) == [1.0, 0.0, 0.0]
