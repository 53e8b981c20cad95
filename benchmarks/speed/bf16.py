"""bf16 autocast against fp32 for the training forward+backward on issue 10's workloads: time and log-prob error.

One rollout batch per workload (64 rows from the shipped tiny model); the forward+backward of the sum of completion
log-probs runs in fp32 and under ``torch.autocast("cpu", dtype=torch.bfloat16)`` (fp32 master weights), packed and
padded, each the median of 7 timings after a warm-up. The error is the largest difference of a completion token's
log-prob from the fp32 forward's.

    flock /tmp/heavy.lock .venv/bin/python benchmarks/speed/bf16.py
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the checkout, for benchmarks.*
from benchmarks.speed import step_time  # noqa: E402  (the workloads and their rollouts)

from lit_grpo.policy.logprobs import sequence_logprobs  # noqa: E402
from lit_grpo.policy.packed import packed_logprobs  # noqa: E402


def forward_backward(policy: Any, buffer: Any, packed: bool, bf16: bool) -> torch.Tensor:
    """One training forward+backward; the completion log-probs it computed ``[N, L]``."""
    ids, mask, counted = buffer.input_ids, buffer.attention_mask, buffer.completion_mask
    policy.train()
    policy.zero_grad()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        logp = packed_logprobs(policy, ids, mask, counted) if packed else sequence_logprobs(policy, ids, mask)
    (logp.float() * counted).sum().backward()
    return logp.detach().float() * counted


def main() -> None:
    flags = set(Path("/proc/cpuinfo").read_text().split()) if Path("/proc/cpuinfo").exists() else set()
    bf16_flags = sorted(flags & {"avx512_bf16", "amx_bf16"}) or "none"
    print(f"CPU bf16 flags: {bf16_flags}; torch threads {torch.get_num_threads()}")
    print("| workload | forward | fp32 ms | bf16 autocast ms | max abs log-prob error |")
    print("|---|---|---|---|---|")
    for workload in ("arith-bench", "fewshot-bench"):
        tokenizer, policy, spec = step_time.policy_and_spec(workload)
        _, buffer = step_time.hf_rollouts(workload, tokenizer, policy, spec)
        for packed in (True, False):
            exact = forward_backward(policy, buffer, packed, bf16=False)
            times, error = {}, 0.0
            for bf16 in (False, True):
                error = max(error, float((forward_backward(policy, buffer, packed, bf16) - exact).abs().max()))
                times[bf16] = statistics.median(
                    step_time.timed(lambda: forward_backward(policy, buffer, packed, bf16)) for _ in range(7))
            print(f"| {workload} | {'packed' if packed else 'padded'} | {1000 * times[False]:.0f} | "
                  f"{1000 * times[True]:.0f} | {error:.3g} |", flush=True)


if __name__ == "__main__":
    main()
