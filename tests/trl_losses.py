"""TRL 1.16's own GRPO loss on crafted inputs, so that our loss functions can be compared with TRL's.

``trl_trainer(**config)`` builds (and caches) a real ``trl.GRPOTrainer`` on the shipped tiny model, and
``trl_loss(trainer, logp, ...)`` runs that trainer's ``_compute_loss`` (trl/trainer/grpo_trainer.py, lines 3020-3292
in trl 1.16.0) with the model forward replaced by the given per-token log-probs, so the returned scalar is TRL's loss
and ``torch.autograd.grad(loss, logp)`` TRL's per-token gradient. Nothing here re-implements a loss formula; the one
piece of TRL copied rather than called is the vLLM importance-sampling ratio, which TRL computes inline in
``_generate_and_score_completions`` (``trl_importance_sampling_ratio`` below; tests/test_trl_loss_harness.py checks
the copy against TRL's source text executed as is).

What is faked, and why it does not change the arithmetic of the loss:

- ``_get_per_token_logps_and_entropies`` (the model forward) is replaced on the trainer *instance* for the duration of
  one call and returns ``(logp, entropies, None)``; ``prompt_ids``/``completion_ids`` are placeholders of the right
  shapes (``_compute_loss`` reads only ``completion_ids.size(1)`` from them once the forward is faked).
- TRL's generation step is not run; ``inputs`` is built as ``_generate_and_score_completions`` (lines 2324-2937)
  builds it: ``completion_mask`` as int64, ``advantages`` [B], ``num_items_in_batch`` = the mask's token count unless
  given, ``old_per_token_logps`` only when given (TRL leaves it out on-policy and ``_compute_loss`` then uses
  ``per_token_logps.detach()``), ``ref_per_token_logps`` when ``beta != 0``, ``sampling_per_token_logps`` when
  sampler log-probs are given, ``importance_sampling_ratio`` when the trainer has ``use_vllm`` and
  ``vllm_importance_sampling_correction`` on.
- ``use_vllm=True`` cannot be passed to the constructor here (it would start a vLLM engine, or connect to a server,
  in ``VLLMGeneration.__init__``): ``trl_trainer`` builds with ``use_vllm=False`` and then sets ``trainer.use_vllm``
  (and ``trainer.args.use_vllm``) to True, after running the one construction-time check that reads it (VESPO needs a
  ``token_*`` importance-sampling mode). The ``vllm_importance_sampling_*`` knobs are ordinary config fields and go
  through ``GRPOConfig``'s own validation.

Floating point: the trainer's model is float32 but never runs; the loss arithmetic runs in ``logp``'s dtype, so pass
float64 tensors for comparisons tighter than float32 allows. The other float inputs are converted to ``logp``'s dtype.
TRL itself keeps a few quantities in float32 whatever the input dtype: the entropy quantile threshold
(``get_high_entropy_mask`` calls ``.float()``), and the per-sign constants built with ``torch.where(cond, float,
float)`` (SAPO temperatures, VESPO k and lambda), so e.g. ``sapo_temperature_neg=1.05`` enters as float32's
1.0499999523.
"""

from __future__ import annotations

import math
import random
import shutil
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from trl import GRPOTrainer

TINY_MODEL = Path(__file__).resolve().parent.parent / "data" / "tiny-llama"

# Infrastructure settings only: CPU, float32, no logging, no checkpoints, no gradient checkpointing, the smallest
# batch GRPOConfig accepts (num_generations >= 2). Loss knobs keep TRL's defaults (beta is stated, though 0.0 is
# GRPOConfig's default too), so a test names every loss knob it relies on.
DEFAULTS: dict[str, Any] = {
    "use_cpu": True,
    "bf16": False,  # GRPOConfig's default is bf16=True
    "fp16": False,
    "report_to": [],
    "logging_strategy": "no",
    "save_strategy": "no",
    "gradient_checkpointing": False,  # GRPOConfig's default is True
    "per_device_train_batch_size": 2,
    "num_generations": 2,
    "gradient_accumulation_steps": 1,
    "dataloader_num_workers": 0,
    "model_init_kwargs": {"dtype": "float32"},
    "beta": 0.0,
}

_TRAINERS: dict[Any, GRPOTrainer] = {}


def _freeze(value: Any) -> Any:
    """A hashable stand-in for a config value (dicts and lists occur in GRPOConfig fields)."""
    if isinstance(value, dict):
        return ("dict", tuple(sorted((k, _freeze(v)) for k, v in value.items())))
    if isinstance(value, (list, tuple)):
        return ("seq", tuple(_freeze(v) for v in value))
    return value


def _zero_reward(completions: list, **_: Any) -> list[float]:
    return [0.0] * len(completions)


def trl_trainer(**config: Any) -> GRPOTrainer:
    """A GRPOTrainer on the shipped tiny model data/tiny-llama (offline), CPU, float32, with
    ``GRPOConfig(**DEFAULTS | config)``: nothing downloads (local model and tokenizer), no vLLM, no logging
    (output_dir a temporary directory removed at exit, report_to=[]), batch 2 with num_generations 2, beta 0.0 unless
    given.

    ``use_vllm=True`` is applied after construction (see the module docstring). Trainers are cached per config: one
    config, one trainer, shared by every caller; ``trl_loss`` resets the state it depends on before each call. The
    global random state (random, numpy, torch), which TRL's constructor reseeds, is restored afterwards.
    """
    key = tuple(sorted((k, _freeze(v)) for k, v in config.items()))
    if key in _TRAINERS:
        return _TRAINERS[key]

    import numpy as np
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    config = dict(config)
    use_vllm = bool(config.pop("use_vllm", False))
    output_dir = tempfile.mkdtemp(prefix="trl-loss-harness-")
    import atexit

    atexit.register(shutil.rmtree, output_dir, ignore_errors=True)
    args = GRPOConfig(**{**DEFAULTS, "output_dir": output_dir, **config})

    states = random.getstate(), np.random.get_state(), torch.get_rng_state()
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(TINY_MODEL))
        trainer = GRPOTrainer(
            model=str(TINY_MODEL),
            reward_funcs=_zero_reward,
            args=args,
            processing_class=tokenizer,
            train_dataset=Dataset.from_dict({"prompt": ["1+1="] * args.generation_batch_size}),
        )
    finally:
        random.setstate(states[0])
        np.random.set_state(states[1])
        torch.set_rng_state(states[2])

    if use_vllm:
        # The construction-time check that reads use_vllm (grpo_trainer.py lines 936-941), run as TRL runs it
        if (
            trainer.loss_type == "vespo"
            and trainer.vllm_importance_sampling_correction
            and trainer.vllm_importance_sampling_mode not in ["token_truncate", "token_mask"]
        ):
            raise ValueError(
                f"VESPO loss requires `vllm_importance_sampling_mode` to be either 'token_truncate' or "
                f"'token_mask'. Got: {trainer.vllm_importance_sampling_mode}."
            )
        trainer.use_vllm = True
        trainer.args.use_vllm = True

    trainer.model.train()
    _TRAINERS[key] = trainer
    return trainer


@torch.no_grad()
def trl_importance_sampling_ratio(
    old_logp: torch.Tensor,
    sampler_logp: torch.Tensor,
    mask: torch.Tensor,
    mode: str,
    clip_min: float | None,
    clip_max: float | None,
) -> torch.Tensor:
    """TRL's vLLM importance-sampling ratio pi_old / pi_sampler: [B, T] for the token_* modes, [B, 1] for the
    sequence_* modes. ``mask`` is completion_mask (times tool_mask in multi-turn runs).

    Copied from trl 1.16.0 trl/trainer/grpo_trainer.py, ``GRPOTrainer._generate_and_score_completions``, lines
    2660-2708 (inline there, so it cannot be called; the computation runs inside ``torch.no_grad()`` there too), with
    ``self.vllm_importance_sampling_*`` renamed to the arguments and ``old_per_token_logps``,
    ``sampling_per_token_logps`` to ``old_logp``, ``sampler_logp``. test_trl_loss_harness.py executes TRL's own lines
    on the same numbers and compares.
    """
    per_token_logps_diff = (old_logp - sampler_logp) * mask
    # Tokens whose sampling logprob was NaN (unavailable from vLLM) get a zero difference, so their
    # importance ratio is exactly 1 (no correction) rather than propagating NaN through the loss.
    per_token_logps_diff = torch.nan_to_num(per_token_logps_diff, nan=0.0)

    sequence_level_is = mode in ["sequence_mask", "sequence_truncate"]
    if sequence_level_is:
        per_sequence_logps_diff = per_token_logps_diff.sum(dim=-1, keepdim=True)
        logps_diff = per_sequence_logps_diff
    else:
        logps_diff = per_token_logps_diff

    vllm_importance_sampling_ratio = torch.exp(logps_diff)

    # vllm_importance_sampling_ratio.shape:
    #   token_* modes:     (B, T)  (per-token ratio)
    #   sequence_* modes:  (B, 1)  (per-sequence ratio)

    if mode in ["sequence_truncate", "token_truncate"]:
        vllm_importance_sampling_ratio = torch.clamp(vllm_importance_sampling_ratio, min=clip_min, max=clip_max)
    elif mode in ["sequence_mask", "token_mask"]:
        min_val = clip_min if clip_min is not None else -math.inf
        max_val = clip_max if clip_max is not None else math.inf

        invalid_mis_mask = (vllm_importance_sampling_ratio < min_val) | (vllm_importance_sampling_ratio > max_val)
        vllm_importance_sampling_ratio = vllm_importance_sampling_ratio.masked_fill(invalid_mis_mask, value=0.0)
    else:
        raise ValueError(
            f"Unknown vLLM importance sampling level: {mode}. Possible values are 'token_truncate', 'token_mask', "
            "'sequence_truncate', and 'sequence_mask'."
        )
    return vllm_importance_sampling_ratio


def _reset_loss_state(trainer: GRPOTrainer) -> None:
    """The trainer state ``_compute_loss`` reads, set as at the first micro-batch of a fresh run (the cached trainer
    would otherwise carry one call's metrics and adaptive-entropy state into the next)."""
    trainer.model.train()  # mode == "train": TRL's train-mode normalisers (gradient accumulation) apply
    # Set by Trainer's training loop (transformers trainer.py: len(batch_samples)); a full accumulation window
    trainer.current_gradient_accumulation_steps = trainer.args.gradient_accumulation_steps
    trainer._metrics = {"train": defaultdict(list), "eval": defaultdict(list)}
    # Adaptive entropy control (use_adaptive_entropy): the values GRPOTrainer.__init__ sets
    trainer.entropy_coef = trainer.args.entropy_coef
    trainer._last_world_entropy = float("inf")
    trainer._entropy_window_stats = None


def trl_inputs(
    trainer: GRPOTrainer,
    logp: torch.Tensor,
    old_logp: torch.Tensor | None,
    advantages: torch.Tensor,
    completion_mask: torch.Tensor,
    *,
    ref_logp: torch.Tensor | None = None,
    sampler_logp: torch.Tensor | None = None,
    num_items_in_batch: int | torch.Tensor | None = None,
    tool_mask: torch.Tensor | None = None,
) -> dict[str, Any]:
    """The ``inputs`` dict ``_compute_loss`` reads, built as TRL's ``_generate_and_score_completions`` would from the
    given tensors (``trl_loss`` explains each); placeholders of the right shapes for the ids it does not read."""
    if logp.dim() != 2:
        raise ValueError(f"logp must be [B, T], got shape {tuple(logp.shape)}")
    batch, length = logp.shape
    dtype, device = logp.dtype, logp.device

    def as_float(x: torch.Tensor) -> torch.Tensor:
        return torch.as_tensor(x, device=device).to(dtype)

    # TRL pads [torch.ones_like(ids, dtype=torch.long)] (line 2453): an int64 mask
    completion_mask = torch.as_tensor(completion_mask, device=device).to(torch.long)
    loss_mask = completion_mask
    if tool_mask is not None:
        tool_mask = torch.as_tensor(tool_mask, device=device).to(torch.long)
        loss_mask = completion_mask * tool_mask
    if num_items_in_batch is None:
        num_items_in_batch = loss_mask.sum()  # line 2498: accelerator.gather(loss_mask.sum()).sum(), one process
    num_items_in_batch = torch.as_tensor(num_items_in_batch, device=device)

    pad_id = trainer.processing_class.pad_token_id
    inputs: dict[str, Any] = {
        "prompt_ids": torch.full((batch, 1), pad_id, dtype=torch.long, device=device),
        "prompt_mask": torch.ones((batch, 1), dtype=torch.long, device=device),
        "completion_ids": torch.full((batch, length), pad_id, dtype=torch.long, device=device),
        "completion_mask": completion_mask,
        "advantages": as_float(advantages),
        "num_items_in_batch": num_items_in_batch,
    }
    if old_logp is not None:
        inputs["old_per_token_logps"] = as_float(old_logp)
    if trainer.use_vllm and trainer.vllm_importance_sampling_correction:
        if sampler_logp is None:
            raise ValueError("the trainer has use_vllm and vllm_importance_sampling_correction on: give sampler_logp")
        inputs["importance_sampling_ratio"] = trl_importance_sampling_ratio(
            as_float(old_logp) if old_logp is not None else logp.detach(),
            as_float(sampler_logp),
            loss_mask,
            trainer.vllm_importance_sampling_mode,
            trainer.vllm_importance_sampling_clip_min,
            trainer.vllm_importance_sampling_clip_max,
        )
    if sampler_logp is not None:
        inputs["sampling_per_token_logps"] = as_float(sampler_logp)
    if trainer.beta != 0.0:
        if ref_logp is None:
            raise ValueError(f"the trainer has beta={trainer.beta}: give ref_logp")
        inputs["ref_per_token_logps"] = as_float(ref_logp)
    if tool_mask is not None:
        inputs["tool_mask"] = tool_mask

    return inputs


def trl_loss(
    trainer: GRPOTrainer,
    logp: torch.Tensor,
    old_logp: torch.Tensor | None,
    advantages: torch.Tensor,
    completion_mask: torch.Tensor,
    *,
    ref_logp: torch.Tensor | None = None,
    sampler_logp: torch.Tensor | None = None,
    entropies: torch.Tensor | None = None,
    num_items_in_batch: int | torch.Tensor | None = None,
    tool_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """TRL's scalar loss from ``trainer._compute_loss`` with the model's per-token log-probs replaced by ``logp``
    ([B, T]; give it requires_grad and ``torch.autograd.grad(loss, logp)`` is TRL's per-token gradient).

    ``old_logp`` [B, T]: the rollout policy's log-probs (``old_per_token_logps``); None leaves the key out, as TRL does
    on-policy, and ``_compute_loss`` then uses ``logp.detach()`` (with vLLM importance sampling on, TRL always has
    them: None then means ``logp.detach()`` for the ratio too). ``advantages`` [B] (or [B, T], which TRL also accepts).
    ``completion_mask`` [B, T] of 0/1. ``ref_logp``: required when the trainer's beta != 0. ``sampler_logp``: the
    sampler's (vLLM's) log-probs, ``inputs["sampling_per_token_logps"]``, read by the off-policy mask and, when the
    trainer has use_vllm and vllm_importance_sampling_correction, turned into ``inputs["importance_sampling_ratio"]``
    by ``trl_importance_sampling_ratio``. ``entropies`` [B, T]: default a constant 1.0 (no gradient).
    ``num_items_in_batch``: the loss-token count of the whole generation batch (cispo/dapo/vespo normaliser); default
    the token count of ``completion_mask`` (times ``tool_mask``), as TRL computes it for one process. ``tool_mask``
    [B, T]: multi-turn runs' mask of tool-output tokens (``inputs["tool_mask"]``).

    After the call ``trainer._metrics["train"]`` holds the metrics TRL logged for this call alone.
    """
    inputs = trl_inputs(trainer, logp, old_logp, advantages, completion_mask, ref_logp=ref_logp,
                        sampler_logp=sampler_logp, num_items_in_batch=num_items_in_batch, tool_mask=tool_mask)
    if entropies is None:
        entropies = torch.ones_like(logp).detach()
    else:
        entropies = torch.as_tensor(entropies, device=logp.device).to(logp.dtype)

    def forward(*_: Any, **__: Any) -> tuple[torch.Tensor, torch.Tensor, None]:
        return logp, entropies, None  # (per_token_logps, entropies, aux_loss)

    _reset_loss_state(trainer)
    trainer._get_per_token_logps_and_entropies = forward  # shadows the method on this instance only
    try:
        return trainer._compute_loss(trainer.model, inputs)
    finally:
        del trainer._get_per_token_logps_and_entropies
