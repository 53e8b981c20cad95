"""The tool path on a CUDA device (issue 48): the token rule over real tool episodes (``tests/tool_episodes_check.py``
with the hf engine, trees, the Trainer on the GPU), and the hf engine's turn cache against a full prefill on CUDA
(the same tokens, log-probs within 1e-5). Prints one JSON line per check.

    python benchmarks/gpu/gpu_tool_check.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from lit_grpo.engines import HFEngine, SamplingSpec  # noqa: E402
from lit_grpo.policy.model_loading import load_policy  # noqa: E402


def turn_cache_on_cuda() -> dict[str, float]:
    policy = load_policy(str(ROOT / "data" / "tiny-qwen2-tools"), 8, 16, 0.0, "all-linear").to("cuda").eval()
    prompts = [[151, 9, 20, 33, 401, 17], [151, 44, 12], [151, 5, 6, 7, 8, 9, 10, 11]]
    reply = [32702, 198, 17, 32703, 198]
    second = {}
    for keep in (True, False):
        engine = HFEngine(keep_turn_cache=keep)
        engine.push_policy(policy)
        first = engine.generate(prompts, 2, SamplingSpec(max_new_tokens=12, seed=3, next_turn=True))
        contexts = [p + list(c.token_ids) + reply for p, group in zip(prompts, first) for c in group]
        second[keep] = engine.generate(contexts, 2, SamplingSpec(max_new_tokens=12, seed=4))
    pairs = [(a, b) for ga, gb in zip(second[True], second[False]) for a, b in zip(ga, gb)]
    return {"device": torch.cuda.get_device_name(), "rows": len(pairs),
            "same_tokens": sum(a.token_ids == b.token_ids for a, b in pairs),
            "max_logprob_diff": max(abs(x - y) for a, b in pairs for x, y in zip(a.logprobs, b.logprobs))}


def main() -> None:
    print("TURN_CACHE " + json.dumps(turn_cache_on_cuda()), flush=True)
    done = subprocess.run([sys.executable, str(ROOT / "tests" / "tool_episodes_check.py"), "hf", "tree", "/tmp/gte"],
                          capture_output=True, text=True, cwd=ROOT / "tests",
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    figures = [line for line in done.stdout.splitlines() if line.startswith("FIGURES ")]
    print("TOOL_EPISODES " + (figures[-1][8:] if figures else f"failed: {done.stderr[-2000:]}"), flush=True)


if __name__ == "__main__":
    main()
