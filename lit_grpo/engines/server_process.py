"""The vLLM server process a ``VLLMServerEngine`` starts itself: its command line and its stop."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from typing import TYPE_CHECKING

import torch

from lit_grpo.engines.server_address import ServerAddress

if TYPE_CHECKING:
    from lit_grpo.engines.vllm_server import VLLMServerEngine


def server_command(model_path: str, address: ServerAddress, engine: "VLLMServerEngine", dtype: str) -> list[str]:
    """``python -m vllm.entrypoints.openai.api_server`` at ``address`` with runtime LoRA and processed log-probs."""
    command = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server",
        "--model", model_path,
        *address.server_args(),
        "--dtype", dtype,
        "--kv-cache-memory-bytes", str(int(engine.kv_cache_gib * 2**30)),
        "--enable-lora",
        "--max-lora-rank", str(engine.max_lora_rank),
        "--max-loras", "1",
        "--logprobs-mode", "processed_logprobs",
        "--seed", str(engine.seed),
        "--generation-config", "vllm",  # neutral default sampling options, not the checkpoint's
    ]
    if engine.max_model_len is not None:
        command += ["--max-model-len", str(engine.max_model_len)]
    if engine.enforce_eager:
        command.append("--enforce-eager")
    if not torch.cuda.is_available():  # a CPU build here: whole prefills (VLLMEngine's chunked_prefill says why)
        command.append("--no-enable-chunked-prefill")
    return command + engine.server_args


def stop_process(process: subprocess.Popen | None, grace: float = 30.0) -> None:
    """SIGTERM to the server's process group (it was started in a session of its own), SIGKILL after ``grace``
    seconds."""
    if process is None or process.poll() is not None:
        return
    os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
