"""The risk head's math, the infer/defer rule and tau's calibration, on hand-computed examples."""

from __future__ import annotations

import math

import pytest
import torch

from lit_grpo.logprobs import (
    FirstTokenConstraint,
    gather_logprobs,
    restrict_to_allowed,
)
from lit_grpo.risk import (
    RiskHead,
    RiskHeadSpec,
    binomial_cdf,
    calibrate_tau,
    learn_then_test,
    error_probability,
    expected_calibration_error,
    first_token_constraints,
    forced_defer,
    risk_loss,
    selective_error,
    two_hot,
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
    assert head.error_probability(torch.randn(3, 4)).tolist() == pytest.approx([0.4] * 3)


def test_the_rule_forces_a_defer_exactly_where_p_error_exceeds_tau():
    p_error = torch.tensor([0.0, 0.1, 0.1000001, 0.5, 1.0])
    assert forced_defer(p_error, 0.1).tolist() == [False, False, True, True, True]
    assert forced_defer(p_error, 1.0).tolist() == [False] * 5
    assert forced_defer(p_error, 0.0).tolist() == [False, True, True, True, True]
    assert forced_defer(p_error, None).tolist() == [True] * 5  # the always-defer state, unlike tau = 0
    assert first_token_constraints(torch.tensor([True, False]), [7]) == ((7,), None)


def test_calibration_picks_the_largest_feasible_tau():
    # selective error grows with tau; coverage too. alpha 0.1 -> 0.3 (0.09) is the largest with error <= 0.1
    table = {0.1: (0.02, 0.2), 0.2: (0.05, 0.4), 0.3: (0.09, 0.55), 0.5: (0.12, 0.7), 1.0: (0.3, 1.0)}
    tau, curve = calibrate_tau(list(table), lambda t: table[t], alpha=0.1)
    assert tau == 0.3
    assert [point[0] for point in curve] == [0.1, 0.2, 0.3, 0.5, 1.0]
    # feasibility need not be monotone: the largest feasible wins even past an infeasible one
    table[0.5] = (0.1, 0.7)
    table[0.3] = (0.11, 0.55)
    assert calibrate_tau(list(table), lambda t: table[t], alpha=0.1)[0] == 0.5


def test_calibration_without_a_feasible_tau_is_the_always_defer_state():
    table = {0.0: (None, 0.0), 0.5: (0.2, 0.6), 1.0: (0.3, 1.0)}  # tau 0 covers nothing: undefined, not feasible
    tau, _ = calibrate_tau(list(table), lambda t: table[t], alpha=0.1)
    assert tau is None


def test_selective_error_and_ece():
    errors = torch.tensor([True, False, False, True])
    covered = torch.tensor([True, True, False, False])
    assert selective_error(errors, covered) == 0.5
    assert selective_error(errors, torch.zeros(4, dtype=torch.bool)) is None
    p = torch.tensor([0.1, 0.1, 0.9, 0.9])
    assert expected_calibration_error(p, torch.tensor([False, False, True, False])) == pytest.approx(0.25)


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
    from lit_grpo.module import PolicyModule

    spec = RiskHeadSpec(v_min=-1.0, v_max=1.0, num_atoms=3, coef=2.0)
    module = PolicyModule(risk=dict(v_min=-1.0, v_max=1.0, num_atoms=3, coef=2.0))
    module.risk_head = RiskHead(2, spec)  # zero weights: uniform over the atoms -1, 0, 1
    hidden = torch.zeros(2, 3, 2)
    batch = {"inferred": torch.tensor([True, False]), "decision_index": torch.tensor([1, 1]),
             "rewards": torch.tensor([0.5, -1.0]), "step_risk_rows": torch.tensor(4.0),
             "step_denominator": torch.tensor(2.0)}
    scaled, unscaled, _ = module.head_losses(hidden, batch)
    # one inferring row, return 0.5: target [0, 0.5, 0.5] against uniform -> cross-entropy log 3, weighted x 2;
    # the step's 4 inferring rows: 2 log 3 x 1/4 (by the policy's share, 2 rows of 2, it was 2 log 3 x 1)
    assert unscaled.item() == pytest.approx(2 * math.log(3), abs=1e-6)
    assert scaled.item() == pytest.approx(2 * math.log(3) / 4, abs=1e-6)
    batch["step_risk_rows"] = torch.tensor(0.0)  # no inferring row in the step: no term at all
    assert module.head_losses(hidden, batch)[0].item() == 0.0


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
