"""The issue's hostile code through the ``lit-grpo`` command: a tool environment (tests/hostile_sandbox.py) runs each
snippet of tests/hostile_code.py through ``PythonSandbox`` during a real run. Each is one counted tool failure, the
run finishes, nothing the code started is left running, what it attacked is intact, the scratch directories are
gone at the end. Skipped, with the kernel's reason, where namespaces are refused."""

from __future__ import annotations

import csv
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from hostile_code import SNIPPETS
from lit_grpo.sandbox.pids import make_group, remove_group
from lit_grpo.sandbox.runner import isolation_problem

pytestmark = pytest.mark.slow  # it runs the command

ROOT = Path(__file__).resolve().parents[1]
TESTS = Path(__file__).resolve().parent
PROBLEM = isolation_problem()
LIMITS = ("CPU time limit", "wall time")  # whichever a busy machine meets first
EXPECTED = {"infinite_loop": LIMITS, "fork_bomb": LIMITS, "memory_bomb": "MemoryError",
            "gigabyte_of_output": "bytes of output", "write_outside": "Read-only file system",
            "connect_local_server": "Network is unreachable", "kill_trainer": "ProcessLookupError",
            "os_exit": "exited with status 7", "segfault": "SIGSEGV", "setsid_background": "left 1 process(es)",
            "read_environ": "KeyError", "read_proc_environ": "FileNotFoundError"}


@pytest.mark.skipif(PROBLEM is not None, reason=f"the kernel refuses namespaces: {PROBLEM}")
def test_every_hostile_snippet_is_one_counted_failure_and_the_run_goes_on(tmp_path):
    group = make_group(1)
    remove_group(group)
    if os.geteuid() == 0 and group is None:
        pytest.skip("root without a writable pids cgroup: the fork bomb is not run on a shared machine")
    scratch_root, log, outside = tmp_path / "scratch", tmp_path / "hostile.jsonl", tmp_path / "escaped.txt"
    scratch_root.mkdir()
    victim = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", "stand-in-trainer"])
    with socket.create_server(("127.0.0.1", 0)) as server:
        server.settimeout(0.1)
        env = {**os.environ, "PYTHONPATH": f"{TESTS}{os.pathsep}{ROOT}", "TMPDIR": str(scratch_root),
               "HOSTILE_LOG": str(log), "HOSTILE_OUTSIDE": str(outside), "HOSTILE_VICTIM": str(victim.pid),
               "HOSTILE_PORT": str(server.getsockname()[1]), "TRAINER_SECRET": "hunter2"}
        command = [sys.executable, "-m", "lit_grpo.cli", "fit", "--config", str(ROOT / "configs/tools.yaml"),
                   "--trainer.max_epochs", "1", "--trainer.enable_progress_bar", "false",
                   "--trainer.logger", "lightning.pytorch.loggers.CSVLogger", "--trainer.logger.save_dir",
                   str(tmp_path), "--data.prompts_per_epoch", "8", "--data.group_size", "8",
                   "--data.val_max_prompts", "1",
                   "--data.task.init_args.environment", "hostile_sandbox.HostileRegisters"]
        try:
            result = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=600, env=env)
        finally:
            victim_alive = victim.poll() is None
            victim.kill()
            victim.wait()
        with pytest.raises(TimeoutError):
            server.accept()  # nobody connected
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    ran = [json.loads(line) for line in log.read_text().splitlines()]
    assert [entry["name"] for entry in ran] == list(SNIPPETS)  # each ran once, in order
    for entry in ran:
        expected = EXPECTED[entry["name"]]
        assert entry["failed"] and any(words in entry["text"] for words in
                                       (expected if isinstance(expected, tuple) else (expected,))), entry
        assert "hunter2" not in entry["text"]
    assert victim_alive and not outside.exists()
    assert list(scratch_root.iterdir()) == []  # every rollout's scratch directory removed by the end
    logged: dict[str, float] = {}
    for path in tmp_path.glob("**/metrics.csv"):
        with path.open() as handle:
            for row in csv.DictReader(handle):
                logged.update({k: float(v) for k, v in row.items() if v and not k.startswith("time/")})
    assert 0 < logged["tools/failure_frequency"] < 1.0  # the hostile calls failed, the harmless ones answered
