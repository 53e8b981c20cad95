"""Tools from two MCP servers through the ``lit-grpo`` command (issue 58): ``add`` from a stdio server lit-grpo
starts, ``multiply`` from a streamable-HTTP server the test starts, both the shipped registers server with the
test's hooks (tests/mcp_registers_test_server.py). The stdio server is killed mid-call at its third call, twice: the
calls in flight count as failures, it is restarted once, and then its tools answer errors to the end; the run
finishes. And the shipped config (configs/tools_mcp.yaml) trains as it is, shortened."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

from test_mcp_tools import free_port, http_server_at, stopped

pytestmark = pytest.mark.slow  # each runs the command

ROOT = Path(__file__).resolve().parents[1]
SERVER = str(ROOT / "tests" / "mcp_registers_test_server.py")


def fit(tmp_path: Path, *extra: str) -> tuple[subprocess.CompletedProcess, list[dict[str, float]]]:
    command = [sys.executable, "-m", "lit_grpo.cli", "fit", "--config", str(ROOT / "configs/tools_mcp.yaml"),
               "--trainer.enable_progress_bar", "false", "--trainer.logger", "lightning.pytorch.loggers.CSVLogger",
               "--trainer.logger.save_dir", str(tmp_path), "--data.group_size", "4",
               "--data.val_max_prompts", "2", *extra]
    result = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=600)
    rows = []
    for path in tmp_path.glob("**/metrics.csv"):
        with path.open() as handle:
            rows.extend({k: float(v) for k, v in row.items() if v} for row in csv.DictReader(handle))
    return result, rows


def test_the_shipped_config_trains_with_its_stdio_server(tmp_path):
    result, rows = fit(tmp_path, "--trainer.max_epochs", "1", "--data.prompts_per_epoch", "4")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    trained = [row for row in rows if "tools/calls/add" in row]
    assert trained and {"tools/calls/add", "tools/calls/multiply"} <= set(trained[0])  # the server's tools


def test_two_servers_train_and_a_killed_stdio_server_is_restarted_once_then_answers_errors(tmp_path):
    stdio_log, http_log, port = tmp_path / "stdio.log", tmp_path / "http.log", free_port()
    http = http_server_at([sys.executable, SERVER, "http", str(port)], port,
                          {"MCP_TEST_LOG": str(http_log), "MCP_TEST_TOOLS": "multiply", "PYTHONPATH": str(ROOT)})
    servers = [{"command": "python", "args": [SERVER, "stdio"], "name": "adder",
                "env": {"MCP_TEST_LOG": str(stdio_log), "MCP_TEST_TOOLS": "add", "MCP_TEST_CRASH_AT": "2",
                        "PYTHONPATH": str(ROOT)}},
               {"url": f"http://127.0.0.1:{port}/mcp", "name": "multiplier"}]
    try:
        result, rows = fit(tmp_path, "--trainer.max_epochs", "2", "--data.prompts_per_epoch", "8",
                           "--data.task.init_args.mcp_servers", json.dumps(servers))
    finally:
        stopped(http)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    lines = stdio_log.read_text().split("\n")
    assert [line.split()[0] for line in lines if line.startswith("start")] == ["start", "start"]  # restarted once
    assert lines.count("crash") == 2  # killed mid-call in each process
    answered = lines.count("ok add") + lines.count("error add")
    trained = [row for row in rows if "tools/calls/add" in row]
    episodes = 8 * 4  # per epoch: prompts x group
    calls = round(sum(row["tools/calls/add"] for row in trained) * episodes)
    failures = round(sum(row["tools/failures/add"] for row in trained) * episodes)
    assert calls - failures == lines.count("ok add")  # every answer the trainer took came from the server
    assert failures == lines.count("error add") + 2 + (calls - answered - 2)  # its errors, the 2 in flight, after
    assert calls > answered + 2  # calls came after the second kill: answered with errors, the run went on
    assert "ok multiply" in http_log.read_text().split("\n") or "error multiply" in http_log.read_text()
