"""The risk head's math, the infer/defer rule and tau's calibration, on hand-computed examples."""

from __future__ import annotations

import math

import pytest
import torch

from lit_grpo.policy.logprobs import (
    FirstTokenConstraint,
    gather_logprobs,
    restrict_to_allowed,
)
from lit_grpo.risk.head import (
    RiskHead,
    RiskHeadSpec,
    binomial_cdf,
    confidence_features,
    cvar,
    error_probability,
    expected_calibration_error,
    first_token_constraints,
    forced_defer,
    learn_then_test,
    reliability_bins,
    risk_loss,
    selective_error,
    two_hot,
    value_rule_defers,
)

ATOMS = torch.tensor([-1.0, 0.0, 1.0])


def test_two_hot_keeps_the_expectation_and_clips_to_the_support():
    target = two_hot(torch.tensor([0.5, -1.0, 3.0, -0.25, 1.0]), ATOMS)
    expected = torch.tensor([[0, 0.5, 0.5], [1, 0, 0], [0, 0, 1], [0.25, 0.75, 0], [0, 0, 1]])
    assert torch.equal(target, expected)


def test_risk_loss_is_the_cross_entropy_against_the_two_hot_target():
    assert risk_loss(torch.zeros(1, 3), torch.tensor([0.5]), ATOMS).item() == pytest.approx(math.log(3), abs=1e-6)
    # logits [1, 0, 0]: log p = [1 - log(e + 2), -log(e + 2), -log(e + 2)]; return -1 -> target [1, 0, 0]
    logits = torch.tensor([[1.0, 0.0, 0.0], [0.0, 2.0, 0.0]])
    # second row: log p(atom 1) = 2 - log(e^2 + 2), return 0.5 -> half on atom 1, half on atom 2 (-log(e^2 + 2))
    first = -(1 - math.log(math.e + 2))
    second = -(0.5 * (2 - math.log(math.e**2 + 2)) + 0.5 * -math.log(math.e**2 + 2))
    loss = risk_loss(logits, torch.tensor([-1.0, 0.5]), ATOMS)
    assert loss.item() == pytest.approx((first + second) / 2, abs=1e-6)
    assert risk_loss(torch.zeros(0, 3, requires_grad=True), torch.zeros(0), ATOMS).item() == 0.0


def test_error_probability():
    probs = torch.tensor([[0.2, 0.3, 0.5]])
    assert error_probability(probs, ATOMS, 0.0).item() == pytest.approx(0.2)  # only the atom below 0
    assert error_probability(probs, ATOMS, 0.5).item() == pytest.approx(0.5)  # atoms -1 and 0


def test_a_fresh_head_is_uniform_over_its_atoms():
    head = RiskHead(4, RiskHeadSpec(v_min=-1, v_max=1, num_atoms=5, success_threshold=0.0))
    # atoms -1, -0.5, 0, 0.5, 1: two of five are below 0
    assert head.error_probability(torch.randn(3, 6)).tolist() == pytest.approx([0.4] * 3)  # hidden 4 + confidence 2


def test_the_rule_forces_a_defer_exactly_where_p_error_exceeds_tau():
    p_error = torch.tensor([0.0, 0.1, 0.1000001, 0.5, 1.0])
    assert forced_defer(p_error, 0.1).tolist() == [False, False, True, True, True]
    assert forced_defer(p_error, 1.0).tolist() == [False] * 5
    assert forced_defer(p_error, 0.0).tolist() == [False, True, True, True, True]
    assert forced_defer(p_error, None).tolist() == [True] * 5  # the always-defer state, unlike tau = 0
    assert first_token_constraints(torch.tensor([True, False]), [7]) == ((7,), None)


def test_cvar_is_the_mean_of_the_worst_mass_and_the_expectation_at_level_0():
    probs = torch.tensor([[0.2, 0.3, 0.5]])
    assert cvar(probs, ATOMS, 0.0).item() == pytest.approx(0.3, abs=1e-7)  # -0.2 + 0.5
    assert cvar(probs, ATOMS, 0.5).item() == pytest.approx(-0.4, abs=1e-7)  # (0.2 * -1 + 0.3 * 0) / 0.5
    assert cvar(probs, ATOMS, 0.9).item() == pytest.approx(-1.0, abs=1e-7)  # the worst 0.1 is all at -1
    # worst 0.6: 0.2 at -1, 0.3 at 0, 0.1 at 1 -> (-0.2 + 0.1) / 0.6
    assert cvar(probs, ATOMS, 0.4).item() == pytest.approx(-0.1 / 0.6, abs=1e-7)
    with pytest.raises(ValueError, match="CVaR level"):
        cvar(probs, ATOMS, 1.0)


def test_the_value_rule_defers_where_deferring_is_worth_more_and_risk_aversion_changes_the_choice():
    # inferring: +1 or -1 at 0.7 / 0.3 (mean 0.4); deferring: 0 for sure (mean 0)
    infer, defer = torch.tensor([0.3, 0.0, 0.7]), torch.tensor([0.0, 1.0, 0.0])
    probs = torch.stack([torch.stack([infer, defer]), torch.stack([defer, infer])])  # [2, 2, 3]
    assert value_rule_defers(probs, ATOMS, 0.0).tolist() == [False, True]  # 0.4 >= 0; 0 < 0.4
    # the worst half: inferring (0.3 * -1 + 0.2 * 1) / 0.5 = -0.2 < 0: a risk-averse rule asks
    assert value_rule_defers(probs, ATOMS, 0.5).tolist() == [True, False]
    tie = torch.stack([defer, defer]).unsqueeze(0)
    assert value_rule_defers(tie, ATOMS, 0.0).tolist() == [False]  # a tie infers


def test_confidence_features_are_the_top_log_prob_and_the_entropy():
    features = confidence_features(torch.tensor([[0.0, math.log(3)]]))
    entropy = -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))
    assert features.tolist()[0] == pytest.approx([math.log(0.75), entropy], abs=1e-6)


def test_the_head_has_an_infer_and_a_defer_branch():
    head = RiskHead(2, RiskHeadSpec(v_min=-1, v_max=1, num_atoms=3))
    with torch.no_grad():
        head.linear.bias.copy_(torch.tensor([2.0, 0.0, 0.0, 0.0, 0.0, 5.0]))  # infer: atom -1 likely; defer: +1
    logits = head(torch.zeros(4, 4))  # hidden 2 + the two confidence features
    assert logits.shape == (4, 2, 3)
    e2 = math.exp(2)
    assert head.error_probability(torch.zeros(1, 4)).item() == pytest.approx(e2 / (e2 + 2), abs=1e-6)
    assert torch.equal(logits[0, 1], torch.tensor([0.0, 0.0, 5.0]))


def test_selective_error_and_ece():
    errors = torch.tensor([True, False, False, True])
    covered = torch.tensor([True, True, False, False])
    assert selective_error(errors, covered) == 0.5
    assert selective_error(errors, torch.zeros(4, dtype=torch.bool)) is None
    # two equal-mass bins: {0.1, 0.2} predicted 0.15, observed 0.5; {0.8, 0.9} predicted 0.85, observed 1
    p = torch.tensor([0.9, 0.1, 0.8, 0.2])
    errors = torch.tensor([True, False, True, True])
    assert expected_calibration_error(p, errors, num_bins=2) == pytest.approx(0.35 * 0.5 + 0.15 * 0.5, abs=1e-7)
    # three bins of 2, 1, 1 (sizes differ by at most one): |0.15 - 0.5| * 2/4 + |0.8 - 1| / 4 + |0.9 - 1| / 4
    assert expected_calibration_error(p, errors, num_bins=3) == pytest.approx(0.175 + 0.05 + 0.025, abs=1e-7)
    assert reliability_bins(p, errors, 2) == [pytest.approx((0.15, 0.5, 2)), pytest.approx((0.85, 1.0, 2))]
    assert expected_calibration_error(torch.zeros(0), torch.zeros(0, dtype=torch.bool)) == 0


def test_restricted_first_token_renormalises_over_the_allowed_ids_only():
    logits = torch.tensor([[[0.0, 1.0, 2.0, 3.0], [0.5, 0.0, 0.0, 0.0], [1.0, 2.0, 0.0, 0.0]]] * 3)  # [3, 3, 4]
    tokens = torch.tensor([[0, 2, 1], [0, 2, 1], [0, 3, 0]])  # [3, 3]: the token after position t is tokens[t]
    # row 0: decision column 2 (predicted at position 1) restricted to {2}; row 1: to {1, 2}; row 2: free
    constraint = FirstTokenConstraint(torch.tensor([2, 2, 2]), torch.tensor([[2, -1], [1, 2], [-1, -1]]))
    rows, positions = torch.arange(3).repeat_interleave(3), torch.arange(3).repeat(3)  # [9]: every (row, position)
    allowed = constraint.at(rows, positions + 1)  # [9, 2]: position t predicts column t + 1
    flat = restrict_to_allowed(logits.reshape(9, 4), allowed)  # [9, 4]
    logp = gather_logprobs(flat, tokens.reshape(9)).view(3, 3)
    free = gather_logprobs(logits, tokens)
    assert logp[0, 1].item() == 0.0  # one allowed id: probability 1
    assert logp[1, 1].item() == pytest.approx(math.log(0.5), abs=1e-7)  # ids 1 and 2 tie at logit 0
    assert torch.equal(logp[2], free[2])
    assert torch.equal(logp[:, [0, 2]], free[:, [0, 2]])  # other positions untouched


def test_the_risk_loss_is_scaled_by_its_own_step_count_of_inferring_rows():
    # issue 18, bug 4: the risk head's loss took the policy aggregation's share of the step; it takes its own: the
    # minibatch's inferring rows over the step's
    from lit_grpo.policy.head_losses import head_losses

    spec = RiskHeadSpec(v_min=-1.0, v_max=1.0, num_atoms=3, coef=2.0, detach=False)
    risk = (RiskHead(2, spec), spec.coef)  # zero weights: uniform over the atoms -1, 0, 1
    output_head = torch.nn.Linear(2, 5)  # only read for the two confidence features
    hidden = torch.zeros(2, 3, 2)
    batch = {"inferred": torch.tensor([True, False]), "decision_index": torch.tensor([1, 1]),
             "rewards": torch.tensor([0.5, -1.0]), "step_risk_rows": torch.tensor(4.0),
             "step_denominator": torch.tensor(2.0)}
    scaled, unscaled, _ = head_losses(hidden, batch, output_head, risk, None)
    # one inferring row, return 0.5: target [0, 0.5, 0.5] against uniform -> cross-entropy log 3, weighted x 2;
    # the step's 4 inferring rows: 2 log 3 x 1/4 (by the policy's share, 2 rows of 2, it was 2 log 3 x 1)
    assert unscaled.item() == pytest.approx(2 * math.log(3), abs=1e-6)
    assert scaled.item() == pytest.approx(2 * math.log(3) / 4, abs=1e-6)
    batch["step_risk_rows"] = torch.tensor(0.0)  # no inferring row in the step: no term at all
    assert head_losses(hidden, batch, output_head, risk, None)[0].item() == 0.0


def test_binomial_cdf_by_hand():
    assert binomial_cdf(1, 3, 0.5) == 0.5  # (1 + 3) / 8
    assert binomial_cdf(2, 10, 0.1) == pytest.approx(0.9**10 + 10 * 0.1 * 0.9**9 + 45 * 0.01 * 0.9**8, rel=1e-12)
    assert binomial_cdf(-1, 5, 0.1) == 0.0 and binomial_cdf(7, 5, 0.1) == 1.0


def test_learn_then_test_certifies_up_to_the_first_candidate_that_fails():
    curve = [(0.3, 2, 10), (0.1, 0, 30), (0.2, 1, 40)]  # given out of order: tested from the smallest tau
    tau, p_values = learn_then_test(curve, alpha=0.1, delta=0.1)
    expected = [0.9**30, 0.9**40 + 40 * 0.1 * 0.9**39, 0.9**10 + 10 * 0.1 * 0.9**9 + 45 * 0.01 * 0.9**8]
    assert p_values == pytest.approx(expected, rel=1e-12) and tau == 0.2  # 0.042, 0.080 <= 0.1 < 0.930
    assert learn_then_test(curve, alpha=0.1, delta=0.05)[0] == 0.1  # 0.080 > 0.05 stops after the first
    # a later candidate that would pass is never reached once one fails (fixed sequence), and nothing covered fails
    assert learn_then_test([(0.1, 0, 0), (0.2, 0, 100)], alpha=0.1, delta=0.1) == (None, [1.0, 0.9**100])
