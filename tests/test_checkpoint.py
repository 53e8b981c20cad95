"""Epoch-boundary checkpoints: adapter weights only, loadable with weights_only=True, and an exact resume."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from support import DigitShareTask

from lit_grpo.policy.module import PolicyModule
from lit_grpo.rollout.datamodule import RolloutDataModule
from lit_grpo.run.checkpoint_file import load_checkpoint

PROMPTS_PER_EPOCH = 4


def run(model_dir: Path, root: Path, epochs: int, ckpt_path: str | None = None) -> tuple[PolicyModule, Any]:
    pl.seed_everything(0)
    module = PolicyModule(
        model_name_or_path=str(model_dir), lora_rank=4, kl_coef=0.04,
        optimizer=lambda params: torch.optim.AdamW(params, lr=1e-2, weight_decay=0.0),
    )
    datamodule = RolloutDataModule(
        task=DigitShareTask(), group_size=4, prompts_per_epoch=PROMPTS_PER_EPOCH, minibatch_size=8, max_new_tokens=4,
    )
    trainer = pl.Trainer(
        max_epochs=epochs, reload_dataloaders_every_n_epochs=1, num_sanity_val_steps=0, limit_val_batches=0,
        callbacks=[ModelCheckpoint(dirpath=root / "ckpt", save_last=True, save_top_k=-1)], default_root_dir=root,
        logger=False, enable_progress_bar=False, enable_model_summary=False,
    )
    trainer.fit(module, datamodule, ckpt_path=ckpt_path)
    return module, datamodule


def adapter(module: PolicyModule) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in module.policy.named_parameters() if p.requires_grad}


def test_checkpoint_holds_adapter_cursor_and_loads_weights_only(tiny_llama_dir, tmp_path):
    module, _ = run(tiny_llama_dir, tmp_path, epochs=2)
    checkpoint = load_checkpoint(tmp_path / "ckpt" / "last.ckpt")
    state = checkpoint["state_dict"]
    assert state and all("lora_" in key for key in state)
    assert set(state) == {f"policy.{name}" for name in adapter(module)}
    assert checkpoint["epoch"] == 1
    assert checkpoint["RolloutDataModule"]["cursor"] == 2 * PROMPTS_PER_EPOCH
    assert checkpoint["optimizer_states"][0]["state"], "the optimizer's moments are saved"


def test_resume_continues_exactly(tiny_llama_dir, tmp_path):
    straight, straight_data = run(tiny_llama_dir, tmp_path / "straight", epochs=3)
    run(tiny_llama_dir, tmp_path / "split", epochs=2)
    resumed, resumed_data = run(tiny_llama_dir, tmp_path / "split", epochs=3,
                                ckpt_path=str(tmp_path / "split" / "ckpt" / "last.ckpt"))
    assert resumed_data.prompts.cursor == straight_data.prompts.cursor == 3 * PROMPTS_PER_EPOCH
    expected, got = adapter(straight), adapter(resumed)
    for name, value in expected.items():
        torch.testing.assert_close(got[name], value, rtol=0, atol=1e-6)
