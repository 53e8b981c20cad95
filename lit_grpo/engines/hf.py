"""Rollouts with transformers' ``generate`` on the live PEFT model: no extra install, exact weights by construction."""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from tqdm.auto import tqdm
from transformers import DynamicCache, GenerationConfig, LogitsProcessor, LogitsProcessorList

from lit_grpo.engines.base import Completion, SamplingSpec


class FirstTokenProcessor(LogitsProcessor):
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


class TemperatureScale(LogitsProcessor):
    """scores / T, done here rather than by ``generate``'s warper: the warpers run after every processor passed in,
    so the log-prob recorder could not see the tempered scores otherwise."""

    def __init__(self, temperature: float) -> None:
        self.temperature = temperature

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        return scores if self.temperature == 1.0 else scores / self.temperature


class SampledLogprobs(LogitsProcessor):
    """Last processor: sees the scores each token is drawn from and records the sampled token's log-prob.

    The token drawn at one step appears as the last column of ``input_ids`` at the next call, so only one step's
    log-softmax ``[rows, V]`` is held at a time (``output_scores`` would keep ``[rows, steps, V]``); the last
    step's token is read from the returned sequences by ``logprobs``.
    """

    def __init__(self) -> None:
        self._held: torch.Tensor | None = None  # [rows, V] fp32 log-probs of the step whose token is not seen yet
        self._picked: list[torch.Tensor] = []  # one [rows] per finished step

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if self._held is not None:
            self._picked.append(self._held.gather(-1, input_ids[:, -1:]).squeeze(-1))
        self._held = torch.log_softmax(scores.float(), dim=-1)
        return scores

    def logprobs(self, new_tokens: torch.Tensor) -> torch.Tensor:
        """``[rows, steps]`` log-probs of the generated ``new_tokens [rows, steps]``."""
        if self._held is None:
            return new_tokens.new_zeros(new_tokens.shape, dtype=torch.float32)
        picked = [*self._picked, self._held.gather(-1, new_tokens[:, -1:]).squeeze(-1)]
        if len(picked) != new_tokens.shape[1]:
            raise RuntimeError(f"recorded {len(picked)} sampling steps for {new_tokens.shape[1]} generated tokens")
        return torch.stack(picked, dim=1)


@contextmanager
def neutral_generation_config(model: Any) -> Iterator[None]:
    """``generate`` fills every option it is not passed from the model's generation_config (a checkpoint's
    repetition/presence penalties, top-k/top-p/min-p, no-repeat n-grams, suppressed or forced tokens, min length,
    ...): for our call the model holds a blank one, so only what the SamplingSpec says shapes the distribution."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    saved = base.generation_config
    base.generation_config = GenerationConfig()
    try:
        yield
    finally:
        base.generation_config = saved


@contextmanager
def device_rng(device: torch.device) -> Iterator[None]:
    """Fork the CPU generator and, on an accelerator, that device's: a seeded generate leaves both as it found them."""
    if device.type == "cpu":
        with torch.random.fork_rng(devices=[]):
            yield
        return
    index = device.index if device.index is not None else getattr(torch, device.type).current_device()
    with torch.random.fork_rng(devices=[index], device_type=device.type):
        yield


class HFEngine:
    """Generates with ``model.generate`` on the policy being trained, in eval mode, without gradients.

    The sampling distribution is softmax(logits / T) over the whole vocabulary (restricted only by the spec's
    first-token constraint), whatever the checkpoint's generation_config says: ``generate`` runs with a blank one,
    top-k 0 and top-p 1 (transformers would otherwise fill top-k 50), and each sampled token's log-prob is recorded
    as it is drawn.

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
        constraints = constraint_processors(sampling, chunk, n, input_ids.shape[1])
        temperature = 1.0 if sampling.greedy else sampling.temperature
        recorder = SampledLogprobs()
        processors = LogitsProcessorList([TemperatureScale(temperature), *constraints, recorder])
        was_training = model.training
        model.eval()
        try:
            with torch.no_grad(), device_rng(model.device), neutral_generation_config(model):
                cache = None
                if self.share_prompt_prefill and n > 1 and input_ids.shape[1] > 1:
                    cache = shared_prefill(model, input_ids, attention_mask, n)
                if cache is not None:
                    input_ids = input_ids.repeat_interleave(n, 0)  # [B * n, P], prompt-major
                    attention_mask = attention_mask.repeat_interleave(n, 0)
                if sampling.seed is not None:
                    torch.manual_seed(sampling.seed + chunk.start)
                sequences = model.generate(
                    input_ids=input_ids,
                    attention_mask=attention_mask,
                    past_key_values=cache,
                    **sampling_kwargs(sampling),
                    max_new_tokens=sampling.max_new_tokens,
                    num_return_sequences=1 if cache is not None else n,
                    eos_token_id=list(sampling.stop_token_ids) or None,
                    pad_token_id=pad_id,
                    logits_processor=processors,
                )
        finally:
            model.train(was_training)
        new_tokens = sequences[:, input_ids.shape[1] :]  # [B * n, steps]
        logprobs = recorder.logprobs(new_tokens)  # [B * n, steps]
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
    """Plain sampling (no warper: top-k off, top-p 1, temperature applied by ``TemperatureScale``) or greedy."""
    if sampling.greedy:
        return {"do_sample": False}
    return {"do_sample": True, "temperature": 1.0, "top_k": 0, "top_p": 1.0}


def pad_token_id(model: Any) -> int:
    """The id left padding is filled with: the model's pad id, else an EOS id, else 0 (padded positions are masked,
    so any id in the vocabulary will do; some released configs name neither)."""
    for config in (model.config, getattr(model, "generation_config", None)):
        for name in ("pad_token_id", "eos_token_id"):
            value = getattr(config, name, None)
            value = value[0] if isinstance(value, (list, tuple)) and value else value
            if isinstance(value, int):
                return value
    return 0


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
    return LogitsProcessorList([FirstTokenProcessor(prompt_length, allowed, banned)])


def to_completion(ids: torch.Tensor, logprobs: torch.Tensor, stop_ids: set[int]) -> Completion:
    """Cut a generated row after its first stop token; the stop token is part of the completion."""
    tokens = ids.tolist()
    for end, token in enumerate(tokens):
        if token in stop_ids:
            return Completion(tuple(tokens[: end + 1]), tuple(logprobs[: end + 1].tolist()), "stop")
    return Completion(tuple(tokens), tuple(logprobs.tolist()), "length")
