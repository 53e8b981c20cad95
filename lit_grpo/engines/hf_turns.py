"""The hf engine's turns without paying for the prefix again (docs/guide.md#tools-and-environments).

A multi-turn episode calls ``generate`` once a turn, each prompt being the previous call's prompt, the completion
drawn there and the environment's reply (``rollout/trees.py``). When a call is told another turn follows
(``SamplingSpec.next_turn``), the engine keeps its rows' key/value cache; the next call finds, for each of its
prompts, the kept row whose tokens begin it, lays those rows' cached columns out again (left-padded, each row's
real columns in order), and runs the model on the new tokens only. Keys are stored after the rotary embedding at
each token's place among its row's real tokens, which relaying does not change, so the cache continues exactly as a
fresh prefill would have computed it (up to the rounding of a different batch shape: ``tests/test_engine_hf.py``).

What is kept lives until the next call (which consumes it, whether or not it continues, and drops it once relaid),
``end_turns`` (the tree expansion's end, however it ends), the next ``push_policy`` or ``close``. A call whose
prompts do not all continue kept rows, a model whose cache is not a plain ``DynamicCache`` (sliding windows,
hybrids), or weights that changed since (the trainable parameters' checksum) prefill in full, as without it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from transformers import DynamicCache

from lit_grpo.buffers.positions import padded_positions
from lit_grpo.engines.hf_decode import left_pad, logits_kwargs


@dataclass
class KeptTurn:
    """A finished call's cache: ``cache`` (``[R]`` rows, ``W`` columns), ``mask [R, W]`` (1 where a column holds one
    of the row's tokens; its other columns are padding or tokens drawn after the row's stop), ``rows`` (a row's
    tokens, prompt then completion, -> (its index, how many of those tokens the cache holds)) and the weights'
    ``checksum`` when it was computed."""

    cache: DynamicCache
    mask: torch.Tensor
    rows: dict[tuple[int, ...], tuple[int, int]]
    checksum: float

    @property
    def lengths(self) -> list[int]:
        """The kept rows' token counts, longest first (a prompt continues the longest row that begins it)."""
        return sorted({len(tokens) for tokens in self.rows}, reverse=True)


def weights_checksum(model: Any) -> float:
    """A checksum of the trainable parameters (the adapter the optimizer moves between epochs): a kept cache is used
    only under the weights that computed it."""
    with torch.no_grad():
        return float(sum(p.sum(dtype=torch.float64) for p in model.parameters() if p.requires_grad))


def keep_turn(cache: Any, attention_mask: torch.Tensor, prompts: list[list[int]], tokens: torch.Tensor,
              lengths: list[int], checksum: float) -> KeptTurn | None:
    """What a finished call keeps: ``cache`` after decoding ``tokens [R, S]`` (``lengths``: each row's completion,
    its stop included) from the left-padded ``attention_mask [R, P]`` of ``prompts`` (``R`` rows, each prompt
    repeated for its samples). The cache holds the prompt columns and the first ``S - 1`` drawn tokens of every
    row (the last one drawn was never run). None where the cache cannot be relaid."""
    if type(cache) is not DynamicCache or any(sliding is not None for _, _, sliding in cache):
        return None
    steps = tokens.shape[1]
    fed = torch.arange(max(steps - 1, 0), device=attention_mask.device)[None]  # [1, S-1]
    held = torch.tensor([min(n, steps - 1) for n in lengths], device=attention_mask.device)[:, None]  # [R, 1]
    mask = torch.cat([attention_mask, (fed < held).to(attention_mask.dtype)], dim=1)  # [R, P + S - 1]
    rows: dict[tuple[int, ...], tuple[int, int]] = {}
    for row, (prompt, length) in enumerate(zip(prompts, lengths)):
        completion = tokens[row, :length].tolist()
        rows.setdefault((*prompt, *completion), (row, len(prompt) + min(length, steps - 1)))
    return KeptTurn(cache, mask, rows, checksum)


def continued_prompts(kept: KeptTurn, prompts: list[list[int]]) -> list[tuple[int, int]] | None:
    """For each prompt, ``(kept row, tokens of it the cache holds)``, the row's tokens beginning the prompt and at
    least one token of the prompt not cached (the one whose logits start the completion); None unless every prompt
    continues a kept row."""
    lengths, matches = kept.lengths, []
    for prompt in prompts:
        hit = next((kept.rows[key] for length in lengths if length <= len(prompt)
                    and (key := tuple(prompt[:length])) in kept.rows), None)
        if hit is None or hit[1] >= len(prompt):
            return None
        matches.append(hit)
    return matches


def relaid_cache(kept: KeptTurn, matches: list[tuple[int, int]]) -> tuple[DynamicCache, torch.Tensor]:
    """The kept rows' cached tokens for ``matches``, one row each, right-aligned (left padding): ``(cache, mask
    [B, C])`` with ``C`` the most tokens a match holds."""
    columns = [kept.mask[row].nonzero().squeeze(-1)[:held] for row, held in matches]  # each row's real columns
    width = max(held for _, held in matches)
    mask = torch.zeros(len(matches), width, dtype=kept.mask.dtype, device=kept.mask.device)  # [B, C]
    layers = []
    for keys, values, _ in kept.cache:  # [R, H, W, D] each
        new_keys = keys.new_zeros(len(matches), keys.shape[1], width, keys.shape[3])  # [B, H, C, D]
        new_values = values.new_zeros(len(matches), values.shape[1], width, values.shape[3])
        for index, ((row, held), cols) in enumerate(zip(matches, columns)):
            new_keys[index, :, width - held:] = keys[row, :, cols]
            new_values[index, :, width - held:] = values[row, :, cols]
        layers.append((new_keys, new_values))
    for index, (_, held) in enumerate(matches):
        mask[index, width - held:] = 1
    return DynamicCache(ddp_cache_data=layers), mask


def continue_prefill(model: Any, kept: KeptTurn, prompts: list[list[int]], n: int,
                     pad_id: int) -> tuple[torch.Tensor, torch.Tensor, DynamicCache] | None:
    """``(input_ids [B * n, C + T], attention_mask, cache)`` for ``decode``: the kept cache of every prompt's first
    tokens, its other tokens but the last run through the model (``T``: the most new tokens of a prompt, left-padded
    to it), repeated ``n`` times per prompt. ``input_ids`` holds pad ids in the cached columns (decode runs only the
    last column). None where the prompts do not all continue kept rows."""
    matches = continued_prompts(kept, prompts)
    if matches is None:
        return None
    cache, cached_mask = relaid_cache(kept, matches)
    new = [prompt[held:] for prompt, (_, held) in zip(prompts, matches)]
    new_ids, new_mask = left_pad(new, pad_id, cached_mask.device)
    width = new_ids.shape[1]  # [B, T]
    mask = torch.cat([cached_mask, new_mask], dim=1)  # [B, C + T]
    if width > 1:  # the new tokens but the last: their keys and values join the cache
        context = mask[:, :-1]
        positions = padded_positions(context)[:, -(width - 1):]
        model(input_ids=new_ids[:, :-1], attention_mask=context, position_ids=positions, past_key_values=cache,
              use_cache=True, **logits_kwargs(model))
    input_ids = torch.cat([torch.full_like(cached_mask, pad_id, dtype=torch.long), new_ids], dim=1)
    if n > 1:
        cache.batch_repeat_interleave(n)
        input_ids, mask = input_ids.repeat_interleave(n, 0), mask.repeat_interleave(n, 0)
    return input_ids, mask, cache
