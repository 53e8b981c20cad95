"""Rollout generation speed: standalone vLLM, vLLM inside the loop (policy push included), and the hf engine.

Same prompts and the same LoRA policy (a non-zero adapter on the shipped tiny model) for all three; runs alternate
so that machine noise hits each alike. Prints the median and the spread (min-max) of each, in seconds per batch.

    .venv/bin/python benchmarks/speed/rollout.py [--prompts 32] [--group-size 8] [--runs 5] [--strategy merged]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

import torch  # noqa: E402

from lit_grpo.engines import HFEngine, SamplingSpec, VLLMEngine  # noqa: E402
from lit_grpo.policy.model_loading import load_policy
from lit_grpo.run.model_files import load_tokenizer
from lit_grpo.tasks import ArithmeticTask  # noqa: E402

MODEL = str(Path(__file__).resolve().parents[2] / "data" / "tiny-llama")


def timed(action: Callable[[], object]) -> float:
    start = time.perf_counter()
    action()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=6)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--strategy", choices=["merged", "adapter"], default="merged")
    args = parser.parse_args()

    tokenizer = load_tokenizer(MODEL)
    policy = load_policy(MODEL, 16, 32, 0.0, "all-linear")
    torch.manual_seed(0)
    with torch.no_grad():
        for name, param in policy.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.01)
    records = ArithmeticTask().train_records()[: args.prompts]
    prompts = [tokenizer(r["prompt"])["input_ids"] for r in records]
    spec = SamplingSpec(max_new_tokens=args.max_new_tokens, temperature=1.0, seed=0,
                        stop_token_ids=(tokenizer.eos_token_id,))
    vllm_engine = VLLMEngine(push_strategy=args.strategy, kv_cache_gib=0.5, max_model_len=64)
    hf_engine = HFEngine()
    start_up = timed(lambda: vllm_engine.push_policy(policy))
    hf_engine.push_policy(policy)
    vllm_engine.generate(prompts, args.group_size, spec)  # warm-up: first-call costs are start-up, not steady state
    hf_engine.generate(prompts, args.group_size, spec)

    def in_loop() -> None:
        vllm_engine.push_policy(policy)
        vllm_engine.generate(prompts, args.group_size, spec)

    times: dict[str, list[float]] = {"vllm standalone": [], "vllm in loop (push + generate)": [], "hf engine": []}
    for _ in range(args.runs):
        times["vllm standalone"].append(timed(lambda: vllm_engine.generate(prompts, args.group_size, spec)))
        times["vllm in loop (push + generate)"].append(timed(in_loop))
        times["hf engine"].append(timed(lambda: hf_engine.generate(prompts, args.group_size, spec)))
    vllm_engine.close()

    completions = args.prompts * args.group_size
    print(f"{completions} completions per batch (<= {args.max_new_tokens} new tokens), strategy {args.strategy}, "
          f"{args.runs} alternating runs; vLLM start-up + first push {start_up:.1f} s")
    print(f"{'':32} {'median s':>9} {'min':>7} {'max':>7}")
    for name, values in times.items():
        print(f"{name:32} {statistics.median(values):9.3f} {min(values):7.3f} {max(values):7.3f}")
    ratio = statistics.median(times["vllm in loop (push + generate)"]) / statistics.median(times["vllm standalone"])
    print(f"in-loop / standalone: {ratio:.2f}x; hf / in-loop: "
          f"{statistics.median(times['hf engine']) / statistics.median(times['vllm in loop (push + generate)']):.2f}x")


if __name__ == "__main__":
    main()
