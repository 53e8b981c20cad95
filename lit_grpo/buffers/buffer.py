"""The epoch's rollouts as tensors, and how they are served as minibatches (docs/guide.md#layout)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from lit_grpo.buffers.completion import Completion
from lit_grpo.buffers.positions import FirstTokenConstraint
from lit_grpo.losses import Sequences, aggregation_terms
from lit_grpo.run.rules import RolloutKind
from lit_grpo.tasks.base import ScoredCompletion


@dataclass
class RolloutBuffer:
    """Rows of context + completion, right-padded; a group's rows are contiguous. A group is a prompt's
    ``group_size`` completions, or one tree's policy nodes (``group_sizes`` then lists the rows of each tree).

    ``completion_mask`` is True on policy-generated tokens (the stop token included), False on the prompt and the
    padding. Log-prob tensors are aligned with ``input_ids``: entry t is the log-prob of token t given the tokens
    before it, 0 where the mask is False.
    """

    input_ids: torch.Tensor  # [N, L]
    attention_mask: torch.Tensor  # [N, L] bool
    completion_mask: torch.Tensor  # [N, L] bool
    rewards: torch.Tensor  # [N] task rewards as scored
    correct: torch.Tensor  # [N] bool
    truncated: torch.Tensor  # [N] bool: hit max_new_tokens without a stop token
    group_size: int
    temperature: float
    max_new_tokens: int
    sampler_logp: torch.Tensor | None = None  # [N, L] from the engine, if it reports log-probs
    old_logp: torch.Tensor | None = None  # [N, L] pi_old, filled by the no-grad passes
    ref_logp: torch.Tensor | None = None  # [N, L] pi_ref, filled when kl.coef > 0
    advantages: torch.Tensor | None = None  # [N] (or [N, L]), filled last
    values: torch.Tensor | None = None  # [N, L] value estimates at theta_old (PPO)
    returns: torch.Tensor | None = None  # [N, L] GAE returns, the value head's targets (PPO)
    pair_role: torch.Tensor | None = None  # [N] +1 chosen, -1 rejected, 0 neither (online DPO)
    pair_id: torch.Tensor | None = None  # [N] the pair's group index, -1 outside a pair (online DPO)
    reward_errors: int = 0
    reward_failed: torch.Tensor | None = None  # [N] bool: the completion's scoring failed (it scored failure_reward)
    sampling_draws: int = 1  # draws made to fill it (DAPO's dynamic sampling draws again for flat groups)
    reward_parts: dict[str, torch.Tensor] = field(default_factory=dict)  # name -> [N], NaN where it did not apply
    reward_weights: dict[str, float] = field(default_factory=dict)  # name -> the task's weight of that reward
    sampler_ratio: torch.Tensor | None = None  # [N, L] pi_old / pi_sampler, corrected (model.sampler_correction)
    prompt_texts: list[str] = field(default_factory=list)  # [N]
    completion_texts: list[str] = field(default_factory=list)  # [N]
    group_sizes: list[int] | None = None  # rows per group when they differ (trees); None: group_size each
    trees: list[Any] | None = None  # the rollout trees, in group order, for tree rollouts
    tree_mode: RolloutKind | None = None  # "tree" (tree-relative advantages) or "chains" (group advantages of returns)
    decision_index: torch.Tensor | None = None  # [N] column of each row's first completion token (trees)
    first_token_allowed: torch.Tensor | None = None  # [N, C] the sampler's first-token restriction, -1 padding
    inferred: torch.Tensor | None = None  # [N] bool: the row's reward is an observed return of inferring (trees)
    risk_probes: Any = None  # the detached risk head's labelled probe states (lit_grpo.risk.probes.ProbeLabels)
    loss_rows: torch.Tensor | None = None  # [N] bool: rows that count in the loss (None: all; trees' flat groups out)
    tree_rounds: int | None = None  # the rounds a tree or chain rollout runs at most (len of data.branching)
    # a tool task's chains, where TRL's sequence is the whole episode (losses.Sequences); None: a row is a sequence
    sequence_tokens: torch.Tensor | None = None  # [N] float: the row's episode's counted tokens over all its rows
    sequence_rows: torch.Tensor | None = None  # [N] float: the number of rows of the row's episode
    sequence_ids: torch.Tensor | None = None  # [N] long: the row's episode's number, unique within the buffer
    sequence_budget: int | None = None  # tokens an episode may hold (TRL's max_completion_length); None: a row's

    @property
    def constant_tokens(self) -> int:
        """What ``constant`` aggregation divides each sequence by: the tokens a sequence may hold (an episode's
        budget where a sequence spans several rows, as TRL's dr_grpo divides by max_completion_length)."""
        return self.max_new_tokens if self.sequence_budget is None else self.sequence_budget

    def first_token_constraint(self) -> FirstTokenConstraint | None:
        """The sampler's first-token restrictions, when any row had one."""
        if self.first_token_allowed is None or not (self.first_token_allowed >= 0).any():
            return None
        return FirstTokenConstraint(self.decision_index, self.first_token_allowed)

    @property
    def sizes(self) -> list[int]:
        """Rows per group, groups in order."""
        if self.group_sizes is not None:
            return self.group_sizes
        return [self.group_size] * (self.input_ids.shape[0] // self.group_size)

    @property
    def num_groups(self) -> int:
        return len(self.sizes)

    @property
    def completion_lengths(self) -> torch.Tensor:
        """``[N]`` tokens sampled per row: a truncated row hit ``max_new_tokens`` (counted so even when
        ``mask_truncated`` took its tokens out of the loss), any other row its counted tokens."""
        counted = self.completion_mask.sum(dim=1)  # [N]
        return torch.where(self.truncated, torch.full_like(counted, self.max_new_tokens), counted)


def build_buffer(
    prompt_ids: Sequence[Sequence[int]],
    completions: Sequence[Sequence[Completion]],
    pad_id: int,
    temperature: float,
    max_new_tokens: int,
) -> RolloutBuffer:
    """Lay out ``G`` completions per prompt as rows of ``prompt + completion`` (rewards are set by the caller)."""
    group_size = len(completions[0])
    rows = [(list(p), c) for p, group in zip(prompt_ids, completions) for c in group]
    width = max(len(p) + len(c.token_ids) for p, c in rows)
    num_rows = len(rows)
    input_ids = torch.full((num_rows, width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((num_rows, width), dtype=torch.bool)
    completion_mask = torch.zeros((num_rows, width), dtype=torch.bool)
    has_logprobs = all(c.logprobs is not None for _, c in rows)
    sampler_logp = torch.zeros((num_rows, width)) if has_logprobs else None
    for row, (prompt, completion) in enumerate(rows):
        start, end = len(prompt), len(prompt) + len(completion.token_ids)
        input_ids[row, :end] = torch.tensor(prompt + list(completion.token_ids))
        attention_mask[row, :end] = True
        completion_mask[row, start:end] = True
        if sampler_logp is not None:
            sampler_logp[row, start:end] = torch.tensor(completion.logprobs)
    return RolloutBuffer(
        input_ids=input_ids,
        attention_mask=attention_mask,
        completion_mask=completion_mask,
        rewards=torch.zeros(num_rows),
        correct=torch.zeros(num_rows, dtype=torch.bool),
        truncated=torch.tensor([c.finish_reason == "length" for _, c in rows]),
        group_size=group_size,
        temperature=temperature,
        max_new_tokens=max_new_tokens,
        sampler_logp=sampler_logp,
    )


def serve_minibatches(
    buffer: RolloutBuffer,
    minibatch_size: int,
    ppo_epochs: int,
    accumulate: int,
    aggregation: str,
    generator: torch.Generator,
) -> list[dict[str, torch.Tensor]]:
    """The buffer ``ppo_epochs`` times over, whole groups shuffled into minibatches of ``minibatch_size`` rows
    (``minibatch_plan``), each with its step counts (``serve_plan``)."""
    return serve_plan(buffer, minibatch_plan(buffer, minibatch_size, ppo_epochs, generator), accumulate, aggregation)


def minibatch_plan(buffer: RolloutBuffer, minibatch_size: int, ppo_epochs: int,
                   generator: torch.Generator) -> list[torch.Tensor]:
    """The rows of each minibatch: the buffer ``ppo_epochs`` times over, whole groups in an order drawn from
    ``generator``, gathered until a minibatch holds at least ``minibatch_size`` rows."""
    sizes = buffer.sizes
    offsets = [0]
    for size in sizes:
        offsets.append(offsets[-1] + size)
    group_rows = [torch.arange(offsets[g], offsets[g + 1]) for g in range(len(sizes))]
    plan: list[torch.Tensor] = []
    for _ in range(ppo_epochs):
        order = torch.randperm(len(sizes), generator=generator).tolist()
        pending: list[torch.Tensor] = []
        for group in order:  # whole groups, until the minibatch holds at least minibatch_size rows
            pending.append(group_rows[group])
            if sum(len(rows) for rows in pending) >= minibatch_size:
                plan.append(torch.cat(pending))
                pending = []
        if pending:
            plan.append(torch.cat(pending))
    return plan


def serve_plan(buffer: RolloutBuffer, plan: list[torch.Tensor], accumulate: int,
               aggregation: str, padding: int = 0) -> list[dict[str, torch.Tensor]]:
    """The minibatches of ``plan`` cut from the (prepared) buffer, then ``padding`` empty ones (``empty_minibatch``).

    Each minibatch carries each loss's count summed over the ``accumulate`` minibatches that make up its optimizer
    step, so the loss of a step does not depend on how it is split: ``step_denominator`` (the policy loss's
    aggregation, over the rows in the loss: ``policy_mask``), ``step_value_tokens`` (counted tokens: the value
    loss's) and ``step_risk_rows`` (rows that inferred: the risk head's). An empty minibatch counts zero in each.
    """
    batches = [minibatch(buffer, rows) for rows in plan]
    counts = [minibatch_counts(b, aggregation, buffer.constant_tokens) for b in batches]
    if padding and not batches:
        raise RuntimeError("a rank with no rollouts cannot serve empty minibatches of their shape")
    batches += [empty_minibatch(batches[-1]) for _ in range(padding)]
    counts += [{key: torch.zeros_like(value) for key, value in counts[-1].items()} for _ in range(padding)]
    for index, batch in enumerate(batches):
        # Lightning accumulates consecutive batches and steps on the epoch's last batch even if the group is short
        step_start = index // accumulate * accumulate
        batch.update({key: torch.stack([c[key] for c in counts[step_start : step_start + accumulate]]).sum()
                      for key in counts[index]})
    return batches


def policy_mask(batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """The tokens the policy loss (and its KL term) counts ``[n, L]``: ``completion_mask``, less the rows a tree
    leaves out of the loss (``loss_rows``: its flat sibling groups under ``model.tree.flat_groups: drop``). Those
    rows stay in the minibatch for everything else (the risk head's rows, the sampler check)."""
    mask = batch["completion_mask"]
    return mask if "loss_rows" not in batch else mask & batch["loss_rows"][:, None]


def empty_minibatch(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``batch`` with nothing in it counting: no token in the loss (``completion_mask`` all False), no row inferring
    (the risk head's rows). Under DDP a rank whose tree rollouts make fewer minibatches serves these, so that every
    rank steps as often as the others (``run.distributed.minibatch_padding``): its loss and gradient are exactly
    zero, and with the step counts summed over ranks the step is the other ranks' rows alone."""
    empty = dict(batch)
    empty["completion_mask"] = torch.zeros_like(batch["completion_mask"])
    if "inferred" in batch:
        empty["inferred"] = torch.zeros_like(batch["inferred"])
    return empty


def batch_sequences(batch: dict[str, torch.Tensor]) -> Sequences | None:
    """The minibatch's rows' episodes where a sequence spans several rows (a tool task's chain), else None."""
    if "sequence_tokens" not in batch:
        return None
    return Sequences(batch["sequence_tokens"], batch["sequence_rows"], batch["sequence_ids"])


def buffer_sequences(buffer: RolloutBuffer) -> Sequences | None:
    """The buffer's rows' episodes where a sequence spans several rows (a tool task's chain), else None."""
    if buffer.sequence_tokens is None:
        return None
    return Sequences(buffer.sequence_tokens, buffer.sequence_rows, buffer.sequence_ids)


def minibatch_counts(batch: dict[str, torch.Tensor], aggregation: str, max_new_tokens: int) -> dict[str, torch.Tensor]:
    """One minibatch's count for each loss: the policy aggregation's over the rows in the loss (a row left out counts
    as no sequence; a row of a multi-row episode as its share of one: ``batch_sequences``), its counted tokens and
    its inferring rows."""
    mask = batch["completion_mask"]
    sequences = batch_sequences(batch)
    if "loss_rows" in batch:
        kept_rows = batch["loss_rows"]
        mask_kept = mask[kept_rows]  # [kept rows, L]
        sequences = None if sequences is None else Sequences(*(field[kept_rows] for field in sequences))
    else:
        mask_kept = mask
    inferred = batch.get("inferred")
    return {
        "step_denominator": aggregation_terms(mask_kept.float(), mask_kept, aggregation, max_new_tokens, sequences)[1],
        "step_value_tokens": mask.float().sum(),
        "step_risk_rows": mask.new_tensor(0.0, dtype=torch.float32) if inferred is None else inferred.float().sum(),
    }


def minibatch(buffer: RolloutBuffer, rows: torch.Tensor) -> dict[str, torch.Tensor]:
    """The given rows, cut to the longest of them."""
    width = int(buffer.attention_mask[rows].sum(dim=1).max())
    out = {
        "input_ids": buffer.input_ids[rows, :width],
        "attention_mask": buffer.attention_mask[rows, :width],
        "completion_mask": buffer.completion_mask[rows, :width],
        "advantages": buffer.advantages[rows] if buffer.advantages.dim() == 1 else buffer.advantages[rows, :width],
        "old_logp": buffer.old_logp[rows, :width],
        "temperature": torch.tensor(buffer.temperature),
        "max_new_tokens": torch.tensor(buffer.constant_tokens),  # the loss's constant aggregation divides by it
    }
    if buffer.ref_logp is not None:
        out["ref_logp"] = buffer.ref_logp[rows, :width]
    if buffer.sampler_logp is not None:
        out["sampler_logp"] = buffer.sampler_logp[rows, :width]
    if buffer.sampler_ratio is not None:
        out["sampler_ratio"] = buffer.sampler_ratio[rows, :width]
    if buffer.pair_role is not None:
        out["pair_role"], out["pair_id"] = buffer.pair_role[rows], buffer.pair_id[rows]
    if buffer.values is not None:
        out["old_values"] = buffer.values[rows, :width]
        out["returns"] = buffer.returns[rows, :width]
    if buffer.loss_rows is not None:  # a tree's flat sibling groups, out of the policy loss (policy_mask)
        out["loss_rows"] = buffer.loss_rows[rows]
    if buffer.sequence_tokens is not None:  # a tool task's chains: each row's episode (batch_sequences)
        out["sequence_tokens"], out["sequence_rows"] = buffer.sequence_tokens[rows], buffer.sequence_rows[rows]
        out["sequence_ids"] = buffer.sequence_ids[rows]
    if buffer.decision_index is not None:  # trees: the risk head's inputs and targets, the sampler's restriction
        out["decision_index"], out["first_token_allowed"] = buffer.decision_index[rows], buffer.first_token_allowed[rows]
        out["inferred"], out["rewards"] = buffer.inferred[rows], buffer.rewards[rows]
    return out


def informative_groups(buffer: RolloutBuffer) -> list[int]:
    """Indices of the groups whose rewards are not all equal (a flat group has zero advantage everywhere)."""
    return [g for g, rewards in enumerate(buffer.rewards.split(buffer.sizes)) if rewards.amax() > rewards.amin()]


def reward_parts(scored: Sequence[ScoredCompletion]) -> dict[str, torch.Tensor]:
    """Each named reward's value per completion ``[N]`` (NaN where it did not apply or the scoring failed)."""
    names = list(dict.fromkeys(name for s in scored if s.parts for name in s.parts))
    nan = float("nan")
    return {name: torch.tensor([nan if not s.parts or s.parts.get(name) is None else s.parts[name] for s in scored])
            for name in names}


def select_groups(buffer: RolloutBuffer, groups: list[int]) -> RolloutBuffer:
    """A scored buffer of ``group_size`` groups cut down to the given groups (before any no-grad pass)."""
    size = buffer.group_size
    rows = [g * size + i for g in groups for i in range(size)]
    index = torch.tensor(rows, dtype=torch.long)
    return RolloutBuffer(
        input_ids=buffer.input_ids[index],
        attention_mask=buffer.attention_mask[index],
        completion_mask=buffer.completion_mask[index],
        rewards=buffer.rewards[index],
        correct=buffer.correct[index],
        truncated=buffer.truncated[index],
        group_size=size,
        temperature=buffer.temperature,
        max_new_tokens=buffer.max_new_tokens,
        sampler_logp=None if buffer.sampler_logp is None else buffer.sampler_logp[index],
        reward_errors=buffer.reward_errors,
        reward_failed=None if buffer.reward_failed is None else buffer.reward_failed[index],
        sequence_tokens=None if buffer.sequence_tokens is None else buffer.sequence_tokens[index],
        sequence_rows=None if buffer.sequence_rows is None else buffer.sequence_rows[index],
        sequence_ids=None if buffer.sequence_ids is None else buffer.sequence_ids[index],
        sequence_budget=buffer.sequence_budget,
        reward_parts={name: values[index] for name, values in buffer.reward_parts.items()},
        reward_weights=buffer.reward_weights,
        prompt_texts=[buffer.prompt_texts[r] for r in rows],
        completion_texts=[buffer.completion_texts[r] for r in rows],
    )


def concat_buffers(buffers: list[RolloutBuffer]) -> RolloutBuffer:
    """Scored buffers of the same group size one after the other, right-padded to the widest (pad id 0 is never
    attended: the attention mask is False there)."""
    width = max(b.input_ids.shape[1] for b in buffers)

    def cat(name: str) -> torch.Tensor:
        return torch.cat([torch.nn.functional.pad(getattr(b, name), (0, width - b.input_ids.shape[1])) for b in buffers])

    first = buffers[0]
    has_logp = all(b.sampler_logp is not None for b in buffers)
    row_offsets = torch.tensor([0] + [len(b.rewards) for b in buffers[:-1]]).cumsum(0).tolist()
    return RolloutBuffer(
        input_ids=cat("input_ids"),
        attention_mask=cat("attention_mask"),
        completion_mask=cat("completion_mask"),
        rewards=torch.cat([b.rewards for b in buffers]),
        correct=torch.cat([b.correct for b in buffers]),
        truncated=torch.cat([b.truncated for b in buffers]),
        group_size=first.group_size,
        temperature=first.temperature,
        max_new_tokens=first.max_new_tokens,
        sampler_logp=cat("sampler_logp") if has_logp else None,
        reward_errors=sum(b.reward_errors for b in buffers),
        reward_failed=(torch.cat([b.reward_failed for b in buffers])
                       if all(b.reward_failed is not None for b in buffers) else None),
        sequence_tokens=(torch.cat([b.sequence_tokens for b in buffers])
                         if all(b.sequence_tokens is not None for b in buffers) else None),
        sequence_rows=(torch.cat([b.sequence_rows for b in buffers])
                       if all(b.sequence_rows is not None for b in buffers) else None),
        sequence_ids=(torch.cat([b.sequence_ids + offset for b, offset in zip(buffers, row_offsets)])
                      if all(b.sequence_ids is not None for b in buffers) else None),  # kept apart: ids < rows
        sequence_budget=first.sequence_budget,
        reward_parts={name: torch.cat([b.reward_parts[name] for b in buffers]) for name in first.reward_parts
                      if all(name in b.reward_parts for b in buffers)},
        reward_weights=first.reward_weights,
        prompt_texts=[t for b in buffers for t in b.prompt_texts],
        completion_texts=[t for b in buffers for t in b.completion_texts],
    )
