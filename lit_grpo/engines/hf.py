"""Rollouts with transformers' ``generate`` on the live PEFT model: no extra install, exact weights by construction."""

from __future__ import annotations

import inspect
from typing import Any

import torch
from tqdm.auto import tqdm
from transformers import DynamicCache, LogitsProcessor, LogitsProcessorList

from lit_grpo.engines.base import Completion, SamplingSpec


class FirstTokenConstraint(LogitsProcessor):
    """Restricts the first generated token of each row to its allowed ids and away from its banned ids."""

    def __init__(self, prompt_length: int, allowed: list[list[int] | None], banned: list[list[int] | None]) -> None:
        self.prompt_length, self.allowed, self.banned = prompt_length, allowed, banned

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if input_ids.shape[1] != self.prompt_length:
            return scores
        blocked = torch.zeros_like(scores, dtype=torch.bool)  # [rows, V]
        for row, (allowed, banned) in enumerate(zip(self.allowed, self.banned)):
            if allowed is not None:
                blocked[row] = True
                blocked[row, list(allowed)] = False
            if banned is not None:
                blocked[row, list(banned)] = True
        return scores.masked_fill(blocked, float("-inf"))


class HFEngine:
    """Generates with ``model.generate`` on the policy being trained, in eval mode, without gradients.

    Top-k is set to 0 explicitly: transformers fills an unset ``top_k`` with 50, which would truncate the sampling
    distribution and bias the importance ratio.

    With ``share_prompt_prefill`` (the default), a prompt sampled ``n`` times is run through the model once: all
    but its last token are prefilled for the ``B`` prompts, the key/value cache is repeated ``n`` times per prompt,
    and ``generate`` continues the ``B * n`` rows from there (what ``num_return_sequences`` would otherwise compute
    ``n`` times). Tokens and log-probs are those of the unshared path (``tests/test_engine_hf.py``); models whose
    cache is not a ``DynamicCache`` take the unshared path.

    Args:
        batch_size: prompts per ``generate`` call (each expands to ``n`` rows).
        shared: see ``RolloutEngine.shared``.
        share_prompt_prefill: compute each prompt's prefill once for its ``n`` samples.
    """

    def __init__(self, batch_size: int = 64, shared: bool = False, share_prompt_prefill: bool = True) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.batch_size = batch_size
        self.shared = shared
        self.share_prompt_prefill = share_prompt_prefill
        self._model: Any = None

    def push_policy(self, model: Any) -> None:
        self._model = model

    def close(self) -> None:
        self._model = None

    def generate(self, prompts: list[list[int]], n: int, sampling: SamplingSpec) -> list[list[Completion]]:
        if self._model is None:
            raise RuntimeError("HFEngine has no policy: call push_policy(model) first")
        if sampling.greedy and n > 1:  # greedy decoding has one answer per prompt: return it n times
            return [group * n for group in self.generate(prompts, 1, sampling)]
        results: list[list[Completion]] = []
        starts = range(0, len(prompts), self.batch_size)
        # a bar on a terminal when generation takes several calls; None lets tqdm stay quiet when not a TTY
        quiet = True if len(starts) < 2 else None
        for start in tqdm(starts, desc="generating", unit="batch", leave=False, disable=quiet):
            chunk = slice(start, min(start + self.batch_size, len(prompts)))
            results.extend(self._generate_chunk(prompts[chunk], n, sampling, chunk))
        return results

    def _generate_chunk(
        self, prompts: list[list[int]], n: int, sampling: SamplingSpec, chunk: slice
    ) -> list[list[Completion]]:
        model = self._model
        pad_id = pad_token_id(model)
        input_ids, attention_mask = left_pad(prompts, pad_id, model.device)  # [B, P]
        processors = constraint_processors(sampling, chunk, n, input_ids.shape[1])
        was_training = model.training
        model.eval()
        try:
            with torch.no_grad(), torch.random.fork_rng(devices=[]):
                cache = None
                if self.share_prompt_prefill and n > 1 and input_ids.shape[1] > 1:
                    cache = shared_prefill(model, input_ids, attention_mask, n)
                if cache is not None:
                    input_ids = input_ids.repeat_interleave(n, 0)  # [B * n, P], prompt-major
                    attention_mask = attention_mask.repeat_interleave(n, 0)
                if sampling.seed is not None:
                    torch.manual_seed(sampling.seed + chunk.start)
                out = model.generate(
                    input_ids=input_ids,
                    attention_mask=attention_mask,
                    past_key_values=cache,
                    **sampling_kwargs(sampling),
                    max_new_tokens=sampling.max_new_tokens,
                    num_return_sequences=1 if cache is not None else n,
                    eos_token_id=list(sampling.stop_token_ids) or None,
                    pad_token_id=pad_id,
                    logits_processor=processors,
                    output_scores=True,
                    return_dict_in_generate=True,
                )
        finally:
            model.train(was_training)
        new_tokens = out.sequences[:, input_ids.shape[1] :]  # [B * n, steps]
        scores = torch.stack(out.scores, dim=1).float()  # [B * n, steps, V], processed (temperature applied)
        logprobs = torch.log_softmax(scores, dim=-1).gather(-1, new_tokens.unsqueeze(-1)).squeeze(-1)
        flat = [to_completion(ids, lps, set(sampling.stop_token_ids)) for ids, lps in zip(new_tokens, logprobs)]
        return [flat[i * n : (i + 1) * n] for i in range(len(prompts))]


def shared_prefill(model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, n: int) -> DynamicCache | None:
    """The key/value cache of every prompt's tokens but the last (``input_ids [B, P]``, left-padded), computed once
    and repeated ``n`` times per prompt (``[B * n]`` rows, prompt-major like ``num_return_sequences``); ``generate``
    then runs from each row's last prompt token. ``None`` when the model's cache cannot be repeated."""
    context_mask = attention_mask[:, :-1]  # [B, P-1]
    positions = (context_mask.cumsum(-1) - 1).masked_fill(context_mask == 0, 1)  # as generate numbers left-padded rows
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    # only the cache is wanted: skip the output head over the prompt (B x P x vocab floats) where the model allows
    head = {"logits_to_keep": 1} if "logits_to_keep" in inspect.signature(base.forward).parameters else {}
    out = model(input_ids=input_ids[:, :-1], attention_mask=context_mask, position_ids=positions, use_cache=True,
                **head)
    cache = out.past_key_values
    if type(cache) is not DynamicCache:  # e.g. a sliding-window or hybrid cache: generate unshared
        return None
    cache.batch_repeat_interleave(n)
    return cache


def sampling_kwargs(sampling: SamplingSpec) -> dict[str, Any]:
    """Full-distribution sampling (top-k off, top-p 1, set explicitly), or plain greedy decoding."""
    if sampling.greedy:
        return {"do_sample": False, "temperature": None, "top_k": None, "top_p": None}
    return {"do_sample": True, "temperature": sampling.temperature, "top_k": 0, "top_p": 1.0}


def pad_token_id(model: Any) -> int:
    config = model.config
    pad = getattr(config, "pad_token_id", None)
    return pad if pad is not None else config.eos_token_id


def left_pad(prompts: list[list[int]], pad_id: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded ``[B, P]`` ids and mask: decoder-only generation continues every row from its last column."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt) :] = torch.tensor(prompt, dtype=torch.long)
        mask[row, width - len(prompt) :] = 1
    return ids.to(device), mask.to(device)


def constraint_processors(sampling: SamplingSpec, chunk: slice, n: int, prompt_length: int) -> LogitsProcessorList:
    """The first-token constraints of the prompts in ``chunk``, one row per returned sequence."""
    if sampling.allowed_token_ids is None and sampling.banned_token_ids is None:
        return LogitsProcessorList()

    def per_row(per_prompt: tuple[tuple[int, ...] | None, ...] | None) -> list[list[int] | None]:
        rows = [None] * (chunk.stop - chunk.start) if per_prompt is None else list(per_prompt[chunk])
        return [None if ids is None else list(ids) for ids in rows for _ in range(n)]  # num_return_sequences order

    allowed, banned = per_row(sampling.allowed_token_ids), per_row(sampling.banned_token_ids)
    return LogitsProcessorList([FirstTokenConstraint(prompt_length, allowed, banned)])


def to_completion(ids: torch.Tensor, logprobs: torch.Tensor, stop_ids: set[int]) -> Completion:
    """Cut a generated row after its first stop token; the stop token is part of the completion."""
    tokens = ids.tolist()
    for end, token in enumerate(tokens):
        if token in stop_ids:
            return Completion(tuple(tokens[: end + 1]), tuple(logprobs[: end + 1].tolist()), "stop")
    return Completion(tuple(tokens), tuple(logprobs.tolist()), "length")
