"""The objectives TRL 1.16 users set (issue 50), each on a hand-computed example that a one-character slip fails:
two-sided clipping, CISPO, SAPO, VESPO, sequence-level ratios, LUSPO's seq-sum, the entropy mask and adaptive
coefficient, the entropy of a distribution, GDPO, and the ratio-corrected KL term."""

import math

import pytest
import torch

from lit_grpo.losses import policy_loss
from lit_grpo.losses.advantages import gdpo_advantages, gdpo_group_sums, nan_std
from lit_grpo.losses.aggregation import masked_aggregate
from lit_grpo.losses.entropy import high_entropy_mask, next_entropy_coef
from lit_grpo.losses.policy import SurrogateOptions
from lit_grpo.losses.surrogates import SapoTemperatures, vespo_weights
from lit_grpo.policy.logprobs import TokenLogSoftmaxEntropy
from lit_grpo.policy.objective import Objective
from lit_grpo.policy.policy_step import policy_terms

F64 = torch.float64


def one_token(ratio: float, old: float = 0.5) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """logp (leaf), old_logp and mask of one row of one token whose ratio pi / pi_old is ``ratio``."""
    logp = torch.tensor([[math.log(old * ratio)]], dtype=F64, requires_grad=True)
    return logp, torch.tensor([[math.log(old)]], dtype=F64), torch.ones(1, 1, dtype=torch.bool)


def loss_and_grad(ratio: float, adv: float, variant: str, **kwargs) -> tuple[float, float, dict]:
    logp, old, mask = one_token(ratio)
    loss, stats = policy_loss(logp, old, torch.tensor([adv], dtype=F64), mask, variant, **kwargs)
    loss.backward()
    return loss.item(), logp.grad.item(), stats


def test_two_sided_clipping_caps_a_runaway_negative_token():
    # r = 3, A = -1, eps 0.2: -min(-3, -1.2) = 3, gradient in logp -A * r = 3
    assert loss_and_grad(3.0, -1.0, "clip", clip_eps=0.2)[:2] == (pytest.approx(3.0, abs=1e-12),
                                                                 pytest.approx(3.0, abs=1e-12))
    # delta 2: -min(-2, -1.2) = 2, and the capped ratio passes no gradient
    loss, grad, _ = loss_and_grad(3.0, -1.0, "clip", clip_eps=0.2, options=SurrogateOptions(delta=2.0))
    assert (loss, grad) == (pytest.approx(2.0, abs=1e-12), 0.0)
    # a positive advantage is clipped at 1.2 either way
    loss, _, _ = loss_and_grad(3.0, 1.0, "clip", clip_eps=0.2, options=SurrogateOptions(delta=2.0))
    assert loss == pytest.approx(-1.2, abs=1e-12)


def test_cispo_caps_the_detached_ratio_and_keeps_every_gradient():
    # r = 6 capped at 1 + 4 = 5, A = 1, logp = log 3 (old 0.5 * 6): -5 * log 3 = -5.4930614; gradient -5
    loss, grad, stats = loss_and_grad(6.0, 1.0, "cispo", clip_eps_high=4.0)
    assert loss == pytest.approx(-5 * math.log(3.0), abs=1e-12)
    assert grad == pytest.approx(-5.0, abs=1e-12)
    assert stats["cispo_clip_ratio"].item() == 1.0
    # r = 2 under the cap: weight 2, gradient -2 (PPO's clip would pass none here)
    assert loss_and_grad(2.0, 1.0, "cispo", clip_eps_high=4.0)[1] == pytest.approx(-2.0, abs=1e-12)


def test_sapo_soft_gate():
    # r = 1: -(4 / tau) * sigmoid(0) * A: A = 1, tau 1 -> -2; A = -1, tau 1.05 -> 2 / 1.05 = 1.9047619
    options = SurrogateOptions(knobs=SapoTemperatures(pos=1.0, neg=1.05))
    loss, grad, stats = loss_and_grad(1.0, 1.0, "sapo", options=options)
    assert (loss, grad) == (pytest.approx(-2.0, abs=1e-12), pytest.approx(-1.0, abs=1e-12))  # -4 s(1-s) r A = -1
    assert stats["sapo/gate_mean"].item() == pytest.approx(1.0, abs=1e-12)
    assert loss_and_grad(1.0, -1.0, "sapo", options=options)[0] == pytest.approx(2 / 1.05, abs=1e-12)
    # r = 3, A = 1: sigmoid(2) = 0.8807971, gate 4 * 0.8807971 * 0.1192029 = 0.4199743, gradient -0.4199743 * 3
    loss, grad, stats = loss_and_grad(3.0, 1.0, "sapo", options=options)
    assert loss == pytest.approx(-4 * 0.8807970780, abs=1e-9)
    assert grad == pytest.approx(-0.4199743416 * 3, abs=1e-9)
    assert stats["sapo/gate_mean"].item() == pytest.approx(0.4199743416, abs=1e-9)


def test_vespo_sequence_weight():
    # log w = log 2: A >= 0 (k 2, lambda 3): e^3 * 2^2 * e^-6 = 4 e^-3 = 0.1991483; A < 0 (k 3, lambda 2): 8 e^-2
    log_ratio = torch.tensor([[math.log(2.0), 0.0]], dtype=F64)
    mask = torch.ones(1, 2, dtype=torch.bool)
    phi = vespo_weights(log_ratio, torch.tensor([[1.0]], dtype=F64), mask, None, 2.0, 3.0, 3.0, 2.0)
    assert phi.item() == pytest.approx(4 * math.exp(-3), abs=1e-12)
    phi = vespo_weights(log_ratio, torch.tensor([[-1.0]], dtype=F64), mask, None, 2.0, 3.0, 3.0, 2.0)
    assert phi.item() == pytest.approx(8 * math.exp(-2), abs=1e-12)
    # a masked token's log ratio does not count; a sampler ratio of 0.5 on a token halves w back to 1: phi 1
    assert vespo_weights(log_ratio, torch.tensor([[1.0]], dtype=F64), torch.tensor([[False, True]]), None,
                         2.0, 3.0, 3.0, 2.0).item() == pytest.approx(1.0, abs=1e-12)
    sampler_log = torch.tensor([[math.log(0.5), 0.0]], dtype=F64)
    assert vespo_weights(log_ratio, torch.tensor([[1.0]], dtype=F64), mask, sampler_log, 2.0, 3.0, 3.0,
                         2.0).item() == pytest.approx(1.0, abs=1e-12)
    # the loss: -phi * A * logp per token, token-mean; its gradient in logp is -phi * A (phi is detached)
    logp = torch.tensor([[math.log(0.5), math.log(0.25)]], dtype=F64, requires_grad=True)
    old = logp.detach() - log_ratio
    loss, stats = policy_loss(logp, old, torch.tensor([1.0], dtype=F64), mask, "vespo", aggregation="token-mean")
    loss.backward()
    phi = 4 * math.exp(-3)
    assert loss.item() == pytest.approx(-phi * (math.log(0.5) + math.log(0.25)) / 2, abs=1e-12)
    torch.testing.assert_close(logp.grad, torch.full((1, 2), -phi / 2, dtype=F64), rtol=0, atol=1e-12)
    assert stats["vespo/phi_seq_mean"].item() == pytest.approx(phi, abs=1e-12)


def test_sequence_level_ratio_and_luspo_seq_sum():
    # token ratios 1.5 and 0.5: the sequence's exp(mean log) = sqrt(0.75) = 0.8660254; A = -1, eps 0.1 clips it at
    # 0.9: loss 0.9 per token, no gradient; unclipped at eps 0.2 (0.8 < 0.866): 0.8660254 per token
    old = torch.full((1, 2), math.log(0.4), dtype=F64)
    logp = torch.log(torch.tensor([[0.6, 0.2]], dtype=F64)).requires_grad_(True)
    mask = torch.ones(1, 2, dtype=torch.bool)
    adv = torch.tensor([-1.0], dtype=F64)
    loss, _ = policy_loss(logp, old, adv, mask, "clip", 0.1, options=SurrogateOptions(ratio_level="sequence"))
    assert loss.item() == pytest.approx(0.9, abs=1e-12)
    loss, _ = policy_loss(logp, old, adv, mask, "gspo", 0.2, aggregation="seq-mean")
    assert loss.item() == pytest.approx(math.sqrt(0.75), abs=1e-12)
    # luspo: the same per-token value summed over the sequence's 2 tokens, over 1 sequence
    loss, _ = policy_loss(logp, old, adv, mask, "luspo", 0.2, aggregation="seq-sum")
    assert loss.item() == pytest.approx(2 * math.sqrt(0.75), abs=1e-12)
    loss.backward()  # d/dlogp_t of -2 A r_seq = 2 r_seq / 2 per token (the mean log ratio's weight 1/2)
    torch.testing.assert_close(logp.grad, torch.full((1, 2), math.sqrt(0.75), dtype=F64), rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match="'luspo' takes aggregation 'seq-sum' only"):
        policy_loss(logp, old, adv, mask, "luspo", 0.2, aggregation="seq-mean")


def test_seq_sum_aggregation():
    values = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    mask = torch.tensor([[True, True], [True, False]])
    assert masked_aggregate(values, mask, "seq-sum").item() == 3.0  # (1 + 2 + 3) / 2 rows
    assert masked_aggregate(values, mask, "token-mean").item() == 2.0  # 6 / 3 tokens


def test_high_entropy_mask_and_adaptive_coefficient():
    entropies = torch.tensor([[0.1, 0.2], [0.3, 0.4]])
    every = torch.ones(2, 2, dtype=torch.bool)
    assert high_entropy_mask(entropies, every, 0.5).tolist() == [[False, False], [True, True]]  # quantile 0.25
    counted = torch.tensor([[True, True], [True, False]])  # 0.4 out: the median of (0.1, 0.2, 0.3) is 0.2
    assert high_entropy_mask(entropies, counted, 0.5).tolist() == [[False, True], [True, False]]
    assert not high_entropy_mask(entropies, torch.zeros(2, 2, dtype=torch.bool), 0.5).any()
    assert next_entropy_coef(0.01, 0.1, 0.2, 0.005, 0.0, 1.0) == pytest.approx(0.015, abs=1e-15)
    assert next_entropy_coef(0.01, 0.2, 0.2, 0.005, 0.0, 0.012) == 0.012  # at the target: up, to the ceiling
    assert next_entropy_coef(0.01, 0.3, 0.2, 0.005, 0.0, 1.0) == pytest.approx(0.005, abs=1e-15)
    assert next_entropy_coef(0.003, 0.3, 0.2, 0.005, 0.0, 1.0) == 0.0


def test_log_prob_and_entropy_of_each_row_and_their_gradients():
    logits = torch.tensor([[0.0, 0.0], [0.0, float("-inf")], [math.log(3.0), 0.0]], dtype=F64, requires_grad=True)
    targets = torch.tensor([0, 0, 1])
    out = TokenLogSoftmaxEntropy.apply(logits, targets)
    # (0, 0): log-prob -log 2, entropy log 2; (0, -inf): 0 and 0; p = (3/4, 1/4), target 1: log 1/4 and
    # -(0.75 log 0.75 + 0.25 log 0.25) = 0.5623351446
    expected = torch.tensor([[-math.log(2), math.log(2)], [0.0, 0.0], [math.log(0.25), 0.5623351446188083]], dtype=F64)
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-12)
    (grad,) = torch.autograd.grad((out * torch.tensor([[0.0, 1.0]] * 3, dtype=F64)).sum(), logits)
    # dH/dl_i = -p_i (l_i - sum_j p_j l_j): for (log 3, 0), mean 0.75 log 3, -0.75 * 0.25 log 3 and +0.75 * 0.25 log 3;
    # the forbidden id's gradient is 0, and a row of one allowed id has entropy 0 whatever its logit
    assert grad[2, 0].item() == pytest.approx(-0.75 * 0.25 * math.log(3.0), abs=1e-12)
    assert grad[2, 1].item() == pytest.approx(0.75 * 0.25 * math.log(3.0), abs=1e-12)
    assert grad[1].tolist() == [0.0, 0.0] and grad[0].tolist() == [0.0, 0.0]
    # against autograd's own softmax on finite logits, both outputs weighted
    finite = torch.randn(4, 7, dtype=F64, generator=torch.Generator().manual_seed(1)).requires_grad_(True)
    ids = torch.tensor([0, 3, 6, 2])
    assert torch.autograd.gradcheck(lambda x: TokenLogSoftmaxEntropy.apply(x, ids), (finite,))
    log_p = torch.log_softmax(finite, dim=-1)
    reference = torch.stack([log_p.gather(-1, ids[:, None]).squeeze(-1), -(log_p.exp() * log_p).sum(-1)], dim=-1)
    torch.testing.assert_close(TokenLogSoftmaxEntropy.apply(finite, ids), reference, rtol=0, atol=1e-12)


def test_gdpo_normalises_each_reward_then_the_batch():
    # group 1: reward a (1, 0), reward b flat (0, 0); group 2: a flat (0, 0), b (0, 1); weights (1, 2)
    parts = torch.tensor([[[1.0, 0.0], [0.0, 0.0]], [[0.0, 0.0], [0.0, 1.0]]], dtype=F64)  # [B=2, G=2, K=2]
    sums = gdpo_group_sums(parts, torch.tensor([1.0, 2.0], dtype=F64))
    a = 0.5 / (math.sqrt(0.5) + 1e-4)  # sample std of (1, 0) is sqrt(0.5); a flat reward normalises to 0
    torch.testing.assert_close(sums, torch.tensor([[a, -a], [-2 * a, 2 * a]], dtype=F64), rtol=0, atol=1e-12)
    std = nan_std(sums)  # sample std of (a, -a, -2a, 2a) around 0: a * sqrt(10 / 3)
    assert std.item() == pytest.approx(a * math.sqrt(10 / 3), abs=1e-12)
    advantages = gdpo_advantages(sums, sums.mean(), std)
    scale = a / (a * math.sqrt(10 / 3) + 1e-4)
    torch.testing.assert_close(advantages, torch.tensor([[scale, -scale], [-2 * scale, 2 * scale]], dtype=F64),
                               rtol=0, atol=1e-12)
    # a completion no reward applied to: NaN in the sums, advantage 0
    parts[0, 1] = float("nan")
    sums = gdpo_group_sums(parts, torch.tensor([1.0, 2.0], dtype=F64))
    assert math.isnan(sums[0, 1].item())
    assert gdpo_advantages(sums, torch.tensor(0.0, dtype=F64), torch.tensor(1.0, dtype=F64))[0, 1].item() == 0.0


def test_kl_term_times_the_ratio():
    # logp log 0.5, pi_old log 0.25 (r = 2), ref log 0.25: k3 = 0.5 + log 2 - 1 = 0.1931472; corrected 0.3862944
    logp = torch.tensor([[math.log(0.5)]], dtype=F64, requires_grad=True)
    batch = {"old_logp": torch.tensor([[math.log(0.25)]], dtype=F64), "ref_logp": torch.tensor([[math.log(0.25)]], dtype=F64),
             "advantages": torch.tensor([0.0], dtype=F64)}
    mask = torch.ones(1, 1, dtype=torch.bool)
    for corrected, expected in ((False, 0.5 + math.log(2) - 1), (True, 2 * (0.5 + math.log(2) - 1))):
        objective = Objective("grpo", "clip", 0.2, 0.2, "seq-mean", 0.1, "k3", "loss", kl_ratio_correction=corrected)
        terms = policy_terms(objective, batch, logp, None, mask, 4)
        assert terms.stats["kl_ref"].item() == pytest.approx(expected, abs=1e-12)
        assert terms.loss.item() == pytest.approx(0.1 * expected, abs=1e-12)  # A = 0: the surrogate is 0


def test_the_two_sided_cap_reports_where_it_binds():
    # ratios 3 (A -1: capped at 2), 1.7 (A -1: under delta 2), 3 (A +1: the clip's, not delta's)
    logp = torch.log(torch.tensor([[3.0, 1.7, 3.0]], dtype=F64) * 0.1)
    old = torch.full((1, 3), math.log(0.1), dtype=F64)
    adv = torch.tensor([[-1.0, -1.0, 1.0]], dtype=F64)  # per token
    _, stats = policy_loss(logp, old, adv, torch.ones(1, 3, dtype=torch.bool), "clip", 0.2,
                           options=SurrogateOptions(delta=2.0))
    assert stats["clip_ratio/delta_mean"].item() == pytest.approx(1 / 3, abs=1e-12)


def test_the_entropy_coefficient_skips_an_empty_step_and_a_loaded_one_keeps_this_runs_bounds():
    from lit_grpo.policy.policy_step import EntropyCoefficient
    from lit_grpo.run.objective_knobs import EntropyControl

    assert EntropyControl().problems() == ["entropy: sets nothing (top_quantile 1, coef 0, not adaptive): give "
                                           "top_quantile < 1, coef > 0 or adaptive true, or leave entropy unset"]
    coefficient = EntropyCoefficient(EntropyControl(coef=0.01, adaptive=True, target=0.2, coef_max=0.05))
    coefficient.step()  # no token observed: nothing measured, nothing changes
    assert (coefficient.coef, coefficient.last_entropy) == (0.01, float("inf"))
    coefficient.observe(torch.tensor([0.3, 2.0], dtype=F64))  # mean entropy 0.15 <= 0.2: up by 0.005
    coefficient.step()
    assert coefficient.coef == pytest.approx(0.015, abs=1e-15) and coefficient.last_entropy == 0.15
    coefficient.load_state_dict({"coef": 0.4, "last_entropy": 0.1})  # a checkpoint's 0.4 above this run's 0.05
    assert coefficient.coef == 0.05 and coefficient.applied() == 0.05
