"""Do torch and the in-process vLLM engine fight over the cores? Torch's threads, the process's CPU affinity and the
packed forward+backward time (fewshot-bench, median of 7) before and after a ``VLLMEngine`` starts in the process,
with each engine's generation time for the same 8 prompts x 8 completions.

    flock /tmp/heavy.lock .venv/bin/python benchmarks/threads.py
"""

from __future__ import annotations

import os
import statistics
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import step_time  # noqa: E402  (the workloads and their rollouts)

from lit_grpo.engines import HFEngine, SamplingSpec, VLLMEngine  # noqa: E402
from lit_grpo.model_loading import load_policy, load_tokenizer  # noqa: E402
from lit_grpo.packed import packed_logprobs  # noqa: E402


def median_ms(action: Any) -> float:
    action()  # warm-up
    return 1000 * statistics.median(step_time.timed(action) for _ in range(7))


def main() -> None:
    tokenizer = load_tokenizer(step_time.MODEL)
    policy = load_policy(step_time.MODEL, 16, 32, 0.0, step_time.TARGETS)
    spec = SamplingSpec(max_new_tokens=6, temperature=1.0, seed=0, stop_token_ids=(tokenizer.eos_token_id,))
    hf = HFEngine()
    hf.push_policy(policy)
    hf_generate, buffer = step_time.rollouts("fewshot-bench", tokenizer, hf, spec)

    def forward_backward() -> None:
        policy.zero_grad()
        logp = packed_logprobs(policy, buffer.input_ids, buffer.attention_mask, buffer.completion_mask)
        (logp * buffer.completion_mask).sum().backward()

    def state() -> str:
        return (f"torch threads {torch.get_num_threads()}, interop {torch.get_num_interop_threads()}, "
                f"affinity {sorted(os.sched_getaffinity(0))}, forward+backward {median_ms(forward_backward):.0f} ms")

    print(f"before vLLM: {state()}; hf generation {median_ms(hf_generate):.0f} ms", flush=True)
    vllm = VLLMEngine()
    vllm.push_policy(policy)
    vllm_generate, _ = step_time.rollouts("fewshot-bench", tokenizer, vllm, spec)
    try:
        print(f"after vLLM started: {state()}; vLLM generation {median_ms(vllm_generate):.0f} ms, "
              f"hf generation {median_ms(hf_generate):.0f} ms")
    finally:
        vllm.close()


if __name__ == "__main__":
    main()
