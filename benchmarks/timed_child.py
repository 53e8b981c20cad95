"""A command run as a timed child process, the way the benchmarks measure a run: its wall seconds, its peak RSS, its
output, a timeout; and the ``RESULT`` line a measuring child prints its figures on.

The peak RSS is the child's own (``os.wait4``'s ``ru_maxrss``: the largest resident set of the child and of the
processes it waited for), so a benchmark that runs several children in turn reads each one's peak, not the largest
so far (what ``resource.getrusage(RUSAGE_CHILDREN)`` gives). It is the figure the child's own
``getrusage(RUSAGE_SELF)`` gives at its end, and like that figure it is at least this process's resident set when
the child started (Linux keeps the high-water mark of the process image that ``exec`` replaces): the measuring
parent stays light (it imports no torch). The output goes to temporary files rather than pipes, so a child that
writes much never blocks on a full pipe, and the parent only waits.

    run = run_child([sys.executable, "-m", "lit_grpo.cli", "fit", ...], cwd=run_dir, timeout=1800)
    run.seconds, run.peak_rss_bytes, run.returncode, run.output, run.result()

The benchmarks that train through the command also share its command line (``fit_command``: the seed, no progress
bar, no checkpoint, a root directory of its own) and what its log says of held-out accuracy (``held_out_accuracies``).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

RESULT = "RESULT "  # a measuring child prints its figures on a line that starts with this, as JSON
ROOT = Path(__file__).resolve().parents[1]
LIT_GRPO = ROOT / ".venv" / "bin" / "lit-grpo"
# the command's validation lines: "before training: ... val/accuracy 0.123" and "after epoch 19: ... val/accuracy ..."
HELD_OUT_ACCURACY = re.compile(r"(before training|after epoch \d+): .*val/accuracy ([0-9.]+)")


@dataclass(frozen=True)
class ChildRun:
    """What one child did. ``returncode`` is None where the timeout stopped it (its whole process group killed);
    ``stderr`` is empty where it was merged into ``stdout``."""

    command: list[str]
    returncode: int | None
    stdout: str
    stderr: str
    seconds: float  # wall time from the start of the process to its exit
    peak_rss_bytes: float

    @property
    def timed_out(self) -> bool:
        return self.returncode is None

    @property
    def output(self) -> str:
        return self.stdout + self.stderr

    def result(self) -> dict[str, Any] | None:
        """The figures of the last ``RESULT`` line the child printed on stdout (None if it printed none)."""
        lines = [line for line in self.stdout.splitlines() if line.startswith(RESULT)]
        return json.loads(lines[-1][len(RESULT):]) if lines else None

    def last_line(self, stream: str = "stderr") -> str:
        """The last non-blank line of ``stream`` ("stderr" or "stdout"): where a failed run says why."""
        return (getattr(self, stream).strip().splitlines() or ["no output"])[-1]

    def checked(self, what: str) -> ChildRun:
        """This run, if it exited 0; else stops the benchmark with ``what`` and the end of the run's output."""
        if self.returncode != 0:
            stopped = "was stopped at its timeout" if self.timed_out else f"failed (exit {self.returncode})"
            raise SystemExit(f"{what} {stopped}:\n{self.output[-3000:]}")
        return self


def print_result(figures: Mapping[str, Any]) -> None:
    """In the measuring child: the one line ``ChildRun.result`` reads."""
    print(RESULT + json.dumps(figures), flush=True)


def with_checkout_on_path(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """``env`` (default: this process's) with the checkout first on ``PYTHONPATH``: a child started in another
    directory imports ``benchmarks.*`` (a callback named by class path, a measuring function) and this checkout's
    ``lit_grpo``."""
    env = dict(os.environ if env is None else env)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    return env


def run_child(command: Sequence[str], *, cwd: str | Path | None = None, env: Mapping[str, str] | None = None,
              timeout: float | None = None, merge_stderr: bool = False) -> ChildRun:
    """Run ``command`` to its end (or ``timeout`` seconds) in its own process group; see ``ChildRun``."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        started = time.perf_counter()
        process = subprocess.Popen(list(command), cwd=cwd, env=None if env is None else dict(env), text=True,
                                   stdout=out, stderr=out if merge_stderr else err, start_new_session=True)
        stopped = threading.Event()

        def stop() -> None:
            stopped.set()
            _kill_group(process.pid)

        timer = threading.Timer(timeout, stop) if timeout is not None else None
        if timer is not None:
            timer.start()
        try:
            _, status, usage = os.wait4(process.pid, 0)
        except BaseException:  # an interrupt of the benchmark takes its child down too (it has its own session)
            _kill_group(process.pid)
            raise
        finally:
            if timer is not None:
                timer.cancel()
        seconds = time.perf_counter() - started
        process.returncode = os.waitstatus_to_exitcode(status)  # reaped here, so Popen does not wait again
        out.seek(0)
        err.seek(0)
        return ChildRun(command=list(command), returncode=None if stopped.is_set() else process.returncode,
                        stdout=out.read(), stderr=err.read(), seconds=seconds,
                        peak_rss_bytes=usage.ru_maxrss * 1024.0)  # Linux counts ru_maxrss in KiB


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)  # the child's own group (start_new_session), none of ours
    except ProcessLookupError:
        pass


def fit_command(arguments: Sequence[str], seed: int, root_dir: str | Path, logger: Sequence[str] = ("--trainer.logger",
                "false"), then: Sequence[str] = ()) -> list[str]:
    """``lit-grpo fit`` with ``arguments`` (a ``--config`` first), seeded (the run and the prompts' order), ``logger``
    (the logger's arguments), no progress bar and no checkpoint, ``then`` (arguments after those), in ``root_dir``."""
    return [str(LIT_GRPO), "fit", *arguments, "--seed_everything", str(seed), "--data.seed", str(seed), *logger,
            "--trainer.enable_progress_bar", "false", "--trainer.enable_checkpointing", "false", *then,
            "--trainer.default_root_dir", str(root_dir)]


def held_out_accuracies(log: str, last_epoch: int) -> tuple[float, float]:
    """The held-out accuracy before training and after ``last_epoch`` (0-based), from the command's ``log``; a log
    whose first validation is not before training or whose last is not after ``last_epoch`` is refused."""
    found = HELD_OUT_ACCURACY.findall(log)
    if not found or found[0][0] != "before training" or found[-1][0] != f"after epoch {last_epoch}":
        raise SystemExit(f"expected validations before training and after epoch {last_epoch}, found {found}")
    return float(found[0][1]), float(found[-1][1])
