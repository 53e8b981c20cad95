"""The release-shaped test model (``data/tiny-qwen2-chat``, built by ``scripts/build_release_model.py``): it has
what a Qwen2.5-class instruct checkpoint has, rebuilds identically, and trains end to end with the sampler's
log-probs equal to the trainer's although its generation_config carries sampling options of its own."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
from pathlib import Path

import lightning.pytorch as pl
import torch
from safetensors.torch import load_file
from transformers import AutoTokenizer

from lit_grpo.datamodule import RolloutDataModule
from lit_grpo.model_loading import load_policy
from lit_grpo.module import PolicyModule
from lit_grpo.tasks import ArithmeticTask

ROOT = Path(__file__).resolve().parents[1]
MODEL = ROOT / "data" / "tiny-qwen2-chat"


def safetensors_dtypes(path: Path) -> set[str]:
    """The dtypes a safetensors header lists (its first 8 bytes give the JSON header's length)."""
    with open(path, "rb") as handle:
        (length,) = struct.unpack("<Q", handle.read(8))
        header = json.loads(handle.read(length))
    return {entry["dtype"] for name, entry in header.items() if name != "__metadata__"}


def test_it_has_the_shapes_and_files_of_a_released_chat_checkpoint():
    config = json.loads((MODEL / "config.json").read_text())
    generation = json.loads((MODEL / "generation_config.json").read_text())
    tokenizer = AutoTokenizer.from_pretrained(MODEL)
    assert config["model_type"] == "qwen2" and config["tie_word_embeddings"] is True
    assert config["num_key_value_heads"] < config["num_attention_heads"]  # grouped-query attention
    assert len(tokenizer) >= 32_000 and config["vocab_size"] % 64 == 0 and config["vocab_size"] > len(tokenizer)
    assert safetensors_dtypes(MODEL / "model.safetensors") == {"BF16"}
    im_end, endoftext = tokenizer.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"])
    assert sorted(generation["eos_token_id"]) == sorted([im_end, endoftext]) and tokenizer.eos_token_id == im_end
    assert generation["repetition_penalty"] != 1.0 and generation["top_k"] > 0 and generation["top_p"] < 1.0
    text = "naïve café ✓ 😀 def f(x):\n\treturn x\x00\x7f"
    assert tokenizer.decode(tokenizer(text, add_special_tokens=False)["input_ids"]) == text  # byte-level: lossless
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": "2+2="}], add_generation_prompt=True,
                                             tokenize=False)
    assert rendered == "<|im_start|>user\n2+2=<|im_end|>\n<|im_start|>assistant\n"


def test_a_tasks_chat_prompt_is_the_chatml_turn(tmp_path):
    tokenizer = AutoTokenizer.from_pretrained(MODEL)
    task = ArithmeticTask(use_chat_template=True)
    record = task.train_records()[0]
    expected = f"<|im_start|>user\n{record['prompt']}<|im_end|>\n<|im_start|>assistant\n"
    ids = task.prompt_ids(record, tokenizer)
    # token ids, not a dict's keys (transformers 5's apply_chat_template(tokenize=True) returns a dict)
    assert all(isinstance(i, int) for i in ids)
    assert ids == tokenizer(expected, add_special_tokens=False)["input_ids"]
    tokens = tokenizer.convert_ids_to_tokens(ids)
    assert (tokens.count("<|im_start|>"), tokens.count("<|im_end|>")) == (2, 1)  # each marker is one special token


def test_the_build_is_reproducible(tmp_path):
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / "build_release_model.py"), "--out",
                             str(tmp_path / "rebuilt")], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    assert (tmp_path / "rebuilt" / "tokenizer.json").read_bytes() == (MODEL / "tokenizer.json").read_bytes()
    rebuilt, shipped = load_file(tmp_path / "rebuilt" / "model.safetensors"), load_file(MODEL / "model.safetensors")
    assert rebuilt.keys() == shipped.keys() and all(torch.equal(rebuilt[k], shipped[k]) for k in shipped)


def test_it_loads_in_each_dtype_with_fp32_lora():
    for dtype in ("float32", "bfloat16"):
        policy = load_policy(str(MODEL), 4, 8, 0.0, "all-linear", dtype=dtype)
        frozen = {p.dtype for p in policy.parameters() if not p.requires_grad}
        assert frozen == {getattr(torch, dtype)}
        assert {p.dtype for p in policy.parameters() if p.requires_grad} == {torch.float32}


class SyncLog(pl.Callback):
    def __init__(self) -> None:
        self.diff_max: list[float] = []
        self.losses: list[float] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.losses.append(float(outputs["loss"]))

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        self.diff_max.append(float(trainer.callback_metrics["rollout/logp_diff_max"]))


def test_two_epochs_with_the_chat_template_and_sampler_trainer_agreement(tmp_path):
    from lit_grpo.callbacks import RolloutMetrics

    pl.seed_everything(0)
    module = PolicyModule(model_name_or_path=str(MODEL), lora_rank=4, kl_coef=0.04)
    datamodule = RolloutDataModule(task=ArithmeticTask(use_chat_template=True), group_size=4, prompts_per_epoch=4,
                                   minibatch_size=8, max_new_tokens=8)
    log = SyncLog()
    trainer = pl.Trainer(max_epochs=2, reload_dataloaders_every_n_epochs=1, num_sanity_val_steps=0,
                         limit_val_batches=0, callbacks=[log, RolloutMetrics(table_every_n_epochs=0)],
                         default_root_dir=tmp_path, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(module, datamodule)
    assert module.stop_token_ids == (0, 2)  # <|endoftext|> and <|im_end|>: both end a rollout
    assert len(log.diff_max) == 2 and max(log.diff_max) < 1e-4  # fp32: the checkpoint's penalties not applied
    assert len(log.losses) == 4 and all(torch.isfinite(torch.tensor(log.losses)))
