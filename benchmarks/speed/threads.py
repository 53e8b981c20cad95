"""Do torch and the in-process vLLM engine fight over the cores? Torch's threads, the process's CPU affinity and the
packed forward+backward time (fewshot-bench, median of 7) before and after a ``VLLMEngine`` starts in the process,
with each engine's generation time for the same 8 prompts x 8 completions.

    flock /tmp/heavy.lock .venv/bin/python benchmarks/speed/threads.py
"""

from __future__ import annotations

import os
import statistics
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the checkout, for benchmarks.*
from benchmarks.speed import step_time  # noqa: E402  (the workloads and their rollouts)

from lit_grpo.engines import VLLMEngine  # noqa: E402
from lit_grpo.policy.packed import packed_logprobs  # noqa: E402


def median_ms(action: Any) -> float:
    action()  # warm-up
    return 1000 * statistics.median(step_time.timed(action) for _ in range(7))


def main() -> None:
    tokenizer, policy, spec = step_time.policy_and_spec("fewshot-bench")
    hf_generate, buffer = step_time.hf_rollouts("fewshot-bench", tokenizer, policy, spec)

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
