"""The release-shaped test model (``data/tiny-qwen2-chat``, built by ``scripts/build_release_model.py``): it has
what a Qwen2.5-class instruct checkpoint has, rebuilds identically, and trains end to end with the sampler's
log-probs equal to the trainer's although its generation_config carries sampling options of its own."""

from __future__ import annotations

import json
import random
import struct
import subprocess
import sys
import unicodedata
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoTokenizer

from lit_grpo.callbacks import RolloutMetrics
from lit_grpo.rollout.datamodule import RolloutDataModule
from lit_grpo.policy.model_loading import completion_stop_ids, load_policy
from lit_grpo.run.model_files import load_tokenizer
from lit_grpo.policy.module import PolicyModule
from lit_grpo.tasks import ArithmeticTask

ROOT = Path(__file__).resolve().parents[1]
MODEL = ROOT / "data" / "tiny-qwen2-chat"


@pytest.fixture(scope="module")
def tokenizer():
    """The shipped tokenizer as transformers loads it, once for the tests that only read it."""
    return AutoTokenizer.from_pretrained(MODEL)


def safetensors_header(path: Path) -> dict[str, dict]:
    """Tensor name -> {dtype, shape, data_offsets}, read from the file's JSON header (its length is the first 8
    bytes) rather than through a loader that might convert."""
    with open(path, "rb") as handle:
        (length,) = struct.unpack("<Q", handle.read(8))
        header = json.loads(handle.read(length))
    header.pop("__metadata__", None)
    return header


def test_the_config_is_qwen2_with_grouped_query_attention_biases_tied_embeddings_and_bf16_weights(tokenizer):
    config = json.loads((MODEL / "config.json").read_text())
    header = safetensors_header(MODEL / "model.safetensors")
    assert config["model_type"] == "qwen2" and config["architectures"] == ["Qwen2ForCausalLM"]
    assert config["num_key_value_heads"] < config["num_attention_heads"]  # grouped-query attention
    assert config["hidden_size"] // config["num_attention_heads"] >= 32  # vLLM's CPU attention takes no smaller head
    assert len(tokenizer) >= 32_000
    assert config["vocab_size"] % 64 == 0 and config["vocab_size"] >= len(tokenizer)
    assert {entry["dtype"] for entry in header.values()} == {"BF16"}
    assert header["model.embed_tokens.weight"]["shape"] == [config["vocab_size"], config["hidden_size"]]
    assert config["tie_word_embeddings"] is True and "lm_head.weight" not in header  # tied: one matrix stored
    weights = load_file(MODEL / "model.safetensors")
    for layer in range(config["num_hidden_layers"]):
        for projection in ("q_proj", "k_proj", "v_proj"):
            bias = weights[f"model.layers.{layer}.self_attn.{projection}.bias"]
            assert bias.abs().max() > 0  # non-zero, so dropping a bias would change the logits
        assert f"model.layers.{layer}.self_attn.o_proj.bias" not in header  # Qwen2: q/k/v biases only


def test_the_generation_config_lists_both_eos_ids_and_sampling_options_of_its_own(tokenizer):
    generation = json.loads((MODEL / "generation_config.json").read_text())
    im_end, endoftext = tokenizer.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"])
    assert generation["eos_token_id"] == [im_end, endoftext] and generation["pad_token_id"] == endoftext
    assert tokenizer.eos_token_id == im_end and tokenizer.pad_token_id == endoftext
    assert generation["do_sample"] is True and generation["temperature"] != 1.0
    assert generation["top_k"] > 0 and generation["top_p"] < 1.0 and generation["min_p"] > 0
    assert generation["repetition_penalty"] != 1.0 and generation["no_repeat_ngram_size"] > 0


def test_the_tokenizer_that_loads_is_the_shipped_file():
    # transformers' Qwen2Tokenizer rebuilds its pipeline from the vocabulary and merges, ignoring the file's
    # normalizer and pre-tokenizer: the shipped file must already be that pipeline, or it is not what runs
    shipped = json.loads((MODEL / "tokenizer.json").read_text())
    loaded = load_tokenizer(str(MODEL))
    assert type(loaded).__name__ == "Qwen2Tokenizer"
    assert json.loads(loaded.backend_tokenizer.to_str()) == shipped


def test_the_byte_level_tokenizer_round_trips_any_text_up_to_nfc(tokenizer):
    generator = random.Random(0)
    # code points from every plane but the surrogates (not encodable as UTF-8), control characters included
    scattered = "".join(chr(generator.choice([generator.randrange(0, 0xD800), generator.randrange(0xE000, 0x110000)]))
                        for _ in range(500))
    for text in ("naïve café ✓ 😀 def f(x):\n\treturn x\x00\x7f", scattered, "<|im_end|> is text here"):
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        # Qwen2.5's tokenizer NFC-normalises its input: text already in NFC comes back exactly
        assert tokenizer.decode(ids) == unicodedata.normalize("NFC", text)
    assert unicodedata.normalize("NFC", scattered) != scattered  # so the random text did exercise the normaliser
    assert tokenizer("<|im_end|>", add_special_tokens=False)["input_ids"] == [tokenizer.eos_token_id]


def test_the_chat_template_renders_chatml_with_the_generation_prompt(tokenizer):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2="}]
    assert tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n2+2=<|im_end|>\n<|im_start|>assistant\n")
    assert tokenizer.apply_chat_template(messages[1:], add_generation_prompt=False, tokenize=False) == (
        "<|im_start|>user\n2+2=<|im_end|>\n")


def test_a_tasks_chat_prompt_is_the_chatml_turn(tokenizer):
    task = ArithmeticTask(use_chat_template=True)
    record = task.train_records()[0]
    expected = f"<|im_start|>user\n{record['prompt']}<|im_end|>\n<|im_start|>assistant\n"
    ids = task.prompt_ids(record, tokenizer)
    # token ids, not a dict's keys (transformers 5's apply_chat_template(tokenize=True) returns a dict)
    assert all(isinstance(i, int) for i in ids)
    assert ids == tokenizer(expected, add_special_tokens=False)["input_ids"]
    assert tokenizer.decode(ids) == expected
    tokens = tokenizer.convert_ids_to_tokens(ids)
    assert (tokens.count("<|im_start|>"), tokens.count("<|im_end|>")) == (2, 1)  # each marker is one special token


@pytest.mark.slow
def test_the_build_is_reproducible(tmp_path):
    # as a user runs it: a fresh process, so the builder's one-thread setting precedes the tokenizers import
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / "build_release_model.py"), "--out",
                             str(tmp_path / "rebuilt")], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    shipped = sorted(path.name for path in MODEL.iterdir())
    assert sorted(path.name for path in (tmp_path / "rebuilt").iterdir()) == shipped
    for name in shipped:  # byte for byte, weights included
        assert (tmp_path / "rebuilt" / name).read_bytes() == (MODEL / name).read_bytes(), name


def test_our_loaders_load_it_in_each_dtype_and_it_runs_a_forward():
    tokenizer = load_tokenizer(str(MODEL))
    ids = torch.tensor([tokenizer("def f(x):\n    return x", add_special_tokens=False)["input_ids"]])
    logits = {}
    for dtype in ("float32", "bfloat16"):
        policy = load_policy(str(MODEL), 4, 8, 0.0, "all-linear", dtype=dtype)
        assert {p.dtype for p in policy.parameters() if not p.requires_grad} == {getattr(torch, dtype)}
        assert {p.dtype for p in policy.parameters() if p.requires_grad} == {torch.float32}  # the LoRA adapter
        assert completion_stop_ids(tokenizer, policy) == tuple(sorted(tokenizer.convert_tokens_to_ids(
            ["<|im_end|>", "<|endoftext|>"])))
        with torch.no_grad():
            logits[dtype] = policy(input_ids=ids).logits.float()
        assert logits[dtype].shape == (1, ids.shape[1], policy.config.vocab_size)
        assert torch.isfinite(logits[dtype]).all()
    # the same weights either way (bf16 on disk), up to bf16 activations
    assert (logits["float32"] - logits["bfloat16"]).abs().max() < 0.1 * logits["float32"].abs().max()


class LetterShareTask(ArithmeticTask):
    """Arithmetic prompts rewarded by the share of ASCII letters in the completion: this random model samples
    fragments of Python source, nearly never a digit, so a digit reward would give every group the same 0."""

    def reward(self, prompt_record, completion_text, completion_ids) -> float:
        return sum(ch.isascii() and ch.isalpha() for ch in completion_text) / max(len(completion_text), 1)


class RunLog(pl.Callback):
    """The weights at the start, each epoch's first prompt ids and ``rollout/logp_diff_max``, and every loss."""

    def __init__(self) -> None:
        self.initial: dict[str, torch.Tensor] = {}
        self.first_prompts: list[list[int]] = []
        self.diff_max: list[float] = []
        self.losses: list[float] = []

    def on_train_start(self, trainer, pl_module) -> None:
        self.initial = {n: p.detach().clone() for n, p in pl_module.policy.named_parameters()}

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        self.first_prompts.append(trainer.datamodule.epoch_report.buffer.input_ids[0].tolist())

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.losses.append(float(outputs["loss"]))

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        self.diff_max.append(float(trainer.callback_metrics["rollout/logp_diff_max"]))


@pytest.mark.slow
def test_two_epochs_with_the_chat_template_train_lora_only_with_sampler_trainer_agreement(tmp_path):
    pl.seed_everything(0)
    module = PolicyModule(model_name_or_path=str(MODEL), lora={"rank": 4}, kl={"coef": 0.04},
                          dtype="float32")  # fp32: exact
    # a dense reward, so a random model's groups differ in reward and the adapter gets a gradient
    datamodule = RolloutDataModule(task=LetterShareTask(use_chat_template=True), group_size=4, prompts_per_epoch=4,
                                   minibatch_size=8, max_new_tokens=8)
    log = RunLog()
    trainer = pl.Trainer(max_epochs=2, reload_dataloaders_every_n_epochs=1, num_sanity_val_steps=0,
                         limit_val_batches=0, callbacks=[log, RolloutMetrics(table_every_n_epochs=0)],
                         default_root_dir=tmp_path, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(module, datamodule)
    tokenizer = module.tokenizer
    im_start, im_end, endoftext = tokenizer.convert_tokens_to_ids(["<|im_start|>", "<|im_end|>", "<|endoftext|>"])
    assert module.stop_token_ids == tuple(sorted([im_end, endoftext]))  # either ends a rollout
    assert all(prompt.count(im_start) == 2 for prompt in log.first_prompts)  # user turn + generation prompt
    # fp32: the sampler's log-probs are the trainer's, although generation_config.json carries penalties
    assert len(log.diff_max) == 2 and max(log.diff_max) < 1e-4
    assert len(log.losses) == 4 and all(torch.isfinite(torch.tensor(log.losses)))
    final = dict(module.policy.named_parameters())
    lora = {name for name in log.initial if "lora_" in name}
    assert lora and all(not torch.equal(final[name].detach(), log.initial[name]) for name in lora)
    # the tied embedding and the q/k/v biases among them
    assert all(torch.equal(final[name].detach(), before) for name, before in log.initial.items() if name not in lora)
