"""The value and risk heads' losses in a training step, each weighted by its coefficient and scaled by the
minibatch's share of that loss's own count over the optimizer step (docs/guide.md#the-math): the step's gradient is
each loss's sum over the step divided by its own count, whatever the split into minibatches and ranks."""

from __future__ import annotations

from typing import Any

import torch

from lit_grpo.policy.risk_features import risk_head_loss
from lit_grpo.policy.value_head import ValueHead, aligned_values, value_loss
from lit_grpo.risk.head import RiskHead


def share(local: torch.Tensor, total: torch.Tensor) -> torch.Tensor:
    """``local / total`` as a float, 0 when the step counts nothing (then no minibatch of it has a term either)."""
    return local.float() / total if total > 0 else local.new_tensor(0.0, dtype=torch.float32)


def nothing_to_learn(batch: dict[str, torch.Tensor], heads: bool, world_size: int) -> bool:
    """Whether the optimizer step this minibatch belongs to counts no token of the policy loss on any rank
    (``step_denominator`` 0: every row left out, e.g. a tree's flat groups under ``model.tree.flat_groups: drop``)
    and no head trains: Lightning then skips the step (``training_step`` returns None), on one process only (it
    refuses a skipped step under DDP, where such a step keeps loss 0 and Adam's momentum moves the weights)."""
    return world_size == 1 and not heads and float(batch["step_denominator"]) == 0.0


def head_losses(
    hidden: torch.Tensor,
    batch: dict[str, torch.Tensor],
    output_head: Any,
    risk: tuple[RiskHead, float] | None,
    value: tuple[ValueHead, float, float | None] | None,
) -> tuple[torch.Tensor, torch.Tensor, dict[str, Any]]:
    """``(scaled, unscaled, stats)`` of the jointly trained risk head ``(head, coef)`` on the inferring rows and of
    the value head ``(head, value.coef, value.clip)`` on the counted tokens; ``hidden [N, L, H]`` aligned with the
    tokens."""
    scaled, unscaled, stats = hidden.new_tensor(0.0), hidden.new_tensor(0.0), {}
    if risk is not None:
        head, coef = risk
        loss, risk_stats = risk_head_loss(head, hidden, batch, output_head)
        weighted = coef * loss
        scaled = scaled + weighted * share(batch["inferred"].sum(), batch["step_risk_rows"])
        unscaled, stats = unscaled + weighted.detach(), {**stats, **risk_stats}
    if value is not None:
        head, coef, clip = value
        mask = batch["completion_mask"]  # [N, L]
        values = aligned_values(head, hidden, batch["attention_mask"])  # [N, L]
        vf_loss, vf_stats = value_loss(values, batch["old_values"], batch["returns"], mask, clip)
        weighted = coef * vf_loss
        scaled = scaled + weighted * share(mask.sum(), batch["step_value_tokens"])
        unscaled, stats = unscaled + weighted.detach(), {**stats, **vf_stats, "value_loss": vf_loss.detach()}
    return scaled, unscaled, stats
