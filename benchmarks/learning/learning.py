"""Learning per sample against TRL's GRPOTrainer (issue 10, done-when 4): held-out greedy accuracy against the
number of completions generated, over seeds, with a plot.

Both trainers start from the shipped tiny model and see the same prompts in the same order: the training split of
``ArithmeticTask`` (``"{a}+{b}="``), whose 1,000 held-out pairs are disjoint from it and from the model's
warm-start (``scripts/build_tiny_model.py`` trains on the training split only). Both are scored with the same
exact-match reward and stop after 3,840 completions (60 optimizer steps of 8 prompts x 8 completions).

- lit-grpo runs its documented defaults: ``configs/quickstart.yaml`` through the ``lit-grpo`` command, changed only
  in the seed, ``--data.completion_budget 3840`` and how often it validates (every 3 epochs = 768 completions).
  Its curve is its own ``val/accuracy`` (greedy, transformers ``generate``, the whole held-out split).
- TRL 1.16 runs issue 10's arith-bench settings (lr 5e-4 constant, beta 0.04, eps 0.2, one pass per batch,
  ``loss_type="grpo"``, group std, grad clip 1.0, LoRA r 16 / alpha 32 on q, k, v, o, gate, up, down): the issue
  reports that TRL did worse with a higher lr or more passes per batch. Its curve is measured every 12 steps (768
  completions) by ``greedy_accuracy`` below, plain ``model.generate`` on the held-out split. As a check that the
  two evaluators agree, ``greedy_accuracy`` is also run on the base model and on each lit-grpo run's final adapter
  and printed beside lit-grpo's own figures.

    flock /tmp/heavy.lock .venv/bin/python benchmarks/learning/learning.py [--seeds 0 1 2] [--plot docs/learning_per_sample.png]
        [--budget 3840] [--no-trl] [--lit-args "--model.optimizer.init_args.lr 0.001"]

TRL comes from the benchmark extra (``pip install -e '.[benchmark]'``, keeping torch 2.13.0).
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # the checkout, for benchmarks.*

from benchmarks.timed_child import RESULT, fit_command, run_child  # noqa: E402

MODEL = str(ROOT / "data" / "tiny-llama")
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
BUDGET, PER_STEP, EVERY_STEPS = 3840, 64, 12  # completions; completions per optimizer step; steps between evaluations
ACCURACY = re.compile(r"(before training|after epoch (\d+)): .*val/accuracy ([0-9.]+)")


def greedy_accuracy(model: Any, tokenizer: Any, records: list[dict[str, Any]], batch_size: int = 250) -> float:
    """Fraction of ``records`` whose greedy completion (<= 6 new tokens, special tokens skipped, stripped) equals
    the record's answer; prompts are left-padded so every row's completion starts at the same column."""
    import torch

    was_training = model.training
    model.eval()
    correct = 0
    for start in range(0, len(records), batch_size):
        chunk = records[start : start + batch_size]
        inputs = tokenizer([r["prompt"] for r in chunk], return_tensors="pt", padding=True, padding_side="left")
        with torch.no_grad():
            output = model.generate(**inputs, do_sample=False, max_new_tokens=6, pad_token_id=tokenizer.pad_token_id,
                                    eos_token_id=tokenizer.eos_token_id)
        texts = tokenizer.batch_decode(output[:, inputs["input_ids"].shape[1] :], skip_special_tokens=True)
        correct += sum(text.strip() == r["answer"] for text, r in zip(texts, chunk))
    model.train(was_training)
    return correct / len(records)


def split() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    from lit_grpo.tasks import ArithmeticTask

    train, heldout = ArithmeticTask().split()
    return [{"prompt": r["prompt"], "answer": r["answer"]} for r in train], list(heldout)


def lit_curve(seed: int, overrides: tuple[str, ...] = (), budget: int = BUDGET) -> dict[str, Any]:
    """lit-grpo's quickstart for one seed (``overrides``: extra command-line arguments, for exploring):
    ``{"completions": [...], "accuracy": [...], "adapter": path}``."""
    root = Path(f"/tmp/lit-grpo-learning/{seed}")
    command = fit_command(["--config", "configs/quickstart.yaml"], seed, root, then=[
        "--data.completion_budget", str(budget), "--trainer.max_epochs", "1000", "--trainer.check_val_every_n_epoch",
        "3", *overrides])
    done = run_child(command, cwd=ROOT).checked(f"lit-grpo seed {seed}")
    per_epoch = 256  # the quickstart's 32 prompts x 8 completions
    curve: dict[str, Any] = {"completions": [], "accuracy": [], "adapter": str(root / "adapter")}
    for _, epoch, accuracy in ACCURACY.findall(done.stdout + done.stderr):
        curve["completions"].append(0 if not epoch else (int(epoch) + 1) * per_epoch)
        curve["accuracy"].append(float(accuracy))
    if curve["completions"][0] != 0 or curve["completions"][-1] != budget:
        raise RuntimeError(f"lit-grpo seed {seed}: unexpected validations {curve['completions']}")
    return curve


def trl_curve(seed: int, budget: int = BUDGET) -> dict[str, Any]:
    """TRL's GRPOTrainer for one seed, evaluated every ``EVERY_STEPS`` steps: ``{"completions", "accuracy"}``."""
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from lit_grpo.run.model_files import load_tokenizer

    train, heldout = split()
    tokenizer = load_tokenizer(MODEL)
    curve: dict[str, Any] = {"completions": [], "accuracy": []}

    def exact_match(completions: list[str], answer: list[str], **_: Any) -> list[float]:
        return [1.0 if c.strip() == a else 0.0 for c, a in zip(completions, answer)]

    class Evaluate(TrainerCallback):
        def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **_: Any) -> None:
            self.record(0, model)

        def on_step_end(self, args: Any, state: Any, control: Any, model: Any = None, **_: Any) -> None:
            if state.global_step % EVERY_STEPS == 0:
                self.record(state.global_step * PER_STEP, model)

        def record(self, completions: int, model: Any) -> None:
            curve["completions"].append(completions)
            curve["accuracy"].append(greedy_accuracy(model, tokenizer, heldout))

    config = GRPOConfig(
        output_dir=f"/tmp/lit-grpo-learning-trl/{seed}", use_cpu=True, bf16=False, fp16=False,
        max_steps=budget // PER_STEP, per_device_train_batch_size=PER_STEP, gradient_accumulation_steps=1,
        num_generations=8, generation_batch_size=PER_STEP, max_completion_length=6, temperature=1.0, top_p=1.0,
        top_k=0, learning_rate=5e-4, lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0,
        max_grad_norm=1.0, beta=0.04, epsilon=0.2, num_iterations=1, loss_type="grpo", scale_rewards="group",
        shuffle_dataset=False, logging_steps=10_000, report_to="none", save_strategy="no", disable_dropout=True,
        dataloader_num_workers=0, seed=seed,
    )
    model = AutoModelForCausalLM.from_pretrained(MODEL, dtype="float32", attn_implementation="sdpa")
    trainer = GRPOTrainer(
        model=model, reward_funcs=exact_match, args=config, processing_class=tokenizer,
        train_dataset=Dataset.from_list(train), callbacks=[Evaluate()],
        peft_config=LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules=TARGETS, task_type="CAUSAL_LM"),
    )
    trainer.train()
    return curve


def evaluator_check(adapters: list[str]) -> dict[str, float]:
    """``greedy_accuracy`` of the base model and of each lit-grpo final adapter, keyed by path ("base")."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from lit_grpo.run.model_files import load_tokenizer

    _, heldout = split()
    tokenizer = load_tokenizer(MODEL)
    base = AutoModelForCausalLM.from_pretrained(MODEL, dtype="float32")
    result = {"base": greedy_accuracy(base, tokenizer, heldout)}
    for path in adapters:
        tuned = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(MODEL, dtype="float32"), path)
        result[path] = greedy_accuracy(tuned, tokenizer, heldout)
    return result


def in_child(function: str, *arguments: Any) -> Any:
    """Run ``function(*arguments)`` of this file in a fresh process (no state shared between runs); its JSON result."""
    code = (f"import json, sys; sys.path.insert(0, {str(ROOT)!r}); from benchmarks.learning import learning; "
            f"print({RESULT!r} + json.dumps(learning.{function}(*{arguments!r})))")
    done = run_child([sys.executable, "-c", code], cwd=ROOT)
    found = done.result()
    if done.returncode or found is None:
        raise RuntimeError(f"{function}{arguments!r} failed:\n{done.stderr[-3000:]}")
    return found


def plot(curves: dict[str, list[dict[str, Any]]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(6.4, 4.0))
    for (name, runs), color in zip(curves.items(), ("tab:blue", "tab:orange")):
        for run in runs:
            axes.plot(run["completions"], [100 * a for a in run["accuracy"]], color=color, alpha=0.3, linewidth=1)
        mean = [100 * statistics.mean(values) for values in zip(*(run["accuracy"] for run in runs))]
        axes.plot(runs[0]["completions"], mean, color=color, linewidth=2.5, marker="o",
                  label=f"{name} (mean of {len(runs)})")
    axes.set_xlabel("completions generated")
    axes.set_ylabel("held-out greedy accuracy, %")
    axes.set_title("Two-digit addition, 1,000 held-out pairs, tiny model")
    axes.grid(alpha=0.3)
    axes.legend()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110, bbox_inches="tight")


def run_all(seeds: list[int], budget: int, lit_args: tuple[str, ...], trl: bool) -> dict[str, list[dict[str, Any]]]:
    """Every seed's curves, the trainers alternating, one run at a time (2 cores); then the evaluator check."""
    curves: dict[str, list[dict[str, Any]]] = {"lit-grpo": [], **({"TRL 1.16": []} if trl else {})}
    for seed in seeds:
        curves["lit-grpo"].append(in_child("lit_curve", seed, lit_args, budget))
        if trl:
            curves["TRL 1.16"].append(in_child("trl_curve", seed, budget))
        for name, runs in curves.items():
            points = ", ".join(f"{c}: {a:.3f}" for c, a in zip(runs[-1]["completions"], runs[-1]["accuracy"]))
            print(f"seed {seed} {name}: {points}", flush=True)
    check = in_child("evaluator_check", [run["adapter"] for run in curves["lit-grpo"]])
    before = ", ".join(f"{run['accuracy'][0]:.3f}" for run in curves["lit-grpo"])
    print(f"evaluator check, base model: greedy_accuracy {check['base']:.3f}, lit-grpo's val/accuracy {before}")
    for run in curves["lit-grpo"]:
        print(f"evaluator check, {run['adapter']}: greedy_accuracy {check[run['adapter']]:.3f}, "
              f"lit-grpo's val/accuracy {run['accuracy'][-1]:.3f}")
    return curves


def report(curves: dict[str, list[dict[str, Any]]], budget: int) -> None:
    gains = {name: [100 * (run["accuracy"][-1] - run["accuracy"][0]) for run in runs] for name, runs in curves.items()}
    print(f"\n| trainer | accuracy before | after {budget:,} completions | gain, points (mean ± sd) | per seed |")
    print("|---|---|---|---|---|")
    for name, runs in curves.items():
        before = statistics.mean(run["accuracy"][0] for run in runs)
        after = statistics.mean(run["accuracy"][-1] for run in runs)
        spread = statistics.pstdev(gains[name]) if len(gains[name]) > 1 else 0.0
        per_seed = ", ".join(f"{g:+.1f}" for g in gains[name])
        gain = f"{statistics.mean(gains[name]):+.1f} ± {spread:.1f}"
        print(f"| {name} | {100 * before:.1f}% | {100 * after:.1f}% | {gain} | {per_seed} |")
    if "TRL 1.16" in gains:
        trl_gain = statistics.mean(gains["TRL 1.16"])
        ratio = statistics.mean(gains["lit-grpo"]) / trl_gain if trl_gain > 0 else float("nan")
        print(f"\nlit-grpo's gain / TRL's gain: {ratio:.2f} (TRL's gain {'>' if trl_gain > 0 else '<='} 0)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--budget", type=int, default=BUDGET, help="completions per run (a multiple of 768)")
    parser.add_argument("--lit-args", default="", help="extra lit-grpo arguments, for exploring (one string)")
    parser.add_argument("--no-trl", action="store_true")
    parser.add_argument("--plot", type=Path, default=ROOT / "docs" / "learning_per_sample.png")
    parser.add_argument("--json", type=Path, default=ROOT / "benchmarks" / "results" / "learning.json")
    options = parser.parse_args()
    if options.budget % (EVERY_STEPS * PER_STEP):
        parser.error(f"--budget must be a multiple of {EVERY_STEPS * PER_STEP}")
    curves = run_all(options.seeds, options.budget, tuple(shlex.split(options.lit_args)), not options.no_trl)
    report(curves, options.budget)
    options.json.parent.mkdir(parents=True, exist_ok=True)
    options.json.write_text(json.dumps(curves, indent=1))
    plot(curves, options.plot)
    print(f"curves: {options.json}; plot: {options.plot}")


if __name__ == "__main__":
    main()
