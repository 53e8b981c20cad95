"""A training step's loss (``PolicyStep``, what ``PolicyModule.training_step`` returns): the policy's part, the
surrogate of the module's ``Objective`` with its masks and sampler correction, the KL to the reference and the
entropy bonus's terms (docs/guide.md#the-math), each from one minibatch (``policy_terms``); the jointly trained
heads' losses; each scaled to the optimizer step. ``EntropyCoefficient`` holds the adaptive coefficient."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from lit_grpo.buffers.buffer import batch_sequences, policy_mask
from lit_grpo.buffers.positions import batch_constraint
from lit_grpo.losses import (
    aggregation_terms,
    kl_divergence,
    masked_aggregate,
    masked_mean,
    off_policy_keep,
    policy_loss,
)
from lit_grpo.losses.entropy import high_entropy_mask, next_entropy_coef
from lit_grpo.losses.policy import importance_ratio
from lit_grpo.policy.head_losses import head_losses, nothing_to_learn, share
from lit_grpo.policy.logprobs import body_and_head, logprobs_and_hidden, sampler_agreement
from lit_grpo.policy.objective import Objective
from lit_grpo.policy.online_dpo import online_dpo_loss
from lit_grpo.policy.packed import TokenLogprobs
from lit_grpo.policy.value_head import ValueHead
from lit_grpo.risk.head import RiskHead
from lit_grpo.run.objective_knobs import EntropyControl


@dataclass
class PolicyTerms:
    loss: torch.Tensor  # [] the surrogate (and beta * KL) aggregated as the objective says
    stats: dict[str, torch.Tensor]  # detached figures, named as TRL logs them
    entropy: torch.Tensor | None  # [] mean entropy over the tokens the loss counts (with its gradient), or None
    entropy_sums: torch.Tensor | None  # [2] detached (entropy sum, token count) of those tokens, or None


def token_masks(objective: Objective, batch: dict[str, torch.Tensor], logp: torch.Tensor,
                entropy: torch.Tensor | None, counted: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor,
                                                                              dict[str, torch.Tensor]]:
    """``(weights on the per-token surrogate or None, the tokens it then counts [n, L], stats)``: the off-policy
    sequence mask (against the sampler's log-probs, else pi_old) and the high-entropy token mask."""
    weights, stats = None, {}
    if objective.off_policy_mask_threshold is not None:
        behaviour = batch.get("sampler_logp", batch["old_logp"])
        keep = off_policy_keep(batch["advantages"], logp, behaviour, counted, objective.off_policy_mask_threshold,
                               batch_sequences(batch))
        weights = keep
        stats["off_policy_mask/masked_ratio"] = masked_mean((1.0 - keep).expand_as(logp), counted)
    effective = counted
    if entropy is not None and objective.entropy.top_quantile < 1.0:
        high = high_entropy_mask(entropy, counted, objective.entropy.top_quantile)  # [n, L]
        effective = counted & high
        weights = high.to(logp.dtype) if weights is None else weights * high
    return weights, effective, stats


def policy_terms(objective: Objective, batch: dict[str, torch.Tensor], logp: torch.Tensor,
                 entropy: torch.Tensor | None, counted: torch.Tensor, max_new_tokens: int) -> PolicyTerms:
    """The policy loss of one minibatch: ``logp [n, L]`` (with gradient), ``entropy [n, L]`` (with gradient, when
    the objective controls entropy), ``counted [n, L]`` the tokens in the loss (``buffer.policy_mask``). The
    surrogate and the KL term are aggregated alike: over rows, or over a tool task's episodes where the minibatch
    carries them (``buffer.batch_sequences``)."""
    weights, effective, stats = token_masks(objective, batch, logp, entropy, counted)
    sampler_ratio, sequences = batch.get("sampler_ratio"), batch_sequences(batch)
    surrogate, loss_stats = policy_loss(logp, batch["old_logp"], batch["advantages"], counted, objective.variant,
                                        objective.clip_eps, objective.clip_eps_high, objective.aggregation,
                                        max_new_tokens, objective.surrogate, weights, sampler_ratio, sequences)
    stats.update(loss_stats, surrogate=surrogate.detach())
    loss = surrogate
    if objective.needs_reference and objective.kl_in == "loss":
        token_kl = kl_divergence(logp, batch["ref_logp"], objective.kl_estimator)  # [n, L]
        if objective.kl_ratio_correction:  # times pi_theta / pi_old: the unbiased gradient of KL at pi_theta
            token_kl = token_kl * importance_ratio(logp, batch["old_logp"], counted,
                                                   objective.surrogate.level(objective.variant), sequences)[0]
        kl = masked_aggregate(token_kl, counted, objective.aggregation, max_new_tokens, sequences)
        loss = loss + objective.kl_coef * kl
        stats["kl_ref"] = kl.detach()
    if sampler_ratio is not None and counted.any():
        picked = sampler_ratio[counted]
        stats.update({"sampling/importance_sampling_ratio/mean": picked.mean(),
                      "sampling/importance_sampling_ratio/min": picked.min(),
                      "sampling/importance_sampling_ratio/max": picked.max(),
                      "sampling/importance_sampling_ratio/masked_ratio": (picked == 0).to(picked.dtype).mean()})
    if entropy is None:
        return PolicyTerms(loss, stats, None, None)
    stats["entropy"] = masked_mean(entropy.detach(), counted)
    mask = effective.to(entropy.dtype)
    sums = torch.stack([(entropy.detach() * mask).sum(), mask.sum()])
    return PolicyTerms(loss, stats, masked_mean(entropy, effective), sums)


class EntropyCoefficient:
    """The entropy bonus's coefficient (``EntropyControl``): constant, or adapted after every optimizer step from
    that step's mean token entropy over every rank (``observe`` each minibatch, ``step`` at the optimizer step).
    Its state goes into checkpoints (``state_dict``), so a resumed run goes on with the coefficient it had."""

    def __init__(self, control: EntropyControl) -> None:
        self.control = control
        self.coef = control.coef
        self.last_entropy = float("inf")  # no bonus before the first measured step (adaptive)
        self.window = torch.zeros(2, dtype=torch.float64)  # (entropy sum, token count) since the last step

    @classmethod
    def of(cls, control: EntropyControl | None) -> EntropyCoefficient | None:
        """The coefficient of ``control``'s entropy bonus; None when it has none."""
        return cls(control) if control is not None and control.bonus else None

    def applied(self) -> float:
        """The coefficient the bonus takes now: the constant, or the adaptive one while the last step's entropy was
        at or below the target."""
        if not self.control.adaptive:
            return self.coef
        return self.coef if self.last_entropy <= self.control.target else 0.0

    def observe(self, sums: torch.Tensor) -> None:
        self.window += sums.detach().double().cpu()

    def step(self, strategy: Any = None, world_size: int = 1) -> None:
        """At an optimizer step: the adaptive coefficient's update from the window's mean entropy over all ranks."""
        if not self.control.adaptive:
            return
        window = self.window
        if world_size > 1:
            window = strategy.reduce(window.to(strategy.root_device), reduce_op="sum").cpu()
        self.window = torch.zeros(2, dtype=torch.float64)
        if window[1] == 0:  # a step that counted no token (its training steps returned None) measures nothing
            return
        entropy = float(window[0] / window[1])
        control = self.control
        self.coef = next_entropy_coef(self.coef, entropy, control.target, control.coef_delta, control.coef_min,
                                      control.coef_max)
        self.last_entropy = entropy

    def state_dict(self) -> dict[str, float]:
        return {"coef": self.coef, "last_entropy": self.last_entropy}

    def load_state_dict(self, state: dict[str, float]) -> None:
        """A checkpoint's adaptive state, its coefficient held within this run's ``coef_min`` and ``coef_max``."""
        control = self.control
        self.coef = min(max(float(state["coef"]), control.coef_min), control.coef_max)
        self.last_entropy = float(state["last_entropy"])


class PolicyStep:
    """One training step's loss from one minibatch, as ``PolicyModule.training_step`` returns it. Built by the module
    once its model has loaded, with what every step reads: the objective, the policy and its log-prob passes
    (``TokenLogprobs``), the jointly trained heads (``risk``: the joint risk head and its coefficient; ``value``: the
    value head, ``value.coef`` and ``value.clip``), the entropy coefficient (the module's, which checkpoints it) and DPO's
    beta. Each call takes the minibatch, Lightning's ``log`` and the trainer (its accumulation count and world size)."""

    def __init__(self, objective: Objective, policy: Any, token_logprobs: TokenLogprobs, chunk_tokens: int,
                 entropy_coef: EntropyCoefficient | None, dpo_beta: float,
                 risk: tuple[RiskHead, float] | None = None,
                 value: tuple[ValueHead, float, float | None] | None = None) -> None:
        self.objective, self.policy, self.token_logprobs = objective, policy, token_logprobs
        self.chunk_tokens, self.entropy_coef, self.dpo_beta = chunk_tokens, entropy_coef, dpo_beta
        self.risk, self.value = risk, value

    def __call__(self, batch: dict[str, torch.Tensor], batch_idx: int, log: Callable[..., None],
                 trainer: Any) -> dict[str, Any] | None:
        """``{"loss": [] (with gradient), "stats": detached figures}``, or None when the step has nothing to learn."""
        if self.objective.variant == "dpo":
            return self.dpo(batch, log)
        world_size = trainer.world_size
        heads = self.risk is not None or self.value is not None
        if nothing_to_learn(batch, heads, world_size):
            return None  # no optimizer step: AdamW would move the weights by its momentum on a zero gradient
        completion_mask, max_new_tokens = batch["completion_mask"], int(batch["max_new_tokens"])
        args = (batch["input_ids"], batch["attention_mask"])
        constraint, entropy = batch_constraint(batch), self.objective.needs_entropy
        if not heads:
            out = self.token_logprobs(self.policy, *args, completion_mask, float(batch["temperature"]), constraint,
                                      entropy)
        else:
            out, hidden = logprobs_and_hidden(self.policy, *args, float(batch["temperature"]), constraint,
                                              completion_mask, self.chunk_tokens, entropy)
        logp, token_entropy = out.unbind(-1) if entropy else (out, None)  # [n, L] each
        counted = policy_mask(batch)  # [n, L]: a tree's rows left out of the loss count in none of its terms
        terms = policy_terms(self.objective, batch, logp, token_entropy, counted, max_new_tokens)
        stats = terms.stats if counted.any() else {}  # a minibatch with nothing counted gives no figures (they'd read 0)
        local_count = aggregation_terms(logp.detach(), counted, self.objective.aggregation, max_new_tokens,
                                        batch_sequences(batch))[1]
        # each loss is its minibatch mean times the minibatch's share of that loss's count over the optimizer step
        # (every rank's minibatches): a step's gradient is each loss's sum over the step divided by its own count
        loss, reported = terms.loss * share(local_count, batch["step_denominator"]), terms.loss.detach()
        if heads:
            scaled, unscaled, head_stats = head_losses(hidden, batch, body_and_head(self.policy)[1], self.risk,
                                                       self.value)
            loss, reported, stats = loss + scaled, reported + unscaled, {**stats, **head_stats}
        if batch_idx == 0 and "sampler_logp" in batch:  # no update yet this epoch: logp is the trainer's pi_old
            stats.update(sampler_agreement(logp.detach(), batch["sampler_logp"], completion_mask))
        log("train/loss", reported, prog_bar=True, on_step=True, on_epoch=True, batch_size=len(logp), sync_dist=True)
        # Lightning divides by the accumulation count and DDP averages over ranks: undo both (docs/guide.md#the-math)
        loss = loss * trainer.accumulate_grad_batches * world_size
        if self.entropy_coef is not None:  # the bonus stays a mean over the step's minibatches and ranks, as TRL's
            self.entropy_coef.observe(terms.entropy_sums)
            loss, stats["entropy_coef"] = loss - self.entropy_coef.applied() * terms.entropy, self.entropy_coef.coef
        return {"loss": loss, "stats": stats}

    def dpo(self, batch: dict[str, torch.Tensor], log: Callable[..., None]) -> dict[str, Any]:
        """Online DPO: the mean DPO loss over the minibatch's pairs (a minibatch without a pair gives 0)."""
        logp = self.token_logprobs(self.policy, batch["input_ids"], batch["attention_mask"], batch["completion_mask"],
                                   float(batch["temperature"]))
        loss, stats = online_dpo_loss(logp, batch["ref_logp"], batch["completion_mask"], batch["pair_role"],
                                      batch["pair_id"], self.dpo_beta)
        log("train/loss", loss.detach(), prog_bar=True, on_step=True, on_epoch=True, batch_size=len(logp))
        return {"loss": loss, "stats": {f"dpo_{k}": v for k, v in stats.items()}}
