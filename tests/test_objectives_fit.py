"""Issue 50's objectives in real runs: the two configs train through the command with their mechanism acting, the
adaptive entropy coefficient moves with each optimizer step and goes on from a checkpoint, and the entropies the
training forward computes are those of the model's own logits (padded and packed forwards alike)."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
from support import DigitShareTask

from lit_grpo.cli import main
from lit_grpo.policy.logprobs import sequence_logprobs
from lit_grpo.policy.module import PolicyModule
from lit_grpo.policy.packed import packed_logprobs
from lit_grpo.rollout.datamodule import RolloutDataModule

ROOT = Path(__file__).resolve().parents[1]


def epoch_figures(root: Path, name: str) -> list[float]:
    (log,) = root.glob("**/metrics.csv")
    with log.open() as handle:
        return [float(row[name]) for row in csv.DictReader(handle) if row.get(name)]


@pytest.mark.slow
@pytest.mark.parametrize(("config", "extra", "figure", "acting"), [
    # negative-advantage tokens below 0.8 (PPO's clip would cut them; CISPO's high side is its cap, 5)
    ("cispo.yaml", [], "train/clip_ratio/low_mean", lambda v: v > 0),
    ("cispo.yaml", ["--model.clip.eps_high", "0.1"], "train/cispo_clip_ratio", lambda v: v > 0),  # a cap of 1.1
    ("sapo.yaml", [], "train/sapo/gate_mean", lambda v: 0 < v < 1),  # the gate damps off-policy tokens
])
def test_the_configs_train_through_the_command_with_their_mechanism_acting(config, extra, figure, acting, tmp_path):
    main(["fit", "--config", str(ROOT / "configs" / config), *extra, "--trainer.max_epochs", "2",
          "--trainer.logger", "lightning.pytorch.loggers.CSVLogger", "--trainer.logger.save_dir", str(tmp_path),
          "--trainer.enable_progress_bar", "false", "--trainer.default_root_dir", str(tmp_path),
          "--trainer.check_val_every_n_epoch", "2", "--data.val_max_prompts", "16"])
    values = epoch_figures(tmp_path, figure)
    assert len(values) == 2 and all(acting(v) for v in values), values
    assert all(math.isfinite(v) for v in epoch_figures(tmp_path, "train/loss_epoch"))
    assert len(list(tmp_path.glob("**/adapter/adapter_model.safetensors"))) == 1


def make_pair(model_dir: Path, entropy: dict) -> tuple[PolicyModule, RolloutDataModule]:
    pl.seed_everything(0)
    module = PolicyModule(model_name_or_path=str(model_dir), lora={"rank": 4}, kl={"coef": 0.0}, entropy=entropy,
                          optimizer=lambda params: torch.optim.AdamW(params, lr=1e-2, weight_decay=0.0))
    data = RolloutDataModule(task=DigitShareTask(), group_size=4, prompts_per_epoch=4, minibatch_size=8,
                             max_new_tokens=4, val_max_prompts=4)
    return module, data


@pytest.mark.slow
def test_the_adaptive_entropy_coefficient_steps_and_resumes(tiny_llama_dir, tmp_path):
    # a target above any entropy: every step's entropy is at or below it, so each step raises the coefficient by 0.005
    entropy = {"coef": 0.01, "adaptive": True, "target": 100.0, "coef_delta": 0.005, "top_quantile": 0.5}
    module, data = make_pair(tiny_llama_dir, entropy)
    trainer = pl.Trainer(max_epochs=1, reload_dataloaders_every_n_epochs=1, num_sanity_val_steps=0, logger=False,
                         default_root_dir=tmp_path, enable_progress_bar=False, enable_model_summary=False,
                         limit_val_batches=0)
    trainer.fit(module, data)
    steps = trainer.global_step  # 16 completions in minibatches of 8: two optimizer steps
    assert steps == 2 and module.entropy_coef.coef == pytest.approx(0.01 + 0.005 * steps, abs=1e-12)
    assert 0 < module.entropy_coef.last_entropy < math.log(module.policy.config.vocab_size)
    path = tmp_path / "after.ckpt"
    trainer.save_checkpoint(path)
    saved = torch.load(path, weights_only=True)["entropy_coef"]
    assert saved == {"coef": module.entropy_coef.coef, "last_entropy": module.entropy_coef.last_entropy}

    resumed, data = make_pair(tiny_llama_dir, entropy)
    trainer = pl.Trainer(max_epochs=2, reload_dataloaders_every_n_epochs=1, num_sanity_val_steps=0, logger=False,
                         default_root_dir=tmp_path, enable_progress_bar=False, enable_model_summary=False,
                         limit_val_batches=0)
    trainer.fit(resumed, data, ckpt_path=path)
    assert resumed.entropy_coef.coef == pytest.approx(0.01 + 0.005 * 4, abs=1e-12)  # went on from 0.02


def test_the_forwards_entropies_are_the_models_own(tiny_llama_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_llama_dir, dtype=torch.float32).eval()
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(3, model.config.vocab_size, (3, 7), generator=generator)
    ids[1:] = ids[0]  # rows that share a prefix, as a group does, for the packed forward
    ids[1, 4:], ids[2, 5:] = 5, 6
    attention = torch.ones_like(ids, dtype=torch.bool)
    attention[2, 6] = False
    counted = torch.zeros_like(attention)
    counted[:, 3:] = True
    counted &= attention
    with torch.no_grad():
        logits = model(input_ids=ids).logits.float() / 0.7  # [3, 7, V]: position t - 1 predicts token t
        probs = torch.softmax(logits, dim=-1)
        expected = -(probs * torch.log_softmax(logits, dim=-1)).sum(-1)[:, :-1]  # [3, 6]
        padded = sequence_logprobs(model, ids, attention, 0.7, token_mask=counted, with_entropy=True)
        packed = packed_logprobs(model, ids, attention, counted, 0.7, with_entropy=True)
    assert padded.shape == (3, 7, 2)
    torch.testing.assert_close(padded[..., 1][:, 1:][counted[:, 1:]], expected[counted[:, 1:]], rtol=0, atol=1e-5)
    assert (padded[..., 1][~counted] == 0).all()
    torch.testing.assert_close(packed, padded, rtol=0, atol=1e-5)
    log_probs = torch.log_softmax(logits, dim=-1)[:, :-1].gather(-1, ids[:, 1:, None]).squeeze(-1)
    torch.testing.assert_close(padded[..., 0][:, 1:][counted[:, 1:]], log_probs[counted[:, 1:]], rtol=0, atol=1e-5)
