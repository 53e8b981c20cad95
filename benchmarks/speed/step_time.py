"""Time per optimizer step against the floor and against TRL's GRPOTrainer (issue 10), with peak RSS.

Workloads (issue 10): ``arith-bench`` — prompts ``"{a}+{b}="``, a and b uniform in [10, 99] from
``random.Random(1234)``, a pool of 2,000 used in order; reward 1.0 iff the completion (special tokens skipped,
stripped) equals ``str(a+b)``; per optimizer step 8 prompts x 8 completions of <= 6 new tokens at temperature 1,
top-p 1; LoRA r 16, alpha 32, dropout 0 on q, k, v, o, gate, up, down; AdamW lr 5e-4 constant, no weight decay,
grad clip 1.0; beta 0.04 (k3 in the loss), eps 0.2, one optimizer step per rollout batch, seq-mean, group std;
fp32; the shipped tiny model. ``fewshot-bench`` — the same with four solved examples before each question
(a header line and four ``a+b=c`` lines from ``random.Random(5678)``: about 60 tokens). ``tree-bench`` — the
clarification game (``ClarifyTask``, ``data/tiny-llama-clarify``) with tree rollouts, branching 4 at each of 3
rounds, 8 trees per optimizer step, otherwise as above (TRL has no tree rollouts: no TRL figure).

The floor: generating the 64 completions (unshared: every row prefills its own prompt), one (padded, unshared) LoRA
forward+backward, one reference forward
and one AdamW step, each the median of 7 timings in a process of its own, measured once per round of runs (the
median over rounds is reported). A trainer's time per step is the wall time from the end of its
first optimizer step to the end of its last over the steps in between (rollout, no-grad passes, update and the
trainer's own overhead all counted); each run is a fresh process (its peak RSS is reported), and runs of lit-grpo
packed, lit-grpo padded and TRL alternate. TRL runs only if installed (``pip install -e '.[benchmark]'``).

    flock /tmp/heavy.lock .venv/bin/python benchmarks/speed/step_time.py [--workloads arith-bench fewshot-bench]
        [--runs 3] [--steps 60] [--no-trl]
"""

from __future__ import annotations

import argparse
import random
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # the checkout, for benchmarks.*

from benchmarks.timed_child import print_result, run_child  # noqa: E402

MODEL = str(ROOT / "data" / "tiny-llama")
TREE_MODEL = str(ROOT / "data" / "tiny-llama-clarify")
BRANCHING = [4, 4, 4]
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
PROMPTS, GROUP, NEW_TOKENS, LR, BETA, EPS = 8, 8, 6, 5e-4, 0.04, 0.2


def workload_records(workload: str) -> list[dict[str, str]]:
    """The 2,000 prompts of a workload, in the order they are used, with their answers."""
    pairs = random.Random(1234)
    examples = random.Random(5678)
    records = []
    for _ in range(2000):
        a, b = pairs.randint(10, 99), pairs.randint(10, 99)
        prompt = f"{a}+{b}="
        if workload == "fewshot-bench":
            shots = [(examples.randint(10, 99), examples.randint(10, 99)) for _ in range(4)]
            prompt = "Add the numbers.\n" + "".join(f"{x}+{y}={x + y}\n" for x, y in shots) + prompt
        records.append({"prompt": prompt, "answer": str(a + b)})
    return records


def timed(action: Any) -> float:
    start = time.perf_counter()
    action()
    return time.perf_counter() - start


def rollouts(workload: str, tokenizer: Any, engine: Any, spec: Any) -> tuple[Any, Any]:
    """``(generate, buffer)``: the workload's generation for one optimizer step, and a buffer it made."""
    from lit_grpo.buffers.buffer import build_buffer
    from lit_grpo.tasks import ClarifyTask
    from lit_grpo.rollout.trees import expand_trees
    from lit_grpo.buffers.tree_layout import tree_buffer

    if workload == "tree-bench":
        task = ClarifyTask()
        records = list(task.train_records()[:PROMPTS])
        roots = expand_trees(task, engine, tokenizer, records, BRANCHING, spec)
        buffer = tree_buffer(roots, tokenizer, 1.0, NEW_TOKENS, "tree", len(BRANCHING))
        return (lambda: expand_trees(task, engine, tokenizer, records, BRANCHING, spec)), buffer
    prompts = [tokenizer(r["prompt"])["input_ids"] for r in workload_records(workload)[:PROMPTS]]
    buffer = build_buffer(prompts, engine.generate(prompts, GROUP, spec), tokenizer.pad_token_id, 1.0, NEW_TOKENS)
    return (lambda: engine.generate(prompts, GROUP, spec)), buffer


def policy_and_spec(workload: str) -> tuple[Any, Any, Any]:
    """The workload's ``(tokenizer, policy, sampling spec)``: a fresh LoRA policy (r 16, alpha 32, no dropout) on
    the workload's model, sampling at temperature 1 with seed 0."""
    from lit_grpo.engines import SamplingSpec
    from lit_grpo.policy.model_loading import load_policy
    from lit_grpo.run.model_files import load_tokenizer

    model = TREE_MODEL if workload == "tree-bench" else MODEL
    tokenizer = load_tokenizer(model)
    policy = load_policy(model, 16, 32, 0.0, TARGETS)
    spec = SamplingSpec(max_new_tokens=NEW_TOKENS, temperature=1.0, seed=0, stop_token_ids=(tokenizer.eos_token_id,))
    return tokenizer, policy, spec


def hf_rollouts(workload: str, tokenizer: Any, policy: Any, spec: Any,
                share_prompt_prefill: bool = True) -> tuple[Any, Any]:
    """``rollouts`` through an ``HFEngine`` on ``policy``."""
    from lit_grpo.engines import HFEngine

    engine = HFEngine(share_prompt_prefill=share_prompt_prefill)
    engine.push_policy(policy)
    return rollouts(workload, tokenizer, engine, spec)


def floor(workload: str) -> dict[str, float]:
    """Median seconds of each floor component, and of the packed forward+backward and reference forward."""
    import torch

    from lit_grpo.policy.logprobs import sequence_logprobs
    from lit_grpo.policy.packed import packed_logprobs

    tokenizer, policy, spec = policy_and_spec(workload)
    # the floor is unshared (each of the G rows prefills its prompt); lit-grpo's default shares the prefill
    generate, buffer = hf_rollouts(workload, tokenizer, policy, spec, share_prompt_prefill=False)
    shared_generate, _ = hf_rollouts(workload, tokenizer, policy, spec)
    ids, mask, counted = buffer.input_ids, buffer.attention_mask, buffer.completion_mask
    optimizer = torch.optim.AdamW([p for p in policy.parameters() if p.requires_grad], lr=LR, weight_decay=0.0)

    def forward_backward(packed: bool) -> None:
        policy.train()
        policy.zero_grad()
        logp = packed_logprobs(policy, ids, mask, counted) if packed else sequence_logprobs(policy, ids, mask)
        (logp * counted).sum().backward()

    def reference(packed: bool) -> None:
        with torch.no_grad(), policy.disable_adapter():
            packed_logprobs(policy, ids, mask, counted) if packed else sequence_logprobs(policy, ids, mask)

    actions = {
        "generate": generate,
        "forward_backward": lambda: forward_backward(False),
        "reference_forward": lambda: reference(False),
        "adamw_step": optimizer.step,
        "packed_forward_backward": lambda: forward_backward(True),
        "packed_reference_forward": lambda: reference(True),
        "shared_prefill_generate": shared_generate,
    }
    result = {}
    for name, action in actions.items():
        action()  # warm-up
        result[name] = statistics.median(timed(action) for _ in range(7))
    result["floor"] = sum(result[k] for k in ("generate", "forward_backward", "reference_forward", "adamw_step"))
    contexts = (mask.sum(dim=1) - counted.sum(dim=1)).float()  # [N]
    result["prompt_tokens"] = float(contexts.mean())
    result["rows"] = ids.shape[0]
    return result


class StepClock:
    """Wall-clock time at the end of every optimizer step."""

    def __init__(self) -> None:
        self.ends: list[float] = []

    def seconds_per_step(self) -> float:
        return (self.ends[-1] - self.ends[0]) / (len(self.ends) - 1)


def lit_run(workload: str, packed: bool, steps: int, callbacks: tuple[Any, ...] = ()) -> float:
    """lit-grpo on the workload: seconds per optimizer step (``callbacks`` join the trainer's)."""
    import lightning.pytorch as pl
    import torch

    from lit_grpo.callbacks import RolloutMetrics
    from lit_grpo.rollout.datamodule import RolloutDataModule
    from lit_grpo.policy.module import PolicyModule
    from lit_grpo.tasks import ClarifyTask, Task
    from lit_grpo.tasks.base import ExactMatchReward

    records = workload_records(workload)

    class PoolTask(Task):
        def __init__(self) -> None:
            super().__init__()
            self.reward_fn = ExactMatchReward()

        def split(self) -> tuple[list[dict[str, str]], list[dict[str, str]]]:
            return records, records[:1]

    clock = StepClock()

    class Clock(pl.Callback):
        def on_train_batch_end(self, *args: Any) -> None:
            clock.ends.append(time.perf_counter())

    tree = workload == "tree-bench"
    module = PolicyModule(
        model_name_or_path=TREE_MODEL if tree else MODEL,
        lora={"rank": 16, "alpha": 32, "dropout": 0.0, "target_modules": TARGETS}, advantage_mode="grpo",
        std_scope="group", loss_variant="clip", clip={"eps": EPS}, aggregation="seq-mean",
        kl={"coef": BETA, "estimator": "k3"}, memory={"packed_forward": packed},
        optimizer=lambda params: torch.optim.AdamW(params, lr=LR, weight_decay=0.0),
    )
    data = RolloutDataModule(task=ClarifyTask() if tree else PoolTask(), group_size=GROUP, prompts_per_epoch=PROMPTS,
                             minibatch_size=1024 if tree else PROMPTS * GROUP, max_new_tokens=NEW_TOKENS,
                             temperature=1.0, rollout="tree" if tree else "grouped", branching=BRANCHING)
    trainer = pl.Trainer(
        max_epochs=steps, gradient_clip_val=1.0, reload_dataloaders_every_n_epochs=1, num_sanity_val_steps=0,
        limit_val_batches=0, logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, callbacks=[RolloutMetrics(), Clock(), *callbacks], default_root_dir="/tmp/lit-grpo-step-time",
    )
    trainer.fit(module, datamodule=data)
    assert len(clock.ends) == steps, len(clock.ends)
    return clock.seconds_per_step()


def trl_run(workload: str, steps: int) -> float:
    """TRL's GRPOTrainer on the same workload (transformers generation): seconds per optimizer step."""
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from lit_grpo.run.model_files import load_tokenizer

    def exact_match(completions: list[str], answer: list[str], **_: Any) -> list[float]:
        return [1.0 if c.strip() == a else 0.0 for c, a in zip(completions, answer)]

    clock = StepClock()

    class Clock(TrainerCallback):
        def on_step_end(self, *args: Any, **kwargs: Any) -> None:
            clock.ends.append(time.perf_counter())

    config = GRPOConfig(
        output_dir="/tmp/lit-grpo-step-time-trl", use_cpu=True, bf16=False, fp16=False, max_steps=steps,
        per_device_train_batch_size=PROMPTS * GROUP, gradient_accumulation_steps=1, num_generations=GROUP,
        generation_batch_size=PROMPTS * GROUP, max_completion_length=NEW_TOKENS, temperature=1.0, top_p=1.0,
        top_k=0, learning_rate=LR, lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0,
        max_grad_norm=1.0, beta=BETA, epsilon=EPS, num_iterations=1, loss_type="grpo", scale_rewards="group",
        shuffle_dataset=False, logging_steps=10_000, report_to="none", save_strategy="no", disable_dropout=True,
        dataloader_num_workers=0, seed=0,
    )
    tokenizer = load_tokenizer(MODEL)
    model = AutoModelForCausalLM.from_pretrained(MODEL, dtype="float32", attn_implementation="sdpa")
    trainer = GRPOTrainer(
        model=model, reward_funcs=exact_match, args=config, processing_class=tokenizer,
        train_dataset=Dataset.from_list(workload_records(workload)), callbacks=[Clock()],
        peft_config=LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules=TARGETS, task_type="CAUSAL_LM"),
    )
    trainer.train()
    assert len(clock.ends) == steps, len(clock.ends)
    return clock.seconds_per_step()


def child(kind: str, workload: str, steps: int) -> None:
    """One measurement in this process; prints one JSON line with its result and the process's peak RSS."""
    if kind == "floor":
        result: dict[str, Any] = floor(workload)
    elif kind == "trl":
        result = {"seconds_per_step": trl_run(workload, steps)}
    else:
        result = {"seconds_per_step": lit_run(workload, kind == "packed", steps)}
    result["rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print_result(result)


def measure(kind: str, workload: str, steps: int) -> dict[str, Any]:
    command = [sys.executable, __file__, "--child", kind, "--workloads", workload, "--steps", str(steps)]
    done = run_child(command, cwd=ROOT)
    found = done.result()
    if done.returncode or found is None:
        raise RuntimeError(f"{kind} on {workload} failed:\n{done.stderr[-3000:]}")
    return found


def trl_installed() -> bool:
    probe = subprocess.run([sys.executable, "-c", "import trl"], capture_output=True)
    return probe.returncode == 0


def report(workload: str, parts: dict[str, float], runs: dict[str, list[dict[str, Any]]]) -> None:
    print(f"\n## {workload} ({parts['rows']} rows, context ~{parts['prompt_tokens']:.0f} tokens per row)")
    print("floor, median over runs of each run's median of 7 (ms): " + ", ".join(
        f"{k} {1000 * parts[k]:.0f}" for k in ("generate", "forward_backward", "reference_forward", "adamw_step")
    ) + f"; total {1000 * parts['floor']:.0f} ms")
    print(f"shared-prefix forward+backward {1000 * parts['packed_forward_backward']:.0f} ms "
          f"({parts['forward_backward'] / parts['packed_forward_backward']:.2f}x less), reference forward "
          f"{1000 * parts['packed_reference_forward']:.0f} ms; shared-prefill generation "
          f"{1000 * parts['shared_prefill_generate']:.0f} ms")
    trl = statistics.median(r["seconds_per_step"] for r in runs["trl"]) if runs.get("trl") else None
    print("| trainer | s / step, median | min-max | / floor | / TRL | peak RSS MB |")
    print("|---|---|---|---|---|---|")
    for kind, results in runs.items():
        times = [r["seconds_per_step"] for r in results]
        median = statistics.median(times)
        versus = f"{median / trl:.2f}" if trl else "n/a"
        print(f"| {kind} | {median:.3f} | {min(times):.3f}-{max(times):.3f} | {median / parts['floor']:.2f} | "
              f"{versus} | {max(r['rss_mb'] for r in results):.0f} |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", nargs="+", default=["arith-bench", "fewshot-bench"],
                        choices=["arith-bench", "fewshot-bench", "tree-bench"])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--no-trl", action="store_true")
    parser.add_argument("--child", choices=["floor", "packed", "padded", "trl"], help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.child:
        child(options.child, options.workloads[0], options.steps)
        return
    kinds = ["lit-grpo packed", "lit-grpo padded"]
    if not options.no_trl and trl_installed():
        kinds.append("trl")
    elif not options.no_trl:
        print("TRL is not installed (pip install -e '.[benchmark]'): no TRL figures")
    print(f"{options.steps} optimizer steps per run, {options.runs} alternating runs per trainer")
    for workload in options.workloads:
        kinds_here = [k for k in kinds if k != "trl" or workload != "tree-bench"]
        runs: dict[str, list[dict[str, Any]]] = {kind: [] for kind in kinds_here}
        floors: list[dict[str, float]] = []
        for _ in range(options.runs):  # the floor too, so that machine noise hits it alike
            floors.append(measure("floor", workload, options.steps))
            for kind in kinds_here:
                runs[kind].append(measure(kind.split()[-1], workload, options.steps))
        parts = {key: statistics.median(f[key] for f in floors) for key in floors[0]}
        report(workload, parts, runs)


if __name__ == "__main__":
    main()
