"""Shared fixtures: tiny models built once per session, offline."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from support import save_tiny_model

torch.set_num_threads(2)


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_model(tmp_path_factory.mktemp("tiny-llama"), "llama")


@pytest.fixture(scope="session")
def tiny_gpt2_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_model(tmp_path_factory.mktemp("tiny-gpt2"), "gpt2")
