"""The sampler correction (TIS and MIS, per token and per sequence) and DeepSeek-V3.2's off-policy sequence mask, by
hand, and how the module sets the buffer's per-token sampler ratios."""

import math

import pytest
import torch

from lit_grpo.buffers.buffer import RolloutBuffer
from lit_grpo.losses import off_policy_keep, sampler_importance_ratio
from lit_grpo.policy.module import PolicyModule
from lit_grpo.run.objective_knobs import SamplerCorrection

# pi_old / pi_sampler per token: 0.5/0.25 = 2, 0.2/0.4 = 0.5, a masked third token (0.3/0.1 = 3, never counted)
OLD = torch.log(torch.tensor([[0.5, 0.2, 0.3]], dtype=torch.float64))
SAMPLER = torch.log(torch.tensor([[0.25, 0.4, 0.1]], dtype=torch.float64))
MASK = torch.tensor([[True, True, False]])


@pytest.mark.parametrize(("mode", "clip_min", "clip_max", "expected"), [
    ("token_truncate", None, 1.5, [1.5, 0.5, 1.0]),  # 2 -> 1.5; 0.5 stays; the masked token is weight 1
    ("token_truncate", 0.6, 1.5, [1.5, 0.6, 1.0]),  # 0.5 -> 0.6
    ("token_mask", 0.6, 1.5, [0.0, 0.0, 1.0]),  # both outside [0.6, 1.5]
    ("token_mask", None, 3.0, [2.0, 0.5, 1.0]),  # both inside
    ("sequence_truncate", None, 1.5, [1.0, 1.0, 1.0]),  # the product 2 * 0.5 = 1 is inside
    ("sequence_mask", 1.5, None, [0.0, 0.0, 1.0]),  # 1 is below 1.5
])
def test_sampler_ratio_by_hand(mode, clip_min, clip_max, expected):
    ratio = sampler_importance_ratio(OLD, SAMPLER, MASK, mode, clip_min, clip_max)
    torch.testing.assert_close(ratio, torch.tensor([expected], dtype=torch.float64), rtol=0, atol=1e-12)


def test_sequence_ratio_is_the_product_over_counted_tokens():
    old = torch.log(torch.tensor([[0.5, 0.5, 0.9]], dtype=torch.float64))
    sampler = torch.log(torch.tensor([[0.25, 0.25, 0.1]], dtype=torch.float64))
    ratio = sampler_importance_ratio(old, sampler, MASK, "sequence_truncate", None, 10.0)
    torch.testing.assert_close(ratio, torch.tensor([[4.0, 4.0, 1.0]], dtype=torch.float64), rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match="valid choices"):
        sampler_importance_ratio(old, sampler, MASK, "sequence", None, 10.0)


def test_off_policy_mask_by_hand():
    # behaviour (-1, -1), current (-1.5, -2.5): mean KL (0.5 + 1.5) / 2 = 1.0
    logp = torch.tensor([[-1.5, -2.5], [-1.5, -2.5], [-1.5, -2.5]])
    behaviour = torch.full((3, 2), -1.0)
    mask = torch.ones(3, 2, dtype=torch.bool)
    adv = torch.tensor([-1.0, 1.0, 0.0])
    assert off_policy_keep(adv, logp, behaviour, mask, 1.0).flatten().tolist() == [1.0, 1.0, 1.0]  # KL <= 1
    assert off_policy_keep(adv, logp, behaviour, mask, 0.5).flatten().tolist() == [0.0, 1.0, 1.0]  # A >= 0 kept
    # a masked token does not count in the mean: the second token alone has KL 1.5
    one = torch.tensor([[False, True]])
    assert off_policy_keep(torch.tensor([-1.0]), logp[:1], behaviour[:1], one, 1.4).item() == 0.0


def test_module_sets_each_token_sampler_ratio(tiny_llama_dir):
    module = PolicyModule(model_name_or_path=str(tiny_llama_dir), kl={"coef": 0.0},
                          sampler_correction=SamplerCorrection("token_truncate", None, 2.0))
    mask = torch.tensor([[False, True, True], [False, True, False]])
    buffer = RolloutBuffer(
        input_ids=torch.zeros(2, 3, dtype=torch.long), attention_mask=torch.ones(2, 3, dtype=torch.bool),
        completion_mask=mask, rewards=torch.tensor([1.0, 0.0]), correct=torch.zeros(2, dtype=torch.bool),
        truncated=torch.zeros(2, dtype=torch.bool), group_size=2, temperature=1.0, max_new_tokens=2,
        sampler_logp=torch.log(torch.tensor([[1.0, 0.1, 0.5], [1.0, 0.5, 1.0]])),
        old_logp=torch.log(torch.tensor([[1.0, 0.3, 0.5], [1.0, 0.25, 1.0]])),
    )
    module.assign_advantages(buffer)
    a = 0.5 / (0.5 + 1e-6)  # grpo on [1, 0]: +-0.5 / (0.5 + 1e-6), one per row
    torch.testing.assert_close(buffer.advantages, torch.tensor([a, -a]), rtol=0, atol=1e-6)
    # row 0: 0.3 / 0.1 = 3 -> 2, 0.5 / 0.5 = 1; row 1: 0.25 / 0.5 = 0.5; the uncounted tokens 1
    expected = torch.tensor([[1.0, 2.0, 1.0], [1.0, 0.5, 1.0]])
    torch.testing.assert_close(buffer.sampler_ratio, expected, rtol=0, atol=1e-6)


def test_a_vespo_sequence_correction_is_refused(tiny_llama_dir):
    with pytest.raises(ValueError, match="'vespo': VESPO takes the sampler's per-token ratios"):
        PolicyModule(model_name_or_path=str(tiny_llama_dir), loss_variant="vespo",
                     sampler_correction={"mode": "sequence_mask"})


def test_a_runaway_sampler_ratio_stays_finite():
    # a sampler 30 nats below pi_old on two tokens: the sequence's product e^60 is clamped to e^20 (no clip_max), so
    # a flat group's advantage 0 times the weight stays 0, not NaN; a sampler log-prob of -inf likewise
    old = torch.zeros(1, 2, dtype=torch.float64)
    sampler = torch.tensor([[-30.0, float("-inf")]], dtype=torch.float64)
    mask = torch.ones(1, 2, dtype=torch.bool)
    for mode in ("sequence_truncate", "token_truncate"):
        ratio = sampler_importance_ratio(old, sampler, mask, mode, None, None)
        assert torch.equal(ratio, torch.full((1, 2), math.exp(20.0), dtype=torch.float64))


def test_gdpo_gives_a_failed_completion_advantage_zero(tiny_llama_dir):
    from lit_grpo.policy.advantages import AdvantageKnobs, assign_advantages
    from lit_grpo.policy.objective import Objective

    parts = torch.tensor([1.0, 0.0, 1.0, 0.0])  # one reward over a group of four; the third completion's scoring failed
    buffer = RolloutBuffer(
        input_ids=torch.zeros(4, 2, dtype=torch.long), attention_mask=torch.ones(4, 2, dtype=torch.bool),
        completion_mask=torch.ones(4, 2, dtype=torch.bool), rewards=torch.tensor([1.0, 0.0, -1.0, 0.0]),
        correct=torch.zeros(4, dtype=torch.bool), truncated=torch.zeros(4, dtype=torch.bool), group_size=4,
        temperature=1.0, max_new_tokens=2, reward_parts={"exact": parts}, reward_weights={"exact": 1.0},
        reward_failed=torch.tensor([False, False, True, False]))
    module_args = {"advantage_mode": "gdpo", "loss_variant": "clip", "clip": {"eps": None, "eps_high": None},
                   "aggregation": None, "kl": {"coef": 0.0, "estimator": "k3", "applied_to": "loss"}}
    assign_advantages(buffer, Objective.from_arguments(module_args), AdvantageKnobs())
    # the others (1, 0, 0): mean 1/3, sample std sqrt(1/3); normalised (2/3, -1/3, -1/3) / (0.5773503 + 1e-4);
    # then over the batch: mean 0, sample std of those three values
    group = torch.tensor([2 / 3, -1 / 3, -1 / 3], dtype=torch.float64) / (math.sqrt(1 / 3) + 1e-4)
    batch_std = math.sqrt(float((group ** 2).sum()) / 2)
    expected = (group / (batch_std + 1e-4)).tolist()
    assert buffer.advantages[2].item() == 0.0
    assert [buffer.advantages[i].item() for i in (0, 1, 3)] == pytest.approx(expected, abs=1e-6)
    assert buffer.rewards.tolist() == [1.0, 0.0, -1.0, 0.0]  # the rewards themselves untouched


def test_the_rules_and_the_losses_name_the_same_modes():
    """losses/ imports nothing outside itself, so what it checks of direct callers is spelled beside the rules'."""
    from lit_grpo.losses import importance
    from lit_grpo.run import objective_knobs

    assert importance.SAMPLER_CORRECTION_MODES == objective_knobs.SAMPLER_CORRECTION_MODES
