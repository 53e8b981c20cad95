"""End to end on a CPU: a few epochs on tiny models train the LoRA adapter and nothing else."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch

from lit_grpo.callbacks import RolloutMetrics
from lit_grpo.rollout.datamodule import RolloutDataModule
from lit_grpo.losses import policy_loss
from lit_grpo.policy.module import PolicyModule
from support import DigitShareTask, eval_logprobs, save_lora_adapter


class TrainingRecorder(pl.Callback):
    """Snapshots the weights at the start, remembers the last epoch's buffer, every loss and which LoRA tensors got
    a non-zero gradient."""

    def __init__(self) -> None:
        self.initial: dict[str, torch.Tensor] = {}
        self.nonzero_grad: set[str] = set()
        self.losses: list[float] = []
        self.last_buffer: Any = None

    def on_train_start(self, trainer: pl.Trainer, pl_module: Any) -> None:
        self.initial = {n: p.detach().clone() for n, p in pl_module.policy.named_parameters()}

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: Any) -> None:
        self.last_buffer = trainer.datamodule.epoch_report.buffer

    def on_after_backward(self, trainer: pl.Trainer, pl_module: Any) -> None:
        for name, param in pl_module.policy.named_parameters():
            if param.grad is not None and param.grad.abs().sum() > 0:
                self.nonzero_grad.add(name)

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.losses.append(float(outputs["loss"]))


def fit_tiny(model_dir: Path, root: Path, epochs: int = 3, **module_kwargs: Any) -> tuple[PolicyModule, TrainingRecorder]:
    module = PolicyModule(
        model_name_or_path=str(model_dir), lora={"rank": 4, "alpha": 8}, kl={"coef": 0.04},
        optimizer=lambda params: torch.optim.AdamW(params, lr=1e-2, weight_decay=0.0), **module_kwargs,
    )
    pl.seed_everything(0)  # the LoRA initialisation
    datamodule = RolloutDataModule(
        task=DigitShareTask(), group_size=4, prompts_per_epoch=8, minibatch_size=16, max_new_tokens=6, ppo_epochs=2,
        val_max_prompts=16,
    )
    recorder = TrainingRecorder()
    trainer = pl.Trainer(
        max_epochs=epochs, reload_dataloaders_every_n_epochs=1, num_sanity_val_steps=0, default_root_dir=root,
        callbacks=[recorder, RolloutMetrics(table_every_n_epochs=0)], enable_progress_bar=False,
        enable_model_summary=False, enable_checkpointing=False, logger=False,
    )
    trainer.fit(module, datamodule)
    return module, recorder


def fixed_batch_surrogate(module: PolicyModule, buffer: Any) -> float:
    """The clip surrogate of a buffer under the module's current policy."""
    logp = eval_logprobs(module.policy, buffer.input_ids, buffer.attention_mask, buffer.temperature)
    loss, _ = policy_loss(logp, buffer.old_logp, buffer.advantages, buffer.completion_mask)
    return loss.item()


@pytest.mark.parametrize("arch", ["llama", "gpt2", "llama-init-adapter"])
def test_training_moves_lora_only(arch, tiny_llama_dir, tiny_gpt2_dir, tmp_path):
    model_dir = tiny_gpt2_dir if arch == "gpt2" else tiny_llama_dir
    extra = {}
    if arch == "llama-init-adapter":
        # a B that is not zero, so continuing from it differs from a fresh adapter
        adapter = save_lora_adapter(model_dir, tmp_path / "init-adapter", lambda b: b.normal_(0, 0.02))
        extra["init_adapter"] = str(adapter)
    module, recorder = fit_tiny(model_dir, tmp_path, **extra)

    assert recorder.losses and all(math.isfinite(loss) for loss in recorder.losses)
    lora = {n for n in recorder.initial if "lora_" in n}
    assert lora and lora <= {n for n, p in module.policy.named_parameters() if p.requires_grad}
    assert recorder.nonzero_grad >= lora, f"no gradient reached {sorted(lora - recorder.nonzero_grad)[:3]}"
    final = dict(module.policy.named_parameters())
    for name, before in recorder.initial.items():
        if name in lora:
            assert not torch.equal(final[name].detach(), before), f"LoRA tensor {name} did not change"
        else:
            assert torch.equal(final[name].detach(), before), f"base tensor {name} changed"
    if arch == "llama-init-adapter":
        assert recorder.initial[next(n for n in lora if "lora_B" in n)].abs().sum() > 0  # started from the adapter

    # at theta_old the surrogate of a batch is -mean(A) = 0 (centred advantages); the last epoch's four updates on
    # that batch must push it below
    buffer = recorder.last_buffer
    start = policy_loss(buffer.old_logp, buffer.old_logp, buffer.advantages, buffer.completion_mask)[0].item()
    assert start == pytest.approx(0.0, abs=1e-6)
    assert fixed_batch_surrogate(module, buffer) < start - 1e-3
