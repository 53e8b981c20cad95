"""The issue's hostile code (tests/hostile_code.py) run through ``PythonSandbox.python``: each call ends as one
``CodeFailed`` (one counted tool failure), nothing the code started is left running, and what it attacked is intact.
The cases that need namespaces are skipped with the kernel's reason where it refuses them; the others run with and
without namespaces."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from hostile_code import snippet
from lit_grpo.errors import InputError
from lit_grpo.sandbox import CodeFailed, Limits, PythonSandbox
from lit_grpo.sandbox.pids import make_group, remove_group
from lit_grpo.sandbox.runner import isolation_problem

PROBLEM = isolation_problem()
needs_namespaces = pytest.mark.skipif(PROBLEM is not None, reason=f"the kernel refuses namespaces: {PROBLEM}")
MODES = [pytest.param("namespaces", marks=needs_namespaces), "none"]


def sandbox(mode: str) -> PythonSandbox:
    kind = type("Small", (PythonSandbox,), {"isolation": mode, "limits": Limits(
        wall_seconds=3, cpu_seconds=2, memory_bytes=256 * 2**20, processes=16, output_bytes=4096)})
    instance = kind()
    instance.reset()
    return instance


def left_running(scratch: str) -> list[int]:
    """Processes whose working directory is the scratch directory (every process the code starts has it)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if os.readlink(f"/proc/{pid}/cwd") == scratch:
                found.append(int(pid))
        except OSError:
            continue
    return found


def hostile(box: PythonSandbox, name: str, **values: object) -> str:
    """The snippet's failure text; the call must fail, and leave nothing running."""
    with pytest.raises(CodeFailed) as failure:
        box.python(snippet(name, **values))
    assert left_running(box._scratch) == []
    return str(failure.value)


@pytest.fixture
def victim():
    """A stand-in trainer: a process of this user with a secret in its environment."""
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", "stand-in-trainer"],
                               env={**os.environ, "TRAINER_SECRET": "hunter2"})
    yield process
    process.kill()
    process.wait()


@pytest.mark.slow
@pytest.mark.parametrize("mode", MODES)
def test_an_infinite_loop_is_stopped(mode):
    text = hostile(sandbox(mode), "infinite_loop")
    assert "passed its CPU time limit of 2 s" in text or "ran past its wall time of 3 s" in text  # the first met


@pytest.mark.parametrize("mode", MODES)
def test_a_memory_bomb_fails_with_memory_error(mode):
    assert "MemoryError" in hostile(sandbox(mode), "memory_bomb")


@pytest.mark.parametrize("mode", MODES)
def test_a_gigabyte_of_output_is_stopped_at_the_cap(mode):
    text = hostile(sandbox(mode), "gigabyte_of_output")
    assert "more than 4096 bytes of output" in text
    assert text.count("x") == 4096


@pytest.mark.parametrize("mode", MODES)
def test_os_exit_is_a_failure_with_its_status(mode):
    assert "exited with status 7" in hostile(sandbox(mode), "os_exit")


@pytest.mark.parametrize("mode", MODES)
def test_a_segfault_is_a_failure_naming_the_signal(mode):
    assert "SIGSEGV" in hostile(sandbox(mode), "segfault")


@pytest.mark.parametrize("mode", MODES)
def test_a_setsid_background_process_is_killed_and_the_call_fails(mode):
    assert "left 1 process(es) running" in hostile(sandbox(mode), "setsid_background")


@pytest.mark.parametrize("mode", MODES)
def test_the_trainers_variables_are_not_in_the_codes_environment(mode, monkeypatch):
    monkeypatch.setenv("TRAINER_SECRET", "hunter2")
    text = hostile(sandbox(mode), "read_environ", secret="TRAINER_SECRET")
    assert "KeyError" in text and "hunter2" not in text


@pytest.mark.slow
@pytest.mark.parametrize("mode", MODES)
def test_a_fork_bomb_is_stopped(mode):
    group = make_group(1)
    remove_group(group)
    if os.geteuid() == 0 and group is None:  # RLIMIT_NPROC does not bind root: only the supervisor's count would
        pytest.skip("root without a writable pids cgroup: not run on a shared machine")
    hostile(sandbox(mode), "fork_bomb")


@needs_namespaces
def test_writing_outside_the_scratch_directory_fails():
    outside = Path(tempfile.mkdtemp(prefix="lit-grpo-outside-")) / "escaped.txt"
    try:
        assert "Read-only file system" in hostile(sandbox("namespaces"), "write_outside", outside=str(outside))
        assert not outside.exists()
    finally:
        outside.parent.rmdir()


@needs_namespaces
def test_a_server_on_127_0_0_1_is_not_reachable():
    with socket.create_server(("127.0.0.1", 0)) as server:
        server.settimeout(0.5)
        assert "Network is unreachable" in hostile(sandbox("namespaces"), "connect_local_server",
                                                   port=server.getsockname()[1])
        with pytest.raises(TimeoutError):
            server.accept()  # nobody came


@needs_namespaces
def test_the_trainers_process_cannot_be_killed(victim):
    assert "ProcessLookupError" in hostile(sandbox("namespaces"), "kill_trainer", victim=victim.pid)
    assert victim.poll() is None  # still running


@needs_namespaces
def test_the_trainers_proc_environ_cannot_be_read(victim):
    text = hostile(sandbox("namespaces"), "read_proc_environ", victim=victim.pid, trainer=os.getpid())
    assert "FileNotFoundError" in text and "hunter2" not in text


def test_files_persist_between_a_rollouts_calls_and_go_at_reset():
    box = sandbox("none")
    assert box.python("open('notes.txt', 'w').write('kept')\nprint('ok')") == "ok\n"
    assert box.python("print(open('notes.txt').read())") == "kept\n"
    first = box._scratch
    box.reset()
    assert not os.path.exists(first)
    with pytest.raises(CodeFailed, match="FileNotFoundError"):
        box.python("print(open('notes.txt').read())")


def test_the_tool_kit_keeps_it_in_process_past_the_timeout_and_counts_its_failure():
    from lit_grpo.tasks.tools.kit import ToolKit

    kit = ToolKit([], {None: type(sandbox("none"))}, timeout=0.01)  # a timeout no sandboxed call could keep
    box, _ = kit.open({"prompt": "x"})
    call = lambda code: {"type": "function", "function": {"name": "python", "arguments": {"code": code}}}  # noqa: E731
    answered, failed = box.call_turn([call("print(6 * 7)"), call("import os\nos._exit(7)")])
    assert box.host is None and kit.hosts == []
    assert answered.message["content"] == "42\n" and answered.failure is None
    assert failed.failure == "raised" and "exited with status 7" in failed.message["content"]
    box.release()
    kit.close()


def test_bad_limits_are_refused_each_by_name():
    kind = type("Bad", (PythonSandbox,), {"limits": Limits(wall_seconds=0, processes=-1), "isolation": "some"})
    with pytest.raises(InputError) as refusal:
        kind()
    assert "wall_seconds must be a positive number, got 0" in str(refusal.value)
    assert "processes must be a positive number, got -1" in str(refusal.value)
    assert "isolation must be 'auto', 'namespaces' or 'none', got 'some'" in str(refusal.value)
