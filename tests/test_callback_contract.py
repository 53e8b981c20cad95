"""What a new callback must be (CONTRIBUTING.md, "Adding a callback"): a ``lightning.pytorch.Callback`` named by class
path in a config's ``trainer.callbacks`` (with its ``init_args``), which ``lit-grpo fit`` runs beside its own
(``RolloutMetrics``, the checkpoint); it reads the rollout side only through what the data module declares
(``ReportsRollouts.epoch_report``, ``lit_grpo/buffers/protocols.py``)."""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
import pytest

from lit_grpo.buffers.protocols import ReportsRollouts
from support import fit_one_small_epoch


class HookLog(pl.Callback):
    """Records the hooks Lightning calls, with its ``label`` (set in the config) and each epoch's rollout rows."""

    seen: list[tuple[Any, ...]] = []

    def __init__(self, label: str = "unset") -> None:
        self.label = label

    def on_fit_start(self, trainer: pl.Trainer, pl_module: Any) -> None:
        names = {type(callback).__name__ for callback in trainer.callbacks}
        self.seen.append(("fit_start", self.label, "RolloutMetrics" in names))

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: Any) -> None:
        data = trainer.datamodule
        report = data.epoch_report if isinstance(data, ReportsRollouts) else None
        rows = None if report is None else report.buffer.input_ids.shape[0]
        self.seen.append(("train_epoch_end", trainer.current_epoch, rows))

    def on_fit_end(self, trainer: pl.Trainer, pl_module: Any) -> None:
        self.seen.append(("fit_end",))


@pytest.mark.slow  # one epoch of the command, in this process (~2 s alone)
def test_a_callback_named_in_the_config_runs_its_hooks_through_a_fit(tmp_path, monkeypatch):
    monkeypatch.setattr(HookLog, "seen", [])
    fit_one_small_epoch(tmp_path, [{"class_path": f"{__name__}.HookLog", "init_args": {"label": "from-the-config"}}])
    # 2 prompts x 2 completions: the epoch's 4 rows, read off the report the data module published
    assert HookLog.seen == [("fit_start", "from-the-config", True), ("train_epoch_end", 0, 4), ("fit_end",)]
