"""policy_loss (design §5) on a small batch with ratios on both sides of the clip for both advantage signs."""

import math

import pytest
import torch

from lit_grpo.losses import policy_loss

# Six tokens as (ratio, A); old prob 0.4 everywhere, so logp = log(0.4 * ratio).
#   row 0: a (1.5, +1) above 1 + eps_high -> clipped to 1.28;  b (0.5, +1) below, A > 0: not clipped
#   row 1: c (1.5, -1) above, A < 0: not clipped;              d (0.5, -1) below 1 - eps_low -> clipped to 0.8
#   row 2: e (1.25, +1) inside [0.8, 1.28] but above 1.2;       f (1.0, +2) masked out of the loss
RATIO = torch.tensor([[1.5, 0.5], [1.5, 0.5], [1.25, 1.0]])
OLD_LOGP = torch.full((3, 2), math.log(0.4))
ADV = torch.tensor([[1.0, 1.0], [-1.0, -1.0], [1.0, 2.0]])
MASK = torch.tensor([[True, True], [True, True], [True, False]])


def logp_leaf() -> torch.Tensor:
    return torch.log(0.4 * RATIO).requires_grad_(True)


def test_clip_with_clip_higher():
    logp = logp_leaf()
    loss, stats = policy_loss(logp, OLD_LOGP, ADV, MASK, "clip", clip_eps=0.2, clip_eps_high=0.28)
    # per-token s: a -1.28, b -0.5 | c +1.5, d +0.8 | e -1.25; row means -0.89, 1.15, -1.25
    # seq-mean (-0.89 + 1.15 - 1.25) / 3 = -0.33
    assert loss.item() == pytest.approx(-0.33, abs=1e-6)
    # clipped tokens (a, d) carry no gradient; unclipped ones d(-A * ratio)/dlogp = -A * ratio, weighted
    # 1 / (2 tokens * 3 rows) in rows 0-1 and 1 / (1 token * 3 rows) in row 2: b -0.5/6, c +1.5/6, e -1.25/3
    loss.backward()
    expected_grad = torch.tensor([[0.0, -0.5 / 6], [1.5 / 6, 0.0], [-1.25 / 3, 0.0]])
    assert torch.allclose(logp.grad, expected_grad, rtol=0, atol=1e-6)
    # 5 counted tokens: a high-clipped, d low-clipped; ratio mean (1.5 + 0.5 + 1.5 + 0.5 + 1.25) / 5 = 1.05;
    # approx KL per token (r - 1) - ln r: 0.0945349 (r 1.5), 0.1931472 (r 0.5), 0.0268564 (r 1.25) -> 0.6022186 / 5
    assert stats["clip_ratio/high_mean"].item() == pytest.approx(0.2, abs=1e-7)
    assert stats["clip_ratio/low_mean"].item() == pytest.approx(0.2, abs=1e-7)
    assert stats["ratio_mean"].item() == pytest.approx(1.05, abs=1e-6)
    assert stats["approx_kl"].item() == pytest.approx(0.6022186 / 5, abs=1e-6)
    assert all(not value.requires_grad for value in stats.values())


def test_clip_symmetric_when_high_unset():
    loss, stats = policy_loss(logp_leaf(), OLD_LOGP, ADV, MASK, "clip", clip_eps=0.2)
    # eps_high = eps_low = 0.2: a is clipped to 1.2, row 0 (-1.2 - 0.5) / 2 = -0.85; e (1.25) is now clipped too,
    # row 2 -1.2; rows -0.85, 1.15, -1.2 -> -0.9 / 3 = -0.3
    assert loss.item() == pytest.approx(-0.3, abs=1e-6)
    assert stats["clip_ratio/high_mean"].item() == pytest.approx(0.4, abs=1e-7)  # a and e


@pytest.mark.parametrize(
    "aggregation, max_new_tokens, expected",
    [
        ("token-mean", None, -0.73 / 5),  # counted sum -1.28 - 0.5 + 1.5 + 0.8 - 1.25 = -0.73 over 5 tokens
        ("constant", 4, -0.73 / 12),  # over 3 sequences * 4
    ],
)
def test_clip_other_aggregations(aggregation, max_new_tokens, expected):
    loss, _ = policy_loss(
        logp_leaf(), OLD_LOGP, ADV, MASK, "clip", clip_eps=0.2, clip_eps_high=0.28,
        aggregation=aggregation, max_new_tokens=max_new_tokens,
    )
    assert loss.item() == pytest.approx(expected, abs=1e-6)


def test_unclipped():
    loss, stats = policy_loss(logp_leaf(), OLD_LOGP, ADV, MASK, "unclipped", clip_eps=0.2, clip_eps_high=0.28)
    # -A * ratio: row 0 (-1.5 - 0.5) / 2 = -1, row 1 (1.5 + 0.5) / 2 = 1, row 2 -1.25 -> -1.25 / 3
    assert loss.item() == pytest.approx(-1.25 / 3, abs=1e-6)
    # the stats still report what the clip would cut
    assert stats["clip_ratio/high_mean"].item() == pytest.approx(0.2, abs=1e-7)


def test_reinforce_ignores_the_ratio():
    logp = logp_leaf()
    loss, _ = policy_loss(logp, OLD_LOGP, ADV, MASK, "reinforce")
    # -A * logp: row 0 -(ln 0.6 + ln 0.2) / 2 = 1.0601317, row 1 the opposite, row 2 -ln 0.5 = 0.6931472
    assert loss.item() == pytest.approx(0.6931472 / 3, abs=1e-6)
    loss.backward()
    assert torch.allclose(logp.grad, torch.tensor([[-1 / 6, -1 / 6], [1 / 6, 1 / 6], [-1 / 3, 0.0]]), atol=1e-7)


def test_per_sequence_advantages_broadcast():
    adv = torch.tensor([1.0, -1.0, 1.0])
    per_seq, _ = policy_loss(logp_leaf(), OLD_LOGP, adv, MASK, "clip", clip_eps=0.2, clip_eps_high=0.28)
    per_token, _ = policy_loss(logp_leaf(), OLD_LOGP, adv[:, None].expand(3, 2), MASK, "clip", 0.2, 0.28)
    assert per_seq.item() == pytest.approx(-0.33, abs=1e-6)  # same A as ADV on every counted token
    assert per_seq.item() == per_token.item()


def test_gspo_sequence_ratio():
    logp = logp_leaf()
    adv = torch.tensor([1.0, -1.0, 1.0])
    loss, stats = policy_loss(logp, OLD_LOGP, adv, MASK, "gspo", clip_eps=0.2, clip_eps_high=0.28)
    # sequence ratios: rows 0 and 1 exp((ln 1.5 + ln 0.5) / 2) = sqrt(0.75) = 0.8660254 (inside the clip range);
    # row 2 counts only e: 1.25. s: -0.8660254, +0.8660254, -1.25 -> -1.25 / 3
    assert loss.item() == pytest.approx(-1.25 / 3, abs=1e-6)
    # d loss / d logp of row 0's tokens: -(1/3) * ratio * (1/2) = -0.1443376 on both, whatever their own ratio
    loss.backward()
    assert logp.grad[0, 0].item() == pytest.approx(-0.8660254 / 6, abs=1e-6)
    assert logp.grad[0, 1].item() == pytest.approx(-0.8660254 / 6, abs=1e-6)
    assert logp.grad[2, 1].item() == 0.0
    # stats use the sequence ratio: mean over 5 counted tokens (4 * 0.8660254 + 1.25) / 5; no token clipped
    assert stats["ratio_mean"].item() == pytest.approx((4 * 0.8660254 + 1.25) / 5, abs=1e-6)
    assert stats["clip_ratio/high_mean"].item() == 0.0
    assert stats["clip_ratio/low_mean"].item() == 0.0


def test_gspo_clips_the_sequence_ratio_and_empty_row_has_ratio_one():
    mask = torch.tensor([[True, True], [False, False], [True, False]])
    adv = torch.tensor([1.0, -1.0, 1.0])
    loss, stats = policy_loss(logp_leaf(), OLD_LOGP, adv, mask, "gspo", clip_eps=0.2, clip_eps_high=0.2)
    # row 0 -0.8660254, row 1 empty: contributes 0, row 2 ratio 1.25 clipped to 1.2 -> -1.2
    assert loss.item() == pytest.approx((-0.8660254 - 1.2) / 3, abs=1e-6)
    assert stats["clip_ratio/high_mean"].item() == pytest.approx(1 / 3, abs=1e-7)


def test_no_counted_token():
    logp = logp_leaf()
    mask = torch.zeros(3, 2, dtype=torch.bool)
    loss, stats = policy_loss(logp, OLD_LOGP, ADV, mask, "clip")
    loss.backward()
    assert loss.item() == 0.0
    assert torch.equal(logp.grad, torch.zeros(3, 2))
    assert all(value.item() == 0.0 for value in stats.values())


def test_ratio_is_exp_of_difference_not_quotient():
    # old_logp = log 0.4, logp = log 0.6: ratio 1.5 (the seed's logp / old_logp would give 0.557)
    logp = torch.log(torch.tensor([[0.6]]))
    _, stats = policy_loss(logp, torch.log(torch.tensor([[0.4]])), torch.tensor([1.0]), torch.ones(1, 1, dtype=torch.bool))
    assert stats["ratio_mean"].item() == pytest.approx(1.5, abs=1e-6)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"variant": "ppo2"}, "reinforce, unclipped, clip, gspo"),
        ({"aggregation": "sum"}, "seq-mean, token-mean, constant"),
        ({"aggregation": "constant"}, "max_new_tokens"),
        ({"variant": "gspo", "aggregation": "token-mean"}, "seq-mean"),
        ({"variant": "gspo"}, r"one advantage per sequence"),  # ADV is per token
    ],
)
def test_invalid_combinations(kwargs, message):
    with pytest.raises(ValueError, match=message):
        policy_loss(logp_leaf(), OLD_LOGP, ADV, MASK, **kwargs)


def test_shape_errors():
    with pytest.raises(ValueError, match=r"\[N\] or \[N, T\]"):
        policy_loss(logp_leaf(), OLD_LOGP, torch.ones(2), MASK)
    with pytest.raises(ValueError, match="share one"):
        policy_loss(logp_leaf(), OLD_LOGP[:, :1], ADV, MASK)


@pytest.mark.parametrize("variant", ["clip", "unclipped", "gspo"])
def test_a_huge_log_ratio_keeps_the_loss_and_gradient_finite(variant):
    # log ratio 100 (exp overflows float32 past 88.7) on a flat group (A = 0): 0 * inf was NaN
    logp = torch.tensor([[100.0, -1.0]], requires_grad=True)
    old = torch.tensor([[0.0, -1.0]])
    mask = torch.tensor([[True, True]])
    loss, stats = policy_loss(logp, old, torch.tensor([0.0]), mask, variant, 0.2)
    loss.backward()
    assert loss.item() == 0.0 and torch.isfinite(logp.grad).all()
    assert torch.isfinite(stats["ratio_mean"]) and torch.isfinite(stats["approx_kl"])


def test_a_log_ratio_beyond_20_is_clamped_there():
    logp = torch.tensor([[100.0], [3.0]], requires_grad=True)
    old = torch.tensor([[0.0], [0.0]])
    mask = torch.ones(2, 1, dtype=torch.bool)
    # row 0: ratio e^20 (clamped), A = -1: -min(-e^20, -1.2) = e^20; row 1: ratio e^3, A = -1: e^3; seq-mean
    loss, _ = policy_loss(logp, old, torch.tensor([-1.0, -1.0]), mask, "clip", 0.2)
    assert loss.item() == pytest.approx((4.851651954097903e8 + 20.085536923187668) / 2, rel=1e-6)
    loss.backward()
    # the clamped token passes no gradient; the other one d/dlogp of e^(logp) / 2 = e^3 / 2
    assert logp.grad[0, 0].item() == 0.0
    assert logp.grad[1, 0].item() == pytest.approx(20.085536923187668 / 2, rel=1e-6)
