"""tests/trl_losses.py reproduces TRL 1.16's GRPO loss formulas: every expected value below is worked out by hand
(the arithmetic in the comments) from the formulas in trl/trainer/grpo_trainer.py, never computed with TRL.

The common case: B=2 completions of T=3 tokens, the last token of the second one padding; per-token ratios
r = pi/pi_old of 1.3, 0.7, 1.0 and 1.3, 0.7, (2.0, padding); advantages +1 and -1; float64 throughout.
"""

from __future__ import annotations

import inspect
import math
import re
import textwrap
import types

import pytest
import torch
from trl_losses import trl_importance_sampling_ratio, trl_loss, trl_trainer

# Importing GRPOTrainer imports vLLM (about 6 s, the first build pays it); a trainer build itself takes ~0.03 s
pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore:TRL currently supports vLLM versions:UserWarning")]

MASK = torch.tensor([[1, 1, 1], [1, 1, 0]])
RATIOS = torch.tensor([[1.3, 0.7, 1.0], [1.3, 0.7, 2.0]], dtype=torch.float64)
OLD = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -1.2, -0.8]], dtype=torch.float64)
ADV = torch.tensor([1.0, -1.0], dtype=torch.float64)
ENTROPIES = torch.tensor([[0.125, 0.5, 0.875], [0.25, 0.75, 9.0]], dtype=torch.float64)  # 9.0: padding

# With epsilon 0.2 (clip range [0.8, 1.2]) the per-token GRPO loss -min(r*A, clip(r)*A) of the common case is
#   row 0 (A=+1): -min(1.3, 1.2) = -1.2 (clipped), -min(0.7, 0.8) = -0.7, -min(1.0, 1.0) = -1.0   sum -2.9 over 3
#   row 1 (A=-1): -min(-1.3, -1.2) = 1.3, -min(-0.7, -0.8) = 0.8 (clipped)                        sum  2.1 over 2
# and its derivative in log pi (dr/dlogp = r): 0 where clipped, else -A*r.
ROW_SUMS = (-2.9, 2.1)
GRPO_LOSS = (-2.9 / 3 + 2.1 / 2) / 2  # = (-29/30 + 31.5/30)/2 = 1/24


def logp_of(ratios: torch.Tensor = RATIOS, old: torch.Tensor = OLD) -> torch.Tensor:
    return (old + ratios.log()).requires_grad_(True)


def loss_and_grad(trainer, logp, old=OLD, adv=ADV, mask=MASK, **kwargs) -> tuple[float, torch.Tensor]:
    loss = trl_loss(trainer, logp, old, adv, mask, **kwargs)
    (grad,) = torch.autograd.grad(loss, logp)
    return loss.item(), grad


def test_grpo_clipped_sequence_mean_and_its_gradient() -> None:
    trainer = trl_trainer(loss_type="grpo", epsilon=0.2)
    loss, grad = loss_and_grad(trainer, logp_of())
    assert GRPO_LOSS == pytest.approx(1 / 24, abs=1e-15)
    assert loss == pytest.approx(1 / 24, abs=1e-12)
    # d loss / d logp = (d per-token loss) / (row's token count) / B:
    #   row 0: 0 (clipped), -0.7/3/2, -1.0/3/2;  row 1: 1.3/2/2 = 0.325, 0 (clipped), 0 (padding)
    expected = torch.tensor([[0.0, -0.7 / 6, -1.0 / 6], [0.325, 0.0, 0.0]], dtype=torch.float64)
    torch.testing.assert_close(grad, expected, atol=1e-12, rtol=0)
    # TRL's own metric: tokens clipped in the direction that stops the gradient, 2 of 5 (row 0 t0, row 1 t1)
    assert trainer._metrics["train"]["clip_ratio/region_mean"] == [pytest.approx(0.4, abs=1e-7)]


@pytest.mark.parametrize(
    ("config", "num_items", "expected"),
    [
        # bnpo: masked sum over masked count: (-2.9 + 2.1) / 5 = -0.16
        ({"loss_type": "bnpo"}, None, -0.8 / 5),
        # dr_grpo: masked sum over B * max_completion_length: -0.8 / (2 * 4) = -0.1
        ({"loss_type": "dr_grpo", "max_completion_length": 4}, None, -0.8 / 8),
        # dapo: masked sum over num_items_in_batch (default the mask's 5 tokens): -0.16; given 10: -0.08
        ({"loss_type": "dapo"}, None, -0.8 / 5),
        ({"loss_type": "dapo"}, 10, -0.8 / 10),
        # luspo: row sums averaged over rows: (-2.9 + 2.1) / 2 = -0.4
        ({"loss_type": "luspo"}, None, -0.8 / 2),
        # gradient accumulation 2 (a full window): grpo's loss is halved, 1/48; dapo's normaliser is
        # num_items * accumulation / steps_per_generation = 5 * 2 / 2 (steps_per_generation defaults to it): -0.16
        ({"loss_type": "grpo", "gradient_accumulation_steps": 2}, None, 1 / 48),
        ({"loss_type": "dapo", "gradient_accumulation_steps": 2}, None, -0.8 / 5),
    ],
)
def test_normalisers(config: dict, num_items: int | None, expected: float) -> None:
    trainer = trl_trainer(epsilon=0.2, **config)
    loss, _ = loss_and_grad(trainer, logp_of(), num_items_in_batch=num_items)
    assert loss == pytest.approx(expected, abs=1e-12)


def test_delta_two_sided_clipping() -> None:
    # delta 1.25 caps r at 1.25 before the min: row 1 t0 (A=-1) becomes -min(-1.25, -1.2) = 1.25 with no gradient
    # loss = (-2.9/3 + (1.25 + 0.8)/2) / 2 = (-29/30 + 41/40) / 2 = (7/120) / 2 = 7/240
    trainer = trl_trainer(loss_type="grpo", epsilon=0.2, delta=1.25)
    loss, grad = loss_and_grad(trainer, logp_of())
    assert loss == pytest.approx(7 / 240, abs=1e-12)
    expected = torch.tensor([[0.0, -0.7 / 6, -1.0 / 6], [0.0, 0.0, 0.0]], dtype=torch.float64)
    torch.testing.assert_close(grad, expected, atol=1e-12, rtol=0)


def test_cispo_caps_the_detached_ratio_at_epsilon_high() -> None:
    # per-token loss -min(r, eps_high).detach() * A * logp, summed over the mask, over num_items_in_batch (5)
    # row 0 (A=+1): logp -0.5, -1.0, -2.0 with r 6, 0.5, 1 -> -(5*-0.5), -(0.5*-1.0), -(1*-2.0) = 2.5, 0.5, 2.0
    # row 1 (A=-1): logp -1.5, -0.25 with r 2, 8 -> 2*-1.5, 5*-0.25 = -3.0, -1.25 (t2 padding)
    # loss = (5.0 - 4.25) / 5 = 0.15; gradient -min(r, 5) * A / 5
    trainer = trl_trainer(loss_type="cispo", epsilon_high=5.0)
    ratios = torch.tensor([[6.0, 0.5, 1.0], [2.0, 8.0, 1.0]], dtype=torch.float64)
    logp = torch.tensor([[-0.5, -1.0, -2.0], [-1.5, -0.25, -0.9]], dtype=torch.float64, requires_grad=True)
    old = logp.detach() - ratios.log()
    loss, grad = loss_and_grad(trainer, logp, old=old)
    assert loss == pytest.approx(0.15, abs=1e-12)
    expected = torch.tensor([[-1.0, -0.1, -0.2], [0.4, 1.0, 0.0]], dtype=torch.float64)
    torch.testing.assert_close(grad, expected, atol=1e-12, rtol=0)
    assert trainer._metrics["train"]["cispo_clip_ratio"] == [pytest.approx(1 / 5, abs=1e-7)]  # r=6, A>0


def test_sapo_soft_gate_with_default_temperatures() -> None:
    # per-token loss -sigmoid(tau*(r-1)) * 4/tau * A, tau 1.0 where A>0 and 1.05 otherwise (TRL's defaults)
    # ratios 1.3 and 0.7 sit symmetrically about 1 and sigmoid(x) + sigmoid(-x) = 1, so
    #   row 0 (A=+1, tau 1): -4 * (sigmoid(0.3) + sigmoid(-0.3) + sigmoid(0)) / 3 = -4 * 1.5 / 3 = -2
    #   row 1 (A=-1, tau 1.05): 4/1.05 * (sigmoid(0.315) + sigmoid(-0.315)) / 2 = 2/1.05
    # loss = (-2 + 2/1.05) / 2 = -1/21 = -0.047619...; TRL builds the temperatures with torch.where on Python floats,
    # so 1.05 enters as float32's 1.0499999523: a difference of ~4e-8
    trainer = trl_trainer(loss_type="sapo")
    loss, grad = loss_and_grad(trainer, logp_of())
    assert loss == pytest.approx(-1 / 21, abs=1e-6)
    # d/dlogp of -A * 4/tau * sigmoid(tau*(r-1)) = -4 * A * r * s * (1-s), s = sigmoid(tau*(r-1)); row 0 t0:
    # s = sigmoid(0.3) = 0.5744425168, -4 * 1.3 * s*(1-s) / 3 / 2 = -0.2118638701
    s = 1 / (1 + math.exp(-0.3))
    assert grad[0, 0].item() == pytest.approx(-4 * 1.3 * s * (1 - s) / 6, abs=1e-12)
    assert -4 * 1.3 * s * (1 - s) / 6 == pytest.approx(-0.2118638701, abs=1e-10)


def test_sequence_level_importance_sampling() -> None:
    # GSPO: w = exp(masked mean of log r) per row, one clipped weight per sequence
    #   row 0: w0 = (1.3*0.7*1.0)^(1/3) = 0.91^(1/3) = 0.9690521083 (inside [0.8, 1.2]); loss -w0 on each token
    #   row 1: w1 = (1.3*0.7)^(1/2) = 0.91^(1/2) = 0.9539392014; loss +w1 on each token
    # loss = (-w0 + w1) / 2 = -0.0075564535; d w/d logp_t = w / n_row, so grad row 0: -w0/3/2, row 1: +w1/2/2
    trainer = trl_trainer(loss_type="grpo", epsilon=0.2, importance_sampling_level="sequence")
    loss, grad = loss_and_grad(trainer, logp_of())
    w0, w1 = 0.91 ** (1 / 3), 0.91**0.5
    assert loss == pytest.approx((w1 - w0) / 2, abs=1e-12)
    assert loss == pytest.approx(-0.0075564535, abs=1e-10)
    expected = torch.tensor([[-w0 / 6] * 3, [w1 / 4, w1 / 4, 0.0]], dtype=torch.float64)
    torch.testing.assert_close(grad, expected, atol=1e-12, rtol=0)


@pytest.mark.parametrize("bias_correction", [False, True])
def test_k3_kl_and_its_bias_correction(bias_correction: bool) -> None:
    # advantages 0: only beta * k3 remains, k3 = exp(d) - d - 1 with d = ref - logp, averaged per row then over rows
    #   row 0: d = 0.5, -0.5, 0 -> k3 = 0.1487212707, 0.1065306597, 0
    #   row 1: d = 1, -1 (t2 padding) -> k3 = e - 2 = 0.7182818285, 1/e = 0.3678794412
    # use_bias_correction_kl multiplies k3 by r (1.3, 0.7, 1.0 / 1.3, 0.7):
    #   off: 0.1 * ((0.1487212707 + 0.1065306597)/3 + (0.7182818285 + 0.3678794412)/2) / 2 = 0.0314082306
    #   on:  0.1 * ((1.3*0.1487212707 + 0.7*0.1065306597)/3 + (1.3*0.7182818285 + 0.7*0.3678794412)/2) / 2
    #        = 0.1 * (0.0893030379 + 0.5956409929) / 2 = 0.0342472015
    # gradient in logp_t: d k3 = 1 - e^d; with the correction d(r*k3) = r*k3 + r*(1 - e^d) = -r*d (the unbiased
    # reverse-KL gradient); row 0 t0: off 0.1 * (1 - e^0.5) / 6 = -0.0108120212, on 0.1 * -1.3*0.5 / 6 = -0.0108333333
    trainer = trl_trainer(loss_type="grpo", beta=0.1, use_bias_correction_kl=bias_correction)
    logp = logp_of()
    d = torch.tensor([[0.5, -0.5, 0.0], [1.0, -1.0, 3.0]], dtype=torch.float64)
    loss, grad = loss_and_grad(trainer, logp, adv=torch.zeros(2, dtype=torch.float64), ref_logp=logp.detach() + d)
    k3 = [math.exp(0.5) - 1.5, math.exp(-0.5) - 0.5, math.e - 2, math.exp(-1)]
    if bias_correction:
        expected = 0.1 * ((1.3 * k3[0] + 0.7 * k3[1]) / 3 + (1.3 * k3[2] + 0.7 * k3[3]) / 2) / 2
        assert expected == pytest.approx(0.0342472015, abs=1e-10)
        assert grad[0, 0].item() == pytest.approx(0.1 * -1.3 * 0.5 / 6, abs=1e-12)
    else:
        expected = 0.1 * ((k3[0] + k3[1]) / 3 + (k3[2] + k3[3]) / 2) / 2
        assert expected == pytest.approx(0.0314082306, abs=1e-10)
        assert grad[0, 0].item() == pytest.approx(0.1 * (1 - math.exp(0.5)) / 6, abs=1e-12)
    assert loss == pytest.approx(expected, abs=1e-12)
    assert grad[1, 2].item() == 0.0  # padding


@pytest.mark.parametrize(
    ("sampler_shift", "expected"),
    [
        # no sampler log-probs: the KL is old - logp = -log r; row 1 mean -(ln 1.3 + ln 0.7)/2 = 0.047 <= 0.5: kept
        (None, 1 / 24),
        # sampler - logp = 0.6 on row 1's tokens (padding 5.0 ignored): mean 0.6 > 0.5 and A < 0: row 1 dropped,
        # loss = (-2.9/3 + 0) / 2 = -29/60; row 0 (A >= 0) is kept whatever its KL (0.9 here)
        ([[0.9, 0.9, 0.9], [0.6, 0.6, 5.0]], -29 / 60),
        # mean 0.4 <= 0.5: kept
        ([[0.9, 0.9, 0.9], [0.4, 0.4, 5.0]], 1 / 24),
    ],
)
def test_off_policy_sequence_mask(sampler_shift: list | None, expected: float) -> None:
    trainer = trl_trainer(loss_type="grpo", epsilon=0.2, off_policy_mask_threshold=0.5)
    logp = logp_of()
    sampler = None if sampler_shift is None else logp.detach() + torch.tensor(sampler_shift, dtype=torch.float64)
    loss, grad = loss_and_grad(trainer, logp, sampler_logp=sampler)
    assert loss == pytest.approx(expected, abs=1e-12)
    if expected == -29 / 60:
        assert grad[1].abs().sum().item() == 0.0


@pytest.mark.parametrize(
    ("quantile", "coef", "expected"),
    [
        # top 50%: threshold = quantile([0.125, 0.25, 0.5, 0.75, 0.875], 0.5) = 0.5 (the padding's 9.0 is left
        # out); kept tokens: row 0 t1, t2, row 1 t1. loss = (-(0.7 + 1.0)/3 + 0.8/2) / 2 = (-17/30 + 12/30)/2 = -1/12
        (0.5, 0.0, -1 / 12),
        # entropy bonus: loss - coef * mean entropy over the mask = 1/24 - 0.1 * 2.5/5 = 1/24 - 0.05
        (1.0, 0.1, 1 / 24 - 0.05),
        # both: the bonus averages over the kept tokens only: -1/12 - 0.1 * (0.5 + 0.875 + 0.75)/3 = -1/12 - 0.0708333
        (0.5, 0.1, -1 / 12 - 0.1 * 2.125 / 3),
    ],
)
def test_entropy_mask_and_bonus(quantile: float, coef: float, expected: float) -> None:
    trainer = trl_trainer(loss_type="grpo", epsilon=0.2, top_entropy_quantile=quantile, entropy_coef=coef)
    logp = logp_of()
    entropies = ENTROPIES.clone().requires_grad_(True)
    loss = trl_loss(trainer, logp, OLD, ADV, MASK, entropies=entropies)
    assert loss.item() == pytest.approx(expected, abs=1e-12)
    if coef:
        # d loss / d entropy = -coef / (number of tokens the bonus averages over) on those tokens
        (grad,) = torch.autograd.grad(loss, entropies)
        kept = torch.tensor([[0, 1, 1], [0, 1, 0]] if quantile < 1 else [[1, 1, 1], [1, 1, 0]], dtype=torch.float64)
        torch.testing.assert_close(grad, -coef * kept / kept.sum(), atol=1e-12, rtol=0)


# log(pi_old / pi_sampler): row 0: ln 2, ln 4, 0 (the sampler's log-prob there NaN: unscored, so ratio 1);
# row 1: ln 0.5, 0, ln 10 (padding: multiplied by the mask before exp, ratio 1)
IS_DIFF = [[math.log(2), math.log(4), 0.0], [math.log(0.5), 0.0, math.log(10)]]


@pytest.mark.parametrize(
    ("mode", "clip_min", "expected"),
    [
        # token ratios 2, 4 -> 3 (clip_max 3, TRL's default), 1 / 0.5, 1; per-token losses times them:
        # row 0: -1.2*2 - 0.7*3 - 1.0 = -5.5 over 3, row 1: 1.3*0.5 + 0.8 = 1.45 over 2:
        # (-11/6 + 29/40) / 2 = -133/240
        ("token_truncate", None, -133 / 240),
        # clip_min 0.6 lifts row 1 t0 to 0.6: row 1 (0.78 + 0.8)/2 = 0.79; (-11/6 + 0.79)/2
        ("token_truncate", 0.6, (-11 / 6 + 0.79) / 2),
        # ratio 4 > 3 masked to 0: row 0 -1.2*2 - 1.0 = -3.4 over 3; (-3.4/3 + 0.725)/2 = -49/240
        ("token_mask", None, -49 / 240),
        # sequence ratios exp(ln 2 + ln 4) = 8 -> 3 and 0.5: (-2.9/3*3 + 2.1/2*0.5) / 2 = (-2.9 + 0.525)/2
        ("sequence_truncate", None, -1.1875),
        # 8 > 3 masked: (0 + 0.525)/2; with clip_min 0.6 row 1's 0.5 is masked too: 0
        ("sequence_mask", None, 0.2625),
        ("sequence_mask", 0.6, 0.0),
    ],
)
def test_vllm_importance_sampling_modes(mode: str, clip_min: float | None, expected: float) -> None:
    trainer = trl_trainer(
        loss_type="grpo", epsilon=0.2, use_vllm=True, vllm_importance_sampling_correction=True,
        vllm_importance_sampling_mode=mode, vllm_importance_sampling_clip_min=clip_min,
    )
    assert trainer.use_vllm and trainer.vllm_importance_sampling_clip_max == 3.0
    sampler = OLD - torch.tensor(IS_DIFF, dtype=torch.float64)
    sampler[0, 2] = float("nan")
    loss, grad = loss_and_grad(trainer, logp_of(), sampler_logp=sampler)
    assert loss == pytest.approx(expected, abs=1e-12)
    if mode == "token_truncate" and clip_min is None:
        # the IS ratio is a constant weight: row 0 t1's gradient -0.7/6 times 3
        assert grad[0, 1].item() == pytest.approx(-0.35, abs=1e-12)


def test_vllm_importance_sampling_needs_sampler_logps_and_vespo_a_token_mode() -> None:
    trainer = trl_trainer(loss_type="grpo", use_vllm=True, vllm_importance_sampling_mode="token_mask")
    with pytest.raises(ValueError, match="sampler_logp"):
        trl_loss(trainer, logp_of(), OLD, ADV, MASK)
    with pytest.raises(ValueError, match="VESPO loss requires"):
        trl_trainer(loss_type="vespo", use_vllm=True)  # TRL's default mode is sequence_mask


def test_vespo_gamma_weights() -> None:
    # phi = exp(lambda + k*log w - lambda*w), w = prod of the row's masked ratios; k, lambda = 2, 3 for A >= 0 and
    # 3, 2 for A < 0 (TRL's defaults); loss = sum over the mask of -phi * A * logp, over num_items_in_batch (5)
    #   row 0: w = 1.3*0.7*1.0 = 0.91, phi0 = e^(3 - 2.73) * 0.91^2 = e^0.27 * 0.8281 = 1.0847815617
    #          logp = -1 + ln 1.3, -2 + ln 0.7, -0.5: sum -3.5943106795
    #   row 1: w = 0.91, phi1 = e^(2 - 1.82) * 0.91^3 = e^0.18 * 0.753571 = 0.9021882855
    #          logp = -0.3 + ln 1.3, -1.2 + ln 0.7: sum -1.5943106795
    # loss = (phi0 * 3.5943106795 - phi1 * 1.5943106795) / 5 = 0.4921347067; phi is detached: grad -phi * A / 5
    trainer = trl_trainer(loss_type="vespo")
    loss, grad = loss_and_grad(trainer, logp_of())
    phi0, phi1 = math.exp(0.27) * 0.91**2, math.exp(0.18) * 0.91**3
    sum0 = -1 + math.log(1.3) - 2 + math.log(0.7) - 0.5
    sum1 = -0.3 + math.log(1.3) - 1.2 + math.log(0.7)
    assert (phi0, phi1) == (pytest.approx(1.0847815617, abs=1e-10), pytest.approx(0.9021882855, abs=1e-10))
    assert loss == pytest.approx((-phi0 * sum0 + phi1 * sum1) / 5, abs=1e-12)
    assert loss == pytest.approx(0.4921347067, abs=1e-10)
    expected = torch.tensor([[-phi0 / 5] * 3, [phi1 / 5, phi1 / 5, 0.0]], dtype=torch.float64)
    torch.testing.assert_close(grad, expected, atol=1e-12, rtol=0)


def _trl_is_block() -> str:
    """TRL's own lines that compute the vLLM importance-sampling ratio, cut from its source as installed."""
    from trl import GRPOTrainer

    source = inspect.getsource(GRPOTrainer._generate_and_score_completions)
    match = re.search(
        r"\n( *)# Compute the importance sampling ratio when using vLLM.*?\n(.*?)\n *# Compute the per-token log "
        r"probabilities for the reference model",
        source,
        re.DOTALL,
    )
    assert match, "TRL's importance-sampling block moved: re-check trl_importance_sampling_ratio against it"
    return textwrap.dedent(match.group(2))


@pytest.mark.parametrize(
    ("mode", "clip_min", "clip_max"),
    [
        ("token_truncate", None, 3.0), ("token_truncate", 0.5, 2.0), ("token_mask", None, 3.0),
        ("token_mask", 0.5, None), ("sequence_truncate", 0.7, 3.0), ("sequence_mask", None, 3.0),
        ("sequence_mask", 0.8, 1.2),
    ],
)
def test_is_ratio_copy_matches_trl_source(mode: str, clip_min: float | None, clip_max: float | None) -> None:
    generator = torch.Generator().manual_seed(0)
    old = -torch.rand(3, 5, generator=generator, dtype=torch.float64) * 3
    sampler = old + torch.randn(3, 5, generator=generator, dtype=torch.float64) * 0.8
    sampler[1, 2] = float("nan")
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 0, 0, 0, 0]])
    owner = types.SimpleNamespace(
        use_vllm=True, vllm_importance_sampling_correction=True, vllm_importance_sampling_mode=mode,
        vllm_importance_sampling_clip_min=clip_min, vllm_importance_sampling_clip_max=clip_max,
    )
    namespace = {"self": owner, "torch": torch, "math": math, "old_per_token_logps": old,
                 "sampling_per_token_logps": sampler, "completion_mask": mask, "tool_mask": None}
    exec(_trl_is_block(), namespace)  # noqa: S102 - TRL's own installed source lines, unchanged
    ours = trl_importance_sampling_ratio(old, sampler, mask, mode, clip_min, clip_max)
    assert torch.equal(ours, namespace["vllm_importance_sampling_ratio"])


def test_cached_trainer_state_and_rng() -> None:
    import trl

    assert trl.__version__ == "1.16.0"  # the line numbers cited in tests/trl_losses.py are this release's
    state = torch.get_rng_state()
    trainer = trl_trainer(loss_type="grpo", epsilon=0.2, seed=1234)  # a fresh build (TRL reseeds in __init__)
    assert torch.equal(torch.get_rng_state(), state)
    assert trl_trainer(loss_type="grpo", epsilon=0.2, seed=1234) is trainer
    assert trainer.model.training and trainer.beta == 0.0 and not trainer.use_vllm
    first = trl_loss(trainer, logp_of(), OLD, ADV, MASK).item()
    assert "_get_per_token_logps_and_entropies" not in vars(trainer)  # the fake forward is removed again
    second = trl_loss(trainer, logp_of(), OLD, ADV, MASK).item()
    assert first == second == pytest.approx(1 / 24, abs=1e-12)
    assert len(trainer._metrics["train"]["entropy"]) == 1  # this call's metrics only
