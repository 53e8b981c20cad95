"""Rollouts from the live PEFT model with our own decoding loop: no extra install, exact weights by construction."""

from __future__ import annotations

import random
from typing import Any

import torch
from tqdm.auto import tqdm

from lit_grpo.engines.base import Completion, SamplingSpec
from lit_grpo.engines.cpu_weights import packed_frozen_linears
from lit_grpo.engines.hf_decode import Decoding, decode, left_pad, prompt_uniforms, shared_prefill
from lit_grpo.engines.hf_turns import KeptTurn, continue_prefill, keep_turn, weights_checksum
from lit_grpo.errors import InputError


class HFEngine:
    """Generates from the policy being trained, in eval mode, without gradients, with our own decoding loop
    (``lit_grpo.engines.hf_decode``): one forward per step with a key/value cache, the head on the last position
    only, each token drawn from softmax(logits / T) over the whole vocabulary (restricted only by the spec's
    first-token constraint) and its log-prob recorded as it is drawn. transformers' ``generate`` is not used, so
    nothing of a checkpoint's generation_config (penalties, truncation, forced or suppressed tokens, min length)
    reaches the samples.

    With ``share_prompt_prefill`` (the default), a prompt sampled ``n`` times is run through the model once: all
    but its last token are prefilled for the ``B`` prompts and the key/value cache is repeated ``n`` times per
    prompt. Tokens and log-probs are those of the unshared path (``tests/test_engine_hf.py``); models whose cache
    is not a ``DynamicCache`` take the unshared path.

    Args:
        batch_size: prompts per decoding loop (each expands to ``n`` rows). A row's tokens do not depend on it.
        shared: see ``RolloutEngine.shared``.
        share_prompt_prefill: compute each prompt's prefill once for its ``n`` samples.
        pack_cpu_weights: on a CPU, decode with the frozen linear weights in oneDNN's packed layout (2x faster
            bf16 and 4x faster fp32 output heads on a CPU with AVX-512; holds a second copy of those weights while
            generating). Where the CPU cannot pack the model's dtype (bf16 without AVX-512 or avx_ne_convert), the
            weights decode unpacked and one line says so; see ``lit_grpo.engines.cpu_weights``.
        keep_turn_cache: when a call says another turn follows (a tool episode's, a game's round), keep its rows'
            key/value cache so that the next turn runs only its new tokens (``lit_grpo.engines.hf_turns``; a call of
            more than ``batch_size`` prompts keeps nothing). Holds one call's cache between the two calls.
    """

    def __init__(self, batch_size: int = 64, shared: bool = False, share_prompt_prefill: bool = True,
                 pack_cpu_weights: bool = True, keep_turn_cache: bool = True) -> None:
        if batch_size < 1:
            raise InputError(f"HFEngine batch_size: must be >= 1, got {batch_size}")
        self.batch_size = batch_size
        self.shared = shared
        self.share_prompt_prefill = share_prompt_prefill
        self.pack_cpu_weights = pack_cpu_weights
        self.keep_turn_cache = keep_turn_cache
        self._model: Any = None
        self._kept: KeptTurn | None = None  # the last call's cache, when its caller said a turn follows
        self._continuing: KeptTurn | None = None  # handed from generate to its one chunk, which lets it go

    def push_policy(self, model: Any) -> None:
        self._model, self._kept = model, None

    def end_turns(self) -> None:
        """The episodes' turns are over (``RolloutEngine``'s optional hook): drop a kept cache now, not at the next
        call, which may be an epoch of training away."""
        self._kept = None

    def close(self) -> None:
        self._model, self._kept = None, None

    def generate(self, prompts: list[list[int]], n: int, sampling: SamplingSpec) -> list[list[Completion]]:
        if self._model is None:
            raise RuntimeError("HFEngine has no policy: call push_policy(model) first")
        if sampling.greedy and n > 1:  # greedy decoding has one answer per prompt: return it n times
            return [group * n for group in self.generate(prompts, 1, sampling)]
        # an unseeded call still draws independently of the global RNG, which it leaves alone
        seed = random.SystemRandom().getrandbits(62) if sampling.seed is None else sampling.seed
        results: list[list[Completion]] = []
        kept, self._kept = self._kept, None  # a kept cache serves one call only
        if kept is not None and kept.checksum != weights_checksum(self._model):
            kept = None  # the weights moved since: that cache is another policy's
        starts = range(0, len(prompts), self.batch_size)
        self._continuing = kept if len(starts) == 1 else None  # the one chunk takes it (and lets it go once relaid)
        del kept
        # a bar on a terminal when generation takes several loops; None lets tqdm stay quiet when not a TTY
        quiet = True if len(starts) < 2 else None
        model, was_training = self._model, self._model.training
        model.eval()
        try:
            with torch.no_grad(), packed_frozen_linears(model, self.pack_cpu_weights):
                for start in tqdm(starts, desc="generating", unit="batch", leave=False, disable=quiet):
                    chunk = slice(start, min(start + self.batch_size, len(prompts)))
                    # a call of one chunk may keep its cache for the next turn
                    keep = sampling.next_turn and self.keep_turn_cache and len(starts) == 1
                    results.extend(self._generate_chunk(prompts[chunk], n, sampling, chunk, seed, keep))
        finally:
            model.train(was_training)
        return results

    def _generate_chunk(self, prompts: list[list[int]], n: int, sampling: SamplingSpec, chunk: slice,
                        seed: int, keep: bool) -> list[list[Completion]]:
        model = self._model
        kept, self._continuing = self._continuing, None
        continued = None if kept is None else continue_prefill(model, kept, prompts, n, pad_token_id(model))
        del kept  # relaid (or not continued): the previous turn's cache is not held through this decode
        if continued is not None:  # the previous turn's cache, relaid; only the new tokens run
            input_ids, attention_mask, cache = continued
        else:
            input_ids, attention_mask = left_pad(prompts, pad_token_id(model), model.device)  # [B, P]
            cache = None
            if self.share_prompt_prefill and n > 1 and input_ids.shape[1] > 1:
                cache = shared_prefill(model, input_ids, attention_mask, n)
            input_ids = input_ids.repeat_interleave(n, 0)  # [B * n, P], prompt-major
            attention_mask = attention_mask.repeat_interleave(n, 0)
        seeds = [seed + index for index in range(chunk.start, chunk.stop)]
        how = Decoding(
            uniforms=None if sampling.greedy else prompt_uniforms(seeds, n, sampling.max_new_tokens, model.device),
            temperature=1.0 if sampling.greedy else sampling.temperature,
            allowed=row_constraint(sampling.allowed_token_ids, chunk, n),
            stop_ids=torch.tensor(sampling.stop_token_ids, dtype=torch.long, device=model.device),
            max_new_tokens=sampling.max_new_tokens,
            top_p=sampling.top_p,
        )
        new_tokens, logprobs, cache = decode(model, input_ids, attention_mask, cache, how)  # [B * n, S] each
        stops = set(sampling.stop_token_ids)
        flat = [to_completion(ids, lps, stops) for ids, lps in zip(new_tokens.cpu(), logprobs.cpu())]
        if keep:
            rows = [list(prompt) for prompt in prompts for _ in range(n)]  # prompt-major, as decoded
            self._kept = keep_turn(cache, attention_mask, rows, new_tokens, [len(c.token_ids) for c in flat],
                                   weights_checksum(model))
        return [flat[i * n : (i + 1) * n] for i in range(len(prompts))]


def row_constraint(per_prompt: tuple[tuple[int, ...] | None, ...] | None, chunk: slice,
                   n: int) -> list[tuple[int, ...] | None]:
    """One first-token constraint per row of ``chunk``'s prompts (each repeated ``n`` times, prompt-major)."""
    prompts = [None] * (chunk.stop - chunk.start) if per_prompt is None else list(per_prompt[chunk])
    return [ids for ids in prompts for _ in range(n)]


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


def to_completion(ids: torch.Tensor, logprobs: torch.Tensor, stop_ids: set[int]) -> Completion:
    """Cut a generated row after its first stop token; the stop token is part of the completion."""
    tokens = ids.tolist()
    for end, token in enumerate(tokens):
        if token in stop_ids:
            return Completion(tuple(tokens[: end + 1]), tuple(logprobs[: end + 1].tolist()), "stop")
    return Completion(tuple(tokens), tuple(logprobs.tolist()), "length")
