"""gather_logprobs against cross-entropy, and sequence_logprobs on right-padded rows against unpadded forwards."""

import pytest
import torch
from transformers import LlamaForCausalLM

from lit_grpo.policy.logprobs import chunked_eval, gather_logprobs, sequence_logprobs
from support import build_char_tokenizer, tiny_llama_config


@pytest.fixture(scope="module")
def tiny_model():
    tokenizer = build_char_tokenizer()
    torch.manual_seed(0)
    model = LlamaForCausalLM(tiny_llama_config(len(tokenizer), hidden_size=64, num_layers=2)).eval()
    return model, len(tokenizer)


def test_gather_logprobs_equals_negative_cross_entropy():
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 5, 11, generator=generator) * 4  # [N, T, V], spread so log-probs are far from uniform
    tokens = torch.randint(0, 11, (3, 5), generator=generator)  # [N, T]
    expected = -torch.nn.functional.cross_entropy(logits.reshape(-1, 11), tokens.reshape(-1), reduction="none")
    got = gather_logprobs(logits, tokens)
    assert got.shape == (3, 5)
    assert torch.allclose(got, expected.reshape(3, 5), rtol=0, atol=1e-6)


def test_gather_logprobs_gradient_equals_autograds_log_softmax():
    generator = torch.Generator().manual_seed(1)
    logits = (torch.randn(4, 9, generator=generator) * 4).requires_grad_()  # [M, V]
    tokens = torch.randint(0, 9, (4,), generator=generator)  # [M]
    weights = torch.tensor([1.0, -2.0, 0.5, 0.0])  # [M]: a loss's weights per token, one of them zero
    (gather_logprobs(logits, tokens) * weights).sum().backward()
    ours = logits.grad.clone()
    logits.grad = None
    (torch.log_softmax(logits, -1).gather(-1, tokens[:, None]).squeeze(-1) * weights).sum().backward()
    assert torch.allclose(ours, logits.grad, rtol=0, atol=1e-6)
    # by hand: logits [0, ln 3], target 1, weight 1 -> d/dlogits = onehot - softmax = [-1/4, 1/4]
    two = torch.log(torch.tensor([[1.0, 3.0]])).requires_grad_()
    gather_logprobs(two, torch.tensor([1])).sum().backward()
    assert torch.allclose(two.grad, torch.tensor([[-0.25, 0.25]]), rtol=0, atol=1e-7)


def test_gather_logprobs_hand_example():
    # logits [0, ln 3] -> probs [1/4, 3/4]: token 1 has log(3/4) = -0.2876821, token 0 log(1/4) = -1.3862944
    logits = torch.log(torch.tensor([[[1.0, 3.0], [1.0, 3.0]]]))
    got = gather_logprobs(logits, torch.tensor([[1, 0]]))
    assert torch.allclose(got, torch.tensor([[-0.2876821, -1.3862944]]), rtol=0, atol=1e-6)


ROWS = [[1, 20, 21, 22, 23, 24, 25, 2], [1, 30, 31, 2], [1, 40, 41, 42, 43]]  # lengths 8, 4, 5


def right_padded(rows, pad_id=0):
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = torch.tensor(row)
        mask[i, : len(row)] = 1
    return ids, mask


def manual_logprobs(model, row, temperature):
    """One unpadded row, by hand: log_softmax(logits / T) at the next token; entry 0 is 0."""
    ids = torch.tensor([row])
    logits = model(input_ids=ids).logits[0]  # [L, V]
    logp = torch.log_softmax(logits[:-1] / temperature, dim=-1)  # [L-1, V]
    picked = logp.gather(-1, ids[0, 1:, None]).squeeze(-1)  # [L-1]
    return torch.cat([torch.zeros(1), picked])  # [L]


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sequence_logprobs_padded_rows_equal_unpadded_forwards(tiny_model, temperature):
    model, _ = tiny_model
    ids, mask = right_padded(ROWS)
    with torch.no_grad():
        got = sequence_logprobs(model, ids, mask, temperature)  # [3, 8]
        assert got.shape == (3, 8)
        for i, row in enumerate(ROWS):
            expected = manual_logprobs(model, row, temperature)
            assert torch.allclose(got[i, : len(row)], expected, rtol=0, atol=1e-5), i
            assert torch.all(got[i, len(row) :] == 0)  # padded positions exactly 0
    assert torch.all(got[:, 0] == 0)  # no context for the first token
    assert torch.all(got[:, 1:][mask[:, 1:].bool()] < 0)  # every real token got a real log-prob


def test_temperature_divides_the_logits(tiny_model):
    # T = 0.5 differs from T = 1 (so the temperature is used), and equals log_softmax(2 * logits) by hand
    model, _ = tiny_model
    ids, mask = right_padded(ROWS[:1])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, :-1]  # [7, V]
        expected = torch.log_softmax(logits / 0.5, dim=-1).gather(-1, ids[0, 1:, None]).squeeze(-1)
        cold = sequence_logprobs(model, ids, mask, 0.5)[0, 1:]
        plain = sequence_logprobs(model, ids, mask, 1.0)[0, 1:]
    assert torch.allclose(cold, expected, rtol=0, atol=1e-5)
    assert (cold - plain).abs().max() > 1e-2


def test_sequence_logprobs_bool_mask_and_gradient(tiny_model):
    model, _ = tiny_model
    ids, mask = right_padded(ROWS)
    with torch.no_grad():
        reference = sequence_logprobs(model, ids, mask, 1.0)
    got = sequence_logprobs(model, ids, mask.bool(), 1.0)
    assert torch.allclose(got, reference, rtol=0, atol=1e-6)
    got.sum().backward()  # differentiable: the training step calls it with gradients on
    assert model.model.embed_tokens.weight.grad is not None
    model.zero_grad(set_to_none=True)


def test_chunked_eval_slices_in_order_in_eval_mode_and_restores_the_flag_on_failure():
    model = torch.nn.Dropout(0.5)  # its training flag is the state chunked_eval must manage
    model.train()
    seen = []

    def forward(rows: slice) -> torch.Tensor:
        seen.append((rows.start, rows.stop, model.training, torch.is_grad_enabled()))
        return torch.arange(7.0)[rows] * 10  # [rows]

    out = chunked_eval(model, 7, 3, forward)
    assert out.tolist() == [0.0, 10.0, 20.0, 30.0, 40.0, 50.0, 60.0]
    assert seen == [(0, 3, False, False), (3, 6, False, False), (6, 9, False, False)]
    assert model.training

    def failing(rows: slice) -> torch.Tensor:
        raise RuntimeError("chunk failed")

    with pytest.raises(RuntimeError, match="chunk failed"):
        chunked_eval(model, 7, 3, failing)
    assert model.training  # restored although the forward raised
