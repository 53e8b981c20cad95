"""KL estimators and masked aggregation (design §5), by hand."""

import math

import pytest
import torch

from lit_grpo.losses import aggregation_terms, kl_divergence, masked_aggregate

# token 0: pi = 0.5, ref = 0.25 -> delta = ref_logp - logp = -ln 2; token 1: pi = 0.2, ref = 0.4 -> delta = +ln 2
LOGP = torch.log(torch.tensor([[0.5, 0.2]]))
REF_LOGP = torch.log(torch.tensor([[0.25, 0.4]]))
LN2 = math.log(2)


@pytest.mark.parametrize(
    "estimator, expected",
    [
        ("k1", [LN2, -LN2]),  # -delta
        ("k2", [LN2**2 / 2, LN2**2 / 2]),  # 0.2402265 both
        ("k3", [0.5 + LN2 - 1, 2 - LN2 - 1]),  # exp(delta) - delta - 1: 0.1931472, 0.3068528
    ],
)
def test_kl_estimators(estimator, expected):
    assert torch.allclose(kl_divergence(LOGP, REF_LOGP, estimator), torch.tensor([expected]), rtol=0, atol=1e-6)


def test_kl_is_zero_when_policies_agree():
    assert torch.equal(kl_divergence(LOGP, LOGP, "k3"), torch.zeros(1, 2))


def test_kl_unknown_estimator():
    with pytest.raises(ValueError, match="k1, k2, k3"):
        kl_divergence(LOGP, REF_LOGP, "k4")


VALUES = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
MASK = torch.tensor([[True, True], [False, False]])


@pytest.mark.parametrize(
    "mode, max_new_tokens, expected",
    [
        ("seq-mean", None, 0.75),  # (1.5 + 0) / 2: the empty row still counts as a sequence
        ("token-mean", None, 1.5),  # 3 / 2 counted tokens
        ("constant", 4, 0.375),  # 3 / (2 sequences * 4)
    ],
)
def test_design_empty_row_example(mode, max_new_tokens, expected):
    assert masked_aggregate(VALUES, MASK, mode, max_new_tokens).item() == pytest.approx(expected, abs=1e-7)


@pytest.mark.parametrize(
    "mode, max_new_tokens, expected",
    [
        ("seq-mean", None, 2.75),  # ((1 + 2) / 2 + 4 / 1) / 2
        ("token-mean", None, 7 / 3),  # (1 + 2 + 4) / 3
        ("constant", 3, 7 / 6),  # 7 / (2 * 3)
    ],
)
def test_unequal_lengths(mode, max_new_tokens, expected):
    values = torch.tensor([[1.0, 2.0, 30.0], [4.0, 50.0, 60.0]])  # masked values are large so a leak shows
    mask = torch.tensor([[True, True, False], [True, False, False]])
    assert masked_aggregate(values, mask, mode, max_new_tokens).item() == pytest.approx(expected, abs=1e-6)


@pytest.mark.parametrize("mode, max_new_tokens", [("seq-mean", None), ("token-mean", None), ("constant", 5)])
def test_no_counted_token_gives_zero_and_finite_grad(mode, max_new_tokens):
    values = torch.tensor([[1.0, 2.0], [3.0, 4.0]], requires_grad=True)
    out = masked_aggregate(values, torch.zeros(2, 2, dtype=torch.bool), mode, max_new_tokens)
    out.backward()
    assert out.item() == 0.0
    assert torch.equal(values.grad, torch.zeros(2, 2))


def test_terms_sum_over_minibatches_to_the_whole_batch():
    # seq-mean over 3 rows split 2 + 1: numerators add, denominators add, the quotient is the whole batch's
    values = torch.tensor([[1.0, 2.0], [3.0, 5.0], [7.0, 0.0]])
    mask = torch.tensor([[True, True], [True, False], [True, False]])
    num_a, den_a = aggregation_terms(values[:2], mask[:2], "seq-mean")
    num_b, den_b = aggregation_terms(values[2:], mask[2:], "seq-mean")
    whole = masked_aggregate(values, mask, "seq-mean")  # (1.5 + 3 + 7) / 3
    assert whole.item() == pytest.approx(11.5 / 3, abs=1e-6)
    assert ((num_a + num_b) / (den_a + den_b)).item() == pytest.approx(11.5 / 3, abs=1e-6)


def test_aggregation_errors():
    with pytest.raises(ValueError, match="seq-mean, token-mean, constant"):
        masked_aggregate(VALUES, MASK, "sum")
    with pytest.raises(ValueError, match="max_new_tokens"):
        masked_aggregate(VALUES, MASK, "constant")
    with pytest.raises(ValueError, match="differ"):
        masked_aggregate(VALUES, MASK[:, :1], "seq-mean")
