"""Clocks a speed benchmark adds to a ``lit-grpo fit`` child the LightningCLI way, by class path:

    --trainer.callbacks+='{"class_path": "benchmarks.speed.clocks.EpochClock", "init_args": {"path": "clock.json"}}'
    --trainer.callbacks+='{"class_path": "benchmarks.speed.clocks.StepClock", "init_args": {"cpu_flags": [...]}}'

The child needs the checkout on ``PYTHONPATH`` (``benchmarks.timed_child.with_checkout_on_path``) when it runs in
another directory. This module imports nothing of the command's, so a child that loads it loads what it did before.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from lightning.pytorch import Callback, LightningModule, Trainer

from benchmarks.timed_child import print_result


class EpochClock(Callback):
    """Writes to ``path`` (JSON) when training ends: the ``time.perf_counter()`` of every epoch's start and of the
    end of training, so consecutive differences are the epochs' seconds (a checkpoint written in between included)."""

    def __init__(self, path: str) -> None:
        self.path = Path(path)
        self.starts: list[float] = []

    def on_train_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.starts.append(time.perf_counter())

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.starts.append(time.perf_counter())
        self.path.write_text(json.dumps(self.starts))


class StepClock(Callback):
    """Prints one ``RESULT`` line (``benchmarks.timed_child``) when training ends: the seconds from the fit's start
    to the end of training (the model load excluded), the dtypes of the frozen base's parameters, which of
    ``cpu_flags`` torch sees on this CPU, and torch's threads. Nothing is printed if training fails."""

    def __init__(self, cpu_flags: list[str]) -> None:
        self.cpu_flags = list(cpu_flags)
        self.started: float | None = None

    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.started = time.perf_counter()

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        import torch

        ended = time.perf_counter()
        frozen = {str(p.dtype) for p in pl_module.parameters() if not p.requires_grad}
        capabilities: dict[str, Any] = dict(torch.cpu.get_capabilities())
        print_result({"step_s": ended - self.started if self.started is not None else None, "loaded": sorted(frozen),
                      "cpu": [flag for flag in self.cpu_flags if capabilities.get(flag)],
                      "threads": torch.get_num_threads()})
