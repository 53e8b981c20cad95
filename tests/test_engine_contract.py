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
    from lit_grpo.cli import main

    monkeypatch.setattr(CannedEngine, "calls", [])
    monkeypatch.setattr(Kept, "rows", [])
    config = tmp_path / "engine.yaml"
    config.write_text(f"""
data:
  engine: {{class_path: {__name__}.CannedEngine}}
  group_size: 2
  prompts_per_epoch: 2
  minibatch_size: 4
  max_new_tokens: 3
trainer:
  max_epochs: 1
  logger: false
  enable_checkpointing: false
  enable_progress_bar: false
  num_sanity_val_steps: 0
  limit_val_batches: 0
  callbacks: [{{class_path: {__name__}.Kept}}]
model: {{model_name_or_path: {ROOT / "data" / "tiny-llama"}}}
metrics: {{table_every_n_epochs: 0}}
""")
    try:
        main(["fit", "--config", str(ROOT / "configs" / "quickstart.yaml"), "--config", str(config),
              "--trainer.default_root_dir", str(tmp_path)])
    except SystemExit as stop:
        assert not stop.code
    assert CannedEngine.calls == [("push_policy", "PeftModelForCausalLM"), ("generate", (2, 2, 3)), ("close", None)]
    assert Kept.rows == [list(CANNED)] * 4  # 2 prompts x 2 completions, every one the engine's
