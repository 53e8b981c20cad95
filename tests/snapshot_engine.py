"""Test-only: an engine that samples from a copy of the weights it was pushed (as vLLM does), built on HFEngine, and
a callback recording each epoch's starting adapter, so a test can tell which adapter drew which epoch."""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import threading
import time
from typing import Any

import lightning.pytorch as pl
from peft import get_peft_model_state_dict

from lit_grpo.engines import HFEngine, SamplingSpec
from lit_grpo.engines.base import Completion


def adapter_checksum(model: Any) -> str:
    """A digest of the model's LoRA weights: equal digests, equal adapters."""
    digest = hashlib.sha1()
    for name, tensor in sorted(get_peft_model_state_dict(model).items()):
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()[:16]


class SnapshotHFEngine(HFEngine):
    """HFEngine sampling from a deep copy of the policy taken at each push; appends ``{"adapter", "seed"}`` per
    generate call to the JSON-lines file ``draws``."""

    samples_from_copy = True

    def __init__(self, draws: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.draws, self.pushed = draws, None

    def push_policy(self, model: Any) -> None:
        super().push_policy(copy.deepcopy(model))
        self.pushed = adapter_checksum(model)

    def generate(self, prompts: list[list[int]], n: int, sampling: SamplingSpec) -> list[list[Completion]]:
        with open(self.draws, "a") as log:
            log.write(json.dumps({"adapter": self.pushed, "seed": sampling.seed}) + "\n")
        return super().generate(prompts, n, sampling)


class AdapterLog(pl.Callback):
    """Appends ``{"epoch", "adapter"}`` at each training epoch's start (the adapter of that version) to ``path``."""

    def __init__(self, path: str) -> None:
        self.path = path

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: Any) -> None:
        with open(self.path, "a") as log:
            log.write(json.dumps({"epoch": trainer.current_epoch, "adapter": adapter_checksum(pl_module.policy)}) + "\n")


class StalledSnapshotHFEngine(SnapshotHFEngine):
    """Its ``stalled_draw``-th draw ahead (counting the sampled draws off the main thread from 1) hangs for
    ``stall_seconds`` first: a server gone silent."""

    def __init__(self, draws: str, stall_seconds: float, stalled_draw: int, **kwargs: Any) -> None:
        super().__init__(draws, **kwargs)
        self.stall_seconds, self.stalled_draw, self.drawn_ahead = stall_seconds, stalled_draw, 0

    def generate(self, prompts: list[list[int]], n: int, sampling: SamplingSpec) -> list[list[Completion]]:
        if sampling.seed is not None and threading.current_thread() is not threading.main_thread():
            self.drawn_ahead += 1
            if self.drawn_ahead == self.stalled_draw:
                time.sleep(self.stall_seconds)
        return super().generate(prompts, n, sampling)


class MuteSnapshotHFEngine(SnapshotHFEngine):
    """Returns its tokens without their log-probs (an engine that cannot report them)."""

    def generate(self, prompts: list[list[int]], n: int, sampling: SamplingSpec) -> list[list[Completion]]:
        return [[dataclasses.replace(c, logprobs=None) for c in group] for group in super().generate(prompts, n, sampling)]
