"""The value head's alignment and the value loss, by hand."""

import pytest
import torch

from lit_grpo.policy.logprobs import logprobs_and_hidden, sequence_logprobs
from lit_grpo.policy.model_loading import load_policy
from lit_grpo.policy.value_head import ValueHead, aligned_values, value_loss


def test_value_loss_by_hand():
    values = torch.tensor([[1.0, 2.0, 9.0]], requires_grad=True)
    old, returns = torch.tensor([[0.0, 0.0, 9.0]]), torch.tensor([[0.0, 3.0, 0.0]])
    mask = torch.tensor([[True, True, False]])
    loss, stats = value_loss(values, old, returns, mask)
    assert loss.item() == pytest.approx(1.0, abs=1e-7)  # errors 1 and 1
    clipped, _ = value_loss(values, old, returns, mask, clip=0.5)
    assert clipped.item() == pytest.approx(3.625, abs=1e-6)  # max(1, 0.25) and max(1, 6.25)
    assert stats["value_mean"].item() == pytest.approx(1.5, abs=1e-7)
    # G = [0, 3] (var 2.25), G - V = [-1, 1] (var 1): explained variance 1 - 1 / 2.25
    assert stats["explained_variance"].item() == pytest.approx(1 - 1 / 2.25, abs=1e-6)


def test_values_align_with_logprobs(tiny_llama_dir):
    policy = load_policy(str(tiny_llama_dir), 4, 8, 0.0, "all-linear")
    head = ValueHead(policy.config.hidden_size)
    torch.manual_seed(0)
    torch.nn.init.normal_(head.linear.weight)
    ids = torch.tensor([[1, 21, 22, 33, 0], [1, 23, 24, 25, 33]])
    mask = ids != 0
    mask[:, 0] = True
    logp, aligned_hidden = logprobs_and_hidden(policy, ids, mask, 0.7)  # the training step's one forward
    values = aligned_values(head, aligned_hidden, mask)
    torch.testing.assert_close(logp, sequence_logprobs(policy, ids, mask, 0.7), rtol=0, atol=1e-6)
    hidden = policy(input_ids=ids, attention_mask=mask.long(), output_hidden_states=True).hidden_states[-1]
    # value of token 2 of row 1 comes from the hidden state at position 1; padding and column 0 are 0
    assert values[1, 2].item() == pytest.approx(head(hidden)[1, 1].item(), abs=1e-5)
    assert values[0, 4].item() == 0.0 and values[:, 0].abs().sum().item() == 0.0


def test_the_value_loss_is_scaled_by_its_own_step_count_not_the_policy_losss():
    # issue 18, bug 4: the value loss took the policy aggregation's share of the step (rows, for seq-mean); it takes
    # its own: the minibatch's counted tokens over the step's
    from lit_grpo.policy.head_losses import head_losses

    head = ValueHead(2)
    with torch.no_grad():
        head.linear.weight.copy_(torch.tensor([[1.0, 0.0]]))
    value = (head, 0.5, None)  # vf_coef 0.5, no value clipping
    hidden = torch.tensor([[[9.0, 9.0], [1.0, 0.0], [3.0, 0.0]]])  # aligned values: 0 (column 0), 1, 3
    batch = {"completion_mask": torch.tensor([[False, True, True]]), "attention_mask": torch.ones(1, 3),
             "old_values": torch.zeros(1, 3), "returns": torch.tensor([[0.0, 0.0, 1.0]]),
             "step_value_tokens": torch.tensor(8.0), "step_denominator": torch.tensor(2.0)}
    scaled, unscaled, stats = head_losses(hidden, batch, None, None, value)
    # squared errors (1 - 0)^2 = 1 and (3 - 1)^2 = 4: minibatch mean 2.5, weighted 0.5 x 2.5 = 1.25; the step's
    # 8 counted tokens: 0.5 x (1 + 4) / 8 = 0.3125 (by the policy's share, 1 row of the step's 2, it was 0.625)
    assert unscaled.item() == 1.25 and scaled.item() == 0.3125
    assert stats["value_loss"].item() == 2.5
    batch["step_value_tokens"] = torch.tensor(2.0)  # the minibatch is its step's only one: its mean, unscaled
    assert head_losses(hidden, batch, None, None, value)[0].item() == 1.25
