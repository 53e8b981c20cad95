"""Truncated importance sampling, by hand, and how the module folds it into per-token advantages."""

import pytest
import torch

from lit_grpo.buffers.buffer import RolloutBuffer
from lit_grpo.losses import truncated_importance_weights
from lit_grpo.policy.module import PolicyModule


def test_weights_by_hand():
    # ratios pi_old / pi_sampler: 0.5/0.25 = 2 -> capped at 1.5; 0.2/0.4 = 0.5; masked token -> 0
    old = torch.log(torch.tensor([[0.5, 0.2, 0.3]]))
    sampler = torch.log(torch.tensor([[0.25, 0.4, 0.1]]))
    mask = torch.tensor([[True, True, False]])
    weights = truncated_importance_weights(old, sampler, mask, cap=1.5)
    torch.testing.assert_close(weights, torch.tensor([[1.5, 0.5, 0.0]]), rtol=0, atol=1e-6)
    with pytest.raises(ValueError, match="positive"):
        truncated_importance_weights(old, sampler, mask, cap=0.0)


def test_module_weights_each_token_advantage(tiny_llama_dir):
    module = PolicyModule(model_name_or_path=str(tiny_llama_dir), kl_coef=0.0, tis_cap=2.0)
    mask = torch.tensor([[False, True, True], [False, True, False]])
    buffer = RolloutBuffer(
        input_ids=torch.zeros(2, 3, dtype=torch.long), attention_mask=torch.ones(2, 3, dtype=torch.bool),
        completion_mask=mask, rewards=torch.tensor([1.0, 0.0]), correct=torch.zeros(2, dtype=torch.bool),
        truncated=torch.zeros(2, dtype=torch.bool), group_size=2, temperature=1.0, max_new_tokens=2,
        sampler_logp=torch.log(torch.tensor([[1.0, 0.1, 0.5], [1.0, 0.5, 1.0]])),
        old_logp=torch.log(torch.tensor([[1.0, 0.3, 0.5], [1.0, 0.25, 1.0]])),
    )
    module.assign_advantages(buffer)
    # grpo on [1, 0]: mean 0.5, std 0.5 -> +-0.5 / (0.5 + 1e-6); weights: row 0 min(3, 2) = 2 and 1; row 1 0.5
    a = 0.5 / (0.5 + 1e-6)
    expected = torch.tensor([[0.0, 2 * a, a], [0.0, -0.5 * a, 0.0]])
    torch.testing.assert_close(buffer.advantages, expected, rtol=0, atol=1e-6)


def test_tis_rejects_gspo(tiny_llama_dir):
    with pytest.raises(ValueError, match="tis_cap"):
        PolicyModule(model_name_or_path=str(tiny_llama_dir), loss_variant="gspo", tis_cap=2.0)
