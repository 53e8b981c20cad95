"""Build a release-shaped test model: the shapes and files of a Qwen2.5-class instruct checkpoint, tiny in width.

Why it exists: the tiny char model has a 100-token vocabulary, one EOS, no chat template and no sampling options.
Users bring checkpoints with a byte-level BPE vocabulary of 150k tokens, grouped-query attention, q/k/v biases, tied
embeddings, a ChatML template, two EOS ids and a ``generation_config.json`` full of sampling options, stored in
bf16. This model has all of those (a 32k-token vocabulary trained offline on the Python standard library's own
sources), in a few MB, so the end-to-end, engine-sync, chat-template and DDP tests run on them. Its weights are
random: it is a rig for shapes and files, not a learner.

Deterministic: the tokenizer is trained on a fixed, sorted list of files with one thread, and the weights are
seeded, so rebuilding gives byte-identical files (``tests/test_release_model.py`` checks it) with the same Python
(whose standard library is the training text), tokenizers, transformers and torch versions. About 5 s on 2 cores.

Usage: ``.venv/bin/python scripts/build_release_model.py [--out data/tiny-qwen2-chat]``
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import sysconfig
from pathlib import Path

# set before tokenizers is imported. The trainer gave identical merges with 1, 2 and 8 threads here, but its docs
# promise no such thing, and one thread costs nothing at this size
os.environ["RAYON_NUM_THREADS"] = "1"

import torch  # noqa: E402
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers  # noqa: E402
from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM, Qwen2Tokenizer  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO_ROOT / "data" / "tiny-qwen2-chat"
VOCAB = 32_700  # trained tokens, specials included; the model pads its vocabulary to the next multiple of 64
TRAINING_BYTES = 6_000_000  # a cap on the training text, so a larger standard library still trains in seconds
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# Qwen2.5's pre-tokenizer split (digits one by one, words with their leading space). transformers' Qwen2Tokenizer
# rebuilds its own pipeline (NFC, this split, byte-level) from the vocabulary and merges whatever tokenizer.json
# says, so the merges are trained under that same pipeline: the shipped file is then what actually runs
QWEN2_SPLIT = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|"""
               r"""\s+(?!\S)|\s+""")
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' "
    "+ '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
# a released instruct model's own sampling options: lit-grpo must sample from softmax(logits / T) regardless
GENERATION = {"do_sample": True, "temperature": 0.7, "top_k": 20, "top_p": 0.8, "min_p": 0.05,
              "repetition_penalty": 1.3, "no_repeat_ngram_size": 2}


def training_files() -> list[Path]:
    """The standard library's top-level ``.py`` modules in sorted order, stopping once ``TRAINING_BYTES`` are
    reached (Python 3.11 has 4.7 MB of them, all used)."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    chosen, total = [], 0
    for path in sorted(stdlib.glob("*.py")):
        chosen.append(path)
        total += path.stat().st_size
        if total >= TRAINING_BYTES:
            break
    return chosen


def train_tokenizer() -> Qwen2Tokenizer:
    """A byte-level BPE with Qwen2.5's pipeline and special tokens: any NFC text encodes, and decodes back exactly."""
    backend = Tokenizer(models.BPE())
    backend.normalizer = normalizers.NFC()
    backend.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    backend.train([str(p) for p in training_files()], trainer)
    trained = json.loads(backend.to_str())["model"]
    return Qwen2Tokenizer(vocab=trained["vocab"], merges=[tuple(pair) for pair in trained["merges"]], unk_token=None,
                          eos_token="<|im_end|>", pad_token="<|endoftext|>", model_max_length=512,
                          extra_special_tokens=["<|im_start|>", "<|im_end|>"], chat_template=CHAT_TEMPLATE)


def build_model(vocab_size: int, eos_ids: list[int], pad_id: int) -> Qwen2ForCausalLM:
    config = Qwen2Config(
        # head size 32 = hidden / heads: the smallest vLLM's CPU attention takes, and vLLM's Qwen2 derives it from
        # these two (it ignores a config head_dim), so 4 heads at hidden 64 would not load there. 2 query heads
        # share 1 KV head: grouped-query attention. hidden 64 keeps the tied embedding, 32,704 x 64 in bf16, at 4 MB
        vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, max_position_embeddings=512, tie_word_embeddings=True, bos_token_id=None,
        eos_token_id=eos_ids[0], pad_token_id=pad_id, dtype="bfloat16",
    )
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config).to(torch.bfloat16)
    with torch.no_grad():  # transformers starts biases at 0; a loader or weight sync that dropped them would not show
        for name, param in model.named_parameters():
            if name.endswith("_proj.bias"):
                param.normal_(0.0, 0.5)
    model.generation_config = GenerationConfig(**GENERATION, eos_token_id=eos_ids, pad_token_id=pad_id)
    return model


def build(out: Path) -> None:
    tokenizer = train_tokenizer()
    vocab_size = -(-len(tokenizer) // 64) * 64  # padded to a multiple of 64, as released checkpoints are
    eos_ids = [tokenizer.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|endoftext|>")]
    model = build_model(vocab_size, eos_ids, tokenizer.pad_token_id)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    (out / "BUILD.md").write_text(build_notes(len(tokenizer), vocab_size))
    print(json.dumps({"out": str(out), "tokens": len(tokenizer), "vocab_size": vocab_size, "eos_ids": eos_ids,
                      "files": len(training_files())}))


def build_notes(tokens: int, vocab_size: int) -> str:
    """The folder's BUILD.md: what the model is, what it is for, and the command that rebuilt it."""
    return f"""# tiny-qwen2-chat

A test rig with the shapes and files of a Qwen2.5-class instruct checkpoint, tiny in width. Its weights are
random (seed 0; q/k/v biases drawn non-zero): it is not a learner, it checks that lit-grpo loads, samples and
trains such a checkpoint (tests/test_release_model.py, and the DDP and real-vLLM sync tests).

- Qwen2ForCausalLM: hidden 64, intermediate 128, 2 layers, 2 query heads sharing 1 KV head (grouped-query
  attention; head size 32, the smallest vLLM's CPU attention takes), q/k/v biases, tied embeddings, 512 positions,
  weights stored in bf16.
- Byte-level BPE tokenizer of {tokens:,} tokens with Qwen2.5's pipeline (NFC, its pre-tokenizer split,
  Qwen2Tokenizer), trained on the Python standard library's top-level modules; the model's vocabulary is padded
  to {vocab_size:,}, a multiple of 64, as released checkpoints pad theirs.
- Special tokens <|endoftext|> (pad), <|im_start|>, <|im_end|> (EOS); a ChatML chat template.
- generation_config.json: both EOS ids, and sampling options of its own (temperature 0.7, top_k 20, top_p 0.8,
  min_p 0.05, repetition_penalty 1.3, no_repeat_ngram_size 2) that lit-grpo must not apply.

Built offline and deterministically (byte-identical files with the same Python, tokenizers, transformers and
torch; about 5 s on 2 CPU cores) by:

    .venv/bin/python scripts/build_release_model.py [--out DIR]
"""


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    build(parser.parse_args(argv).out)


if __name__ == "__main__":
    sys.exit(main())
