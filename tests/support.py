"""Test helpers: tiny random models saved offline, and a dense reward so random policies get a signal."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
from transformers import GPT2LMHeadModel, LlamaForCausalLM

from lit_grpo.tasks import ArithmeticTask, PromptRecord
from lit_grpo.tiny import build_char_tokenizer, tiny_gpt2_config, tiny_llama_config


def save_tiny_model(target: Path, arch: str, seed: int = 0) -> Path:
    """A randomly initialised tiny ``llama`` or ``gpt2`` with the project's character tokenizer."""
    tokenizer = build_char_tokenizer()
    torch.manual_seed(seed)
    if arch == "llama":
        model = LlamaForCausalLM(tiny_llama_config(len(tokenizer), hidden_size=64, num_layers=2))
    else:
        model = GPT2LMHeadModel(tiny_gpt2_config(len(tokenizer)))
    model.save_pretrained(target)
    tokenizer.save_pretrained(target)
    return target


class DigitShareTask(ArithmeticTask):
    """Arithmetic prompts rewarded by the share of digits in the completion: dense, so a random model's
    completions differ in reward within a group and every update has a signal."""

    def reward(self, prompt_record: PromptRecord, completion_text: str, completion_ids: Sequence[int]) -> float:
        return sum(ch.isdigit() for ch in completion_text) / max(len(completion_text), 1)
