"""Build a release-shaped test model: the shapes and files of a Qwen2.5-class instruct checkpoint, tiny in width.

Why it exists: the tiny char model has a 100-token vocabulary, one EOS, no chat template and no sampling options.
Users bring checkpoints with a byte-level BPE vocabulary of 150k tokens, grouped-query attention, q/k/v biases, tied
embeddings, a ChatML template, two EOS ids and a ``generation_config.json`` full of sampling options, stored in
bf16. This model has all of those (a 32k-token vocabulary trained offline on the Python standard library's own
sources), in a few MB, so the end-to-end, engine-sync, chat-template and DDP tests run on them. Its weights are
random: it is a rig for shapes and files, not a learner.

Deterministic: the tokenizer is trained on a fixed, sorted list of files with one thread, and the weights are
seeded, so rebuilding gives the same files (``tests/test_release_model.py`` checks it).

Usage: ``.venv/bin/python scripts/build_release_model.py [--out data/tiny-qwen2-chat]``
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import sysconfig
from pathlib import Path

os.environ["RAYON_NUM_THREADS"] = "1"  # the BPE trainer's merges must not depend on thread scheduling

import torch  # noqa: E402
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers  # noqa: E402
from transformers import GenerationConfig, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO_ROOT / "data" / "tiny-qwen2-chat"
VOCAB = 32_700  # trained tokens; the model pads its vocabulary to 32,768
TRAINING_BYTES = 6_000_000  # of stdlib source: enough text for 32k merges, seconds to train
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' "
    "+ '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
# a released instruct model's own sampling options: lit-grpo must sample from softmax(logits / T) regardless
GENERATION = {"do_sample": True, "temperature": 0.7, "top_k": 20, "top_p": 0.8, "min_p": 0.05,
              "repetition_penalty": 1.3, "no_repeat_ngram_size": 2}


def training_files() -> list[Path]:
    """A fixed, sorted prefix of the standard library's ``.py`` files, about ``TRAINING_BYTES`` of text."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    chosen, total = [], 0
    for path in sorted(stdlib.glob("*.py")):
        chosen.append(path)
        total += path.stat().st_size
        if total >= TRAINING_BYTES:
            break
    return chosen


def train_tokenizer() -> PreTrainedTokenizerFast:
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    backend.train([str(p) for p in training_files()], trainer)
    return PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   chat_template=CHAT_TEMPLATE)


def build_model(vocab_size: int, eos_ids: list[int], pad_id: int) -> Qwen2ForCausalLM:
    config = Qwen2Config(
        vocab_size=vocab_size, hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, max_position_embeddings=512, tie_word_embeddings=True, bos_token_id=None,
        eos_token_id=eos_ids[0], pad_token_id=pad_id, dtype="bfloat16",
    )
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config).to(torch.bfloat16)
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
    (out / "BUILD.md").write_text(
        "# tiny-qwen2-chat\n\nA release-shaped test rig (random weights): Qwen2 with grouped-query attention (2 heads, "
        "1 KV head, head size 64 as vLLM's CPU attention needs), q/k/v biases and tied embeddings, hidden 128, 2 layers; "
        "a byte-level BPE tokenizer of "
        f"{len(tokenizer):,} tokens (vocabulary padded to {vocab_size:,}) trained on the Python standard library's "
        "sources; a ChatML chat template; EOS ids <|im_end|> and <|endoftext|>; a generation_config.json with "
        "sampling options of its own; weights in bf16.\n\nBuilt offline and deterministically by "
        "`.venv/bin/python scripts/build_release_model.py` (see its docstring).\n")
    print(json.dumps({"out": str(out), "tokens": len(tokenizer), "vocab_size": vocab_size, "eos_ids": eos_ids,
                      "files": len(training_files())}))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    build(parser.parse_args(argv).out)


if __name__ == "__main__":
    sys.exit(main())
