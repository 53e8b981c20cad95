"""Peak memory and time of one GRPO step at Qwen2.5-0.5B width (issue 15), per memory technique, against the floor
computed from the shape and against TRL 1.16's GRPOTrainer on the same model and rollouts.

Model: a random Qwen2 with Qwen2.5-0.5B's width (hidden 896, MLP 4,864, 14 heads / 2 KV heads, q/k/v bias,
vocabulary 151,936, tied embeddings) and 2 or 24 layers, saved once in bf16 under ``--model-dir``. Rollouts: 8 rows
of a 32-token prompt and N completion tokens (seeded random ids), advantages +-1; LoRA r 16, alpha 32 on q, k, v,
o, gate, up, down; AdamW. One step = the reference pass (adapter off, no grad) + the GRPO loss (clip, k3 KL,
beta 0.04) forward and backward + one AdamW step; pi_old is the sampler's, so no old-policy pass (TRL with
num_iterations 1 skips it too). Each measurement is a fresh process: its peak RSS (``ru_maxrss``) and the wall
time of its second step (the first allocates the optimizer state). Configurations, cumulative:

- ``a``: fp32 base, logits of the whole vocabulary at every position (what lit-grpo did before issue 15);
- ``b``: + the chunked head (log-probs of completion tokens only, 256 tokens per head chunk, recomputed in backward);
- ``c``: + gradient checkpointing (non-reentrant);
- ``d``: + a bf16 frozen base (LoRA, its gradients and AdamW state stay fp32);
- ``trl``: TRL 1.16 ``GRPOTrainer`` (bf16 base, gradient checkpointing on) driven through its own reference pass
  (``_get_per_token_logps_and_entropies`` under the disabled adapter) and its own ``compute_loss``, then backward
  and its optimizer's step.

Floor (bytes) for ``d`` = process baseline RSS (after imports) + 2 P_base (bf16 weights) + 16 P_LoRA (fp32 weight,
gradient, Adam m and v) + T L H 2 (one bf16 activation checkpoint per layer; T = rows x tokens) + T s (one layer's
saved activations while it is recomputed, s measured in bytes per token on that layer) + 3 C V 4 (one fp32 logits
chunk of C = 256 tokens: logits, log-softmax and its gradient). A configuration whose projected peak exceeds
``--max-gib`` is skipped and says so.

Every child fixes glibc's mmap threshold as the ``lit-grpo`` command does (``lit_grpo.run.host_memory``), TRL's row
too; ``--glibc-heap`` leaves glibc's default, under which freed activations stay in the heap and the peak RSS of
c, d and TRL rises well above live memory.

``--cli``: one epoch through the ``lit-grpo`` command of 1 prompt x 4 completions x 512 new tokens on the 2-layer
model (hf engine), peak RSS of the child and its generation seconds from the epoch log line.

    flock /tmp/heavy.lock .venv/bin/python benchmarks/memory/memory.py [--layers 2 24] [--tokens 512 1024]
        [--configs a b c d trl] [--cli] [--max-gib 16]

Run it alone on a quiet machine: times compete for the same cores.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # the checkout, for benchmarks.*

from benchmarks.timed_child import print_result, run_child  # noqa: E402

TOKENIZER_FROM = ROOT / "data" / "tiny-qwen2-chat"
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
ROWS, PROMPT, VOCAB, HIDDEN, CHUNK = 8, 32, 151_936, 896, 256
GIB = 2**30


def build_model(layers: int, out: Path) -> None:
    """The random width model, saved in bf16 with a tokenizer our loader accepts (ids < 32,704 are used)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=4864, num_hidden_layers=layers,
                         num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=4096,
                         tie_word_embeddings=True, eos_token_id=2, pad_token_id=0, dtype="bfloat16")
    torch.manual_seed(0)
    Qwen2ForCausalLM(config).to(torch.bfloat16).save_pretrained(out)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(TOKENIZER_FROM / name, out / name)


def model_path(model_dir: Path, layers: int) -> Path:
    path = model_dir / f"qwen-width-L{layers}"
    if not (path / "model.safetensors").is_file():
        subprocess.run([sys.executable, __file__, "--build", str(layers), "--model-dir", str(model_dir)], check=True)
    return path


def rollouts(tokens: int) -> dict[str, Any]:
    import torch

    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 32_000, (ROWS, PROMPT + tokens), generator=generator)
    completion = torch.zeros(ROWS, PROMPT + tokens, dtype=torch.bool)
    completion[:, PROMPT:] = True
    advantages = torch.tensor([1.0, -1.0] * (ROWS // 2))
    return {"ids": ids, "mask": torch.ones_like(ids), "completion": completion, "advantages": advantages}


def full_logits_logprobs(policy: Any, ids: Any, mask: Any) -> Any:
    """Configuration a: fp32 log-softmax of the logits at every position, then the next token's. ``[N, L]``."""
    import torch

    logits = policy(input_ids=ids, attention_mask=mask).logits.float()  # [N, L, V]
    logp = torch.log_softmax(logits[:, :-1], dim=-1).gather(-1, ids[:, 1:, None]).squeeze(-1)
    return torch.cat([torch.zeros_like(logp[:, :1]), logp], dim=1)


def lit_step(config: str, path: Path, tokens: int) -> tuple[Any, Any]:
    """(one step, a closure over the policy): lit-grpo's own functions for configurations a-d."""
    import torch

    from lit_grpo.losses import kl_divergence, masked_aggregate, policy_loss
    from lit_grpo.policy.model_loading import load_policy
    from lit_grpo.policy.packed import TokenLogprobs

    policy = load_policy(str(path), 16, 32, 0.0, TARGETS, dtype="bfloat16" if config == "d" else "float32",
                         gradient_checkpointing=config in ("c", "d"))
    batch = rollouts(tokens)
    ids, mask, counted = batch["ids"], batch["mask"], batch["completion"]
    logprobs = TokenLogprobs(policy, True, CHUNK)
    forward = (lambda: full_logits_logprobs(policy, ids, mask)) if config == "a" else (
        lambda: logprobs(policy, ids, mask, counted, 1.0))
    optimizer = torch.optim.AdamW([p for p in policy.parameters() if p.requires_grad], lr=1e-5)

    def step() -> None:
        policy.eval()
        with torch.no_grad(), policy.disable_adapter():
            ref = forward() if config == "a" else logprobs.batched(policy, ids, mask, counted, 1.0, 16_384)
        policy.train()
        logp = forward()
        advantages = batch["advantages"][:, None].expand_as(logp)
        surrogate, _ = policy_loss(logp, logp.detach(), advantages, counted, "clip", 0.2, None, "seq-mean", tokens)
        kl = masked_aggregate(kl_divergence(logp, ref, "k3"), counted, "seq-mean", tokens)
        (surrogate + 0.04 * kl).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step, policy


def trl_step(path: Path, tokens: int) -> tuple[Any, Any]:
    """TRL 1.16's GRPOTrainer on the same model and rollouts, through its own passes and loss."""
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from trl import GRPOConfig, GRPOTrainer
    from trl.trainer.utils import use_adapter

    config = GRPOConfig(output_dir=tempfile.mkdtemp(prefix="lit-grpo-memory-trl-"), use_cpu=True, bf16=True,
                        gradient_checkpointing=True, per_device_train_batch_size=ROWS, num_generations=ROWS,
                        max_completion_length=tokens, beta=0.04, epsilon=0.2, loss_type="grpo", learning_rate=1e-5,
                        report_to="none", save_strategy="no", model_init_kwargs={"dtype": "bfloat16"})
    trainer = GRPOTrainer(model=str(path), reward_funcs=lambda completions, **_: [0.0] * len(completions),
                          args=config, train_dataset=Dataset.from_list([{"prompt": "x"}] * ROWS),
                          peft_config=LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules=TARGETS,
                                                 task_type="CAUSAL_LM"))
    model = trainer.model
    trainer.create_optimizer()
    trainer.current_gradient_accumulation_steps = 1  # what Trainer's loop sets before each step
    batch = rollouts(tokens)
    prompt_ids, completion_ids = batch["ids"][:, :PROMPT], batch["ids"][:, PROMPT:]
    inputs = {"prompt_ids": prompt_ids, "prompt_mask": torch.ones_like(prompt_ids), "completion_ids": completion_ids,
              "completion_mask": torch.ones_like(completion_ids), "advantages": batch["advantages"],
              "old_per_token_logps": None, "num_items_in_batch": torch.tensor(float(completion_ids.numel()))}

    def step() -> None:
        model.eval()
        with torch.no_grad(), use_adapter(model, adapter_name=None):
            ref, _, _ = trainer._get_per_token_logps_and_entropies(model, batch["ids"], batch["mask"], tokens)
        model.train()
        loss = trainer.compute_loss(model, {**inputs, "ref_per_token_logps": ref})
        loss.backward()
        trainer.optimizer.step()
        trainer.optimizer.zero_grad(set_to_none=True)

    return step, model


def layer_bytes_per_token(path: Path) -> float:
    """Bytes per token one decoder layer saves for backward (LoRA on, bf16 base), measured on 64 tokens."""
    import torch

    from lit_grpo.policy.model_loading import load_policy

    policy = load_policy(str(path), 16, 32, 0.0, TARGETS, dtype="bfloat16").train()
    layer = policy.get_base_model().model.layers[0]
    hidden = torch.randn(1, 64, HIDDEN, dtype=torch.bfloat16, requires_grad=True)
    rotary = policy.get_base_model().model.rotary_emb(hidden, torch.arange(64)[None])
    saved: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        if not isinstance(tensor, torch.nn.Parameter) and tensor.untyped_storage().data_ptr() != 0:
            saved[tensor.untyped_storage().data_ptr()] = tensor.untyped_storage().nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        layer(hidden, position_embeddings=rotary, attention_mask=None)
    frozen = {p.untyped_storage().data_ptr() for p in policy.parameters()}
    return sum(size for ptr, size in saved.items() if ptr not in frozen) / 64


def floor_bytes(layers: int, tokens: int, baseline: float, per_token: float, path: Path) -> dict[str, float]:
    from lit_grpo.policy.model_loading import load_policy

    policy = load_policy(str(path), 16, 32, 0.0, TARGETS, dtype="bfloat16")
    base = sum(p.numel() for p in policy.parameters() if not p.requires_grad)
    lora = sum(p.numel() for p in policy.parameters() if p.requires_grad)
    count = ROWS * (PROMPT + tokens)
    parts = {"baseline": baseline, "weights": 2 * base, "lora_states": 16 * lora,
             "checkpoints": count * layers * HIDDEN * 2, "recomputed_layer": count * per_token,
             "logits_chunk": 3 * CHUNK * VOCAB * 4}
    return {**parts, "floor": sum(parts.values())}


def projected_gib(config: str, layers: int, tokens: int) -> float:
    """A rough peak for the skip decision: full logits (several fp32 copies) and un-checkpointed activations."""
    count = ROWS * (PROMPT + tokens)
    weights = (2 if config in ("d", "trl") else 4) * (VOCAB * HIDDEN + layers * 15e6)
    logits = 4 * count * VOCAB * 4 if config == "a" else 3 * CHUNK * VOCAB * 4
    activations = count * layers * (150e3 if config in ("a", "b") else 2 * HIDDEN)
    return (weights + logits + activations) / GIB + 0.5


def rss_bytes() -> float:
    import psutil

    return float(psutil.Process().memory_info().rss)


def child(config: str, layers: int, tokens: int, model_dir: Path, glibc_heap: bool) -> None:
    """One measurement in this process; prints one RESULT line."""
    import torch  # noqa: F401  (imported before the baseline is read, as every configuration needs it)

    import lit_grpo.policy.packed  # noqa: F401
    from lit_grpo.run.host_memory import return_freed_memory

    if not glibc_heap:  # as the lit-grpo command does; the same for TRL's row, so both use one allocator setting
        return_freed_memory()
    path = model_path(model_dir, layers)
    baseline = rss_bytes()
    if config == "floor":
        result: dict[str, Any] = floor_bytes(layers, tokens, baseline, layer_bytes_per_token(path), path)
    else:
        step, _ = trl_step(path, tokens) if config == "trl" else lit_step(config, path, tokens)
        step()
        start = time.perf_counter()
        step()
        result = {"seconds": time.perf_counter() - start, "baseline": baseline}
    result["peak"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024.0
    print_result(result)


def measure(config: str, layers: int, tokens: int, model_dir: Path, glibc_heap: bool) -> dict[str, Any]:
    command = [sys.executable, __file__, "--child", config, "--layers", str(layers), "--tokens", str(tokens),
               "--model-dir", str(model_dir)] + (["--glibc-heap"] if glibc_heap else [])
    done = run_child(command, env={**os.environ, "TOKENIZERS_PARALLELISM": "false"})
    found = done.result()
    return found if done.returncode == 0 and found is not None else {"error": done.last_line()}


def cli_epoch(model_dir: Path, new_tokens: int, extra: list[str]) -> dict[str, Any]:
    """One epoch of 1 prompt x 4 completions through ``lit-grpo fit`` on the 2-layer model: peak RSS and the
    generation seconds its epoch line reports."""
    path = model_path(model_dir, 2)
    with tempfile.TemporaryDirectory(prefix="lit-grpo-memory-cli-") as run_dir:
        command = [sys.executable, "-m", "lit_grpo.cli", "fit", "--model.model_name_or_path", str(path),
                   "--data.group_size", "4", "--data.prompts_per_epoch", "1", "--data.minibatch_size", "4",
                   "--data.max_new_tokens", str(new_tokens), "--trainer.max_epochs", "1",
                   "--trainer.limit_val_batches", "0", "--trainer.logger", "false", "--trainer.default_root_dir",
                   run_dir, "--trainer.enable_progress_bar", "false", *extra]
        done = run_child(command, cwd=run_dir)
    found = re.search(r"\(generate ([0-9.]+)s\)", done.stderr)
    return {"returncode": done.returncode, "peak_gib": done.peak_rss_bytes / GIB,
            "generate_s": float(found.group(1)) if found else None,
            "error": None if done.returncode == 0 else done.last_line()}


def table(rows: list[dict[str, Any]]) -> str:
    lines = ["| layers | tokens | config | peak GiB | step s | / floor | / TRL |", "|---|---|---|---|---|---|---|"]
    for row in rows:
        if "skipped" in row or "error" in row:
            lines.append(f"| {row['layers']} | {row['tokens']} | {row['config']} | {row.get('skipped') or row['error']} "
                         "| | | |")
            continue
        ratio = lambda key: f"{row['peak'] / row[key]:.2f}" if row.get(key) else "—"  # noqa: E731
        seconds = f"{row['seconds']:.2f}" if "seconds" in row else "—"
        lines.append(f"| {row['layers']} | {row['tokens']} | {row['config']} | {row['peak'] / GIB:.2f} | {seconds} "
                     f"| {ratio('floor')} | {ratio('trl')} |")
    return "\n".join(lines)


def run_shapes(args: argparse.Namespace) -> None:
    rows = []
    for layers in args.layers:
        for tokens in args.tokens:
            floor = measure("floor", layers, tokens, args.model_dir, args.glibc_heap)
            print(json.dumps({"layers": layers, "tokens": tokens, "floor_parts_gib":
                              {k: round(v / GIB, 3) for k, v in floor.items() if k != "peak"}}), flush=True)
            shape = []
            for config in args.configs:
                row: dict[str, Any] = {"layers": layers, "tokens": tokens, "config": config}
                projected = projected_gib(config, layers, tokens)
                if projected > args.max_gib:
                    row["skipped"] = f"skipped: projected {projected:.0f} GiB > {args.max_gib:g}"
                else:
                    row.update(measure(config, layers, tokens, args.model_dir, args.glibc_heap))
                shape.append(row)
                print(json.dumps(row), flush=True)
            trl_peak = next((r.get("peak") for r in shape if r["config"] == "trl"), None)
            for row in shape:
                row["floor"], row["trl"] = floor.get("floor"), trl_peak
            rows += shape
    print(table(rows))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, nargs="+", default=[2, 24])
    parser.add_argument("--tokens", type=int, nargs="+", default=[512, 1024])
    parser.add_argument("--configs", nargs="+", default=["a", "b", "c", "d", "trl"])
    parser.add_argument("--max-gib", type=float, default=16.0)
    parser.add_argument("--model-dir", type=Path, default=Path(tempfile.gettempdir()) / "lit-grpo-memory-models")
    parser.add_argument("--cli", action="store_true", help="also the CLI epoch (first, each in its own process)")
    parser.add_argument("--cli-tokens", type=int, default=512)
    parser.add_argument("--glibc-heap", action="store_true",
                        help="leave glibc's mmap threshold dynamic (the default before lit_grpo.run.host_memory)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--build", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.build is not None:
        build_model(args.build, args.model_dir / f"qwen-width-L{args.build}")
    elif args.child is not None:
        child(args.child, args.layers[0], args.tokens[0], args.model_dir, args.glibc_heap)
    else:
        if args.cli:
            # defaults (dtype auto: the model is saved in bf16), + checkpointing, and an fp32 base
            for extra in ([], ["--model.memory.gradient_checkpointing", "true"], ["--model.dtype", "float32"]):
                found = cli_epoch(args.model_dir, args.cli_tokens, extra)
                print(json.dumps({"cli": " ".join(extra) or "defaults", **found}), flush=True)
        run_shapes(args)


if __name__ == "__main__":
    main()
