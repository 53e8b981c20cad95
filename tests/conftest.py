"""Shared fixtures: tiny models built once per session, offline."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from lit_grpo.cli.idle_threads import idle_threads_sleep

# The suite's torch threads sleep when idle, as the command's do (lit_grpo/cli/idle_threads.py): set before torch
# loads. Spinning, they took the second core from what runs beside them (stand-in servers, reward workers, the
# background checkpoint writer, the command in a child process, another process on the machine) and the quick loop
# ran up to several times slower on a busy 2-core machine. The idle-threads tests set and clear the variable
# themselves.
TORCH_THREADS_SLEEP = idle_threads_sleep()

import torch  # noqa: E402  (after the policy is set: libgomp reads it when torch loads it)

from support import save_tiny_model  # noqa: E402

# Under pytest-xdist (``-n 2``, the quick loop's and CI's command) each worker takes one core; alone, the suite
# takes both.
torch.set_num_threads(1 if os.environ.get("PYTEST_XDIST_WORKER") else 2)


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_model(tmp_path_factory.mktemp("tiny-llama"), "llama")


@pytest.fixture(scope="session")
def tiny_gpt2_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_model(tmp_path_factory.mktemp("tiny-gpt2"), "gpt2")


def pytest_configure(config: pytest.Config) -> None:
    """Ctrl-C as a terminal delivers it, even when the suite itself was started with SIGINT ignored (``nohup cmd &``
    from a script: a shell without job control starts background commands so). The Ctrl-C tests send SIGINT to
    the run and to themselves; an inherited ``SIG_IGN`` would reach every command they start (a handler, unlike an
    ignored signal, is reset at exec) and make them fail for the way the suite was launched."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


# TRL's import sets VLLM_LOGGING_LEVEL=ERROR in os.environ (trl/_compat.py) when vLLM is installed; the tool tests
# import TRL while the suite collects, and every vLLM server started after that would inherit it and log no INFO
# line (tests/failover_check.py reads "Loaded new LoRA adapter" from a real server's log). The suite's children get
# the environment the suite started with.
VLLM_LOGGING_LEVEL = os.environ.get("VLLM_LOGGING_LEVEL")


def pytest_collection_finish(session: pytest.Session) -> None:
    if VLLM_LOGGING_LEVEL is None:
        os.environ.pop("VLLM_LOGGING_LEVEL", None)
    else:
        os.environ["VLLM_LOGGING_LEVEL"] = VLLM_LOGGING_LEVEL
