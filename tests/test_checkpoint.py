"""Epoch-boundary checkpoints are Lightning's own files (issue 40): adapter weights only, loadable with
``torch.load(weights_only=True)``, an exact resume, and the command's ``last.ckpt`` read, resumed and loaded from
plain Python."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from support import DigitShareTask

from lit_grpo.cli import main
from lit_grpo.policy.module import PolicyModule
from lit_grpo.rollout.datamodule import RolloutDataModule

PROMPTS_PER_EPOCH = 4


def run(model_dir: Path, root: Path, epochs: int, ckpt_path: str | None = None) -> tuple[PolicyModule, Any]:
    pl.seed_everything(0)
    module = PolicyModule(
        model_name_or_path=str(model_dir), lora={"rank": 4}, kl={"coef": 0.04},
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
    checkpoint = torch.load(tmp_path / "ckpt" / "last.ckpt", weights_only=True)
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


COMMAND_RUN = ["--data.prompts_per_epoch", "2", "--data.group_size", "2", "--data.minibatch_size", "4",
               "--data.max_new_tokens", "3"]


@pytest.mark.slow
def test_the_commands_last_checkpoint_is_lightnings_and_resumes_from_python(tiny_llama_dir, tmp_path):
    main(["fit", "--model.model_name_or_path", str(tiny_llama_dir), "--trainer.logger", "false",
          "--trainer.max_epochs", "2", "--trainer.default_root_dir", str(tmp_path / "command"),
          "--trainer.enable_progress_bar", "false", "--trainer.limit_val_batches", "0", *COMMAND_RUN])
    last = tmp_path / "command" / "checkpoints" / "last.ckpt"
    checkpoint = torch.load(last, weights_only=True)
    assert {"state_dict", "optimizer_states", "epoch", "global_step", "loops", "callbacks", "hyper_parameters",
            "pytorch-lightning_version", "RolloutDataModule"} <= set(checkpoint)
    assert checkpoint["pytorch-lightning_version"] == pl.__version__
    assert (checkpoint["epoch"], checkpoint["global_step"]) == (1, 2)
    state = checkpoint["state_dict"]
    assert state and all(".lora_A." in key or ".lora_B." in key for key in state)  # the trained weights only
    assert len(checkpoint["optimizer_states"][0]["state"]) == len(state)  # AdamW's moments of each of them

    # plain Python, the command's settings, the command's file
    module = PolicyModule(model_name_or_path=str(tiny_llama_dir))
    datamodule = RolloutDataModule(prompts_per_epoch=2, group_size=2, minibatch_size=4, max_new_tokens=3)
    trainer = pl.Trainer(max_epochs=3, reload_dataloaders_every_n_epochs=1, num_sanity_val_steps=0,
                         use_distributed_sampler=False, limit_val_batches=0, logger=False, enable_progress_bar=False,
                         enable_model_summary=False, enable_checkpointing=False, default_root_dir=tmp_path / "python")
    started = {}

    class FirstEpoch(pl.Callback):
        def on_train_epoch_start(self, trainer, pl_module):
            started.setdefault("epoch", trainer.current_epoch)
            started.setdefault("step", trainer.global_step)
            started.setdefault("weights", {k: v.detach().clone() for k, v in pl_module.state_dict().items()})

    trainer.callbacks.append(FirstEpoch())
    trainer.fit(module, datamodule=datamodule, ckpt_path=str(last))
    assert (started["epoch"], started["step"]) == (2, 2) and trainer.global_step == 3  # one epoch, the third
    assert datamodule.prompts.cursor == checkpoint["RolloutDataModule"]["cursor"] + 2
    assert set(started["weights"]) == set(state)
    for name, value in state.items():  # the run went on from the command's weights
        assert torch.equal(started["weights"][name], value), name


def test_load_from_checkpoint_gives_the_trained_policy_back(tiny_llama_dir, tmp_path):
    run(tiny_llama_dir, tmp_path, epochs=1)
    path = tmp_path / "ckpt" / "last.ckpt"
    saved = torch.load(path, weights_only=True)["state_dict"]
    loaded = PolicyModule.load_from_checkpoint(path)
    lora = {f"policy.{name}": p for name, p in loaded.policy.named_parameters() if "lora_" in name}
    assert set(lora) == set(saved) and lora
    for name, value in saved.items():
        assert torch.equal(lora[name], value), name
    assert loaded.load_state_dict(saved, strict=True).missing_keys == []  # the frozen base is not missing
    with pytest.raises(RuntimeError, match="missing trained weights"):
        loaded.load_state_dict({k: v for k, v in saved.items() if ".lora_B." not in k}, strict=True)
    untrained = PolicyModule(model_name_or_path=str(tiny_llama_dir), lora={"rank": 4})
    untrained.configure_model()
    assert any(not torch.equal(p, lora[f"policy.{n}"]) for n, p in untrained.policy.named_parameters() if "lora_" in n)


def test_state_dict_is_the_trained_weights_bare_or_inside_a_wrapping_module(tiny_llama_dir):
    module = PolicyModule(model_name_or_path=str(tiny_llama_dir), lora={"rank": 4},
                          advantage_mode="gae")  # a value head
    module.configure_model()
    trained = {name: p for name, p in module.named_parameters() if p.requires_grad}
    assert any(".lora_A." in name for name in trained) and any(name.startswith("value_head.") for name in trained)
    assert any(not p.requires_grad for p in module.parameters())  # the frozen base, in no state dict below
    bare = module.state_dict()
    assert set(bare) == set(trained) and not any(value.requires_grad for value in bare.values())  # detached copies
    wrapper = torch.nn.ModuleDict({"learner": module})  # what a user's own module holding the policy does
    wrapped = wrapper.state_dict()
    assert list(wrapped) == [f"learner.{name}" for name in trained]
    assert all(torch.equal(wrapped[f"learner.{name}"], p) for name, p in trained.items())
    kept = wrapper.state_dict(keep_vars=True)
    assert all(kept[f"learner.{name}"] is p for name, p in trained.items())
    # loading it back: only a trained weight counts as missing, on its own or under the wrapper's prefix
    assert wrapper.load_state_dict(wrapped, strict=True).missing_keys == []
    lacking = {key: value for key, value in wrapped.items() if not key.startswith("learner.value_head.")}
    assert sorted(wrapper.load_state_dict(lacking, strict=False).missing_keys) == sorted(
        f"learner.{name}" for name in trained if name.startswith("value_head."))
    with pytest.raises(RuntimeError, match="learner.value_head"):
        wrapper.load_state_dict(lacking, strict=True)
