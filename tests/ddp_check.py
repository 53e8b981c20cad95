"""A 2-epoch fit, on 2 DDP ranks (gloo, CPU) or in one process, that writes what each rank trained on and the
adapter after every optimizer step. Run by test_ddp.py: DDP as a subprocess (Lightning re-launches this script for
rank 1), the one-process run in the test's own process.

Usage: python tests/ddp_check.py ddp CASE MODEL_DIR OUT_DIR, CASE one of ``CASES``
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch

sys.path.insert(0, str(Path(__file__).parent))

from support import DigitShareTask  # noqa: E402

from lit_grpo.callbacks import RolloutMetrics  # noqa: E402
from lit_grpo.rollout.datamodule import RolloutDataModule  # noqa: E402
from lit_grpo.engines import Completion, SamplingSpec  # noqa: E402
from lit_grpo.policy.module import PolicyModule  # noqa: E402

PROMPTS_PER_EPOCH, GROUP_SIZE, PPO_EPOCHS, ACCUMULATE = 8, 4, 2, 2
# the module's arguments per case: two aggregations of GRPO, PPO (value head, GAE whitened over the whole batch,
# KL in the reward) and GRPO with the batch's std (statistics that span every rank's rollouts)
CASES = {
    "token-mean": {"aggregation": "token-mean"},
    "seq-mean": {"aggregation": "seq-mean"},
    "ppo": {"aggregation": "token-mean", "advantage_mode": "gae", "kl": {"coef": 0.04, "applied_to": "reward"},
            "value": {"coef": 0.5}},
    "batch-std": {"aggregation": "seq-mean", "std_scope": "batch"},
}


class PerPromptSeededEngine:
    """Made-up completions (digits, letters, EOS) drawn from a generator seeded with ``sampling.seed + i`` for the
    i-th prompt, as vLLM seeds its requests: a prompt gets the same completions whichever rank draws it. No
    log-probs, so pi_old comes from the trainer's own (real) forward."""

    shared = True

    def __init__(self, token_ids: list[int], eos_id: int) -> None:
        self.token_ids, self.eos_id = token_ids, eos_id

    def push_policy(self, model: Any) -> None:
        pass

    def close(self) -> None:
        pass

    def generate(self, prompts: list[list[int]], n: int, sampling: SamplingSpec) -> list[list[Completion]]:
        groups = []
        for index in range(len(prompts)):
            generator = torch.Generator().manual_seed(sampling.seed + index)
            group = []
            for _ in range(n):
                length = int(torch.randint(1, sampling.max_new_tokens + 1, (1,), generator=generator))
                picks = torch.randint(len(self.token_ids), (length,), generator=generator).tolist()
                ids = [self.token_ids[p] for p in picks]
                stopped = length < sampling.max_new_tokens
                if stopped:
                    ids[-1] = self.eos_id
                group.append(Completion(tuple(ids), None, "stop" if stopped else "length"))
            groups.append(group)
        return groups


class Record(pl.Callback):
    """Per rank: each epoch's (prompt, completion) pairs and the synced ``rollout/reward_mean`` and
    ``rollout/policy_tokens``; the adapter after every optimizer step."""

    def __init__(self, out: Path) -> None:
        self.out, self.saved_step = out, 0

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: Any) -> None:
        buffer = trainer.datamodule.epoch_report.buffer
        self.pairs = [[p, c] for p, c in zip(buffer.prompt_texts, buffer.completion_texts)]

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if trainer.global_step != self.saved_step:
            self.saved_step = trainer.global_step
            adapter = {n: p.detach().clone() for n, p in pl_module.policy.named_parameters() if p.requires_grad}
            torch.save(adapter, self.out / f"rank{trainer.global_rank}_step{trainer.global_step}.pt")

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: Any) -> None:
        metrics = trainer.callback_metrics
        record = {"pairs": self.pairs, "reward_mean": float(metrics["rollout/reward_mean"]),
                  "policy_tokens": float(metrics["rollout/policy_tokens"])}
        path = self.out / f"rank{trainer.global_rank}_epoch{trainer.current_epoch}.json"
        path.write_text(json.dumps(record))


class FixedAdapterInit(pl.Callback):
    """The same non-zero adapter in every run (B too, so A gets a gradient at the first step)."""

    def on_fit_start(self, trainer: pl.Trainer, pl_module: Any) -> None:
        generator = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for name, param in sorted(pl_module.policy.named_parameters()):
                if param.requires_grad:
                    param.copy_(torch.randn(param.shape, generator=generator) * 0.1)


def run(mode: str, case: str, model_dir: str, out: Path) -> None:
    """``ddp``: 2 ranks with half the epoch's prompts each; ``single``: one process with all of them. The same
    optimizer steps cover the same sequences in both: each step takes the whole epoch's buffer (every rank's)."""
    if mode == "ddp":
        torch.set_num_threads(1)  # two ranks on two cores
    out.mkdir(parents=True, exist_ok=True)
    pl.seed_everything(0)
    ranks = 2 if mode == "ddp" else 1
    module = PolicyModule(model_name_or_path=model_dir, lora={"rank": 4, "alpha": 8}, dtype="float32",
                          optimizer=lambda p: torch.optim.SGD(p, lr=0.5), **{"kl": {"coef": 0.04}, **CASES[case]})
    rows_per_rank = PROMPTS_PER_EPOCH * GROUP_SIZE // ranks
    datamodule = RolloutDataModule(task=DigitShareTask(), engine=engine_for(model_dir), group_size=GROUP_SIZE,
                                   prompts_per_epoch=PROMPTS_PER_EPOCH, minibatch_size=rows_per_rank // ACCUMULATE,
                                   ppo_epochs=PPO_EPOCHS, max_new_tokens=6)
    trainer = pl.Trainer(
        strategy="ddp" if mode == "ddp" else "auto", devices=ranks, accelerator="cpu", max_epochs=2,
        accumulate_grad_batches=ACCUMULATE, reload_dataloaders_every_n_epochs=1, use_distributed_sampler=False,
        num_sanity_val_steps=0, limit_val_batches=0, logger=False, enable_checkpointing=False, default_root_dir=out,
        enable_progress_bar=False, enable_model_summary=False,
        callbacks=[FixedAdapterInit(), Record(out), RolloutMetrics(table_every_n_epochs=0)],
    )
    trainer.fit(module, datamodule)


def engine_for(model_dir: str) -> PerPromptSeededEngine:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    return PerPromptSeededEngine(tokenizer.convert_tokens_to_ids(list("0123456789ab+=")), tokenizer.eos_token_id)


if __name__ == "__main__":
    run(sys.argv[1], sys.argv[2], sys.argv[3], Path(sys.argv[4]))
