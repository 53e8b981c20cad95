"""The module's work on an epoch's buffer before its training steps (``PolicyModule.prepare_epoch`` runs them in
order): the no-grad passes (pi_old, pi_ref, the old values) and the detached risk head's fit on the epoch's probes.
Functions of what they read; the advantages are ``policy/advantages.py``'s. The buffer comes from the train loader
(``served_epoch``)."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import torch

from lit_grpo.buffers.buffer import RolloutBuffer
from lit_grpo.buffers.epoch import EpochBatches
from lit_grpo.policy.packed import TokenLogprobs
from lit_grpo.policy.risk_features import fit_on_replay
from lit_grpo.policy.value_head import ValueHead, old_values
from lit_grpo.risk.fit import RiskReplay
from lit_grpo.risk.head import RiskHead, RiskHeadSpec
from lit_grpo.risk.probes import ProbeLabels
from lit_grpo.run.distributed import global_step_denominators


def served_epoch(trainer: Any) -> EpochBatches | None:
    """The epoch the DataModule handed over (``EpochBatches``, the train loader's dataset); None under another."""
    epoch = getattr(trainer.train_dataloader, "dataset", None)
    return epoch if isinstance(epoch, EpochBatches) else None


def serve_minibatches(epoch: EpochBatches, trainer: Any, aggregation: str) -> None:
    """Cut the prepared epoch's minibatches for ``trainer``'s accumulation, with each optimizer step's loss counts
    (``aggregation``'s) summed over all ranks."""
    batches = epoch.serve(trainer.accumulate_grad_batches, aggregation)
    global_step_denominators(batches, trainer.strategy, trainer.world_size)


def ranks(trainer: Any) -> tuple[Any, int]:
    """``(strategy, world size)`` for statistics pooled over ranks; ``(None, 1)`` outside a trainer."""
    return (None, 1) if trainer is None else (trainer.strategy, trainer.world_size)


def no_grad_passes(buffer: RolloutBuffer, policy: Any, token_logprobs: TokenLogprobs, device: torch.device,
                   batch_tokens: int, recompute_old: bool, reference: Callable[[], AbstractContextManager[None]] | None,
                   value_head: ValueHead | None) -> None:
    """Set the buffer's pi_old log-probs (recomputed by ``policy`` when ``recompute_old`` or the sampler gave none,
    else the sampler's), its pi_ref log-probs (run inside ``reference()``, when given) and its old values (with a
    value head), each ``[N, L]`` on the CPU, in forwards of ``batch_tokens`` padded tokens."""
    args = (buffer.input_ids.to(device), buffer.attention_mask.to(device))
    rows = (*args, buffer.completion_mask.to(device), buffer.temperature, batch_tokens)
    constraint = buffer.first_token_constraint()  # the risk rule's forced defers, scored as sampled
    if recompute_old or buffer.sampler_logp is None:
        buffer.old_logp = token_logprobs.batched(policy, *rows, constraint).cpu()
    else:
        buffer.old_logp = buffer.sampler_logp
    if reference is not None:
        with reference():
            buffer.ref_logp = token_logprobs.batched(policy, *rows, constraint).cpu()
    if value_head is not None:
        buffer.values = old_values(policy, value_head, *args, batch_tokens).cpu()


def fit_detached_risk_head(policy: Any, head: RiskHead, replay: RiskReplay, labels: ProbeLabels, pad_id: int,
                           spec: RiskHeadSpec, ranks: tuple[Any, int]) -> dict[str, float]:
    """The detached risk head's fit of the epoch on its replay (``risk_features.fit_on_replay``), its statistics;
    under DDP (``ranks``: strategy, world size) every rank then takes rank 0's head, so the rule is the same
    everywhere."""
    stats = fit_on_replay(policy, head, replay, labels, pad_id, spec.fit_steps, spec.fit_lr)
    strategy, world_size = ranks
    if world_size > 1:
        head.load_state_dict(strategy.broadcast(head.state_dict(), src=0))
    return stats
