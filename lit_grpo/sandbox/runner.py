"""One piece of Python code run in a child with limits (docs/guide.md#a-python-sandbox): this process's side.

``run_code`` starts ``sandbox/supervisor.py`` (``python -I``, an environment of a ``PATH`` and the scratch directory
only), hands it the code on stdin, reads the code's output up to its cap (past it: stopped), and waits for the
supervisor's status line, at most the wall time and ``GRACE`` s more (past it: killed). The call ends only once every
process the code started is gone (the output pipe reads its end only then).

``isolation_problem`` says once per process whether namespaces can be entered here (the kernel's own reason where
not): Docker's default seccomp profile and Ubuntu 24.04's AppArmor rule refuse unprivileged user namespaces.
"""

from __future__ import annotations

import functools
import json
import os
import selectors
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from lit_grpo.sandbox.limits import Limits
from lit_grpo.sandbox.pids import make_group, remove_group

SUPERVISOR = str(Path(__file__).with_name("supervisor.py"))
GRACE = 5.0  # seconds the supervisor has, past the wall time, to kill what is left and report
Isolation = Literal["namespaces", "none"]


@dataclass(frozen=True)
class Outcome:
    """How a call ended: ``status`` is ``"ok"`` (exit status 0, nothing left running) or what ended it
    (``"exit"``, ``"signal"``, ``"cpu"``, ``"timeout"``, ``"memory"``, ``"processes"``, ``"disk"``, ``"output"``,
    ``"stragglers"``, ``"setup"``, ``"lost"``); ``detail`` says it in words ("exited with status 1");
    ``output`` is stdout and stderr as the code wrote them, cut at the output cap."""

    status: str
    detail: str
    output: str

    @property
    def failed(self) -> bool:
        return self.status != "ok"


def sandbox_environment(scratch: str) -> dict[str, str]:
    """The code's whole environment: nothing of this process's."""
    return {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": scratch, "TMPDIR": scratch, "LANG": "C.UTF-8"}


def run_code(code: str, scratch: str | os.PathLike, limits: Limits, isolation: Isolation,
             interpreter: str | None = None, probe: bool = False) -> Outcome:
    """Run ``code`` in ``scratch`` under ``limits``; the outcome, never an exception for what the code did."""
    scratch = os.fspath(scratch)
    group = None if probe else make_group(limits.processes)
    try:
        return run_supervised(code, scratch, limits, isolation, interpreter, probe, group)
    finally:
        remove_group(group)


def run_supervised(code: str, scratch: str, limits: Limits, isolation: Isolation, interpreter: str | None,
                   probe: bool, group: Path | None) -> Outcome:
    status_read, status_write = os.pipe()
    config = {"cgroup": None if group is None else str(group / "cgroup.procs"), "limits": limits.as_config(),
              "scratch": scratch, "isolation": isolation, "probe": probe,
              "interpreter": interpreter or sys.executable, "environment": sandbox_environment(scratch),
              "status_fd": status_write}
    try:
        process = subprocess.Popen([sys.executable, "-I", SUPERVISOR, json.dumps(config)], stdin=subprocess.PIPE,
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, pass_fds=(status_write,),
                                   env=sandbox_environment(scratch), cwd=scratch, start_new_session=True)
    finally:
        os.close(status_write)
    try:
        assert process.stdin is not None and process.stdout is not None
        try:
            process.stdin.write(code.encode("utf-8", "surrogateescape"))
            process.stdin.close()
        except BrokenPipeError:
            pass
        output, status_text, cut = collect(process, status_read, limits)
    finally:
        os.close(status_read)
        end(process)
    try:
        status = json.loads(status_text.splitlines()[0])
    except (IndexError, ValueError):
        status = {"status": "lost", "detail": "ended without a report (the supervisor was killed)"}
    if cut:
        status = {"status": "output", "detail": f"wrote more than {limits.output_bytes} bytes of output (stopped)"}
    return Outcome(status["status"], status["detail"], output.decode("utf-8", "replace"))


def collect(process: subprocess.Popen, status_read: int, limits: Limits) -> tuple[bytes, str, bool]:
    """The code's output (at most the cap), the supervisor's status text, and whether the output passed the cap.
    Reads until both pipes end (every process that held them is gone) or the wall time and ``GRACE`` pass."""
    assert process.stdout is not None
    deadline = time.monotonic() + limits.wall_seconds + GRACE
    output, status, cut = bytearray(), bytearray(), False
    with selectors.DefaultSelector() as selector:
        selector.register(process.stdout, selectors.EVENT_READ, "output")
        selector.register(status_read, selectors.EVENT_READ, "status")
        while selector.get_map() and (left := deadline - time.monotonic()) > 0:
            for key, _ in selector.select(left):
                chunk = os.read(key.fd, 65536)
                if not chunk:
                    selector.unregister(key.fileobj)
                elif key.data == "status":
                    status += chunk
                elif len(output) + len(chunk) <= limits.output_bytes:
                    output += chunk
                else:
                    output += chunk[:limits.output_bytes - len(output)]
                    cut = True
                    selector.unregister(key.fileobj)
                    process.stdout.close()  # a writer now gets EPIPE
                    stop(process)
    if selector.get_map():  # past the deadline: nothing more is waited for
        os.killpg(process.pid, signal.SIGKILL) if process.poll() is None else None
    return bytes(output), status.decode(), cut


def stop(process: subprocess.Popen) -> None:
    """Ask the supervisor to end the call (it kills every process the code started, then reports)."""
    try:
        process.send_signal(signal.SIGTERM)
    except ProcessLookupError:
        pass


def end(process: subprocess.Popen) -> None:
    """The supervisor waited for (killed where it does not end within ``GRACE`` s)."""
    try:
        process.wait(GRACE)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
    for stream in (process.stdout, process.stdin):
        if stream is not None and not stream.closed:
            stream.close()


@functools.cache
def isolation_problem(interpreter: str | None = None) -> str | None:
    """None where namespaces (user where not root, mount, network, PID) can be entered here; else the kernel's
    reason, as it gave it."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="lit-grpo-probe-") as scratch:
        outcome = run_code("", scratch, Limits(wall_seconds=10), "namespaces", interpreter, probe=True)
    return None if outcome.status == "ok" else outcome.detail
