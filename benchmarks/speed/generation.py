"""Generation at Qwen2.5-0.5B width (issue 15): the output head's product plain and packed, and one decode step of
the hf engine against transformers' ``generate``.

On the random 2-layer model of ``benchmarks/memory/memory.py`` (hidden 896, vocab 151,936, tied head) with a LoRA
adapter
(r 16, every linear), 1 prompt of 32 tokens x 4 completions, no stop token. Rows:

- ``head``: ``[4, 896] x [896, 151,936]``, plain ``F.linear`` and on oneDNN's packed weight, median of 20 (``nan``
  where this CPU does not pack the dtype: bf16 without AVX-512 or avx_ne_convert);
- ``engine``: ``HFEngine.generate`` with and without packing, milliseconds per generated token step (the whole
  call, prefill and packing included, divided by the steps; "with packing" decodes unpacked the dtypes this CPU
  does not pack, as a training run does);
- ``transformers generate``: plain sampling (top-k 0, blank generation config), the engine's previous path.

Every process fixes glibc's mmap threshold as the ``lit-grpo`` command does (``lit_grpo.run.host_memory``). Run alone:

    flock /tmp/heavy.lock .venv/bin/python benchmarks/speed/generation.py --steps 512
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the checkout, for benchmarks.*
from benchmarks.memory import memory  # noqa: E402  (the width model)

from lit_grpo.engines import HFEngine, SamplingSpec
from lit_grpo.engines.cpu_weights import packed_linear, packing_refusal
from lit_grpo.policy.model_loading import load_policy
from lit_grpo.run.host_memory import return_freed_memory

PROMPT, ROWS = list(range(100, 132)), 4


def median_ms(call: Any, repeats: int = 20) -> float:
    call()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


def head_ms(policy: Any) -> tuple[float, float]:
    """Plain and packed milliseconds of the head's product for ``ROWS`` rows (packed: NaN where this CPU does not
    pack the dtype, e.g. bf16 without AVX-512; the engine then decodes that dtype unpacked)."""
    weight = policy.get_base_model().get_output_embeddings().weight.detach()
    hidden = torch.randn(ROWS, weight.shape[1], dtype=weight.dtype)
    with torch.no_grad():
        plain = median_ms(lambda: torch.nn.functional.linear(hidden, weight))
        if packing_refusal(weight.dtype) is not None:
            return plain, float("nan")
        packed = torch.ops.mkldnn._reorder_linear_weight(weight, None)
        return plain, median_ms(lambda: packed_linear(packed, None, hidden))


def engine_ms(policy: Any, steps: int, pack: bool) -> float:
    engine = HFEngine(pack_cpu_weights=pack)
    engine.push_policy(policy)
    start = time.perf_counter()
    (group,) = engine.generate([PROMPT], ROWS, SamplingSpec(max_new_tokens=steps, seed=0))
    assert all(len(c.token_ids) == steps for c in group)
    return 1000 * (time.perf_counter() - start) / steps


def transformers_ms(policy: Any, steps: int) -> float:
    from transformers import GenerationConfig

    config = GenerationConfig(do_sample=True, top_k=0, top_p=1.0, temperature=1.0, max_new_tokens=steps,
                              min_new_tokens=steps, num_return_sequences=ROWS, pad_token_id=0)
    ids = torch.tensor([PROMPT])
    start = time.perf_counter()
    with torch.no_grad():
        policy.generate(input_ids=ids, attention_mask=torch.ones_like(ids), generation_config=config)
    return 1000 * (time.perf_counter() - start) / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=512)
    parser.add_argument("--dtypes", nargs="+", default=["bfloat16", "float32"])
    parser.add_argument("--model-dir", type=Path, default=Path(tempfile.gettempdir()) / "lit-grpo-memory-models")
    args = parser.parse_args()
    return_freed_memory()
    path = memory.model_path(args.model_dir, 2)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; {ROWS} rows x {args.steps} steps")
    print("| dtype | head plain ms | head packed ms | engine packed ms/step | engine plain ms/step | "
          "transformers generate ms/step |")
    print("|---|---|---|---|---|---|")
    for dtype in args.dtypes:
        torch.manual_seed(0)
        policy = load_policy(str(path), 16, 32, 0.0, "all-linear", dtype=dtype).eval()
        plain, packed = head_ms(policy)
        row = [engine_ms(policy, args.steps, True), engine_ms(policy, args.steps, False),
               transformers_ms(policy, args.steps)]
        print(f"| {dtype} | {plain:.1f} | {packed:.1f} | " + " | ".join(f"{v:.1f}" for v in row) + " |", flush=True)


if __name__ == "__main__":
    main()
