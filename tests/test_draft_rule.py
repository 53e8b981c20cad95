"""The draft-reading risk rule (issue 35): its features, head and decisions, by hand on constructed states."""

from __future__ import annotations

import math

import torch

from lit_grpo.policy.logprobs import sequence_logprobs
from lit_grpo.policy.model_loading import load_policy
from lit_grpo.policy.risk_features import draft_features
from lit_grpo.risk.draft import DraftRule, LogisticHead, draft_confidences


def test_draft_confidences_are_the_sum_the_smallest_and_the_first_log_prob():
    got = draft_confidences([torch.tensor([-0.1, -2.0, -0.5]), torch.tensor([-0.3]), torch.tensor([])])
    assert torch.equal(got, torch.tensor([[-2.6, -2.0, -0.1], [-0.3, -0.3, -0.3], [0.0, 0.0, 0.0]]))


def head_with(weight: list[float], bias: float) -> LogisticHead:
    head = LogisticHead()
    head.mean, head.std = torch.zeros(len(weight), dtype=torch.float64), torch.ones(len(weight), dtype=torch.float64)
    head.weight, head.bias = torch.tensor(weight, dtype=torch.float64), torch.tensor(bias, dtype=torch.float64)
    return head


def test_p_error_is_the_sigmoid_of_the_standardised_score():
    head = head_with([2.0, -1.0], -1.0)
    head.mean, head.std = torch.tensor([1.0, 0.0], dtype=torch.float64), torch.tensor([2.0, 1.0], dtype=torch.float64)
    # (3 - 1) / 2 * 2 - 1 * 0 - 1 = 1;  (1 - 1) / 2 * 2 - 1 * 1 - 1 = -2
    got = head.p_error(torch.tensor([[3.0, 0.0], [1.0, 1.0]]))
    assert got.tolist() == [float(torch.tensor(1 / (1 + math.exp(-1)))), float(torch.tensor(1 / (1 + math.exp(2))))]


def test_a_fitted_head_is_neutral_on_uninformative_features_and_ranks_informative_ones():
    flat = LogisticHead().fit(torch.tensor([[-1.0], [1.0], [-1.0], [1.0]]), torch.tensor([False, True, True, False]))
    assert torch.allclose(flat.p_error(torch.tensor([[-1.0], [1.0]])), torch.tensor([0.5, 0.5]), atol=1e-6)
    x = torch.tensor([[0.0], [1.0], [2.0], [3.0], [4.0], [5.0]])
    ranked = LogisticHead().fit(x, torch.tensor([False, False, True, False, True, True]))
    p = ranked.p_error(x)
    assert torch.all(p[1:] > p[:-1]) and p[0] < 0.5 < p[-1]


def test_the_rule_commits_below_tau_asks_above_and_always_commits_at_the_last_round():
    features = torch.tensor([[-2.0], [0.0], [0.5], [3.0]])  # p = sigmoid(x): 0.119, 0.5, 0.622, 0.953
    seen = []

    def drafter(contexts):
        seen.append(contexts)
        return features[: len(contexts)]

    rule = DraftRule(drafter, head_with([1.0], 0.0), tau=0.5, defer_token_ids=[35], answer_token_ids=[16, 17],
                     last_round=3)
    contexts = [[1, 2], [1, 3], [1, 4], [1, 5]]
    assert rule(contexts, 1) == ((16, 17), (16, 17), (35,), (35,))  # p = 0.5 is not above tau: commit
    assert seen == [contexts]
    assert rule(contexts, 3) == ((16, 17),) * 4 and len(seen) == 1  # no draft needed where it cannot ask


def test_draft_features_read_the_policy_at_the_draft(tiny_llama_dir):
    policy = load_policy(str(tiny_llama_dir), 4, 8, 0.0, "all-linear")
    contexts, drafts = [[1, 21, 15, 22, 33], [1, 23, 33]], [[24, 25], [26]]
    got = draft_features(policy, contexts, drafts, pad_id=0)  # [2, H + 3]
    assert got.shape == (2, policy.config.hidden_size + 3)
    for row, (context, draft) in enumerate(zip(contexts, drafts)):
        ids = torch.tensor([context + draft])
        with torch.no_grad():
            logp = sequence_logprobs(policy, ids, torch.ones_like(ids))[0, len(context):]  # [S]
            hidden = policy(input_ids=ids, output_hidden_states=True).hidden_states[-1][0, -1]  # [H]
        assert torch.allclose(got[row, -3:], torch.stack([logp.sum(), logp.min(), logp[0]]), atol=1e-5)
        assert torch.allclose(got[row, :-3], hidden, atol=1e-5)
