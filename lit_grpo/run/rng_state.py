"""RngState: the random number generators' states in every checkpoint, as tensors and ints (weights_only-safe)."""

from __future__ import annotations

import random
from typing import Any

import lightning.pytorch as pl
import numpy as np
import torch


def capture_rng() -> dict[str, Any]:
    """Python's, NumPy's and torch's (CPU and, if present, CUDA) generator states, as tensors and ints."""
    version, python_words, gauss = random.getstate()
    kind, numpy_words, position, has_gauss, cached = np.random.get_state()
    state: dict[str, Any] = {
        "python": {"version": version, "words": torch.tensor(python_words, dtype=torch.int64), "gauss": gauss},
        "numpy": {"kind": kind, "words": torch.from_numpy(numpy_words.astype(np.int64)), "position": int(position),
                  "has_gauss": int(has_gauss), "cached": float(cached)},
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict[str, Any]) -> None:
    """Put back the generator states ``capture_rng`` returned."""
    python = state["python"]
    random.setstate((python["version"], tuple(python["words"].tolist()), python["gauss"]))
    numpy = state["numpy"]
    np.random.set_state((numpy["kind"], numpy["words"].numpy().astype(np.uint32), numpy["position"],
                         numpy["has_gauss"], numpy["cached"]))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


class RngState(pl.Callback):
    """Saves the generators' states with each checkpoint and restores them on resume, so a resumed run draws the
    same numbers as an uninterrupted one (model construction before the restore has consumed some). Rollout
    sampling and minibatch order have their own per-epoch seeds; this covers everything else (dropout, user code).
    ``PolicyModule.configure_callbacks`` adds one to any ``Trainer`` whose callbacks hold none (exact resume needs
    it)."""

    @property
    def state_key(self) -> str:
        return "RngState"

    def state_dict(self) -> dict[str, Any]:
        return capture_rng()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        restore_rng(state_dict)
