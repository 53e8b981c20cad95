"""ReferencePolicy and RolloutMetrics, each in a real Trainer on a tiny model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.loggers import TensorBoardLogger
from lit_grpo.callbacks import ReferencePolicy, RolloutMetrics
from support import DigitShareTask, eval_logprobs
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from transformers import AutoModelForCausalLM

from lit_grpo.errors import InputError
from lit_grpo.policy.module import PolicyModule
from lit_grpo.policy.reference import install_reference
from lit_grpo.rollout.datamodule import RolloutDataModule


def make_trainer(root: Path, epochs: int, callbacks: list[pl.Callback], logger: Any = False) -> pl.Trainer:
    return pl.Trainer(
        max_epochs=epochs, reload_dataloaders_every_n_epochs=1, num_sanity_val_steps=0, callbacks=callbacks,
        default_root_dir=root, logger=logger, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False,
    )


def make_pair(model_dir: Path, kl_coef: float = 0.04) -> tuple[PolicyModule, RolloutDataModule]:
    pl.seed_everything(0)
    module = PolicyModule(
        model_name_or_path=str(model_dir), lora={"rank": 4}, kl={"coef": kl_coef},
        optimizer=lambda params: torch.optim.AdamW(params, lr=2e-2, weight_decay=0.0),
    )
    datamodule = RolloutDataModule(
        task=DigitShareTask(), group_size=4, prompts_per_epoch=4, minibatch_size=8, max_new_tokens=4,
        val_max_prompts=8,
    )
    return module, datamodule


def references(trainer: pl.Trainer) -> list[ReferencePolicy]:
    return [c for c in trainer.callbacks if isinstance(c, ReferencePolicy)]


def test_pi_ref_is_the_base_without_a_callback_and_a_users_reference_callback_owns_it(tiny_llama_dir, tmp_path):
    module, datamodule = make_pair(tiny_llama_dir, kl_coef=0.04)
    trainer = make_trainer(tmp_path, 1, [])
    trainer.fit(module, datamodule)
    assert references(trainer) == [] and module.reference_source is None  # the adapter switched off: see below
    assert datamodule.epoch_report.buffer.ref_logp is not None

    module, datamodule = make_pair(tiny_llama_dir, kl_coef=0.0)
    trainer = make_trainer(tmp_path, 1, [])
    trainer.fit(module, datamodule)
    assert trainer.datamodule.epoch_report.buffer.ref_logp is None

    mine = ReferencePolicy(refresh_every_n_epochs=3)
    module, datamodule = make_pair(tiny_llama_dir, kl_coef=0.04)
    trainer = make_trainer(tmp_path, 1, [mine])
    trainer.fit(module, datamodule)
    assert references(trainer) == [mine] and module.reference_source is mine


def test_base_reference_is_the_model_without_adapter(tiny_llama_dir, tmp_path):
    module, datamodule = make_pair(tiny_llama_dir)
    trainer = make_trainer(tmp_path, 2, [])
    trainer.fit(module, datamodule)
    buffer = datamodule.epoch_report.buffer
    base = AutoModelForCausalLM.from_pretrained(tiny_llama_dir)
    expected = eval_logprobs(base, buffer.input_ids, buffer.attention_mask, buffer.temperature,
                                         token_mask=buffer.completion_mask)
    torch.testing.assert_close(buffer.ref_logp, expected, rtol=0, atol=1e-5)
    # after two epochs of updates the policy differs from its reference
    assert (buffer.old_logp - buffer.ref_logp)[buffer.completion_mask].abs().max() > 1e-3


class CaptureAfterRefresh(pl.Callback):
    """Runs after ReferencePolicy (callbacks run in list order) and records pi_theta's log-probs of a probe."""

    def __init__(self, probe: torch.Tensor) -> None:
        self.probe = probe
        self.policy_logp: list[torch.Tensor] = []

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: Any) -> None:
        mask = torch.ones_like(self.probe, dtype=torch.bool)
        self.policy_logp.append(eval_logprobs(pl_module.policy, self.probe, mask, 1.0))


def test_refresh_copies_the_adapter_and_then_stays_frozen(tiny_llama_dir, tmp_path):
    probe = torch.tensor([[1, 21, 22, 15, 23, 33, 24, 25]])
    mask = torch.ones_like(probe, dtype=torch.bool)
    reference = ReferencePolicy(refresh_every_n_epochs=2)
    capture = CaptureAfterRefresh(probe)
    module, datamodule = make_pair(tiny_llama_dir)
    trainer = make_trainer(tmp_path, 3, [reference, capture])
    trainer.fit(module, datamodule)
    with module.reference_active():
        ref_logp = eval_logprobs(module.policy, probe, mask, 1.0)
    # refreshed after epoch index 1 (the second epoch): pi_ref is pi_theta as it was then, not as it is now
    torch.testing.assert_close(ref_logp, capture.policy_logp[1], rtol=0, atol=1e-6)
    assert (ref_logp - capture.policy_logp[2]).abs().max() > 1e-4
    frozen = [p for n, p in module.policy.named_parameters() if ".reference." in n]
    assert frozen and not any(p.requires_grad for p in frozen)
    assert set(reference.state_dict()["frozen"]) == set(module.adapter_copy())  # the adapter's keys, PEFT's format


@pytest.mark.slow
def test_rollout_metrics_reach_tensorboard(tiny_llama_dir, tmp_path):
    module, datamodule = make_pair(tiny_llama_dir)
    logger = TensorBoardLogger(tmp_path, name="run")
    trainer = make_trainer(tmp_path, 2, [RolloutMetrics(table_every_n_epochs=1, table_rows=4)], logger=logger)
    trainer.fit(module, datamodule)
    events = EventAccumulator(logger.log_dir, size_guidance={"tensors": 0, "scalars": 0})
    events.Reload()
    scalars = set(events.Tags()["scalars"])
    expected = {
        "rollout/reward_mean", "rollout/reward_std", "rollout/accuracy", "rollout/kl_ref", "rollout/completion_length",
        "rollout/truncated_frac", "rollout/zero_std_frac", "rollout/reward_errors", "rollout/logp_diff_max",
        "train/clip_ratio/low_mean", "train/clip_ratio/high_mean", "train/ratio_mean", "train/approx_kl", "train/kl_ref",
        "val/reward", "val/accuracy",
    }
    assert expected <= scalars, sorted(expected - scalars)
    assert [e.step for e in events.Scalars("val/accuracy")][0] == 0  # the pre-training validation is kept
    assert len(events.Scalars("rollout/reward_mean")) == 2
    texts = events.Tags()["tensors"]
    assert any("rollout/samples" in tag for tag in texts)


def test_installing_the_reference_adapter_draws_nothing_from_the_global_rng(tiny_llama_dir):
    # add_adapter initialises LoRA weights from the global RNG; a resumed run installs the reference after the
    # checkpoint restored that RNG, so every later draw (dropout, sampling) moved against the uninterrupted run
    module, _ = make_pair(tiny_llama_dir)
    module.configure_model()  # loads the policy (Lightning calls it at fit start)
    weights = module.adapter_copy()
    install_reference(module.policy, weights)  # the first install: add_adapter, then the copy
    assert [p for n, p in module.policy.named_parameters() if ".reference." in n]
    state = torch.get_rng_state()
    module.policy.delete_adapter("reference")
    install_reference(module.policy, {k: v + 1 for k, v in weights.items()})
    assert torch.equal(torch.get_rng_state(), state)
    installed = {n.replace(".reference.", "."): p for n, p in module.policy.named_parameters() if ".reference." in n}
    assert installed.keys() == weights.keys()
    assert all(torch.equal(installed[k], weights[k] + 1) and not installed[k].requires_grad for k in weights)


def test_a_reference_of_another_adapter_shape_is_refused(tiny_llama_dir):
    module, _ = make_pair(tiny_llama_dir)
    module.configure_model()
    weights = {f"{k}.extra": v for k, v in module.adapter_copy().items()}
    with pytest.raises(InputError, match="do not fit the policy's adapter"):
        install_reference(module.policy, weights)


def test_a_checkpoint_from_before_issue_51_keeps_its_frozen_reference():
    # frozen weights were saved under the reference adapter's parameter names; now in adapter_copy's format
    reference = ReferencePolicy("initial")
    weight = torch.ones(2)
    reference.load_state_dict({"frozen": {"base_model.model.q_proj.lora_A.reference.weight": weight}})
    assert reference.reference_adapter() == {"base_model.model.q_proj.lora_A.weight": weight}


def test_the_phase_line_offers_drawing_ahead_only_where_the_engine_can(caplog):
    # issue 33, item 5: the per-epoch phase line prices data.max_staleness only for grouped rollouts from an engine
    # that samples from a copy of the weights (the hf engine samples from the model being trained)
    import logging
    import time
    from types import SimpleNamespace

    from snapshot_engine import SnapshotHFEngine

    from lit_grpo.engines import HFEngine
    from lit_grpo.tasks import ClarifyTask

    lines = {}
    for name, engine, rollout in (("hf", HFEngine(), "grouped"), ("copy", SnapshotHFEngine("unused"), "grouped"),
                                  ("copy-tree", SnapshotHFEngine("unused"), "tree")):
        callback = RolloutMetrics()
        callback._train_started = time.perf_counter()
        data = RolloutDataModule(task=ClarifyTask(), engine=engine, rollout=rollout)
        data.timings = {"push": 0.5, "generate": 2.0}
        datamodule = SimpleNamespace(epoch_report=data.report(SimpleNamespace()))  # the report the epoch publishes
        caplog.clear()
        with caplog.at_level(logging.INFO):
            callback.on_train_epoch_end(SimpleNamespace(current_epoch=3, datamodule=datamodule),
                                        SimpleNamespace(log=lambda *args, **kwargs: None))
        (lines[name],) = [r.getMessage() for r in caplog.records if "epoch 3 phases" in r.getMessage()]
    assert "data.max_staleness" not in lines["hf"] and "data.max_staleness" not in lines["copy-tree"]
    assert "drawn ahead (data.max_staleness)" in lines["copy"]
    assert lines["hf"].startswith("epoch 3 phases: push 0.50s, generate 2.00s, train ")
