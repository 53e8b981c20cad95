"""The value head's alignment and the value loss, by hand."""

import pytest
import torch

from lit_grpo.logprobs import sequence_logprobs
from lit_grpo.model_loading import load_policy
from lit_grpo.value_head import ValueHead, logprobs_and_values, value_loss


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
    logp, values = logprobs_and_values(policy, head, ids, mask, 0.7)
    torch.testing.assert_close(logp, sequence_logprobs(policy, ids, mask, 0.7), rtol=0, atol=1e-6)
    hidden = policy(input_ids=ids, attention_mask=mask.long(), output_hidden_states=True).hidden_states[-1]
    # value of token 2 of row 1 comes from the hidden state at position 1; padding and column 0 are 0
    assert values[1, 2].item() == pytest.approx(head(hidden)[1, 1].item(), abs=1e-5)
    assert values[0, 4].item() == 0.0 and values[:, 0].abs().sum().item() == 0.0
