"""A reward model: a local sequence-classification checkpoint scoring prompt + completion."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from lit_grpo.errors import InputError
from lit_grpo.run.model_files import (
    BASE_DTYPES,
    base_dtype,
    load_tokenizer,
    model_path_problem,
    refuse_remote_code,
    resolve_model_path,
)
from lit_grpo.tasks.base import is_conversation
from lit_grpo.tasks.rewards.functions import BatchedReward, Completions


class RewardModel(BatchedReward):
    """Scores from a local ``AutoModelForSequenceClassification`` checkpoint with its own tokenizer: each completion
    is appended to its prompt as the assistant's turn (through the reward model's chat template when its tokenizer
    has one, else as plain text after the prompt) and scored by one output of the classifier's head at the last
    token. Batched, without gradients, on the policy's device (the task is told it at setup).

    Its scores have no floor: give the task a ``failure_reward``.

    Args:
        path: the checkpoint's directory (``config.json``, weights, tokenizer); model code it ships is never run.
        dtype: ``auto`` (the checkpoint's own), ``float32``, ``bfloat16`` or ``float16``.
        batch_size: completions per forward pass.
        label: the name of the head's output that is the score (one of its config.json's ``id2label``, e.g.
            ``POSITIVE``); its raw logit is the score.
        label_index: the same by position. A head with one output (a usual reward model's) needs neither; one with
            several (a classifier's NEGATIVE/POSITIVE, a regression head's several targets) is refused until one of
            them names the output, as scoring its first silently would train towards whatever that label means.
        name: the name of its metrics (``rollout/rewards/<name>/mean``).
    """

    min_value = None

    def __init__(self, path: str, dtype: str = "auto", batch_size: int = 16, label_index: int | None = None,
                 name: str = "reward_model", label: str | None = None) -> None:
        from transformers import AutoModelForSequenceClassification

        if dtype not in ("auto", *BASE_DTYPES):
            raise InputError(f"RewardModel dtype: one of auto, {', '.join(BASE_DTYPES)}; got {dtype!r}")
        if batch_size < 1:
            raise InputError(f"RewardModel batch_size: must be >= 1, got {batch_size}")
        self.path = resolve_model_path(path)
        problem = model_path_problem(path) or ("" if Path(self.path).is_dir() else "not a local directory")
        if problem:
            raise InputError(f"RewardModel path {path!r}: {problem}")
        refuse_remote_code(self.path, trust_remote_code=False)
        config = json.loads((Path(self.path) / "config.json").read_text(encoding="utf-8"))
        architectures = config.get("architectures") or []
        if not any(str(name).endswith("ForSequenceClassification") for name in architectures):
            raise InputError(f"RewardModel {path!r} is not a sequence-classification checkpoint (its config.json "
                             f"names {architectures or 'no architectures'}); its score head would be random")
        self.__name__ = name
        self.dtype, self.batch_size = dtype, batch_size
        self.device = torch.device("cpu")
        self.tokenizer = load_tokenizer(self.path)
        model, info = AutoModelForSequenceClassification.from_pretrained(
            self.path, dtype=base_dtype(self.path, dtype), trust_remote_code=False, output_loading_info=True)
        if info["missing_keys"]:  # e.g. a causal LM's checkpoint: its classifier head would be random
            raise InputError(f"RewardModel {path!r} is not a sequence-classification checkpoint: "
                             f"{len(info['missing_keys'])} weight(s) missing, e.g. {sorted(info['missing_keys'])[0]!r}")
        labels = [str(model.config.id2label.get(i, f"LABEL_{i}")) for i in range(model.config.num_labels)]
        try:
            self.label_index = score_output(labels, label_index, label, model.config.problem_type)
        except InputError as error:
            raise InputError(f"RewardModel {path!r}: {error}") from None
        self.model = model.eval().requires_grad_(False)
        # the classifier reads the score at the last token that is not padding, found through pad_token_id
        self.model.config.pad_token_id = self.tokenizer.pad_token_id

    def use_device(self, device: torch.device) -> None:
        self.device = torch.device(device)
        self.model.to(self.device)

    def texts(self, batch: Completions) -> list[str]:
        """Prompt and completion as the reward model reads them."""
        template = getattr(self.tokenizer, "chat_template", None) is not None
        texts = []
        for record, completion in zip(batch.records, batch.texts):
            prompt = record["prompt"]
            if template:
                messages = prompt if is_conversation(prompt) else [{"role": "user", "content": prompt}]
                messages = [*messages, {"role": "assistant", "content": completion}]
                texts.append(self.tokenizer.apply_chat_template(messages, tokenize=False))
            elif is_conversation(prompt):
                texts.append("\n".join(m["content"] for m in prompt) + "\n" + completion)
            else:
                texts.append(prompt + completion)
        return texts

    @torch.no_grad()
    def score_batch(self, batch: Completions) -> list[float | None]:
        texts = self.texts(batch)
        # a chat template writes its own special tokens; plain text gets the tokenizer's usual ones
        special = getattr(self.tokenizer, "chat_template", None) is None
        scores: list[float | None] = []
        for start in range(0, len(texts), self.batch_size):
            encoded = self.tokenizer(texts[start:start + self.batch_size], padding=True, return_tensors="pt",
                                     add_special_tokens=special).to(self.device)
            logits = self.model(**encoded).logits  # [B, labels]
            scores.extend(float(v) for v in logits[:, self.label_index].float().cpu())
        return scores

    def __getstate__(self) -> dict[str, Any]:
        # a reward worker process gets the path, not the weights: it loads its own copy
        return {"args": (self.path, self.dtype, self.batch_size, self.label_index, self.__name__), "device": self.device}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(*state["args"])
        self.use_device(state["device"])


def score_output(labels: list[str], label_index: int | None, label: str | None, problem_type: str | None = None) -> int:
    """Which of the head's outputs (named ``labels``) is the score: the index ``label_index`` or ``label`` names,
    the only one of a one-output head; ``InputError`` naming the labels and the knob when none can be chosen.

    >>> score_output(["NEGATIVE", "POSITIVE"], None, "POSITIVE")
    1
    >>> score_output(["LABEL_0"], None, None)
    0
    """
    shown = ", ".join(f"{i} {name}" for i, name in enumerate(labels))
    if label is not None and label_index is not None:
        raise InputError(f"label {label!r} and label_index {label_index} both pick the score; give one")
    if label is not None:
        if label not in labels:
            raise InputError(f"label {label!r} is not one of its outputs ({shown}); set label to one of them")
        return labels.index(label)
    if label_index is not None:
        if not 0 <= label_index < len(labels):
            raise InputError(f"label_index {label_index} is outside its {len(labels)} output(s) ({shown}); give 0 "
                             f"to {len(labels) - 1}, or name one with label")
        return label_index
    if len(labels) == 1:
        return 0
    kind = "regression head" if problem_type == "regression" else "classifier head"
    raise InputError(f"its {kind} has {len(labels)} outputs ({shown}) and the score is one of them: name it with "
                     f"label (e.g. label: {labels[-1]}) or label_index in the RewardModel's init_args")
