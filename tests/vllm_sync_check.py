"""Real-vLLM checks for one push strategy, run in a subprocess by test_vllm_engine.py (an in-process engine pins
torch's thread count for its whole process). Prints one JSON line of measured figures.

Every check runs on a copy of the model whose generation_config.json sets every sampling option a released
checkpoint can carry (``support.PENALISING_GENERATION``): the engine must sample what the SamplingSpec says.

Usage: python tests/vllm_sync_check.py {merged|adapter} OUT_DIR [MODEL_DIR]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lit_grpo.callbacks import RolloutMetrics
from support import eval_logprobs, penalised_copy

from lit_grpo.buffers.positions import FirstTokenConstraint
from lit_grpo.engines import HFEngine, SamplingSpec, VLLMEngine
from lit_grpo.policy.module import PolicyModule
from lit_grpo.rollout.datamodule import RolloutDataModule
from lit_grpo.tasks import ArithmeticTask

DATA = Path(__file__).resolve().parents[1] / "data"


class SyncLog(pl.Callback):
    """Reads the sampler/trainer agreement Lightning logged for each epoch."""

    def __init__(self) -> None:
        self.diff_max: list[float] = []

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: Any) -> None:
        self.diff_max.append(float(trainer.callback_metrics["rollout/logp_diff_max"]))


def train_two_epochs(engine: VLLMEngine, root: Path, model: Path) -> tuple[PolicyModule, RolloutDataModule, list[float]]:
    pl.seed_everything(0)
    module = PolicyModule(model_name_or_path=str(model), kl={"coef": 0.04}, dtype="float32",  # exact agreement needs fp32
                          optimizer=lambda p: torch.optim.AdamW(p, lr=5e-3, weight_decay=0.0))
    datamodule = RolloutDataModule(task=ArithmeticTask(), engine=engine, group_size=8, prompts_per_epoch=16,
                                   minibatch_size=64, max_new_tokens=6)
    sync = SyncLog()
    trainer = pl.Trainer(max_epochs=2, reload_dataloaders_every_n_epochs=1, num_sanity_val_steps=0,
                         limit_val_batches=0, callbacks=[sync, RolloutMetrics(table_every_n_epochs=0)],
                         default_root_dir=root, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(module, datamodule)
    return module, datamodule, sync.diff_max


def sampler_vs_trainer(engine: VLLMEngine, module: PolicyModule, prompts: list[list[int]]) -> float:
    """max |sampler log-prob - trainer log-prob| of sampled tokens under the module's current weights."""
    spec = SamplingSpec(max_new_tokens=6, temperature=1.0, seed=7, stop_token_ids=module.stop_token_ids)
    groups = engine.generate(prompts, 4, spec)
    worst = 0.0
    for prompt, group in zip(prompts, groups):
        for completion in group:
            ids = torch.tensor([prompt + list(completion.token_ids)])
            logp = eval_logprobs(module.policy, ids, torch.ones_like(ids, dtype=torch.bool), 1.0)
            trainer_lp = logp[0, len(prompt):]
            worst = max(worst, (trainer_lp - torch.tensor(completion.logprobs)).abs().max().item())
    return worst


def restricted_check(engine: VLLMEngine, module: PolicyModule, prompts: list[list[int]]) -> dict[str, Any]:
    """First-token constraints: the first token is always allowed, a single allowed token has log-prob 0, and the
    sampler's log-probs equal the trainer's under the same renormalised first-token distribution."""
    tokenizer = module.tokenizer
    one, two = (tokenizer(d, add_special_tokens=False)["input_ids"][0] for d in ("1", "2"))
    allowed = tuple((one,) if k % 3 == 0 else (one, two) if k % 3 == 1 else None for k in range(len(prompts)))
    spec = SamplingSpec(max_new_tokens=6, temperature=1.0, seed=11, stop_token_ids=module.stop_token_ids,
                        allowed_token_ids=allowed)
    groups = engine.generate(prompts, 4, spec)
    first_allowed, single_zero, worst = True, 0.0, 0.0
    for prompt, group, ids in zip(prompts, groups, allowed):
        for completion in group:
            row = torch.tensor([prompt + list(completion.token_ids)])
            table = torch.tensor([list(ids) if ids is not None else [-1]])
            constraint = FirstTokenConstraint(torch.tensor([len(prompt)]), table)
            logp = eval_logprobs(module.policy, row, torch.ones_like(row, dtype=torch.bool), 1.0,
                                             constraint=constraint)[0, len(prompt):]
            worst = max(worst, (logp - torch.tensor(completion.logprobs)).abs().max().item())
            if ids is not None:
                first_allowed &= completion.token_ids[0] in ids
                if len(ids) == 1:
                    single_zero = max(single_zero, abs(completion.logprobs[0]))
    return {"restricted_first_allowed": first_allowed, "restricted_single_logp": single_zero,
            "restricted_diff": worst}


def lengths_past_eos(engine: VLLMEngine, module: PolicyModule, prompts: list[list[int]]) -> list[int]:
    """Completion lengths when the first token is forced to be the model's EOS and the spec lists no stop id: the
    checkpoint's EOS ids must not end a completion the trainer will score as unfinished."""
    eos = module.stop_token_ids[0]
    spec = SamplingSpec(max_new_tokens=4, temperature=1.0, seed=5, allowed_token_ids=((eos,),) * len(prompts))
    return [len(c.token_ids) for group in engine.generate(prompts, 2, spec) for c in group]


def greedy_matches(engine: VLLMEngine, module: PolicyModule, prompts: list[list[int]]) -> int:
    spec = SamplingSpec(max_new_tokens=6, greedy=True, stop_token_ids=module.stop_token_ids)
    hf = HFEngine()
    hf.push_policy(module.policy)
    ours = engine.generate(prompts, 1, spec)
    reference = hf.generate(prompts, 1, spec)
    return sum(a[0].token_ids == b[0].token_ids for a, b in zip(ours, reference))


def perturb_adapter(module: PolicyModule) -> None:
    generator = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, param in module.policy.named_parameters():
            if "lora_B" in name and param.requires_grad:
                param.add_(torch.randn(param.shape, generator=generator) * 0.05)


def main(strategy: str, root: Path, model: Path) -> None:
    torch.manual_seed(0)
    engine = VLLMEngine(push_strategy=strategy, kv_cache_gib=0.25, shared=True)  # max_model_len: the model's own
    model = penalised_copy(model, root / "penalised-model")
    module, datamodule, diff_max = train_two_epochs(engine, root, model)
    records = list(ArithmeticTask().heldout_records())
    prompts = [module.tokenizer(r["prompt"])["input_ids"] for r in records[:32]]
    engine.push_policy(module.policy)
    figures: dict[str, Any] = {"strategy": strategy, "logp_diff_max_per_epoch": diff_max}
    figures["greedy_equal"] = greedy_matches(engine, module, prompts)
    figures["synced_diff"] = sampler_vs_trainer(engine, module, prompts[:8])
    figures.update(restricted_check(engine, module, prompts[:9]))
    figures["lengths_past_eos"] = lengths_past_eos(engine, module, prompts[:3])
    perturb_adapter(module)
    figures["stale_diff"] = sampler_vs_trainer(engine, module, prompts[:8])
    engine.push_policy(module.policy)
    figures["pushed_diff"] = sampler_vs_trainer(engine, module, prompts[:8])
    engine.close()
    print("FIGURES " + json.dumps(figures), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]) if len(sys.argv) > 3 else DATA / "tiny-llama")
