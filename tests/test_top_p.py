"""``data.evaluation.top_p`` (issue 59): nucleus sampling for a sampled evaluation, by hand on the hf engine's
sampler, carried by ``SamplingSpec`` to every engine (the hf decode, vLLM's SamplingParams, the server's request),
refused out of (0, 1], and never used by training rollouts (top-p 1)."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch

from lit_grpo.engines import HFEngine, SamplingSpec
from lit_grpo.engines.hf_decode import nucleus
from lit_grpo.engines.server_answers import completion_request
from lit_grpo.errors import InputError
from lit_grpo.rollout.datamodule import RolloutDataModule
from lit_grpo.rollout.sampled import SampledEvaluation, sampling_of

PROMPTS = [[1, 21, 22, 15, 23, 24, 33], [1, 25, 15, 26, 33]]


def test_the_nucleus_keeps_the_fewest_likeliest_tokens_reaching_top_p_by_hand():
    logp = torch.tensor([[0.2, 0.5, 0.3], [0.5, 0.3, 0.2]]).log()  # [2, 3], the second row in rank order
    kept = nucleus(logp, 0.75).exp()
    # row 0: ranked 0.5 (mass above it 0), 0.3 (above 0.5 < 0.75: kept, the token that reaches top_p), 0.2 (above
    # 0.8): 0.5 and 0.3 renormalised, 0.5 / 0.8 and 0.3 / 0.8
    assert torch.allclose(kept, torch.tensor([[0.0, 0.625, 0.375], [0.625, 0.375, 0.0]]), rtol=0, atol=1e-6)
    assert torch.equal(nucleus(logp, 0.45).exp() > 0, torch.tensor([[False, True, False], [True, False, False]]))
    assert torch.allclose(nucleus(logp, 0.85).exp(), logp.exp(), rtol=0, atol=1e-6)  # 0.8 < 0.85: all three
    assert nucleus(logp, 1.0) is logp


def test_a_tiny_top_p_on_the_hf_engine_draws_the_greedy_tokens(tiny_llama_dir):
    from lit_grpo.policy.model_loading import load_policy

    policy = load_policy(str(tiny_llama_dir), 4, 8, 0.0, "all-linear").eval()
    engine = HFEngine()
    engine.push_policy(policy)
    greedy = engine.generate(PROMPTS, 1, SamplingSpec(max_new_tokens=5, greedy=True))
    sampled = engine.generate(PROMPTS, 3, SamplingSpec(max_new_tokens=5, temperature=1.0, seed=0, top_p=1e-6))
    full = engine.generate(PROMPTS, 3, SamplingSpec(max_new_tokens=5, temperature=1.0, seed=0))
    for (one,), three, unrestricted in zip(greedy, sampled, full):
        assert all(c.token_ids == one.token_ids for c in three)
        assert all(lp == 0.0 for c in three for lp in c.logprobs)  # drawn from a nucleus of one token
        assert any(c.token_ids != one.token_ids for c in unrestricted)  # without it the draws differ


def test_every_engine_is_asked_for_the_specs_top_p():
    spec = SamplingSpec(max_new_tokens=3, temperature=0.7, seed=1, top_p=0.9)
    assert completion_request("p", [1], 2, spec, index=0)["top_p"] == 0.9
    assert completion_request("p", [1], 1, replace(spec, greedy=True), index=0)["top_p"] == 1.0


@pytest.mark.slow  # imports vLLM (seconds)
def test_the_vllm_engine_asks_for_the_specs_top_p():
    spec = SamplingSpec(max_new_tokens=3, temperature=0.7, seed=1, top_p=0.9)
    pytest.importorskip("vllm")
    from lit_grpo.engines.vllm_engine import VLLMEngine

    params = VLLMEngine()._params(2, spec, 0)  # the SamplingParams of a request (no engine is started)
    assert math.isclose(params.top_p, 0.9) and params.temperature == 0.7
    assert VLLMEngine()._params(1, replace(spec, greedy=True), 0).top_p == 1.0


def test_the_evaluations_top_p_reaches_its_sampling_and_training_keeps_the_whole_distribution():
    greedy = SamplingSpec(max_new_tokens=4, greedy=True, stop_token_ids=(2,))
    sampling = sampling_of(SampledEvaluation(samples=2, temperature=0.5, top_p=0.75), greedy, [{"prompt": "1+2="}])
    assert (sampling.greedy, sampling.temperature, sampling.top_p, sampling.stop_token_ids) == (False, 0.5, 0.75, (2,))
    assert SamplingSpec(max_new_tokens=4).top_p == 1.0  # what the data module's training rollouts build
    for bad in (0.0, 1.5):
        with pytest.raises(InputError, match=rf"evaluation.top_p: must be within \(0, 1\] \(1: the whole "
                                             rf"distribution\), got {bad}"):
            RolloutDataModule(evaluation={"samples": 2, "top_p": bad})
