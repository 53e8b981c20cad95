"""What entropy control costs a training step at Qwen2.5-0.5B width (issue 50): peak RSS and seconds of one forward
and backward of the policy's completion log-probs, with and without each token's entropy beside them.

Model: the random 2-layer Qwen2 of benchmarks/memory/memory.py (hidden 896, vocabulary 151,936, tied embeddings, bf16
files loaded in fp32), built there once under ``--model-dir``; LoRA r 16 on every linear layer. Rows: 8 of a 32-token
prompt and ``--tokens`` completion tokens (seeded random ids). One process per measurement: it builds the model,
runs one warm-up step and then the measured step, and prints its peak RSS (``ru_maxrss``, glibc's mmap threshold
set as the ``lit-grpo`` command sets it) and the measured step's seconds. ``--autograd-entropy`` computes the entropy
with autograd's softmax instead of the fused function, for comparison. The entropy is computed per 256-token chunk of the output head, beside the log-prob, and recomputed in
backward (``policy/logprobs.py``), so its cost is a chunk's softmax, not a ``[tokens, vocabulary]`` tensor.

    .venv/bin/python benchmarks/speed/entropy_cost.py [--tokens 512] [--model-dir DIR] [--entropy | --autograd-entropy]
"""

from __future__ import annotations

import argparse
import resource
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the checkout, for benchmarks.*
from benchmarks.memory.memory import model_path  # noqa: E402 - the shared random model of benchmarks/memory/memory.py


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--model-dir", type=Path, default=Path(tempfile.gettempdir()) / "lit-grpo-memory-models")
    parser.add_argument("--entropy", action="store_true", help="compute each token's entropy too")
    parser.add_argument("--autograd-entropy", action="store_true", help="the entropy by autograd's softmax")
    args = parser.parse_args()
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from lit_grpo.policy.packed import TokenLogprobs
    from lit_grpo.run.host_memory import return_freed_memory

    return_freed_memory()  # as the lit-grpo command does: freed buffers go back, so the peak is live memory
    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(model_path(args.model_dir, 2), dtype=torch.float32)
    policy = get_peft_model(base, LoraConfig(r=16, lora_alpha=32, target_modules="all-linear"))
    rows, prompt = 8, 32
    ids = torch.randint(0, base.config.vocab_size, (rows, prompt + args.tokens))
    attention = torch.ones_like(ids, dtype=torch.bool)
    counted = attention.clone()
    counted[:, :prompt] = False
    if args.autograd_entropy:  # the reference: log-softmax, then -sum(p log p), every op autograd's own
        import lit_grpo.policy.logprobs as logprobs

        class AutogradEntropy:
            @staticmethod
            def apply(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
                log_p = torch.log_softmax(logits, dim=-1)
                entropy = -(log_p.exp() * log_p).sum(-1)
                return torch.stack([log_p.gather(-1, targets[:, None]).squeeze(-1), entropy], dim=-1)

        logprobs.TokenLogSoftmaxEntropy = AutogradEntropy
        args.entropy = True
    forward = TokenLogprobs(policy, packed=False)
    seconds = 0.0
    for _ in range(2):  # a warm-up step, then the measured one
        started = time.perf_counter()
        out = forward(policy, ids, attention, counted, 1.0, None, args.entropy)
        loss = out.sum() if not args.entropy else out[..., 0].sum() - 0.01 * out[..., 1].sum()
        loss.backward()
        seconds = time.perf_counter() - started
        policy.zero_grad(set_to_none=True)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    kind = "autograd's softmax" if args.autograd_entropy else "fused" if args.entropy else "none"
    print(f"entropy {kind}: {rows} x {args.tokens} completion tokens, peak RSS {peak:.0f} MB, "
          f"step {seconds:.2f} s")


if __name__ == "__main__":
    main()
