"""The project's tiny character-level models: built offline, no download, for the quickstart and the tests.

Not part of the package: ``scripts/build_tiny_model.py`` (beside it) builds ``data/tiny-llama/`` from it, and
``tests/support.py`` imports it for the tests' random tiny models."""

from __future__ import annotations

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import GPT2Config, LlamaConfig, PreTrainedTokenizerFast

SPECIAL_TOKENS = ("<pad>", "<s>", "</s>", "<unk>")
# printable ASCII and the newline: every built-in and later task writes its prompts with these
CHARACTERS = tuple(chr(code) for code in range(32, 127)) + ("\n",)


def build_char_tokenizer() -> PreTrainedTokenizerFast:
    """One token per character, ``<s>`` prepended to every encoded text, ``</s>`` as EOS, ``<pad>`` id 0."""
    vocab = {token: index for index, token in enumerate(SPECIAL_TOKENS + CHARACTERS)}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")
    backend.decoder = decoders.Fuse()
    backend.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", vocab["<s>"])])
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<pad>", bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )


def tiny_llama_config(vocab_size: int, hidden_size: int = 256, num_layers: int = 4, max_positions: int = 256) -> LlamaConfig:
    """A Llama of a few million parameters over the character vocabulary."""
    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 8 // 3 // 16 * 16,
        num_hidden_layers=num_layers,
        num_attention_heads=hidden_size // 32,
        num_key_value_heads=hidden_size // 32,
        max_position_embeddings=max_positions,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        tie_word_embeddings=True,
        torch_dtype="float32",
    )


def tiny_gpt2_config(vocab_size: int, hidden_size: int = 64, num_layers: int = 2, max_positions: int = 128) -> GPT2Config:
    """A GPT-2-style model over the same vocabulary: the second architecture the tests train."""
    return GPT2Config(
        vocab_size=vocab_size,
        n_embd=hidden_size,
        n_layer=num_layers,
        n_head=4,
        n_positions=max_positions,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
