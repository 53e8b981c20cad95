"""Real tool episodes through a real Trainer, run in a subprocess by test_tool_episodes.py (an in-process vLLM engine
pins torch's thread count for its whole process): the tokens trained are the tokens the engine sampled, in every
episode of a run, on the hf engine and on the in-process vLLM engine. Prints one JSON line of measured figures.

Usage: python tests/tool_episodes_check.py {hf|vllm} {chains|tree} OUT_DIR
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch

from lit_grpo.callbacks import RolloutMetrics
from lit_grpo.engines import HFEngine, VLLMEngine
from lit_grpo.policy.module import PolicyModule
from lit_grpo.rollout.datamodule import RolloutDataModule
from lit_grpo.tasks.tools.arithmetic import Registers, register_answer
from lit_grpo.tasks.tools.task import ToolTask
from lit_grpo.tree import depth_first, policy_nodes

ROOT = Path(__file__).resolve().parents[1]


def recording(engine_class: type) -> type:
    """The engine class, unchanged, except that every completion it returns is also kept under its context (what the
    test compares the training rows with)."""

    class Recording(engine_class):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.sampled: dict[tuple[int, ...], list[Any]] = defaultdict(list)

        def generate(self, prompts, n, sampling):  # type: ignore[no-untyped-def]
            groups = super().generate(prompts, n, sampling)
            for prompt, group in zip(prompts, groups):
                self.sampled[tuple(prompt)] += group
            return groups

    return Recording


class CompareRows(pl.Callback):
    """At each epoch's first step, every training row against what the engine sampled for its context."""

    def __init__(self, engine: Any) -> None:
        self.engine, self.figures = engine, defaultdict(int)
        self.logp_diff_max: list[float] = []

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: Any, batch: Any, batch_idx: int) -> None:
        if batch_idx:
            return
        buffer = trainer.datamodule.epoch_report.buffer
        nodes = [node for root in buffer.trees for node in policy_nodes(root)]
        tokenizer = pl_module.tokenizer
        for row, node in enumerate(nodes):
            counted = buffer.input_ids[row][buffer.completion_mask[row]].tolist()
            drawn = [c for c in self.engine.sampled.get(tuple(node.context), []) if list(c.token_ids) == counted]
            self.figures["rows"] += 1
            self.figures["rows_equal_to_a_sample"] += bool(drawn) and counted == list(node.segment)
            # the same tokens drawn twice for one context may differ in their log-probs' last bits (another row of
            # the batch): the row's are one of those draws'
            self.figures["logprobs_the_samplers"] += any(list(c.logprobs) == list(node.logprobs) for c in drawn)
            self.figures["context_masked"] += not buffer.completion_mask[row, : len(node.context)].any()
            for child in node.children:
                if getattr(child, "segment", ()):
                    self.figures["turns_continued"] += 1
                    self.figures["context_is_parent_plus_reply"] += (
                        tuple(child.context) == tuple(node.context) + tuple(node.segment) + tuple(node.reply))
                    self.figures["reply_is_a_tool_message"] += tokenizer.decode(list(node.reply)).startswith(
                        "\n<|im_start|>user\n<tool_response>")
        self.figures["calls"] += sum(n.kind == "call" for root in buffer.trees for n in depth_first(root))

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: Any) -> None:
        self.logp_diff_max.append(float(trainer.callback_metrics["rollout/logp_diff_max"]))


def main() -> None:
    engine_name, rollout, out = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    pl.seed_everything(0)
    engine_class = recording(HFEngine if engine_name == "hf" else VLLMEngine)
    engine = engine_class() if engine_name == "hf" else engine_class(dtype="float32", kv_cache_gib=0.5)
    task = ToolTask(path=str(ROOT / "data" / "tool-arithmetic" / "rows.jsonl"), environment=Registers,
                    rewards=[register_answer], max_turns=3, heldout_size=200)  # configs/tools.yaml's task
    module = PolicyModule(model_name_or_path=str(ROOT / "data" / "tiny-qwen2-tools"), kl={"coef": 0.04},
                          dtype="float32", optimizer=lambda p: torch.optim.AdamW(p, lr=1e-3, weight_decay=0.0))
    # chains as configs/tools.yaml draws them (64 episodes of 350-id prompts: more than a vLLM batch's token budget)
    shape = dict(group_size=8, prompts_per_epoch=8) if rollout == "chains" else dict(
        branching=[2, 2, 2], group_size=4, prompts_per_epoch=4)
    datamodule = RolloutDataModule(task=task, engine=engine, rollout=rollout, minibatch_size=64, max_new_tokens=48,
                                   **shape)
    compare = CompareRows(engine)
    trainer = pl.Trainer(max_epochs=2, reload_dataloaders_every_n_epochs=1, num_sanity_val_steps=0,
                         limit_val_batches=0, callbacks=[compare, RolloutMetrics(table_every_n_epochs=0)], default_root_dir=out, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(module, datamodule)
    print("FIGURES " + json.dumps({**compare.figures, "logp_diff_max_per_epoch": compare.logp_diff_max}))


if __name__ == "__main__":
    main()
