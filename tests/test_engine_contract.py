"""What a new rollout engine must be (CONTRIBUTING.md, "Adding an engine"): ``lit_grpo.engines.base.RolloutEngine``'s
``shared`` flag and its three methods, nothing else. ``CannedEngine`` is the least such class; named as
``data.engine`` in a config, it draws an epoch of ``lit-grpo fit``: the data module pushes it the policy, asks it for
``group_size`` completions of each of the epoch's prompts, trains on what it returned, and closes it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest

from lit_grpo.engines import Completion, RolloutEngine, SamplingSpec
from support import fit_one_small_epoch

ROOT = Path(__file__).resolve().parents[1]
CANNED = (5, 6, 7)  # the token ids every completion holds, cut at the generation budget


class CannedEngine:
    """Answers every prompt with ``CANNED`` (no log-probs: the module computes pi_old itself); records each call."""

    shared = False
    calls: list[tuple[str, Any]] = []  # (method, what it was given), over every instance, in order

    def generate(self, prompts: list[list[int]], n: int, sampling: SamplingSpec) -> list[list[Completion]]:
        self.calls.append(("generate", (len(prompts), n, sampling.max_new_tokens)))
        ids = CANNED[:sampling.max_new_tokens]
        return [[Completion(ids, None, "length") for _ in range(n)] for _ in prompts]

    def push_policy(self, model: Any) -> None:
        self.calls.append(("push_policy", type(model).__name__))

    def close(self) -> None:
        self.calls.append(("close", None))


class Kept(pl.Callback):
    """Keeps each epoch's trained completions, as the data module handed them over (its ``epoch_report``)."""

    rows: list[list[int]] = []

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: Any) -> None:
        buffer = trainer.datamodule.epoch_report.buffer
        self.rows.extend(row[mask].tolist() for row, mask in zip(buffer.input_ids, buffer.completion_mask))


def test_the_least_engine_satisfies_the_interface():
    assert isinstance(CannedEngine(), RolloutEngine)
    assert not isinstance(object(), RolloutEngine)  # the check reads the members: it can fail


@pytest.mark.slow  # one epoch of the command, in this process (~2 s alone)
def test_an_engine_named_in_the_config_draws_the_epoch_the_module_trains_on(tmp_path, monkeypatch):
    monkeypatch.setattr(CannedEngine, "calls", [])
    monkeypatch.setattr(Kept, "rows", [])
    fit_one_small_epoch(tmp_path, [{"class_path": f"{__name__}.Kept"}],
                        engine={"class_path": f"{__name__}.CannedEngine"})
    assert CannedEngine.calls == [("push_policy", "PeftModelForCausalLM"), ("generate", (2, 2, 3)), ("close", None)]
    assert Kept.rows == [list(CANNED)] * 4  # 2 prompts x 2 completions, every one the engine's
