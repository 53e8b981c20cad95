"""A value head on the policy's hidden states (PPO's critic, sharing the LoRA backbone), and its loss."""

from __future__ import annotations

import torch
from torch import nn

from lit_grpo.losses import masked_mean
from lit_grpo.policy.logprobs import chunked_eval, rows_per_pass, token_hidden_states


class ValueHead(nn.Module):
    """V(state) from the last hidden state; zero-initialised so PPO starts from a neutral critic."""

    def __init__(self, hidden_size: int) -> None:
        super().__init__()
        self.linear = nn.Linear(hidden_size, 1)
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.linear(hidden.float()).squeeze(-1)  # [N, L]


def old_values(policy: nn.Module, head: ValueHead, input_ids: torch.Tensor, attention_mask: torch.Tensor,
               batch_tokens: int) -> torch.Tensor:
    """``[N, L]`` value estimates at theta_old, in eval mode, in chunks of at most ``batch_tokens`` tokens (no
    output head: the values need none)."""

    def forward(rows: slice) -> torch.Tensor:
        hidden = token_hidden_states(policy, input_ids[rows], attention_mask[rows])  # [n, L, H]
        return aligned_values(head, hidden, attention_mask[rows])

    return chunked_eval(policy, input_ids.shape[0], rows_per_pass(batch_tokens, input_ids.shape[1]), forward)


def aligned_values(head: ValueHead, hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """The head on token-aligned ``hidden [N, L, H]``: ``[N, L]``, 0 in column 0 (no state) and on padding."""
    values = head(hidden)  # [N, L]
    values = torch.cat([values.new_zeros(values.shape[0], 1), values[:, 1:]], dim=1)
    return values * attention_mask.to(values.dtype)


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    completion_mask: torch.Tensor,
    clip: float | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Mean over counted tokens of (V - G)^2, or with ``clip`` PPO's pessimistic clipped form
    max((V - G)^2, (old_V + clip(V - old_V, -clip, clip) - G)^2). All inputs ``[N, T]``.

    Returns ``(loss [], stats)``: ``value_mean`` and ``explained_variance`` 1 - Var(G - V) / Var(G), detached.

    Example: V [1, 2], old V [0, 0], G [0, 3], clip 0.5: unclipped errors 1, 1; clipped V [0.5, 0.5] errors
    0.25, 6.25; max -> 1, 6.25; loss 3.625.
    """
    squared = (values - returns).square()  # [N, T]
    if clip is not None:
        clipped = old_values + (values - old_values).clamp(-clip, clip)
        squared = torch.maximum(squared, (clipped - returns).square())
    loss = masked_mean(squared, completion_mask)
    counted = completion_mask.bool()
    residual, target = (returns - values).detach()[counted], returns.detach()[counted]
    variance = target.var(correction=0) if target.numel() > 1 else target.new_tensor(0.0)
    explained = 1 - residual.var(correction=0) / variance if variance > 0 else variance.new_tensor(0.0)
    return loss, {"value_mean": masked_mean(values.detach(), completion_mask), "explained_variance": explained}
